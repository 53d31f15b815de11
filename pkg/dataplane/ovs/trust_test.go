package ovs

import (
	"context"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestCompileTrust checks the flows behind design §9 in the compiled pipeline: source
// anti-spoofing and VLAN drop on container ports, commit only for connection openers,
// SynOnly rules without a flag match, UDP-aware service hashing, tenant-scoped VIPs.
func TestCompileTrust(t *testing.T) {
	st := testState()
	t2 := dataplane.Network{ID: "n2.t2", Encap: dataplane.EncapVXLAN, Tag: 5002, Subnet: vxNet.Subnet, MTU: 1450}
	st.Networks[t2.ID] = t2
	other := st.Services["s:default"]
	other.ID = "s:t2" // same VIP:port, other tenant
	other.Ports = append(other.Ports, dataplane.ServicePort{Proto: 17, Port: 53})
	st.Services[other.ID] = other
	c, err := testPipeline(t).compile(st, dataplane.HostConfig{FwdMode: dataplane.FwdBridge}, testPorts, newIDs())
	if err != nil {
		t.Fatal(err)
	}
	all := texts(c)
	wantFlows(t, all,
		"table=classifier,priority=110,in_port=100,vlan_tci=0x1000/0x1000 actions=drop",
		"table=classifier,priority=100,in_port=100,vlan_tci=0x0000/0x1fff,dl_type=0x0800,dl_src=02:02:0a:01:00:01,nw_src=10.1.0.1 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:16385->reg9,goto_table:arp",
		"table=classifier,priority=100,in_port=100,vlan_tci=0x0000/0x1fff,dl_type=0x0806,dl_src=02:02:0a:01:00:01,arp_spa=10.1.0.1,arp_sha=02:02:0a:01:00:01 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:16385->reg9,goto_table:arp",
		"table=classifier,priority=10,in_port=100 actions=drop",
		// A port's fragments pass its fragment meter; what is answered to it, its answer
		// meter (portmeter.go).
		"table=classifier,priority=105,in_port=100,vlan_tci=0x0000/0x1fff,dl_type=0x0800,dl_src=02:02:0a:01:00:01,nw_src=10.1.0.1,nw_frag=yes actions=meter:3406823524,load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:16385->reg9,goto_table:arp",
		"table=answer,priority=100,in_port=100,reg4[4..4]=1 actions=meter:3407872100,controller(reject_no_backend)",
		"table=answer,priority=90,in_port=100,reg4[5..5]=1 actions=meter:3407872100,goto_table:answer_shared",
		"table=answer,priority=0, actions=drop",
		"table=answer_shared,priority=100,reg4[5..5]=1 actions=meter:51971,IN_PORT",
		"table=commit,priority=110,dl_type=0x0800,ct_state=+new+trk,reg4[1..1]=0,nw_proto=6,tcp_flags=+syn-ack actions=ct(commit,table=ct_check,zone=reg8[0..15],exec(load:1->NXM_NX_CT_MARK[0]))",
		"table=commit,priority=105,dl_type=0x0800,ct_state=+new+trk,reg4[1..1]=0,nw_proto=6 actions=goto_table:l3_rewrite",
		"table=commit,priority=100,dl_type=0x0800,ct_state=+new+trk,reg4[1..1]=0 actions=ct(commit,table=ct_check,zone=reg8[0..15],exec(load:1->NXM_NX_CT_MARK[0]))",
		// Fail closed when conntrack refuses a commit (zone limit, full table).
		"table=ct_check,priority=0, actions=drop",
		// A service packet's DNAT is committed after policy, from the VIP:port it came to;
		// one without its commit flow never leaves untracked.
		"table=commit,priority=130,dl_type=0x0800,ct_state=+new+trk,reg4[1..1]=1,reg7=65537,nw_proto=6 actions=set_field:10.9.0.1->ip_dst,set_field:80->tcp_dst,ct(commit,table=ct_check,zone=reg8[0..15],nat(dst=10.1.0.9:8080),exec(load:1->NXM_NX_CT_MARK[0]))",
		"table=commit,priority=120,reg4[1..1]=1 actions=drop",
		"table=ct_check,priority=90,dl_type=0x0800,ct_mark=0x1/0x1 actions=goto_table:l3_rewrite",
		"table=arp,priority=90,reg3=1,dl_type=0x0806,arp_op=1,arp_tpa=10.9.0.1 actions=",
		"table=arp,priority=90,reg3=2,dl_type=0x0806,arp_op=1,arp_tpa=10.9.0.1 actions=",
		// Pings of the VIP: answered per tenant, only from local ports, whole ones only.
		"table=arp,priority=90,reg3=1,dl_type=0x0800,reg4[0..0]=0,nw_dst=10.9.0.1,nw_proto=1,nw_frag=no,icmp_type=8 actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],mod_dl_src:00:00:11:11:11:11,move:NXM_OF_IP_SRC[]->NXM_OF_IP_DST[],load:10.9.0.1->NXM_OF_IP_SRC[],load:0->NXM_OF_ICMP_TYPE[],load:1->reg4[5..5],goto_table:answer",
		"table=arp,priority=90,reg3=2,dl_type=0x0800,reg4[0..0]=0,nw_dst=10.9.0.1,nw_proto=1,nw_frag=no,icmp_type=8 actions=",
		"table=service_lb,priority=100,dl_type=0x0800,ct_state=+new+trk,reg3=1,nw_dst=10.9.0.1,nw_proto=6,tp_dst=80,tcp_flags=+syn-ack actions=load:1->reg7[16..31],multipath(symmetric_l3l4+udp,0,hrw,2,0,reg7[0..15]),resubmit(,service_backend)",
		"table=service_lb,priority=90,dl_type=0x0800,ct_state=+new+trk,reg3=1,nw_dst=10.9.0.1,nw_proto=6,tp_dst=80 actions=drop",
		"table=service_lb,priority=100,dl_type=0x0800,ct_state=+new+trk,reg3=2,nw_dst=10.9.0.1,nw_proto=6,tp_dst=80,tcp_flags=+syn-ack actions=load:2->reg7[16..31]",
		"table=service_lb,priority=100,dl_type=0x0800,ct_state=+new+trk,reg3=2,nw_dst=10.9.0.1,nw_proto=17,tp_dst=53 actions=load:3->reg7[16..31],multipath(symmetric_l3l4+udp,0,hrw,2,0,reg7[0..15]),resubmit(,service_backend)",
		"table=service_backend,priority=100,reg7=65536 actions=load:167837697->reg5,load:8080->reg6,resubmit(,service_dnat)",
		"table=service_backend,priority=100,reg7=65537 actions=load:167837705->reg5,load:8080->reg6,resubmit(,service_dnat)",
	)
	for _, bad := range []string{"tcp_flags=+syn-ack actions=drop", "table=arp,priority=90,dl_type"} {
		if strings.Contains(all, bad) {
			t.Errorf("unexpected flow matching %q", bad)
		}
	}
	// A service of a tenant without networks here has no flows at all.
	st = testState()
	lone := st.Services["s:default"]
	lone.ID, lone.VIP = "s:nobody", netip.MustParseAddr("10.9.0.2")
	st.Services[lone.ID] = lone
	c, err = testPipeline(t).compile(st, dataplane.HostConfig{}, testPorts, newIDs())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(texts(c), "10.9.0.2") {
		t.Error("service of a tenant without networks on this host has flows")
	}
}

// TestVRFIDsStable: a tenant keeps its VRF id (conntrack zone) when other tenants come
// and go and across an agent restart; an id is reused only after its zone was flushed
// (NXT_CT_FLUSH_ZONE, which OVS must accept).
func TestVRFIDsStable(t *testing.T) {
	needOVS(t)
	id := testID()
	h := oneHost(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nets := func(tenants ...string) dataplane.State {
		var s dataplane.State
		for i, tn := range tenants {
			s.Networks = append(s.Networks, dataplane.Network{ID: "n." + tn, Encap: dataplane.EncapVXLAN, Tag: uint32(100 + i),
				Subnet: netip.MustParsePrefix("10.1.0.0/24"), MTU: 1450})
		}
		return s
	}
	check := func(d *Driver, want map[string]uint32) {
		t.Helper()
		if !maps.Equal(d.vrfIDs, want) {
			t.Errorf("vrf ids = %v, want %v", d.vrfIDs, want)
		}
		if got := d.db.bridge(d.opts.Bridge).ExternalIDs[extVRFs]; got != formatVRFs(want) {
			t.Errorf("persisted vrf ids = %s, want %s", got, formatVRFs(want))
		}
	}
	d := newDriver(t, h)
	steps := []struct {
		tenants []string
		want    map[string]uint32
	}{
		{[]string{"zeta", "beta"}, map[string]uint32{"beta": 1, "zeta": 2}},
		{[]string{"zeta", "beta", "alpha"}, map[string]uint32{"alpha": 3, "beta": 1, "zeta": 2}},
		{[]string{"zeta", "alpha"}, map[string]uint32{"alpha": 3, "zeta": 2}},
		{[]string{"zeta", "alpha", "gamma"}, map[string]uint32{"alpha": 3, "gamma": 1, "zeta": 2}},
	}
	for i, s := range steps {
		if err := d.Sync(ctx, nets(s.tenants...)); err != nil {
			t.Fatalf("step %d: sync: %v", i, err)
		}
		check(d, s.want)
		if i == 1 {
			_ = d.Close()
			d = newDriver(t, h) // restarted agent: same numbering
			check(d, s.want)
		}
	}
	if err := d.Teardown(ctx); err != nil {
		t.Error(err)
	}
}

func TestVRFIDsParse(t *testing.T) {
	m, err := parseVRFs(formatVRFs(map[string]uint32{"a": 1, "b": 7}))
	if err != nil || m["a"] != 1 || m["b"] != 7 {
		t.Errorf("round trip: %v %v", m, err)
	}
	for _, bad := range []string{"{", `{"a":0}`, `{"a":70000}`} {
		if _, err := parseVRFs(bad); err == nil {
			t.Errorf("parseVRFs(%s) accepted", bad)
		}
	}
}
