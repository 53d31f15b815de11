package ebpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

const (
	tcpSYN = 0x02
	tcpACK = 0x10
)

func csum(b []byte, seed uint32) uint16 {
	s := seed
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

func pseudo(src, dst netip.Addr, proto uint8, n int) uint32 {
	s, d := src.As4(), dst.As4()
	var sum uint32
	for _, b := range [][]byte{s[:], d[:]} {
		sum += uint32(binary.BigEndian.Uint16(b[0:])) + uint32(binary.BigEndian.Uint16(b[2:]))
	}
	return sum + uint32(proto) + uint32(n)
}

// l4Frame builds an Ethernet/IPv4/TCP or UDP frame with valid checksums.
func l4Frame(proto uint8, src, dst netip.Addr, sport, dport uint16, flags uint8, fragOff uint16) []byte {
	return l4FrameOpts(proto, src, dst, sport, dport, flags, ipOpts{fragOff: fragOff})
}

// l4FrameOpts is l4Frame with the IPv4 header's options o (options, fragment offset).
func l4FrameOpts(proto uint8, src, dst netip.Addr, sport, dport uint16, flags uint8, o ipOpts) []byte {
	var l4 []byte
	payload := []byte("contivbpf-payload")
	if proto == 6 {
		l4 = make([]byte, 20)
		l4[12] = 5 << 4
		l4[13] = flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
	} else {
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
	}
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	l4 = append(l4, payload...)
	off := 16
	if proto == 17 {
		off = 6
	}
	binary.BigEndian.PutUint16(l4[off:], csum(l4, pseudo(src, dst, proto, len(l4))))
	ip := ipv4Pkt(src, dst, l4, o)
	ip[9] = proto
	binary.BigEndian.PutUint16(ip[10:], csum(ip[:4*(ip[0]&0xf)], 0))
	return append(ethHdr(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), 0x0800), ip...)
}

// checkSums verifies the IP and L4 checksums of an output frame and returns its addresses
// and ports.
func checkSums(t *testing.T, f []byte) (src, dst netip.Addr, sport, dport uint16) {
	t.Helper()
	ip := f[14:]
	n := int(binary.BigEndian.Uint16(ip[2:]))
	if csum(ip[:20], 0) != 0 {
		t.Errorf("bad IP checksum")
	}
	src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	l4 := ip[20:n]
	if csum(l4, pseudo(src, dst, ip[9], len(l4))) != 0 {
		t.Errorf("bad L4 checksum")
	}
	return src, dst, binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
}

// icmpEcho builds an ICMP echo request (typ 8) or reply (0) with the given id, checksums
// valid.
func icmpEcho(src, dst netip.Addr, typ uint8, id uint16) []byte {
	icmp := make([]byte, 16)
	icmp[0] = typ
	binary.BigEndian.PutUint16(icmp[4:], id)
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp, 0))
	ip := ipv4Pkt(src, dst, icmp, ipOpts{})
	ip[9] = 1
	binary.BigEndian.PutUint16(ip[10:], csum(ip[:20], 0))
	return append(ethHdr(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), 0x0800), ip...)
}

// asFirstFragment marks frame's IPv4 packet as the first fragment of a larger datagram
// (more fragments, offset 0), its header checksum fixed.
func asFirstFragment(f []byte) []byte {
	binary.BigEndian.PutUint16(f[14+6:], 0x2000)
	binary.BigEndian.PutUint16(f[14+10:], 0)
	binary.BigEndian.PutUint16(f[14+10:], csum(f[14:34], 0))
	return f
}

// editConfig changes the config map's entry with edit.
func editConfig(t *testing.T, objs *contivbpfObjects, edit func(*contivbpfCbConfig)) {
	t.Helper()
	var cfg contivbpfCbConfig
	if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	edit(&cfg)
	if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
}

func setFeatures(t *testing.T, objs *contivbpfObjects, f uint32) {
	t.Helper()
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.Features = f })
	if err := objs.CbFeatures.Set(f); err != nil { // what the programs read
		t.Fatal(err)
	}
}

