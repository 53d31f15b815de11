package dataplane

import (
	"net/netip"
	"strings"
	"testing"
)

func TestRemoteEndpointValidate(t *testing.T) {
	ip := netip.MustParseAddr("10.1.0.7")
	good := RemoteEndpoint{ID: "n.t-c", NetworkID: "n.t", IP: ip, MAC: ContivMAC(ip), Host: "h2",
		VTEP: netip.MustParseAddr("192.168.1.2")}
	if err := good.Validate(EncapVXLAN); err != nil {
		t.Fatalf("valid vxlan remote: %v", err)
	}
	noVTEP := good
	noVTEP.VTEP = netip.Addr{}
	if err := noVTEP.Validate(EncapVLAN); err != nil {
		t.Fatalf("vlan remote without vtep: %v", err)
	}
	for _, c := range []struct {
		name  string
		mod   func(*RemoteEndpoint)
		encap Encap
		want  string
	}{
		{"no id", func(r *RemoteEndpoint) { r.ID = "" }, EncapVXLAN, "id is empty"},
		{"no network", func(r *RemoteEndpoint) { r.NetworkID = "" }, EncapVXLAN, "networkID"},
		{"ipv6", func(r *RemoteEndpoint) { r.IP = netip.MustParseAddr("fd00::1") }, EncapVXLAN, "ip"},
		{"short mac", func(r *RemoteEndpoint) { r.MAC = r.MAC[:4] }, EncapVXLAN, "mac"},
		{"vxlan without vtep", func(r *RemoteEndpoint) { r.VTEP = netip.Addr{} }, EncapVXLAN, "vtep is missing"},
		{"vtep 0.0.0.0", func(r *RemoteEndpoint) { r.VTEP = netip.IPv4Unspecified() }, EncapVXLAN, "vtep"},
		{"ipv6 vtep on vlan", func(r *RemoteEndpoint) { r.VTEP = netip.MustParseAddr("fd00::2") }, EncapVLAN, "vtep"},
	} {
		r := good
		r.MAC = append(r.MAC[:0:0], good.MAC...)
		c.mod(&r)
		err := r.Validate(c.encap)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestNativeRoutingValidate(t *testing.T) {
	rip := netip.MustParsePrefix("172.30.1.2/24")
	nh := netip.MustParseAddr("172.30.1.1")
	ok := []NativeRouting{
		{},
		{RouterIP: rip},
		{RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32"), NextHop: nh}, {Prefix: netip.MustParsePrefix("0.0.0.0/0"), NextHop: nh}}},
	}
	for _, n := range ok {
		if err := n.Validate(); err != nil {
			t.Errorf("%+v: %v", n, err)
		}
	}
	bad := map[string]NativeRouting{
		"routes without router-ip": {Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32"), NextHop: nh}}},
		"ipv6 router-ip":           {RouterIP: netip.MustParsePrefix("fd00::2/64")},
		"/32 router-ip":            {RouterIP: netip.MustParsePrefix("172.30.1.2/32")},
		"network address":          {RouterIP: netip.MustParsePrefix("172.30.1.0/24")},
		"unmasked prefix":          {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/24"), NextHop: nh}}},
		"ipv6 prefix":              {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("fd00::/64"), NextHop: nh}}},
		"off-link next hop":        {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32"), NextHop: netip.MustParseAddr("10.0.0.1")}}},
		"next hop is router-ip":    {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32"), NextHop: rip.Addr()}}},
		"no next hop":              {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32")}}},
		"broadcast next hop":       {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32"), NextHop: netip.MustParseAddr("172.30.1.255")}}},
		"network next hop":         {RouterIP: rip, Routes: []Route{{Prefix: netip.MustParsePrefix("10.1.0.9/32"), NextHop: netip.MustParseAddr("172.30.1.0")}}},
	}
	for name, n := range bad {
		if err := n.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestPolicySetValidate: the checks both backends apply to a rule set, each naming the
// rule and field.
func TestPolicySetValidate(t *testing.T) {
	good := PolicySet{EPGID: 3, Rules: []PolicyRule{
		{ID: "r1", Priority: 1, Action: ActionDeny, Proto: 6},
		{ID: "r2", Priority: 100, Action: ActionAllow, Ingress: true, Remote: netip.MustParsePrefix("10.0.0.0/8")},
	}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid set: %v", err)
	}
	for _, c := range []struct {
		name string
		mod  func(*PolicySet)
		want string
	}{
		{"no group", func(p *PolicySet) { p.EPGID = 0 }, "epgID is 0"},
		{"priority 0", func(p *PolicySet) { p.Rules[0].Priority = 0 }, "rule r1: priority 0 out of 1-100"},
		{"priority 101", func(p *PolicySet) { p.Rules[1].Priority = 101 }, "rule r2: priority 101"},
		{"empty action", func(p *PolicySet) { p.Rules[0].Action = "" }, `rule r1: action ""`},
		{"ipv6 remote", func(p *PolicySet) { p.Rules[1].Remote = netip.MustParsePrefix("fd00::/8") }, "rule r2: remote fd00::/8 is not IPv4"},
	} {
		p := good
		p.Rules = append([]PolicyRule(nil), good.Rules...)
		c.mod(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
}

// TestServiceValidate: the checks both backends apply to a service.
func TestServiceValidate(t *testing.T) {
	good := Service{ID: "web:t1", VIP: netip.MustParseAddr("10.96.0.1"),
		Ports:    []ServicePort{{Proto: 6, Port: 80, TargetPort: 8080, NodePort: 30080}, {Proto: 17, Port: 53, NodePort: 30080}},
		Backends: []netip.Addr{netip.MustParseAddr("10.1.0.2")}, Draining: []netip.Addr{netip.MustParseAddr("10.1.0.3")}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid service: %v", err)
	}
	for _, c := range []struct {
		name string
		mod  func(*Service)
		want string
	}{
		{"no id", func(s *Service) { s.ID = "" }, "id must be <name>:<tenant>"},
		{"no tenant", func(s *Service) { s.ID = "web:" }, "id must be <name>:<tenant>"},
		{"no name", func(s *Service) { s.ID = ":t1" }, "id must be <name>:<tenant>"},
		{"ipv6 vip", func(s *Service) { s.VIP = netip.MustParseAddr("fd00::1") }, "vip fd00::1 is not IPv4"},
		{"no vip", func(s *Service) { s.VIP = netip.Addr{} }, "is not IPv4"},
		{"no ports", func(s *Service) { s.Ports = nil }, "no ports"},
		{"sctp", func(s *Service) { s.Ports[0].Proto = 132 }, "proto 132 must be 6 (tcp) or 17 (udp)"},
		{"port 0", func(s *Service) { s.Ports[1].Port = 0 }, "port is 0"},
		{"node port twice", func(s *Service) { s.Ports[1].Proto = 6; s.Ports[1].Port = 81 }, "node port 30080/6 listed twice"},
		{"ipv6 backend", func(s *Service) { s.Backends = []netip.Addr{netip.MustParseAddr("fd00::2")} }, "backend fd00::2"},
		{"ipv6 draining", func(s *Service) { s.Draining = []netip.Addr{netip.MustParseAddr("fd00::3")} }, "backend fd00::3"},
	} {
		s := good
		s.Ports = append([]ServicePort(nil), good.Ports...)
		c.mod(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
}
