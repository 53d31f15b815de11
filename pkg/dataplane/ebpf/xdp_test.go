package ebpf

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

const (
	xdpDrop   = 1
	xdpPass   = 2
	testVXLAN = 4789
)

// vxlanFrame wraps inner (an Ethernet frame) in Ethernet/IPv4/UDP/VXLAN from outer source
// src to dst's overlay port in VNI vni, the way a peer's vxlan device sends it.
func vxlanFrame(src, dst netip.Addr, vni uint32, inner []byte) []byte {
	vx := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], testVXLAN)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(vx)+len(inner)))
	ip := ipv4Pkt(src, dst, append(append(udp, vx...), inner...), ipOpts{})
	ip[9] = 17
	return append(ethHdr(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), 0x0800), ip...)
}

// The XDP prefilter drops exactly what the tc path drops without state, under the same
// reason, and passes the rest: each inner frame and tunnel (sender, VNI) goes through
// cb_xdp_uplink wrapped as VXLAN and through cb_test_overlay decapsulated (what
// cb_from_overlay runs after the vxlan device). A prefilter drop the tc path would not
// make, a reason that differs, or a spoofed packet the prefilter lets by fails.
func TestXDPOverlayAgreesWithTC(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbXdpUplink)
	peer := netip.MustParseAddr(testVTEP)
	other := netip.MustParseAddr("192.168.0.3") // no peer
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = nport(testVXLAN); c.Vtep = ip4(hostIP) })
	inner := map[string]struct {
		f      []byte
		judged bool // a plain inner IPv4 header: the prefilter judges its source
	}{
		"to-local":            {ipFrame(remoteIP, localIP, ipOpts{}), true},
		"to-remote":           {ipFrame(remoteIP, orphanIP, ipOpts{}), true},
		"src-behind-other":    {ipFrame(orphanIP, localIP, ipOpts{}), true},
		"src-unknown":         {ipFrame(netip.MustParseAddr("10.1.0.77"), localIP, ipOpts{}), true},
		"src-outside":         {ipFrame(netip.MustParseAddr("8.8.8.8"), localIP, ipOpts{}), true},
		"src-local":           {ipFrame(srcIP, localIP, ipOpts{}), true},
		"src-peer-host":       {ipFrame(peer, localIP, ipOpts{}), true},
		"src-other-host":      {ipFrame(other, localIP, ipOpts{}), true},
		"first-fragment":      {asFirstFragment(ipFrame(orphanIP, localIP, ipOpts{})), true},
		"later-fragment":      {ipFrame(orphanIP, localIP, ipOpts{fragOff: 100}), false},
		"options":             {ipFrame(orphanIP, localIP, ipOpts{options: []byte{1, 1, 1, 0}}), false},
		"totlen-too-big":      {ipFrame(orphanIP, localIP, ipOpts{totLen: 1000}), false},
		"totlen-below-header": {ipFrame(orphanIP, localIP, ipOpts{totLen: 12}), false},
		"ihl-3":               {ipFrame(orphanIP, localIP, ipOpts{ihl: 3}), false},
		"short":               {ipFrame(orphanIP, localIP, ipOpts{totLen: 60})[:14+20], false},
		"arp":                 {arpFrame(1, dataplane.ContivMAC(orphanIP), orphanIP, localIP), false},
		"ipv6":                {func() []byte { p := ipFrame(orphanIP, localIP, ipOpts{}); p[12], p[13] = 0x86, 0xdd; return p }(), false},
	}
	prefiltered := map[Reason]bool{DropUnknownPeer: true, DropUnknownNetwork: true, DropOverlaySpoof: true, DropRemoteSrc: true}
	for _, sender := range []netip.Addr{peer, other} {
		for _, vni := range []uint32{testNet, 4242, 0} {
			for name, in := range inner {
				t.Run(fmt.Sprintf("%v/%d/%s", sender, vni, name), func(t *testing.T) {
					tc := run(t, objs, objs.CbTestOverlay, in.f, &skbCtx{CB: [5]uint32{ip4(sender), vni}})
					x := run(t, objs, objs.CbXdpUplink, vxlanFrame(sender, hostIP, vni, in.f), nil)
					var tcWhy Reason
					for r := range tc.diff {
						tcWhy = r
					}
					// What the tc path drops for the tunnel alone (sender, VNI) the
					// prefilter drops whatever the inner frame; for the inner source,
					// only when it judges the inner header.
					want := tc.ret == tcActShot && prefiltered[tcWhy] &&
						(tcWhy == DropUnknownPeer || tcWhy == DropUnknownNetwork || in.judged)
					if want {
						x.expect(t, xdpDrop, tcWhy)
						return
					}
					if x.ret != xdpPass || len(x.diff) != 0 {
						t.Errorf("prefilter verdict %d reasons %v, want pass, uncounted (tc: %d %v)", x.ret, x.diff, tc.ret, tc.diff)
					}
				})
			}
		}
	}
	// The cases the comparison must hold, so that it cannot pass by the fixture alone.
	x := run(t, objs, objs.CbXdpUplink, vxlanFrame(peer, hostIP, testNet, ipFrame(orphanIP, localIP, ipOpts{})), nil)
	x.expect(t, xdpDrop, DropOverlaySpoof)
	run(t, objs, objs.CbXdpUplink, vxlanFrame(other, hostIP, testNet, ipFrame(remoteIP, localIP, ipOpts{})), nil).expect(t, xdpDrop, DropUnknownPeer)
}

