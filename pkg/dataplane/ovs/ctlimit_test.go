package ovs

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

func TestCTZoneLimits(t *testing.T) {
	st, err := desiredFrom(dataplane.State{
		Networks:  []dataplane.Network{vxNet, {ID: "red.t2", Encap: dataplane.EncapVXLAN, Tag: 5001, Subnet: netip.MustParsePrefix("10.2.0.0/24")}},
		Endpoints: []dataplane.Endpoint{ep("e1", "10.1.0.1", "x", "a1"), ep("e2", "10.1.0.2", "x", "a2"), ep("e3", "10.1.0.3", "x", "a3")},
	})
	if err != nil {
		t.Fatal(err)
	}
	vrf := map[string]uint32{"default": 1, "t2": 2}
	// Each tenant zone, its own and its inbound one: the quota per local endpoint, at
	// least one endpoint's worth.
	in1, in2 := uint16(1|inboundZoneBit), uint16(2|inboundZoneBit)
	if got := ctZoneLimits(st, vrf, 100, 0); len(got) != 4 || got[1] != 300 || got[in1] != 300 || got[2] != 100 || got[in2] != 100 {
		t.Fatalf("limits %v, want zones 1 and %d: 300, zones 2 and %d: 100", got, in1, in2)
	}
	// The inbound zones together hold at most half the table (inboundLimit); the own
	// zones and a legacy tenant's one zone are not capped.
	if got := ctZoneLimits(st, vrf, 100, inboundLimit(800)); got[1] != 300 || got[in1] != 300 || got[2] != 100 || got[in2] != 100 {
		t.Fatalf("limits with an inbound cap of 400: %v", got)
	}
	// Past the cap: t2 asks less than an equal share and gets it, default the rest.
	if got := ctZoneLimits(st, vrf, 100, inboundLimit(400)); got[1] != 300 || got[in1] != 100 || got[2] != 100 || got[in2] != 100 {
		t.Fatalf("limits with an inbound cap of 200: %v", got)
	}
	// Both ask more than an equal share: halves, never more than the cap together.
	if got := ctZoneLimits(st, vrf, 100, inboundLimit(300)); got[in1]+got[in2] != 150 || got[in1] != 75 {
		t.Fatalf("limits with an inbound cap of 150: %v", got)
	}
	if got := inboundShares(map[uint16]uint32{7: 10, 3: 10, 5: 10}, 20); got[3]+got[5]+got[7] != 20 || got[3] != 6 || got[7] != 7 {
		t.Fatalf("three zones sharing 20: %v", got)
	}
	if got := inboundShares(map[uint16]uint32{3: 10, 5: 10}, 1); got[3] != 1 || got[5] != 1 {
		t.Fatalf("two zones sharing 1 (each at least 1): %v", got)
	}
	if got := inboundShares(map[uint16]uint32{3: 10, 5: 2}, 0); got[3] != 10 || got[5] != 2 {
		t.Fatalf("no cap: %v", got)
	}
	if got := ctZoneLimits(st, map[string]uint32{"default": 1, "t2": 1 | inboundZoneBit}, 100, 50); got[1] != 300 || got[in1] != 100 {
		t.Fatalf("limits of one-zone tenants with an inbound cap: %v", got)
	}
	if inboundLimit(1) != 1 || inboundLimit(3_000_000) != 1_500_000 || inboundLimit(1<<40) != 1<<32-1 {
		t.Fatalf("inboundLimit: %d %d %d", inboundLimit(1), inboundLimit(3_000_000), inboundLimit(1<<40))
	}
	if got := zoneOwners(vrf); len(got) != 4 || got[1] != (zoneOwner{"default", "local"}) || got[in1] != (zoneOwner{"default", "remote"}) {
		t.Fatalf("zone owners %v", got)
	}
	// A VRF persisted above maxVRF, and the tenant whose inbound zone it would be: one
	// zone each, for both openers.
	legacy := map[string]uint32{"default": 1, "t2": 1 | inboundZoneBit}
	if got := ctZoneLimits(st, legacy, 100, 0); len(got) != 2 || got[1] != 300 || got[in1] != 100 {
		t.Fatalf("limits with a VRF above maxVRF %v, want zone 1: 300, zone %d: 100", got, in1)
	}
	if got := zoneOwners(legacy); len(got) != 2 || got[1] != (zoneOwner{"default", "any"}) || got[in1] != (zoneOwner{"t2", "any"}) {
		t.Fatalf("zone owners with a VRF above maxVRF %v", got)
	}
	if got := ctZoneLimits(st, vrf, 0, 0); len(got) != 0 {
		t.Fatalf("no quota: limits %v", got)
	}
	if got := ctZoneLimits(st, vrf, 1<<31, 0); got[1] != 1<<32-1 {
		t.Fatalf("limit %d, want it capped at 2^32-1", got[1])
	}
	got := parseCTLimits("default limit=0\nzone=5,limit=2,count=1\nzone=70,limit=0,count=0\nbogus\nzone=x,limit=1,count=1\n")
	if len(got) != 2 || got[5] != (ctZoneLimit{limit: 2, count: 1}) || got[70] != (ctZoneLimit{}) {
		t.Fatalf("parsed %+v", got)
	}
}

