package ebpf

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestConcernLocksReadersDoNotWait holds an endpoint apply in its first step (the veth,
// before its policy clock is announced: the StepObserver blocks) and checks that what
// another concern or no concern at all needs completes meanwhile: a /metrics scrape, the
// agent's counters, Status, a conntrack collector pass, a policy listing, and a group
// policy apply and removal. Under one driver lock every one of them waited for the
// endpoint.
func TestConcernLocksReadersDoNotWait(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	ep := h.endpoint(t, "held", "10.50.0.10", true)
	finish := holdEndpointApply(t, h, ep, StepVeth)

	reg := prometheus.NewRegistry()
	reg.MustRegister(h.d.Collector())
	pol := dataplane.PolicySet{EPGID: 9, Rules: []dataplane.PolicyRule{{ID: "r1", Priority: 10, Ingress: true, Proto: 6, Port: 80, Action: dataplane.ActionAllow}}}
	completeWhileHeld(t, "an endpoint apply", []heldCase{
		{"metrics scrape", func() error { _, err := reg.Gather(); return err }},
		{"counters", func() error { _, err := h.d.Counters(ctx); return err }},
		{"status", func() error { _, err := h.d.Status(ctx); return err }},
		{"conntrack collector pass", func() error { _, err := h.d.CTGC(ctx); return err }},
		{"policy apply", func() error { return h.d.UpsertPolicy(ctx, pol) }},
		{"policy listing", func() error {
			l, err := h.d.Listing(dataplane.ListQuery{Kind: "policy"})
			if err == nil && len(l.Rows) == 0 {
				err = fmt.Errorf("no rows, want group %d's rule", pol.EPGID)
			}
			return err
		}},
		{"failed policies", func() error { h.d.FailedPolicies(); return nil }},
		{"policy removal", func() error { return h.d.DeletePolicy(ctx, pol.EPGID) }},
	})
	finish()
}

// TestConcernLocksPolicyApplyHeld holds the group policy's lock as a policy apply does
// and checks that a /metrics scrape (which reports the groups failed closed), the
// counters, a conntrack collector pass, listings of endpoints and conntrack, and an
// endpoint apply complete meanwhile.
func TestConcernLocksPolicyApplyHeld(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.d.Collector())
	ep := h.endpoint(t, "during", "10.50.0.11", true)
	h.d.pols.mu.Lock()
	released := false
	unblock := func() {
		if !released {
			released = true
			h.d.pols.mu.Unlock()
		}
	}
	defer unblock()
	completeWhileHeld(t, "a policy apply", []heldCase{
		{"metrics scrape", func() error { _, err := reg.Gather(); return err }},
		{"counters", func() error { _, err := h.d.Counters(ctx); return err }},
		{"conntrack collector pass", func() error { _, err := h.d.CTGC(ctx); return err }},
		{"endpoint listing", func() error { _, err := h.d.Listing(dataplane.ListQuery{Kind: "endpoints"}); return err }},
		{"conntrack listing", func() error { _, err := h.d.Listing(dataplane.ListQuery{Kind: "ct"}); return err }},
		{"endpoint apply", func() error { return h.d.UpsertEndpoint(ctx, ep) }},
	})
}

// holdEndpointApply starts UpsertEndpoint(ep) and returns once it reached step, where the
// StepObserver holds it; finish releases it and fails the test unless it then succeeds
// (a test that ends earlier releases it when it is cleaned up).
func holdEndpointApply(t *testing.T, h *oneHost, ep dataplane.Endpoint, step string) (finish func()) {
	t.Helper()
	held, release := make(chan struct{}), make(chan struct{})
	h.d.cfg.StepObserver = func(s string, _ time.Duration) {
		if s == step {
			close(held)
			<-release
		}
	}
	applied := make(chan error, 1)
	go func() { applied <- h.d.UpsertEndpoint(context.Background(), ep) }()
	released := false
	unblock := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(unblock)
	select {
	case <-held:
	case err := <-applied:
		t.Fatalf("endpoint apply ended before its %s step: %v", step, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("endpoint apply never reached its %s step", step)
	}
	return func() {
		t.Helper()
		unblock()
		select {
		case err := <-applied:
			if err != nil {
				t.Fatalf("held endpoint apply: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("held endpoint apply did not finish once released")
		}
		h.d.cfg.StepObserver = nil
	}
}

type heldCase struct {
	name string
	fn   func() error
}

// completeWhileHeld runs each case in turn and fails when one errs or takes longer than a
// few seconds while what (another concern's apply) holds its lock.
func completeWhileHeld(t *testing.T, what string, cases []heldCase) {
	t.Helper()
	for _, c := range cases {
		done := make(chan error, 1)
		go func() { done <- c.fn() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s while %s is held: %v", c.name, what, err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%s waited for %s (another concern's lock)", c.name, what)
		}
	}
}

// TestConcernLocksEndpointNetlinkOutsideClock holds a new endpoint's apply right after its
// map entries (StepMaps: before its tcx attach) and again after its tcx attach (StepTCX:
// before its host route), and checks each time that a group policy apply and removal,
// which take the policy clock, complete meanwhile: the endpoint's change publishes the
// clock before that netlink work. Publishing when the apply returned held clockMu across
// every netlink call of the attach and the host route; held only at StepTCX, a publish
// moved after the attach went unnoticed.
func TestConcernLocksEndpointNetlinkOutsideClock(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	pol := dataplane.PolicySet{EPGID: 9, Rules: []dataplane.PolicyRule{{ID: "r1", Priority: 10, Ingress: true, Proto: 6, Port: 80, Action: dataplane.ActionAllow}}}
	var eps []dataplane.Endpoint
	for i, step := range []string{StepMaps, StepTCX} {
		ep := h.endpoint(t, "clock"+step[:1], fmt.Sprintf("10.50.0.%d", 12+i), true)
		eps = append(eps, ep)
		finish := holdEndpointApply(t, h, ep, step)
		completeWhileHeld(t, "an endpoint apply's netlink work (held at "+step+")", []heldCase{
			{"policy apply", func() error { return h.d.UpsertPolicy(ctx, pol) }},
			{"policy removal", func() error { return h.d.DeletePolicy(ctx, pol.EPGID) }},
		})
		finish()
	}
	drift, err := h.d.Verify(dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: eps})
	if err != nil || len(drift) != 0 {
		t.Fatalf("after the applies: drift %v, err %v", drift, err)
	}
}

// TestConcernLocksVerifyNetpolApplyHeld holds the NetworkPolicy lock as a pod policy apply
// does and checks that Verify, which reads no NetworkPolicy state, completes meanwhile and
// still finds what it reads (an endpoint left out of the state is reported). Verify took
// every concern's read lock and waited.
func TestConcernLocksVerifyNetpolApplyHeld(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	ep := h.endpoint(t, "verify", "10.50.0.13", true)
	if err := h.d.UpsertEndpoint(ctx, ep); err != nil {
		t.Fatal(err)
	}
	h.d.np.mu.Lock()
	released := false
	unblock := func() {
		if !released {
			released = true
			h.d.np.mu.Unlock()
		}
	}
	defer unblock()
	completeWhileHeld(t, "a pod policy apply", []heldCase{
		{"verify", func() error {
			drift, err := h.d.Verify(dataplane.State{Networks: []dataplane.Network{h.net}})
			if err == nil && len(drift) == 0 {
				err = fmt.Errorf("no drift, want endpoint %s's entries reported extra", ep.ID)
			}
			return err
		}},
	})
}
