package agent

import (
	"fmt"
	"io"
	"log/slog"
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
	r.nets["v1.default"] = model.CfgNetworkState{ID: "v1.default", PktTagType: "vlan", PktTag: 100, SubnetIP: "20.1.1.0", SubnetLen: 24, NatDisabled: true}
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
	r.svcs["web:default"] = model.CfgServiceLBState{ID: "web:default", IPAddress: "10.1.1.100", Ports: []string{"80:8080:TCP"}, NodePorts: []string{"30080:80:TCP"},
		Providers: map[string]*model.Provider{"10.1.1.3:default": {IPAddress: "10.1.1.3"}, "10.1.1.2:default": {IPAddress: "10.1.1.2"}}}

	s, bad := compute(hostView{host: "h1", vtep: netip.MustParseAddr("192.168.1.1"), uplinkMTU: 1500, vlanIf: "eth1"}, r)
	if len(s.Networks) != 2 || s.Networks[0].ID != "n1.default" || s.Networks[0].MTU != 1450 || s.Networks[0].Tag != 7 ||
		s.Networks[1].MTU != 1500 || s.Networks[1].Tag != 100 || s.Networks[0].Gateway.String() != "10.1.1.1" ||
		s.Networks[0].NoSNAT || !s.Networks[1].NoSNAT {
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
	// Evaluation order (pkg/policy): priority descending, so the egress allow (5) first.
	out, in := s.Policies[0].Rules[0], s.Policies[0].Rules[1]
	if !in.Ingress || !in.SynOnly || in.Action != dataplane.ActionDeny || in.Proto != 6 {
		t.Fatalf("ingress rule = %+v", in)
	}
	if out.Ingress || out.Remote.String() != "8.8.8.8/32" || out.Port != 53 || out.Priority != 5 {
		t.Fatalf("egress rule = %+v", out)
	}
	if len(s.Services) != 1 || s.Services[0].Ports[0] != (dataplane.ServicePort{Proto: 6, Port: 80, TargetPort: 8080, NodePort: 30080}) ||
		len(s.Services[0].Backends) != 2 || s.Services[0].Backends[0].String() != "10.1.1.2" {
		t.Fatalf("services = %+v", s.Services)
	}

	// h3 registers its VTEP: its vxlan endpoint appears.
	r.vteps["k3"] = vxlan.Registration{HostAddr: "192.168.1.3", Hostname: "h3"}
	s, _ = compute(hostView{host: "h1", uplinkMTU: 9000, vlanIf: "eth1"}, r)
	if len(s.RemoteEndpoints) != 3 || len(s.Peers) != 2 || s.Networks[0].MTU != 8950 {
		t.Fatalf("after h3 registered: remote=%+v peers=%+v", s.RemoteEndpoints, s.Peers)
	}
	// h2's registration expires (netplugin restarting): its endpoint keeps the last VTEP.
	delete(r.vteps, "k2")
	r.lastVTEP["h2"] = netip.MustParseAddr("192.168.1.2")
	s, _ = compute(hostView{host: "h1", uplinkMTU: 1500, vlanIf: "eth1"}, r)
	if len(s.RemoteEndpoints) != 3 || s.RemoteEndpoints[0].VTEP.String() != "192.168.1.2" || len(s.Peers) != 1 {
		t.Fatalf("after h2 expired: remote=%+v peers=%+v", s.RemoteEndpoints, s.Peers)
	}
	// Without a VLAN uplink the vlan network (and its endpoints) is refused, visibly.
	s, bad = compute(hostView{host: "h1", uplinkMTU: 1500}, r)
	if len(s.Networks) != 1 || s.Networks[0].ID != "n1.default" || len(s.RemoteEndpoints) != 2 ||
		bad["network/v1.default"] == nil || !strings.Contains(bad["network/v1.default"].Error(), "--vlan-if") {
		t.Fatalf("without --vlan-if: networks=%+v remote=%+v errors=%v", s.Networks, s.RemoteEndpoints, bad)
	}
}

// TestComputePolicies checks the agent compiles rules with pkg/policy: address ranges
// become exact prefix covers, rules come in evaluation order, and refused records are
// reported per rule while the valid ones are still installed.
func TestComputePolicies(t *testing.T) {
	r := newRecords()
	rule := func(id string, o model.OfnetPolicyRule) {
		o.RuleId = id
		r.rules[id] = model.CfgPolicyRule{ID: id, OfnetPolicyRule: o}
	}
	rule("t:g:t:p:t:p:a:inRx", model.OfnetPolicyRule{Priority: 10, DstEndpointGroup: 5, SrcIpAddr: "10.1.1.1-10", IpProtocol: 6, DstPort: 80, Action: "allow"})
	rule("t:g:t:p:t:p:b:inRx", model.OfnetPolicyRule{Priority: 1, DstEndpointGroup: 5, IpProtocol: 6, TcpFlags: "syn,!ack", Action: "deny"})
	rule("t:g:t:p:t:p:c:inRx", model.OfnetPolicyRule{Priority: 0, DstEndpointGroup: 5, Action: "deny"})                            // priority out of range
	rule("t:g:t:p:t:p:d:sideways", model.OfnetPolicyRule{Priority: 3, DstEndpointGroup: 5, Action: "allow"})                       // unknown direction
	rule("t:g:t:p:t:p:e:outTx", model.OfnetPolicyRule{Priority: 3, SrcEndpointGroup: 5, Action: "permit"})                         // bad action
	rule("t:g:t:p:t:p:f:outTx", model.OfnetPolicyRule{Priority: 3, SrcEndpointGroup: 5, DstIpAddr: "10.2.0.0/33", Action: "deny"}) // bad prefix
	// A record whose body has no id is named by its key.
	r.rules["t:g:t:p:t:p:g:outTx"] = model.CfgPolicyRule{OfnetPolicyRule: model.OfnetPolicyRule{Priority: 50, SrcEndpointGroup: 5, IpProtocol: 17, DstPort: 53, Action: "allow"}}

	s, bad := compute(hostView{host: "h1", uplinkMTU: 1500}, r)
	if len(s.Policies) != 1 || s.Policies[0].EPGID != 5 {
		t.Fatalf("policies = %+v", s.Policies)
	}
	var got []string
	for _, pr := range s.Policies[0].Rules {
		got = append(got, fmt.Sprintf("%s %d %s %v", pr.ID[strings.LastIndex(pr.ID[:strings.LastIndex(pr.ID, ":")], ":")+1:], pr.Priority, pr.Action, pr.Remote))
	}
	want := []string{
		"g:outTx 50 allow invalid Prefix",
		"a:inRx 10 allow 10.1.1.1/32", "a:inRx 10 allow 10.1.1.2/31", "a:inRx 10 allow 10.1.1.4/30", "a:inRx 10 allow 10.1.1.8/31", "a:inRx 10 allow 10.1.1.10/32",
		"b:inRx 1 deny invalid Prefix",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("compiled rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, k := range []string{"c:inRx", "d:sideways", "e:outTx", "f:outTx"} {
		key := "policy-rule/t:g:t:p:t:p:" + k
		if bad[key] == nil {
			t.Errorf("%s not reported; errors: %v", key, bad)
		}
	}
	if len(bad) != 4 {
		t.Errorf("want 4 errors, got %v", bad)
	}
	if e := bad["policy-rule/t:g:t:p:t:p:c:inRx"]; e != nil && !strings.Contains(e.Error(), "Priority") {
		t.Errorf("priority error should name the field: %v", e)
	}
}

func TestPlanOrder(t *testing.T) {
	n := dataplane.Network{ID: "n"}
	cur := dataplane.IndexOf(dataplane.State{Networks: []dataplane.Network{n}, Endpoints: []dataplane.Endpoint{{ID: "e", NetworkID: "n"}}})
	want := dataplane.IndexOf(dataplane.State{Networks: []dataplane.Network{{ID: "m"}}, Endpoints: []dataplane.Endpoint{{ID: "f", NetworkID: "m"}}})
	ops := plan(&nopDriver{}, cur, want, scope{all: true})
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

// TestComputeDurableVTEPs: a host whose registration is gone (agent down) and which this
// agent never saw registered (this agent restarted meanwhile) stays a peer, and its
// endpoints keep their VTEP, from its durable host-vtep record, for as long as it owns
// endpoints.
func TestComputeDurableVTEPs(t *testing.T) {
	r := newRecords()
	r.nets["n1.default"] = model.CfgNetworkState{ID: "n1.default", PktTagType: "vxlan", ExtPktTag: 7, SubnetIP: "10.1.1.0", SubnetLen: 24}
	r.eps["n1.default-b"] = model.CfgEndpointState{ID: "n1.default-b", NetID: "n1.default", IPAddress: "10.1.1.3", HomingHost: "h2"}
	r.hostVTEPs["h1"] = netip.MustParseAddr("192.168.1.1")
	r.hostVTEPs["h2"] = netip.MustParseAddr("192.168.1.2")
	r.hostVTEPs["h4"] = netip.MustParseAddr("192.168.1.4") // no endpoints: not a peer
	h := hostView{host: "h1", vtep: netip.MustParseAddr("192.168.1.1"), uplinkMTU: 1500}
	s, bad := compute(h, r)
	if len(bad) != 0 {
		t.Fatalf("bad = %v", bad)
	}
	if len(s.Peers) != 1 || s.Peers[0] != (dataplane.Peer{Host: "h2", VTEP: netip.MustParseAddr("192.168.1.2")}) {
		t.Fatalf("peers = %+v", s.Peers)
	}
	if len(s.RemoteEndpoints) != 1 || s.RemoteEndpoints[0].VTEP.String() != "192.168.1.2" {
		t.Fatalf("remote endpoints = %+v", s.RemoteEndpoints)
	}
	// A live registration naming h2 at another address does not move h2: any host's agent
	// may write a registration's value (etcd RBAC binds keys, not values: a compromised h3
	// would draw h2's traffic to itself), while only h2's writes its durable record.
	r.vteps["k2"] = vxlan.Registration{HostAddr: "192.168.1.0", Hostname: "h2"}
	s, _ = compute(h, r)
	if len(s.Peers) != 1 || s.Peers[0].VTEP.String() != "192.168.1.2" || s.RemoteEndpoints[0].VTEP.String() != "192.168.1.2" {
		t.Fatalf("with a registration naming h2 elsewhere: peers %+v remotes %+v", s.Peers, s.RemoteEndpoints)
	}
	// A host without a durable record (an earlier build) is found by its registration.
	delete(r.hostVTEPs, "h2")
	s, _ = compute(h, r)
	if len(s.Peers) != 1 || s.Peers[0].VTEP.String() != "192.168.1.0" || s.RemoteEndpoints[0].VTEP.String() != "192.168.1.0" {
		t.Fatalf("registration only: peers %+v remotes %+v", s.Peers, s.RemoteEndpoints)
	}
	r.hostVTEPs["h2"] = netip.MustParseAddr("192.168.1.2")
	// The host's last endpoint goes: so does the peer.
	delete(r.vteps, "k2")
	delete(r.eps, "n1.default-b")
	if s, _ = compute(h, r); len(s.Peers) != 0 {
		t.Fatalf("peer without endpoints or registration kept: %+v", s.Peers)
	}
}

// TestComputeValidates: objects the driver would refuse are left out and reported one by
// one instead of reaching (and failing) a whole Sync.
func TestComputeValidates(t *testing.T) {
	r := newRecords()
	r.nets["n1.default"] = model.CfgNetworkState{ID: "n1.default", PktTagType: "vxlan", ExtPktTag: 7, SubnetIP: "10.1.1.0", SubnetLen: 24}
	r.nets["v1.default"] = model.CfgNetworkState{ID: "v1.default", PktTagType: "vlan", PktTag: 100, SubnetIP: "20.1.1.0", SubnetLen: 24}
	r.eps["n1.default-bad"] = model.CfgEndpointState{ID: "n1.default-bad", NetID: "n1.default", IPAddress: "10.1.1.3", HomingHost: "h2", VtepIP: "0.0.0.0"}
	r.eps["n1.default-ok"] = model.CfgEndpointState{ID: "n1.default-ok", NetID: "n1.default", IPAddress: "10.1.1.4", HomingHost: "h2", VtepIP: "192.168.1.2"}
	r.eps["v1.default-novtep"] = model.CfgEndpointState{ID: "v1.default-novtep", NetID: "v1.default", IPAddress: "20.1.1.4", HomingHost: "h3"}
	r.eps["n1.default-loc"] = model.CfgEndpointState{ID: "n1.default-loc", NetID: "n1.default", IPAddress: "10.1.1.5", HomingHost: "h1"}
	r.local["n1.default-loc"] = LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: "n1.default-loc", IntfName: "much-too-long-ifname", PortName: HostIfName("n1.default-loc")}}
	r.undecodable["endpoint-group/g1"] = fmt.Errorf("does not decode")
	s, bad := compute(hostView{host: "h1", uplinkMTU: 1500, vlanIf: "eth1"}, r)
	if err := bad["remote-endpoint/n1.default-bad"]; err == nil || !strings.Contains(err.Error(), "vtep") {
		t.Errorf("bad remote not reported: %v", bad)
	}
	if err := bad["endpoint/n1.default-loc"]; err == nil || !strings.Contains(err.Error(), "ifName") {
		t.Errorf("bad local endpoint not reported: %v", bad)
	}
	if bad["endpoint-group/g1"] == nil {
		t.Errorf("undecodable record not reported: %v", bad)
	}
	if len(s.Endpoints) != 0 || len(s.RemoteEndpoints) != 2 || s.RemoteEndpoints[0].ID != "n1.default-ok" || s.RemoteEndpoints[1].ID != "v1.default-novtep" {
		t.Errorf("remote endpoints = %+v, local = %+v", s.RemoteEndpoints, s.Endpoints)
	}
}

// TestComputePodPolicies: NetworkPolicy records become PodPolicies with the endpoint's own
// address and network; a record that cannot be used fails the pod closed (isolated both
// ways, no rules) and is reported; records of unknown endpoints are ignored.
func TestComputePodPolicies(t *testing.T) {
	r := newRecords()
	r.nets["n1.default"] = model.CfgNetworkState{ID: "n1.default", PktTagType: "vxlan", PktTag: 1, ExtPktTag: 7, SubnetIP: "10.1.1.0", SubnetLen: 24, Gateway: "10.1.1.1"}
	r.eps["n1.default-a"] = model.CfgEndpointState{ID: "n1.default-a", NetID: "n1.default", IPAddress: "10.1.1.2", HomingHost: "h2"}
	r.eps["n1.default-b"] = model.CfgEndpointState{ID: "n1.default-b", NetID: "n1.default", IPAddress: "10.1.1.3", HomingHost: "h2"}
	r.podPols["n1.default-a"] = model.K8sPodPolicy{ID: "n1.default-a", Pod: "ns/a", IPAddress: "10.9.9.9", IngressIsolated: true,
		Ingress: []model.K8sPodRule{{Remote: "10.1.1.0/24", Proto: 6, PortMin: 80, PortMax: 81}}}
	r.podPols["n1.default-b"] = model.K8sPodPolicy{ID: "n1.default-b", Pod: "ns/b", EgressIsolated: true,
		Egress: []model.K8sPodRule{{Remote: "not-a-cidr"}}}
	r.podPols["n1.default-gone"] = model.K8sPodPolicy{ID: "n1.default-gone", Pod: "ns/gone", IngressIsolated: true}
	s, bad := compute(hostView{host: "h1", vtep: netip.MustParseAddr("192.168.1.1"), uplinkMTU: 1500}, r)
	if len(s.PodPolicies) != 2 {
		t.Fatalf("pod policies = %+v", s.PodPolicies)
	}
	a, b := s.PodPolicies[0], s.PodPolicies[1]
	want := dataplane.PodPolicy{ID: "n1.default-a", NetworkID: "n1.default", IP: netip.MustParseAddr("10.1.1.2"), IngressIsolated: true,
		Ingress: []dataplane.PodRule{{Remote: netip.MustParsePrefix("10.1.1.0/24"), Proto: 6, PortMin: 80, PortMax: 81}}, Egress: []dataplane.PodRule{}}
	if a.ID != want.ID || a.IP != want.IP || !a.IngressIsolated || a.EgressIsolated || len(a.Ingress) != 1 || a.Ingress[0] != want.Ingress[0] {
		t.Fatalf("pod policy a = %+v (the endpoint's address, not the record's, must be used)", a)
	}
	if !b.IngressIsolated || !b.EgressIsolated || len(b.Ingress)+len(b.Egress) != 0 || b.Validate() != nil {
		t.Fatalf("bad record: %+v, want isolated both ways with no rules", b)
	}
	if err := bad["pod-policy/n1.default-b"]; err == nil || !strings.Contains(err.Error(), "not-a-cidr") {
		t.Fatalf("bad record not reported: %v", bad)
	}
}

// TestUndecodablePodPolicyFailsClosed: a NetworkPolicy record the agent cannot read
// isolates its pod both ways with no rules (it never opens it) and is reported.
func TestUndecodablePodPolicyFailsClosed(t *testing.T) {
	a := &Agent{rec: newRecords(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.rec.nets["n1.default"] = model.CfgNetworkState{ID: "n1.default", PktTagType: "vxlan", PktTag: 1, ExtPktTag: 7, SubnetIP: "10.1.1.0", SubnetLen: 24}
	a.rec.eps["n1.default-a"] = model.CfgEndpointState{ID: "n1.default-a", NetID: "n1.default", IPAddress: "10.1.1.2", HomingHost: "h2"}
	a.put(model.K8sPodPolicyPrefix, model.K8sPodPolicyPrefix+"n1.default-a", []byte("{not json"))
	s, bad := compute(hostView{host: "h1", uplinkMTU: 1500}, a.rec)
	if len(s.PodPolicies) != 1 || !s.PodPolicies[0].IngressIsolated || !s.PodPolicies[0].EgressIsolated ||
		len(s.PodPolicies[0].Ingress)+len(s.PodPolicies[0].Egress) != 0 {
		t.Fatalf("pod policies %+v, want one isolated both ways with no rules", s.PodPolicies)
	}
	if bad["pod-policy/n1.default-a"] == nil {
		t.Fatalf("undecodable record not reported: %v", bad)
	}
}
