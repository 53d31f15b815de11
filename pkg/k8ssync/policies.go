package k8ssync

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// PolicyStore is where the per-pod NetworkPolicy records go (pkg/master.Master).
type PolicyStore interface {
	K8sPodEndpoints(ctx context.Context) (map[string][]master.K8sPodEndpoint, error)
	PutK8sPodPolicy(ctx context.Context, rec model.K8sPodPolicy) (bool, error)
	DeleteK8sPodPolicy(ctx context.Context, id string) error
	K8sPodPolicyIDs(ctx context.Context) ([]string, error)
	WatchEndpoints(ctx context.Context, changed func()) error
}

// Policies syncs Kubernetes NetworkPolicies into per-pod records while Run runs.
type Policies struct {
	cs    kubernetes.Interface
	store PolicyStore
	log   *slog.Logger

	mu      sync.Mutex
	applied map[string]string // endpoint id -> JSON of the record last written
	notes   map[string]string // policy "ns/name" -> last warning text posted

	isolated prometheus.Gauge
	warnings *prometheus.CounterVec
	writes   prometheus.Counter
	errors   prometheus.Counter
}

// NewPolicies builds the syncer.
func NewPolicies(cs kubernetes.Interface, store PolicyStore, log *slog.Logger) *Policies {
	return &Policies{
		cs: cs, store: store, log: log.With("component", "k8s-networkpolicy"),
		applied: map[string]string{}, notes: map[string]string{},
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "contiv_k8s_netpol_pods", Help: "Pod endpoints some NetworkPolicy selects (isolated in at least one direction), written by this netmaster (leader only)."}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "contiv_k8s_netpol_warnings_total",
			Help: "NetworkPolicy parts not compiled (they narrow access, never widen it), by kind."}, []string{"kind"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{Name: "contiv_k8s_netpol_writes_total", Help: "Per-pod NetworkPolicy records written or deleted."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "contiv_k8s_netpol_write_errors_total", Help: "Per-pod NetworkPolicy records that could not be written (retried on the next change or resync)."}),
	}
}

// Collectors are the syncer's metrics.
func (p *Policies) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.isolated, p.warnings, p.writes, p.errors}
}

// Run watches until ctx ends (netmaster runs it while it leads).
func (p *Policies) Run(ctx context.Context) {
	w, err := k8s.NewPolicyWatcher(p.cs)
	if err != nil {
		p.log.Error("kubernetes networkpolicies: no watcher", "err", err)
		return
	}
	p.log.Info("watching Kubernetes NetworkPolicies, pods and namespaces")
	if !w.Run(ctx) {
		return
	}
	eps := make(chan struct{}, 1)
	go func() {
		err := p.store.WatchEndpoints(ctx, func() {
			select {
			case eps <- struct{}{}:
			default:
			}
		})
		if err != nil && ctx.Err() == nil {
			p.log.Error("kubernetes networkpolicies: endpoint watch ended", "err", err)
		}
	}()
	p.mu.Lock()
	clear(p.applied) // a new term: compare against the store once
	p.mu.Unlock()
	tick := time.NewTicker(Resync)
	defer tick.Stop()
	full := true
	for {
		p.sync(ctx, w, full)
		full = false
		select {
		case <-ctx.Done():
			return
		case <-w.Changed():
		case <-eps:
		case <-tick.C:
			full = true
			continue
		}
		// Coalesce a burst (a namespace relabelled, a deployment's pods).
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *Policies) sync(ctx context.Context, w *k8s.PolicyWatcher, full bool) {
	pols, pods, nsLabels, err := w.Inputs()
	if err != nil {
		p.log.Warn("kubernetes networkpolicies: read cache", "err", err)
		return
	}
	eps, err := p.store.K8sPodEndpoints(ctx)
	if err != nil {
		p.log.Warn("kubernetes networkpolicies: read endpoints", "err", err)
		return
	}
	want, warns := k8s.CompilePolicies(pols, podEndpoints(pods, eps), nsLabels)

	p.mu.Lock()
	defer p.mu.Unlock()
	if full || len(p.applied) == 0 {
		// What the store holds (a new term, a resync): records this leader did not write
		// are compared and pruned too.
		ids, err := p.store.K8sPodPolicyIDs(ctx)
		if err != nil {
			p.log.Warn("kubernetes networkpolicies: list records", "err", err)
			return
		}
		for _, id := range ids {
			if _, ok := p.applied[id]; !ok {
				p.applied[id] = "?" // unknown content: rewritten or deleted below
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(p.applied)) {
		if _, ok := want[id]; ok {
			continue
		}
		if err := p.store.DeleteK8sPodPolicy(ctx, id); err != nil {
			p.errors.Inc()
			p.log.Warn("kubernetes networkpolicies: delete record", "endpoint", id, "err", err)
			continue
		}
		p.writes.Inc()
		delete(p.applied, id)
	}
	for _, id := range slices.Sorted(maps.Keys(want)) {
		rec := want[id]
		b, _ := json.Marshal(rec)
		if p.applied[id] == string(b) && !full {
			continue
		}
		written, err := p.store.PutK8sPodPolicy(ctx, rec)
		if err != nil {
			// The endpoint went away under us (its deletion removes the record too) or
			// the store failed: retried on the next change or resync.
			p.errors.Inc()
			delete(p.applied, id)
			p.log.Warn("kubernetes networkpolicies: write record", "endpoint", id, "pod", rec.Pod, "err", err)
			continue
		}
		if written {
			p.writes.Inc()
		}
		p.applied[id] = string(b)
	}
	p.isolated.Set(float64(len(want)))
	reportOnce(p.notes, warns, func(key, text string, ws []string) {
		for _, wt := range ws {
			p.warnings.WithLabelValues(policyWarnKind(wt)).Inc()
		}
		ns, name, _ := strings.Cut(key, "/")
		p.log.Warn("kubernetes networkpolicy partly compiled (access narrowed)", "networkpolicy", key, "warnings", text)
		postEvent(ctx, p.cs, p.log, corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Namespace: ns, Name: name},
			corev1.EventTypeWarning, "ContivNetworkPolicyPartlySupported", text)
	})
}

func policyWarnKind(w string) string {
	switch {
	case strings.Contains(w, "tenants never reach"):
		return "other_tenant"
	case strings.Contains(w, "named port"):
		return "named_port"
	case strings.Contains(w, "ipBlock"):
		return "ip_block"
	case strings.Contains(w, "protocol"):
		return "protocol"
	case strings.Contains(w, "Selector"):
		return "selector"
	case strings.Contains(w, "rules after merging prefixes, at most"):
		return "too_many_rules"
	}
	return "other"
}

// podEndpoints gives each pod its Contiv endpoints, one entry per endpoint: every endpoint a
// pod has is isolated (and a peer) alike. An endpoint is a pod's only on the pod's node
// (agents' host labels are node names): an agent of another host that records a pod's
// name for an endpoint of its own does not make it that pod, a peer other pods' rules
// admit.
func podEndpoints(pods []k8s.PolicyPod, eps map[string][]master.K8sPodEndpoint) []k8s.PolicyPod {
	var out []k8s.PolicyPod
	for _, pod := range pods {
		for _, ep := range eps[pod.Key()] {
			if ep.Host != pod.Node {
				continue
			}
			pod.EndpointID, pod.IP, pod.Tenant = ep.ID, ep.IP, ep.Tenant
			out = append(out, pod)
		}
	}
	return out
}
