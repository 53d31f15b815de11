package dataplane

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

func TestICMPPortUnreachable(t *testing.T) {
	c, vip := netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("10.9.0.200")
	syn := TraceFrame(ContivMAC(c), ContivMAC(vip), c, vip, 6, 40000, 80)
	reply, ok := ICMPPortUnreachable(syn)
	if !ok || len(reply) != 14+28+28 || len(reply) > len(syn)+28 {
		t.Fatalf("syn: ok %v, %d bytes", ok, len(reply))
	}
	srcMAC, dstMAC, src, dst, proto, ttl, _, _, _ := TraceFrameFields(reply)
	if src != vip || dst != c || proto != 1 || ttl != 64 || srcMAC.String() != ContivMAC(vip).String() || dstMAC.String() != ContivMAC(c).String() {
		t.Errorf("reply %v → %v proto %d ttl %d macs %v → %v", src, dst, proto, ttl, srcMAC, dstMAC)
	}
	if checksum(reply[14:34], 0) != 0 || checksum(reply[34:], 0) != 0 || reply[34] != 3 || reply[35] != 3 {
		t.Errorf("icmp %x", reply[14:])
	}
	edit := func(f func([]byte)) []byte {
		b := append([]byte{}, syn...)
		f(b)
		return b
	}
	for name, frame := range map[string][]byte{
		"ack":              edit(func(b []byte) { b[14+20+13] = 0x10 }),
		"syn-ack":          edit(func(b []byte) { b[14+20+13] = 0x12 }),
		"rst":              edit(func(b []byte) { b[14+20+13] = 0x04 }),
		"later-fragment":   edit(func(b []byte) { binary.BigEndian.PutUint16(b[14+6:], 3) }),
		"l2-broadcast":     edit(func(b []byte) { copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) }),
		"l2-group-source":  edit(func(b []byte) { copy(b[6:], []byte{0x01, 0, 0x5e, 0, 0, 1}) }),
		"this-network-src": edit(func(b []byte) { copy(b[14+12:], []byte{0, 1, 2, 3}) }),
		"multicast-dst":    edit(func(b []byte) { copy(b[14+16:], []byte{224, 0, 0, 1}) }),
		"zero-src":         edit(func(b []byte) { copy(b[14+12:], []byte{0, 0, 0, 0}) }),
		"icmp":             TraceFrame(ContivMAC(c), ContivMAC(vip), c, vip, 1, 7, 0),
		"truncated-tcp":    syn[:14+20+10],
		"not-ipv4":         edit(func(b []byte) { b[12] = 0x86; b[13] = 0xdd }),
		"short":            syn[:20],
	} {
		if _, ok := ICMPPortUnreachable(frame); ok {
			t.Errorf("%s answered", name)
		}
	}
	udp := TraceFrame(ContivMAC(c), ContivMAC(vip), c, vip, 17, 40000, 53)
	if r, ok := ICMPPortUnreachable(udp); !ok || string(r[42:]) != string(udp[14:14+28]) {
		t.Errorf("udp: ok %v quote %x", ok, r)
	}
}

// TestICMPTimeExceeded: an expired TCP, UDP or ICMP (not error) packet is answered from the
// router it addressed with type 11 code 0, quoting it; errors, later fragments, group
// addresses and other protocols are not.
func TestICMPTimeExceeded(t *testing.T) {
	c, d, gw := netip.MustParseAddr("10.37.1.1"), netip.MustParseAddr("10.37.2.1"), netip.MustParseAddr("10.37.1.254")
	for _, proto := range []uint8{6, 17, 1} {
		f := TraceFrame(ContivMAC(c), RouterMAC, c, d, proto, 33434, 33435)
		reply, ok := ICMPTimeExceeded(f, gw)
		if !ok {
			t.Fatalf("proto %d not answered", proto)
		}
		srcMAC, dstMAC, src, dst, p, ttl, _, _, _ := TraceFrameFields(reply)
		if src != gw || dst != c || p != 1 || ttl != 64 || srcMAC.String() != RouterMAC.String() || dstMAC.String() != ContivMAC(c).String() {
			t.Errorf("proto %d: reply %v → %v proto %d ttl %d macs %v → %v", proto, src, dst, p, ttl, srcMAC, dstMAC)
		}
		if checksum(reply[14:34], 0) != 0 || checksum(reply[34:], 0) != 0 || reply[34] != 11 || reply[35] != 0 ||
			string(reply[42:]) != string(f[14:14+28]) {
			t.Errorf("proto %d: icmp %x", proto, reply[14:])
		}
	}
	udp := TraceFrame(ContivMAC(c), RouterMAC, c, d, 17, 33434, 33435)
	edit := func(f func([]byte)) []byte {
		b := append([]byte{}, udp...)
		f(b)
		return b
	}
	unreach := TraceFrame(ContivMAC(c), RouterMAC, c, d, 1, 0, 0)
	unreach[14+20] = 3 // an ICMP error itself
	for name, frame := range map[string][]byte{
		"icmp-error":     unreach,
		"later-fragment": edit(func(b []byte) { binary.BigEndian.PutUint16(b[14+6:], 3) }),
		"l2-broadcast":   edit(func(b []byte) { copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) }),
		"multicast-dst":  edit(func(b []byte) { copy(b[14+16:], []byte{224, 0, 0, 1}) }),
		"gre":            edit(func(b []byte) { b[14+9] = 47 }),
		"short":          udp[:14+20+4],
	} {
		if _, ok := ICMPTimeExceeded(frame, gw); ok {
			t.Errorf("%s answered", name)
		}
	}
	if _, ok := ICMPTimeExceeded(udp, netip.MustParseAddr("0.0.0.1")); ok {
		t.Error("answered from 0.0.0.1")
	}
}
