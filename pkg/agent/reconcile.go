package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// applied is what the agent believes the driver holds, keyed like the error map.
type applied struct {
	nets  map[string]dataplane.Network
	eps   map[string]dataplane.Endpoint
	reps  map[string]dataplane.RemoteEndpoint
	peers map[string]dataplane.Peer
	pols  map[uint16]dataplane.PolicySet
	svcs  map[string]dataplane.Service
	pps   map[string]dataplane.PodPolicy
}

func appliedFrom(s dataplane.State) applied {
	a := applied{
		nets: map[string]dataplane.Network{}, eps: map[string]dataplane.Endpoint{},
		reps: map[string]dataplane.RemoteEndpoint{}, peers: map[string]dataplane.Peer{},
		pols: map[uint16]dataplane.PolicySet{}, svcs: map[string]dataplane.Service{},
		pps: map[string]dataplane.PodPolicy{},
	}
	for _, n := range s.Networks {
		a.nets[n.ID] = n
	}
	for _, e := range s.Endpoints {
		a.eps[e.ID] = e
	}
	for _, e := range s.RemoteEndpoints {
		a.reps[e.ID] = e
	}
	for _, p := range s.Peers {
		a.peers[p.Host] = p
	}
	for _, p := range s.Policies {
		a.pols[p.EPGID] = p
	}
	for _, v := range s.Services {
		a.svcs[v.ID] = v
	}
	for _, v := range s.PodPolicies {
		a.pps[v.ID] = v
	}
	return a
}

// state is the applied objects as a driver State.
func (a *applied) state() dataplane.State {
	var s dataplane.State
	for _, v := range a.nets {
		s.Networks = append(s.Networks, v)
	}
	for _, v := range a.eps {
		s.Endpoints = append(s.Endpoints, v)
	}
	for _, v := range a.reps {
		s.RemoteEndpoints = append(s.RemoteEndpoints, v)
	}
	for _, v := range a.peers {
		s.Peers = append(s.Peers, v)
	}
	for _, v := range a.pols {
		s.Policies = append(s.Policies, v)
	}
	for _, v := range a.svcs {
		s.Services = append(s.Services, v)
	}
	for _, v := range a.pps {
		s.PodPolicies = append(s.PodPolicies, v)
	}
	sortState(&s)
	return s
}

// op is one driver call of a reconcile pass.
type op struct {
	key string // "endpoint/<id>", ...
	do  func(ctx context.Context) error
	ok  func() // updates the applied state after success
}

// plan diffs desired against applied. Deletes come first, dependents before what they
// depend on (endpoints before networks); upserts follow in the opposite order.
func (a *applied) plan(d dplan, want applied) []op {
	var ops []op
	for id := range a.svcs {
		if _, ok := want.svcs[id]; !ok {
			ops = append(ops, op{"service/" + id, func(ctx context.Context) error { return d.DeleteService(ctx, id) }, func() { delete(a.svcs, id) }})
		}
	}
	for id := range a.pps {
		if _, ok := want.pps[id]; !ok {
			ops = append(ops, op{"pod-policy/" + id, func(ctx context.Context) error { return d.DeletePodPolicy(ctx, id) }, func() { delete(a.pps, id) }})
		}
	}
	for id := range a.pols {
		if _, ok := want.pols[id]; !ok {
			ops = append(ops, op{fmt.Sprintf("policy/%d", id), func(ctx context.Context) error { return d.DeletePolicy(ctx, id) }, func() { delete(a.pols, id) }})
		}
	}
	for id := range a.reps {
		if _, ok := want.reps[id]; !ok {
			ops = append(ops, op{"remote-endpoint/" + id, func(ctx context.Context) error { return d.DeleteRemoteEndpoint(ctx, id) }, func() { delete(a.reps, id) }})
		}
	}
	for id := range a.eps {
		if _, ok := want.eps[id]; !ok {
			ops = append(ops, op{"endpoint/" + id, func(ctx context.Context) error { return d.DeleteEndpoint(ctx, id) }, func() { delete(a.eps, id) }})
		}
	}
	for id := range a.peers {
		if _, ok := want.peers[id]; !ok {
			ops = append(ops, op{"peer/" + id, func(ctx context.Context) error { return d.DeletePeer(ctx, id) }, func() { delete(a.peers, id) }})
		}
	}
	for id := range a.nets {
		if _, ok := want.nets[id]; !ok {
			ops = append(ops, op{"network/" + id, func(ctx context.Context) error { return d.DeleteNetwork(ctx, id) }, func() { delete(a.nets, id) }})
		}
	}
	for id, n := range want.nets {
		if cur, ok := a.nets[id]; !ok || !reflect.DeepEqual(cur, n) {
			ops = append(ops, op{"network/" + id, func(ctx context.Context) error { return d.UpsertNetwork(ctx, n) }, func() { a.nets[id] = n }})
		}
	}
	for id, p := range want.peers {
		if cur, ok := a.peers[id]; !ok || cur != p {
			ops = append(ops, op{"peer/" + id, func(ctx context.Context) error { return d.UpsertPeer(ctx, p) }, func() { a.peers[id] = p }})
		}
	}
	for id, p := range want.pols {
		if cur, ok := a.pols[id]; !ok || !reflect.DeepEqual(cur, p) {
			ops = append(ops, op{fmt.Sprintf("policy/%d", id), func(ctx context.Context) error { return d.UpsertPolicy(ctx, p) }, func() { a.pols[id] = p }})
		}
	}
	for id, e := range want.eps {
		if cur, ok := a.eps[id]; !ok || !reflect.DeepEqual(cur, e) {
			ops = append(ops, op{"endpoint/" + id, func(ctx context.Context) error { return d.UpsertEndpoint(ctx, e) }, func() { a.eps[id] = e }})
		}
	}
	for id, e := range want.reps {
		if cur, ok := a.reps[id]; !ok || !reflect.DeepEqual(cur, e) {
			ops = append(ops, op{"remote-endpoint/" + id, func(ctx context.Context) error { return d.UpsertRemoteEndpoint(ctx, e) }, func() { a.reps[id] = e }})
		}
	}
	for id, v := range want.svcs {
		if cur, ok := a.svcs[id]; !ok || !reflect.DeepEqual(cur, v) {
			ops = append(ops, op{"service/" + id, func(ctx context.Context) error { return d.UpsertService(ctx, v) }, func() { a.svcs[id] = v }})
		}
	}
	// After the endpoints (a pod's own address is attached first); before nothing.
	for id, v := range want.pps {
		if cur, ok := a.pps[id]; !ok || !reflect.DeepEqual(cur, v) {
			ops = append(ops, op{"pod-policy/" + id, func(ctx context.Context) error { return d.UpsertPodPolicy(ctx, v) }, func() { a.pps[id] = v }})
		}
	}
	return ops
}

