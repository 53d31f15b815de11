package ovs

import (
	"encoding/hex"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

func testState() *dataplane.Index {
	d := dataplane.NewIndex()
	d.Networks[vxNet.ID] = vxNet
	a := netip.MustParseAddr("10.1.0.1")
	d.Endpoints["e1"] = dataplane.Endpoint{ID: "e1", NetworkID: vxNet.ID, IP: a, MAC: dataplane.ContivMAC(a), EPGID: 7, HostIfName: "v1", IfName: "eth0"}
	b := netip.MustParseAddr("10.1.0.9")
	d.RemoteEndpoints["r1"] = dataplane.RemoteEndpoint{ID: "r1", NetworkID: vxNet.ID, IP: b, MAC: dataplane.ContivMAC(b), EPGID: 8, Host: "h2",
		VTEP: netip.MustParseAddr("192.168.1.2")}
	d.Peers["h2"] = dataplane.Peer{Host: "h2", VTEP: netip.MustParseAddr("192.168.1.2")}
	d.Policies[7] = dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "d", Priority: 1, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "a", Priority: 3, RemoteEPG: 8, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
	}}
	d.PodPolicies["e1"] = dataplane.PodPolicy{ID: "e1", NetworkID: vxNet.ID, IP: a, IngressIsolated: true, EgressIsolated: true,
		Ingress: []dataplane.PodRule{{Remote: netip.MustParsePrefix("10.1.0.8/30"), Proto: 6, PortMin: 8000, PortMax: 8009}},
		Egress:  []dataplane.PodRule{{Remote: netip.MustParsePrefix("0.0.0.0/0"), Proto: 17, PortMin: 53, PortMax: 53}, {Remote: netip.MustParsePrefix("10.1.0.9/32")}}}
	d.Services["s:default"] = dataplane.Service{ID: "s:default", VIP: netip.MustParseAddr("10.9.0.1"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{a, b}}
	return d
}

var testPorts = ports{endpoints: map[string]uint32{"e1": 100}, tunnel: 1}

func texts(c *compiled) string {
	var s []string
	for _, f := range c.list() {
		s = append(s, f.String())
	}
	return strings.Join(s, "\n")
}

// compileTexts compiles st for host with the ports and ids given and returns the flows'
// text (texts).
func compileTexts(t *testing.T, st *dataplane.Index, host dataplane.HostConfig, p ports, ids idTables) string {
	t.Helper()
	c, err := testPipeline(t).compile(st, host, p, ids)
	if err != nil {
		t.Fatal(err)
	}
	return texts(c)
}

// wantFlows fails t for every flow of want (a flow's text or part of it) that all lacks.
func wantFlows(t *testing.T, all string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("missing flow\n  %s\nin\n%s", w, all)
		}
	}
}

