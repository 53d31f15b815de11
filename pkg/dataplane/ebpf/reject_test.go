package ebpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// rejectVIP is a service (80/tcp and 53/udp) without backends in the fixture's zone.
var rejectVIP = netip.MustParseAddr("10.1.0.110")

// loadRejectObjects is the fixture with service LB on and rejectVIP's two ports without
// backends.
func loadRejectObjects(t *testing.T) *contivbpfObjects {
	t.Helper()
	objs := loadTestObjects(t, contivbpfProgCbFromUplink)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	for i, port := range []struct {
		n     uint16
		proto uint8
	}{{80, 6}, {53, 17}} {
		k := contivbpfCbSvcKey{Zone: testZone, Vip: ip4(rejectVIP), Port: nport(port.n), Proto: port.proto}
		if err := objs.CbServices.Put(&k, &contivbpfCbSvc{Id: uint32(40 + i), TargetPort: nport(8080)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := objs.CbVips.Put(&contivbpfCbVipKey{Zone: testZone, Vip: ip4(rejectVIP)}, &contivbpfCbVip{}); err != nil {
		t.Fatal(err)
	}
	return objs
}

// checkReject verifies, field by field, that out is the ICMP port unreachable the
// datapath answers the frame in with: from the VIP to the sender, MACs swapped, checksums
// right (recomputed), quoting in's IPv4 header with its options and the first 8 bytes of
// its payload.
func checkReject(t *testing.T, in, out []byte) {
	t.Helper()
	hlen := int(in[14]&0xf) * 4
	quote := in[14 : 14+hlen+8]
	if want := 14 + 28 + len(quote); len(out) != want {
		t.Fatalf("error is %d bytes, want %d", len(out), want)
	}
	if len(out) > len(in)+28 {
		t.Errorf("error of %d bytes for a %d-byte packet", len(out), len(in))
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || binary.BigEndian.Uint16(out[12:]) != 0x0800 {
		t.Errorf("ethernet %x, want dst %x src %x ipv4", out[:14], in[6:12], in[0:6])
	}
	ip := out[14:34]
	wantIP := []byte{0x45, 0xc0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0}
	binary.BigEndian.PutUint16(wantIP[2:], uint16(28+len(quote)))
	copy(wantIP[10:], ip[10:12]) // checked below
	if !bytes.Equal(ip[:12], wantIP) {
		t.Errorf("ipv4 header %x, want %x", ip[:12], wantIP)
	}
	if csum(ip, 0) != 0 {
		t.Errorf("bad IPv4 checksum %x", ip[10:12])
	}
	if !bytes.Equal(ip[12:16], in[14+16:14+20]) || !bytes.Equal(ip[16:20], in[14+12:14+16]) {
		t.Errorf("addresses %v → %v, want the VIP to the sender", netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])))
	}
	icmp := out[34:]
	if icmp[0] != 3 || icmp[1] != 3 || binary.BigEndian.Uint32(icmp[4:]) != 0 {
		t.Errorf("icmp header %x, want type 3 code 3", icmp[:8])
	}
	if csum(icmp, 0) != 0 {
		t.Errorf("bad ICMP checksum %x", icmp[2:4])
	}
	if !bytes.Equal(icmp[8:], quote) {
		t.Errorf("quote\n got %x\nwant %x", icmp[8:], quote)
	}
	// The OVS backend's agent builds the same reply (dataplane.ICMPPortUnreachable).
	if want, ok := dataplane.ICMPPortUnreachable(in); !ok || !bytes.Equal(out, want) {
		t.Errorf("differs from dataplane.ICMPPortUnreachable (ok %v)\n got %x\nwant %x", ok, out, want)
	}
}

// checkGenerated verifies that out is an ICMP error (typ, code) from src to in's sender,
// MACs swapped, both checksums right, quoting in's IPv4 header and 8 bytes of its payload.
func checkGenerated(t *testing.T, in, out []byte, src netip.Addr, typ, code byte) {
	t.Helper()
	hlen := int(in[14]&0xf) * 4
	quote := in[14 : 14+hlen+8]
	if want := 14 + 28 + len(quote); len(out) < want {
		t.Fatalf("error is %d bytes, want %d", len(out), want)
	}
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) {
		t.Errorf("ethernet %x, want dst %x src %x", out[:12], in[6:12], in[0:6])
	}
	ip := out[14:34]
	if ip[0] != 0x45 || ip[9] != 1 || csum(ip, 0) != 0 || int(binary.BigEndian.Uint16(ip[2:])) != 28+len(quote) {
		t.Errorf("ipv4 header %x (checksum %x)", ip, csum(ip, 0))
	}
	if s, d := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])); s != src || !bytes.Equal(ip[16:20], in[14+12:14+16]) {
		t.Errorf("addresses %v → %v, want %v to the sender", s, d, src)
	}
	icmp := out[34 : 34+8+len(quote)]
	if icmp[0] != typ || icmp[1] != code || csum(icmp, 0) != 0 {
		t.Errorf("icmp header %x (checksum %x), want type %d code %d", icmp[:8], csum(icmp, 0), typ, code)
	}
	if !bytes.Equal(icmp[8:], quote) {
		t.Errorf("quote\n got %x\nwant %x", icmp[8:], quote)
	}
}

