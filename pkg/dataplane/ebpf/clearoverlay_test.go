package ebpf

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// udp6Frame builds an Ethernet/IPv6/UDP frame (no extension headers) from src to dst port
// dport.
func udp6Frame(src, dst netip.Addr, dport uint16) []byte {
	udp := make([]byte, 8, 8+4)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], dport)
	udp = append(udp, "vxln"...)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	ip := make([]byte, 40)
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
	ip[6] = 17
	ip[7] = 64
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	f := ethHdr(dataplane.ContivMAC(remoteIP), dataplane.ContivMAC(srcIP), 0x86dd)
	return append(append(f, ip...), udp...)
}

// With encryption on, cb_from_uplink drops every UDP packet to the overlay's port that the
// wire brings (only WireGuard's decrypted packets may carry the overlay, and those come
// out of the WireGuard device), whatever address, IP options, fragment or IP version it
// tries; WireGuard's own port and other traffic pass as before, and with encryption off
// the clear overlay packet passes as it always did.
func TestClearOverlayDropped(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbFromUplink)
	up := objs.CbFromUplink
	vtep, peer := hostIP, netip.MustParseAddr("192.168.0.2")
	const vxlan, wg = 4789, 51820
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = nport(vxlan); c.Vtep = ip4(vtep) })
	clear := func() []byte { return l4Frame(17, peer, vtep, 40000, vxlan, 0, 0) }
	passes := func(t *testing.T, f []byte) {
		t.Helper()
		if r := run(t, objs, up, f, nil); r.ret != tcxNext || len(r.diff) != 0 {
			t.Errorf("verdict %#x reasons %v, want tcx next, uncounted", r.ret, r.diff)
		}
	}
	dropped := func(t *testing.T, f []byte) {
		t.Helper()
		run(t, objs, up, f, nil).expect(t, tcActShot, DropClearOverlay)
	}

	t.Run("off-passes", func(t *testing.T) {
		setFeatures(t, objs, 0)
		passes(t, clear())
	})
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ENCRYPT))
	t.Run("on-without-egress-drops", func(t *testing.T) { dropped(t, clear()) })
	t.Run("wireguard-passes", func(t *testing.T) { passes(t, l4Frame(17, peer, vtep, wg, wg, 0, 0)) })
	t.Run("other-udp-passes", func(t *testing.T) { passes(t, l4Frame(17, peer, vtep, 40000, 53, 0, 0)) })
	t.Run("tcp-to-the-port-passes", func(t *testing.T) { passes(t, l4Frame(6, peer, vtep, 40000, vxlan, 0x02, 0)) })
	t.Run("from-the-port-passes", func(t *testing.T) { passes(t, l4Frame(17, peer, vtep, vxlan, 40000, 0, 0)) })
	t.Run("ip-options-drop", func(t *testing.T) {
		dropped(t, l4FrameOpts(17, peer, vtep, 40000, vxlan, 0, ipOpts{options: []byte{1, 1, 1, 0}}))
	})
	t.Run("other-address-drops", func(t *testing.T) {
		// The vxlan device's socket listens on every address, broadcast included.
		dropped(t, l4Frame(17, peer, netip.MustParseAddr("192.168.0.255"), 40000, vxlan, 0, 0))
		dropped(t, l4Frame(17, peer, netip.MustParseAddr("255.255.255.255"), 40000, vxlan, 0, 0))
	})
	t.Run("first-fragment-drops", func(t *testing.T) { dropped(t, asFirstFragment(clear())) })
	t.Run("later-fragment-passes", func(t *testing.T) {
		// No ports to read: its first fragment is dropped, so it never reassembles.
		passes(t, l4Frame(17, peer, vtep, 40000, vxlan, 0, 185))
	})
	t.Run("ipv6-drops", func(t *testing.T) {
		// A collect_md vxlan device opens an IPv6 socket too.
		dropped(t, udp6Frame(netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1"), vxlan))
		passes(t, udp6Frame(netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1"), wg))
	})
	t.Run("on-with-egress-drops", func(t *testing.T) {
		editConfig(t, objs, func(c *contivbpfCbConfig) { c.SnatIp = ip4(vtep); c.EgressIfindex = loIfindex })
		dropped(t, clear())
		passes(t, l4Frame(17, peer, vtep, wg, wg, 0, 0))
	})
	t.Run("on-without-port-passes", func(t *testing.T) {
		editConfig(t, objs, func(c *contivbpfCbConfig) { c.VxlanPort = 0 })
		passes(t, clear())
	})
}

// The encryption bit follows Options.Encrypted from the first config a driver writes: a
// netplugin restarted without --encryption takes clear overlay packets at once, not only
// after its first Sync (the bit is configuration, not an index the Sync rebuilds; carried
// over, it stayed on while netmaster was unreachable, dropping the now clear overlay).
func TestEncryptionBitNotCarried(t *testing.T) {
	h := newOneHost(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.cfg.Encrypted = true
	vtepOn(t, h, "", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.prefix + "u0"}, PeerName: h.prefix + "u1"})
	enc := uint32(contivbpfCbFeaturesCB_FEAT_ENCRYPT)
	bits := func() (cfg, global uint32) {
		t.Helper()
		if err := h.d.objs.CbFeatures.Get(&global); err != nil {
			t.Fatal(err)
		}
		return h.features(t), global
	}
	h.d = h.start(t)
	if c, g := bits(); c&enc == 0 || g&enc == 0 {
		t.Fatalf("encrypted: features %#x, global %#x, want the encryption bit", c, g)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.cfg.Encrypted = false
	h.d = h.start(t)
	if c, g := bits(); c&enc != 0 || g&enc != 0 {
		t.Errorf("restarted without encryption, before Sync: features %#x, global %#x, want no encryption bit", c, g)
	}
}

// With encryption on, a VTEP on a device no packet from the underlay enters (loopback, a
// dummy: a routed VTEP) is refused at start: the check would sit where no peer's packet
// arrives and every clear one would pass (before, the driver attached there and started).
func TestEncryptedVTEPOnLoopbackRefused(t *testing.T) {
	h := newOneHost(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	vtepOn(t, h, "lo")
	h.cfg.Encrypted = true
	if d, err := New(context.Background(), h.cfg.HostConfig, h.cfg.Options); err == nil || !strings.Contains(err.Error(), "which no packet from the underlay enters") {
		if d != nil {
			_ = d.Teardown(context.Background())
		}
		t.Fatalf("encrypted with the VTEP on lo: %v, want refused", err)
	}
	// (A dummy device is refused the same way; this kernel has no dummy module to show it.)
}

// vtepOn moves h's VTEP address onto the device named dev in h's namespace, or onto add,
// created there first (and removed at the end).
func vtepOn(t *testing.T, h *oneHost, dev string, add ...netlink.Link) {
	t.Helper()
	a := &netlink.Addr{IPNet: netlink.NewIPNet(h.cfg.VTEP.AsSlice())}
	if err := nsexec.Run(h.cfg.NetNS, func() error {
		if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
			for _, old := range addrs {
				if old.IP.Equal(a.IP) {
					if l, err := netlink.LinkByIndex(old.LinkIndex); err == nil {
						_ = netlink.AddrDel(l, &old)
					}
				}
			}
		}
		for _, l := range add {
			if err := netlink.LinkAdd(l); err != nil {
				return fmt.Errorf("add %s: %w", l.Attrs().Name, err)
			}
			dev = l.Attrs().Name
		}
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.AddrAdd(l, a)
	}); err != nil {
		t.Fatal(err)
	}
	for _, l := range add {
		t.Cleanup(func() { _ = nsexec.Run(h.cfg.NetNS, func() error { return netlink.LinkDel(l) }) })
	}
}
