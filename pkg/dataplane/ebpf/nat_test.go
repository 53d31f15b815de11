package ebpf

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

const tcxNext = 0xffffffff // CB_TCX_NEXT as the run's return value

var (
	hostIP  = netip.MustParseAddr("192.168.0.1") // the fixture host's address (egress NAT source)
	worldIP = netip.MustParseAddr("198.51.100.7")
)

// natFixture is loadTestObjects with egress NAT on: snat_ip 192.168.0.1 out of ifindex 1,
// ports 61000..61000+ports-1, network 100 with CB_NET_SNAT, 192.168.0.1 a host address.
func natFixture(t *testing.T, ports uint16) *contivbpfObjects {
	t.Helper()
	objs := loadTestObjects(t, contivbpfProgCbFromUplink)
	var cfg contivbpfCbConfig
	if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.SnatIp = ip4(hostIP)
	cfg.EgressIfindex = loIfindex
	cfg.SnatPortMin = 61000
	cfg.SnatPortMax = 61000 + ports - 1
	if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	var n contivbpfCbNetwork
	if err := objs.CbNetworks.Lookup(uint32(testNet), &n); err != nil {
		t.Fatal(err)
	}
	n.Flags |= uint8(contivbpfCbNetFlagsCB_NET_SNAT)
	if err := objs.CbNetworks.Put(uint32(testNet), &n); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbHostIps.Put(ip4(hostIP), &contivbpfCbHostIp{}); err != nil {
		t.Fatal(err)
	}
	return objs
}

// egressOut sends a TCP/UDP packet from the fixture endpoint and returns the NAT port it got.
func egressOut(t *testing.T, objs *contivbpfObjects, proto uint8, sport, dport uint16, flags uint8) uint16 {
	t.Helper()
	r := run(t, objs, objs.CbFromContainer, l4Frame(proto, srcIP, worldIP, sport, dport, flags, 0), nil)
	r.expect(t, tcActRedirect, FwdEgress)
	src, dst, nport, dp := checkSums(t, r.out)
	if src != hostIP || dst != worldIP || dp != dport {
		t.Fatalf("egress packet %v:%d → %v:%d", src, nport, dst, dp)
	}
	if nport < 61000 {
		t.Fatalf("nat port %d outside the range", nport)
	}
	if ttl := r.out[14+8]; ttl != 63 {
		t.Errorf("ttl %d, want 63 (routed)", ttl)
	}
	return nport
}

func TestEgressNAT(t *testing.T) {
	objs := natFixture(t, 64)
	up := objs.CbFromUplink

	p := egressOut(t, objs, 6, 40000, 443, 0x02)
	t.Run("same-flow-same-port", func(t *testing.T) {
		if q := egressOut(t, objs, 6, 40000, 443, 0x02); q != p {
			t.Errorf("retransmitted SYN got port %d, first %d", q, p)
		}
	})
	t.Run("reply", func(t *testing.T) {
		// The SYN-ACK acknowledges the SYN (sequence number 0): the flow is established.
		r := run(t, objs, up, withSeq(l4Frame(6, worldIP, hostIP, 443, p, 0x12, 0), 9000, 1), nil)
		r.expect(t, tcActRedirect, FwdEgressReply)
		src, dst, sport, dport := checkSums(t, r.out)
		if src != worldIP || dst != srcIP || sport != 443 || dport != 40000 {
			t.Errorf("reply %v:%d → %v:%d", src, sport, dst, dport)
		}
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(srcIP)) || !bytes.Equal(r.out[6:12], dataplane.RouterMAC) {
			t.Errorf("macs dst %x src %x", r.out[0:6], r.out[6:12])
		}
		var k contivbpfCbSnatKey
		var e contivbpfCbSnatEntry
		it := objs.CbSnat.Iterate()
		for it.Next(&k, &e) {
			if e.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) {
				t.Errorf("state %d after the reply, want established", e.State)
			}
		}
	})
	t.Run("established-ack-passes", func(t *testing.T) {
		if q := egressOut(t, objs, 6, 40000, 443, 0x10); q != p {
			t.Errorf("ACK got port %d, want %d", q, p)
		}
	})
	t.Run("bare-ack-opens-nothing", func(t *testing.T) {
		run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, worldIP, 40001, 443, 0x10, 0), nil).expect(t, tcActShot, DropEgressNoFlow)
		run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, worldIP, 40001, 443, 0x12, 0), nil).expect(t, tcActShot, DropEgressNoFlow)
	})
	t.Run("reply-to-unknown-port-is-the-hosts", func(t *testing.T) {
		r := run(t, objs, up, l4Frame(6, worldIP, hostIP, 443, 61000+((p-61000+1)%64), 0x12, 0), nil)
		if r.ret != tcxNext || len(r.diff) != 0 {
			t.Errorf("verdict %#x reasons %v, want tcx next and no counter", r.ret, r.diff)
		}
		// From another remote address or port: not this flow's reply.
		for _, f := range [][]byte{l4Frame(6, remoteIP, hostIP, 443, p, 0x12, 0), l4Frame(6, worldIP, hostIP, 444, p, 0x12, 0), l4Frame(17, worldIP, hostIP, 443, p, 0, 0)} {
			if r := run(t, objs, up, f, nil); r.ret != tcxNext {
				t.Errorf("verdict %#x, want tcx next", r.ret)
			}
		}
	})
	t.Run("underlay-to-endpoint-dropped", func(t *testing.T) {
		if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
			t.Fatal(err)
		}
		defer objs.CbHostRoutes.Delete(ip4(srcIP))
		run(t, objs, up, l4Frame(6, worldIP, srcIP, 443, 40000, 0x12, 0), nil).expect(t, tcActShot, DropUplinkToEndpoint)
	})
	t.Run("fin-closes", func(t *testing.T) {
		egressOut(t, objs, 6, 40000, 443, 0x11)
		var k contivbpfCbSnatKey
		var e contivbpfCbSnatEntry
		it := objs.CbSnat.Iterate()
		for it.Next(&k, &e) {
			if e.State != uint8(contivbpfCbCtStateCB_CTS_CLOSING) {
				t.Errorf("state %d after FIN, want closing", e.State)
			}
		}
	})
	t.Run("udp-and-two-sources-same-port", func(t *testing.T) {
		a := egressOut(t, objs, 17, 5353, 53, 0)
		setZone(t, objs, testZone+1) // another tenant, same address and port
		b := egressOut(t, objs, 17, 5353, 53, 0)
		setZone(t, objs, testZone)
		if a == b {
			t.Fatalf("two tenants' identical flows share NAT port %d", a)
		}
		for _, port := range []uint16{a, b} {
			r := run(t, objs, up, l4Frame(17, worldIP, hostIP, 53, port, 0, 0), nil)
			r.expect(t, tcActRedirect, FwdEgressReply)
			if _, dst, _, dport := checkSums(t, r.out); dst != srcIP || dport != 5353 {
				t.Errorf("reply to %d delivered to %v:%d", port, dst, dport)
			}
		}
		var rk contivbpfCbSnatRkey
		var rv contivbpfCbSnatRval
		zones := map[uint32]uint16{}
		it := objs.CbSnatRev.Iterate()
		for it.Next(&rk, &rv) {
			if rk.Proto == 17 {
				zones[rv.Zone] = hport(rk.NatPort)
			}
		}
		if zones[testZone] != a || zones[testZone+1] != b {
			t.Errorf("reply mappings by zone %v, want %d and %d", zones, a, b)
		}
	})
}

func TestEgressICMP(t *testing.T) {
	objs := natFixture(t, 64)
	r := run(t, objs, objs.CbFromContainer, icmpEcho(srcIP, worldIP, 8, 0x1234), nil)
	r.expect(t, tcActRedirect, FwdEgress)
	ip := r.out[14:]
	if netip.AddrFrom4([4]byte(ip[12:16])) != hostIP || csum(ip[:20], 0) != 0 || csum(ip[20:36], 0) != 0 {
		t.Fatalf("echo out: src %v, checksums ip %#x icmp %#x", netip.AddrFrom4([4]byte(ip[12:16])), csum(ip[:20], 0), csum(ip[20:36], 0))
	}
	id := binary.BigEndian.Uint16(ip[24:])
	if id < 61000 {
		t.Fatalf("echo id %d not from the NAT range", id)
	}
	t.Run("reply", func(t *testing.T) {
		r := run(t, objs, objs.CbFromUplink, icmpEcho(worldIP, hostIP, 0, id), nil)
		r.expect(t, tcActRedirect, FwdEgressReply)
		ip := r.out[14:]
		if netip.AddrFrom4([4]byte(ip[16:20])) != srcIP || binary.BigEndian.Uint16(ip[24:]) != 0x1234 || csum(ip[:20], 0) != 0 || csum(ip[20:36], 0) != 0 {
			t.Errorf("echo reply in: dst %v id %#x", netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(ip[24:]))
		}
	})
	t.Run("error-about-udp-flow", func(t *testing.T) {
		p := egressOut(t, objs, 17, 7000, 9999, 0)
		router := netip.MustParseAddr("203.0.113.1")
		r := run(t, objs, objs.CbFromUplink, icmpError(router, hostIP, 3, hostIP, worldIP, p, 9999), nil)
		r.expect(t, tcActRedirect, FwdEgressReply)
		src, _, qsrc, q := quoteOf(t, r.out) // the quoted UDP checksum follows too
		if src != router || q != netip.AddrPortFrom(worldIP, 9999) || qsrc != netip.AddrPortFrom(srcIP, 7000) {
			t.Errorf("error delivered: from %v quoting %v → %v", src, qsrc, q)
		}
		if dst := netip.AddrFrom4([4]byte(r.out[14+16 : 14+20])); dst != srcIP {
			t.Errorf("error delivered to %v", dst)
		}
	})
	t.Run("error-about-echo", func(t *testing.T) {
		// Time exceeded about the echo as it left (from the host's address, the NAT id):
		// back to the endpoint about its own echo, the quoted echo's checksum fixed.
		quote := icmpEcho(hostIP, worldIP, 8, id)[14 : 14+20+8]
		router := netip.MustParseAddr("203.0.113.1")
		r := run(t, objs, objs.CbFromUplink, icmpErrorQuoting(router, hostIP, 11, quote), nil)
		r.expect(t, tcActRedirect, FwdEgressReply)
		src, q := checkICMPError(t, r.out)
		inner := r.out[14+20+8:]
		if src != router || q.Addr() != worldIP || netip.AddrFrom4([4]byte(inner[12:16])) != srcIP || binary.BigEndian.Uint16(inner[24:]) != 0x1234 {
			t.Errorf("error delivered: from %v quoting %v → %v id %#x", src, netip.AddrFrom4([4]byte(inner[12:16])), q.Addr(), binary.BigEndian.Uint16(inner[24:]))
		}
		if want := icmpEcho(srcIP, worldIP, 8, 0x1234)[14+20+2 : 14+20+4]; inner[22] != want[0] || inner[23] != want[1] {
			t.Errorf("quoted echo checksum %x, want %x", inner[22:24], want)
		}
	})
	t.Run("error-about-nothing-is-the-hosts", func(t *testing.T) {
		r := run(t, objs, objs.CbFromUplink, icmpError(worldIP, hostIP, 3, hostIP, worldIP, 33333, 9999), nil)
		if r.ret != tcxNext {
			t.Errorf("verdict %#x, want tcx next", r.ret)
		}
	})
}

