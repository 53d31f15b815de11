package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestConcernLocksMixedLoad runs applies of every concern, Sync, and every reader side by
// side for a while (under -race: no two of them touch the same index unlocked), then
// Closes the driver while they still run. Each must finish within the deadline: a lock
// order inversion, an announce without its published, or a nested read lock behind a
// waiting Close hangs them and fails the test instead of hanging it.
func TestConcernLocksMixedLoad(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	peer := dataplane.Peer{Host: "h2", VTEP: netip.MustParseAddr("10.254.0.2")}
	remote := func(i, epg int) dataplane.RemoteEndpoint {
		ip := netip.AddrFrom4([4]byte{10, 50, 0, byte(20 + i)})
		return dataplane.RemoteEndpoint{ID: fmt.Sprintf("red.t-r%d", i), NetworkID: h.net.ID, IP: ip,
			MAC: dataplane.ContivMAC(ip), VTEP: peer.VTEP, Host: peer.Host, EPGID: uint16(epg)}
	}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Peers: []dataplane.Peer{peer},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(0, 1), remote(1, 2)}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.d.Collector())
	vip := netip.MustParseAddr("10.50.0.100")
	stop := make(chan struct{})
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		runs = map[string]int{}
	)
	loop := func(name string, fn func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if fn(i) == nil {
					mu.Lock()
					runs[name]++
					mu.Unlock()
				}
			}
		}()
	}
	loop("remotes", func(i int) error { return h.d.UpsertRemoteEndpoint(ctx, remote(i%2, 1+i%3)) })
	loop("policy", func(i int) error {
		p := dataplane.PolicySet{EPGID: uint16(1 + i%3), Rules: []dataplane.PolicyRule{{ID: fmt.Sprint("r", i), Priority: 10,
			Ingress: true, Proto: 6, Port: uint16(80 + i%5), Action: dataplane.ActionAllow}}}
		err := h.d.UpsertPolicy(ctx, p)
		if i%4 == 0 && err == nil {
			err = h.d.DeletePolicy(ctx, p.EPGID)
		}
		return err
	})
	loop("pod policy", func(i int) error {
		r := remote(i%2, 1)
		p := dataplane.PodPolicy{ID: r.ID, NetworkID: r.NetworkID, IP: r.IP, IngressIsolated: true,
			Ingress: []dataplane.PodRule{{Remote: netip.MustParsePrefix("10.50.0.0/24"), Proto: 6, PortMin: uint16(8000 + i%7), PortMax: 8100}}}
		err := h.d.UpsertPodPolicy(ctx, p)
		if i%3 == 0 && err == nil {
			err = h.d.DeletePodPolicy(ctx, p.ID)
		}
		return err
	})
	loop("service", func(i int) error {
		s := dataplane.Service{ID: "svc:t", VIP: vip, Backends: []netip.Addr{remote(i%2, 0).IP},
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: uint16(8080 + i%3), NodePort: uint16(30080 + i%2)}}}
		err := h.d.UpsertService(ctx, s)
		if i%3 == 0 && err == nil {
			err = h.d.DeleteService(ctx, s.ID)
		}
		return err
	})
	loop("sync", func(i int) error {
		err := h.d.Sync(ctx, state)
		time.Sleep(20 * time.Millisecond)
		return err
	})
	loop("events", func(i int) error {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := h.d.DropEvents(cctx) // fails while the last stream is still closing
		return errors.Join(err, h.d.SetAllowEvents(i%2 == 0))
	})
	for name, read := range map[string]func() error{
		"metrics":   func() error { _, err := reg.Gather(); return err },
		"status":    func() error { _, err := h.d.Status(ctx); return err },
		"verify":    func() error { _, err := h.d.Verify(state); return err },
		"collector": func() error { _, err := h.d.CTGC(ctx); return err },
		"listings": func() error {
			var errs []error
			for _, k := range ListingKinds {
				_, err := h.d.Listing(dataplane.ListQuery{Kind: k})
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		},
		"tables": func() error {
			_, err := h.d.NativeRoutes()
			_, derr := h.d.DumpTables()
			h.d.FailedPolicies()
			return errors.Join(err, derr)
		},
	} {
		loop(name, func(int) error { return read() })
	}
	// Until each has succeeded at least once (a loaded machine under -race is slow).
	names := []string{"remotes", "policy", "pod policy", "service", "sync", "events",
		"metrics", "status", "verify", "collector", "listings", "tables"}
	time.Sleep(3 * time.Second)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		var never []string
		for _, name := range names {
			if runs[name] == 0 {
				never = append(never, name)
			}
		}
		if len(never) == 0 {
			t.Logf("successes: %v", runs)
			mu.Unlock()
			break
		}
		mu.Unlock()
		if time.Now().After(deadline) {
			t.Errorf("never succeeded beside the others: %v", never)
			break
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- h.d.Close() }()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("driver operations still running a minute after stop: a deadlock")
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close never returned: a deadlock")
	}
}
