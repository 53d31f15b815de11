// Package k8ssync is netmaster's leader-side Kubernetes integration: it watches the API
// server (client-go informers, pkg/k8s) and writes what Kubernetes objects mean into
// Contiv's state through netmaster (pkg/master), so every agent programs them on either
// datapath: Services and EndpointSlices → serviceLB state (ClusterIP, node ports, ready
// endpoints), NetworkPolicies → per-pod NetworkPolicy records. It owns the loops, their
// de-duplication, warnings as Kubernetes Events, and their metrics; the mappings
// themselves are pkg/k8s.ServiceRecord and pkg/k8s.CompilePolicies.
package k8ssync

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// ServiceStore is where the records go (pkg/master.Master implements it).
type ServiceStore interface {
	PutK8sService(ctx context.Context, prefix string, rec model.CfgServiceLBState) master.K8sServiceResult
	PruneK8sServices(ctx context.Context, prefix string, keep map[string]bool) ([]string, error)
}

// Resync is how often every Service is written again even without a change (records
// refused earlier, e.g. for a tenant created since, are retried).
const Resync = 30 * time.Second

// Services syncs Kubernetes Services into serviceLB state while Run runs.
type Services struct {
	cs    kubernetes.Interface
	store ServiceStore
	log   *slog.Logger

	mu       sync.Mutex
	applied  map[string]string // id -> JSON of the record last written successfully
	notes    map[string]string // "ns/name" -> last warning text posted as an Event
	problems map[string]string // id -> JSON of the record whose last write failed

	programmed prometheus.Gauge
	failed     prometheus.Gauge
	warnings   *prometheus.CounterVec
	applies    prometheus.Counter
}

// NewServices builds the syncer.
func NewServices(cs kubernetes.Interface, store ServiceStore, log *slog.Logger) *Services {
	return &Services{
		cs: cs, store: store, log: log.With("component", "k8s-services"),
		applied: map[string]string{}, notes: map[string]string{}, problems: map[string]string{},
		programmed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "contiv_k8s_services", Help: "Kubernetes Services written as serviceLB state by this netmaster (leader only)."}),
		failed:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "contiv_k8s_services_failed", Help: "Kubernetes Services whose serviceLB state could not be written (unknown tenant, node port taken)."}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "contiv_k8s_service_warnings_total",
			Help: "Kubernetes Service features ignored or endpoints left out, by kind."}, []string{"kind"}),
		applies: prometheus.NewCounter(prometheus.CounterOpts{Name: "contiv_k8s_service_writes_total", Help: "serviceLB state records written for Kubernetes Services."}),
	}
}

// Collectors are the syncer's metrics.
func (s *Services) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.programmed, s.failed, s.warnings, s.applies}
}

// Run watches until ctx ends (netmaster runs it while it leads).
func (s *Services) Run(ctx context.Context) {
	w, err := k8s.NewServiceWatcher(s.cs, s.log)
	if err != nil {
		s.log.Error("kubernetes services: no watcher", "err", err)
		return
	}
	s.log.Info("watching Kubernetes Services and EndpointSlices")
	if !w.Run(ctx) {
		return
	}
	s.mu.Lock()
	clear(s.applied) // a new term: write everything once
	s.mu.Unlock()
	tick := time.NewTicker(Resync)
	defer tick.Stop()
	full := true
	for {
		s.sync(ctx, w, full)
		full = false
		select {
		case <-ctx.Done():
			return
		case <-w.Changed():
			// Coalesce a burst (a Service and its slices arrive as several events).
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		case <-tick.C:
			full = true
		}
	}
}

