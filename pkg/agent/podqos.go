package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/pkg/netprofile"
	"github.com/contivbpf/contivbpf/pkg/retry"
)

// PodBandwidthWatcher tells of pods' bandwidth annotations as they are listed and as
// they change (pkg/k8s.PodCache implements it). With a PodLabeler that lacks it, the
// annotations are read at attach only.
type PodBandwidthWatcher interface {
	WatchBandwidth(fn func(namespace, name string, ann map[string]string)) error
}

// watchPodBandwidth makes changes of the pods' kubernetes.io/{ingress,egress}-bandwidth
// annotations reach this host's endpoints of the pods live (podBandwidth), as a change of
// their group's netprofile does, at most once per podQoSInterval per pod (podQoSGate).
// Called once the records are read.
func (a *Agent) watchPodBandwidth(ctx context.Context) {
	w, ok := a.cfg.Pods.(PodBandwidthWatcher)
	if !ok {
		return
	}
	go a.retryPodQoSRecords(ctx)
	gate := newPodQoSGate(podQoSInterval, func(ns, name string, ann map[string]string) { a.podBandwidth(ctx, ns, name, ann) })
	if err := w.WatchBandwidth(gate.change); err != nil {
		a.log.Warn("pod bandwidth annotations apply at attach only", "err", err)
	}
}

// podBandwidth applies the bandwidth annotations ann of pod ns/name to this host's
// endpoints of the pod (their record's K8sPod): a changed QoS is written into the
// endpoint's local record (LocalEndpoint.PodQoS, persisted through netmaster) and
// applied by a pass scoped to the endpoint, combined with the group's netprofile as at
// attach (endpointQoS). Annotations that do not parse fail the endpoint (reported in
// /healthz naming the annotation) until they are fixed; it keeps the last annotations
// that parsed, applied in place (endpointOf): never looser than before the change, and
// no veth deleted and made again. Unchanged annotations (the
// informer lists every pod again after a reconnect) touch nothing.
func (a *Agent) podBandwidth(ctx context.Context, ns, name string, ann map[string]string) {
	if ctx.Err() != nil {
		return
	}
	pod := ns + "/" + name
	q, qerr := netprofile.OfPod(ann)
	if qerr != nil {
		qerr = fmt.Errorf("pod %s: %w", pod, qerr)
	}
	var save []LocalEndpoint
	touched := false
	a.mu.Lock()
	for id, l := range a.rec.local {
		if a.rec.eps[id].K8sPod != pod {
			continue
		}
		_, failed := a.rec.podQoSErr[id]
		switch {
		case qerr != nil:
			a.rec.podQoSErr[id] = qerr
			a.rec.dirty.touchEp(id)
			touched = true
		case failed || l.PodQoS != q:
			delete(a.rec.podQoSErr, id)
			if l.PodQoS != q {
				l.PodQoS = q
				save = append(save, l)
			}
			a.rec.setLocal(id, &l)
			touched = true
		}
	}
	a.mu.Unlock()
	if !touched {
		return
	}
	a.trigger()
	if qerr != nil {
		a.log.Warn("pod bandwidth annotations do not parse: its endpoints fail until fixed", "pod", pod, "err", qerr)
	}
	for _, l := range save {
		done, err := a.recordPodQoS(ctx, l)
		if err != nil {
			// Applied; the record is written again with backoff until it is or the
			// endpoint goes (retryPodQoSRecords).
			a.log.Warn("pod bandwidth applied, not recorded yet: retrying", "endpoint", l.ID, "err", err)
			continue
		}
		if done {
			a.log.Info("pod bandwidth changed", "pod", pod, "endpoint", l.ID, "egress", q.EgressRate, "ingress", q.IngressRate)
		}
	}
}

// recordPodQoS writes local endpoint l.ID's record (with its new PodQoS) through
// netmaster, under the attach lock and only while the endpoint is still local with this
// QoS: a detach (which forgets the record under that lock) in between would otherwise be
// followed by this write, leaving a record of an endpoint the host no longer has. It
// writes the record as it stands then, not l: an attach of the same id since l was
// taken recorded its own (another network namespace, say), which l would overwrite.
// done is false when there was nothing to write (detached, or changed again: that change
// writes its record). A failed write is left to retryPodQoSRecords.
func (a *Agent) recordPodQoS(ctx context.Context, l LocalEndpoint) (done bool, err error) {
	a.attachMu.Lock()
	defer a.attachMu.Unlock()
	a.mu.Lock()
	cur, ok := a.rec.local[l.ID]
	a.mu.Unlock()
	if !ok || cur.PodQoS != l.PodQoS {
		return false, nil
	}
	if err := a.writeLocalRecord(ctx, cur); err != nil {
		a.podQoSRetry[l.ID] = true
		select {
		case a.podQoSKick <- struct{}{}:
		default: // a kick is pending
		}
		return false, err
	}
	return true, nil
}

// writeLocalRecord writes local record l through netmaster within masterTimeout.
func (a *Agent) writeLocalRecord(ctx context.Context, l LocalEndpoint) error {
	rctx, cancel := context.WithTimeout(ctx, masterTimeout)
	defer cancel()
	if err := a.cfg.Master.RecordEndpoint(rctx, l); err != nil {
		return fmt.Errorf("record endpoint %s: %w", l.ID, err)
	}
	return nil
}