func setEPG(t *testing.T, objs *contivbpfObjects, ip netip.Addr, epg uint16) {
	t.Helper()
	k := contivbpfCbEpKey{Net: testNet, Ip: ip4(ip)}
	var v contivbpfCbEndpoint
	if err := objs.CbEndpoints.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	v.Epg = epg
	if err := objs.CbEndpoints.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	// A local endpoint's interface entry has its group too (the sender's is lo's).
	ifindex := v.Ifindex
	if ip == srcIP {
		ifindex = loIfindex
	}
	if ifc, err := objs.ifaceTable().lookup(ifindex); err == nil && ifc.Ip == ip4(ip) {
		ifc.Epg = epg
		if err := objs.ifaceTable().put(ifindex, &ifc, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func putPolicy(t *testing.T, objs *contivbpfObjects, p dataplane.PolicySet) {
	t.Helper()
	eg, in, err := compileRules(p)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := objsPolTables(objs)
	if err != nil {
		t.Fatal(err)
	}
	for dir, rules := range [][]contivbpfCbRule{eg, in} {
		k := contivbpfCbPolKey{Epg: p.EPGID, Dir: uint8(dir)}
		if len(rules) == 0 {
			_ = objs.CbPolicies.Delete(&k)
			_ = pt.remove(k)
			continue
		}
		v := contivbpfCbPolicy{Count: uint32(len(rules))}
		copy(v.Rules[:], rules)
		if err := objs.CbPolicies.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
		if err := pt.install(k, rules, 0); err != nil {
			t.Fatal(err)
		}
	}
	var st contivbpfCbEpgState // (its stamp kept: stamps.go)
	_ = objs.CbEpgs.Lookup(uint32(p.EPGID), &st)
	st.Flags = 0
	if len(eg)+len(in) > 0 {
		st.Flags = uint32(contivbpfCbEpgFlagsCB_EPG_RULES)
	}
	if err := objs.CbEpgs.Put(uint32(p.EPGID), &st); err != nil {
		t.Fatal(err)
	}
}

func TestPolicy(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
	// lo = 10.1.0.2 in EPG 10; local 10.1.0.3 in EPG 20; remote 10.1.0.4 in EPG 30.
	setEPG(t, objs, srcIP, 10)
	setEPG(t, objs, localIP, 20)
	setEPG(t, objs, remoteIP, 30)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-syn", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-80", Priority: 5, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
		{ID: "tie-allow", Priority: 7, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionAllow},
		{ID: "tie-deny", Priority: 7, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionDeny},
	}})
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-out", Priority: 3, Ingress: false, Remote: netip.MustParsePrefix("10.1.0.4/32"), Proto: 17, Action: dataplane.ActionDeny},
		{ID: "no-30-in", Priority: 9, Ingress: true, RemoteEPG: 30, Action: dataplane.ActionDeny},
	}})
	fc := objs.CbFromContainer
	peer := ip4(netip.MustParseAddr(testVTEP))
	ovl := &skbCtx{CB: [5]uint32{peer, testNet}}

	t.Run("syn-allowed-port", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("syn-denied-port", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40001, 22, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
	})
	// A bare ACK is judged as the SYN of its connection: no bypass of SynOnly denies, and
	// no state for the SYN that follows.
	t.Run("bare-ack-judged-as-syn", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40002, 22, tcpACK, 0), nil).expect(t, tcActShot, DropPolicy)
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40002, 22, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
	})
	t.Run("mid-stream-ack-picked-up-when-allowed", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40010, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("icmp-unmatched-allowed", func(t *testing.T) {
		run(t, objs, fc, icmpEcho(srcIP, localIP, 8, 7), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("deny-wins-tie", func(t *testing.T) {
		run(t, objs, fc, l4Frame(17, srcIP, localIP, 40003, 53, 0, 0), nil).expect(t, tcActShot, DropPolicy)
	})
	t.Run("egress-prefix", func(t *testing.T) {
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40004, 9999, 0, 0), nil).expect(t, tcActShot, DropPolicy)
	})
	t.Run("orphan-non-first-fragment", func(t *testing.T) {
		// A later fragment to a UDP-denied destination no longer bypasses policy.
		run(t, objs, fc, laterFrag(17, srcIP, remoteIP, 0x0101), nil).expect(t, tcActShot, DropFragNoFirst)
	})
	t.Run("truncated-tcp", func(t *testing.T) {
		p := l4Frame(6, srcIP, localIP, 40005, 80, tcpSYN, 0)
		p = p[:14+20+10]
		binary.BigEndian.PutUint16(p[16:], 30)
		run(t, objs, fc, p, nil).expect(t, tcActShot, DropMalformedL4)
	})
	t.Run("stateful-reply", func(t *testing.T) {
		// New flows from EPG 30 into EPG 10 are denied ...
		run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, srcIP, 5555, 22, tcpSYN, 0), ovl).expect(t, tcActShot, DropPolicy)
		// ... but replies of a flow EPG 10 opened pass.
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, srcIP, 443, 41000, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, objs.CbTestOverlay, icmpEcho(remoteIP, srcIP, 8, 9), ovl).expect(t, tcActShot, DropPolicy)
		// An echo request from EPG 10 opens the way for its reply only.
		run(t, objs, fc, icmpEcho(srcIP, remoteIP, 8, 10), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, objs.CbTestOverlay, icmpEcho(remoteIP, srcIP, 0, 10), ovl).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, objs.CbTestOverlay, icmpEcho(remoteIP, srcIP, 0, 11), ovl).expect(t, tcActShot, DropPolicy)
	})
	t.Run("no-rules-no-conntrack", func(t *testing.T) {
		setEPG(t, objs, localIP, 99)
		defer setEPG(t, objs, localIP, 20)
		setEPG(t, objs, srcIP, 98)
		defer setEPG(t, objs, srcIP, 10)
		n := 0
		var k contivbpfCbCtKey
		var v contivbpfCbCtEntry
		it := objs.CbCt.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 42000, 22, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
		m := 0
		it = objs.CbCt.Iterate()
		for it.Next(&k, &v) {
			m++
		}
		if m != n {
			t.Errorf("conntrack grew %d → %d for a flow between groups without rules", n, m)
		}
	})
}