// What the prefilter does not judge passes uncounted: any frame cut short, an outer header
// with options, a fragment, to another address than the VTEP, a VLAN tag, a VXLAN header
// with other flags, another UDP port, lengths that do not agree. With encryption on it drops
// every clear overlay packet (drop_clear_overlay), as cb_from_uplink does, and passes
// WireGuard's port.
func TestXDPPrefilterPasses(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbXdpUplink)
	other := netip.MustParseAddr("192.168.0.3")
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = nport(testVXLAN); c.Vtep = ip4(hostIP) })
	spoof := func() []byte { return vxlanFrame(other, hostIP, testNet, ipFrame(orphanIP, localIP, ipOpts{})) }
	passes := func(t *testing.T, f []byte) {
		t.Helper()
		if r := run(t, objs, objs.CbXdpUplink, f, nil); r.ret != xdpPass || len(r.diff) != 0 {
			t.Errorf("verdict %d reasons %v, want pass, uncounted", r.ret, r.diff)
		}
	}
	run(t, objs, objs.CbXdpUplink, spoof(), nil).expect(t, xdpDrop, DropUnknownPeer)
	t.Run("truncated", func(t *testing.T) {
		f := spoof()
		for n := 14; n < len(f); n++ { // (a test run takes no frame shorter than its MAC header)
			passes(t, f[:n])
		}
	})
	t.Run("outer-options", func(t *testing.T) {
		f := spoof()
		o := append(append(append([]byte{}, f[:34]...), 1, 1, 1, 0), f[34:]...)
		o[14] = 0x46
		binary.BigEndian.PutUint16(o[16:], binary.BigEndian.Uint16(f[16:])+4)
		passes(t, o)
	})
	t.Run("outer-fragment", func(t *testing.T) { passes(t, asFirstFragment(spoof())) })
	t.Run("not-to-vtep", func(t *testing.T) {
		passes(t, vxlanFrame(other, netip.MustParseAddr("192.168.0.9"), testNet, ipFrame(orphanIP, localIP, ipOpts{})))
	})
	t.Run("vlan-tagged", func(t *testing.T) {
		f := spoof()
		passes(t, append(append(append([]byte{}, f[:12]...), 0x81, 0, 0, 10), f[12:]...))
	})
	// The VXLAN header at 42: flags (other than exactly 0x08), reserved bytes set.
	for _, c := range [][2]int{{42, 0x0c}, {42, 0}, {43, 1}, {45, 1}, {49, 1}} {
		t.Run(fmt.Sprintf("vxlan-byte-%d-%#x", c[0], c[1]), func(t *testing.T) {
			f := spoof()
			f[c[0]] = byte(c[1])
			passes(t, f)
		})
	}
	t.Run("other-port", func(t *testing.T) {
		f := spoof()
		binary.BigEndian.PutUint16(f[36:], 4790)
		passes(t, f)
	})
	t.Run("udp-length-past-ip", func(t *testing.T) {
		f := spoof()
		binary.BigEndian.PutUint16(f[38:], binary.BigEndian.Uint16(f[38:])+1)
		passes(t, f)
	})
	t.Run("ip-length-past-frame", func(t *testing.T) {
		f := spoof()
		binary.BigEndian.PutUint16(f[16:], binary.BigEndian.Uint16(f[16:])+1)
		passes(t, f)
	})
	// An outer total length below its own header plus the UDP length: the stack drops
	// the datagram (ip_rcv), and a prefilter that subtracted the header from it wrapped
	// around and took the frame for a whole one.
	for _, tot := range []uint16{0, 19, 20, 49} {
		t.Run(fmt.Sprintf("ip-length-%d-below-udp", tot), func(t *testing.T) {
			f := spoof()
			binary.BigEndian.PutUint16(f[16:], tot)
			passes(t, f)
		})
	}
	t.Run("udp-length-without-inner", func(t *testing.T) {
		f := spoof()
		binary.BigEndian.PutUint16(f[38:], 8+8+13)
		passes(t, f)
	})
	t.Run("no-config", func(t *testing.T) {
		editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = 0 })
		defer editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = nport(testVXLAN) })
		passes(t, spoof())
	})
	t.Run("encrypted", func(t *testing.T) {
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ENCRYPT))
		defer setFeatures(t, objs, 0)
		peer := netip.MustParseAddr(testVTEP)
		// Every clear overlay packet, a peer's own and to any address, with options, as
		// a first fragment or over IPv6: what cb_from_uplink drops.
		for name, f := range map[string][]byte{
			"peer":           vxlanFrame(peer, hostIP, testNet, ipFrame(remoteIP, localIP, ipOpts{})),
			"other-address":  vxlanFrame(peer, netip.MustParseAddr("255.255.255.255"), testNet, ipFrame(remoteIP, localIP, ipOpts{})),
			"options":        l4FrameOpts(17, peer, hostIP, 40000, testVXLAN, 0, ipOpts{options: []byte{1, 1, 1, 0}}),
			"first-fragment": asFirstFragment(l4Frame(17, peer, hostIP, 40000, testVXLAN, 0, 0)),
			"ipv6":           udp6Frame(netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1"), testVXLAN),
		} {
			t.Run(name, func(t *testing.T) {
				run(t, objs, objs.CbXdpUplink, f, nil).expect(t, xdpDrop, DropClearOverlay)
			})
		}
		for name, f := range map[string][]byte{
			"wireguard":      l4Frame(17, peer, hostIP, 51820, 51820, 0, 0),
			"from-the-port":  l4Frame(17, peer, hostIP, testVXLAN, 40000, 0, 0),
			"tcp":            l4Frame(6, peer, hostIP, 40000, testVXLAN, 0x02, 0),
			"later-fragment": l4Frame(17, peer, hostIP, 40000, testVXLAN, 0, 100),
		} {
			t.Run(name, func(t *testing.T) { passes(t, f) })
		}
	})
}

