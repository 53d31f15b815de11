package ebpf

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// putDeny puts prefixes into cb_deny_src and sets CB_FEAT_DENY (as syncDenySources and
// writeConfig do), keeping the other feature bits.
func putDeny(t *testing.T, objs *contivbpfObjects, prefixes ...string) {
	t.Helper()
	for _, s := range prefixes {
		p := netip.MustParsePrefix(s)
		k := contivbpfCbDenyKey{Prefixlen: uint32(p.Bits()), Addr: ip4(p.Addr())}
		if err := objs.CbDenySrc.Put(&k, uint32(1)); err != nil {
			t.Fatal(err)
		}
	}
	var f uint32
	if err := objs.CbFeatures.Get(&f); err != nil {
		t.Fatal(err)
	}
	setFeatures(t, objs, f|uint32(contivbpfCbFeaturesCB_FEAT_DENY))
}

// A denied source's packets from the underlay are dropped where they enter, by the XDP
// prefilter and by cb_from_uplink alike (drop_denied_source): any protocol, to any
// address, a fragment, a VXLAN packet of a peer; sources outside the prefixes pass as
// before, and so does everything while the list is empty (the feature bit off) or the
// frame is tagged or not IPv4.
func TestDenySources(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbXdpUplink, contivbpfProgCbFromUplink, contivbpfProgCbFromUnderlay)
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = nport(testVXLAN); c.Vtep = ip4(hostIP) })
	denied, near := netip.MustParseAddr("203.0.113.77"), netip.MustParseAddr("203.0.114.1")
	peer := netip.MustParseAddr(testVTEP)
	frames := map[string][]byte{
		"udp":            l4Frame(17, denied, hostIP, 40000, 53, 0, 0),
		"tcp-syn":        l4Frame(6, denied, hostIP, 40000, 22, 0x02, 0),
		"other-address":  l4Frame(17, denied, netip.MustParseAddr("198.51.100.1"), 40000, 53, 0, 0),
		"later-fragment": l4Frame(17, denied, hostIP, 40000, 53, 0, 100),
		"options":        l4FrameOpts(17, denied, hostIP, 40000, 53, 0, ipOpts{options: []byte{1, 1, 1, 0}}),
	}
	passes := func(t *testing.T, name string, f []byte) {
		t.Helper()
		if r := run(t, objs, objs.CbXdpUplink, f, nil); r.ret != xdpPass || len(r.diff) != 0 {
			t.Errorf("%s at xdp: verdict %d reasons %v, want pass, uncounted", name, r.ret, r.diff)
		}
		for _, p := range []*ebpf.Program{objs.CbFromUplink, objs.CbFromUnderlay} {
			if r := run(t, objs, p, f, nil); r.ret != tcxNext || len(r.diff) != 0 {
				t.Errorf("%s at tc (%v): verdict %#x reasons %v, want tcx next, uncounted", name, p, r.ret, r.diff)
			}
		}
	}
	// The list empty: everything passes (a stale entry without the bit too).
	k := contivbpfCbDenyKey{Prefixlen: 24, Addr: ip4(netip.MustParseAddr("203.0.113.0"))}
	if err := objs.CbDenySrc.Put(&k, uint32(1)); err != nil {
		t.Fatal(err)
	}
	for name, f := range frames {
		passes(t, "off/"+name, f)
	}
	putDeny(t, objs, "203.0.113.0/24", "192.0.2.5/32")
	for name, f := range frames {
		t.Run(name, func(t *testing.T) {
			run(t, objs, objs.CbXdpUplink, f, nil).expect(t, xdpDrop, DropDeniedSource)
			run(t, objs, objs.CbFromUplink, f, nil).expect(t, tcActShot, DropDeniedSource)
			run(t, objs, objs.CbFromUnderlay, f, nil).expect(t, tcActShot, DropDeniedSource)
		})
	}
	t.Run("host-prefix", func(t *testing.T) {
		f := l4Frame(17, netip.MustParseAddr("192.0.2.5"), hostIP, 1, 2, 0, 0)
		run(t, objs, objs.CbXdpUplink, f, nil).expect(t, xdpDrop, DropDeniedSource)
		run(t, objs, objs.CbFromUplink, f, nil).expect(t, tcActShot, DropDeniedSource)
	})
	passes(t, "near", l4Frame(17, near, hostIP, 40000, 53, 0, 0))
	passes(t, "beside-host-prefix", l4Frame(17, netip.MustParseAddr("192.0.2.4"), hostIP, 1, 2, 0, 0))
	passes(t, "to-the-denied", l4Frame(17, near, denied, 40000, 53, 0, 0))
	passes(t, "ipv6", udp6Frame(netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1"), 53))
	passes(t, "tagged", append(append(append([]byte{}, frames["udp"][:12]...), 0x81, 0, 0, 10), frames["udp"][12:]...))
	// A peer's overlay packet from a denied address is dropped too (the operator's list
	// wins; netmaster refuses a prefix holding a host's VTEP).
	putDeny(t, objs, testVTEP+"/32")
	ov := vxlanFrame(peer, hostIP, testNet, ipFrame(remoteIP, localIP, ipOpts{}))
	run(t, objs, objs.CbXdpUplink, ov, nil).expect(t, xdpDrop, DropDeniedSource)
	run(t, objs, objs.CbFromUplink, ov, nil).expect(t, tcActShot, DropDeniedSource)
	run(t, objs, objs.CbFromUnderlay, ov, nil).expect(t, tcActShot, DropDeniedSource)
}

// SetDenySources makes cb_deny_src exactly the deny list and sets CB_FEAT_DENY while it
// holds a prefix: prefixes added, duplicates and unmasked spellings folded, stale ones
// removed, the bit cleared with the last; an IPv6 prefix is left out and named in the
// error while the rest is applied. A restarted driver keeps the list and its bit through
// its first Sync, before the agent sets it again.
func TestSetDenySources(t *testing.T) {
	h := newDenyHost(t)
	keys := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		var k contivbpfCbDenyKey
		var v uint32
		it := h.d.objs.CbDenySrc.Iterate()
		for it.Next(&k, &v) {
			out[netip.PrefixFrom(addrFrom(k.Addr), int(k.Prefixlen)).String()] = true
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	deny := uint32(contivbpfCbFeaturesCB_FEAT_DENY)
	set := func(p ...string) error {
		var l []netip.Prefix
		for _, s := range p {
			l = append(l, netip.MustParsePrefix(s))
		}
		return h.d.SetDenySources(context.Background(), l)
	}
	if err := set("203.0.113.9/24", "203.0.113.0/24", "192.0.2.5/32"); err != nil {
		t.Fatal(err)
	}
	if got := keys(); len(got) != 2 || !got["203.0.113.0/24"] || !got["192.0.2.5/32"] || h.features(t)&deny == 0 {
		t.Fatalf("deny list %v, features %#x: want 203.0.113.0/24 and 192.0.2.5/32 with the deny bit", got, h.features(t))
	}
	if err := set("192.0.2.5/32", "fd00::/8"); err == nil {
		t.Error("an IPv6 prefix: no error")
	}
	if got := keys(); len(got) != 1 || !got["192.0.2.5/32"] || h.features(t)&deny == 0 {
		t.Fatalf("deny list %v, features %#x: want 192.0.2.5/32 alone with the deny bit", got, h.features(t))
	}
	// A restart: the list and its bit hold through the first Sync.
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = h.start(t)
	if err := h.d.Sync(context.Background(), dataplane.State{Networks: []dataplane.Network{h.net}}); err != nil {
		t.Fatal(err)
	}
	if got := keys(); len(got) != 1 || h.features(t)&deny == 0 {
		t.Fatalf("restarted and synced: deny list %v, features %#x: want the list kept with its bit", got, h.features(t))
	}
	if err := set(); err != nil {
		t.Fatal(err)
	}
	if got := keys(); len(got) != 0 || h.features(t)&deny != 0 {
		t.Fatalf("deny list %v, features %#x: want empty, no deny bit", got, h.features(t))
	}
}

// Through a namespace, without XDP and without encryption: the VTEP on a device that is not
// the egress device gets cb_from_underlay (underlay_<device>), and a denied source's
// packet arriving there is dropped and counted; an allowed source's is not. (Before, no
// program of ours sat on that device, and the deny list did not hold there.)
func TestDenyListOnTheVTEPDevice(t *testing.T) {
	h := newOneHost(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	up, wire := h.prefix+"u0", h.prefix+"u1"
	vtepOn(t, h, "", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: up}, PeerName: wire})
	// The egress device: another veth holding the NAT address.
	eg := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.prefix + "e0"}, PeerName: h.prefix + "e1"}
	snat := netip.MustParseAddr("10.253.0.1")
	if err := nsexec.Run(h.cfg.NetNS, func() error {
		if err := netlink.LinkAdd(eg); err != nil {
			return err
		}
		for _, n := range []string{eg.Name, eg.PeerName, wire} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName(eg.Name)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: netlink.NewIPNet(snat.AsSlice())})
	}); err != nil {
		t.Fatal(err)
	}
	h.cfg.SNATIP = snat
	h.d = h.start(t)
	st, err := h.d.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range st.Attachments {
		found = found || a.Interface == underlayLinkPrefix+up && a.Program == contivbpfProgCbFromUnderlay
	}
	if !found {
		t.Fatalf("no %s link with %s: %+v", underlayLinkPrefix+up, contivbpfProgCbFromUnderlay, st.Attachments)
	}
	if err := h.d.SetDenySources(context.Background(), []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}); err != nil {
		t.Fatal(err)
	}
	nl := netlinkIn(t, h.cfg.NetNS)
	defer nl.Close()
	dev, err := nl.LinkByName(up)
	if err != nil {
		t.Fatal(err)
	}
	frame := func(src string) []byte {
		s := netip.MustParseAddr(src)
		return conformance.UDPFrame(dev.Attrs().HardwareAddr, dataplane.ContivMAC(s), s, h.cfg.VTEP, 40000, 9, []byte("deny"))
	}
	count := func() uint64 {
		t.Helper()
		c, err := h.d.ReasonCounters()
		if err != nil {
			t.Fatal(err)
		}
		return c[DropDeniedSource].Packets
	}
	before := count()
	if err := conformance.SendRawFrames(h.cfg.NetNS, wire, [][]byte{frame("203.0.113.7"), frame("198.51.100.7")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for count() < before+1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // (the allowed one, were it counted, by now too)
	if got := count() - before; got != 1 {
		t.Fatalf("drop_denied_source +%d on the VTEP's device, want +1 (the denied source alone)", got)
	}
}

// A host where no program of the list's sits on a wire (no device holds the VTEP, no
// --egress-if, no XDP device) cannot drop a denied source: SetDenySources says so for a
// list that is not empty (the agent reports it under "prefilter" and retries), never a
// silent success while every denied source passes; the map still holds the list.
// An empty list is no error.
func TestDenyListOnNoDevice(t *testing.T) {
	h := newOneHost(t) // (its VTEP is on no device: egress NAT off, no uplink program)
	err := h.d.SetDenySources(context.Background(), []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")})
	if err == nil || !strings.Contains(err.Error(), "no device") {
		t.Fatalf("deny list on a host with no uplink program: %v, want an error saying no device checks it", err)
	}
	var k contivbpfCbDenyKey
	var v uint32
	if it := h.d.objs.CbDenySrc.Iterate(); !it.Next(&k, &v) {
		t.Error("the list was not written to cb_deny_src")
	}
	if err := h.d.SetDenySources(context.Background(), nil); err != nil {
		t.Errorf("empty list: %v", err)
	}
}

// A full list replaced by another full list (an agent that was down while entries were
// swapped, or changes coalesced into one pass) is taken whole: the new prefixes do not
// fit beside the stale ones in cb_deny_src, so the stale ones make room first, never a
// refusal that every retry repeats while the new prefixes pass.
func TestSetDenySourcesFullListReplaced(t *testing.T) {
	h := newDenyHost(t)
	list := func(second byte) []netip.Prefix {
		out := make([]netip.Prefix, 0, denyMax)
		for i := range denyMax {
			out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, second, byte(i >> 8), byte(i)}), 32))
		}
		return out
	}
	ctx := context.Background()
	if err := h.d.SetDenySources(ctx, list(1)); err != nil {
		t.Fatal(err)
	}
	if err := h.d.SetDenySources(ctx, list(2)); err != nil {
		t.Fatalf("a full list replaced by another: %v", err)
	}
	n := 0
	var k contivbpfCbDenyKey
	var v uint32
	for it := h.d.objs.CbDenySrc.Iterate(); it.Next(&k, &v); n++ {
		if a := addrFrom(k.Addr); a.As4()[1] != 2 {
			t.Fatalf("cb_deny_src holds %v of the old list", a)
		}
	}
	if n != denyMax {
		t.Errorf("cb_deny_src holds %d prefixes, want %d", n, denyMax)
	}
}

// newDenyHost is newOneHost with its VTEP on a veth: cb_from_uplink sits on it (the
// egress device) and checks the deny list (TestDenyListOnNoDevice: without one, the list
// is refused).
func newDenyHost(t *testing.T) *oneHost {
	t.Helper()
	h := newOneHost(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	vtepOn(t, h, "", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.prefix + "u0"}, PeerName: h.prefix + "u1"})
	h.d = h.start(t)
	return h
}
