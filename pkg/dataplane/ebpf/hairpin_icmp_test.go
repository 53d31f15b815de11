package ebpf

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// setFragOff sets the fragment field (flags and offset in 8-byte units) of a frame and
// fixes its IP checksum.
func setFragOff(f []byte, field uint16) []byte {
	binary.BigEndian.PutUint16(f[14+6:], field)
	return setIPID(f, binary.BigEndian.Uint16(f[14+4:]))
}

// addrsOf returns the IP addresses of a frame, checking its IP checksum.
func addrsOf(t *testing.T, f []byte) (src, dst netip.Addr) {
	t.Helper()
	ip := f[14:]
	if csum(ip[:20], 0) != 0 {
		t.Error("bad IP checksum")
	}
	return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
}

// quoteOf checks an ICMP error frame's checksums (checkICMPError) and returns its outer
// addresses and the quoted packet's source and destination. A quoted UDP checksum must be
// the one of the whole datagram icmpErrorOf quoted, under the quote's addresses and ports
// as they are now (the translation updated it like the kernel's NAT).
func quoteOf(t *testing.T, f []byte) (src, dst netip.Addr, qsrc, qdst netip.AddrPort) {
	t.Helper()
	src, qdst = checkICMPError(t, f)
	_, dst = addrsOf(t, f)
	q := f[14+20+8:]
	qsrc = netip.AddrPortFrom(netip.AddrFrom4([4]byte(q[12:16])), binary.BigEndian.Uint16(q[20:]))
	// Where the quote holds the L4 checksum: UDP's at 6, TCP's at 16 (whole header quoted).
	if off := map[uint8]int{17: 6, 6: 16}[q[9]]; off != 0 && len(q) >= 20+off+2 {
		want := l4Frame(q[9], qsrc.Addr(), qdst.Addr(), qsrc.Port(), qdst.Port(), 0x10, 0)[14+20+off : 14+20+off+2]
		if got := q[20+off : 20+off+2]; got[0] != want[0] || got[1] != want[1] {
			t.Errorf("quoted L4 checksum %x, want %x (the packet's under %v → %v)", got, want, qsrc, qdst)
		}
	}
	return src, dst, qsrc, qdst
}

// hairpinFixture: LB and policy, the client srcIP in a group that refuses UDP in (hairpin
// traffic is not judged), a UDP service VIP:53 whose only backend is the client (:5353).
func hairpinFixture(t *testing.T) (*contivbpfObjects, netip.Addr) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 10)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-in", Priority: 5, Ingress: true, Proto: 17, Action: dataplane.ActionDeny}}})
	vip := netip.MustParseAddr("10.1.0.100")
	putTestService(t, objs, 1, vip, 53, 17, 5353, srcIP)
	return objs, vip
}

