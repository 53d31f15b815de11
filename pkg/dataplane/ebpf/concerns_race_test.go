package ebpf

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestConcernLocksStampNotLost: a policy apply that changes no verdict (the same rules
// again) rewrites its group's flags and generation outside the policy clock, while an
// endpoint moving into that group stamps it under the clock. Both read-modify-write the
// group's cb_epgs entry; unserialized, the policy's write puts back the stamp it read and
// the move's stamp is lost: the endpoint's flows, judged under its old group, are never
// judged again under the new one.
func TestConcernLocksStampNotLost(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	peer := dataplane.Peer{Host: "h2", VTEP: netip.MustParseAddr("10.254.0.2")}
	ip := netip.MustParseAddr("10.50.0.20")
	r := dataplane.RemoteEndpoint{ID: "red.t-r", NetworkID: h.net.ID, IP: ip, MAC: dataplane.ContivMAC(ip), VTEP: peer.VTEP, Host: peer.Host}
	pol := dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{{ID: "r1", Priority: 10, Ingress: true, Proto: 6, Port: 80, Action: dataplane.ActionAllow}}}
	if err := h.d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{h.net}, Peers: []dataplane.Peer{peer},
		RemoteEndpoints: []dataplane.RemoteEndpoint{r}, Policies: []dataplane.PolicySet{pol}}); err != nil {
		t.Fatal(err)
	}
	stamp := func() uint32 {
		var st contivbpfCbEpgState
		if err := h.d.objs.CbEpgs.Lookup(uint32(pol.EPGID), &st); err != nil {
			t.Fatal(err)
		}
		return st.Changed
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := h.d.UpsertPolicy(ctx, pol); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	var want uint32
	deadline := time.Now().Add(8 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if i > 0 {
			if got := stamp(); int32(got-want) < 0 {
				t.Fatalf("move %d: group %d's stamp %d, older than the clock %d its endpoint's move published", i, pol.EPGID, got, want)
			}
		}
		r.EPGID = 0
		if err := h.d.UpsertRemoteEndpoint(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got := stamp(); i > 0 && int32(got-want) < 0 {
			t.Fatalf("move %d: group %d's stamp %d, older than the clock %d its endpoint's move published", i, pol.EPGID, got, want)
		}
		r.EPGID = pol.EPGID
		if err := h.d.UpsertRemoteEndpoint(ctx, r); err != nil {
			t.Fatal(err)
		}
		var c contivbpfCbConfig
		if err := h.d.objs.CbCfg.Lookup(uint32(0), &c); err != nil {
			t.Fatal(err)
		}
		want = c.PolicyEpoch
	}
}

// TestConcernLocksCollectorReadersAndClose: the conntrack collector's figures (/metrics)
// and a pass (the inspect API) run while Close stops the collector: they must hold the
// lifecycle lock, or they read the collector Close is dropping (a data race under -race,
// a nil dereference without).
func TestConcernLocksCollectorReadersAndClose(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, fn := range []func(){func() { h.d.CTStats() }, func() { _, _ = h.d.CTGC(ctx) }} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				fn()
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
}
