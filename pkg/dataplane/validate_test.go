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