func TestEgressEdges(t *testing.T) {
	objs := natFixture(t, 4)
	fc := objs.CbFromContainer
	t.Run("port-range-exhausted", func(t *testing.T) {
		for i := range 4 {
			egressOut(t, objs, 6, uint16(41000+i), 80, 0x02)
		}
		run(t, objs, fc, l4Frame(6, srcIP, worldIP, 41010, 80, 0x02, 0), nil).expect(t, tcActShot, DropEgressNoPort)
		// Another destination port is another reply key space.
		egressOut(t, objs, 6, 41010, 81, 0x02)
	})
	t.Run("fragments", func(t *testing.T) {
		run(t, objs, fc, l4Frame(17, srcIP, worldIP, 5000, 53, 0, 0x2000), nil).expect(t, tcActShot, DropEgressUnsupported)
		run(t, objs, fc, laterFrag(17, srcIP, worldIP, 9), nil).expect(t, tcActShot, DropEgressUnsupported)
	})
	t.Run("other-protocols", func(t *testing.T) {
		f := ipFrame(srcIP, worldIP, ipOpts{})
		f[14+9] = 47 // GRE
		run(t, objs, fc, f, nil).expect(t, tcActShot, DropEgressUnsupported)
	})
	t.Run("invalid-destinations", func(t *testing.T) {
		for _, d := range []string{"255.255.255.255", "224.0.0.251", "127.0.0.1", "0.1.2.3"} {
			run(t, objs, fc, l4Frame(17, srcIP, netip.MustParseAddr(d), 5000, 53, 0, 0), nil).expect(t, tcActShot, DropEgressInvalidDst)
		}
	})
	t.Run("to-host", func(t *testing.T) {
		toHost := l4Frame(6, srcIP, hostIP, 40000, 10250, 0x02, 0)
		// Only from the veth the host routes the source address to (overlapping tenants).
		run(t, objs, fc, toHost, nil).expect(t, tcActShot, DropHostNoRoute)
		if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: peerIfindex}); err != nil {
			t.Fatal(err)
		}
		run(t, objs, fc, toHost, nil).expect(t, tcActShot, DropHostNoRoute)
		if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
			t.Fatal(err)
		}
		r := run(t, objs, fc, toHost, nil)
		r.expect(t, 0, FwdHost)
		if src, dst, _, _ := checkSums(t, r.out); src != srcIP || dst != hostIP {
			t.Errorf("host packet rewritten: %v → %v", src, dst)
		}
	})
	t.Run("gateway-ping", func(t *testing.T) {
		r := run(t, objs, fc, icmpEcho(srcIP, gwIP, 8, 77), nil)
		r.expect(t, tcActRedirect, ICMPGatewayReply)
		ip := r.out[14:]
		if ip[20] != 0 || netip.AddrFrom4([4]byte(ip[12:16])) != gwIP || netip.AddrFrom4([4]byte(ip[16:20])) != srcIP || csum(ip[20:36], 0) != 0 || csum(ip[:20], 0) != 0 {
			t.Errorf("gateway reply %x", ip[:36])
		}
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(srcIP)) || !bytes.Equal(r.out[6:12], dataplane.RouterMAC) {
			t.Errorf("macs dst %x src %x", r.out[0:6], r.out[6:12])
		}
		run(t, objs, fc, l4Frame(6, srcIP, gwIP, 40000, 22, 0x02, 0), nil).expect(t, tcActShot, DropToGateway)
	})
	t.Run("snat-off", func(t *testing.T) {
		var n contivbpfCbNetwork
		if err := objs.CbNetworks.Lookup(uint32(testNet), &n); err != nil {
			t.Fatal(err)
		}
		n.Flags = 0
		if err := objs.CbNetworks.Put(uint32(testNet), &n); err != nil {
			t.Fatal(err)
		}
		run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40000, 443, 0x02, 0), nil).expect(t, tcActShot, DropToGateway)
		// The host stays reachable.
		run(t, objs, fc, l4Frame(6, srcIP, hostIP, 40000, 10250, 0x02, 0), nil).expect(t, 0, FwdHost)
	})
}

// Policy decides egress before NAT state exists; replies pass on the flow's entry even
// when the endpoint's group denies everything inbound.
func TestEgressPolicy(t *testing.T) {
	objs := natFixture(t, 64)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-in", Priority: 1, Ingress: true, Action: dataplane.ActionDeny},
		{ID: "deny-out", Priority: 1, Action: dataplane.ActionDeny},
		{ID: "dns", Priority: 10, Proto: 17, Port: 53, Remote: netip.MustParsePrefix("198.51.100.0/24"), Action: dataplane.ActionAllow},
	}})
	run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, worldIP, 40000, 443, 0x02, 0), nil).expect(t, tcActShot, DropPolicy)
	if n := countEntries(t, objs.CbSnat); n != 0 {
		t.Errorf("%d NAT entries after a denied flow", n)
	}
	p := egressOut(t, objs, 17, 5000, 53, 0)
	r := run(t, objs, objs.CbFromUplink, l4Frame(17, worldIP, hostIP, 53, p, 0, 0), nil)
	r.expect(t, tcActRedirect, FwdEgressReply)
	// Unsolicited traffic to a NAT port of that flow from elsewhere never matches it.
	if r := run(t, objs, objs.CbFromUplink, l4Frame(17, remoteIP, hostIP, 53, p, 0, 0), nil); r.ret != tcxNext {
		t.Errorf("verdict %#x for a stranger", r.ret)
	}
}

func TestEgressNATGC(t *testing.T) {
	objs := natFixture(t, 64)
	g := natGC{flows: objs.CbSnat, replies: objs.CbSnatRev}
	egressOut(t, objs, 17, 5000, 53, 0)
	egressOut(t, objs, 6, 40000, 443, 0x02)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	if del, live, err := g.sweep(now, nil); err != nil || del != 0 || live != 2 {
		t.Fatalf("fresh flows: deleted %d live %d err %v", del, live, err)
	}
	// UDP and TCP-new both time out after 60 s.
	if del, live, err := g.sweep(now+uint64(61e9), nil); err != nil || del != 2 || live != 0 {
		t.Fatalf("after the timeout: deleted %d live %d err %v", del, live, err)
	}
	if n, m := countEntries(t, objs.CbSnat), countEntries(t, objs.CbSnatRev); n != 0 || m != 0 {
		t.Errorf("left %d flows and %d reply mappings", n, m)
	}
	// An endpoint's flush takes its flows at once.
	egressOut(t, objs, 17, 5001, 53, 0)
	if del, _, err := g.sweep(now, map[ctFlush]bool{{testZone, ip4(srcIP)}: true}); err != nil || del != 1 {
		t.Fatalf("flush: deleted %d err %v", del, err)
	}
	if m := countEntries(t, objs.CbSnatRev); m != 0 {
		t.Errorf("flush left %d reply mappings", m)
	}
}

// A tagged frame on an uplink that is also the egress device is a VLAN network's, never
// an egress reply or an underlay packet for an endpoint.
func TestEgressUplinkIgnoresTagged(t *testing.T) {
	objs := natFixture(t, 64)
	if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
		t.Fatal(err)
	}
	for _, f := range [][]byte{vlanTag(l4Frame(6, remoteIP, srcIP, 443, 40000, 0x12, 0), 100), vlanTag(l4Frame(6, worldIP, hostIP, 443, 61000, 0x12, 0), 100)} {
		if r := run(t, objs, objs.CbFromUplink, f, nil); r.ret != tcxNext || len(r.diff) != 0 {
			t.Errorf("tagged frame: verdict %#x reasons %v, want tcx next", r.ret, r.diff)
		}
	}
}

// A new TCP flow may take the port of a closing one (FIN or RST seen) when no port is
// free, as the kernel reuses TIME_WAIT tuples; the closing flow's stragglers find no flow.
// Never an established flow's port, never for UDP.
func TestEgressReuseClosingPort(t *testing.T) {
	objs := natFixture(t, 1)
	fc := objs.CbFromContainer
	p := egressOut(t, objs, 6, 40000, 443, 0x02)
	// (The SYN-ACKs acknowledge the SYN: l4Frame's sequence numbers are 0.)
	synAck := func() []byte { return withSeq(l4Frame(6, worldIP, hostIP, 443, p, 0x12, 0), 9000, 1) }
	run(t, objs, objs.CbFromUplink, synAck(), nil).expect(t, tcActRedirect, FwdEgressReply)
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40001, 443, 0x02, 0), nil).expect(t, tcActShot, DropEgressNoPort) // established: kept
	egressOut(t, objs, 6, 40000, 443, 0x11)                                                                       // FIN: closing
	run(t, objs, fc, l4Frame(17, srcIP, worldIP, 40001, 443, 0, 0), nil)                                          // other protocol: own key space
	if q := egressOut(t, objs, 6, 40001, 443, 0x02); q != p {
		t.Fatalf("new flow got port %d, want the closing flow's %d", q, p)
	}
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40000, 443, 0x10, 0), nil).expect(t, tcActShot, DropEgressNoFlow)
	r := run(t, objs, objs.CbFromUplink, synAck(), nil)
	r.expect(t, tcActRedirect, FwdEgressReply)
	if _, _, _, dport := checkSums(t, r.out); dport != 40001 {
		t.Errorf("reply to the reused port went to port %d, want the new flow's 40001", dport)
	}
}