func TestServiceLB(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	vip, vip2, vip3 := netip.MustParseAddr("10.1.0.100"), netip.MustParseAddr("10.1.0.101"), netip.MustParseAddr("10.1.0.102")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// vip:80/tcp → local 10.1.0.3:8080; vip2:53/udp → remote 10.1.0.4:5353; vip3:80 → none.
	must(objs.CbServices.Put(&contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip), Port: nport(80), Proto: 6}, &contivbpfCbSvc{Id: 1, Count: 1, TargetPort: nport(8080)}))
	must(objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: 1, Index: 0}, &contivbpfCbBackend{Ip: ip4(localIP), Net: testNet}))
	must(objs.CbMembers.Put(&contivbpfCbMemberKey{SvcId: 1, Ip: ip4(localIP)}, &contivbpfCbMember{Net: testNet}))
	must(objs.CbServices.Put(&contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip2), Port: nport(53), Proto: 17}, &contivbpfCbSvc{Id: 2, Count: 1, TargetPort: nport(5353)}))
	must(objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: 2, Index: 0}, &contivbpfCbBackend{Ip: ip4(remoteIP), Net: testNet}))
	must(objs.CbMembers.Put(&contivbpfCbMemberKey{SvcId: 2, Ip: ip4(remoteIP)}, &contivbpfCbMember{Net: testNet}))
	must(objs.CbServices.Put(&contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip3), Port: nport(80), Proto: 6}, &contivbpfCbSvc{Id: 3}))
	for _, v := range []netip.Addr{vip, vip2, vip3} {
		must(objs.CbVips.Put(&contivbpfCbVipKey{Zone: testZone, Vip: ip4(v)}, &contivbpfCbVip{}))
	}
	fc := objs.CbFromContainer
	peer := ip4(netip.MustParseAddr(testVTEP))
	ovl := &skbCtx{CB: [5]uint32{peer, testNet}}

	t.Run("tcp-to-local-backend", func(t *testing.T) {
		r := run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpSYN, 0), nil)
		r.expect(t, tcActRedirect, FwdLocal)
		s, d, sp, dp := checkSums(t, r.out)
		if s != srcIP || d != localIP || sp != 43000 || dp != 8080 {
			t.Errorf("after DNAT %v:%d → %v:%d", s, sp, d, dp)
		}
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(localIP)) {
			t.Errorf("dst mac %x", r.out[0:6])
		}
		// Second packet of the flow follows conntrack.
		run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("udp-to-remote-backend-and-reply", func(t *testing.T) {
		r := run(t, objs, fc, l4Frame(17, srcIP, vip2, 43001, 53, 0, 0), nil)
		r.expect(t, tcActRedirect, FwdTunnel)
		s, d, sp, dp := checkSums(t, r.out)
		if s != srcIP || d != remoteIP || sp != 43001 || dp != 5353 {
			t.Errorf("after DNAT %v:%d → %v:%d", s, sp, d, dp)
		}
		r = run(t, objs, objs.CbTestOverlay, l4Frame(17, remoteIP, srcIP, 5353, 43001, 0, 0), ovl)
		r.expect(t, tcActRedirect, FwdLocal)
		s, d, sp, dp = checkSums(t, r.out)
		if s != vip2 || d != srcIP || sp != 53 || dp != 43001 {
			t.Errorf("reply after un-DNAT %v:%d → %v:%d", s, sp, d, dp)
		}
	})
	t.Run("no-backend", func(t *testing.T) {
		// A SYN is refused with ICMP (reject_test.go), a segment that opens nothing dropped.
		run(t, objs, fc, l4Frame(6, srcIP, vip3, 43002, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, RejectNoBackend)
		run(t, objs, fc, l4Frame(6, srcIP, vip3, 43002, 80, tcpACK, 0), nil).expect(t, tcActShot, DropNoBackend)
	})
	t.Run("other-port-not-balanced", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, vip, 43003, 81, tcpSYN, 0), nil).expect(t, tcActShot, DropUnknownDst)
	})
	t.Run("fragment-to-vip", func(t *testing.T) {
		p := append(ethHdr(dataplane.ContivMAC(vip), dataplane.ContivMAC(srcIP), 0x0800), ipv4Pkt(srcIP, vip, []byte{1, 2, 3}, ipOpts{fragOff: 100})...)
		run(t, objs, fc, p, nil).expect(t, tcActShot, DropFragToService)
	})
	t.Run("arp-for-vip", func(t *testing.T) {
		r := run(t, objs, fc, arpFrame(1, dataplane.ContivMAC(srcIP), srcIP, vip), nil)
		r.expect(t, tcActRedirect, ARPReply)
		if !bytes.Equal(r.out[22:28], dataplane.ContivMAC(vip)) {
			t.Errorf("vip answered with %x", r.out[22:28])
		}
	})
}