// Fragments of a hairpin datagram (a client balanced to itself): the later fragments of the
// request and of the reply go from the VIP back to the client like their first fragment;
// a later fragment whose first fragment was never seen (or too long ago), of another
// tenant, or with an impossible offset gets no rewrite.
func TestServiceHairpinFragments(t *testing.T) {
	objs, vip := hairpinFixture(t)
	fc := objs.CbFromContainer
	hairpin := func(r runResult, what string) {
		t.Helper()
		r.expect(t, tcActRedirect, FwdLocal)
		if s, d := addrsOf(t, r.out); s != vip || d != srcIP {
			t.Errorf("%s %v → %v, want %v → %v", what, s, d, vip, srcIP)
		}
	}

	// A forged later fragment before any first fragment: nothing to follow.
	run(t, objs, fc, laterFrag(17, srcIP, vip, 0x51), nil).expect(t, tcActShot, DropFragToService)
	r := run(t, objs, fc, firstFrag(17, srcIP, vip, 41000, 53, 0, 0x51), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, d, sp, dp := checkSums(t, r.out); s != vip || sp != 41000 || d != srcIP || dp != 5353 {
		t.Fatalf("first fragment %v:%d → %v:%d, want %v:41000 → %v:5353", s, sp, d, dp, vip, srcIP)
	}
	hairpin(run(t, objs, fc, laterFrag(17, srcIP, vip, 0x51), nil), "request's later fragment")
	hairpin(run(t, objs, fc, setFragOff(laterFrag(17, srcIP, vip, 0x51), 40), nil), "request's last fragment")
	// Same addresses, another datagram or protocol: no first fragment.
	run(t, objs, fc, laterFrag(17, srcIP, vip, 0x52), nil).expect(t, tcActShot, DropFragToService)
	run(t, objs, fc, laterFrag(6, srcIP, vip, 0x51), nil).expect(t, tcActShot, DropFragToService)

	// The reply (the client as backend answers itself through the VIP), fragmented.
	r = run(t, objs, fc, firstFrag(17, srcIP, vip, 5353, 41000, 0, 0x61), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, d, sp, dp := checkSums(t, r.out); s != vip || sp != 53 || d != srcIP || dp != 41000 {
		t.Fatalf("reply first fragment %v:%d → %v:%d, want %v:53 → %v:41000", s, sp, d, dp, vip, srcIP)
	}
	hairpin(run(t, objs, fc, laterFrag(17, srcIP, vip, 0x61), nil), "reply's later fragment")
	run(t, objs, fc, laterFrag(17, srcIP, vip, 0x62), nil).expect(t, tcActShot, DropFragToService)

	t.Run("verdict-needed", func(t *testing.T) {
		// The rewrite record alone passes nothing: without its first fragment's verdict
		// (cb_frags, same client → VIP key) a later fragment is drop_frag_no_first.
		run(t, objs, fc, firstFrag(17, srcIP, vip, 41002, 53, 0, 0x81), nil).expect(t, tcActRedirect, FwdLocal)
		var (
			k    contivbpfCbFragKey
			v    contivbpfCbFragEntry
			keys []contivbpfCbFragKey
		)
		it := objs.CbFrags.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if k.Saddr == ip4(srcIP) && k.Daddr == ip4(vip) && k.Id == binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, 0x81)) {
				if err := objs.CbFrags.Delete(&k); err != nil {
					t.Fatal(err)
				}
			}
		}
		run(t, objs, fc, laterFrag(17, srcIP, vip, 0x81), nil).expect(t, tcActShot, DropFragNoFirst)
	})
	t.Run("bad-offsets", func(t *testing.T) {
		// Past the largest datagram (8191 × 8 + 24 bytes).
		run(t, objs, fc, setFragOff(laterFrag(17, srcIP, vip, 0x51), 0x1fff), nil).expect(t, tcActShot, DropMalformedIP)
		// A TCP fragment at offset 8, inside the TCP header (RFC 1858).
		run(t, objs, fc, setFragOff(laterFrag(6, srcIP, vip, 0x71), ipMF|1), nil).expect(t, tcActShot, DropMalformedIP)
	})
	t.Run("other-tenant", func(t *testing.T) {
		// Same addresses and IP id in another tenant: its VIP is no VIP there, nothing
		// of the first tenant's records applies.
		setZone(t, objs, testZone+1)
		defer setZone(t, objs, testZone)
		run(t, objs, fc, laterFrag(17, srcIP, vip, 0x51), nil).expect(t, tcActShot, DropUnknownDst)
	})
	t.Run("expired", func(t *testing.T) {
		// A record past its 30 s counts as none.
		var (
			k contivbpfCbFragKey
			v contivbpfCbNatfrag
		)
		var keys []contivbpfCbFragKey
		it := objs.CbNatFrags.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := objs.CbNatFrags.Lookup(&k, &v); err != nil {
				t.Fatal(err)
			}
			v.Expires = 1
			if err := objs.CbNatFrags.Put(&k, &v); err != nil {
				t.Fatal(err)
			}
		}
		run(t, objs, fc, laterFrag(17, srcIP, vip, 0x51), nil).expect(t, tcActShot, DropFragToService)
	})
}

