package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// op is one driver call of a reconcile pass.
type op struct {
	key  string // "endpoint/<id>", ...
	verb string // "upsert" or "delete"
	do   func(ctx context.Context) error
	ok   func() // updates the applied state after success
}

// plan diffs want against have (what the driver holds) within sc: everything when
// sc.all, otherwise only the endpoints (local, remote, pod policy) and services sc
// names, the rule sets of sc.groups (all when sc.pols), and the peers (want then holds just those objects).
// Deletes come first, dependents before what they depend on (endpoints before
// networks); upserts follow in the opposite order. Each op's ok updates have.
func plan(d dplan, have, want *dataplane.Index, sc scope) []op {
	var ops []op
	epIDs, svcIDs := sc.eps, sc.svcs
	if sc.all {
		epIDs, svcIDs = nil, nil
	} else {
		// Non-nil even when empty: nil means every key.
		epIDs, svcIDs = orEmpty(epIDs), orEmpty(svcIDs)
	}
	deletes(&ops, "service/", have.Services, want.Services, svcIDs, d.DeleteService)
	deletes(&ops, "pod-policy/", have.PodPolicies, want.PodPolicies, epIDs, d.DeletePodPolicy)
	var groups map[uint16]struct{} // nil: every group
	if !sc.all && !sc.pols {
		groups = sc.groups
		if groups == nil {
			groups = map[uint16]struct{}{}
		}
	}
	deletes(&ops, "policy/", have.Policies, want.Policies, groups, d.DeletePolicy)
	deletes(&ops, "remote-endpoint/", have.RemoteEndpoints, want.RemoteEndpoints, epIDs, d.DeleteRemoteEndpoint)
	deletes(&ops, "endpoint/", have.Endpoints, want.Endpoints, epIDs, d.DeleteEndpoint)
	deletes(&ops, "peer/", have.Peers, want.Peers, nil, d.DeletePeer)
	if sc.all {
		deletes(&ops, "network/", have.Networks, want.Networks, nil, d.DeleteNetwork)
		upserts(&ops, "network/", have.Networks, want.Networks, nil, d.UpsertNetwork)
	}
	upserts(&ops, "peer/", have.Peers, want.Peers, nil, d.UpsertPeer)
	upserts(&ops, "policy/", have.Policies, want.Policies, groups, d.UpsertPolicy)
	upserts(&ops, "endpoint/", have.Endpoints, want.Endpoints, epIDs, d.UpsertEndpoint)
	upserts(&ops, "remote-endpoint/", have.RemoteEndpoints, want.RemoteEndpoints, epIDs, d.UpsertRemoteEndpoint)
	upserts(&ops, "service/", have.Services, want.Services, svcIDs, d.UpsertService)
	// After the endpoints (a pod's own address is attached first); before nothing.
	upserts(&ops, "pod-policy/", have.PodPolicies, want.PodPolicies, epIDs, d.UpsertPodPolicy)
	return ops
}

func orEmpty(m map[string]struct{}) map[string]struct{} {
	if m == nil {
		return map[string]struct{}{}
	}
	return m
}

// deletes plans the removal of what have holds and want does not, among ids (nil: all).
func deletes[K comparable, V any](ops *[]op, kind string, have, want map[K]V, ids map[K]struct{}, del func(context.Context, K) error) {
	one := func(id K) {
		if _, ok := have[id]; !ok {
			return
		}
		if _, ok := want[id]; ok {
			return
		}
		*ops = append(*ops, op{kind + fmt.Sprint(id), "delete", func(ctx context.Context) error { return del(ctx, id) }, func() { delete(have, id) }})
	}
	eachID(have, ids, one)
}

// upserts plans writing what want holds and have lacks or holds differently, among ids
// (nil: all).
func upserts[K comparable, V any](ops *[]op, kind string, have, want map[K]V, ids map[K]struct{}, up func(context.Context, V) error) {
	one := func(id K) {
		v, ok := want[id]
		if !ok {
			return
		}
		if cur, ok := have[id]; ok && reflect.DeepEqual(cur, v) {
			return
		}
		*ops = append(*ops, op{kind + fmt.Sprint(id), "upsert", func(ctx context.Context) error { return up(ctx, v) }, func() { have[id] = v }})
	}
	eachID(want, ids, one)
}

// eachID calls f for every id of ids, or of all when ids is nil.
func eachID[K comparable, V any](all map[K]V, ids map[K]struct{}, f func(K)) {
	if ids == nil {
		for id := range all {
			f(id)
		}
		return
	}
	for id := range ids {
		f(id)
	}
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
	v := a.desired(!a.synced, a.retry)
	a.retry = scope{}
	if v.sc.all {
		a.bad = v.bad
	} else {
		dropScoped(a.bad, v.sc)
		maps.Copy(a.bad, v.bad)
	}
	want := v.full
	errs := map[string]error{}
	defer func() {
		all := maps.Clone(a.bad)
		maps.Copy(all, errs)
		a.setErrors(all)
		// A failed driver call is retried by the next pass (its object is not applied):
		// an endpoint, service or pod policy by its id, anything else by a full pass.
		a.retry = retryScope(errs)
	}()
	// (Registered after the errors' defer: it runs first, and its error is among them.)
	defer func() {
		if err := a.applyDenyList(ctx, v); err != nil {
			errs[denyListKey] = err
		}
	}()
	if v.sc.empty() && a.synced {
		return errs // nothing changed
	}
	if !a.synced {
		start := time.Now()
		err := a.driver.Sync(ctx, want)
		a.metrics.observeSync(err, time.Since(start))
		if err == nil {
			a.applied = v.want
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
		a.applied = dataplane.NewIndex()
		for _, o := range plan(a.driver, a.applied, v.want, v.sc) {
			if oerr := o.do(ctx); oerr != nil {
				errs[o.key] = oerr
				a.metrics.opErrors.Inc()
				continue
			}
			o.ok()
		}
		part := a.applied.State()
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
	ops := plan(a.driver, a.applied, v.want, v.sc)
	for _, o := range ops {
		start := time.Now()
		err := o.do(ctx)
		a.metrics.observeCall(o, time.Since(start))
		if err != nil {
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

// retryScope is what the next pass must redo for the failed driver calls keyed in errs.
func retryScope(errs map[string]error) scope {
	var sc scope
	for k := range errs {
		kind, id, _ := strings.Cut(k, "/")
		switch kind {
		case "endpoint", "remote-endpoint", "pod-policy":
			sc.touchEp(id)
		case "service":
			sc.touchSvc(id)
		case "policy":
			if g, err := strconv.ParseUint(id, 10, 16); err == nil && g > 0 {
				sc.touchGroup(uint16(g))
			} else {
				sc.pols = true
			}
		default: // network, peer, sync
			return scope{all: true}
		}
	}
	return sc
}

func mapErrs(m map[string]error) []error {
	out := make([]error, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	return out
}