// holdConn connects from ns to addr and checks the connection echoes; it stays open
// until the test ends.
func holdConn(t *testing.T, ns, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := nsexec.Run(nsPath(ns), func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, time.Second)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, ns, err)
	}
	t.Cleanup(func() { c.Close() })
	return c, echo(c)
}

// echo sends a line on c and reads it back.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return err
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("echo on %v: %w", c.RemoteAddr(), err)
	}
	return nil
}

// TestCTLimitOVS: with a quota of 2 conntrack entries per endpoint, a tenant with two
// endpoints on the host gets a zone limit of 4 connections. At it, its new connections
// (direct, to a service VIP, ICMP) are dropped (drop_ct_quota) while its established ones
// keep working and another tenant is unaffected; another endpoint raises the limit in
// place, and a restarted vswitchd gets the limits back.
func TestCTLimitOVS(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, _ := twoHosts(t, id)
	h1.cfg.CTQuota = 2
	c1, c2, c3, c4 := newNS(t, id, "c1"), newNS(t, id, "c2"), newNS(t, id, "c3"), newNS(t, id, "c4")
	d := newDriver(t, h1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	red := dataplane.Network{ID: "red.t2", Encap: dataplane.EncapVXLAN, Tag: 5001,
		Subnet: netip.MustParsePrefix("10.2.0.0/24"), Gateway: netip.MustParseAddr("10.2.0.254"), MTU: 1450}
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbq1"+id), ep("e2", "10.1.0.2", c2, "cbq2"+id)
	e3, e4 := ep("e3", "10.2.0.3", c3, "cbq3"+id), ep("e4", "10.2.0.4", c4, "cbq4"+id)
	e3.NetworkID, e4.NetworkID = red.ID, red.ID
	svc := dataplane.Service{ID: "web:default", VIP: netip.MustParseAddr("10.1.0.100"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{e2.IP}}
	if err := d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{vxNet, red}, Endpoints: []dataplane.Endpoint{e1, e2, e3, e4},
		Services: []dataplane.Service{svc}}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	blue, redZone := uint16(d.vrfIDs["default"]), uint16(d.vrfIDs["t2"])
	limits := func() map[uint16]ctZoneLimit {
		t.Helper()
		out, err := d.appctl(ctx, "dpctl/ct-get-limits")
		if err != nil {
			t.Fatal(err)
		}
		return parseCTLimits(out)
	}
	if l := limits(); l[blue].limit != 4 || l[redZone].limit != 4 {
		t.Fatalf("zone limits %+v, want 4 for zones %d and %d", l, blue, redZone)
	}
	listen(t, c2, "0.0.0.0:8080")
	listen(t, c4, "0.0.0.0:8080")

	// Four connections of tenant default: three direct, one through the service.
	var held []net.Conn
	for i, addr := range []string{"10.1.0.2:8080", "10.1.0.2:8080", "10.1.0.2:8080", "10.1.0.100:80"} {
		c, err := holdConn(t, c1, addr)
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, addr, err)
		}
		held = append(held, c)
	}
	if l := limits()[blue]; l.count != 4 {
		t.Fatalf("zone %d holds %d connections, want 4", blue, l.count)
	}

	// At the limit: new connections fail closed, whatever opens them.
	if err := dial(t, c1, "10.1.0.2:8080"); err == nil {
		t.Fatal("a fifth connection got through the zone limit")
	}
	if err := dial(t, c1, "10.1.0.100:80"); err == nil {
		t.Fatal("a service connection got through the zone limit")
	}
	if err := ping(c1, "10.1.0.2"); err == nil {
		t.Fatal("a ping got through the zone limit")
	}
	if l := limits()[blue]; l.count != 4 {
		t.Fatalf("refused connections left entries: zone %d holds %d", blue, l.count)
	}
	// The established ones keep working; the other tenant is not affected.
	for i, c := range held {
		if err := echo(c); err != nil {
			t.Fatalf("established connection %d at the limit: %v", i, err)
		}
	}
	if err := dial(t, c3, "10.2.0.4:8080"); err != nil {
		t.Fatalf("tenant t2 while tenant default is at its limit: %v", err)
	}

	// The refusals are counted, and the zones show in the metrics.
	counters, err := d.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counters["drop_ct_quota"] < 3 {
		t.Fatalf("drop_ct_quota = %v, want at least 3 (counters %v)", counters["drop_ct_quota"], counters)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(d.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	zone := map[string]float64{} // name/tenant/opener
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if t, ok := labels["tenant"]; ok {
				zone[mf.GetName()+"/"+t+"/"+labels["opener"]] = m.GetGauge().GetValue()
			}
		}
	}
	// The four connections c1 opened fill the tenant's own zone; its inbound zone holds
	// none of them and has a limit of its own.
	if zone["contiv_datapath_ct_zone_entries/default/local"] != 4 || zone["contiv_datapath_ct_zone_limit/default/local"] != 4 ||
		zone["contiv_datapath_ct_zone_entries/default/remote"] != 0 || zone["contiv_datapath_ct_zone_limit/default/remote"] != 4 ||
		zone["contiv_datapath_ct_zone_limit/t2/local"] != 4 || len(zone) != 8 {
		t.Fatalf("zone metrics %v", zone)
	}

	// A third endpoint of tenant default raises its limit to 6, keeping the count.
	e5 := ep("e5", "10.1.0.5", newNS(t, id, "c5"), "cbq5"+id)
	if err := d.UpsertEndpoint(ctx, e5); err != nil {
		t.Fatal(err)
	}
	if l := limits()[blue]; l.limit != 6 || l.count != 4 {
		t.Fatalf("after a third endpoint: zone %d %+v, want limit 6 count 4", blue, l)
	}
	if err := dial(t, c1, "10.1.0.2:8080"); err != nil {
		t.Fatalf("below the raised limit: %v", err)
	}

	// Deleting the tenant's endpoints lowers it again (one endpoint's worth at least).
	if err := d.DeleteEndpoint(ctx, "e5"); err != nil {
		t.Fatal(err)
	}
	if l := limits()[blue]; l.limit != 4 {
		t.Fatalf("after deleting an endpoint: zone %d %+v, want limit 4", blue, l)
	}

	// A restarted vswitchd has neither connections nor limits: the driver sets them again.
	priv := Private{Dir: h1.dir, NetNS: h1.cfg.NetNS}
	if err := priv.StopVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := priv.StartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		out, err := d.appctl(ctx, "dpctl/ct-get-limits")
		if err != nil {
			return err
		}
		if l := parseCTLimits(out); l[blue].limit != 4 || l[redZone].limit != 4 {
			return fmt.Errorf("zone limits after a vswitchd restart: %+v", l)
		}
		return nil
	})
	eventually(t, 5*time.Second, func() error { return dial(t, c1, "10.1.0.2:8080") })
}
