package agent

import (
	"context"
	"fmt"

	"github.com/contivbpf/contivbpf/pkg/netprofile"
)

// PodBandwidthWatcher tells of pods' bandwidth annotations as they are listed and as
// they change (pkg/k8s.PodCache implements it). With a PodLabeler that lacks it, the
// annotations are read at attach only.
type PodBandwidthWatcher interface {
	WatchBandwidth(fn func(namespace, name string, ann map[string]string)) error
}

// watchPodBandwidth makes changes of the pods' kubernetes.io/{ingress,egress}-bandwidth
// annotations reach this host's endpoints of the pods live (podBandwidth), as a change of
// their group's netprofile does. Called once the records are read.
func (a *Agent) watchPodBandwidth(ctx context.Context) {
	w, ok := a.cfg.Pods.(PodBandwidthWatcher)
	if !ok {
		return
	}
	if err := w.WatchBandwidth(func(ns, name string, ann map[string]string) { a.podBandwidth(ctx, ns, name, ann) }); err != nil {
		a.log.Warn("pod bandwidth annotations apply at attach only", "err", err)
	}
}

// podBandwidth applies the bandwidth annotations ann of pod ns/name to this host's
// endpoints of the pod (their record's K8sPod): a changed QoS is written into the
// endpoint's local record (LocalEndpoint.PodQoS, persisted through netmaster) and
// applied by a pass scoped to the endpoint, combined with the group's netprofile as at
// attach (endpointQoS). Annotations that do not parse fail the endpoint (reported in
// /healthz naming the annotation, left out of the datapath: a limit fails closed, the
// endpoint never runs unlimited for it) until they are fixed. Unchanged annotations (the
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
	// The records are written under the attach lock, each only while its endpoint is still
	// local with this QoS: a detach (which forgets the record under that lock) in between
	// would otherwise be followed by this write, leaving a record of an endpoint the host
	// no longer has.
	a.attachMu.Lock()
	defer a.attachMu.Unlock()
	for _, l := range save {
		a.mu.Lock()
		cur, ok := a.rec.local[l.ID]
		a.mu.Unlock()
		if !ok || cur.PodQoS != l.PodQoS {
			continue // detached, or changed again (that change writes its record)
		}
		rctx, cancel := context.WithTimeout(ctx, masterTimeout)
		err := a.cfg.Master.RecordEndpoint(rctx, l)
		cancel()
		if err != nil {
			// Applied; the record catches up when the informer lists the pod again (at
			// the latest when the agent restarts).
			a.log.Warn("pod bandwidth applied, not recorded", "endpoint", l.ID, "err", err)
			continue
		}
		a.log.Info("pod bandwidth changed", "pod", pod, "endpoint", l.ID, "egress", q.EgressRate, "ingress", q.IngressRate)
	}
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