// ICMP errors a client sends about a service's replies go to the backend as errors about
// its own packet; errors that belong to no service flow of the sender stay dropped.
func TestServiceICMPFromClient(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	vip := netip.MustParseAddr("10.1.0.101")
	putTestService(t, objs, 2, vip, 53, 17, 5353, remoteIP)
	run(t, objs, fc, l4Frame(17, srcIP, vip, 40600, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 5353, 40600, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)

	for _, typ := range []uint8{3, 11} {
		// The client's kernel: port unreachable (time exceeded) about vip:53 → client:40600.
		r := run(t, objs, fc, icmpError(srcIP, vip, typ, vip, srcIP, 53, 40600), nil)
		r.expect(t, tcActRedirect, FwdTunnel)
		s, d, qs, qd := quoteOf(t, r.out)
		if s != srcIP || d != remoteIP || qs != netip.AddrPortFrom(remoteIP, 5353) || qd != netip.AddrPortFrom(srcIP, 40600) {
			t.Errorf("type %d: error %v → %v quoting %v → %v, want %v → %v quoting %v:5353 → %v:40600",
				typ, s, d, qs, qd, srcIP, remoteIP, remoteIP, srcIP)
		}
	}
	if _, ok := ctEntry(t, objs, testZone, 1, srcIP, remoteIP, 0, 0); ok {
		t.Error("a translated error created an entry")
	}

	t.Run("hostile", func(t *testing.T) {
		// Truncated quote: malformed.
		p := icmpError(srcIP, vip, 3, vip, srcIP, 53, 40600)
		p = p[:len(p)-4]
		binary.BigEndian.PutUint16(p[16:], uint16(len(p)-14))
		run(t, objs, fc, p, nil).expect(t, tcActShot, DropMalformedL4)
		// Quoting no flow of the sender: another port, another client (a third party's
		// flow), another service port.
		run(t, objs, fc, icmpError(srcIP, vip, 3, vip, srcIP, 53, 40601), nil).expect(t, tcActShot, DropUnknownDst)
		run(t, objs, fc, icmpError(srcIP, vip, 3, vip, localIP, 53, 40600), nil).expect(t, tcActShot, DropUnknownDst)
		run(t, objs, fc, icmpError(srcIP, vip, 3, vip, srcIP, 54, 40600), nil).expect(t, tcActShot, DropUnknownDst)
		// The flow's quote, but not sent to the VIP it quotes (then it is a packet to the
		// backend like any other: judged, not translated; here to the gateway).
		run(t, objs, fc, icmpError(srcIP, gwIP, 3, vip, srcIP, 53, 40600), nil).expect(t, tcActShot, DropToGateway)
		// A fragment of an error is not translated.
		run(t, objs, fc, setFragOff(icmpError(srcIP, vip, 3, vip, srcIP, 53, 40600), ipMF), nil).expect(t, tcActShot, DropUnknownDst)
		// Another tenant's client with the same addresses and ports.
		setZone(t, objs, testZone+1)
		run(t, objs, fc, icmpError(srcIP, vip, 3, vip, srcIP, 53, 40600), nil).expect(t, tcActShot, DropUnknownDst)
		setZone(t, objs, testZone)
	})

	t.Run("tcp-whole-header", func(t *testing.T) {
		// A backend's frag needed about the client's TCP segment, quoting its whole TCP
		// header: the quoted TCP checksum follows the VIP:port too.
		tvip := netip.MustParseAddr("10.1.0.103")
		putTestService(t, objs, 4, tvip, 80, 6, 8080, remoteIP)
		run(t, objs, fc, l4Frame(6, srcIP, tvip, 41500, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		quote := l4Frame(6, srcIP, remoteIP, 41500, 8080, 0x10, 0)[14 : 14+20+20]
		r := run(t, objs, ov, icmpErrorQuoting(remoteIP, srcIP, 3, quote), ovl)
		r.expect(t, tcActRedirect, FwdLocal)
		if s, _, qs, qd := quoteOf(t, r.out); s != tvip || qs != netip.AddrPortFrom(srcIP, 41500) || qd != netip.AddrPortFrom(tvip, 80) {
			t.Errorf("error from %v quoting %v → %v, want from %v quoting %v:41500 → %v:80", s, qs, qd, tvip, srcIP, tvip)
		}
	})

	t.Run("hairpin", func(t *testing.T) {
		hvip := netip.MustParseAddr("10.1.0.102")
		putTestService(t, objs, 3, hvip, 55, 17, 5555, srcIP)
		run(t, objs, fc, l4Frame(17, srcIP, hvip, 40800, 55, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, l4Frame(17, srcIP, hvip, 5555, 40800, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
		check := func(r runResult, what string, wantQS, wantQD netip.AddrPort) {
			t.Helper()
			r.expect(t, tcActRedirect, FwdLocal)
			s, d, qs, qd := quoteOf(t, r.out)
			if s != hvip || d != srcIP || qs != wantQS || qd != wantQD {
				t.Errorf("%s: %v → %v quoting %v → %v, want %v → %v quoting %v → %v", what, s, d, qs, qd, hvip, srcIP, wantQS, wantQD)
			}
		}
		// The client's error about the reply it got from VIP:55: for the client as backend,
		// about client:5555 → VIP:40800, from the VIP.
		check(run(t, objs, fc, icmpError(srcIP, hvip, 3, hvip, srcIP, 55, 40800), nil), "error about the reply",
			netip.AddrPortFrom(srcIP, 5555), netip.AddrPortFrom(hvip, 40800))
		// The client as backend's error about the request (VIP:40800 → client:5555): for the
		// client, about client:40800 → VIP:55, from the VIP.
		check(run(t, objs, fc, icmpError(srcIP, hvip, 3, hvip, srcIP, 40800, 5555), nil), "error about the request",
			netip.AddrPortFrom(srcIP, 40800), netip.AddrPortFrom(hvip, 55))
	})
}
