package agent

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

func TestBGPSession(t *testing.T) {
	r := newRecords()
	if _, has, err := bgpSession(r, "h1"); has || err != nil {
		t.Fatalf("no record: has %v err %v", has, err)
	}
	good := model.CfgBgpState{ID: "h1", Hostname: "h1", RouterIP: "172.30.1.2/24", As: "65001", NeighborAs: "65000", Neighbor: "172.30.1.1"}
	r.bgp["h1"] = good
	c, has, err := bgpSession(r, "h1")
	if !has || err != nil || c.ASN != 65001 || c.NeighborAS != 65000 || c.Neighbor != netip.MustParseAddr("172.30.1.1") || c.RouterIP != netip.MustParsePrefix("172.30.1.2/24") {
		t.Fatalf("good record: %+v %v %v", c, has, err)
	}
	if _, has, _ := bgpSession(r, "h2"); has {
		t.Error("another host's record was taken")
	}
	for name, mut := range map[string]func(*model.CfgBgpState){
		"router-ip":         func(s *model.CfgBgpState) { s.RouterIP = "172.30.1.2" },
		"as":                func(s *model.CfgBgpState) { s.As = "x" },
		"as too big":        func(s *model.CfgBgpState) { s.As = "4294967296" },
		"neighbor-as":       func(s *model.CfgBgpState) { s.NeighborAs = "" },
		"neighbor":          func(s *model.CfgBgpState) { s.Neighbor = "nope" },
		"neighbor off-link": func(s *model.CfgBgpState) { s.Neighbor = "10.0.0.1" },
		"neighbor itself":   func(s *model.CfgBgpState) { s.Neighbor = "172.30.1.2" },
		"as 0":              func(s *model.CfgBgpState) { s.As = "0" },
	} {
		st := good
		mut(&st)
		r.bgp["h1"] = st
		if _, has, err := bgpSession(r, "h1"); !has || err == nil || !strings.Contains(err.Error(), "bgp h1") {
			t.Errorf("%s: has %v err %v", name, has, err)
		}
	}
}

func TestNativePrefixesAndUsableRoutes(t *testing.T) {
	s := dataplane.State{
		Networks: []dataplane.Network{{ID: "v.t", Encap: dataplane.EncapVLAN}, {ID: "x.t", Encap: dataplane.EncapVXLAN}},
		Endpoints: []dataplane.Endpoint{
			{ID: "2", NetworkID: "v.t", IP: netip.MustParseAddr("10.1.0.3")},
			{ID: "1", NetworkID: "v.t", IP: netip.MustParseAddr("10.1.0.2")},
			{ID: "3", NetworkID: "x.t", IP: netip.MustParseAddr("10.2.0.2")}, // overlay: never advertised
		},
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.2/32"), netip.MustParsePrefix("10.1.0.3/32")}
	if got := nativePrefixes(s, nil, nil); !slices.Equal(got, want) {
		t.Errorf("advertised %v, want %v", got, want)
	}
	if got := nativePrefixes(s, []netip.Prefix{netip.MustParsePrefix("10.1.0.3/32")}, nil); !slices.Equal(got, want[1:]) {
		t.Errorf("advertised inside --bgp-prefixes %v, want %v", got, want[1:])
	}
	if got := nativePrefixes(s, nil, map[netip.Addr]bool{netip.MustParseAddr("10.1.0.2"): true}); !slices.Equal(got, want[1:]) {
		t.Errorf("advertised with a shared address %v, want %v", got, want[1:])
	}
	r := newRecords()
	r.nets["v.a"] = model.CfgNetworkState{ID: "v.a", Tenant: "a", PktTagType: "vlan"}
	r.nets["v.b"] = model.CfgNetworkState{ID: "v.b", Tenant: "b", PktTagType: "vlan"}
	r.nets["x.c"] = model.CfgNetworkState{ID: "x.c", Tenant: "c", PktTagType: "vxlan"}
	r.eps["1"] = model.CfgEndpointState{ID: "1", NetID: "v.a", IPAddress: "10.1.0.2"}
	r.eps["2"] = model.CfgEndpointState{ID: "2", NetID: "v.b", IPAddress: "10.1.0.2"}
	r.eps["3"] = model.CfgEndpointState{ID: "3", NetID: "v.a", IPAddress: "10.1.0.3"}
	r.eps["4"] = model.CfgEndpointState{ID: "4", NetID: "x.c", IPAddress: "10.1.0.3"} // overlay: not in the fabric
	if got := sharedNativeAddrs(r); len(got) != 1 || !got[netip.MustParseAddr("10.1.0.2")] {
		t.Errorf("shared %v, want only 10.1.0.2", got)
	}
	rip := netip.MustParsePrefix("172.30.1.2/24")
	rt := func(p, nh string) dataplane.Route {
		return dataplane.Route{Prefix: netip.MustParsePrefix(p), NextHop: netip.MustParseAddr(nh)}
	}
	in := []dataplane.Route{
		rt("10.1.0.9/32", "172.30.1.1"),
		rt("0.0.0.0/0", "172.30.1.1"),
		rt("10.1.0.8/32", "10.9.9.9"),   // next hop off the router-ip's subnet
		rt("10.1.0.7/32", "172.30.1.2"), // next hop = ourselves
		{Prefix: netip.MustParsePrefix("10.1.0.0/16"), NextHop: netip.MustParseAddr("172.30.1.1")},
	}
	got := usableRoutes(in, rip)
	wantR := []dataplane.Route{rt("0.0.0.0/0", "172.30.1.1"), rt("10.1.0.0/16", "172.30.1.1"), rt("10.1.0.9/32", "172.30.1.1")}
	if !slices.Equal(got, wantR) {
		t.Errorf("usable %v, want %v", got, wantR)
	}
}
