package ovs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// openerWorld is two hosts on a VXLAN network of tenant default: e1 (group 1) on h1, e3
// (group 2) on h2, each the other's remote endpoint. Each host has a TCP echo server on
// 8080 and a UDP echo server on 7000 in its container.
type openerWorld struct {
	h1, h2 testHost
	d1, d2 *Driver
	c1, c3 string
	s1, s2 dataplane.State
}

func newOpenerWorld(t *testing.T, ctx context.Context) *openerWorld {
	t.Helper()
	needOVS(t)
	id := testID()
	w := &openerWorld{}
	w.h1, w.h2 = twoHosts(t, id)
	w.c1, w.c3 = newNS(t, id, "c1"), newNS(t, id, "c3")
	w.d1, w.d2 = newDriver(t, w.h1), newDriver(t, w.h2)
	e1, e3 := ep("e1", "10.1.0.1", w.c1, "cbz1"+id), ep("e3", "10.1.0.3", w.c3, "cbz3"+id)
	e1.EPGID, e3.EPGID = 1, 2
	w.s1 = dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e3, w.h2)}, Peers: []dataplane.Peer{{Host: "h2", VTEP: w.h2.cfg.VTEP}}}
	w.s2 = dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e3},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e1, w.h1)}, Peers: []dataplane.Peer{{Host: "h1", VTEP: w.h1.cfg.VTEP}}}
	if err := w.d1.Sync(ctx, w.s1); err != nil {
		t.Fatalf("sync h1: %v", err)
	}
	if err := w.d2.Sync(ctx, w.s2); err != nil {
		t.Fatalf("sync h2: %v", err)
	}
	for _, c := range []struct{ ns, ip string }{{w.c1, "10.1.0.1"}, {w.c3, "10.1.0.3"}} {
		listen(t, c.ns, c.ip+":8080")
		u, err := conformance.StartUDPEcho(nsPath(c.ns), c.ip, 7000)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(u.Close)
	}
	eventually(t, 3*time.Second, func() error { return ping(w.c3, "10.1.0.1") })
	return w
}

