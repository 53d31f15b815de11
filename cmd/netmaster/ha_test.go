package main

import (
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// TestHACluster runs three netmaster processes on one etcd: one leader, followers proxy,
// registrations and /info agree, 500 concurrent allocations through two processes never
// collide, a SIGTERMed leader hands over at once and a SIGKILLed one within the lock TTL.
func TestHACluster(t *testing.T) {
	etcdURL := statetest.Etcd(t)
	var ps []*proc
	for i := 0; i < 3; i++ {
		ps = append(ps, startNetmaster(t, fmt.Sprintf("nm%d", i), etcdURL))
	}
	leader := leaderOf(t, ps, 20*time.Second)
	var followers []*proc
	for _, p := range ps {
		if p != leader {
			followers = append(followers, p)
		}
	}
	t.Logf("leader %s (%s)", leader.name, leader.addr)

	store, err := state.Open(ctxT(t, time.Minute), []string{etcdURL})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	t.Run("registrations and info", func(t *testing.T) {
		ctx := ctxT(t, 10*time.Second)
		if got, err := cluster.LeaderAddr(ctx, store); err != nil || got != leader.addr {
			t.Fatalf("lock value %q, %v; want %s", got, err, leader.addr)
		}
		eventually(t, 5*time.Second, "3 netmaster registrations", func() error {
			nms, err := cluster.ListServices(ctx, store, cluster.ServiceNetmaster)
			if err != nil {
				return err
			}
			rpcs, err := cluster.ListServices(ctx, store, cluster.ServiceNetmasterRPC)
			if err != nil {
				return err
			}
			roles := map[string]int{}
			for _, s := range nms {
				roles[s.Role]++
			}
			if len(nms) != 3 || len(rpcs) != 3 || roles["leader"] != 1 || roles["follower"] != 2 {
				return fmt.Errorf("netmaster %+v rpc %+v", nms, rpcs)
			}
			return nil
		})
		i, err := getInfo(followers[0])
		if err != nil {
			t.Fatal(err)
		}
		if i.CurrentState != "follower" || i.LeaderIP != "127.0.0.1" || i.LocalIP != "127.0.0.1" || len(i.NetmasterNodes) != 3 {
			t.Fatalf("follower /info %+v", i)
		}
	})

	t.Run("follower proxy", func(t *testing.T) {
		// Create through a follower, read back through the leader and the other follower.
		mustCall(t, "POST", followers[0].url+"/api/v1/networks/default:pnet/", netJSON("pnet", "10.10.0.0/22", "10.10.0.1"), 200)
		if n := networkNames(t, leader.url); !hasString(n, "pnet") {
			t.Fatalf("leader lists %v, want pnet", n)
		}
		if n := networkNames(t, followers[1].url); !hasString(n, "pnet") {
			t.Fatalf("follower 2 lists %v, want pnet", n)
		}
		// Errors keep their status through the proxy.
		st, body, err := call("GET", followers[0].url+"/api/v1/networks/default:nosuch/", "")
		if err != nil || st != 404 {
			t.Fatalf("missing object via follower: %d %v %s", st, err, body)
		}
		st, body, err = call("POST", followers[0].url+"/api/v1/networks/default:bad/", `{"tenantName":"default","networkName":"bad","encap":"gre","subnet":"10.2.2.0/24"}`)
		if err != nil || st != 400 {
			t.Fatalf("bad input via follower: %d %v %s", st, err, body)
		}
		// The /plugin routes need the JSON content type on the proxied request too.
		var resp model.AllocAddressResponse
		if err := json.Unmarshal([]byte(mustCall(t, "POST", followers[1].url+"/plugin/allocAddress", `{"NetworkID":"pnet.default"}`, 200)), &resp); err != nil {
			t.Fatal(err)
		}
		if resp.IPv4Address != "10.10.0.2/22" {
			t.Fatalf("first address %q, want 10.10.0.2/22", resp.IPv4Address)
		}
	})

	t.Run("500 concurrent allocations through two netmasters", func(t *testing.T) {
		mustCall(t, "POST", leader.url+"/api/v1/networks/default:anet/", netJSON("anet", "10.20.0.0/22", "10.20.0.1"), 200)
		targets := []*proc{leader, followers[0]}
		const n = 500
		var wg sync.WaitGroup
		addrs := make([]string, n)
		errs := make([]error, n)
		start := time.Now()
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				st, b, err := postJSON(targets[i%2].url+"/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "anet.default"})
				if err != nil || st != 200 {
					errs[i] = fmt.Errorf("status %d err %v body %s", st, err, b)
					return
				}
				var r model.AllocAddressResponse
				if err := json.Unmarshal(b, &r); err != nil {
					errs[i] = err
					return
				}
				addrs[i] = r.IPv4Address
			}(i)
		}
		wg.Wait()
		el := time.Since(start)
		seen := map[string]int{}
		for i, a := range addrs {
			if errs[i] != nil {
				t.Fatalf("allocation %d via %s: %v", i, targets[i%2].name, errs[i])
			}
			if a == "" || a == "10.20.0.1/22" {
				t.Fatalf("allocation %d got %q", i, a)
			}
			if j, dup := seen[a]; dup {
				t.Fatalf("duplicate address %s for requests %d and %d", a, j, i)
			}
			seen[a] = i
		}
		t.Logf("500 concurrent allocAddress via leader+follower: %s (%.0f/s), 0 duplicates", el.Round(time.Millisecond), n/el.Seconds())
	})

	t.Run("SIGTERM leader hands over at once", func(t *testing.T) {
		old := leader
		start := time.Now()
		if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		newLeader := leaderOf(t, followers, 10*time.Second)
		took := time.Since(start)
		select {
		case <-old.done:
		case <-time.After(10 * time.Second):
			t.Fatal("netmaster did not exit within 10s of SIGTERM")
		}
		if code := old.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("exit code after SIGTERM %d, want 0", code)
		}
		// Its registrations (10 s TTL) were revoked on the way out, not left to expire.
		nms, err := cluster.ListServices(ctxT(t, 5*time.Second), store, cluster.ServiceNetmaster)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range nms {
			if s.Addr() == old.addr {
				t.Errorf("registration of the stopped netmaster %s still present", old.addr)
			}
		}
		t.Logf("graceful failover (SIGTERM) to %s: %s", newLeader.name, took.Round(time.Millisecond))
		if took > cluster.DefaultLeaderTTL {
			t.Errorf("graceful failover took %s: resign should not wait for the %s TTL", took, cluster.DefaultLeaderTTL)
		}
		leader = newLeader
	})

	t.Run("SIGKILL leader fails over within the lock TTL", func(t *testing.T) {
		var other *proc
		for _, p := range followers {
			if p != leader {
				other = p
			}
		}
		mustCall(t, "POST", other.url+"/api/v1/networks/default:knet/", netJSON("knet", "10.30.0.0/24", "10.30.0.1"), 200)
		start := time.Now()
		leader.kill()
		var leaderAt, apiAt time.Duration
		eventually(t, 15*time.Second, "survivor leads and API answers", func() error {
			i, err := getInfo(other)
			if err != nil {
				return err
			}
			if i.CurrentState == "leader" && leaderAt == 0 {
				leaderAt = time.Since(start)
			}
			st, body, err := call("POST", other.url+"/plugin/allocAddress", `{"NetworkID":"knet.default"}`)
			if err != nil || st != 200 {
				return fmt.Errorf("alloc %d %v %s", st, err, body)
			}
			apiAt = time.Since(start)
			return nil
		})
		if n := networkNames(t, other.url); !hasString(n, "knet") || !hasString(n, "anet") {
			t.Fatalf("after failover lists %v", n)
		}
		got, _ := cluster.LeaderAddr(ctxT(t, 5*time.Second), store)
		if got != other.addr {
			t.Fatalf("lock value %q after failover, want %s", got, other.addr)
		}
		t.Logf("SIGKILL failover: new leader after %s, API answering after %s (lock TTL %s)",
			leaderAt.Round(time.Millisecond), apiAt.Round(time.Millisecond), cluster.DefaultLeaderTTL)
	})
}
