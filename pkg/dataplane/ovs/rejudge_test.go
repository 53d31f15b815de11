package ovs

import (
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

func TestParseConntrackAndJudge(t *testing.T) {
	out := `tcp,orig=(src=10.1.0.2,dst=10.1.0.3,sport=40000,dport=80),reply=(src=10.1.0.3,dst=10.1.0.2,sport=80,dport=40000),zone=1,protoinfo=(state=ESTABLISHED)
udp,orig=(src=10.1.0.2,dst=10.9.0.1,sport=5353,dport=53),reply=(src=10.1.0.4,dst=10.1.0.2,sport=5300,dport=5353),zone=1
icmp,orig=(src=10.1.0.2,dst=10.1.0.3,id=7,type=8,code=0),reply=(src=10.1.0.3,dst=10.1.0.2,id=7,type=0,code=0),zone=2
tcp,orig=(src=fd00::1,dst=fd00::2,sport=1,dport=2),reply=(src=fd00::2,dst=fd00::1,sport=2,dport=1),zone=1
garbage`
	cs := parseConntrack(out)
	if len(cs) != 3 {
		t.Fatalf("parsed %+v", cs)
	}
	if c := cs[1]; c.proto != 17 || c.dst != netip.MustParseAddr("10.9.0.1") || c.replySrc != netip.MustParseAddr("10.1.0.4") || c.replySport != 5300 || c.zone != 1 {
		t.Fatalf("udp entry %+v", c)
	}
	if c := cs[2]; c.proto != 1 || c.sport != 7 || c.zone != 2 {
		t.Fatalf("icmp entry %+v", c)
	}
	st := dataplane.NewIndex()
	st.Networks[vxNet.ID] = vxNet
	vrf := map[string]uint32{tenantOf(vxNet.ID): 1}
	st.PodPolicies["p"] = dataplane.PodPolicy{ID: "p", NetworkID: vxNet.ID, IP: netip.MustParseAddr("10.1.0.3"), IngressIsolated: true,
		Ingress: []dataplane.PodRule{{Remote: netip.MustParsePrefix("10.1.0.0/24"), Proto: 6, PortMin: 80, PortMax: 80}}}
	// The backend of a DNATed flow is judged, not the VIP.
	st.PodPolicies["b"] = dataplane.PodPolicy{ID: "b", NetworkID: vxNet.ID, IP: netip.MustParseAddr("10.1.0.4"), IngressIsolated: true}
	in := inputsOf(st, vrf)
	if !in.allows(cs[0], 1) {
		t.Error("tcp to an allowed port judged denied")
	}
	if in.allows(cs[1], 1) {
		t.Error("a DNATed flow to an isolated backend judged allowed")
	}
	c := cs[0]
	c.dport = 81
	c.replySport = 81
	if in.allows(c, 1) {
		t.Error("tcp to another port judged allowed")
	}
	if verdictChanged(in, inputsOf(st, vrf)) {
		t.Error("equal inputs reported as changed")
	}
}
