package ebpf

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestNativeRouting runs routing mode's BGP path (native.h) on crafted packets: out of a
// VLAN network by learned routes (untagged, routed), never tagged or tunnelled when no
// route covers the destination, NAT-less egress by a learned default route, and the
// uplink's untagged packets routed in to local endpoints, hostile ones refused.
func TestNativeRouting(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbFromWire)
	const vnet, notNativeIf = 1<<24 | 10, 77
	vsrc, vloc, vrem := netip.MustParseAddr("10.2.0.2"), netip.MustParseAddr("10.2.0.3"), netip.MustParseAddr("10.2.0.9")
	vrem2 := netip.MustParseAddr("10.2.0.10")
	outside := netip.MustParseAddr("198.51.100.7")
	nh := netip.MustParseAddr("172.30.1.1")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	put := func(ip netip.Addr, v contivbpfCbEndpoint) {
		copy(v.Mac[:], dataplane.ContivMAC(ip))
		must(objs.CbEndpoints.Put(&contivbpfCbEpKey{Net: vnet, Ip: ip4(ip)}, &v))
		must(objs.CbRoutes.Put(&contivbpfCbRouteKey{Vrf: testZone, Ip: ip4(ip)}, &contivbpfCbRoute{Net: vnet}))
	}
	put(vsrc, contivbpfCbEndpoint{Ifindex: loIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL)})
	put(vloc, contivbpfCbEndpoint{Ifindex: peerIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL)})
	put(vrem, contivbpfCbEndpoint{Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)})
	put(vrem2, contivbpfCbEndpoint{Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)})
	for ifindex, ip := range map[uint32]netip.Addr{loIfindex: vsrc, peerIfindex: vloc} {
		ifc := contivbpfCbIface{Net: vnet, Ip: ip4(ip), Vrf: testZone}
		copy(ifc.Mac[:], dataplane.ContivMAC(ip))
		must(objs.ifaceTable().put(ifindex, &ifc, nil))
		must(objs.CbHostRoutes.Put(ip4(ip), &contivbpfCbHostRoute{Ifindex: ifindex}))
	}
	// An endpoint of the VXLAN network, homed here: never routed in from the uplink.
	ifc := contivbpfCbIface{Net: testNet, Ip: ip4(localIP), Vrf: testZone}
	must(objs.ifaceTable().put(uint32(notNativeIf), &ifc, nil))
	must(objs.CbHostRoutes.Put(ip4(localIP), &contivbpfCbHostRoute{Ifindex: notNativeIf}))
	var cfg contivbpfCbConfig
	must(objs.CbCfg.Lookup(uint32(0), &cfg))
	cfg.UplinkIfindex = 5
	must(objs.CbCfg.Put(uint32(0), &cfg))
	route := func(p string, on bool) {
		t.Helper()
		pfx := netip.MustParsePrefix(p)
		k := contivbpfCbBgpKey{Prefixlen: uint32(pfx.Bits()), Addr: ip4(pfx.Addr())}
		if on {
			must(objs.CbBgpRoutes.Put(&k, &contivbpfCbBgpRoute{Nexthop: ip4(nh), Ifindex: 5}))
		} else {
			must(objs.CbBgpRoutes.Delete(&k))
		}
	}
	route("10.2.0.9/32", true)
	bgp := uint32(contivbpfCbFeaturesCB_FEAT_ROUTING | contivbpfCbFeaturesCB_FEAT_BGP)
	setFeatures(t, objs, bgp)
	fc, wire := objs.CbFromContainer, objs.CbFromWire

	routedOut := func(t *testing.T, r runResult) {
		t.Helper()
		r.expect(t, tcActRedirect, FwdNative)
		if et := binary.BigEndian.Uint16(r.out[12:]); et != 0x0800 {
			t.Errorf("ethertype %#x: the packet must leave untagged", et)
		}
		if r.out[14+8] != 63 {
			t.Errorf("ttl %d, want 63", r.out[14+8])
		}
		checkSums(t, r.out)
	}
	t.Run("out/learned-host-route", func(t *testing.T) {
		routedOut(t, run(t, objs, fc, l4Frame(6, vsrc, vrem, 1000, 80, tcpSYN, 0), nil))
	})
	t.Run("out/no-route-dropped-not-tagged", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, vsrc, vrem2, 1000, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropNoRoute)
	})
	t.Run("out/covering-prefix", func(t *testing.T) {
		route("10.2.0.0/24", true)
		defer route("10.2.0.0/24", false)
		routedOut(t, run(t, objs, fc, l4Frame(17, vsrc, vrem2, 1000, 53, 0, 0), nil))
	})
	t.Run("out/local-stays-local", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, vsrc, vloc, 1000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("out/bgp-off-tags-again", func(t *testing.T) {
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ROUTING))
		defer setFeatures(t, objs, bgp)
		run(t, objs, fc, l4Frame(6, vsrc, vrem, 1000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdUplink)
	})
	t.Run("outside/nat-off-by-default-route", func(t *testing.T) {
		var n contivbpfCbNetwork
		must(objs.CbNetworks.Lookup(uint32(vnet), &n))
		if n.Flags&uint8(contivbpfCbNetFlagsCB_NET_SNAT) != 0 {
			t.Fatal("fixture network has NAT on")
		}
		run(t, objs, fc, l4Frame(6, vsrc, outside, 1000, 443, tcpSYN, 0), nil).expect(t, tcActShot, DropNoRoute)
		route("0.0.0.0/0", true)
		defer route("0.0.0.0/0", false)
		routedOut(t, run(t, objs, fc, l4Frame(6, vsrc, outside, 1000, 443, tcpSYN, 0), nil))
		run(t, objs, fc, l4Frame(17, vsrc, netip.MustParseAddr("255.255.255.255"), 1000, 67, 0, 0), nil).expect(t, tcActShot, DropEgressInvalidDst)
	})

	routedIn := func(t *testing.T, r runResult, dst netip.Addr) {
		t.Helper()
		r.expect(t, tcActRedirect, FwdLocal)
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(dst)) || !bytes.Equal(r.out[6:12], dataplane.RouterMAC) {
			t.Errorf("macs dst %x src %x", r.out[0:6], r.out[6:12])
		}
		if r.out[14+8] != 63 {
			t.Errorf("ttl %d, want 63", r.out[14+8])
		}
		checkSums(t, r.out)
	}
	t.Run("in/remote-endpoint", func(t *testing.T) {
		routedIn(t, run(t, objs, wire, toHost(l4Frame(6, vrem, vloc, 1000, 80, tcpSYN, 0)), nil), vloc)
	})
	t.Run("in/outside-source", func(t *testing.T) {
		routedIn(t, run(t, objs, wire, toHost(l4Frame(6, outside, vloc, 1000, 80, tcpSYN, 0)), nil), vloc)
	})
	t.Run("in/local-source-spoofed", func(t *testing.T) {
		run(t, objs, wire, toHost(l4Frame(6, vsrc, vloc, 1000, 80, tcpSYN, 0)), nil).expect(t, tcActShot, DropRemoteSrc)
	})
	t.Run("in/ttl-1", func(t *testing.T) {
		p := l4Frame(6, vrem, vloc, 1000, 80, tcpSYN, 0)
		p[14+8] = 1
		run(t, objs, wire, toHost(p), nil).expect(t, tcActShot, DropTTLExceeded)
	})
	pass := func(t *testing.T, pkt []byte) {
		t.Helper()
		r := run(t, objs, wire, toHost(pkt), nil)
		if int32(r.ret) != -1 || len(r.diff) != 0 {
			t.Errorf("verdict %d reasons %v, want TCX_NEXT and no counters", int32(r.ret), r.diff)
		}
	}
	t.Run("in/overlay-network-endpoint-not-routed-in", func(t *testing.T) {
		run(t, objs, wire, toHost(l4Frame(6, vrem, localIP, 1000, 80, tcpSYN, 0)), nil).expect(t, tcActShot, DropUplinkToEndpoint)
	})
	t.Run("in/not-for-this-host", func(t *testing.T) {
		// Addressed to another MAC (flooded, or seen in promiscuous mode): PACKET_OTHERHOST.
		f := l4Frame(6, vrem, vloc, 1000, 80, tcpSYN, 0)
		r := run(t, objs, wire, f, nil)
		if int32(r.ret) != -1 || len(r.diff) != 0 {
			t.Errorf("verdict %d reasons %v, want TCX_NEXT and no counters", int32(r.ret), r.diff)
		}
	})
	t.Run("in/host-traffic-passes", func(t *testing.T) {
		pass(t, l4Frame(6, nh, netip.MustParseAddr("172.30.1.2"), 40000, 179, tcpSYN, 0))
		pass(t, arpFrame(1, dataplane.ContivMAC(nh), nh, netip.MustParseAddr("172.30.1.2")))
	})
	t.Run("in/malformed", func(t *testing.T) {
		run(t, objs, wire, toHost(ipFrame(vrem, vloc, ipOpts{ihl: 15, truncate: 30})), nil).expect(t, tcActShot, DropMalformedIP)
	})
	t.Run("in/bgp-off", func(t *testing.T) {
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ROUTING))
		defer setFeatures(t, objs, bgp)
		pass(t, l4Frame(6, vrem, vloc, 1000, 80, tcpSYN, 0))
	})
}