func TestRejectNoBackend(t *testing.T) {
	objs := loadRejectObjects(t)
	fc := objs.CbFromContainer
	reject := func(t *testing.T, in []byte) {
		t.Helper()
		r := run(t, objs, fc, in, nil)
		r.expect(t, tcActRedirect, RejectNoBackend)
		checkReject(t, in, r.out)
	}
	t.Run("tcp-syn", func(t *testing.T) {
		reject(t, l4Frame(6, srcIP, rejectVIP, 44000, 80, tcpSYN, 0))
	})
	t.Run("tcp-syn-ecn", func(t *testing.T) {
		reject(t, l4Frame(6, srcIP, rejectVIP, 44001, 80, tcpSYN|0x40|0x80, 0))
	})
	t.Run("udp", func(t *testing.T) {
		reject(t, l4Frame(17, srcIP, rejectVIP, 44002, 53, 0, 0))
	})
	t.Run("udp-first-fragment", func(t *testing.T) {
		reject(t, l4Frame(17, srcIP, rejectVIP, 44003, 53, 0, ipMF))
	})
	t.Run("ip-options-quoted", func(t *testing.T) {
		// Record route (7, 11 bytes, pointer 4) + end of options: a 32-byte header.
		opts := []byte{7, 11, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		reject(t, l4FrameOpts(17, srcIP, rejectVIP, 44004, 53, 0, ipOpts{options: opts}))
		reject(t, l4FrameOpts(6, srcIP, rejectVIP, 44005, 80, tcpSYN, ipOpts{options: opts}))
	})
	t.Run("tiny-udp", func(t *testing.T) {
		// No payload: the error is the packet plus 28 bytes, no more.
		in := l4Frame(17, srcIP, rejectVIP, 44006, 53, 0, 0)
		in = in[:14+20+8]
		binary.BigEndian.PutUint16(in[14+2:], 28)
		binary.BigEndian.PutUint16(in[14+10:], 0)
		binary.BigEndian.PutUint16(in[14+10:], csum(in[14:34], 0))
		binary.BigEndian.PutUint16(in[34+4:], 8)
		binary.BigEndian.PutUint16(in[34+6:], 0) // no UDP checksum
		reject(t, in)
	})
	t.Run("event", func(t *testing.T) {
		// A monitor sees the packet as it came, with the reject reason.
		rd, err := ringbuf.NewReader(objs.CbEvents)
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_EVENTS))
		defer setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
		in := l4Frame(17, srcIP, rejectVIP, 44008, 53, 0, 0)
		reject(t, in)
		ev, ok := nextEvent(t, rd)
		if !ok || ev.Reason != RejectNoBackend || ev.Src != srcIP || ev.Dst != rejectVIP || ev.Proto != 17 ||
			ev.SrcPort != 44008 || ev.DstPort != 53 || ev.Len != uint32(len(in)) {
			t.Errorf("event %+v", ev)
		}
	})
	t.Run("never", func(t *testing.T) { rejectNever(t, objs) })
	t.Run("routing-mac", func(t *testing.T) {
		// Sent to the router's MAC (routing mode): the error comes from it.
		in := l4Frame(6, srcIP, rejectVIP, 44007, 80, tcpSYN, 0)
		copy(in[0:6], dataplane.RouterMAC)
		reject(t, in)
	})
}

