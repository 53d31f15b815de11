package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// TestElectionStepsDownBeforeLeaseExpiry: when the leader cannot reach etcd it must stop
// acting as leader within about TTL/2, before etcd expires its lease and another
// candidate takes the lock: there is never a moment with two leaders.
func TestElectionStepsDownBeforeLeaseExpiry(t *testing.T) {
	direct, url := statetest.Store(t)
	proxy := statetest.NewProxy(t, url)
	viaProxy, err := state.Open(context.Background(), []string{proxy.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })

	const ttl = 2 * time.Second
	a, _ := startElection(t, viaProxy, "10.0.0.1:9999", ttl)
	waitFor(t, 5*time.Second, "a leads", a.IsLeader)
	b, _ := startElection(t, direct, "10.0.0.2:9999", ttl)
	waitFor(t, 5*time.Second, "b sees a as leader", func() bool { return b.CurrentLeader() == "10.0.0.1:9999" })
	time.Sleep(ttl / 3) // let a renew a few times so the cut lands at a random point

	cut := time.Now()
	proxy.Cut()
	var aDown, bUp time.Duration
	deadline := cut.Add(4 * ttl)
	for time.Now().Before(deadline) && (aDown == 0 || bUp == 0) {
		now := time.Since(cut)
		if aDown == 0 && !a.IsLeader() {
			aDown = now
		}
		if bUp == 0 && b.IsLeader() {
			bUp = now
			if aDown == 0 {
				t.Fatalf("two leaders: b leads %s after the cut while a still does", now)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("after cutting a off etcd: a stepped down at %s, b took over at %s (TTL %s)", aDown, bUp, ttl)
	if aDown == 0 {
		t.Fatal("a never stepped down")
	}
	if aDown > ttl/2+250*time.Millisecond {
		t.Errorf("a stepped down %s after losing etcd, want within TTL/2 (+250ms) = %s", aDown, ttl/2+250*time.Millisecond)
	}
	if bUp == 0 {
		t.Fatal("b never took over")
	}
	if aDown >= bUp {
		t.Errorf("leadership overlap: a stepped down at %s, b led from %s", aDown, bUp)
	}
}