// TestSetNativeRouting drives the BGP side of the driver in a namespace: the router-ip
// (labelled) on the uplink, the learned routes in cb_bgp_routes and the feature bit, all
// or nothing on a bad route, kept across a driver restart, removed when turned off and by
// Teardown; refused in bridge mode and without an uplink.
func TestSetNativeRouting(t *testing.T) {
	testroot.Need(t)
	ctx := context.Background()
	p := conformance.Prefix()
	ns := conformance.NewNetNS(t, p+"-h")
	nsRun(t, ns, "ip", "link", "add", "tor0", "type", "veth", "peer", "name", "tor0p")
	nsRun(t, ns, "ip", "link", "set", "tor0", "up")
	pinBase := filepath.Join("/sys/fs/bpf", p)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	cfg := dataplane.HostConfig{Host: "h", NetNS: ns, VTEP: netip.MustParseAddr("10.254.0.1"), FwdMode: dataplane.FwdRouting, VLANIf: "tor0"}
	opts := func(pins string) Options {
		return Options{PinRoot: filepath.Join(pinBase, pins), VXLANIf: "cbevx0", MapEntries: 1024, CgroupPath: "off"}
	}
	start := func(c dataplane.HostConfig, o Options) *Driver {
		t.Helper()
		d, err := New(ctx, c, o)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := start(cfg, opts("h"))
	defer func() { _ = d.Teardown(ctx) }()
	rip := netip.MustParsePrefix("172.30.1.2/24")
	nh := netip.MustParseAddr("172.30.1.1")
	r1 := dataplane.Route{Prefix: netip.MustParsePrefix("10.66.1.3/32"), NextHop: nh}
	r2 := dataplane.Route{Prefix: netip.MustParsePrefix("0.0.0.0/0"), NextHop: nh}
	addrs := func() string {
		t.Helper()
		out, err := exec.Command("nsenter", "--net="+ns, "ip", "-4", "-o", "addr", "show", "dev", "tor0").CombinedOutput()
		if err != nil {
			t.Fatalf("ip addr: %v: %s", err, out)
		}
		return string(out)
	}
	feat := func() bool {
		var c contivbpfCbConfig
		if err := d.objs.CbCfg.Lookup(uint32(0), &c); err != nil {
			t.Fatal(err)
		}
		return c.Features&uint32(contivbpfCbFeaturesCB_FEAT_BGP) != 0
	}
	routes := func() []dataplane.Route {
		t.Helper()
		rs, err := d.NativeRoutes()
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(rs, func(a, b dataplane.Route) int { return a.Prefix.Bits() - b.Prefix.Bits() })
		return rs
	}
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: rip, Routes: []dataplane.Route{r1, r2}}); err != nil {
		t.Fatal(err)
	}
	if a := addrs(); !strings.Contains(a, "172.30.1.2/24") || !strings.Contains(a, "tor0:cb") {
		t.Errorf("router-ip not on the uplink with its label: %s", a)
	}
	if !feat() || !slices.Equal(routes(), []dataplane.Route{r2, r1}) {
		t.Fatalf("feature %v routes %v", feat(), routes())
	}
	l, err := d.Listing(dataplane.ListQuery{Kind: "routes"})
	if err != nil || len(l.Rows) != 2 || l.Rows[1][0] != "10.66.1.3/32" || l.Rows[1][2] != "tor0" {
		t.Errorf("listing %+v %v", l, err)
	}
	bad := dataplane.NativeRouting{RouterIP: rip, Routes: []dataplane.Route{r1, {Prefix: netip.MustParsePrefix("10.9.0.0/16"), NextHop: netip.MustParseAddr("10.0.0.1")}}}
	if err := d.SetNativeRouting(ctx, bad); err == nil {
		t.Error("an off-link next hop was accepted")
	}
	if !slices.Equal(routes(), []dataplane.Route{r2, r1}) {
		t.Errorf("a refused call changed the routes: %v", routes())
	}
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: rip, Routes: []dataplane.Route{r1}}); err != nil {
		t.Fatal(err)
	}
	// A restarted driver (agent restart) keeps native routing and the routes.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = start(cfg, opts("h"))
	if !feat() || !slices.Equal(routes(), []dataplane.Route{r1}) {
		t.Errorf("after restart: feature %v routes %v", feat(), routes())
	}
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{}); err != nil {
		t.Fatal(err)
	}
	if feat() || len(routes()) != 0 || strings.Contains(addrs(), "172.30.1.2") {
		t.Errorf("off: feature %v routes %v addrs %s", feat(), routes(), addrs())
	}
	// An address the operator put there is used and left alone.
	nsRun(t, ns, "ip", "addr", "add", "172.30.1.2/24", "dev", "tor0")
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: rip}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(addrs(), "172.30.1.2/24") {
		t.Error("the operator's address was removed")
	}
	nsRun(t, ns, "ip", "addr", "del", "172.30.1.2/24", "dev", "tor0")
	// Teardown removes the router-ip it added.
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: rip}); err != nil {
		t.Fatal(err)
	}
	if err := d.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(addrs(), "172.30.1.2") {
		t.Errorf("router-ip left after Teardown: %s", addrs())
	}

	// A router-ip on another network of the host, or on a tenant network, is refused.
	d = start(cfg, opts("h"))
	nsRun(t, ns, "ip", "addr", "add", "192.168.77.1/24", "dev", "tor0p")
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: netip.MustParsePrefix("192.168.77.9/24")}); err == nil || !strings.Contains(err.Error(), "tor0p") {
		t.Errorf("router-ip on the network of another link: %v", err)
	}
	if err := d.UpsertNetwork(ctx, dataplane.Network{ID: "v.t", Encap: dataplane.EncapVLAN, Tag: 200, Subnet: netip.MustParsePrefix("10.66.0.0/16"), MTU: 1500}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: netip.MustParsePrefix("10.66.1.2/24")}); err == nil || !strings.Contains(err.Error(), "v.t") {
		t.Errorf("router-ip on a tenant network: %v", err)
	}
	if strings.Contains(addrs(), "192.168.77.9") || strings.Contains(addrs(), "10.66.1.2") || feat() {
		t.Errorf("a refused router-ip left state: %s feature %v", addrs(), feat())
	}
	if err := d.Teardown(ctx); err != nil {
		t.Fatal(err)
	}

	// Bridge mode and a host without an uplink refuse it.
	for name, c := range map[string]dataplane.HostConfig{"bridge": {FwdMode: dataplane.FwdBridge, VLANIf: "tor0"}, "no-uplink": {FwdMode: dataplane.FwdRouting}} {
		c.Host, c.NetNS, c.VTEP = "h", ns, cfg.VTEP
		d2 := start(c, opts(name))
		if err := d2.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: rip}); err == nil {
			t.Errorf("%s: native routing accepted", name)
		}
		_ = d2.Teardown(ctx)
	}
}

// toHost addresses a frame to the test device's own MAC (the loopback's, all zeros), so
// BPF_PROG_TEST_RUN gives it PACKET_HOST, as the ToR's frames to this host get.
func toHost(f []byte) []byte {
	f = append([]byte{}, f...)
	copy(f[0:6], make([]byte, 6))
	return f
}
