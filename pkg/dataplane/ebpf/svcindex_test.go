package ebpf

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestServiceIndexes: service changes update only their own entries (the host-service
// map, the port owners, the backend address index) instead of rescanning every service
// and endpoint; after any sequence of changes the maps hold exactly what a full
// recomputation from the applied services says, backends resolve in their own tenant when
// two tenants hold the address, and a Sync sweeps host-service entries nobody owns.
func TestServiceIndexes(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	blue := dataplane.Network{ID: "blue.u", Encap: dataplane.EncapVXLAN, Tag: 78,
		Subnet: h.net.Subnet, Gateway: h.net.Gateway} // the same subnet in another tenant
	st := dataplane.State{Networks: []dataplane.Network{h.net, blue},
		Peers: []dataplane.Peer{{Host: "h2", VTEP: netip.MustParseAddr("10.254.0.2")}}}
	for i := 0; i < 4; i++ {
		ip := netip.AddrFrom4([4]byte{10, 50, 0, byte(10 + i)})
		for _, n := range []dataplane.Network{h.net, blue} {
			st.RemoteEndpoints = append(st.RemoteEndpoints, dataplane.RemoteEndpoint{ID: fmt.Sprintf("%s-r%d", n.ID, i), NetworkID: n.ID,
				IP: ip, MAC: dataplane.ContivMAC(ip), VTEP: netip.MustParseAddr("10.254.0.2"), Host: "h2"})
		}
	}
	if err := h.d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	netKey := map[string]uint32{}
	for id, r := range h.d.eps.networks {
		netKey[tenantOf(id)] = r.key
	}
	rng := rand.New(rand.NewPCG(3, 9))
	for step := 0; step < 400; step++ {
		tenant := []string{"t", "u"}[rng.IntN(2)]
		id := fmt.Sprintf("s%d:%s", rng.IntN(6), tenant)
		if rng.IntN(4) == 0 {
			if err := h.d.DeleteService(ctx, id); err != nil {
				t.Fatalf("step %d: delete %s: %v", step, id, err)
			}
		} else {
			s := dataplane.Service{ID: id, VIP: netip.AddrFrom4([4]byte{10, 50, 0, byte(100 + rng.IntN(3))}),
				Backends: []netip.Addr{netip.AddrFrom4([4]byte{10, 50, 0, byte(10 + rng.IntN(4))})}}
			for _, p := range rng.Perm(3)[:1+rng.IntN(2)] {
				s.Ports = append(s.Ports, dataplane.ServicePort{Proto: 6, Port: uint16(80 + p), TargetPort: 8080})
			}
			if rng.IntN(3) == 0 {
				s.Ports[0].NodePort = uint16(30000 + rng.IntN(3))
			}
			// Refused when another service holds a port or node port: checked below too.
			_ = h.d.UpsertService(ctx, s)
		}
		// What a full recomputation says: VIP:port/proto served on the host path when
		// exactly one tenant's services hold it; every port and node port owned once.
		zones := map[contivbpfCbHostSvcKey]map[uint32]bool{}
		owners := map[contivbpfCbSvcKey]string{}
		for sid, r := range h.d.svc.services {
			for _, k := range r.keys {
				hk := contivbpfCbHostSvcKey{Vip: k.Vip, Port: k.Port, Proto: k.Proto}
				if zones[hk] == nil {
					zones[hk] = map[uint32]bool{}
				}
				zones[hk][k.Zone] = true
				if o, dup := owners[k]; dup {
					t.Fatalf("step %d: port %v held by %s and %s", step, k, o, sid)
				}
				owners[k] = sid
			}
			var b contivbpfCbBackend
			if err := h.d.objs.CbBackends.Lookup(&contivbpfCbBackendKey{SvcId: r.id, Index: 0}, &b); err != nil {
				t.Fatalf("step %d: %s backend: %v", step, sid, err)
			}
			if tenant, _ := dataplane.ServiceTenant(sid); b.Net != netKey[tenant] {
				t.Fatalf("step %d: %s backend resolved in network key %d, want its tenant's %d", step, sid, b.Net, netKey[tenant])
			}
		}
		want := map[contivbpfCbHostSvcKey]uint32{}
		for hk, zs := range zones {
			if len(zs) == 1 {
				for z := range zs {
					want[hk] = z
				}
			}
		}
		got := map[contivbpfCbHostSvcKey]uint32{}
		var k contivbpfCbHostSvcKey
		var v contivbpfCbHostSvc
		it := h.d.objs.CbHostSvcs.Iterate()
		for it.Next(&k, &v) {
			got[k] = v.Zone
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: cb_host_svcs %v, want %v", step, got, want)
		}
		if !maps.Equal(owners, h.d.svc.svcKeyOwner) {
			t.Fatalf("step %d: port owners %v, want %v", step, h.d.svc.svcKeyOwner, owners)
		}
	}
	// An entry no service owns (a previous run's) is swept by the next Sync.
	stale := contivbpfCbHostSvcKey{Vip: ip4(netip.MustParseAddr("10.9.9.9")), Port: nport(99), Proto: 6}
	if err := h.d.objs.CbHostSvcs.Put(&stale, &contivbpfCbHostSvc{Zone: 1}); err != nil {
		t.Fatal(err)
	}
	for _, r := range h.d.svc.services {
		st.Services = append(st.Services, r.svc)
	}
	if err := h.d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	var v contivbpfCbHostSvc
	if err := h.d.objs.CbHostSvcs.Lookup(&stale, &v); err == nil {
		t.Fatal("Sync kept a host-service entry no service owns")
	}
	// A change that could not settle its entries (hostSvcsStale) makes the next service
	// change, whichever it is, rewrite the whole table.
	if err := h.d.objs.CbHostSvcs.Put(&stale, &contivbpfCbHostSvc{Zone: 1}); err != nil {
		t.Fatal(err)
	}
	h.d.svc.hostSvcsStale = true
	if err := h.d.UpsertService(ctx, dataplane.Service{ID: "late:t", VIP: netip.MustParseAddr("10.50.0.120"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80}}, Backends: []netip.Addr{netip.MustParseAddr("10.50.0.10")}}); err != nil {
		t.Fatal(err)
	}
	if err := h.d.objs.CbHostSvcs.Lookup(&stale, &v); err == nil || h.d.svc.hostSvcsStale {
		t.Fatalf("after a stale table the next change did not rewrite it (stale flag %v)", h.d.svc.hostSvcsStale)
	}
}