// UDP to the gateway's port 53 goes to the agent's DNS responder (cb_config.dns_ip), port
// kept; nothing else to the gateway does, and without a responder nothing does.
func TestDNSRedirect(t *testing.T) {
	objs := natFixture(t, 64)
	fc := objs.CbFromContainer
	q := l4Frame(17, srcIP, gwIP, 5000, 53, 0, 0)
	run(t, objs, fc, q, nil).expect(t, tcActShot, DropToGateway)
	var cfg contivbpfCbConfig
	if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.DnsIp = ip4(hostIP)
	if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	r := run(t, objs, fc, q, nil)
	r.expect(t, 0, FwdDNS)
	if src, dst, sport, dport := checkSums(t, r.out); src != srcIP || dst != hostIP || sport != 5000 || dport != 53 {
		t.Errorf("query rewritten to %v:%d -> %v:%d, want %v:5000 -> %v:53", src, sport, dst, dport, srcIP, hostIP)
	}
	for _, f := range [][]byte{l4Frame(6, srcIP, gwIP, 5000, 53, 0x02, 0), l4Frame(17, srcIP, gwIP, 5000, 54, 0, 0), l4Frame(17, srcIP, gwIP, 5000, 53, 0, 0x2000)} {
		run(t, objs, fc, f, nil).expect(t, tcActShot, DropToGateway)
	}
}

// Node ports: from outside to the host's address and node port, balanced to a local
// backend with the client's address kept; the backend's reply leaves from the host's
// address and node port. A remote backend is not served yet; other ports are the host's.
func TestNodePort(t *testing.T) {
	objs, vip := nodePortFixture(t, 6, 80, 8080, 30080)
	up := objs.CbFromUplink
	r := run(t, objs, up, l4Frame(6, worldIP, hostIP, 5555, 30080, 0x02, 0), nil)
	r.expect(t, tcActRedirect, FwdNodePort)
	if src, dst, sport, dport := checkSums(t, r.out); src != worldIP || dst != srcIP || sport != 5555 || dport != 8080 {
		t.Errorf("delivered %v:%d -> %v:%d, want the client's address to the backend %v:8080", src, sport, dst, dport, srcIP)
	}
	if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(srcIP)) || r.out[14+8] != 63 {
		t.Errorf("dst mac %x ttl %d", r.out[0:6], r.out[14+8])
	}
	// The backend's reply.
	r = run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, worldIP, 8080, 5555, 0x12, 0), nil)
	r.expect(t, tcActRedirect, FwdNodePortReply)
	if src, dst, sport, dport := checkSums(t, r.out); src != hostIP || dst != worldIP || sport != 30080 || dport != 5555 {
		t.Errorf("reply %v:%d -> %v:%d, want %v:30080 -> the client", src, sport, dst, dport, hostIP)
	}
	// The rest of the connection follows.
	run(t, objs, up, l4Frame(6, worldIP, hostIP, 5555, 30080, 0x10, 0), nil).expect(t, tcActRedirect, FwdNodePort)
	// A VIP of the tenant at the outside client's address does not swallow the node port
	// flow's replies; anything else to that VIP goes nowhere.
	putTestService(t, objs, 2, worldIP, 53, 17, 53, srcIP)
	run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, worldIP, 8080, 5555, 0x10, 0), nil).expect(t, tcActRedirect, FwdNodePortReply)
	run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, worldIP, 8080, 5599, 0x02, 0), nil).expect(t, tcActShot, DropUnknownDst)
	// Other ports and protocols are the host's.
	for _, f := range [][]byte{l4Frame(6, worldIP, hostIP, 5555, 30081, 0x02, 0), l4Frame(17, worldIP, hostIP, 5555, 30080, 0, 0)} {
		if r := run(t, objs, up, f, nil); r.ret != tcxNext {
			t.Errorf("verdict %#x, want the host's", r.ret)
		}
	}
	// A backend on another host: through the overlay from this host's address; its reply
	// comes back through the overlay and leaves from the node port.
	putTestService(t, objs, 1, vip, 80, 6, 8080, remoteIP)
	r = run(t, objs, up, l4Frame(6, worldIP, hostIP, 5556, 30080, 0x02, 0), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	src, dst, natPort, dport := checkSums(t, r.out)
	if src != hostIP || dst != remoteIP || dport != 8080 || natPort < 61000 {
		t.Fatalf("to the remote backend %v:%d -> %v:%d, want %v:<nat port> -> %v:8080", src, natPort, dst, dport, hostIP, remoteIP)
	}
	// No local owner: the flow counts in the host's total of flows opened from outside.
	if e, ok := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, remoteIP, 5556, 8080); !ok || e.Owner != ownerIn {
		t.Errorf("the remote backend's flow entry %+v (found %v), want owner %#x (the total alone)", e, ok, ownerIn)
	}
	fromPeer := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	r = run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, hostIP, 8080, natPort, 0x12, 0), fromPeer)
	r.expect(t, tcActRedirect, FwdNodePortReply)
	if src, dst, sport, dport := checkSums(t, r.out); src != hostIP || dst != worldIP || sport != 30080 || dport != 5556 {
		t.Errorf("remote reply %v:%d -> %v:%d, want %v:30080 -> the client :5556", src, sport, dst, dport, hostIP)
	}
	// Only that backend's reply: another remote endpoint cannot answer in its place.
	run(t, objs, objs.CbTestOverlay, l4Frame(6, orphanIP, hostIP, 8080, natPort, 0x12, 0), fromPeer).expect(t, tcActShot, DropOverlaySpoof)
	r = run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, hostIP, 8081, natPort, 0x12, 0), fromPeer)
	r.expect(t, tcActShot, DropUnknownDst)
}

// nodePortFixture: egress NAT, LB and node ports on, service VIP:port (proto) → srcIP:target
// with node port nodePort; returns the VIP.
func nodePortFixture(t *testing.T, proto uint8, port, target, nodePort uint16) (*contivbpfObjects, netip.Addr) {
	t.Helper()
	objs := natFixture(t, 64)
	vip := netip.MustParseAddr("10.1.0.100")
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_NODEPORT))
	putTestService(t, objs, 1, vip, port, proto, target, srcIP)
	if err := objs.CbNodeports.Put(&contivbpfCbNpKey{Port: nport(nodePort), Proto: proto}, &contivbpfCbNp{Zone: testZone, Vip: ip4(vip), SvcPort: nport(port)}); err != nil {
		t.Fatal(err)
	}
	return objs, vip
}

// ICMP errors of node port flows with a local backend: the backend's about the client's
// datagram leaves from the host's address quoting what the client sent to the node port;
// one from outside about a reply (a router's, the client's) reaches the backend quoting
// the reply as the backend sent it. The client's own error is related to the flow; a
// router's is judged like any packet from outside. Errors about no node port flow are the
// host's.
func TestNodePortICMP(t *testing.T) {
	objs, _ := nodePortFixture(t, 17, 53, 5353, 30053)
	router := netip.MustParseAddr("203.0.113.1")
	up, fc := objs.CbFromUplink, objs.CbFromContainer
	run(t, objs, up, l4Frame(17, worldIP, hostIP, 5555, 30053, 0, 0), nil).expect(t, tcActRedirect, FwdNodePort)

	// forwarded runs ICMP error pkt through prog and wants it forwarded (reason) from src to
	// dst quoting qsrc → qdst, every checksum right.
	forwarded := func(prog *ebpf.Program, pkt []byte, reason Reason, src, dst netip.Addr, qsrc, qdst netip.AddrPort) {
		t.Helper()
		r := run(t, objs, prog, pkt, nil)
		r.expect(t, tcActRedirect, reason)
		if s, d, qs, qd := quoteOf(t, r.out); s != src || d != dst || qs != qsrc || qd != qdst {
			t.Errorf("error forwarded %v → %v quoting %v → %v, want %v → %v quoting %v → %v", s, d, qs, qd, src, dst, qsrc, qdst)
		}
	}
	// The backend has no socket on 5353: its port unreachable goes to the client.
	forwarded(fc, icmpError(srcIP, worldIP, 3, worldIP, srcIP, 5555, 5353), FwdNodePortReply,
		hostIP, worldIP, netip.AddrPortFrom(worldIP, 5555), netip.AddrPortFrom(hostIP, 30053))
	// Not about a node port flow (another client port): the backend's own business.
	r := run(t, objs, fc, icmpError(srcIP, worldIP, 3, worldIP, srcIP, 5556, 5353), nil)
	if r.diff[FwdNodePortReply] != 0 {
		t.Error("an error about no node port flow left as the node port's")
	}

	// A reply, then errors about it from outside.
	run(t, objs, fc, l4Frame(17, srcIP, worldIP, 5353, 5555, 0, 0), nil).expect(t, tcActRedirect, FwdNodePortReply)
	for _, from := range []netip.Addr{router, worldIP} {
		forwarded(up, icmpError(from, hostIP, 3, hostIP, worldIP, 30053, 5555), FwdNodePort,
			from, srcIP, netip.AddrPortFrom(srcIP, 5353), netip.AddrPortFrom(worldIP, 5555))
	}
	// About no live flow: another client port, another node port, not from the host's
	// address: the host's.
	for _, f := range [][]byte{
		icmpError(router, hostIP, 3, hostIP, worldIP, 30053, 5556),
		icmpError(router, hostIP, 3, hostIP, worldIP, 30054, 5555),
		icmpError(router, hostIP, 3, router, worldIP, 30053, 5555),
	} {
		if r := run(t, objs, up, f, nil); r.ret != tcxNext {
			t.Errorf("verdict %#x for an error about no node port flow, want the host's", r.ret)
		}
	}

	// The backend's group takes nothing new from outside: the client's error is its flow's
	// (related), a router's is a new packet and dropped.
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_NODEPORT|contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-in", Priority: 1, Ingress: true, Action: dataplane.ActionDeny},
		{ID: "dns", Priority: 10, Ingress: true, Proto: 17, Port: 5353, Action: dataplane.ActionAllow}}})
	run(t, objs, up, l4Frame(17, worldIP, hostIP, 5557, 30053, 0, 0), nil).expect(t, tcActRedirect, FwdNodePort)
	run(t, objs, fc, l4Frame(17, srcIP, worldIP, 5353, 5557, 0, 0), nil).expect(t, tcActRedirect, FwdNodePortReply)
	run(t, objs, up, icmpError(worldIP, hostIP, 3, hostIP, worldIP, 30053, 5557), nil).expect(t, tcActRedirect, FwdNodePort)
	run(t, objs, up, icmpError(router, hostIP, 3, hostIP, worldIP, 30053, 5557), nil).expect(t, tcActShot, DropPolicy)
	// A truncated quote is malformed, never translated.
	p := icmpError(router, hostIP, 3, hostIP, worldIP, 30053, 5557)
	p = p[:len(p)-4]
	binary.BigEndian.PutUint16(p[16:], uint16(len(p)-14))
	if r := run(t, objs, up, p, nil); r.ret == tcActRedirect {
		t.Error("a truncated error was delivered")
	}
}

