package ovs

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestConformance runs the backend-neutral suite with one private OVS per simulated
// host. A restarted host (the factory called again for the same host namespace) reuses
// its OVS, as a restarted netplugin would.
func TestConformance(t *testing.T) {
	needOVS(t)
	conformance.Run(t, privateFactory(t))
}

// TestConformanceRouting runs Contiv's routing mode (router MAC, TTL decremented, routed
// between networks of a tenant on one host and across hosts, other tenants apart).
func TestConformanceRouting(t *testing.T) {
	needOVS(t)
	conformance.RunRouting(t, privateFactory(t))
}

// TestConformanceAdversarial runs the trust cases (design §9): spoofed sources, VLAN tags
// from containers, overlay injection, bare ACKs, SYNs after reset and policy change,
// cross-tenant VIPs, UDP spreading and backend removal under a live flow.
func TestConformanceAdversarial(t *testing.T) {
	needOVS(t)
	conformance.RunAdversarial(t, privateFactory(t))
}

// privateFactory starts one private OVS per simulated host, stopped when the test that
// first started a driver for that host ends. Hosts are told apart by their namespace: a
// suite builds several pairs of hosts with the same names (conformance scenarios that
// restart drivers get hosts of their own).
func privateFactory(_ *testing.T) conformance.Factory {
	var mu sync.Mutex
	dirs := map[string]string{} // host namespace → private OVS directory
	factory := func(t *testing.T, cfg dataplane.HostConfig) dataplane.Driver {
		t.Helper()
		mu.Lock()
		dir, ok := dirs[cfg.NetNS]
		if !ok {
			var err error
			if dir, err = os.MkdirTemp("", "cbo-ovs-"); err != nil {
				mu.Unlock()
				t.Fatal(err)
			}
			dirs[cfg.NetNS] = dir
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				_ = Private{Dir: dir}.Stop(ctx)
				os.RemoveAll(dir)
			})
		}
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d, err := New(ctx, cfg, Options{Dir: dir})
		if err != nil {
			t.Fatalf("new ovs driver for %s: %v", cfg.Host, err)
		}
		return d
	}
	return factory
}