func (s *Services) sync(ctx context.Context, w *k8s.ServiceWatcher, full bool) {
	recs, warns, err := w.Records()
	if err != nil {
		s.log.Warn("kubernetes services: read cache", "err", err)
		return
	}
	keep := map[string]bool{}
	for _, rec := range recs {
		keep[rec.ID] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Prune first: a Service that moved to another tenant frees its node ports for the
	// record under its new id before that one is written.
	if gone, err := s.store.PruneK8sServices(ctx, k8s.ServicePrefix, keep); err != nil {
		s.log.Warn("kubernetes services: prune", "err", err)
	} else {
		for _, id := range gone {
			delete(s.applied, id)
			delete(s.problems, id)
		}
	}
	for _, rec := range recs {
		b, _ := json.Marshal(rec)
		// Unchanged records are not written again until the resync: neither the ones
		// written nor the ones refused (a refused Service costs one transaction and one
		// Event per change of its own, not per change anywhere in the cluster).
		if !full && (s.applied[rec.ID] == string(b) || s.problems[rec.ID] == string(b)) {
			continue
		}
		res := s.store.PutK8sService(ctx, k8s.ServicePrefix, rec)
		ns, name := nsName(rec.ServiceName)
		key := ns + "/" + name
		if res.Err != nil {
			delete(s.applied, rec.ID)
			s.problems[rec.ID] = string(b)
			warns[key] = append(warns[key], "not programmed: "+res.Err.Error())
			continue
		}
		delete(s.problems, rec.ID)
		s.applied[rec.ID] = string(b)
		if res.Written {
			s.applies.Inc()
		}
		if res.Skipped {
			warns[key] = append(warns[key], "not programmed: no endpoint is a Contiv endpoint of a pod in this namespace (a VIP would only blackhole it)")
		}
		if len(res.Dropped) > 0 {
			warns[key] = append(warns[key], fmt.Sprintf("endpoints %s are not Contiv endpoints of pods in namespace %s (tenant %s): left out", strings.Join(res.Dropped, ","), ns, rec.Tenant))
		}
		if len(res.NodePortsDropped) > 0 {
			warns[key] = append(warns[key], "node ports left out: "+strings.Join(res.NodePortsDropped, ", "))
		}
	}
	for id := range s.applied {
		if !keep[id] {
			delete(s.applied, id)
		}
	}
	for id := range s.problems {
		if !keep[id] {
			delete(s.problems, id)
		}
	}
	s.programmed.Set(float64(len(s.applied)))
	s.failed.Set(float64(len(s.problems)))
	// Warnings (and refusals): logged and posted as an Event once per distinct text.
	reportOnce(s.notes, warns, func(key, text string, ws []string) {
		reason := "ContivServicePartlySupported"
		for _, wtext := range ws {
			s.warnings.WithLabelValues(warnKind(wtext)).Inc()
			if strings.HasPrefix(wtext, "not programmed: ") {
				reason = "ContivServiceRefused"
			}
		}
		ns, name, _ := strings.Cut(key, "/")
		s.log.Warn("kubernetes service not fully programmed", "service", key, "warnings", text)
		s.event(ctx, ns, name, corev1.EventTypeWarning, reason, text)
	})
}

// reportOnce calls report for every object ("namespace/name") whose warnings differ from
// what notes says was reported last, and forgets objects without warnings now (so the
// same text comes again if they come back).
func reportOnce(notes map[string]string, warns map[string][]string, report func(key, text string, ws []string)) {
	for _, key := range slices.Sorted(maps.Keys(warns)) {
		text := strings.Join(warns[key], "; ")
		if notes[key] == text {
			continue
		}
		notes[key] = text
		report(key, text, warns[key])
	}
	for key := range notes {
		if _, ok := warns[key]; !ok {
			delete(notes, key)
		}
	}
}

func warnKind(w string) string {
	switch {
	case strings.HasPrefix(w, "not programmed: no endpoint"):
		return "no_contiv_endpoint"
	case strings.HasPrefix(w, "not programmed: "):
		return "refused"
	case strings.HasPrefix(w, "node ports left out"):
		return "node_port"
	case strings.HasPrefix(w, "sessionAffinity"):
		return "session_affinity"
	case strings.Contains(w, "TrafficPolicy"):
		return "traffic_policy"
	case strings.HasPrefix(w, "external"):
		return "external_ips"
	case strings.HasPrefix(w, "port "), strings.HasPrefix(w, "no TCP"):
		return "protocol"
	case strings.HasPrefix(w, "EndpointSlice"):
		return "target_port"
	case strings.HasPrefix(w, "endpoints "):
		return "endpoint_not_contiv"
	}
	return "other"
}

// nsName splits "k8s_<ns>_<name>".
func nsName(serviceName string) (string, string) {
	ns, name, _ := strings.Cut(strings.TrimPrefix(serviceName, k8s.ServicePrefix), "_")
	return ns, name
}

// postEvent posts a Kubernetes Event on an object (best effort: RBAC in
// deploy/kubernetes/rbac.yaml allows it).
func postEvent(ctx context.Context, cs kubernetes.Interface, log *slog.Logger, ref corev1.ObjectReference, typ, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: ref.Name + ".", Namespace: ref.Namespace},
		InvolvedObject: ref,
		Type:           typ, Reason: reason, Message: msg,
		Source:         corev1.EventSource{Component: "contiv-netmaster"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Events(ref.Namespace).Create(ectx, ev, metav1.CreateOptions{}); err != nil {
		log.Debug("post event", "object", ref.Kind+" "+ref.Namespace+"/"+ref.Name, "err", err)
	}
}

// event posts a Kubernetes Event on the Service.
func (s *Services) event(ctx context.Context, ns, name, typ, reason, msg string) {
	postEvent(ctx, s.cs, s.log, corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: ns, Name: name}, typ, reason, msg)
}