// A fragmented datagram to a node port with a local backend: its later fragments follow
// the first one to the backend, and a fragmented reply's leave from the host's address;
// only behind a first fragment that passed (a lone later fragment is the host's, or
// judged as the container's egress). A remote backend takes no fragmented datagram.
func TestNodePortFragments(t *testing.T) {
	objs, vip := nodePortFixture(t, 17, 53, 5353, 30053)
	up, fc := objs.CbFromUplink, objs.CbFromContainer
	addrs := func(f []byte) (netip.Addr, netip.Addr) {
		ip := f[14:]
		if csum(ip[:20], 0) != 0 {
			t.Error("bad IP checksum")
		}
		return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	}
	// A later fragment before any first one: the host's.
	if r := run(t, objs, up, laterFrag(17, worldIP, hostIP, 7), nil); r.ret != tcxNext {
		t.Errorf("lone later fragment: verdict %#x, want the host's", r.ret)
	}
	// datagram runs the first and a later fragment of one datagram through prog: both
	// forwarded (reason) from src to dst, the first with ports sport → dport.
	datagram := func(prog *ebpf.Program, first, later []byte, reason Reason, src, dst netip.Addr, sport, dport uint16) {
		t.Helper()
		r := run(t, objs, prog, first, nil)
		r.expect(t, tcActRedirect, reason)
		if s, d, sp, dp := checkSums(t, r.out); s != src || d != dst || sp != sport || dp != dport {
			t.Errorf("first fragment %v:%d → %v:%d, want %v:%d → %v:%d", s, sp, d, dp, src, sport, dst, dport)
		}
		r = run(t, objs, prog, later, nil)
		r.expect(t, tcActRedirect, reason)
		if s, d := addrs(r.out); s != src || d != dst {
			t.Errorf("later fragment %v → %v, want %v → %v", s, d, src, dst)
		}
	}
	datagram(up, firstFrag(17, worldIP, hostIP, 5555, 30053, 0, 7), laterFrag(17, worldIP, hostIP, 7), FwdNodePort, worldIP, srcIP, 5555, 5353)
	// Another datagram (id) or another protocol: not that datagram's.
	for _, f := range [][]byte{laterFrag(17, worldIP, hostIP, 8), laterFrag(6, worldIP, hostIP, 7)} {
		if r := run(t, objs, up, f, nil); r.ret != tcxNext {
			t.Errorf("unrelated later fragment: verdict %#x, want the host's", r.ret)
		}
	}
	// The backend's fragmented reply leaves from the node port.
	datagram(fc, firstFrag(17, srcIP, worldIP, 5353, 5555, 0, 90), laterFrag(17, srcIP, worldIP, 90), FwdNodePortReply, hostIP, worldIP, 30053, 5555)
	// A later fragment of a datagram whose first one was not a node port reply: egress's
	// (which takes no fragments).
	run(t, objs, fc, laterFrag(17, srcIP, worldIP, 91), nil).expect(t, tcActShot, DropEgressUnsupported)

	// A first fragment policy drops leaves its later ones to the host.
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_NODEPORT|contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionDeny}}})
	run(t, objs, up, firstFrag(17, worldIP, hostIP, 5557, 30053, 0, 10), nil).expect(t, tcActShot, DropPolicy)
	if r := run(t, objs, up, laterFrag(17, worldIP, hostIP, 10), nil); r.ret != tcxNext {
		t.Errorf("later fragment after a denied first: verdict %#x, want the host's", r.ret)
	}

	// A remote backend: the first fragment is refused, its later ones are the host's.
	putTestService(t, objs, 1, vip, 53, 17, 5353, remoteIP)
	run(t, objs, up, firstFrag(17, worldIP, hostIP, 5556, 30053, 0, 9), nil).expect(t, tcActShot, DropNodePortNoLocal)
	if r := run(t, objs, up, laterFrag(17, worldIP, hostIP, 9), nil); r.ret != tcxNext {
		t.Errorf("later fragment after a refused first: verdict %#x, want the host's", r.ret)
	}
}

// The backend's side of a node port flow another host balanced here: the peer host's own
// address is its source; the backend's replies to that address go back through the tunnel.
// Other traffic to the peer's address still leaves by egress NAT.
func TestNodePortPeerSide(t *testing.T) {
	objs := natFixture(t, 64)
	peer := netip.MustParseAddr(testVTEP)
	fromPeer := &skbCtx{CB: [5]uint32{ip4(peer), testNet}}
	r := run(t, objs, objs.CbTestOverlay, l4Frame(6, peer, srcIP, 61007, 8080, 0x02, 0), fromPeer)
	r.expect(t, tcActRedirect, FwdLocal)
	// Another VTEP claiming to be the peer is a spoof.
	other := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr("192.168.0.99")), testNet}}
	run(t, objs, objs.CbTestOverlay, l4Frame(6, peer, srcIP, 61007, 8080, 0x02, 0), other).expect(t, tcActShot, DropUnknownPeer)
	r = run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, peer, 8080, 61007, 0x12, 0), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	if src, dst, sport, dport := checkSums(t, r.out); src != srcIP || dst != peer || sport != 8080 || dport != 61007 {
		t.Errorf("reply %v:%d -> %v:%d not sent back unchanged", src, sport, dst, dport)
	}
	// Not a reply of such a flow: the peer's address is like any other outside address.
	egressOut(t, objs, 6, 8081, 22, 0x02)
	r = run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, peer, 8080, 61008, 0x12, 0), nil)
	r.expect(t, tcActShot, DropEgressNoFlow)
}

// TestPeerHostJudged (Datapath v3 issue, hole 1): any process on a peer host can send
// VXLAN whose inner source is the peer's own address, to any endpoint of any VNI. Such a
// packet is a node port flow from outside whose client is the peer's address: the
// destination's in-rules and NetworkPolicy judge it, with state in the tenant's node port
// zone; the replies of a flow they allowed go back through the tunnel despite the group's
// "deny all out", and a refused flow leaves no peer flow record for replies.
func TestPeerHostJudged(t *testing.T) {
	objs := natFixture(t, 64)
	peer := netip.MustParseAddr(testVTEP)
	fromPeer := &skbCtx{CB: [5]uint32{ip4(peer), testNet}}
	ov, fc := objs.CbTestOverlay, objs.CbFromContainer
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NETPOL))
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-in", Priority: 1, Ingress: true, Action: dataplane.ActionDeny},
		{ID: "deny-out", Priority: 1, Action: dataplane.ActionDeny},
		{ID: "web", Priority: 10, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
	}})
	run(t, objs, ov, l4Frame(17, peer, srcIP, 61000, 7009, 0, 0), fromPeer).expect(t, tcActShot, DropPolicy)
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61001, 22, 0x02, 0), fromPeer).expect(t, tcActShot, DropPolicy)
	// A bare ACK is judged as its SYN would be: no way around "deny in".
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61002, 22, 0x10, 0), fromPeer).expect(t, tcActShot, DropPolicy)
	// The endpoint's answer to a refused flow is its own new flow: "deny all out".
	run(t, objs, fc, l4Frame(6, srcIP, peer, 22, 61001, 0x12, 0), nil).expect(t, tcActShot, DropPolicy)
	// What the in-rules allow is delivered, tracked in the node port zone, and its replies
	// go back through the tunnel.
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61003, 8080, 0x02, 0), fromPeer).expect(t, tcActRedirect, FwdLocal)
	if _, ok := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, peer, srcIP, 61003, 8080); !ok {
		t.Error("the allowed flow has no entry in the node port zone")
	}
	if _, ok := ctEntry(t, objs, testZone, 6, peer, srcIP, 61003, 8080); ok {
		t.Error("the peer's flow has an entry in the tenant's own zone")
	}
	run(t, objs, fc, l4Frame(6, srcIP, peer, 8080, 61003, 0x12, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61003, 8080, 0x10, 0), fromPeer).expect(t, tcActRedirect, FwdLocal)
	// A group that failed closed takes nothing, not even what its rules allowed.
	var st contivbpfCbEpgState
	if err := objs.CbEpgs.Lookup(uint32(7), &st); err != nil {
		t.Fatal(err)
	}
	st.Flags |= uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL)
	if err := objs.CbEpgs.Put(uint32(7), &st); err != nil {
		t.Fatal(err)
	}
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61004, 8080, 0x02, 0), fromPeer).expect(t, tcActShot, DropPolicy)
	st.Flags &^= uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL)
	if err := objs.CbEpgs.Put(uint32(7), &st); err != nil {
		t.Fatal(err)
	}
	// NetworkPolicy: a pod isolated for ingress that admits only its network's clients on
	// 8080 takes nothing from the peer's address (the tenant's zone holds its entry).
	admit8080(t, objs, netip.MustParsePrefix("10.1.0.0/24"), false)
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61005, 8080, 0x02, 0), fromPeer).expect(t, tcActShot, DropNetpol)
	admit8080(t, objs, netip.PrefixFrom(peer, 32), false)
	run(t, objs, ov, l4Frame(6, peer, srcIP, 61006, 8080, 0x02, 0), fromPeer).expect(t, tcActRedirect, FwdLocal)
}

