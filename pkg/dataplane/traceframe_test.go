package dataplane

import (
	"net"
	"net/netip"
	"testing"
)

// TestTraceFrameRoundTrip: what TraceFrame writes, TraceFrameFields reads back; short,
// non-IPv4 and bad-header frames are refused, never read past their end.
func TestTraceFrameRoundTrip(t *testing.T) {
	sm, dm := net.HardwareAddr{2, 2, 10, 1, 0, 1}, net.HardwareAddr{2, 2, 10, 1, 0, 2}
	src, dst := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")
	for _, p := range []struct {
		proto        uint8
		sport, dport uint16
	}{{6, 40000, 80}, {17, 5353, 53}, {1, 77, 0}} {
		f := TraceFrame(sm, dm, src, dst, p.proto, p.sport, p.dport)
		gsm, gdm, gs, gd, proto, ttl, sp, dp, ok := TraceFrameFields(f)
		if !ok || gsm.String() != sm.String() || gdm.String() != dm.String() || gs != src || gd != dst || proto != p.proto || ttl != 64 || sp != p.sport || dp != p.dport {
			t.Errorf("proto %d: read back %v %v %v %v %d %d %d %d %v", p.proto, gsm, gdm, gs, gd, proto, ttl, sp, dp, ok)
		}
		if checksum(f[14:34], 0) != 0 {
			t.Errorf("proto %d: IPv4 header checksum does not verify", p.proto)
		}
		for n := 0; n < 34; n++ {
			if _, _, _, _, _, _, _, _, ok := TraceFrameFields(f[:n]); ok {
				t.Errorf("a %d-byte frame was read", n)
			}
		}
	}
	bad := TraceFrame(sm, dm, src, dst, 6, 1, 2)
	bad[12] = 0x86 // IPv6 ethertype
	if _, _, _, _, _, _, _, _, ok := TraceFrameFields(bad); ok {
		t.Error("non-IPv4 frame read")
	}
	bad = TraceFrame(sm, dm, src, dst, 6, 1, 2)
	bad[14] = 0x4f // IHL 60 bytes: the header runs past the frame's end
	if _, _, _, _, _, _, _, _, ok := TraceFrameFields(bad[:40]); ok {
		t.Error("a frame whose IPv4 header runs past its end was read")
	}
	bad[14] = 0x46 // IHL 24 bytes: the ports are not where TCP would put them without it
	if _, _, _, _, _, _, sp, dp, ok := TraceFrameFields(bad); !ok || sp == 1 && dp == 2 {
		t.Errorf("IPv4 options ignored: ports %d %d, ok %v", sp, dp, ok)
	}
}