// TestServiceRevisions: the driver moves a service's backend revision (cb_svc_revs) on
// whenever it writes the service (a restarted agent trusts no earlier check) and again
// after every membership it deletes, so no flow keeps a removed backend on the fast path's
// trust: a backend leaving, a Sync that drops one, the service deleted.
func TestServiceRevisions(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	st, backends := h.remoteEndpoints(t, 3)
	svc := dataplane.Service{ID: "rev:" + tenantOf(h.net.ID), VIP: netip.MustParseAddr("10.50.0.100"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80}}, Backends: backends[:2]}
	rev := func() (uint32, uint32) {
		t.Helper()
		id := h.d.svc.services[svc.ID].id
		var r contivbpfCbSvcRev
		if err := h.d.objs.CbSvcRevs.Lookup(id, &r); err != nil {
			t.Fatal(err)
		}
		return id, r.Rev
	}
	last := uint32(0)
	step := func(what string, atLeast uint32, apply func() error) {
		t.Helper()
		if err := apply(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_, got := rev()
		if got < last+atLeast || got == 0 {
			t.Fatalf("after %s the revision went from %d to %d, want %d more at least", what, last, got, atLeast)
		}
		last = got
	}
	step("the service is written", 1, func() error { return h.d.UpsertService(ctx, svc) })
	svc.Backends = backends
	step("a backend joins", 1, func() error { return h.d.UpsertService(ctx, svc) })
	svc.Backends = backends[1:]
	step("a backend leaves (written, then its membership deleted)", 2, func() error { return h.d.UpsertService(ctx, svc) })
	st.Services = []dataplane.Service{{ID: svc.ID, VIP: svc.VIP, Ports: svc.Ports, Backends: backends[2:]}}
	step("a Sync without another backend", 2, func() error { return h.d.Sync(ctx, st) })
	id, _ := rev()
	if err := h.d.DeleteService(ctx, svc.ID); err != nil {
		t.Fatal(err)
	}
	var r contivbpfCbSvcRev
	if err := h.d.objs.CbSvcRevs.Lookup(id, &r); err != nil || r.Rev <= last {
		t.Fatalf("after the service was deleted its revision is %d (%v), want past %d", r.Rev, err, last)
	}
}

// A service port put on an endpoint's own address moves the policy epoch, so the direct
// flows to that address and port are judged again (and balanced) on their next packet:
// the fast path trusts a direct flow's entry of the current epoch to be no service's
// (cb_fast_pass). A VIP of its own, a rewrite of the same ports, and other ports of other
// addresses leave the epoch alone (every flow would be judged again).
func TestServiceOnEndpointAddress(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	_, eps := h.remoteEndpoints(t, 2)
	tenant := tenantOf(h.net.ID)
	for _, c := range []struct {
		what  string
		svc   dataplane.Service
		moves bool
	}{
		{"a VIP of its own", dataplane.Service{ID: "own:" + tenant, VIP: netip.MustParseAddr("10.50.0.100"),
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80}}, Backends: eps[:1]}, false},
		{"a port on an endpoint's address", dataplane.Service{ID: "on-ep:" + tenant, VIP: eps[1],
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80}}, Backends: eps[:1]}, true},
		{"the same port again", dataplane.Service{ID: "on-ep:" + tenant, VIP: eps[1],
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80}}, Backends: eps[:1]}, false},
		{"another port there", dataplane.Service{ID: "on-ep:" + tenant, VIP: eps[1],
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80}, {Proto: 17, Port: 53}}, Backends: eps[:1]}, true},
	} {
		before := h.d.epoch
		if err := h.d.UpsertService(ctx, c.svc); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if moved := h.d.epoch != before; moved != c.moves {
			t.Errorf("%s: policy epoch %d → %d, want moved %v", c.what, before, h.d.epoch, c.moves)
		}
	}
}

// remoteEndpoints syncs h's network with n remote endpoints 10.50.0.10, .11, ... behind
// peer h2 and returns the state it synced and their addresses.
func (h *oneHost) remoteEndpoints(t *testing.T, n int) (dataplane.State, []netip.Addr) {
	t.Helper()
	st := dataplane.State{Networks: []dataplane.Network{h.net}, Peers: []dataplane.Peer{{Host: "h2", VTEP: netip.MustParseAddr("10.254.0.2")}}}
	var ips []netip.Addr
	for i := 0; i < n; i++ {
		ip := netip.AddrFrom4([4]byte{10, 50, 0, byte(10 + i)})
		ips = append(ips, ip)
		st.RemoteEndpoints = append(st.RemoteEndpoints, dataplane.RemoteEndpoint{ID: fmt.Sprintf("r%d", i), NetworkID: h.net.ID,
			IP: ip, MAC: dataplane.ContivMAC(ip), VTEP: netip.MustParseAddr("10.254.0.2"), Host: "h2"})
	}
	if err := h.d.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return st, ips
}