// TestNodePortNetpol (Datapath v3 issue, hole 2): a node port flow's state lives in the
// tenant's node port zone, but its pods' NetworkPolicy is the tenant's: a backend isolated
// for ingress takes a client from the wire only when one of its rules admits it.
func TestNodePortNetpol(t *testing.T) {
	objs := natFixture(t, 64)
	vip := netip.MustParseAddr("10.1.0.100")
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_POLICY|
		contivbpfCbFeaturesCB_FEAT_NODEPORT|contivbpfCbFeaturesCB_FEAT_NETPOL))
	putTestService(t, objs, 1, vip, 80, 6, 8080, srcIP)
	if err := objs.CbNodeports.Put(&contivbpfCbNpKey{Port: nport(30080), Proto: 6}, &contivbpfCbNp{Zone: testZone, Vip: ip4(vip), SvcPort: nport(80)}); err != nil {
		t.Fatal(err)
	}
	up, fc := objs.CbFromUplink, objs.CbFromContainer
	admit8080(t, objs, netip.MustParsePrefix("10.1.0.0/24"), false)
	run(t, objs, up, l4Frame(6, worldIP, hostIP, 40000, 30080, 0x02, 0), nil).expect(t, tcActShot, DropNetpol)
	// Admitted: the client's own prefix.
	admit8080(t, objs, netip.PrefixFrom(worldIP, 32), false)
	run(t, objs, up, l4Frame(6, worldIP, hostIP, 40001, 30080, 0x02, 0), nil).expect(t, tcActRedirect, FwdNodePort)
	// Isolated for egress without rules: its replies still belong to the flow it took.
	admit8080(t, objs, netip.PrefixFrom(worldIP, 32), true)
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 8080, 40001, 0x12, 0), nil).expect(t, tcActRedirect, FwdNodePortReply)
}

// admit8080 isolates the fixture endpoint for ingress (and, with egress, for egress without
// rules) with NetworkPolicy, admitting TCP 8080 from remote only.
func admit8080(t *testing.T, objs *contivbpfObjects, remote netip.Prefix, egress bool) {
	t.Helper()
	putKPod(t, objs, testZone, srcIP, &dataplane.PodPolicy{IngressIsolated: true, EgressIsolated: egress,
		Ingress: []dataplane.PodRule{{Remote: remote, Proto: 6, PortMin: 8080, PortMax: 8080}}})
}

// A group's out-rules apply to its endpoints' traffic to the host and to DNS at the gateway
// as to any address of no group: "deny all out" closes both, an allow rule opens them.
func TestPolicyToHostAndDNS(t *testing.T) {
	objs := natFixture(t, 64)
	var cfg contivbpfCbConfig
	if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.DnsIp = ip4(hostIP)
	if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
		t.Fatal(err)
	}
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-out", Priority: 1, Action: dataplane.ActionDeny},
		{ID: "kubelet", Priority: 10, Proto: 6, Port: 10250, Remote: netip.PrefixFrom(hostIP, 32), Action: dataplane.ActionAllow},
	}})
	fc := objs.CbFromContainer
	run(t, objs, fc, l4Frame(6, srcIP, hostIP, 40000, 22, 0x02, 0), nil).expect(t, tcActShot, DropPolicy)
	run(t, objs, fc, l4Frame(6, srcIP, hostIP, 40000, 10250, 0x02, 0), nil).expect(t, 0, FwdHost)
	run(t, objs, fc, l4Frame(17, srcIP, gwIP, 5000, 53, 0, 0), nil).expect(t, tcActShot, DropPolicy)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-out", Priority: 1, Action: dataplane.ActionDeny},
		{ID: "dns", Priority: 10, Proto: 17, Port: 53, Remote: netip.PrefixFrom(gwIP, 32), Action: dataplane.ActionAllow},
	}})
	run(t, objs, fc, l4Frame(17, srcIP, gwIP, 5001, 53, 0, 0), nil).expect(t, 0, FwdDNS)
}

// From the review (attacker's pass): the findings, each as the packets that showed it.
func TestEgressAttacks(t *testing.T) {
	objs := natFixture(t, 1)
	var cfg contivbpfCbConfig
	if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.VxlanPort = nport(4789)
	if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	fc := objs.CbFromContainer
	// A container may not send a VXLAN datagram from the host's own address (it would be a
	// tunnel packet of this host on the peer: any VNI, any inner source).
	run(t, objs, fc, l4Frame(17, srcIP, netip.MustParseAddr(testVTEP), 5000, 4789, 0, 0), nil).expect(t, tcActShot, DropEgressOverlay)
	run(t, objs, fc, l4Frame(17, srcIP, worldIP, 5000, 4789, 0, 0), nil).expect(t, tcActShot, DropEgressOverlay)
	// Another tenant never takes over a closing flow's port (its late data would reach it).
	p := egressOut(t, objs, 6, 40000, 443, 0x02)
	egressOut(t, objs, 6, 40000, 443, 0x04) // RST: closing
	setZone(t, objs, testZone+1)
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40000, 443, 0x02, 0), nil).expect(t, tcActShot, DropEgressNoPort)
	setZone(t, objs, testZone)
	if q := egressOut(t, objs, 6, 40001, 443, 0x02); q != p {
		t.Errorf("the same endpoint's new SYN got %d, want its closing port %d", q, p)
	}
}

// TestNodePortSpoofedInternalSource (Datapath v3 issue, hole 4): a node port client from
// the wire claiming an address of one of the service's tenant's networks is dropped: those
// addresses live behind the tenant's veths and tunnels. Before, it matched the rules the
// tenant wrote for its own network's clients and the backend's answer was reflected to
// the real endpoint. Another tenant's addresses are outside addresses for this one.
func TestNodePortSpoofedInternalSource(t *testing.T) {
	objs := natFixture(t, 64)
	vip := netip.MustParseAddr("10.1.0.100")
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NODEPORT))
	putTestService(t, objs, 1, vip, 80, 6, 8080, srcIP)
	if err := objs.CbNodeports.Put(&contivbpfCbNpKey{Port: nport(30080), Proto: 6}, &contivbpfCbNp{Zone: testZone, Vip: ip4(vip), SvcPort: nport(80)}); err != nil {
		t.Fatal(err)
	}
	tenantNet := func(zone uint32, p string) {
		t.Helper()
		pf := netip.MustParsePrefix(p)
		k := contivbpfCbTnetKey{Prefixlen: 32 + uint32(pf.Bits()), Zone: zone, Addr: ip4(pf.Addr())}
		if err := objs.CbTenantNets.Put(&k, &contivbpfCbTnet{Net: testNet}); err != nil {
			t.Fatal(err)
		}
	}
	tenantNet(testZone, "10.1.0.0/24")
	tenantNet(testZone+1, "10.9.0.0/16")
	// The backend's group only admits its own network's clients on 8080 (not the outside).
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "deny-in", Priority: 1, Ingress: true, Action: dataplane.ActionDeny},
		{ID: "net", Priority: 10, Ingress: true, Proto: 6, Port: 8080, Remote: netip.MustParsePrefix("10.1.0.0/24"), Action: dataplane.ActionAllow},
		{ID: "world", Priority: 10, Ingress: true, Proto: 6, Port: 8080, Remote: netip.MustParsePrefix("10.9.0.0/16"), Action: dataplane.ActionAllow},
	}})
	up := objs.CbFromUplink
	// With the source of the tenant's endpoint 10.1.0.3 (and of an address of the network
	// no endpoint holds): dropped before any state.
	for _, src := range []netip.Addr{localIP, netip.MustParseAddr("10.1.0.77")} {
		run(t, objs, up, l4Frame(6, src, hostIP, 40000, 30080, 0x02, 0), nil).expect(t, tcActShot, DropNodePortInternalSrc)
	}
	var k contivbpfCbCtKey
	var v contivbpfCbCtEntry
	if it := objs.CbCt.Iterate(); it.Next(&k, &v) {
		t.Errorf("a spoofed internal client left state: %+v", k)
	}
	// Another tenant's address is an outside address here: balanced (its rule admits it).
	run(t, objs, up, l4Frame(6, netip.MustParseAddr("10.9.3.4"), hostIP, 40001, 30080, 0x02, 0), nil).expect(t, tcActRedirect, FwdNodePort)
	// Without the tenant's subnet (the network deleted), 10.1.0.3 is an outside address too.
	k0 := contivbpfCbTnetKey{Prefixlen: 56, Zone: testZone, Addr: ip4(netip.MustParseAddr("10.1.0.0"))}
	if err := objs.CbTenantNets.Delete(&k0); err != nil {
		t.Fatal(err)
	}
	run(t, objs, up, l4Frame(6, localIP, hostIP, 40002, 30080, 0x02, 0), nil).expect(t, tcActRedirect, FwdNodePort)
}

// TestOverlayInSkipsEgress: a tunnel packet on the egress device (UDP to the overlay's
// port at the VTEP or the NAT address) goes to the host, and so to the vxlan device,
// before any egress or node port lookup (cb_overlay_in). The agent refuses egress ports
// holding the overlay's port; here that refused configuration is forced, so that an
// egress flow's reply on the overlay's port shows which way the packet took.
func TestOverlayInSkipsEgress(t *testing.T) {
	objs := natFixture(t, 64)
	up := objs.CbFromUplink
	p := egressOut(t, objs, 17, 5353, 53, 0)
	reply := func() []byte { return l4Frame(17, worldIP, hostIP, 53, p, 0, 0) }
	setPort := func(port uint16, vtep netip.Addr) {
		t.Helper()
		var cfg contivbpfCbConfig
		if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.VxlanPort = nport(port)
		cfg.Vtep = ip4(vtep)
		if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
	}
	passes := func(t *testing.T, f []byte) {
		t.Helper()
		if r := run(t, objs, up, f, nil); r.ret != tcxNext || len(r.diff) != 0 {
			t.Errorf("verdict %#x reasons %v, want tcx next, untouched", r.ret, r.diff)
		}
	}
	vtep := netip.MustParseAddr("192.168.0.2")
	if err := objs.CbHostIps.Put(ip4(vtep), &contivbpfCbHostIp{}); err != nil {
		t.Fatal(err)
	}

	t.Run("reply-on-another-port-is-translated", func(t *testing.T) {
		setPort(4789, hostIP)
		run(t, objs, up, reply(), nil).expect(t, tcActRedirect, FwdEgressReply)
	})
	t.Run("to-the-nat-address-skips-egress", func(t *testing.T) {
		setPort(p, hostIP)
		passes(t, reply())
	})
	t.Run("to-the-vtep-skips-egress", func(t *testing.T) {
		setPort(p, vtep)
		// (The full way hands this one on too: the VTEP is no NAT address and no endpoint's.)
		passes(t, l4Frame(17, worldIP, vtep, 53, p, 0, 0))
		// The NAT address still counts while the VTEP is another address.
		passes(t, reply())
	})
	t.Run("full-way-when-not-plain", func(t *testing.T) {
		setPort(p, hostIP)
		// With IP options the overlay's check does not take it: the full way translates
		// (in the refused configuration forced here).
		run(t, objs, up, l4FrameOpts(17, worldIP, hostIP, 53, p, 0, ipOpts{ihl: 6, options: []byte{1, 1, 1, 0}}), nil).expect(t, tcActRedirect, FwdEgressReply)
		// A later fragment has no port: the full way leaves it to the host.
		passes(t, l4Frame(17, worldIP, hostIP, 53, p, 0, 8))
	})
	t.Run("only-udp-and-only-with-a-port", func(t *testing.T) {
		q := egressOut(t, objs, 6, 40000, 443, tcpSYN)
		setPort(q, hostIP)
		run(t, objs, up, withSeq(l4Frame(6, worldIP, hostIP, 443, q, 0x12, 0), 9000, 1), nil).expect(t, tcActRedirect, FwdEgressReply)
		setPort(0, hostIP) // no overlay port configured: nothing is the overlay's
		run(t, objs, up, reply(), nil).expect(t, tcActRedirect, FwdEgressReply)
	})
	t.Run("to-an-endpoint-still-dropped", func(t *testing.T) {
		setPort(4789, hostIP)
		if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
			t.Fatal(err)
		}
		defer objs.CbHostRoutes.Delete(ip4(srcIP))
		run(t, objs, up, l4Frame(17, worldIP, srcIP, 5000, 4789, 0, 0), nil).expect(t, tcActShot, DropUplinkToEndpoint)
	})
}