// holdUDP opens a connected UDP socket from ns to addr (one source port for its whole
// life) and checks one echo; it is closed when the test ends.
func holdUDP(t *testing.T, ns, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	if err := nsexec.Run(nsPath(ns), func() (err error) { c, err = net.Dial("udp4", addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := udpEcho(c); err != nil {
		t.Fatalf("udp from %s to %s: %v", ns, addr, err)
	}
	return c
}

// udpEcho sends a datagram on c and waits for its echo.
func udpEcho(c net.Conn) error { return udpEchoWithin(c, time.Second) }

// udpEchoWithin is udpEcho waiting at most wait.
func udpEchoWithin(c net.Conn, wait time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	if _, err := c.Read(buf); err != nil {
		return fmt.Errorf("udp echo from %v: %w", c.RemoteAddr(), err)
	}
	return nil
}

// zonesOf returns the conntrack zones of d that hold a connection of proto from src to
// dst:dport (original direction).
func zonesOf(t *testing.T, ctx context.Context, d *Driver, proto uint8, src, dst string, dport uint16) []uint16 {
	t.Helper()
	out, err := d.appctl(ctx, "dpctl/dump-conntrack")
	if err != nil {
		t.Fatal(err)
	}
	var zones []uint16
	for _, c := range parseConntrack(out) {
		if c.proto == proto && c.src == netip.MustParseAddr(src) && c.dst == netip.MustParseAddr(dst) && c.dport == dport {
			zones = append(zones, c.zone)
		}
	}
	return zones
}

// ofctl runs ovs-ofctl (OpenFlow 1.3) against host h's integration bridge.
func ofctl(t *testing.T, h testHost, args ...string) {
	t.Helper()
	mgmt := "unix:" + filepath.Join(h.dir, "contivbr.mgmt")
	full := append([]string{"-O", "OpenFlow13"}, args[0], mgmt)
	full = append(full, args[1:]...)
	if out, err := exec.Command("ovs-ofctl", full...).CombinedOutput(); err != nil {
		t.Fatalf("ovs-ofctl %s: %v: %s", strings.Join(full, " "), err, out)
	}
}

// TestOpenerZonesUpgradeKeepsConnections: connections another host opened before the
// opener zones (committed in the tenant's own zone, as the single-zone pipeline did) keep
// working when the agent comes back with the new pipeline: the packets of their opener
// find them where they would be replies, their replies on the second lookup. Emulated
// with a flow that commits what arrives from other hosts in the tenant's own zone,
// removed once the connections exist.
func TestOpenerZonesUpgradeKeepsConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	w := newOpenerWorld(t, ctx)
	v := w.d1.vrfIDs["default"]
	old := fmt.Sprintf("table=%d,priority=200,ip,ct_state=+new+trk,reg4=0x1/0x3", tCommit)
	ofctl(t, w.h1, "add-flow", old+fmt.Sprintf(",actions=ct(commit,zone=%d,table=%d,exec(load:1->NXM_NX_CT_MARK[0]))", v, tCTCheck))

	tcp, err := holdConn(t, w.c3, "10.1.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	udp := holdUDP(t, w.c3, "10.1.0.1:7000")
	if z := zonesOf(t, ctx, w.d1, 6, "10.1.0.3", "10.1.0.1", 8080); len(z) != 1 || uint32(z[0]) != v {
		t.Fatalf("h1: the tcp connection from h2 is in zones %v, want the old pipeline's %d", z, v)
	}
	if z := zonesOf(t, ctx, w.d1, 17, "10.1.0.3", "10.1.0.1", 7000); len(z) != 1 || uint32(z[0]) != v {
		t.Fatalf("h1: the udp flow from h2 is in zones %v, want the old pipeline's %d", z, v)
	}

	ofctl(t, w.h1, "del-flows", "--strict", old)
	for i := 0; i < 3; i++ {
		if err := echo(tcp); err != nil {
			t.Fatalf("tcp connection opened before the upgrade: %v", err)
		}
		if err := udpEcho(udp); err != nil {
			t.Fatalf("udp flow opened before the upgrade: %v", err)
		}
	}
	// Found where they were, not opened again in the inbound zone.
	if z := zonesOf(t, ctx, w.d1, 6, "10.1.0.3", "10.1.0.1", 8080); len(z) != 1 || uint32(z[0]) != v {
		t.Errorf("h1: after the upgrade the tcp connection is in zones %v, want %d alone", z, v)
	}
	if z := zonesOf(t, ctx, w.d1, 17, "10.1.0.3", "10.1.0.1", 7000); len(z) != 1 || uint32(z[0]) != v {
		t.Errorf("h1: after the upgrade the udp flow is in zones %v, want %d alone", z, v)
	}
	// What h2 opens now goes to the inbound zone.
	if _, err := holdConn(t, w.c3, "10.1.0.1:8080"); err != nil {
		t.Fatal(err)
	}
	if z := zonesOf(t, ctx, w.d1, 6, "10.1.0.3", "10.1.0.1", 8080); len(z) != 2 {
		t.Errorf("h1: zones of tcp connections from h2 %v, want %d and %d", z, v, v|inboundZoneBit)
	}
}

// TestOpenerZonesRejudgeInbound: a connection another host opened lives in the tenant's
// inbound zone on the receiving host; a policy change there (and only there: the
// opener's host still allows it, so its own re-judging cuts nothing) cuts it. The ct
// listing names the zone inbound.
func TestOpenerZonesRejudgeInbound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	w := newOpenerWorld(t, ctx)
	v := w.d1.vrfIDs["default"]
	tcp, err := holdConn(t, w.c3, "10.1.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	udp := holdUDP(t, w.c3, "10.1.0.1:7000")
	for _, p := range []struct {
		proto uint8
		port  uint16
	}{{6, 8080}, {17, 7000}} {
		if z := zonesOf(t, ctx, w.d1, p.proto, "10.1.0.3", "10.1.0.1", p.port); len(z) != 1 || uint32(z[0]) != v|inboundZoneBit {
			t.Fatalf("h1: proto %d from h2 in zones %v, want the inbound zone %d", p.proto, z, v|inboundZoneBit)
		}
	}
	var l dataplane.Listing
	if err := w.d1.listCT(ctx, &l, 100); err != nil {
		t.Fatal(err)
	}
	rows := fmt.Sprint(l.Rows)
	if !strings.Contains(rows, "inbound") {
		t.Errorf("ct listing names no inbound zone: %v", l.Rows)
	}

	// h1 alone now denies group 2 → group 1 on both ports.
	deny := dataplane.PolicySet{EPGID: 1, Rules: []dataplane.PolicyRule{
		{ID: "no-tcp", Priority: 1, Ingress: true, RemoteEPG: 2, Proto: 6, Port: 8080, Action: dataplane.ActionDeny},
		{ID: "no-udp", Priority: 1, Ingress: true, RemoteEPG: 2, Proto: 17, Port: 7000, Action: dataplane.ActionDeny}}}
	if err := w.d1.UpsertPolicy(ctx, deny); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		proto uint8
		port  uint16
	}{{6, 8080}, {17, 7000}} {
		if z := zonesOf(t, ctx, w.d1, p.proto, "10.1.0.3", "10.1.0.1", p.port); len(z) != 0 {
			t.Errorf("h1: proto %d from h2 still in zones %v after the policy denied it", p.proto, z)
		}
	}
	if err := echo(tcp); err == nil {
		t.Error("the tcp connection h2 opened survived h1's deny")
	}
	if err := udpEcho(udp); err == nil {
		t.Error("the udp flow h2 opened survived h1's deny")
	}
}

// TestCompileInboundZoneHeldByStaleTenant: a tenant whose networks are gone keeps its VRF
// id, and its conntrack entries in that zone, until releaseVRFs flushes it (after the
// pipeline is installed; a failed flush keeps it). While it does, no other tenant may
// take that zone as its inbound zone: tenant default (VRF 1) must not commit what other
// hosts open, nor look its endpoints' packets up, in zone 0x4001 while tenant old
// (persisted id 0x4001, before the ids were capped) may still have entries there. The
// zone limits (ctZoneLimits, from all held ids) and the pipeline must agree.
func TestCompileInboundZoneHeldByStaleTenant(t *testing.T) {
	st := testState()
	ids := newIDs()
	ids.vrf["default"], ids.vrf["old"] = 1, 0x4001 // "old" has no network in st
	bridge := dataplane.HostConfig{FwdMode: dataplane.FwdBridge}
	all := compileTexts(t, st, bridge, testPorts, ids)
	wantFlows(t, all,
		"nw_src=10.1.0.1 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:1->reg9,goto_table:arp",
		"table=classifier,priority=100,in_port=1,tun_id=5000 actions=load:5000->reg0,load:1->reg3,load:1->reg4[0..0],load:1->reg8,load:1->reg9,goto_table:overlay_src",
	)
	if strings.Contains(all, "load:16385->reg") {
		t.Error("tenant default uses zone 16385, which tenant old still holds, as its inbound zone")
	}
	if got := ctZoneLimits(st, ids.vrf, 100, 0); got[1] != 100 || got[0x4001] != 100 || len(got) != 2 {
		t.Errorf("limits %v, want one zone each for default (1) and old (16385)", got)
	}

	// A scoped recompile (an endpoint changed) keeps the zones of the full compile.
	pl := testPipeline(t)
	c, err := pl.compile(st, bridge, testPorts, ids)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pl.recompile(c, st, bridge, testPorts, ids.svc, []string{unitEp("e1")}); err != nil {
		t.Fatal(err)
	}
	if all := texts(c); strings.Contains(all, "load:16385->reg") {
		t.Error("after a scoped recompile tenant default uses zone 16385 as its inbound zone")
	}
}

// TestOpenerZonesRemoteCannotFillTable: what other hosts open toward the endpoints of one
// tenant, or of all tenants together, may not take the whole conntrack table of the host,
// or its endpoints (and every other tenant's) open nothing again, as before the opener
// zones, only through the table instead of the zone (the eBPF datapath keeps half its
// table for what the host's endpoints open: cb_config.ct_in_limit). Scaled down:
// vswitchd's table holds 20 connections, the quota is 12; tenant default has three
// endpoints on h1 (zone limits of 36), tenant t2 one (f1, 12) on a network of the same
// subnet. h2's containers open 40 UDP flows toward e1 and 40 toward f1, then e2 opens its
// own toward e4. Before the inbound zones shared half the table, each took up to half of
// it, together all of it.
func TestOpenerZonesRemoteCannotFillTable(t *testing.T) {
	needOVS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	id := testID()
	h1, h2 := twoHosts(t, id)
	h1.cfg.CTQuota = 12
	c1, c2, c3, c4 := newNS(t, id, "c1"), newNS(t, id, "c2"), newNS(t, id, "c3"), newNS(t, id, "c4")
	cf1, cg3 := newNS(t, id, "f1"), newNS(t, id, "g3")
	d1, d2 := newDriver(t, h1), newDriver(t, h2)
	const maxconns = 20
	if _, err := d1.appctl(ctx, "dpctl/ct-set-maxconns", fmt.Sprint(maxconns)); err != nil {
		t.Fatal(err)
	}
	t2 := dataplane.Network{ID: "n2.t2", Encap: dataplane.EncapVXLAN, Tag: 5002, Subnet: vxNet.Subnet, MTU: 1450}
	e1, e2, e3, e4 := ep("e1", "10.1.0.1", c1, "cbf1"+id), ep("e2", "10.1.0.2", c2, "cbf2"+id),
		ep("e3", "10.1.0.3", c3, "cbf3"+id), ep("e4", "10.1.0.4", c4, "cbf4"+id)
	f1, g3 := ep("f1", "10.1.0.1", cf1, "cbg1"+id), ep("g3", "10.1.0.3", cg3, "cbg3"+id)
	f1.NetworkID, g3.NetworkID = t2.ID, t2.ID
	nets := []dataplane.Network{vxNet, t2}
	if err := d1.Sync(ctx, dataplane.State{Networks: nets, Endpoints: []dataplane.Endpoint{e1, e2, e4, f1},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e3, h2), remote(g3, h2)}, Peers: []dataplane.Peer{{Host: "h2", VTEP: h2.cfg.VTEP}}}); err != nil {
		t.Fatal(err)
	}
	if err := d2.Sync(ctx, dataplane.State{Networks: nets, Endpoints: []dataplane.Endpoint{e3, g3},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e1, h1), remote(e2, h1), remote(e4, h1), remote(f1, h1)},
		Peers:           []dataplane.Peer{{Host: "h1", VTEP: h1.cfg.VTEP}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ns, ip string }{{c1, "10.1.0.1"}, {c4, "10.1.0.4"}, {cf1, "10.1.0.1"}} {
		u, err := conformance.StartUDPEcho(nsPath(c.ns), c.ip, 7000)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(u.Close)
	}
	listen(t, c4, "10.1.0.4:8080")

	// h2's containers open flows toward e1 and f1 until h1 refuses them.
	delivered := map[string]int{}
	for _, from := range []string{c3, cg3} {
		for i := 0; i < 2*maxconns; i++ {
			if udpFlow(from, "10.1.0.1:7000", 200*time.Millisecond) == nil {
				delivered[from]++
			}
		}
	}
	nconns, _ := d1.appctl(ctx, "dpctl/ct-get-nconns")
	t.Logf("h1: %d (default) and %d (t2) of %d flows each from h2 delivered; %s connections in a table of %d",
		delivered[c3], delivered[cg3], 2*maxconns, strings.TrimSpace(nconns), maxconns)
	if delivered[c3] == 2*maxconns || delivered[cg3] == 2*maxconns {
		t.Fatal("every flow from h2 to a tenant was delivered: no limit in force (the probe does not work)")
	}
	if delivered[c3] == 0 || delivered[cg3] == 0 {
		t.Fatalf("a tenant was opened no flow from h2: %v", delivered)
	}
	if sum := delivered[c3] + delivered[cg3]; sum > maxconns/2 {
		t.Errorf("flows other hosts opened toward e1 and f1 took %d of h1's %d conntrack entries, more than half", sum, maxconns)
	}
	// e2's own flows, UDP and TCP, to e4 on its host.
	if err := udpFlow(c2, "10.1.0.4:7000", time.Second); err != nil {
		t.Errorf("e2's own new udp flow after h2 opened %v toward e1 and f1: %v", delivered, err)
	}
	if err := dial(t, c2, "10.1.0.4:8080"); err != nil {
		t.Errorf("e2's own new tcp connection after h2 opened %v flows toward e1 and f1: %v", delivered, err)
	}
}

// udpFlow opens a new UDP flow from ns to addr (a socket of its own) and says whether one
// datagram was echoed within wait.
func udpFlow(ns, addr string, wait time.Duration) error {
	var c net.Conn
	if err := nsexec.Run(nsPath(ns), func() (err error) { c, err = net.Dial("udp4", addr); return }); err != nil {
		return err
	}
	defer c.Close()
	return udpEchoWithin(c, wait)
}
