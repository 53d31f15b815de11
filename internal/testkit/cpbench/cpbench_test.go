package cpbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// startNode serves a Master on store at a free loopback port until ctx ends; it returns
// the node's URL and a channel closed once it stopped.
func startNode(ctx context.Context, t *testing.T, store *state.Store) (string, chan struct{}) {
	t.Helper()
	m, err := master.New(ctx, master.Config{Store: store, FwdMode: "routing", NetMode: "vxlan"})
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", statetest.FreePort(t))
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		err := cluster.Serve(ctx, cluster.NodeConfig{Store: store, ListenAddr: addr, ControlAddr: addr, API: m.Handler(),
			LeaderTTL: 2 * time.Second, ServiceTTL: 2 * time.Second, Ready: func(net.Addr) { close(ready) }})
		if err != nil {
			t.Errorf("node %s: %v", addr, err)
			close(ready)
		}
	}()
	<-ready
	return "http://" + addr, done
}

func TestRunOneAndTwoNetmasters(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	var urls []string
	var dones []chan struct{}
	for range 2 {
		url, done := startNode(ctx, t, store)
		urls = append(urls, url)
		dones = append(dones, done)
	}
	t.Cleanup(func() {
		cancel()
		for _, d := range dones {
			<-d
		}
	})
	// Wait until a leader is elected and the follower proxies.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := Run(ctx, Options{NetmasterURLs: urls, Creates: 1, Lists: 1, Allocs: 1})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("netmasters not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range []int{1, 2} {
		res, err := Run(ctx, Options{NetmasterURLs: urls[:n], Creates: 30, Lists: 30, Allocs: 200, Concurrency: 8})
		if err != nil {
			t.Fatalf("%d netmasters: %v", n, err)
		}
		t.Logf("%d netmaster(s): create %s; list %s; alloc %s", n, res.Create, res.List, res.Alloc)
		if res.Create.Count != 30 || res.List.Count != 30 || res.Alloc.Count != 200 {
			t.Fatalf("not every request succeeded: %+v", res)
		}
		if res.Duplicates != 0 {
			t.Fatalf("%d duplicate addresses", res.Duplicates)
		}
		if res.CleanupErr != "" {
			t.Fatalf("cleanup: %s", res.CleanupErr)
		}
	}
	if _, err := Run(ctx, Options{}); err == nil {
		t.Fatal("Run without URLs succeeded")
	}
	if _, err := Run(ctx, Options{NetmasterURLs: []string{"http://127.0.0.1:1"}}); err == nil {
		t.Fatal("Run against a closed port succeeded")
	}
}

// TestNetworks: Networks creates tenants x perTenant networks in the tenants CreateTenants
// made, names and addresses them by NetworkName and NetworkSubnet, and stops at the first
// failed create with an error naming it (a tenant that does not exist).
func TestNetworks(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	url, done := startNode(ctx, t, store)
	t.Cleanup(func() { cancel(); <-done })
	c := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for SetVXLANs(ctx, c, url, "1-16000") != nil {
		if time.Now().After(deadline) {
			t.Fatal("netmaster not leading")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := CreateTenants(ctx, c, url, "nt", 3); err != nil {
		t.Fatal(err)
	}
	// CPU is sampled four times: before the first create, when creates 3 and 9 are sent
	// (in either order: two workers), and after the last. Call k answers k² seconds.
	var mu sync.Mutex
	calls := 0
	cpu := func() (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return time.Duration((calls-1)*(calls-1)) * time.Second, nil
	}
	res, err := Networks(ctx, NetworksOptions{URL: url, Tenants: 3, PerTenant: 4, TenantPrefix: "nt", Workers: 4, Window: 3, CPU: cpu})
	if err != nil || res.Created != 12 || res.StartRate <= 0 || res.EndRate <= 0 {
		t.Fatalf("Networks: %+v, %v; want 12 created and both rates", res, err)
	}
	inOrder := res.StartCPU == time.Second/3 && res.EndCPU == 5*time.Second/3
	swapped := res.StartCPU == 4*time.Second/3 && res.EndCPU == 8*time.Second/3
	if calls != 4 || !inOrder && !swapped {
		t.Fatalf("CPU per create %s then %s from %d samples, want 333ms then 1.667s (or 1.333s then 2.667s) from 4", res.StartCPU, res.EndCPU, calls)
	}
	failing := func() (time.Duration, error) { return 0, errors.New("no such process") }
	if _, err := Networks(ctx, NetworksOptions{URL: url, Tenants: 1, PerTenant: 2, TenantPrefix: "nt", Workers: 1, CPU: failing}); err == nil ||
		!strings.Contains(err.Error(), "CPU time") {
		t.Fatalf("Networks with CPU failing: %v, want its error", err)
	}
	// Window half of all: the first window ends where the last begins, and both samples
	// are taken there (one sequential worker: samples at 0, 2, 2 and 4 creates).
	mu.Lock()
	calls = 0
	mu.Unlock()
	if err := CreateTenants(ctx, c, url, "nh", 1); err != nil {
		t.Fatal(err)
	}
	res, err = Networks(ctx, NetworksOptions{URL: url, Tenants: 1, PerTenant: 4, TenantPrefix: "nh", Workers: 1, Window: 2, CPU: cpu})
	if err != nil || calls != 4 || res.StartCPU != time.Second/2 || res.EndCPU != 5*time.Second/2 {
		t.Fatalf("Window half of all: CPU per create %s then %s from %d samples (%v), want 500ms then 2.5s from 4", res.StartCPU, res.EndCPU, calls, err)
	}
	var nw struct {
		Subnet string `json:"subnet"`
	}
	if err := expect(ctx, c, url, http.MethodGet, "/api/v1/networks/nt2:"+NetworkName(3)+"/", nil, &nw); err != nil || nw.Subnet != NetworkSubnet(2, 3) {
		t.Fatalf("network 3 of nt2: %+v %v, want subnet %s", nw, err, NetworkSubnet(2, 3))
	}
	res, err = Networks(ctx, NetworksOptions{URL: url, Tenants: 1, PerTenant: 5, TenantPrefix: "nx", Workers: 1})
	if err == nil || !strings.Contains(err.Error(), "network 1 of 5") || !strings.Contains(err.Error(), "nx0:n0") || res.Created != 0 {
		t.Fatalf("Networks in a missing tenant: %+v, %v; want an error naming nx0:n0, nothing created", res, err)
	}
}