func TestRoutingMode(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ROUTING))
	const vrf, otherNet = 7, 101
	other := netip.MustParseAddr("10.3.0.5")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var n contivbpfCbNetwork
	must(objs.CbNetworks.Lookup(uint32(testNet), &n))
	n.Vrf = vrf
	must(objs.CbNetworks.Put(uint32(testNet), &n))
	must(objs.CbNetworks.Put(uint32(otherNet), &contivbpfCbNetwork{Subnet: ip4(netip.MustParseAddr("10.3.0.0")),
		Mask: ip4(netip.MustParseAddr("255.255.255.0")), Tag: otherNet, Mtu: 1450, Encap: uint8(contivbpfCbEncapCB_ENCAP_VXLAN), Vrf: vrf}))
	ep := contivbpfCbEndpoint{Ifindex: peerIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL)}
	copy(ep.Mac[:], dataplane.ContivMAC(other))
	must(objs.CbEndpoints.Put(&contivbpfCbEpKey{Net: otherNet, Ip: ip4(other)}, &ep))
	for ip, net := range map[netip.Addr]uint32{other: otherNet, localIP: testNet, srcIP: testNet, remoteIP: testNet} {
		must(objs.CbRoutes.Put(&contivbpfCbRouteKey{Vrf: vrf, Ip: ip4(ip)}, &contivbpfCbRoute{Net: net}))
	}
	fc := objs.CbFromContainer
	routed := func(t *testing.T, r runResult, dstMAC []byte) {
		t.Helper()
		r.expect(t, tcActRedirect, FwdLocal)
		if !bytes.Equal(r.out[6:12], dataplane.RouterMAC) || !bytes.Equal(r.out[0:6], dstMAC) {
			t.Errorf("macs dst %x src %x", r.out[0:6], r.out[6:12])
		}
		if r.out[14+8] != 63 {
			t.Errorf("ttl %d, want 63", r.out[22])
		}
		checkSums(t, r.out)
	}
	t.Run("other-network", func(t *testing.T) {
		routed(t, run(t, objs, fc, l4Frame(6, srcIP, other, 1000, 80, tcpSYN, 0), nil), dataplane.ContivMAC(other))
	})
	t.Run("same-network", func(t *testing.T) {
		routed(t, run(t, objs, fc, l4Frame(17, srcIP, localIP, 1000, 53, 0, 0), nil), dataplane.ContivMAC(localIP))
	})
	t.Run("ttl-1", func(t *testing.T) {
		// Answered from the sender's gateway (the router it addressed) with an ICMP time
		// exceeded quoting what it sent (Datapath v3 issue, hole 6; traceroute).
		ttl1 := func(f []byte) []byte {
			f[14+8] = 1
			f[14+10], f[14+11] = 0, 0
			binary.BigEndian.PutUint16(f[14+10:], csum(f[14:14+20], 0))
			return f
		}
		for _, in := range [][]byte{ttl1(l4Frame(6, srcIP, other, 1000, 80, tcpSYN, 0)), ttl1(l4Frame(17, srcIP, localIP, 1000, 33434, 0, 0)),
			ttl1(icmpEcho(srcIP, other, 8, 7))} {
			r := run(t, objs, fc, in, nil)
			r.expect(t, tcActRedirect, RejectTTLExceeded)
			checkGenerated(t, in, r.out, gwIP, 11, 0)
		}
		// Never answered: an ICMP error, a later fragment.
		errIn := ttl1(icmpEcho(srcIP, other, 8, 7))
		errIn[14+20] = 3 // destination unreachable
		run(t, objs, fc, errIn, nil).expect(t, tcActShot, DropTTLExceeded)
		later := ttl1(l4Frame(17, srcIP, other, 1000, 53, 0, 0))
		binary.BigEndian.PutUint16(later[14+6:], 100) // offset 800: a later fragment
		later[14+10], later[14+11] = 0, 0
		binary.BigEndian.PutUint16(later[14+10:], csum(later[14:14+20], 0))
		run(t, objs, fc, later, nil).expect(t, tcActShot, DropTTLExceeded)
	})
	t.Run("not-in-tenant", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, netip.MustParseAddr("10.4.0.1"), 1000, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropToGateway)
	})
	for name, target := range map[string]netip.Addr{"arp-same-network": localIP, "arp-other-network": other, "arp-gateway": gwIP} {
		t.Run(name, func(t *testing.T) {
			r := run(t, objs, fc, arpFrame(1, dataplane.ContivMAC(srcIP), srcIP, target), nil)
			r.expect(t, tcActRedirect, ARPReply)
			if !bytes.Equal(r.out[22:28], dataplane.RouterMAC) {
				t.Errorf("answered %x, want the router MAC", r.out[22:28])
			}
		})
	}
	t.Run("overlay-src-from-other-network", func(t *testing.T) {
		// A packet routed at the sender arrives in the destination's VNI; its source is
		// found through the tenant's routes (here: a local address, so it is spoofed).
		peer := ip4(netip.MustParseAddr(testVTEP))
		run(t, objs, objs.CbTestOverlay, l4Frame(6, srcIP, other, 1, 2, tcpSYN, 0), &skbCtx{CB: [5]uint32{peer, otherNet}}).expect(t, tcActShot, DropRemoteSrc)
		run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, other, 1, 2, tcpSYN, 0), &skbCtx{CB: [5]uint32{peer, otherNet}}).expect(t, tcActRedirect, FwdLocal)
	})
}