// dplan is the part of the driver a reconcile pass calls.
type dplan interface {
	UpsertNetwork(ctx context.Context, n dataplane.Network) error
	DeleteNetwork(ctx context.Context, id string) error
	UpsertEndpoint(ctx context.Context, ep dataplane.Endpoint) error
	DeleteEndpoint(ctx context.Context, id string) error
	UpsertRemoteEndpoint(ctx context.Context, ep dataplane.RemoteEndpoint) error
	DeleteRemoteEndpoint(ctx context.Context, id string) error
	UpsertPeer(ctx context.Context, p dataplane.Peer) error
	DeletePeer(ctx context.Context, host string) error
	UpsertPolicy(ctx context.Context, p dataplane.PolicySet) error
	DeletePolicy(ctx context.Context, epgID uint16) error
	UpsertService(ctx context.Context, s dataplane.Service) error
	DeleteService(ctx context.Context, id string) error
	UpsertPodPolicy(ctx context.Context, p dataplane.PodPolicy) error
	DeletePodPolicy(ctx context.Context, id string) error
}

// reconcile runs one pass: a full Sync until the first one succeeded, then the diff.
// It returns the driver errors of this pass by object key (worth retrying); every error,
// including records that cannot be used, is kept for the inspect API.
func (a *Agent) reconcile(ctx context.Context) map[string]error {
	// The BGP loop advertises what is applied: it looks again after every pass (an
	// attach's too).
	defer func() {
		select {
		case a.bgpKick <- struct{}{}:
		default:
		}
	}()
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	want, bad := a.desired()
	errs := map[string]error{}
	defer func() {
		all := map[string]error{}
		for k, err := range bad {
			all[k] = err
		}
		for k, err := range errs {
			all[k] = err
		}
		a.setErrors(all)
	}()
	if !a.synced {
		start := time.Now()
		err := a.driver.Sync(ctx, want)
		a.metrics.observeSync(err, time.Since(start))
		if err == nil {
			a.applied = appliedFrom(want)
			a.synced = true
			a.log.Info("driver synced", "networks", len(want.Networks), "endpoints", len(want.Endpoints),
				"remote-endpoints", len(want.RemoteEndpoints), "peers", len(want.Peers), "took", time.Since(start).Round(time.Millisecond))
			return errs
		}
		// The driver refused something (a failed Sync writes what it can and sweeps
		// nothing). One bad object must not hold the host hostage: find the refused
		// objects by applying each on its own, then Sync what the driver accepted so stale
		// entries are swept. The refused objects stay reported and are retried one by one.
		a.log.Warn("full driver sync failed; applying objects one by one", "err", err)
		a.applied = appliedFrom(dataplane.State{})
		for _, o := range a.applied.plan(a.driver, appliedFrom(want)) {
			if oerr := o.do(ctx); oerr != nil {
				errs[o.key] = oerr
				a.metrics.opErrors.Inc()
				continue
			}
			o.ok()
		}
		part := a.applied.state()
		start = time.Now()
		err = a.driver.Sync(ctx, part)
		a.metrics.observeSync(err, time.Since(start))
		if err != nil {
			errs["sync"] = fmt.Errorf("driver sync: %w", err)
			return errs
		}
		a.synced = true
		a.log.Warn("driver synced without the objects it refused", "refused", len(errs))
		return errs
	}
	ops := a.applied.plan(a.driver, appliedFrom(want))
	for _, o := range ops {
		if err := o.do(ctx); err != nil {
			errs[o.key] = err
			a.metrics.opErrors.Inc()
			a.log.Warn("driver call failed", "object", o.key, "err", err)
			continue
		}
		o.ok()
	}
	if len(ops) > 0 {
		a.metrics.observeSync(errors.Join(mapErrs(errs)...), 0)
	}
	return errs
}

func mapErrs(m map[string]error) []error {
	out := make([]error, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	return out
}
