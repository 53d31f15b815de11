package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

func TestCompute(t *testing.T) {
	r := newRecords()
	r.nets["n1.default"] = model.CfgNetworkState{ID: "n1.default", PktTagType: "vxlan", PktTag: 1, ExtPktTag: 7, SubnetIP: "10.1.1.0", SubnetLen: 24, Gateway: "10.1.1.1"}
	r.nets["v1.default"] = model.CfgNetworkState{ID: "v1.default", PktTagType: "vlan", PktTag: 100, SubnetIP: "20.1.1.0", SubnetLen: 24}
	r.nets["bad.default"] = model.CfgNetworkState{ID: "bad.default", PktTagType: "vxlan", ExtPktTag: 3, SubnetIP: "nope", SubnetLen: 24}
	r.eps["n1.default-a"] = model.CfgEndpointState{ID: "n1.default-a", NetID: "n1.default", IPAddress: "10.1.1.2", MacAddress: "02:02:0a:01:01:02", HomingHost: "h1", EndpointGroupID: 3}
	r.eps["n1.default-b"] = model.CfgEndpointState{ID: "n1.default-b", NetID: "n1.default", IPAddress: "10.1.1.3", HomingHost: "h2"}
	r.eps["n1.default-c"] = model.CfgEndpointState{ID: "n1.default-c", NetID: "n1.default", IPAddress: "10.1.1.4", HomingHost: "h3"} // h3 has no VTEP yet
	r.eps["n1.default-d"] = model.CfgEndpointState{ID: "n1.default-d", NetID: "n1.default", IPAddress: "10.1.1.5", HomingHost: "h1"} // no local record
	r.eps["v1.default-e"] = model.CfgEndpointState{ID: "v1.default-e", NetID: "v1.default", IPAddress: "20.1.1.2", HomingHost: "h3"}
	r.local["n1.default-a"] = LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: "n1.default-a", IntfName: "eth0", PortName: HostIfName("n1.default-a")}, NetNS: "/run/netns/x"}
	r.vteps["k1"] = vxlan.Registration{HostAddr: "192.168.1.1", Hostname: "h1"}
	r.vteps["k2"] = vxlan.Registration{HostAddr: "192.168.1.2", Hostname: "h2"}
	r.rules["t:g:t:p:t:p:1:inRx"] = model.CfgPolicyRule{ID: "t:g:t:p:t:p:1:inRx", OfnetPolicyRule: model.OfnetPolicyRule{RuleId: "t:g:t:p:t:p:1:inRx", Priority: 1, DstEndpointGroup: 3, IpProtocol: 6, TcpFlags: "syn,!ack", Action: "deny"}}
	r.rules["t:g:t:p:t:p:2:inTx"] = model.CfgPolicyRule{ID: "t:g:t:p:t:p:2:inTx", OfnetPolicyRule: model.OfnetPolicyRule{RuleId: "t:g:t:p:t:p:2:inTx", Priority: 10, SrcEndpointGroup: 3, Action: "allow"}}
	r.rules["t:g:t:p:t:p:3:outTx"] = model.CfgPolicyRule{ID: "t:g:t:p:t:p:3:outTx", OfnetPolicyRule: model.OfnetPolicyRule{RuleId: "t:g:t:p:t:p:3:outTx", Priority: 5, SrcEndpointGroup: 3, DstIpAddr: "8.8.8.8", IpProtocol: 17, DstPort: 53, Action: "allow"}}
	r.svcs["web:default"] = model.CfgServiceLBState{ID: "web:default", IPAddress: "10.1.1.100", Ports: []string{"80:8080:TCP"},
		Providers: map[string]*model.Provider{"10.1.1.3:default": {IPAddress: "10.1.1.3"}, "10.1.1.2:default": {IPAddress: "10.1.1.2"}}}

	s, bad := compute(hostView{host: "h1", vtep: netip.MustParseAddr("192.168.1.1"), uplinkMTU: 1500}, r)
	if len(s.Networks) != 2 || s.Networks[0].ID != "n1.default" || s.Networks[0].MTU != 1450 || s.Networks[0].Tag != 7 ||
		s.Networks[1].MTU != 1500 || s.Networks[1].Tag != 100 || s.Networks[0].Gateway.String() != "10.1.1.1" {
		t.Fatalf("networks = %+v", s.Networks)
	}
	if bad["network/bad.default"] == nil || !strings.Contains(bad["network/bad.default"].Error(), "subnetIP") {
		t.Fatalf("bad network not reported: %v", bad)
	}
	if len(s.Endpoints) != 1 || s.Endpoints[0].ID != "n1.default-a" || s.Endpoints[0].EPGID != 3 ||
		s.Endpoints[0].NetNS != "/run/netns/x" || s.Endpoints[0].MAC.String() != "02:02:0a:01:01:02" || s.Endpoints[0].Validate() != nil {
		t.Fatalf("local endpoints = %+v", s.Endpoints)
	}
	if len(s.RemoteEndpoints) != 2 || s.RemoteEndpoints[0].ID != "n1.default-b" || s.RemoteEndpoints[0].VTEP.String() != "192.168.1.2" ||
		s.RemoteEndpoints[0].MAC.String() != "02:02:0a:01:01:03" || s.RemoteEndpoints[1].ID != "v1.default-e" {
		t.Fatalf("remote endpoints = %+v", s.RemoteEndpoints)
	}
	if len(s.Peers) != 1 || s.Peers[0].Host != "h2" {
		t.Fatalf("peers = %+v", s.Peers)
	}
	if len(s.Policies) != 1 || s.Policies[0].EPGID != 3 || len(s.Policies[0].Rules) != 2 {
		t.Fatalf("policies = %+v", s.Policies)
	}
	in, out := s.Policies[0].Rules[0], s.Policies[0].Rules[1]
	if !in.Ingress || !in.SynOnly || in.Action != dataplane.ActionDeny || in.Proto != 6 {
		t.Fatalf("ingress rule = %+v", in)
	}
	if out.Ingress || out.Remote.String() != "8.8.8.8/32" || out.Port != 53 || out.Priority != 5 {
		t.Fatalf("egress rule = %+v", out)
	}
	if len(s.Services) != 1 || s.Services[0].Ports[0] != (dataplane.ServicePort{Proto: 6, Port: 80, TargetPort: 8080}) ||
		len(s.Services[0].Backends) != 2 || s.Services[0].Backends[0].String() != "10.1.1.2" {
		t.Fatalf("services = %+v", s.Services)
	}

	// h3 registers its VTEP: its vxlan endpoint appears.
	r.vteps["k3"] = vxlan.Registration{HostAddr: "192.168.1.3", Hostname: "h3"}
	s, _ = compute(hostView{host: "h1", uplinkMTU: 9000}, r)
	if len(s.RemoteEndpoints) != 3 || len(s.Peers) != 2 || s.Networks[0].MTU != 8950 {
		t.Fatalf("after h3 registered: remote=%+v peers=%+v", s.RemoteEndpoints, s.Peers)
	}
	// h2's registration expires (netplugin restarting): its endpoint keeps the last VTEP.
	delete(r.vteps, "k2")
	r.lastVTEP["h2"] = netip.MustParseAddr("192.168.1.2")
	s, _ = compute(hostView{host: "h1", uplinkMTU: 1500}, r)
	if len(s.RemoteEndpoints) != 3 || s.RemoteEndpoints[0].VTEP.String() != "192.168.1.2" || len(s.Peers) != 1 {
		t.Fatalf("after h2 expired: remote=%+v peers=%+v", s.RemoteEndpoints, s.Peers)
	}
}

func TestPlanOrder(t *testing.T) {
	n := dataplane.Network{ID: "n"}
	cur := appliedFrom(dataplane.State{Networks: []dataplane.Network{n}, Endpoints: []dataplane.Endpoint{{ID: "e", NetworkID: "n"}}})
	want := appliedFrom(dataplane.State{Networks: []dataplane.Network{{ID: "m"}}, Endpoints: []dataplane.Endpoint{{ID: "f", NetworkID: "m"}}})
	ops := cur.plan(nil, want)
	var keys []string
	for _, o := range ops {
		keys = append(keys, o.key)
	}
	if strings.Join(keys, ",") != "endpoint/e,network/n,network/m,endpoint/f" {
		t.Fatalf("plan order = %v", keys)
	}
}

func TestHostIfName(t *testing.T) {
	a, b := HostIfName("n1.default-abc"), HostIfName("n1.default-abd")
	if len(a) != 15 || a == b || !strings.HasPrefix(a, "cbv") {
		t.Fatalf("HostIfName = %q, %q", a, b)
	}
}
