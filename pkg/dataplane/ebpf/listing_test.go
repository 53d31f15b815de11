package ebpf

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestListings: after real traffic through a service VIP and a denied connection, every
// decoded table names what an operator knows (endpoint ids, interfaces, rule ids, service
// names, protocols and ports in host order) instead of raw map bytes.
func TestListings(t *testing.T) {
	h, a, b, _, _ := opsHost(t,
		dataplane.PolicyRule{ID: "t:p:deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		dataplane.PolicyRule{ID: "t:p:allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
		dataplane.PolicyRule{ID: "t:p:from-far", Priority: 3, Ingress: true, Remote: netip.MustParsePrefix("10.50.0.8/30"), Action: dataplane.ActionAllow})
	srv, err := conformance.StartTCPEchoPort(b.NetNS, b.IP.String(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := conformance.DialTCP(a.NetNS, "10.50.0.100:80")
	if err != nil {
		t.Fatal(err)
	}
	if err := conformance.EchoRoundTrip(c, 512); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.3:8081", 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("denied port reachable")
	}

	list := func(kind string) dataplane.Listing {
		t.Helper()
		l, err := h.d.Listing(dataplane.ListQuery{Kind: kind})
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		return l
	}
	// has finds a row containing every cell of want (in order of columns named).
	has := func(l dataplane.Listing, want map[string]string) {
		t.Helper()
		col := map[string]int{}
		for i, c := range l.Columns {
			col[c] = i
		}
		for _, r := range l.Rows {
			ok := len(r) == len(l.Columns)
			for c, v := range want {
				i, known := col[c]
				if !known {
					t.Fatalf("%s: no column %q in %v", l.Kind, c, l.Columns)
				}
				ok = ok && strings.Contains(r[i], v)
			}
			if ok {
				return
			}
		}
		t.Errorf("%s: no row with %v in\n%v", l.Kind, want, l.Rows)
	}
	eps := list("endpoints")
	has(eps, map[string]string{"NETWORK": "red.t", "IP": "10.50.0.2", "MAC": "02:02:0a:32:00:02", "EPG": "1", "WHERE": "local " + a.HostIfName, "ENDPOINT": "red.t-a"})
	has(eps, map[string]string{"IP": "10.50.0.9", "WHERE": "vtep 10.254.0.2 (h2)", "ENDPOINT": "red.t-far"})
	has(list("networks"), map[string]string{"NETWORK": "red.t", "ZONE": "(t)", "ENCAP": "vxlan", "TAG": "77", "SUBNET": "10.50.0.0/24", "GATEWAY": "10.50.0.1"})
	has(list("peers"), map[string]string{"VTEP": "10.254.0.2", "HOST": "h2"})
	pl := list("policy")
	has(pl, map[string]string{"EPG": "2", "DIRECTION": "ingress", "#": "1", "RULE": "t:p:allow-8080", "ACTION": "allow", "PROTO": "tcp", "PORT": "8080"})
	has(pl, map[string]string{"RULE": "t:p:from-far", "PROTO": "any", "REMOTE": "10.50.0.8/30"})
	has(pl, map[string]string{"RULE": "t:p:deny-tcp", "ACTION": "deny", "FLAGS": "syn-only"})
	// One group's listing: its rules, named, and nothing of other groups.
	for _, q := range []struct {
		epg  uint16
		rows int
	}{{2, len(pl.Rows)}, {1, 0}, {999, 0}} {
		g, err := h.d.Listing(dataplane.ListQuery{Kind: "policy", EPG: q.epg})
		if err != nil || len(g.Rows) != q.rows {
			t.Errorf("policy of group %d: %d rows, %v; want %d", q.epg, len(g.Rows), err, q.rows)
		} else if q.rows > 0 {
			has(g, map[string]string{"EPG": "2", "RULE": "t:p:allow-8080"})
		}
	}
	has(list("services"), map[string]string{"SERVICE": "web:t", "FRONTEND": "10.50.0.100:80/tcp", "TARGET PORT": "8080", "BACKENDS": "10.50.0.3"})
	ct := list("ct")
	// The service entry (VIP → chosen backend) and the policy entry of the translated flow.
	has(ct, map[string]string{"PROTO": "tcp", "SOURCE": "10.50.0.2:", "DESTINATION": "10.50.0.100:80", "FLAGS": "service",
		"NAT": "10.50.0.3:8080 on red.t", "SERVICE": "web:t"})
	has(ct, map[string]string{"PROTO": "tcp", "SOURCE": "10.50.0.2:", "DESTINATION": "10.50.0.3:8080", "STATE": "established",
		"FLAGS": "allowed,dnat", "NAT": "10.50.0.100:80", "EXPIRES": "h"})
	for _, r := range ct.Rows {
		if strings.Contains(r[3], ":8081") {
			t.Errorf("the denied SYN left a conntrack entry: %v", r)
		}
	}
	has(list("counters"), map[string]string{"COUNTER": "drop_policy", "KIND": "drop"})
	if l, err := h.d.Listing(dataplane.ListQuery{Kind: "ct", Limit: 1}); err != nil || len(l.Rows) != 1 || l.Truncated == 0 {
		t.Errorf("ct with limit 1: %d rows, %d truncated, %v", len(l.Rows), l.Truncated, err)
	}
	if _, err := h.d.Listing(dataplane.ListQuery{Kind: "bogus"}); err == nil || !strings.Contains(err.Error(), "unknown table") {
		t.Errorf("unknown table: %v", err)
	}
	// A rule written behind the agent's back is shown, but not under a rule id.
	var k contivbpfCbPolKey
	var v contivbpfCbPolicy
	k.Epg, k.Dir = 2, uint8(contivbpfCbPolDirCB_DIR_INGRESS)
	if err := h.d.objs.CbPolicies.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	v.Rules[0].Port = nport(9999)
	if err := h.d.objs.CbPolicies.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	has(list("policy"), map[string]string{"#": "1", "RULE": "(not in the agent's state)", "PORT": "9999"})
}

// TestVerify: right after Sync the maps hold exactly what the state implies; entries
// changed, deleted or added behind the driver's back are each named.
func TestVerify(t *testing.T) {
	ctx := context.Background()
	h, a, _, remote, state := opsHost(t,
		dataplane.PolicyRule{ID: "t:p:allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
		dataplane.PolicyRule{ID: "t:p:deny-22", Priority: 9, Ingress: true, Proto: 6, Port: 22, Action: dataplane.ActionDeny})
	if drift, err := h.d.Verify(state); err != nil || len(drift) != 0 {
		t.Fatalf("drift right after Sync: %v %+v", err, drift)
	}
	objs := &h.d.objs
	// Endpoint a's group changed behind the agent's back.
	ak := contivbpfCbEpKey{Net: h.d.eps.networks[h.net.ID].key, Ip: ip4(a.IP)}
	var av contivbpfCbEndpoint
	if err := objs.CbEndpoints.Lookup(&ak, &av); err != nil {
		t.Fatal(err)
	}
	av.Epg = 7
	if err := objs.CbEndpoints.Put(&ak, &av); err != nil {
		t.Fatal(err)
	}
	// The peer entry deleted, a stray network added, a policy rule's port rewritten.
	if err := objs.CbPeers.Delete(ip4(remote.VTEP)); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbNetworks.Put(uint32(4242), &contivbpfCbNetwork{Subnet: ip4(netip.MustParseAddr("10.99.0.0")), Tag: 4242}); err != nil {
		t.Fatal(err)
	}
	pk := contivbpfCbPolKey{Epg: 2, Dir: uint8(contivbpfCbPolDirCB_DIR_INGRESS)}
	var pv contivbpfCbPolicy
	if err := objs.CbPolicies.Lookup(&pk, &pv); err != nil {
		t.Fatal(err)
	}
	pv.Rules[0].Port = nport(2222)
	if err := objs.CbPolicies.Put(&pk, &pv); err != nil {
		t.Fatal(err)
	}
	// The node port deleted, a stray one added; a's host route pointed elsewhere.
	if err := objs.CbNodeports.Delete(&contivbpfCbNpKey{Port: nport(30080), Proto: 6}); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbNodeports.Put(&contivbpfCbNpKey{Port: nport(31000), Proto: 17}, &contivbpfCbNp{Vip: ip4(netip.MustParseAddr("10.50.0.100"))}); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbHostRoutes.Put(ip4(a.IP), &contivbpfCbHostRoute{Ifindex: 9999}); err != nil {
		t.Fatal(err)
	}
	drift, err := h.d.Verify(state)
	if err != nil {
		t.Fatal(err)
	}
	want := []dataplane.Drift{
		{Table: "cb_endpoints", Object: "red.t-a", Kind: "different"},
		{Table: "cb_host_routes", Object: "10.50.0.2", Kind: "different"},
		{Table: "cb_networks", Object: "key 4242", Kind: "extra"},
		{Table: "cb_nodeports", Object: "node port 31000/udp", Kind: "extra"},
		{Table: "cb_nodeports", Object: "web:t node port 30080/tcp", Kind: "missing"},
		{Table: "cb_peers", Object: "h2 10.254.0.2", Kind: "missing"},
		{Table: "cb_policies", Object: "epg 2 ingress #1", Kind: "different"},
	}
	if len(drift) != len(want) {
		t.Fatalf("drift %+v, want %d entries", drift, len(want))
	}
	for i, w := range want {
		if g := drift[i]; g.Table != w.Table || g.Object != w.Object || g.Kind != w.Kind {
			t.Errorf("drift %d = %+v, want %+v", i, g, w)
		}
	}
	if !strings.Contains(drift[0].Detail, "epg 7") || !strings.Contains(drift[6].Detail, "t:p:deny-22") {
		t.Errorf("details do not say what differs: %+v", drift)
	}
	// A Sync repairs it all.
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if drift, err := h.d.Verify(state); err != nil || len(drift) != 0 {
		t.Fatalf("drift after the repairing Sync: %v %+v", err, drift)
	}
}

// TestTrace: traces through the live maps agree with real traffic (a service VIP is
// translated and delivered, a denied port is dropped by the named rule, a remote endpoint
// is tunneled to its host) and change no live state.
func TestTrace(t *testing.T) {
	h, a, b, remote, _ := opsHost(t,
		dataplane.PolicyRule{ID: "t:p:deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		dataplane.PolicyRule{ID: "t:p:allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow})
	liveState := func() (int, map[Reason]Counter) {
		n := countEntries(t, h.d.objs.CbCt)
		r, err := readReasons(h.d.objs.CbReasons)
		if err != nil {
			t.Fatal(err)
		}
		delete(r, DropNotIPv4) // the namespaces' own IPv6 chatter
		return n, r
	}
	ct0, reasons0 := liveState()
	trace := func(dst string, proto uint8, port uint16) dataplane.TraceResult {
		t.Helper()
		r, err := h.d.Trace(dataplane.TraceRequest{From: a.ID, Dst: netip.MustParseAddr(dst), Proto: proto, DstPort: port})
		if err != nil {
			t.Fatalf("trace to %s:%d: %v", dst, port, err)
		}
		t.Logf("trace %s: %s", r.Packet, r.Verdict)
		for _, s := range r.Stages {
			t.Logf("  %-9s %s", s.Name, s.Detail)
		}
		return r
	}
	vip := trace("10.50.0.100", 6, 80)
	if vip.Reason != "fwd_local" || !strings.Contains(vip.Verdict, "delivered to 10.50.0.3 red.t-b") {
		t.Errorf("VIP trace: %+v", vip)
	}
	stage := func(r dataplane.TraceResult, name, sub string) {
		t.Helper()
		for _, s := range r.Stages {
			if s.Name == name && strings.Contains(s.Detail, sub) {
				return
			}
		}
		t.Errorf("no %s stage with %q in %+v", name, sub, r.Stages)
	}
	stage(vip, "service", "backend 10.50.0.3:8080")
	stage(vip, "policy", "allowed by rule t:p:allow-8080 (group 2 ingress")
	stage(vip, "conntrack", "would create tcp 10.50.0.2:")
	denied := trace("10.50.0.3", 6, 22)
	if denied.Reason != "drop_policy" || denied.Rule != "t:p:deny-tcp" || !strings.HasPrefix(denied.Verdict, "dropped") {
		t.Errorf("denied trace: %+v", denied)
	}
	stage(denied, "policy", "t:p:deny-tcp (group 2 ingress")
	far := trace("10.50.0.9", 6, 80)
	if far.Reason != "fwd_tunnel" || far.Tunnel == nil || far.Tunnel.VTEP != remote.VTEP || far.Tunnel.VNI != 77 || far.Tunnel.Source != h.cfg.VTEP {
		t.Errorf("remote trace: %+v", far)
	}
	stage(far, "forward", "VXLAN to 10.254.0.2 (h2), VNI 77 (remote endpoint red.t-far)")
	if icmp := trace("10.50.0.3", 1, 0); icmp.Reason != "fwd_local" {
		t.Errorf("icmp trace: %+v", icmp)
	}
	// The receive side: the frame a remote endpoint's host would tunnel here.
	inner := dataplane.TraceFrame(remote.MAC, b.MAC, remote.IP, b.IP, 6, 41000, 8080)
	rx, err := h.d.TraceReceive(dataplane.TraceTunnel{Source: remote.VTEP, VNI: 77, Inner: inner})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("receive %s: %s %+v", rx.Packet, rx.Verdict, rx.Stages)
	if rx.Reason != "fwd_local" || !strings.Contains(rx.Verdict, "delivered to 10.50.0.3 red.t-b") {
		t.Errorf("receive trace: %+v", rx)
	}
	rx, err = h.d.TraceReceive(dataplane.TraceTunnel{Source: remote.VTEP, VNI: 77, Inner: dataplane.TraceFrame(remote.MAC, b.MAC, remote.IP, b.IP, 6, 41000, 22)})
	if err != nil || rx.Reason != "drop_policy" || rx.Rule != "t:p:deny-tcp" {
		t.Errorf("receive trace of a denied port: %+v %v", rx, err)
	}
	// A peer claiming an endpoint that lives behind another VTEP is refused.
	if rx, err := h.d.TraceReceive(dataplane.TraceTunnel{Source: netip.MustParseAddr("10.254.0.99"), VNI: 77, Inner: inner}); err != nil || !strings.HasPrefix(rx.Verdict, "dropped") {
		t.Errorf("receive trace from a foreign VTEP: %+v %v", rx, err)
	}
	// The reused trace programs start each run from the live state, not the last trace's.
	again := trace("10.50.0.100", 6, 80)
	stage(again, "service", "backend 10.50.0.3:8080")
	stage(again, "conntrack", "would create tcp 10.50.0.2:")
	// No live state changed.
	if ct1, reasons1 := liveState(); ct1 != ct0 || !reflect.DeepEqual(reasons1, reasons0) {
		t.Errorf("trace changed live state: conntrack %d -> %d entries, reasons %v -> %v", ct0, ct1, reasons0, reasons1)
	}
	// Real traffic agrees.
	srv, err := conformance.StartTCPEchoPort(b.NetNS, b.IP.String(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if c, err := conformance.DialTCP(a.NetNS, "10.50.0.100:80"); err != nil {
		t.Errorf("real connection to the VIP: %v", err)
	} else {
		c.Close()
	}
	if c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.3:22", 300*time.Millisecond); err == nil {
		c.Close()
		t.Error("real connection to the denied port succeeded")
	}
	// Bad requests.
	for _, req := range []dataplane.TraceRequest{
		{From: "red.t-nobody", Dst: b.IP, Proto: 6, DstPort: 80},
		{From: a.ID, Dst: netip.MustParseAddr("fd00::1"), Proto: 6, DstPort: 80},
		{From: a.ID, Dst: b.IP, Proto: 6},
		{From: a.ID, Dst: b.IP, Proto: 47},
	} {
		if _, err := h.d.Trace(req); err == nil {
			t.Errorf("trace %+v accepted", req)
		}
	}
}

// opsHost is one host with endpoints a (EPG 1) and b (EPG 2), a remote endpoint "far" on
// peer h2, service web:t (10.50.0.100:80 -> b:8080) and the given ingress rules on EPG 2,
// synced.
func opsHost(t *testing.T, rules ...dataplane.PolicyRule) (*oneHost, dataplane.Endpoint, dataplane.Endpoint, dataplane.RemoteEndpoint, dataplane.State) {
	t.Helper()
	h := newOneHost(t)
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 1, 2
	remote := dataplane.RemoteEndpoint{ID: "red.t-far", NetworkID: h.net.ID, IP: netip.MustParseAddr("10.50.0.9"),
		MAC: dataplane.ContivMAC(netip.MustParseAddr("10.50.0.9")), EPGID: 1, VTEP: netip.MustParseAddr("10.254.0.2"), Host: "h2"}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote}, Peers: []dataplane.Peer{{Host: "h2", VTEP: remote.VTEP}},
		Policies: []dataplane.PolicySet{{EPGID: 2, Rules: rules}},
		Services: []dataplane.Service{{ID: "web:t", VIP: netip.MustParseAddr("10.50.0.100"),
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080, NodePort: 30080}}, Backends: []netip.Addr{b.IP}}}}
	if err := h.d.Sync(context.Background(), state); err != nil {
		t.Fatal(err)
	}
	return h, a, b, remote, state
}