// Through a namespace: the prefilter sits on the VTEP's device (a veth here, native XDP)
// and drops a non-peer's and a spoofed inner source's VXLAN before the kernel builds an
// skb: counted under the tc path's reasons, and the vxlan device never receives them. A
// restart in the same mode updates the pinned link in place (same link, no moment
// without it), one in generic mode replaces it (the drops the same); a restart with the
// prefilter off removes it as it starts (before any Sync), and the
// same packets then reach the vxlan device and are dropped there by cb_from_overlay,
// under the same reasons.
func TestXDPPrefilterOnTheWire(t *testing.T) {
	h := newOneHost(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	up, wire := h.prefix+"u0", h.prefix+"u1"
	vtepOn(t, h, "", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: up}, PeerName: wire})
	h.cfg.XDP = XDPNative
	h.d = h.start(t)
	h.remoteEndpoints(t, 1) // peer h2 (10.254.0.2) with 10.50.0.10
	hook := "xdp-native"
	xdpLink := func() (uint32, bool) {
		t.Helper()
		st, err := h.d.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range st.Attachments {
			if a.Interface == xdpLinkPrefix+up {
				if a.Hook != hook || a.Program != contivbpfProgCbXdpUplink {
					t.Errorf("attachment %+v, want hook %s, program %s", a, hook, contivbpfProgCbXdpUplink)
				}
				return a.ID, true
			}
		}
		return 0, false
	}
	id, ok := xdpLink()
	if !ok {
		t.Fatalf("no xdp attachment on %s", up)
	}
	if mode, dev := h.d.XDPMode(); mode != XDPNative || dev != up {
		t.Errorf("XDPMode %s %s, want %s %s", mode, dev, XDPNative, up)
	}
	nl := netlinkIn(t, h.cfg.NetNS)
	defer nl.Close()
	dev, err := nl.LinkByName(up)
	if err != nil {
		t.Fatal(err)
	}
	if w, err := nl.LinkByName(wire); err != nil || nl.LinkSetUp(w) != nil {
		t.Fatalf("wire %s: %v", wire, err)
	}
	vtep := h.cfg.VTEP
	inner := func(src netip.Addr) []byte {
		dst := netip.MustParseAddr("10.50.0.2")
		return conformance.UDPFrame(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), src, dst, 40000, 7000, []byte("xdp"))
	}
	frames := [][]byte{
		// A host that is not a peer.
		conformance.UDPFrame(dev.Attrs().HardwareAddr, dataplane.ContivMAC(vtep), netip.MustParseAddr("10.254.0.9"), vtep, 40000, DefaultVXLANPort,
			conformance.VXLANPayload(uint32(h.net.Tag), inner(netip.MustParseAddr("10.50.0.10")))),
		// The peer, with an inner source no endpoint behind it has.
		conformance.UDPFrame(dev.Attrs().HardwareAddr, dataplane.ContivMAC(vtep), netip.MustParseAddr("10.254.0.2"), vtep, 40000, DefaultVXLANPort,
			conformance.VXLANPayload(uint32(h.net.Tag), inner(netip.MustParseAddr("10.50.0.99")))),
	}
	vxRx := func() uint64 {
		t.Helper()
		l, err := nl.LinkByName(h.cfg.VXLANIf)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Statistics.RxPackets
	}
	// send sends the frames and waits until both reasons moved by one.
	send := func() {
		t.Helper()
		before, err := h.d.ReasonCounters()
		if err != nil {
			t.Fatal(err)
		}
		if err := conformance.SendRawFrames(h.cfg.NetNS, wire, frames); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			after, err := h.d.ReasonCounters()
			if err != nil {
				t.Fatal(err)
			}
			peer := after[DropUnknownPeer].Packets - before[DropUnknownPeer].Packets
			spoof := after[DropOverlaySpoof].Packets - before[DropOverlaySpoof].Packets
			if peer == 1 && spoof == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("drop_unknown_peer +%d, drop_overlay_spoof +%d, want +1 each", peer, spoof)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	rx := vxRx()
	send()
	if got := vxRx(); got != rx {
		t.Errorf("the vxlan device received %d packets the prefilter drops", got-rx)
	}

	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = h.start(t)
	if again, ok := xdpLink(); !ok || again != id {
		t.Errorf("restarted in the same mode: xdp link %d (attached %v), want the pinned link %d updated in place", again, ok, id)
	}

	// Generic mode: the native link is replaced, and the drops are the same.
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.cfg.XDP, hook = XDPGeneric, "xdp-generic"
	h.d = h.start(t)
	if again, ok := xdpLink(); !ok || again == id {
		t.Errorf("restarted generic: xdp link %d (attached %v), want a new link in place of %d", again, ok, id)
	}
	if l, err := nl.LinkByName(up); err != nil || l.Attrs().Xdp == nil || l.Attrs().Xdp.AttachMode != xdpAttachedSKB {
		t.Fatalf("%s: attach mode %+v (err %v), want generic", up, l.Attrs().Xdp, err)
	}
	rx = vxRx()
	send()
	if got := vxRx(); got != rx {
		t.Errorf("generic: the vxlan device received %d packets the prefilter drops", got-rx)
	}

	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.cfg.XDP = XDPOff
	h.d = h.start(t)
	// Gone at the start, not at the first Sync: until then (for good, were Sync to fail)
	// the earlier build's program would judge with maps a layout migration froze.
	if l, err := nl.LinkByName(up); err != nil || (l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached) {
		t.Errorf("restarted with the prefilter off: %s still has an XDP program before Sync (err %v)", up, err)
	}
	h.remoteEndpoints(t, 1)
	if _, ok := xdpLink(); ok {
		t.Fatal("restarted with the prefilter off: its link is still attached after Sync")
	}
	if l, err := nl.LinkByName(up); err != nil || (l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached) {
		t.Fatalf("%s still has an XDP program (err %v)", up, err)
	}
	rx = vxRx()
	send()
	if got := vxRx(); got < rx+2 {
		t.Errorf("without the prefilter the vxlan device received %d of the 2 packets (the control does not work)", got-rx)
	}
}