// TestEgressNATGCKeepsReopened: as TestConntrackGCKeepsReopened, for egress NAT flows.
func TestEgressNATGCKeepsReopened(t *testing.T) {
	objs := natFixture(t, 64)
	g := natGC{flows: objs.CbSnat, replies: objs.CbSnatRev}
	egressOut(t, objs, 17, 5353, 53, 0)
	egressOut(t, objs, 17, 5354, 53, 0)
	var keys []contivbpfCbSnatKey
	var k contivbpfCbSnatKey
	var v contivbpfCbSnatEntry
	it := objs.CbSnat.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if len(keys) != 2 {
		t.Fatalf("%d egress flows, want 2", len(keys))
	}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	later := now + uint64(120*time.Second) // both flows' 60 s have run out
	dead, err := g.scanFlows(later, nil)
	if err != nil || len(dead) != 2 {
		t.Fatalf("scan found %d dead flows (%v), want 2", len(dead), err)
	}
	// Meanwhile the first flow sends again.
	if err := objs.CbSnat.Lookup(&keys[0], &v); err != nil {
		t.Fatal(err)
	}
	v.Expires = later + uint64(60*time.Second)
	if err := objs.CbSnat.Put(&keys[0], &v); err != nil {
		t.Fatal(err)
	}
	if n, errs := g.deleteFlows(later, dead); n != 1 || len(errs) != 0 {
		t.Fatalf("deleted %d (%v), want 1", n, errs)
	}
	if err := objs.CbSnat.Lookup(&keys[0], &v); err != nil {
		t.Errorf("the flow that sent again lost its entry: %v", err)
	}
	if err := objs.CbSnat.Lookup(&keys[1], &v); err == nil {
		t.Errorf("the expired flow kept its entry")
	}
	// A flush takes a flow whatever its state.
	dead, err = g.scanFlows(now, map[ctFlush]bool{{testZone, ip4(srcIP)}: true})
	if err != nil || len(dead) != 1 {
		t.Fatalf("flush scan found %d (%v), want 1", len(dead), err)
	}
	if n, errs := g.deleteFlows(now, dead); n != 1 || len(errs) != 0 {
		t.Fatalf("flush deleted %d (%v), want 1", n, errs)
	}
}

// withSeq sets a TCP frame's sequence and acknowledgment numbers (checksum fixed).
func withSeq(f []byte, seq, ack uint32) []byte {
	f = append([]byte{}, f...)
	ip := f[14:]
	l4 := ip[4*(ip[0]&0xf):]
	binary.BigEndian.PutUint32(l4[4:], seq)
	binary.BigEndian.PutUint32(l4[8:], ack)
	l4[16], l4[17] = 0, 0
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	binary.BigEndian.PutUint16(l4[16:], csum(l4, pseudo(src, dst, 6, len(l4))))
	return f
}

// TestEgressBlindClose (Datapath v3 issue, hole 5): a FIN or RST from outside closes an
// egress flow only with a sequence number its peer would use: after the endpoint's SYN a
// refusal must acknowledge it, afterwards the segment must lie in the window after the
// endpoint's last acknowledgment. A blind one is passed as a plain segment and changes
// nothing, in the NAT table or in conntrack; an idle flow no longer dies 10 s after one.
func TestEgressBlindClose(t *testing.T) {
	objs, out, reply := trackedEgress(t)
	up := objs.CbFromUplink
	const syn, ack, fin, rst = 0x02, 0x10, 0x01, 0x04
	in := func(port uint16, flags uint8, seq, an uint32) {
		t.Helper()
		r := reply(port, flags, seq, an)
		if _, _, _, dp := checkSums(t, r.out); flags&(fin|rst) != 0 && r.out[14+20+13] != flags {
			t.Errorf("flags %#x delivered as %#x (port %d)", flags, r.out[14+20+13], dp)
		}
	}
	states := func(sport uint16) (nat, ct uint8) {
		t.Helper()
		n, c := egressEntries(t, objs, sport)
		return n.State, c.State
	}
	closing := uint8(contivbpfCbCtStateCB_CTS_CLOSING)
	// After the SYN (seq 1000): a segment that does not acknowledge it is blind, dropped
	// (a RST is no refusal, a SYN-ACK establishes nothing, in NAT or conntrack).
	p := out(40000, syn, 1000, 0)
	for _, s := range []struct {
		flags    uint8
		seq, ack uint32
	}{{rst | ack, 0, 999}, {rst, 1001, 0}, {syn | ack, 7777, 1002}, {ack, 7778, 0}, {fin | ack, 7778, 1000}} {
		run(t, objs, up, withSeq(l4Frame(6, worldIP, hostIP, 443, p, s.flags, 0), s.seq, s.ack), nil).expect(t, tcActShot, DropEgressUnanswered)
	}
	if n, c := states(40000); n != uint8(contivbpfCbCtStateCB_CTS_NEW) || c != uint8(contivbpfCbCtStateCB_CTS_NEW) {
		t.Errorf("blind segments after a SYN moved the flow (NAT %d, conntrack %d), want new", n, c)
	}
	in(p, rst|ack, 0, 1001)
	if n, c := states(40000); n != closing || c != closing {
		t.Errorf("the refusal of the SYN did not close the flow (NAT %d, conntrack %d)", n, c)
	}
	// Established (the endpoint acknowledged 9001): out of the window nothing closes.
	p = out(40001, syn, 5000, 0)
	in(p, syn|ack, 9000, 5001)
	out(40001, ack, 5001, 9001)
	for _, s := range []uint32{9000, 9001 + 1<<23, 0xfff02329 /* 1 MiB before */, 0x80000000} {
		in(p, rst, s, 0)
		in(p, fin|ack, s, 5001)
	}
	if n, c := states(40001); n == closing || c == closing {
		t.Errorf("blind FIN/RST closed an established flow (NAT %d, conntrack %d)", n, c)
	}
	// In the window (data in flight past the last ACK): closed.
	in(p, rst, 9001+100000, 0)
	if n, c := states(40001); n != closing || c != closing {
		t.Errorf("an in-window RST did not close the flow (NAT %d, conntrack %d)", n, c)
	}
	// The endpoint's own FIN closes whatever it carries.
	p = out(40002, syn, 7000, 0)
	in(p, syn|ack, 3000, 7001)
	out(40002, fin|ack, 7001, 3001)
	if n, c := states(40002); n != closing || c != closing {
		t.Errorf("the endpoint's FIN did not close its flow (NAT %d, conntrack %d)", n, c)
	}
}