func TestCompile(t *testing.T) {
	c, err := testPipeline(t).compile(testState(), dataplane.HostConfig{FwdMode: dataplane.FwdBridge}, testPorts, newIDs())
	if err != nil {
		t.Fatal(err)
	}
	all := texts(c)
	wantFlows(t, all,
		"table=classifier,priority=100,in_port=1,tun_id=5000 actions=load:5000->reg0,load:1->reg3,load:1->reg4[0..0],load:16385->reg8,load:1->reg9,goto_table:overlay_src",
		"table=overlay_src,priority=0, actions=drop",
		"table=overlay_src,priority=100,reg3=1,tun_src=192.168.1.2,dl_type=0x0800,nw_src=10.1.0.9 actions=goto_table:arp",
		"table=overlay_src,priority=100,reg3=1,tun_src=192.168.1.2,dl_type=0x0806,arp_spa=10.1.0.9 actions=goto_table:arp",
		"table=arp,priority=100,reg0=5000,dl_type=0x0806,arp_op=1,arp_tpa=10.1.0.254 actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],mod_dl_src:00:00:11:11:11:11",
		"table=output,priority=100,reg0=5000,dl_dst=02:02:0a:01:00:09 actions=set_field:5000->tun_id,set_field:192.168.1.2->tun_dst,output:1",
		"table=output,priority=100,reg0=5000,dl_dst=02:02:0a:01:00:01 actions=output:100",
		"table=policy,priority=103,dl_type=0x0800,reg1=7,nw_proto=6 actions=drop",
		"table=policy,priority=106,dl_type=0x0800,reg1=7,reg2=8,nw_proto=6,tp_dst=80 actions=goto_table:netpol_egress",
		"table=policy,priority=0, actions=goto_table:netpol_egress",
		"table=netpol_egress,priority=0, actions=goto_table:netpol_ingress",
		"table=netpol_ingress,priority=0, actions=goto_table:commit",
		"table=netpol_egress,priority=10,dl_type=0x0800,reg3=1,nw_src=10.1.0.1 actions=drop",
		"table=netpol_egress,priority=20,dl_type=0x0800,reg3=1,nw_src=10.1.0.1,nw_proto=17,tp_dst=53 actions=goto_table:netpol_ingress",
		"table=netpol_egress,priority=20,dl_type=0x0800,reg3=1,nw_src=10.1.0.1,nw_dst=10.1.0.9 actions=goto_table:netpol_ingress",
		"table=netpol_ingress,priority=10,dl_type=0x0800,reg3=1,nw_dst=10.1.0.1 actions=drop",
		"table=netpol_ingress,priority=20,dl_type=0x0800,reg3=1,nw_dst=10.1.0.1,nw_src=10.1.0.8/30,nw_proto=6,tp_dst=0x1f40/0xfff8 actions=goto_table:commit",
		"table=netpol_ingress,priority=20,dl_type=0x0800,reg3=1,nw_dst=10.1.0.1,nw_src=10.1.0.8/30,nw_proto=6,tp_dst=0x1f48/0xfffe actions=goto_table:commit",
		// The backend as policy sees it; the DNAT committed only after policy (commit).
		"table=service_dnat,priority=100,dl_type=0x0800,nw_proto=6,reg5=167837705,reg6=8080 actions=load:1->reg4[1..1],set_field:10.1.0.9->ip_dst,set_field:8080->tcp_dst,goto_table:src_epg",
		"table=src_epg,priority=100,reg4[0..0]=1,reg3=1,dl_type=0x0800,nw_src=10.1.0.9 actions=load:8->reg1,goto_table:dst_epg",
	)
	if keys := c.serviceKeys(); len(keys) != 1 {
		t.Errorf("service keys = %v, want one", keys)
	}
	// Routing mode answers ARP for endpoints with the router MAC.
	c, _ = testPipeline(t).compile(testState(), dataplane.HostConfig{FwdMode: dataplane.FwdRouting}, testPorts, newIDs())
	if !strings.Contains(texts(c), "arp_tpa=10.1.0.9 actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],mod_dl_src:00:00:11:11:11:11") {
		t.Error("routing mode: remote endpoint not answered with the router MAC")
	}
}

// TestCompileOpenerZones: a tenant's connections are committed in the zone of their
// opener's side (pipeline.go "Opener zones"): a container's packets open connections in
// the tenant's own zone (reg8) and would be replies in its inbound zone (reg9), packets
// from other hosts (overlay, VLAN uplink) the other way round; conntrack looks a packet up
// where it would be a reply first and, found nothing there, where it opens. A tenant
// whose inbound zone is another tenant's VRF (an id persisted above maxVRF) keeps one
// zone for both.
func TestCompileOpenerZones(t *testing.T) {
	st := testState()
	vlan := dataplane.Network{ID: "green.default", Encap: dataplane.EncapVLAN, Tag: 100,
		Subnet: netip.MustParsePrefix("10.2.0.0/24"), Gateway: netip.MustParseAddr("10.2.0.254")}
	st.Networks[vlan.ID] = vlan
	p := testPorts
	p.uplink = 2
	bridge := dataplane.HostConfig{FwdMode: dataplane.FwdBridge}
	all := compileTexts(t, st, bridge, p, newIDs())
	wantFlows(t, all,
		"table=classifier,priority=100,in_port=100,vlan_tci=0x0000/0x1fff,dl_type=0x0800,dl_src=02:02:0a:01:00:01,nw_src=10.1.0.1 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:16385->reg9,goto_table:arp",
		"table=classifier,priority=100,in_port=1,tun_id=5000 actions=load:5000->reg0,load:1->reg3,load:1->reg4[0..0],load:16385->reg8,load:1->reg9,goto_table:overlay_src",
		"table=classifier,priority=100,in_port=2,dl_vlan=100 actions=pop_vlan,load:16777316->reg0,load:1->reg3,load:1->reg4[0..0],load:16385->reg8,load:1->reg9,goto_table:arp",
		"table=conntrack,priority=10,dl_type=0x0800 actions=ct(table=ct_opener,zone=reg9[0..15],nat)",
		"table=ct_opener,priority=100,dl_type=0x0800,ct_state=+est+trk actions=goto_table:service_lb",
		"table=ct_opener,priority=100,dl_type=0x0800,ct_state=+rel+trk actions=goto_table:service_lb",
		"table=ct_opener,priority=0,dl_type=0x0800 actions=ct(table=service_lb,zone=reg8[0..15],nat)",
		"table=commit,priority=100,dl_type=0x0800,ct_state=+new+trk,reg4[1..1]=0 actions=ct(commit,table=ct_check,zone=reg8[0..15],exec(load:1->NXM_NX_CT_MARK[0]))",
	)
	if strings.Contains(all, "zone=reg3") {
		t.Error("a ct action takes its zone from the VRF register")
	}

	// Tenant "old" holds VRF 0x4001 (persisted before ids were capped at maxVRF): tenant
	// default's inbound zone would be it, so default keeps one zone, and so does old.
	old := dataplane.Network{ID: "red.old", Encap: dataplane.EncapVXLAN, Tag: 5001, Subnet: netip.MustParsePrefix("10.3.0.0/24")}
	st.Networks[old.ID] = old
	ids := newIDs()
	ids.vrf["default"], ids.vrf["old"] = 1, 0x4001
	wantFlows(t, compileTexts(t, st, bridge, p, ids),
		"nw_src=10.1.0.1 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:1->reg9,goto_table:arp",
		"table=classifier,priority=100,in_port=1,tun_id=5000 actions=load:5000->reg0,load:1->reg3,load:1->reg4[0..0],load:1->reg8,load:1->reg9,goto_table:overlay_src",
		"table=classifier,priority=100,in_port=1,tun_id=5001 actions=load:5001->reg0,load:16385->reg3,load:1->reg4[0..0],load:16385->reg8,load:16385->reg9,goto_table:overlay_src",
	)
}

