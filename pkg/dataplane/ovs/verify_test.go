package ovs

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestVerifyNamesDrift installs a state, then changes the switch behind the driver's
// back (a policy flow deleted, a remote endpoint's flow given other actions, a foreign
// allow flow with the driver's cookie added): Verify must name each by object and kind,
// and find nothing before the tampering and after a Sync repaired it.
func TestVerifyNamesDrift(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, h2 := twoHosts(t, id)
	c1 := newNS(t, id, "c1")
	d := newDriver(t, h1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e1 := ep("e1", "10.1.0.1", c1, "cbo1"+id)
	e1.EPGID = 7
	r1 := remote(ep("r1", "10.1.0.9", c1, "unused"), h2)
	r1.EPGID = 8
	st := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1},
		RemoteEndpoints: []dataplane.RemoteEndpoint{r1}, Peers: []dataplane.Peer{{Host: "h2", VTEP: h2.cfg.VTEP}},
		Policies: []dataplane.PolicySet{{EPGID: 7, Rules: []dataplane.PolicyRule{
			{ID: "deny-tcp", Priority: 1, Proto: 6, Action: dataplane.ActionDeny, Ingress: true},
			{ID: "web", Priority: 10, RemoteEPG: 8, Proto: 6, Port: 80, Action: dataplane.ActionAllow, Ingress: true}}}},
		Services: []dataplane.Service{{ID: "web:default", VIP: netip.MustParseAddr("10.96.0.10"),
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{e1.IP, r1.IP}},
			// No backends: the rejecting flows (controller action through the reject meter).
			{ID: "empty:default", VIP: netip.MustParseAddr("10.96.0.11"),
				Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}, {Proto: 17, Port: 53, TargetPort: 53}}}}}
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if drift, err := d.Verify(st); err != nil || len(drift) != 0 {
		t.Fatalf("freshly installed: drift %v, err %v", drift, err)
	}
	live, _, err := d.liveFlows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	find := func(table, part string) string {
		for k := range live {
			if tb, match, _ := strings.Cut(k, " "); tb == table && strings.Contains(match, part) {
				return match
			}
		}
		t.Fatalf("no live %s flow with %q in %v", table, part, live)
		return ""
	}
	sw := "unix:" + d.mgmtSocket()
	deny := find("policy", "priority=103")
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "del-flows", "--strict", sw, "table=50,"+deny)
	dst := find("dst_epg", "nw_dst=10.1.0.9")
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "mod-flows", "--strict", sw, "table=40,"+dst+",actions=goto_table:50")
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "add-flow", sw, "cookie=0xcb0b000100000000,table=50,priority=999,ip,nw_src=10.9.9.9,actions=goto_table:52")
	// An allow above every rule with a cookie that is not the driver's, and one with none.
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "add-flow", sw, "cookie=0x1234,table=50,priority=60000,ip,nw_src=10.1.0.9,actions=goto_table:52")
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "add-flow", sw, "table=50,priority=60001,ip,nw_src=10.1.0.8,actions=goto_table:52")
	drift, err := d.Verify(st)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"missing": "policy of group 7", "different": "remote endpoint r1", "extra": "nw_src=10.9.9.9",
		"foreign": "nw_src=10.1.0.9", "foreign without cookie": "nw_src=10.1.0.8"}
	if len(drift) != len(want) {
		t.Errorf("drift %+v, want one row each of %v", drift, want)
	}
	for _, dr := range drift {
		found := false
		for kind, w := range want {
			if strings.HasPrefix(kind, dr.Kind) || (dr.Kind == "extra" && strings.HasPrefix(kind, "foreign")) {
				found = found || strings.Contains(dr.Object, w)
			}
		}
		if !found {
			t.Errorf("unexpected %+v (want %v)", dr, want)
		}
	}
	if !strings.Contains(driftText(drift), "cookie 0x1234, not this driver's") || !strings.Contains(driftText(drift), "cookie 0x0, not this driver's") {
		t.Errorf("foreign flows not named as such:\n%s", driftText(drift))
	}
	// A state the driver cannot compile is reported per object, not as a failure.
	bad := st
	bad.Services = append([]dataplane.Service{{ID: "web:default", VIP: netip.MustParseAddr("10.96.0.10"),
		Ports: []dataplane.ServicePort{{Proto: 1, Port: 80}}}}, st.Services[1:]...)
	if drift, err := d.Verify(bad); err != nil || !strings.Contains(driftText(drift), "service web:default missing cannot be compiled") {
		t.Errorf("uncompilable service: %v, %v", driftText(drift), err)
	}
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	// A resync replaces the driver's flows; foreign ones stay (they are not its to delete)
	// and stay reported.
	if drift, err := d.Verify(st); err != nil || len(drift) != 2 || !strings.Contains(driftText(drift), "not this driver's") {
		t.Errorf("after a resync: drift %v, err %v", drift, err)
	}
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "del-flows", "--strict", sw, "table=50,priority=60000,ip,nw_src=10.1.0.9")
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "del-flows", "--strict", sw, "table=50,priority=60001,ip,nw_src=10.1.0.8")
	if drift, err := d.Verify(st); err != nil || len(drift) != 0 {
		t.Errorf("clean again: drift %v, err %v", drift, err)
	}
}

func driftText(drift []dataplane.Drift) string {
	var s []string
	for _, d := range drift {
		s = append(s, strings.Join([]string{d.Table, d.Object, d.Kind, d.Detail}, " "))
	}
	return strings.Join(s, "\n")
}