// TestNodePortBlindClose (Datapath v3 issue, hole 5): a FIN or RST from the client side of
// a node port flow closes it only with a sequence number in the window the backend's last
// acknowledgment set; a blind one is dropped (drop_nodeport_blind) and moves nothing, for
// a local backend (conntrack) and a remote one (conntrack and the NAT entry here, and
// nothing reaches the backend's host). A spoofed SYN on the established flow does not
// reset the reference for the RST after it (found by review). Before the backend's first
// segment the client's RST is believed; the backend's own FIN closes.
func TestNodePortBlindClose(t *testing.T) {
	objs, vip := nodePortFixture(t, 6, 80, 8080, 30080)
	up, fc := objs.CbFromUplink, objs.CbFromContainer
	const syn, ack, fin, rst = 0x02, 0x10, 0x01, 0x04
	closing := uint8(contivbpfCbCtStateCB_CTS_CLOSING)
	send := func(cport uint16, flags uint8, seq, an uint32) runResult {
		t.Helper()
		return run(t, objs, up, withSeq(l4Frame(6, worldIP, hostIP, cport, 30080, flags, 0), seq, an), nil)
	}
	blind := func(cport uint16, flags uint8, seq, an uint32) {
		t.Helper()
		send(cport, flags, seq, an).expect(t, tcActShot, DropNodePortBlind)
	}
	state := func(backend netip.Addr, cport uint16) uint8 {
		t.Helper()
		e, ok := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, backend, cport, 8080)
		if !ok {
			t.Fatalf("no conntrack entry of the client's port %d", cport)
		}
		return e.State
	}
	// A local backend. SYN (seq 1000), the backend's SYN-ACK (acknowledging 1001), then
	// blind FINs and RSTs: behind the reference, past 8 MiB, far away.
	local := func(cport uint16, flags uint8, seq, an uint32) {
		t.Helper()
		r := send(cport, flags, seq, an)
		r.expect(t, tcActRedirect, FwdNodePort)
		if r.out[14+20+13] != flags {
			t.Errorf("flags %#x delivered as %#x", flags, r.out[14+20+13])
		}
	}
	local(5555, syn, 1000, 0)
	run(t, objs, fc, withSeq(l4Frame(6, srcIP, worldIP, 8080, 5555, syn|ack, 0), 9000, 1001), nil).expect(t, tcActRedirect, FwdNodePortReply)
	local(5555, ack, 1001, 9001)
	for _, seq := range []uint32{1000, 1001 + 1<<23, 0xfff003e9 /* 1 MiB before */, 0x80000000} {
		blind(5555, rst, seq, 0)
		blind(5555, fin|ack, seq, 9001)
	}
	// A spoofed SYN first: it goes on as a plain segment (the backend answers it with a
	// challenge ACK) and leaves the reference in place.
	local(5555, syn, 0x12345678, 0)
	blind(5555, rst, 0x80000000, 0)
	blind(5555, syn|rst, 0x80000000, 0) // a RST all the same, to a remote backend's host too
	if st := state(srcIP, 5555); st != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) {
		t.Errorf("blind segments moved a local backend's node port flow to state %d", st)
	}
	local(5555, rst, 1001+100000, 0) // data in flight past the last ACK: in the window
	if st := state(srcIP, 5555); st != closing {
		t.Errorf("an in-window RST left the flow in state %d, want closing", st)
	}
	// After the close, a SYN on the tuple opens a new flow.
	local(5555, syn, 50000, 0)
	if st := state(srcIP, 5555); st != uint8(contivbpfCbCtStateCB_CTS_NEW) {
		t.Errorf("a SYN after the close left state %d, want new", st)
	}
	// No backend segment yet: the client's RST is believed.
	local(5557, syn, 4000, 0)
	local(5557, rst, 77, 0)
	if st := state(srcIP, 5557); st != closing {
		t.Errorf("the client's RST before any answer left state %d, want closing", st)
	}
	// The backend's own FIN closes whatever it carries.
	local(5558, syn, 6000, 0)
	run(t, objs, fc, withSeq(l4Frame(6, srcIP, worldIP, 8080, 5558, syn|ack, 0), 3000, 6001), nil).expect(t, tcActRedirect, FwdNodePortReply)
	run(t, objs, fc, withSeq(l4Frame(6, srcIP, worldIP, 8080, 5558, fin|ack, 0), 3001, 6001), nil).expect(t, tcActRedirect, FwdNodePortReply)
	if st := state(srcIP, 5558); st != closing {
		t.Errorf("the backend's FIN left state %d, want closing", st)
	}

	// A backend on another host: its SYN-ACK comes back through the overlay. A blind one
	// never leaves for the backend's host, whose own state would take it.
	putTestService(t, objs, 1, vip, 80, 6, 8080, remoteIP)
	r := send(5556, syn, 2000, 0)
	r.expect(t, tcActRedirect, FwdTunnel)
	_, _, natPort, _ := checkSums(t, r.out)
	fromPeer := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	run(t, objs, objs.CbTestOverlay, withSeq(l4Frame(6, remoteIP, hostIP, 8080, natPort, syn|ack, 0), 5000, 2001), fromPeer).expect(t, tcActRedirect, FwdNodePortReply)
	snat := func() uint8 {
		t.Helper()
		var e contivbpfCbSnatEntry
		k := contivbpfCbSnatKey{Zone: testZone, Kind: ctKindNodePort, Saddr: ip4(worldIP), Daddr: ip4(remoteIP), Sport: nport(5556), Dport: nport(8080), Proto: 6}
		if err := objs.CbSnat.Lookup(&k, &e); err != nil {
			t.Fatalf("the remote flow's NAT entry: %v", err)
		}
		return e.State
	}
	for _, seq := range []uint32{2000, 2001 + 1<<23, 0x80000000} {
		blind(5556, rst, seq, 0)
		blind(5556, fin|ack, seq, 5001)
	}
	// The NAT collector keeps the flow's reverse entry (its key has the node port kind).
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	if _, live, err := (natGC{flows: objs.CbSnat, replies: objs.CbSnatRev}).sweep(now, nil); err != nil || live != 1 {
		t.Fatalf("NAT sweep with the remote node port flow open: %d live, %v; want 1", live, err)
	}
	send(5556, syn, 0x5555, 0).expect(t, tcActRedirect, FwdTunnel)
	blind(5556, rst, 0x80000000, 0)
	if st, n := state(remoteIP, 5556), snat(); st == closing || n == closing {
		t.Errorf("blind segments closed a remote backend's node port flow (conntrack %d, NAT %d)", st, n)
	}
	send(5556, rst, 2001+5000, 0).expect(t, tcActRedirect, FwdTunnel)
	if st, n := state(remoteIP, 5556), snat(); st != closing || n != closing {
		t.Errorf("an in-window RST left conntrack %d, NAT %d, want closing", st, n)
	}
}

// TestTenantNets: the driver keeps cb_tenant_nets (the node port stage's view of each
// tenant's subnets) with its networks: written by the network, kept while another network
// of the tenant has the subnet, removed with the last, swept by a Sync that no longer has
// it, and rewritten when a network moves to another subnet.
func TestTenantNets(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	has := func(n dataplane.Network) bool {
		t.Helper()
		m := n.Subnet.Masked()
		k := contivbpfCbTnetKey{Prefixlen: 32 + uint32(m.Bits()), Zone: vrfOf(n.ID), Addr: ip4(m.Addr())}
		var v contivbpfCbTnet
		return h.d.objs.CbTenantNets.Lookup(&k, &v) == nil
	}
	red := h.net
	twin := dataplane.Network{ID: "twin.t", Encap: dataplane.EncapVXLAN, Tag: 78, Subnet: red.Subnet} // same tenant t
	if err := h.d.UpsertNetwork(ctx, red); err != nil {
		t.Fatal(err)
	}
	if err := h.d.UpsertNetwork(ctx, twin); err != nil {
		t.Fatal(err)
	}
	if !has(red) {
		t.Fatal("the network's subnet is not in cb_tenant_nets")
	}
	if err := h.d.DeleteNetwork(ctx, red.ID); err != nil {
		t.Fatal(err)
	}
	if !has(twin) {
		t.Error("the subnet went with one network while another of the tenant has it")
	}
	moved := twin
	moved.Subnet = netip.MustParsePrefix("10.51.0.0/24")
	if err := h.d.UpsertNetwork(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if has(twin) || !has(moved) {
		t.Errorf("after the network moved: old subnet held %v, new %v", has(twin), has(moved))
	}
	if err := h.d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{red}}); err != nil {
		t.Fatal(err)
	}
	if !has(red) || has(moved) {
		t.Errorf("after Sync with only red: red %v, swept network %v", has(red), has(moved))
	}
	if err := h.d.DeleteNetwork(ctx, red.ID); err != nil {
		t.Fatal(err)
	}
	if has(red) {
		t.Error("the last network's subnet stayed")
	}
}

// TestEgressLinkLocal (Datapath v3 issue, hole 6): egress to a link-local address is never
// forwarded; the cloud metadata address 169.254.169.254, which answers the node's identity
// to whoever asks from its address (egress NAT gives every endpoint that address), only
// when the agent allows it (--egress-allow-metadata).
func TestEgressLinkLocal(t *testing.T) {
	objs := natFixture(t, 64)
	fc := objs.CbFromContainer
	metadata, other := netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("169.254.1.1")
	for _, dst := range []netip.Addr{metadata, other} {
		run(t, objs, fc, l4Frame(6, srcIP, dst, 40000, 80, 0x02, 0), nil).expect(t, tcActShot, DropEgressLinkLocal)
		run(t, objs, fc, l4Frame(17, srcIP, dst, 40000, 53, 0, 0), nil).expect(t, tcActShot, DropEgressLinkLocal)
	}
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.EgressFlags |= uint8(contivbpfCbEgressFlagsCB_EGRESS_METADATA) })
	run(t, objs, fc, l4Frame(6, srcIP, metadata, 40001, 80, 0x02, 0), nil).expect(t, tcActRedirect, FwdEgress)
	run(t, objs, fc, l4Frame(6, srcIP, other, 40001, 80, 0x02, 0), nil).expect(t, tcActShot, DropEgressLinkLocal)
	// Next to the range: ordinary outside addresses.
	for _, dst := range []string{"169.253.255.255", "169.255.0.1"} {
		run(t, objs, fc, l4Frame(6, srcIP, netip.MustParseAddr(dst), 40002, 80, 0x02, 0), nil).expect(t, tcActRedirect, FwdEgress)
	}
}

// TestBlindSynAckLeavesConntrackNew (found by review): a blind segment while the
// endpoint's SYN is unanswered went on to conntrack as the flow's reply and moved its entry
// to ESTABLISHED (6 h instead of 60 s, against the endpoint's own quota, out of step with
// the NAT entry). It is dropped now (drop_egress_unanswered): both entries stay NEW.
func TestBlindSynAckLeavesConntrackNew(t *testing.T) {
	objs := natFixture(t, 64)
	up, fc := objs.CbFromUplink, objs.CbFromContainer
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 7)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
		{ID: "out", Priority: 1, Action: dataplane.ActionAllow}}})
	r := run(t, objs, fc, withSeq(l4Frame(6, srcIP, worldIP, 40000, 443, tcpSYN, 0), 1000, 0), nil)
	r.expect(t, tcActRedirect, FwdEgress)
	_, _, p, _ := checkSums(t, r.out)
	// Blind: does not acknowledge the SYN (1001).
	run(t, objs, up, withSeq(l4Frame(6, worldIP, hostIP, 443, p, tcpSYN|tcpACK, 0), 7777, 1002), nil).expect(t, tcActShot, DropEgressUnanswered)
	var e contivbpfCbSnatEntry
	k := contivbpfCbSnatKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(worldIP), Sport: nport(40000), Dport: nport(443), Proto: 6}
	if err := objs.CbSnat.Lookup(&k, &e); err != nil {
		t.Fatal(err)
	}
	c, ok := ctEntry(t, objs, testZone, 6, srcIP, worldIP, 40000, 443)
	if !ok {
		t.Fatal("no conntrack entry")
	}
	if e.State != uint8(contivbpfCbCtStateCB_CTS_NEW) {
		t.Fatalf("NAT entry state %d, want NEW (the commit's own check)", e.State)
	}
	if c.State != uint8(contivbpfCbCtStateCB_CTS_NEW) {
		t.Errorf("a blind SYN-ACK moved the flow's conntrack entry to %d (ESTABLISHED, 6 h) while its NAT entry stays NEW", c.State)
	}
}