// A mode Options.XDP does not know is refused before anything is created.
func TestXDPModeRefused(t *testing.T) {
	_, err := New(context.Background(), dataplane.HostConfig{Host: "h", VTEP: netip.MustParseAddr("10.254.0.1")}, Options{XDP: "offload"})
	if err == nil || !strings.Contains(err.Error(), `xdp mode "offload"`) {
		t.Fatalf("New with XDP offload: %v, want refused naming the mode", err)
	}
}

// A prefilter drop is counted and reported as the tc path's drop of the same packet:
// the bytes counted and the event's length, addresses and ports are those of the frame
// tc would have judged (after the vxlan device: the UDP payload past the VXLAN header,
// nothing the frame carries past its IP or UDP datagram; a clear overlay packet: the
// whole frame, ports past IP options too). Each frame goes through cb_xdp_uplink and the
// same packet through the tc program that drops it, and their counters and events are
// compared.
func TestXDPDropReportsAsTC(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbXdpUplink, contivbpfProgCbFromUplink)
	rd, err := ringbuf.NewReader(objs.CbEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = nport(testVXLAN); c.Vtep = ip4(hostIP) })
	peer := netip.MustParseAddr(testVTEP)
	in := conformance.UDPFrame(dataplane.ContivMAC(localIP), dataplane.ContivMAC(orphanIP), orphanIP, localIP, 5000, 53, []byte("spoofed"))
	// got runs f through prog and returns the bytes counted under reason and its event.
	got := func(t *testing.T, prog *ebpf.Program, f []byte, ctx any, reason Reason, ret uint32) (uint64, DropEvent) {
		t.Helper()
		before, err := readReasons(objs.CbReasons)
		if err != nil {
			t.Fatal(err)
		}
		run(t, objs, prog, f, ctx).expect(t, ret, reason)
		after, err := readReasons(objs.CbReasons)
		if err != nil {
			t.Fatal(err)
		}
		ev, ok := nextEvent(t, rd)
		if !ok || ev.Reason != reason {
			t.Fatalf("event %+v, want one of %v", ev, reason)
		}
		ev.Time, ev.Ifindex = 0, 0
		return after[reason].Bytes - before[reason].Bytes, ev
	}
	same := func(t *testing.T, xf []byte, tc *ebpf.Program, tf []byte, ctx any, reason Reason) {
		t.Helper()
		xb, xe := got(t, objs.CbXdpUplink, xf, nil, reason, xdpDrop)
		tb, te := got(t, tc, tf, ctx, reason, tcActShot)
		if xb != tb || xe != te {
			t.Errorf("prefilter counted %d bytes, event %+v; tc %d bytes, event %+v", xb, xe, tb, te)
		}
	}
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_EVENTS))
	overlay := objs.CbTestOverlay
	tunnel := &skbCtx{CB: [5]uint32{ip4(peer), testNet}}
	// trailer appends n bytes past the outer IP datagram (an Ethernet trailer: the stack
	// trims it); extra grows the IP datagram by n bytes past the UDP one (udp_rcv trims).
	trailer := func(f []byte, n int) []byte { return append(append([]byte{}, f...), make([]byte, n)...) }
	extra := func(f []byte, n int) []byte {
		f = trailer(f, n)
		binary.BigEndian.PutUint16(f[16:], binary.BigEndian.Uint16(f[16:])+uint16(n))
		return f
	}
	for name, f := range map[string][]byte{
		"plain":         vxlanFrame(peer, hostIP, testNet, in),
		"frame-trailer": trailer(vxlanFrame(peer, hostIP, testNet, in), 9),
		"past-udp":      extra(vxlanFrame(peer, hostIP, testNet, in), 5),
	} {
		t.Run(name, func(t *testing.T) { same(t, f, overlay, in, tunnel, DropOverlaySpoof) })
	}
	t.Run("unknown-peer", func(t *testing.T) {
		other := netip.MustParseAddr("192.168.0.3")
		same(t, trailer(vxlanFrame(other, hostIP, testNet, in), 7), overlay, in,
			&skbCtx{CB: [5]uint32{ip4(other), testNet}}, DropUnknownPeer)
	})
	t.Run("encrypted-options", func(t *testing.T) {
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ENCRYPT|contivbpfCbFeaturesCB_FEAT_EVENTS))
		defer setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_EVENTS))
		f := l4FrameOpts(17, peer, hostIP, 40000, testVXLAN, 0, ipOpts{options: []byte{1, 1, 1, 0}})
		same(t, f, objs.CbFromUplink, f, nil, DropClearOverlay)
	})
}

// A device another XDP program holds (another agent's, a tool's) is refused at start with
// an error that says so (one device takes one XDP program), not a bare EBUSY.
func TestXDPDeviceHeldRefused(t *testing.T) {
	h := newOneHost(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	up := h.prefix + "u0"
	vtepOn(t, h, "", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: up}, PeerName: h.prefix + "u1"})
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	var other link.Link
	if err := nsexec.Run(h.cfg.NetNS, func() error {
		l, err := netlink.LinkByName(up)
		if err != nil {
			return err
		}
		other, err = link.AttachXDP(link.XDPOptions{Program: pass, Interface: l.Attrs().Index, Flags: link.XDPDriverMode})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	h.cfg.XDP = XDPNative
	d, err := New(context.Background(), h.cfg.HostConfig, h.cfg.Options)
	if err == nil {
		h.d = d
		t.Fatal("a device another XDP program holds: started")
	}
	if !strings.Contains(err.Error(), "another XDP program holds the device") {
		t.Fatalf("error %v, want it to say another XDP program holds the device", err)
	}
	h.cfg.XDP = XDPOff
	h.d = h.start(t)
}
