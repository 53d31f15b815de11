package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// TestTraceOVS traces packets through two hosts' switches and checks the verdicts
// against real traffic: a connection a rule denies (named), one a rule allows (local
// delivery), one through a service VIP (backend chosen) and one tunneled to the other
// host, whose receive path is traced from the first trace's tunnel; an address nothing
// answers ARP for; and that tracing committed nothing to conntrack.
func TestTraceOVS(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, h2 := twoHosts(t, id)
	c1, c2, c3 := newNS(t, id, "c1"), newNS(t, id, "c2"), newNS(t, id, "c3")
	d1, d2 := newDriver(t, h1), newDriver(t, h2)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e1, e2, e3 := ep("e1", "10.1.0.1", c1, "cbo1"+id), ep("e2", "10.1.0.2", c2, "cbo2"+id), ep("e3", "10.1.0.3", c3, "cbo3"+id)
	e1.EPGID, e2.EPGID, e3.EPGID = 8, 7, 7
	pol := dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Proto: 6, Action: dataplane.ActionDeny, Ingress: true},
		{ID: "web", Priority: 10, RemoteEPG: 8, Proto: 6, Port: 80, Action: dataplane.ActionAllow, Ingress: true}}}
	vip := netip.MustParseAddr("10.96.0.10")
	svc := dataplane.Service{ID: "web:default", VIP: vip, Ports: []dataplane.ServicePort{{Proto: 6, Port: 8000, TargetPort: 80}}, Backends: []netip.Addr{e2.IP}}
	empty := dataplane.Service{ID: "empty:default", VIP: netip.MustParseAddr("10.96.0.11"), Ports: []dataplane.ServicePort{{Proto: 6, Port: 8000, TargetPort: 80}}}
	s1 := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e3, h2)}, Peers: []dataplane.Peer{{Host: "h2", VTEP: h2.cfg.VTEP}},
		Policies: []dataplane.PolicySet{pol}, Services: []dataplane.Service{svc, empty}}
	s2 := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e3},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e1, h1), remote(e2, h1)}, Peers: []dataplane.Peer{{Host: "h1", VTEP: h1.cfg.VTEP}},
		Policies: []dataplane.PolicySet{pol}}
	if err := d1.Sync(ctx, s1); err != nil {
		t.Fatal(err)
	}
	if err := d2.Sync(ctx, s2); err != nil {
		t.Fatal(err)
	}
	listen(t, c2, "10.1.0.2:80")
	listen(t, c2, "10.1.0.2:22")
	listen(t, c3, "10.1.0.3:80")
	dial := func(addr string) error {
		return nsexec.Run(nsPath(c1), func() error {
			c, err := net.DialTimeout("tcp4", addr, 1500*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	trace := func(dst string, port uint16) dataplane.TraceResult {
		t.Helper()
		r, err := d1.Trace(dataplane.TraceRequest{From: "e1", Dst: netip.MustParseAddr(dst), Proto: 6, DstPort: port, SrcPort: 45000})
		if err != nil {
			t.Fatalf("trace to %s:%d: %v", dst, port, err)
		}
		t.Logf("trace %s:%d: %s (%s)\n%v", dst, port, r.Verdict, r.Rule, r.Stages)
		return r
	}
	stages := func(r dataplane.TraceResult) string { return fmt.Sprint(r.Stages) }

	if r := trace("10.96.0.11", 8000); r.Reason != "reject_no_backend" {
		t.Errorf("service without backends: %+v", r)
	}
	// A ping of a VIP is answered by the datapath, through the sender's answer meter.
	if r, err := d1.Trace(dataplane.TraceRequest{From: "e1", Dst: netip.MustParseAddr("10.96.0.11"), Proto: 1}); err != nil ||
		r.Reason != "icmp_vip_reply" || !strings.Contains(fmt.Sprint(r.Stages), "answer") {
		t.Errorf("ping of a VIP: %+v, %v", r, err)
	}
	if err := dial("10.96.0.11:8000"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("real traffic to a service without backends: %v, want ECONNREFUSED", err)
	}
	denied := trace("10.1.0.2", 22)
	if denied.Reason != "drop_policy" || denied.Rule != "deny-tcp" || !strings.Contains(stages(denied), "denied by rule deny-tcp (group 7 ingress)") {
		t.Errorf("denied flow: %+v", denied)
	}
	if err := dial("10.1.0.2:22"); err == nil {
		t.Error("real traffic: 10.1.0.2:22 answered, the trace said denied")
	}
	allowed := trace("10.1.0.2", 80)
	if allowed.Reason != "fwd_local" || !strings.Contains(allowed.Verdict, "delivered to 10.1.0.2 (e2)") ||
		!strings.Contains(stages(allowed), "allowed by rule web (group 7 ingress)") || !strings.Contains(stages(allowed), "committed") {
		t.Errorf("allowed flow: %+v", allowed)
	}
	if err := dial("10.1.0.2:80"); err != nil {
		t.Errorf("real traffic: %v, the trace said delivered", err)
	}
	viaVIP := trace(vip.String(), 8000)
	if viaVIP.Reason != "fwd_local" || !strings.Contains(stages(viaVIP), "10.96.0.10:8000 is a service VIP: backend 10.1.0.2:80 chosen") {
		t.Errorf("service flow: %+v", viaVIP)
	}
	if err := dial(vip.String() + ":8000"); err != nil {
		t.Errorf("real traffic through the VIP: %v", err)
	}
	tunneled := trace("10.1.0.3", 80)
	if tunneled.Reason != "fwd_tunnel" || !strings.Contains(tunneled.Verdict, "tunneled to VTEP 192.168.77.2 (h2), VNI 5000") || tunneled.Tunnel == nil || len(tunneled.Tunnel.Inner) == 0 {
		t.Fatalf("tunneled flow: %+v", tunneled)
	}
	rx, err := d2.TraceReceive(*tunneled.Tunnel)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("receive on h2: %s %v", rx.Verdict, rx.Stages)
	if rx.Reason != "fwd_local" || !strings.Contains(rx.Verdict, "(e3)") || !strings.Contains(fmt.Sprint(rx.Stages), "allowed by rule web") {
		t.Errorf("receive side: %+v", rx)
	}
	if err := dial("10.1.0.3:80"); err != nil {
		t.Errorf("real traffic to h2: %v, the trace said tunneled and delivered", err)
	}
	// From another host to a service without backends: dropped, never answered (the
	// error would leave the uplink to an address the sender chose).
	fromRemote := slices.Clone(tunneled.Tunnel.Inner)
	copy(fromRemote[6:12], e3.MAC)
	copy(fromRemote[26:30], netip.MustParseAddr("10.1.0.3").AsSlice())
	copy(fromRemote[30:34], netip.MustParseAddr("10.96.0.11").AsSlice())
	binary.BigEndian.PutUint16(fromRemote[14+int(fromRemote[14]&0xf)*4+2:], 8000)
	rrx, err := d1.TraceReceive(dataplane.TraceTunnel{Source: h2.cfg.VTEP, VTEP: h1.cfg.VTEP, VNI: tunneled.Tunnel.VNI, Inner: fromRemote})
	if err != nil {
		t.Fatal(err)
	}
	if rrx.Reason == "reject_no_backend" || !strings.HasPrefix(rrx.Verdict, "dropped") {
		t.Errorf("a remote host's SYN to a service without backends: %+v, want dropped unanswered", rrx)
	}
	nobody := trace("10.1.0.77", 80)
	if !strings.HasPrefix(nobody.Verdict, "dropped") || !strings.Contains(nobody.Verdict, "ARP") {
		t.Errorf("unknown address: %+v", nobody)
	}
	if _, err := d1.Trace(dataplane.TraceRequest{From: "nobody", Dst: e2.IP, Proto: 6, DstPort: 80}); err == nil {
		t.Error("trace from an unknown endpoint: no error")
	}
	if _, err := d2.TraceReceive(dataplane.TraceTunnel{Source: h1.cfg.VTEP, VNI: 5000, Inner: []byte{1, 2, 3}}); err == nil {
		t.Error("trace receive of a truncated frame: no error")
	}
	// Decoded tables (netctl bpf <kind> on an OVS host).
	for kind, want := range map[string]string{
		"endpoints": "vtep 192.168.77.2 (h2)", "networks": "blue.default", "peers": "h2",
		"services": "10.96.0.10:8000/tcp", "policy": "deny-tcp", "counters": "policy",
		"flows": "service web:default", "ct": "10.1.0.2:80",
	} {
		l, err := d1.Listing(dataplane.ListQuery{Kind: kind, Limit: 100})
		if err != nil || !strings.Contains(fmt.Sprint(l.Rows), want) {
			t.Errorf("listing %s: %v, no %q in %v", kind, err, want, l.Rows)
		}
	}
	for epg, want := range map[uint16]int{7: len(pol.Rules), 8: 0} { // one group's rules only
		if l, err := d1.Listing(dataplane.ListQuery{Kind: "policy", EPG: epg}); err != nil || len(l.Rows) != want {
			t.Errorf("policy listing of group %d: %d rows, %v; want %d", epg, len(l.Rows), err, want)
		}
	}
	if _, err := d1.Listing(dataplane.ListQuery{Kind: "nat", Limit: 10}); err == nil || !strings.Contains(err.Error(), "eBPF only") {
		t.Errorf("listing nat on OVS: %v", err)
	}
	// The traces committed nothing: no conntrack entry has their source port.
	ct, err := d1.appctl(ctx, "dpctl/dump-conntrack")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ct, "sport=45000") {
		t.Errorf("a trace left conntrack state:\n%s", ct)
	}
}

// TestParseTrace: tables of another bridge (a tunneled packet's trip through the
// underlay bridge, table numbers at column 0 included) are left out, a table miss is a
// step, actions belong to their table, and the last final flow and datapath actions win.
func TestParseTrace(t *testing.T) {
	out := `Flow: tcp,in_port=100,nw_src=10.1.0.1,nw_dst=10.1.0.3

bridge("contivbr")
------------------
 0. ip,in_port=100, priority 100, cookie 0xcb0b000200000000
    load:0x1->NXM_NX_REG3[]
    goto_table:10
70. reg0=0x1388, priority 100, cookie 0xcb0b000200000000
    set_field:192.168.77.2->tun_dst
    output:1
     -> output to native tunnel

        bridge("contivul")
        ------------------
         0. priority 0
            NORMAL
12. priority 5
    NORMAL

Final flow: tcp,reg3=0x1,nw_src=10.1.0.1,nw_dst=10.1.0.3,tp_src=1,tp_dst=80
Datapath actions: tnl_push(...)

bridge("contivbr")
------------------
40. No match.
    drop
`
	steps, dp, final := parseTrace(out, "contivbr")
	if len(steps) != 3 || steps[0].table != tClassifier || steps[1].table != tOutput || steps[2].table != tDstEPG || steps[2].prio != -1 {
		t.Fatalf("steps %+v", steps)
	}
	if got := fmt.Sprint(steps[1].actions); got != "[set_field:192.168.77.2->tun_dst output:1]" {
		t.Errorf("actions of table 70: %s", got)
	}
	if dp != "tnl_push(...)" || final["nw_dst"] != "10.1.0.3" || final["tp_dst"] != "80" {
		t.Errorf("datapath %q, final %v", dp, final)
	}
	if steps, _, _ := parseTrace("garbage\n 99. \n", "contivbr"); len(steps) != 0 {
		t.Errorf("garbage parsed as %+v", steps)
	}
}