// rejectNever: packets an ICMP error never answers are dropped, each with exactly one
// counted reason and nothing sent.
func rejectNever(t *testing.T, objs *contivbpfObjects) {
	fc := objs.CbFromContainer
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	withDstMAC := func(f []byte, mac net.HardwareAddr) []byte { copy(f[0:6], mac); return f }
	truncated := l4Frame(6, srcIP, rejectVIP, 44100, 80, tcpSYN, 0)[:14+20+12]
	binary.BigEndian.PutUint16(truncated[14+2:], 32)
	binary.BigEndian.PutUint16(truncated[14+10:], 0)
	binary.BigEndian.PutUint16(truncated[14+10:], csum(truncated[14:34], 0))
	for _, c := range []struct {
		name   string
		frame  []byte
		reason Reason
	}{
		{"tcp-ack", l4Frame(6, srcIP, rejectVIP, 44101, 80, tcpACK, 0), DropNoBackend},
		{"tcp-rst", l4Frame(6, srcIP, rejectVIP, 44102, 80, 0x04, 0), DropNoBackend},
		{"tcp-syn-ack", l4Frame(6, srcIP, rejectVIP, 44103, 80, tcpSYN|tcpACK, 0), DropNoBackend},
		{"tcp-syn-fin", l4Frame(6, srcIP, rejectVIP, 44104, 80, tcpSYN|0x01, 0), DropNoBackend},
		{"ethernet-broadcast", withDstMAC(l4Frame(17, srcIP, rejectVIP, 44105, 53, 0, 0), bcast), DropNoBackend},
		{"ethernet-multicast", withDstMAC(l4Frame(17, srcIP, rejectVIP, 44106, 53, 0, 0), net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}), DropNoBackend},
		{"non-first-fragment", laterFrag(17, srcIP, rejectVIP, 0x4242), DropFragToService},
		{"truncated-l4", truncated, DropMalformedL4},
		{"ip-longer-than-frame", l4FrameOpts(17, srcIP, rejectVIP, 44107, 53, 0, ipOpts{totLen: 200}), DropMalformedIP},
		{"icmp-error-to-vip", icmpErrorOf(srcIP, rejectVIP, 3, 17, rejectVIP, srcIP, 53, 44108), DropUnknownDst},
		// (A whole echo request is answered from the VIP: TestVIPAnswers.)
		{"icmp-echo-fragment-to-vip", asFirstFragment(icmpEcho(srcIP, rejectVIP, 8, 44109)), DropUnknownDst},
		{"spoofed-source", l4Frame(17, localIP, rejectVIP, 44110, 53, 0, 0), DropSpoofedSrc},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "spoofed-source" {
				copy(c.frame[6:12], dataplane.ContivMAC(srcIP)) // past the MAC check
			}
			run(t, objs, fc, c.frame, nil).expect(t, tcActShot, c.reason)
		})
	}
}

// TestRejectNodePort: a node port of a service without backends refuses from the host's
// address and node port (the packet as the client sent it), back out of the uplink; a
// per-CPU token bucket bounds these errors (the wire's sources are spoofable).
func TestRejectNodePort(t *testing.T) {
	objs := natFixture(t, 64)
	vip := netip.MustParseAddr("10.1.0.100")
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_NODEPORT))
	putTestService(t, objs, 1, vip, 80, 6, 8080)
	putTestService(t, objs, 2, vip, 53, 17, 5353)
	for _, np := range []contivbpfCbNpKey{{Port: nport(30080), Proto: 6}, {Port: nport(30053), Proto: 17}} {
		svcPort := map[uint8]uint16{6: 80, 17: 53}[np.Proto]
		if err := objs.CbNodeports.Put(&np, &contivbpfCbNp{Zone: testZone, Vip: ip4(vip), SvcPort: nport(svcPort)}); err != nil {
			t.Fatal(err)
		}
	}
	up := objs.CbFromUplink
	for _, in := range [][]byte{l4Frame(6, worldIP, hostIP, 5555, 30080, tcpSYN, 0), l4Frame(17, worldIP, hostIP, 5555, 30053, 0, 0)} {
		r := run(t, objs, up, in, nil)
		r.expect(t, tcActRedirect, RejectNoBackend)
		checkReject(t, in, r.out)
	}
	run(t, objs, up, l4Frame(6, worldIP, hostIP, 5556, 30080, tcpACK, 0), nil).expect(t, tcActShot, DropNoBackend)
	bcast := l4Frame(17, worldIP, hostIP, 5557, 30053, 0, 0)
	copy(bcast[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	run(t, objs, up, bcast, nil).expect(t, tcActShot, DropNoBackend)
	// A forged group source MAC: the error would be flooded to the segment.
	for _, src := range []net.HardwareAddr{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {0x01, 0, 0x5e, 0, 0, 1}} {
		in := l4Frame(17, worldIP, hostIP, 5558, 30053, 0, 0)
		copy(in[6:12], src)
		run(t, objs, up, in, nil).expect(t, tcActShot, DropNoBackend)
	}

	// The host's budget: 50 per 50 ms window whichever CPU runs the program, then
	// dropped. A flood within a few windows gets at most 50 answers per window it spans.
	sent := map[Reason]int{}
	start := time.Now()
	for i := range 400 {
		r := run(t, objs, up, l4Frame(17, worldIP, hostIP, uint16(6000+i), 30053, 0, 0), nil)
		for reason := range r.diff {
			sent[reason]++
		}
	}
	windows := int(time.Since(start)/(50*time.Millisecond)) + 2
	if sent[DropNoBackend] == 0 || sent[RejectNoBackend] < 40 || sent[RejectNoBackend] > 50*windows {
		t.Errorf("a flood of 400 over %d windows answered %v (50 per window)", windows, sent)
	}
}
