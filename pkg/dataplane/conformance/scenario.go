package conformance

import (
	"fmt"
	"slices"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// scenario is one named check of a suite, run as a subtest of that name.
type scenario struct {
	name string
	// ownHosts: run restarts or replaces a host's driver, so it gets a pair of hosts of
	// its own instead of the pair the suite's other scenarios share.
	ownHosts bool
	// hostConfig, with ownHosts, changes the HostConfig of the hosts built for this
	// scenario before their drivers start (a small CTQuota, say).
	hostConfig func(*dataplane.HostConfig)
	// run gets hosts that hold only their baseline (see runScenarios) and creates the
	// containers and objects it checks; it may leave them behind.
	run func(t *testing.T, e *Env)
}

// runScenarios runs each scenario as a subtest of t. The scenarios run in order but do
// not depend on it: each creates its own containers (namespaces of its own, named with
// a prefix of its own) and programs its own objects, so any one runs alone
// (go test -run 'Test/<name>$'), in any order, and a failure does not carry over.
//
// Starting a driver costs seconds (the eBPF verifier, a private OVS per host), so the
// scenarios share one pair of hosts from newEnv, and only the hosts: before a scenario
// both hold just their baseline (the networks newEnv put in their State, each other as a
// peer); when it ends, passed or failed, both are synced back to that baseline, which
// removes every endpoint, remote endpoint, peer, policy, pod policy, service and network
// it added. If that Sync fails, the pair is left to t's cleanup and the next scenario
// gets a new one. A scenario with ownHosts gets a new pair from newEnv instead, built
// with its hostConfig.
func runScenarios(t *testing.T, newEnv func(t *testing.T, tweak func(*dataplane.HostConfig)) *Env, scenarios []scenario) {
	t.Helper()
	var shared *sharedHosts
	for i, s := range scenarios {
		if s.ownHosts {
			t.Run(s.name, func(t *testing.T) { s.run(t, newEnv(t, s.hostConfig)) })
			continue
		}
		if s.hostConfig != nil {
			t.Fatalf("scenario %s: a host config of its own needs hosts of its own (ownHosts)", s.name)
		}
		if shared == nil {
			shared = newSharedHosts(t, newEnv(t, nil))
		}
		restored := true
		t.Run(s.name, func(t *testing.T) {
			e := shared.begin(i)
			// Deferred, not a cleanup: the hosts are brought back while the scenario's
			// namespaces still exist (as a CNI DEL precedes a container's removal).
			defer func() { restored = shared.restore(t) }()
			s.run(t, e)
		})
		if !restored {
			shared = nil
		}
	}
}

// sharedHosts is the pair of hosts the scenarios of one suite share, with the state each
// scenario starts from.
type sharedHosts struct {
	env      *Env
	baseline map[*Host]dataplane.State
}

// newSharedHosts makes e's hosts peers of each other and programs that baseline.
func newSharedHosts(t *testing.T, e *Env) *sharedHosts {
	t.Helper()
	s := &sharedHosts{env: e, baseline: map[*Host]dataplane.State{
		e.H1: {Networks: e.H1.State.Networks, Peers: []dataplane.Peer{e.H2.Peer()}},
		e.H2: {Networks: e.H2.State.Networks, Peers: []dataplane.Peer{e.H1.Peer()}},
	}}
	for _, h := range []*Host{e.H1, e.H2} {
		h.State = s.fresh(h)
		h.Sync(t)
	}
	return s
}

// fresh returns a copy of h's baseline that a scenario may append to.
func (s *sharedHosts) fresh(h *Host) dataplane.State {
	b := s.baseline[h]
	return dataplane.State{Networks: slices.Clone(b.Networks), Peers: slices.Clone(b.Peers)}
}

// begin returns the shared hosts for scenario i: the baseline in their State and a name
// prefix no other scenario uses.
func (s *sharedHosts) begin(i int) *Env {
	e := *s.env
	e.Prefix = fmt.Sprintf("%s%02x", s.env.Prefix, i)
	for _, h := range []*Host{e.H1, e.H2} {
		h.State = s.fresh(h)
	}
	return &e
}

// restore syncs both hosts back to their baseline and reports whether they got there.
func (s *sharedHosts) restore(t *testing.T) bool {
	t.Helper()
	ok := true
	for _, h := range []*Host{s.env.H1, s.env.H2} {
		h.State = s.fresh(h)
		if err := h.sync(); err != nil {
			t.Errorf("restore to the baseline: %v (the next scenario gets new hosts)", err)
			ok = false
		}
	}
	return ok
}