// TestTTLFloodSparesNodePortRefusals (found by review): time exceeded answers spent the
// one host-wide ICMP budget that bounds the node port refusals to the wire, so a container
// sending TTL-1 packets silenced every node port's "port unreachable". They have a budget
// of their own (CB_ICMP_BUDGET_TTL).
func TestTTLFloodSparesNodePortRefusals(t *testing.T) {
	objs := natFixture(t, 64)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_ROUTING|contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_NODEPORT))
	vip := netip.MustParseAddr("10.1.0.100")
	putTestService(t, objs, 2, vip, 53, 17, 5353) // no backend
	if err := objs.CbNodeports.Put(&contivbpfCbNpKey{Port: nport(30053), Proto: 17}, &contivbpfCbNp{Zone: testZone, Vip: ip4(vip), SvcPort: nport(53)}); err != nil {
		t.Fatal(err)
	}
	ttl1 := l4Frame(17, srcIP, localIP, 1000, 33434, 0, 0)
	ttl1[14+8] = 1
	ttl1[14+10], ttl1[14+11] = 0, 0
	binary.BigEndian.PutUint16(ttl1[14+10:], csum(ttl1[14:14+20], 0))
	fc, up := objs.CbFromContainer, objs.CbFromUplink
	// Control: without the flood the node port refuses, and the container's TTL-1 is
	// answered.
	run(t, objs, up, l4Frame(17, worldIP, hostIP, 5554, 30053, 0, 0), nil).expect(t, tcActRedirect, RejectNoBackend)
	run(t, objs, fc, ttl1, nil).expect(t, tcActRedirect, RejectTTLExceeded)
	time.Sleep(60 * time.Millisecond)
	starved := 0
	for trial := 0; trial < 5; trial++ {
		// The container's flood until the budget of this window is spent...
		for i := 0; i < 200; i++ {
			if r := run(t, objs, fc, ttl1, nil); r.diff[DropTTLExceeded] == 1 {
				break
			}
		}
		// ...then a client from the wire at a node port without backends.
		r := run(t, objs, up, l4Frame(17, worldIP, hostIP, uint16(5555+trial), 30053, 0, 0), nil)
		if r.diff[RejectNoBackend] != 1 {
			starved++
		}
		time.Sleep(60 * time.Millisecond)
	}
	if starved > 0 {
		t.Errorf("after a container's TTL-1 flood, %d of 5 node port refusals to the wire were not sent (one shared ICMP budget)", starved)
	}
}

// TestMetadataOnTheHostPath (found by review): cb_outside handed a packet to an address of
// this host (cb_host_ips, every IPv4 address but loopback: syncHostIPs keeps link-local
// ones) to the host's stack before either egress way's cb_dst_link_local check. A host
// that holds the metadata address itself (a node-local metadata proxy or credential agent
// bound on a dummy device, as metadata concealment proxies and IMDS proxies do) serves it
// to every endpoint as the node, with --egress-allow-metadata off.
func TestMetadataOnTheHostPath(t *testing.T) {
	objs := natFixture(t, 64)
	metadata := netip.MustParseAddr("169.254.169.254")
	if err := objs.CbHostIps.Put(ip4(metadata), &contivbpfCbHostIp{}); err != nil { // as syncHostIPs writes it
		t.Fatal(err)
	}
	if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
		t.Fatal(err)
	}
	r := run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, metadata, 40000, 80, tcpSYN, 0), nil)
	if r.diff[DropEgressLinkLocal] != 1 {
		t.Errorf("an endpoint reached the metadata address held by the host: verdict %#x reasons %v, want drop_egress_link_local", r.ret, r.diff)
	}
}

// TestPeerFlowBlindClose (Datapath v3 issue, hole 5, the peer host's node port flows): a
// node port flow a peer host balanced here arrives from the peer's own address, which any
// process on that host can send from (VXLAN is plain UDP). The flow's record that sends
// the backend's replies back through the tunnel (cb_peer_flows) moves to CLOSING only on
// a FIN or RST in the window of the backend's last acknowledgment, as conntrack's entry
// does: a blind one left it CLOSING, and the backend's first reply after 10 s idle went
// out by egress NAT instead (DropEgressNoFlow), the connection dead.
func TestPeerFlowBlindClose(t *testing.T) {
	objs := natFixture(t, 64)
	peer := netip.MustParseAddr(testVTEP)
	fromPeer := &skbCtx{CB: [5]uint32{ip4(peer), testNet}}
	ov, fc := objs.CbTestOverlay, objs.CbFromContainer
	const window = 1 << 23
	record := func(sport uint16) contivbpfCbPeerFlow {
		t.Helper()
		var v contivbpfCbPeerFlow
		k := contivbpfCbPeerFlowKey{Zone: testZone, Saddr: ip4(peer), Daddr: ip4(srcIP), Sport: nport(sport), Dport: nport(8080), Proto: 6}
		if err := objs.CbPeerFlows.Lookup(&k, &v); err != nil {
			t.Fatalf("peer flow of port %d: %v", sport, err)
		}
		return v
	}
	in := func(sport uint16, flags uint8, seq, ack uint32) {
		t.Helper()
		run(t, objs, ov, withSeq(l4Frame(6, peer, srcIP, sport, 8080, flags, 0), seq, ack), fromPeer).expect(t, tcActRedirect, FwdLocal)
	}
	out := func(sport uint16, flags uint8, seq, ack uint32) {
		t.Helper()
		run(t, objs, fc, withSeq(l4Frame(6, srcIP, peer, 8080, sport, flags, 0), seq, ack), nil).expect(t, tcActRedirect, FwdTunnel)
	}
	established := uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED)
	for _, features := range []uint32{0, uint32(contivbpfCbFeaturesCB_FEAT_POLICY)} {
		setFeatures(t, objs, features)
		if features != 0 {
			setEPG(t, objs, srcIP, 7) // tracked: conntrack's own window applies too
			putPolicy(t, objs, dataplane.PolicySet{EPGID: 7, Rules: []dataplane.PolicyRule{
				{ID: "web", Priority: 10, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow}}})
		}
		sport := uint16(61100 + features)
		in(sport, tcpSYN, 1000, 0)
		out(sport, tcpSYN|tcpACK, 50000, 1001)
		in(sport, tcpACK, 1001, 50001)
		for _, seq := range []uint32{1000, 1001 + window, 0x80000000} {
			in(sport, tcpRST, seq, 0)
			in(sport, tcpFIN|tcpACK, seq, 50001)
		}
		if v := record(sport); v.State != established {
			t.Errorf("features %#x: blind FINs and RSTs from the peer's address moved its flow record to state %d", features, v.State)
		}
		// The backend's reply after the record's CLOSING timeout (10 s) would have gone
		// by egress NAT: pushed past it here.
		k := contivbpfCbPeerFlowKey{Zone: testZone, Saddr: ip4(peer), Daddr: ip4(srcIP), Sport: nport(sport), Dport: nport(8080), Proto: 6}
		v := record(sport)
		v.Expires -= uint64(11 * time.Second)
		if err := objs.CbPeerFlows.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
		if r := run(t, objs, fc, withSeq(l4Frame(6, srcIP, peer, 8080, sport, tcpACK, 0), 50001, 1001), nil); r.diff[FwdTunnel] != 1 {
			t.Errorf("features %#x: the backend's reply 10 s after blind RSTs: %v, want it through the tunnel", features, r.diff)
		}
		// In the window: closes.
		in(sport, tcpRST, 1001+1000, 0)
		if v := record(sport); v.State != uint8(contivbpfCbCtStateCB_CTS_CLOSING) {
			t.Errorf("features %#x: an in-window RST left the flow record in state %d", features, v.State)
		}
	}
}

// TestNodePortBlindCloseBackendHost (Datapath v3 issue, hole 5, the other side of a node
// port flow to a backend on another host): the backend's segments come back through the
// overlay, and any process on the backend's host can send them (it owns the backend's
// address there). A FIN or RST from that side closes the flow here, its NAT entry and its
// conntrack entry, only in the window of the client's last acknowledgment; a blind one
// goes on to the client as a plain segment. Before, one such RST moved both to CLOSING
// and the idle connection died 10 s later.
func TestNodePortBlindCloseBackendHost(t *testing.T) {
	objs, vip := nodePortFixture(t, 6, 80, 8080, 30080)
	putTestService(t, objs, 1, vip, 80, 6, 8080, remoteIP)
	up, ov := objs.CbFromUplink, objs.CbTestOverlay
	fromPeer := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	const window = 1 << 23
	const cport = 5600
	client := func(flags uint8, seq, ack uint32) runResult {
		t.Helper()
		r := run(t, objs, up, withSeq(l4Frame(6, worldIP, hostIP, cport, 30080, flags, 0), seq, ack), nil)
		r.expect(t, tcActRedirect, FwdTunnel)
		return r
	}
	_, _, natPort, _ := checkSums(t, client(tcpSYN, 2000, 0).out)
	backend := func(flags uint8, seq, ack uint32) {
		t.Helper()
		r := run(t, objs, ov, withSeq(l4Frame(6, remoteIP, hostIP, 8080, natPort, flags, 0), seq, ack), fromPeer)
		r.expect(t, tcActRedirect, FwdNodePortReply)
	}
	states := func() (uint8, uint8) {
		t.Helper()
		var n contivbpfCbSnatEntry
		k := contivbpfCbSnatKey{Zone: testZone, Kind: ctKindNodePort, Saddr: ip4(worldIP), Daddr: ip4(remoteIP), Sport: nport(cport), Dport: nport(8080), Proto: 6}
		if err := objs.CbSnat.Lookup(&k, &n); err != nil {
			t.Fatalf("the flow's NAT entry: %v", err)
		}
		e, ok := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, remoteIP, cport, 8080)
		if !ok {
			t.Fatal("the flow's conntrack entry is missing")
		}
		return n.State, e.State
	}
	backend(tcpSYN|tcpACK, 5000, 2001)
	client(tcpACK, 2001, 5001)
	established := uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED)
	for _, seq := range []uint32{5000, 5001 + window, 0x80000000} {
		backend(tcpRST, seq, 0)
		backend(tcpFIN|tcpACK, seq, 2001)
	}
	if n, e := states(); n != established || e != established {
		t.Errorf("blind FINs and RSTs from the backend's host: NAT entry state %d, conntrack %d, want both established", n, e)
	}
	backend(tcpRST, 5001+1000, 0) // in the window
	if n, e := states(); n != uint8(contivbpfCbCtStateCB_CTS_CLOSING) || e != uint8(contivbpfCbCtStateCB_CTS_CLOSING) {
		t.Errorf("an in-window RST: NAT entry state %d, conntrack %d, want both closing", n, e)
	}
}
