package cpbench

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/master"
)

func TestRunOneAndTwoNetmasters(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	var urls []string
	var dones []chan struct{}
	for i := 0; i < 2; i++ {
		m, err := master.New(ctx, master.Config{Store: store, FwdMode: "routing", NetMode: "vxlan"})
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", statetest.FreePort(t))
		ready := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			err := cluster.Serve(ctx, cluster.NodeConfig{Store: store, ListenAddr: addr, ControlAddr: addr, API: m.Handler(),
				LeaderTTL: 2 * time.Second, ServiceTTL: 2 * time.Second, Ready: func(net.Addr) { close(ready) }})
			if err != nil {
				t.Errorf("node %d: %v", i, err)
				close(ready)
			}
		}()
		<-ready
		urls = append(urls, "http://"+addr)
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