// retryPodQoSRecords writes the records of the endpoints whose pod bandwidth record
// write failed (podQoSRetry) again, with backoff (pkg/retry), each as it stands at the
// try (a later change of its QoS included), until written or the endpoint is detached;
// it runs until ctx (the agent's, not the request's whose write failed: the CNI ADD's
// recheckPodBandwidth ends before its retry) ends. One loop for the host, however many
// writes failed. Before, a failed write caught up only when the informer listed the pod
// again (at the latest at an agent restart), and an agent restart in between read the
// old QoS from the record.
func (a *Agent) retryPodQoSRecords(ctx context.Context) {
	b := retry.New(podQoSRecordRetry, 30*time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.podQoSKick:
		}
		b.Reset()
		for b.Wait(ctx) {
			if a.retryPodQoSOnce(ctx) {
				break
			}
		}
	}
}

// retryPodQoSOnce is one round of retryPodQoSRecords: each endpoint's write, each under
// the attach lock on its own (an attach or detach waits for one write at most), every
// endpoint tried (one whose write netmaster keeps refusing does not hold up the others).
// It says whether none is left.
func (a *Agent) retryPodQoSOnce(ctx context.Context) (none bool) {
	a.attachMu.Lock()
	ids := slices.Sorted(maps.Keys(a.podQoSRetry))
	a.attachMu.Unlock()
	none = true
	for _, id := range ids {
		if err := a.retryPodQoSRecord(ctx, id); err != nil {
			a.log.Debug("pod bandwidth record: retrying", "endpoint", id, "err", err)
			none = false
		}
	}
	return none
}

// retryPodQoSRecord writes local endpoint id's record as it stands, under the attach
// lock, and forgets the retry unless the write failed (written, or detached).
func (a *Agent) retryPodQoSRecord(ctx context.Context, id string) error {
	a.attachMu.Lock()
	defer a.attachMu.Unlock()
	if !a.podQoSRetry[id] {
		return nil // written meanwhile by another round
	}
	a.mu.Lock()
	cur, ok := a.rec.local[id]
	a.mu.Unlock()
	if ok {
		if err := a.writeLocalRecord(ctx, cur); err != nil {
			return err
		}
		a.log.Info("pod bandwidth recorded after a retry", "endpoint", id)
	}
	delete(a.podQoSRetry, id)
	return nil
}

// recheckPodBandwidth reads pod ns/name's bandwidth annotations again once an attach has
// recorded its endpoint, and applies them if they changed since the CNI ADD read them
// (podBandwidth): the watch reported such a change before the endpoint was recorded,
// found no endpoint of the pod and changed nothing. The watch's handler runs after its
// cache holds the change, so this read sees every change the watch missed. Without a watch
// the annotations apply at attach only.
func (a *Agent) recheckPodBandwidth(ctx context.Context, ns, name string) {
	if _, ok := a.cfg.Pods.(PodBandwidthWatcher); !ok {
		return
	}
	pa, ok := a.cfg.Pods.(PodAnnotator)
	if !ok {
		return
	}
	ann, err := pa.PodAnnotations(ctx, ns, name)
	if err != nil {
		a.log.Warn("pod bandwidth annotations not read again after attach", "pod", ns+"/"+name, "err", err)
		return
	}
	a.podBandwidth(ctx, ns, name, ann)
}

// podQoSInterval is the least time between two applies of one pod's bandwidth
// annotations: a pod owner flipping them cannot make the host recompute and rewrite
// the pod's endpoints, and their records through netmaster, faster than this.
const podQoSInterval = time.Second

// podQoSRecordRetry is the first wait before a failed record write of a pod's new
// bandwidth is tried again (doubling to 30 s).
const podQoSRecordRetry = 200 * time.Millisecond

// podQoSGate passes on each pod's annotation changes at most once per interval: a
// change after a quiet interval is applied at once, changes within the interval after an
// apply wait for its end, and only the last of them is applied (the last value wins).
// A pod is forgotten an interval after its last apply.
type podQoSGate struct {
	interval time.Duration
	apply    func(ns, name string, ann map[string]string)

	mu   sync.Mutex
	pods map[string]*podQoSHeld // by namespace/name: pods applied within the interval
}

// podQoSHeld is a pod applied within the interval: the annotations that came since
// (pending), to apply when it ends.
type podQoSHeld struct {
	ns, name string
	pending  bool
	ann      map[string]string
}

func newPodQoSGate(interval time.Duration, apply func(ns, name string, ann map[string]string)) *podQoSGate {
	return &podQoSGate{interval: interval, apply: apply, pods: map[string]*podQoSHeld{}}
}

// change is the watch's handler: pod ns/name's annotations are now ann.
func (g *podQoSGate) change(ns, name string, ann map[string]string) {
	key := ns + "/" + name
	g.mu.Lock()
	if h, ok := g.pods[key]; ok {
		h.pending, h.ann = true, ann
		g.mu.Unlock()
		return
	}
	g.pods[key] = &podQoSHeld{ns: ns, name: name}
	g.mu.Unlock()
	g.apply(ns, name, ann)
	time.AfterFunc(g.interval, func() { g.expire(key) })
}

// expire ends pod key's interval: what came within it is applied (and starts another),
// or the pod is forgotten.
func (g *podQoSGate) expire(key string) {
	g.mu.Lock()
	h := g.pods[key]
	if !h.pending {
		delete(g.pods, key)
		g.mu.Unlock()
		return
	}
	ann := h.ann
	h.pending, h.ann = false, nil
	g.mu.Unlock()
	g.apply(h.ns, h.name, ann)
	time.AfterFunc(g.interval, func() { g.expire(key) })
}