func TestCompileRemoteWithoutPeerForwardsNothing(t *testing.T) {
	st := testState()
	delete(st.Peers, "h2")
	c, err := testPipeline(t).compile(st, dataplane.HostConfig{}, testPorts, newIDs())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(texts(c), "dl_dst=02:02:0a:01:00:09") {
		t.Error("remote endpoint of an unknown peer has forwarding flows")
	}
}

func TestCompileRejects(t *testing.T) {
	for name, mutate := range map[string]func(*dataplane.Index){
		"unknown network": func(d *dataplane.Index) {
			e := d.Endpoints["e1"]
			e.NetworkID = "nope.x"
			d.Endpoints["e1"] = e
		},
		"no port": func(d *dataplane.Index) {
			e := d.Endpoints["e1"]
			e.ID = "e2"
			d.Endpoints["e2"] = e
		},
		"bad action": func(d *dataplane.Index) {
			d.Policies[9] = dataplane.PolicySet{EPGID: 9, Rules: []dataplane.PolicyRule{{ID: "x", Action: "maybe"}}}
		},
		"vxlan remote without vtep": func(d *dataplane.Index) {
			r := d.RemoteEndpoints["r1"]
			r.VTEP = netip.Addr{}
			d.RemoteEndpoints["r1"] = r
		},
		"bad service proto": func(d *dataplane.Index) {
			s := d.Services["s:default"]
			s.Ports = []dataplane.ServicePort{{Proto: 1, Port: 1}}
			d.Services["s:default"] = s
		},
		"service id without tenant": func(d *dataplane.Index) {
			s := d.Services["s:default"]
			s.ID = "s"
			d.Services["s"] = s
		},
		"same VIP:port twice in one tenant": func(d *dataplane.Index) {
			s := d.Services["s:default"]
			s.ID = "s2:default"
			d.Services["s2:default"] = s
		},
	} {
		st := testState()
		mutate(st)
		if _, err := testPipeline(t).compile(st, dataplane.HostConfig{}, testPorts, newIDs()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestEncodingDecodes checks every flow encodes into messages that OVS's own
// decoder (ovs-ofctl ofp-print) accepts.
func TestEncodingDecodes(t *testing.T) {
	if _, err := exec.LookPath("ovs-ofctl"); err != nil {
		testroot.Need(t) // (not root: cannot install it)
		t.Fatal("ovs-ofctl not installed (make test installs openvswitch-switch)")
	}
	c, err := testPipeline(t).compile(testState(), dataplane.HostConfig{}, testPorts, newIDs())
	if err != nil {
		t.Fatal(err)
	}
	var msgs []interface{ MarshalBinary() ([]byte, error) }
	for _, f := range c.list() {
		msgs = append(msgs, f.flowMod(of.FC_ADD, cookieFor(1)), f.flowMod(of.FC_DELETE_STRICT, 0))
	}
	for i, m := range msgs {
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("ovs-ofctl", "ofp-print", hex.EncodeToString(b)).CombinedOutput()
		if err != nil || strings.Contains(string(out), "decode error") || strings.Contains(string(out), "WARN") {
			t.Errorf("message %d does not decode: %v\n%s", i, err, out)
		}
	}
}

func TestPortMasks(t *testing.T) {
	for _, c := range []struct{ lo, hi uint16 }{{1, 65535}, {80, 80}, {8000, 8009}, {0, 0}, {65535, 65535}, {1000, 2000}, {32768, 65535}} {
		covered := map[uint16]int{}
		for _, m := range portMasks(c.lo, c.hi) {
			for p := uint32(0); p <= 65535; p++ {
				if uint16(p)&m[1] == m[0] {
					covered[uint16(p)]++
				}
			}
		}
		for p := uint32(0); p <= 65535; p++ {
			want := 0
			if uint16(p) >= c.lo && uint16(p) <= c.hi {
				want = 1
			}
			if covered[uint16(p)] != want {
				t.Fatalf("%d-%d: port %d covered %d times", c.lo, c.hi, p, covered[uint16(p)])
			}
		}
	}
}

func testPipeline(t *testing.T) *pipeline {
	t.Helper()
	pl, err := newPipeline()
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// TestFieldLookupFailsCleanly: a field libOpenflow does not know fails pipeline
// construction, and a flow using a field the pipeline did not resolve fails compile
// with an error naming it (it used to panic).
func TestFieldLookupFailsCleanly(t *testing.T) {
	if _, err := resolveFields([]string{"NXM_NX_REG0", "NXM_NX_NO_SUCH_FIELD"}, nil); err == nil || !strings.Contains(err.Error(), "NXM_NX_NO_SUCH_FIELD") {
		t.Fatalf("resolveFields with an unknown name: err = %v, want one naming NXM_NX_NO_SUCH_FIELD", err)
	}
	plain, masked := pipelineFields()
	for _, missing := range []string{"NXM_NX_REG0", "NXM_NX_ARP_SHA", "NXM_NX_REG3"} {
		var keep []string
		for _, n := range plain {
			if n != missing {
				keep = append(keep, n)
			}
		}
		fields, err := resolveFields(keep, masked)
		if err != nil {
			t.Fatal(err)
		}
		pl := &pipeline{fields: fields}
		_, err = pl.compile(testState(), dataplane.HostConfig{}, testPorts, newIDs())
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("compile without %s: err = %v, want one naming the field", missing, err)
		}
	}
}

// TestCompileLaterFragmentsLearn: the later fragments of a new UDP flow to a VIP whose UDP
// ports have different target ports take the choice their first fragment's commit taught
// service_frag (learn, after policy passed it); with one target port they hash the
// addresses as the first fragment did.
func TestCompileLaterFragmentsLearn(t *testing.T) {
	st := testState()
	s := st.Services["s:default"]
	s.Ports = []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: 5353}, {Proto: 17, Port: 54, TargetPort: 5354}}
	st.Services[s.ID] = s
	one := dataplane.Service{ID: "one:default", VIP: netip.MustParseAddr("10.9.0.2"), Backends: s.Backends,
		Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: 5353}}}
	st.Services[one.ID] = one
	all := compileTexts(t, st, dataplane.HostConfig{FwdMode: dataplane.FwdBridge}, testPorts, newIDs())
	wantFlows(t, all,
		"table=service_frag,priority=0, actions=drop",
		"table=service_lb,priority=110,dl_type=0x0800,ct_state=+new+trk,reg3=1,nw_dst=10.9.0.1,nw_proto=17,nw_frag=later actions=resubmit(,service_frag),resubmit(,service_backend)",
		"nw_frag=first actions=set_field:10.9.0.1->ip_dst,set_field:53->udp_dst,learn(table=service_frag,hard_timeout=15,priority=100,cookie=0xcb0d000000000000,dl_type=0x0800,nw_proto=17,NXM_NX_REG3[],NXM_OF_IP_SRC[],NXM_OF_IP_DST[],load:NXM_NX_REG7[]->NXM_NX_REG7[]),ct(commit",
		"table=service_lb,priority=110,dl_type=0x0800,ct_state=+new+trk,reg3=1,nw_dst=10.9.0.2,nw_proto=17,nw_frag=later actions=load:",
	)
	// The learned flows' cookie is not the pipeline's: a resync neither counts nor sweeps them.
	if cookieLearn&cookieOwnerMask == cookieOwner {
		t.Error("learned flows carry the pipeline's cookie")
	}
}