const ipMF = 0x2000 // IPv4 "more fragments"

// firstFrag is l4Frame as the first fragment (MF set, offset 0) of datagram id.
func firstFrag(proto uint8, src, dst netip.Addr, sport, dport uint16, flags uint8, id uint16) []byte {
	return setIPID(l4Frame(proto, src, dst, sport, dport, flags, ipMF), id)
}

// laterFrag is a non-first fragment (offset 3 × 8 bytes, no L4 header) of datagram id.
func laterFrag(proto uint8, src, dst netip.Addr, id uint16) []byte {
	ip := ipv4Pkt(src, dst, bytes.Repeat([]byte{0xcd}, 24), ipOpts{fragOff: 3})
	ip[9] = proto
	return setIPID(append(ethHdr(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), 0x0800), ip...), id)
}

func setIPID(f []byte, id uint16) []byte {
	binary.BigEndian.PutUint16(f[14+4:], id)
	binary.BigEndian.PutUint16(f[14+10:], 0)
	binary.BigEndian.PutUint16(f[14+10:], csum(f[14:14+20], 0))
	return f
}

func countFrags(t *testing.T, objs *contivbpfObjects) int {
	t.Helper()
	var (
		k contivbpfCbFragKey
		v contivbpfCbFragEntry
		n int
	)
	it := objs.CbFrags.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPolicyFragments: non-first fragments carry no ports, so they inherit the verdict of
// their datagram's first fragment (cb_frags); without one they are dropped.
func TestPolicyFragments(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 10)
	setEPG(t, objs, localIP, 20)
	setEPG(t, objs, remoteIP, 30)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "no-dns-in", Priority: 7, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionDeny},
	}})
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-out", Priority: 3, Ingress: false, Remote: netip.MustParsePrefix("10.1.0.4/32"), Proto: 17, Action: dataplane.ActionDeny},
		{ID: "no-30-in", Priority: 9, Ingress: true, RemoteEPG: 30, Action: dataplane.ActionDeny},
	}})
	fc := objs.CbFromContainer
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}

	t.Run("first-allowed-later-allowed", func(t *testing.T) {
		run(t, objs, fc, firstFrag(17, srcIP, localIP, 40000, 9999, 0, 0x1001), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x1001), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x1001), nil).expect(t, tcActRedirect, FwdLocal)
		// TCP too, and across the overlay (an allowed reply's fragments).
		run(t, objs, fc, firstFrag(6, srcIP, localIP, 40001, 80, tcpSYN, 0x1002), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, laterFrag(6, srcIP, localIP, 0x1002), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("first-denied-later-dropped", func(t *testing.T) {
		// Ingress deny of the destination group.
		run(t, objs, fc, firstFrag(17, srcIP, localIP, 40002, 53, 0, 0x2001), nil).expect(t, tcActShot, DropPolicy)
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x2001), nil).expect(t, tcActShot, DropPolicy)
		// Egress deny of the source group.
		run(t, objs, fc, firstFrag(17, srcIP, remoteIP, 40003, 9999, 0, 0x2002), nil).expect(t, tcActShot, DropPolicy)
		run(t, objs, fc, laterFrag(17, srcIP, remoteIP, 0x2002), nil).expect(t, tcActShot, DropPolicy)
		// From another host: EPG 30 may not reach EPG 10.
		run(t, objs, objs.CbTestOverlay, firstFrag(17, remoteIP, srcIP, 5000, 9999, 0, 0x2003), ovl).expect(t, tcActShot, DropPolicy)
		run(t, objs, objs.CbTestOverlay, laterFrag(17, remoteIP, srcIP, 0x2003), ovl).expect(t, tcActShot, DropPolicy)
	})
	t.Run("reply-fragments", func(t *testing.T) {
		// EPG 10 opens a flow to EPG 30; the fragmented reply passes (conntrack), its
		// later fragments with it; an unrelated datagram from EPG 30 does not.
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, objs.CbTestOverlay, firstFrag(6, remoteIP, srcIP, 443, 41000, tcpACK, 0x3001), ovl).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, objs.CbTestOverlay, laterFrag(6, remoteIP, srcIP, 0x3001), ovl).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, objs.CbTestOverlay, laterFrag(6, remoteIP, srcIP, 0x3002), ovl).expect(t, tcActShot, DropFragNoFirst)
	})
	t.Run("orphan", func(t *testing.T) {
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x4001), nil).expect(t, tcActShot, DropFragNoFirst)
		// The record is per (src, dst, id, proto): same id, other protocol or direction.
		run(t, objs, fc, laterFrag(6, srcIP, localIP, 0x1001), nil).expect(t, tcActShot, DropFragNoFirst)
		run(t, objs, objs.CbTestOverlay, laterFrag(17, remoteIP, srcIP, 0x1001), ovl).expect(t, tcActShot, DropFragNoFirst)
		// An expired record counts as none.
		k := contivbpfCbFragKey{Saddr: ip4(srcIP), Daddr: ip4(localIP), Id: binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, 0x4002)), Proto: 17}
		if err := objs.CbFrags.Put(&k, &contivbpfCbFragEntry{Expires: 1, Allowed: 1}); err != nil {
			t.Fatal(err)
		}
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x4002), nil).expect(t, tcActShot, DropFragNoFirst)
	})
	t.Run("malformed", func(t *testing.T) {
		// A first fragment with a truncated UDP header is dropped and records nothing.
		p := firstFrag(17, srcIP, localIP, 40004, 9999, 0, 0x5001)
		p = p[:14+20+4]
		binary.BigEndian.PutUint16(p[16:], 24)
		setIPID(p, 0x5001)
		run(t, objs, fc, p, nil).expect(t, tcActShot, DropMalformedL4)
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x5001), nil).expect(t, tcActShot, DropFragNoFirst)
		// A later fragment whose total length exceeds the packet never reaches policy.
		q := laterFrag(17, srcIP, localIP, 0x1001)
		binary.BigEndian.PutUint16(q[16:], 200)
		run(t, objs, fc, q, nil).expect(t, tcActShot, DropMalformedIP)
		// IHL < 5.
		r := laterFrag(17, srcIP, localIP, 0x1001)
		r[14] = 0x44
		run(t, objs, fc, r, nil).expect(t, tcActShot, DropMalformedIP)
	})
	t.Run("no-policy-unchanged", func(t *testing.T) {
		// Groups without rules: fragments pass as before and the table stays untouched.
		setEPG(t, objs, localIP, 99)
		defer setEPG(t, objs, localIP, 20)
		setEPG(t, objs, srcIP, 98)
		defer setEPG(t, objs, srcIP, 10)
		n := countFrags(t, objs)
		run(t, objs, fc, laterFrag(17, srcIP, localIP, 0x6001), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, firstFrag(17, srcIP, localIP, 40005, 53, 0, 0x6002), nil).expect(t, tcActRedirect, FwdLocal)
		if m := countFrags(t, objs); m != n {
			t.Errorf("cb_frags grew %d → %d for groups without rules", n, m)
		}
		// Policy feature off entirely (no policy on the host): same.
		setFeatures(t, objs, 0)
		defer setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
		setEPG(t, objs, srcIP, 10)
		run(t, objs, fc, laterFrag(17, srcIP, remoteIP, 0x6003), nil).expect(t, tcActRedirect, FwdTunnel)
	})
}
