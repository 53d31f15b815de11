package ebpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// The fast path (cb_ipv4_fast, cb_fast_pass) takes an established flow's packet only when
// the full stage would do nothing else with it: a hostile or odd packet on the same
// tuple, a policy change, an expired entry or a service at its destination each get what
// the full stage gives them. With policy alone and with services on.
func TestFastPath(t *testing.T) {
	for _, lb := range []bool{false, true} {
		name := "policy"
		if lb {
			name = "policy+services"
		}
		t.Run(name, func(t *testing.T) { testFastPath(t, lb) })
	}
}

func testFastPath(t *testing.T, lb bool) {
	objs := ctPolicyFixture(t)
	features := uint32(contivbpfCbFeaturesCB_FEAT_POLICY)
	if lb {
		features |= uint32(contivbpfCbFeaturesCB_FEAT_LB)
		putTestService(t, objs, 7, netip.MustParseAddr("10.1.0.100"), 80, 6, 80, localIP)
	}
	setFeatures(t, objs, features)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	flowKey := contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(remoteIP), Sport: nport(42000), Dport: nport(443), Proto: 6}
	entry := func() contivbpfCbCtEntry {
		t.Helper()
		e, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 42000, 443)
		if !ok {
			t.Fatal("the flow's entry is gone")
		}
		return e
	}
	// Open src → remote:443 and get the reply: ESTABLISHED.
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 42000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 42000, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	if e := entry(); e.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) {
		t.Fatalf("after the reply: %+v, want ESTABLISHED", e)
	}
	// The established flow's ACK passes and refreshes its entry.
	e := entry()
	e.Expires -= uint64(time.Hour)
	if err := objs.CbCt.Put(&flowKey, &e); err != nil {
		t.Fatal(err)
	}
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 42000, 443, tcpACK, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	if r := remaining(t, entry()); r < 5*time.Hour+59*time.Minute {
		t.Fatalf("an established ACK left %v on the entry, want 6 h", r)
	}

	// Hostile and odd packets on the tuple.
	ack := l4Frame(6, srcIP, remoteIP, 42000, 443, tcpACK, 0)
	cut := append([]byte(nil), ack[:14+20+12]...) // a TCP header cut short, tot_len to match
	binary.BigEndian.PutUint16(cut[14+2:], 20+12)
	binary.BigEndian.PutUint16(cut[14+10:], 0)
	binary.BigEndian.PutUint16(cut[14+10:], csum(cut[14:34], 0))
	run(t, objs, fc, cut, nil).expect(t, tcActShot, DropMalformedL4)
	spoofed := l4Frame(6, localIP, remoteIP, 42000, 443, tcpACK, 0)
	run(t, objs, fc, spoofed, nil).expect(t, tcActShot, DropSpoofedSrc)
	short := l4Frame(6, srcIP, remoteIP, 42000, 443, tcpACK, 0)
	binary.BigEndian.PutUint16(short[14+2:], 4000) // tot_len past the frame
	run(t, objs, fc, short, nil).expect(t, tcActShot, DropMalformedIP)

	// An expired entry is no entry: the ACK is judged as an opening (allowed) and opens a
	// fresh NEW one.
	e = entry()
	e.Expires = 1
	if err := objs.CbCt.Put(&flowKey, &e); err != nil {
		t.Fatal(err)
	}
	run(t, objs, fc, ack, nil).expect(t, tcActRedirect, FwdTunnel)
	if e := entry(); e.State != uint8(contivbpfCbCtStateCB_CTS_NEW) || remaining(t, e) > 61*time.Second {
		t.Fatalf("after an ACK on an expired entry: %+v, want a fresh NEW entry", e)
	}
	run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 42000, tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)

	// A policy change that denies the flow: its next packet is judged, dropped, and its
	// entry goes.
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "no-443-out", Priority: 9, Proto: 6, Port: 443, Action: dataplane.ActionDeny}}})
	var epoch uint32
	if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
		t.Fatal(err)
	}
	setEpoch(t, objs, epoch+1)
	run(t, objs, fc, ack, nil).expect(t, tcActShot, DropPolicy)
	if _, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 42000, 443); ok {
		t.Fatal("the denied flow kept its entry")
	}

	if !lb {
		return
	}
	// A service on an endpoint's own address and port (a VIP is normally not one): the
	// established direct flow's packet is balanced, as the full stage does.
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10})
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 42001, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 42001, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	putTestService(t, objs, 8, remoteIP, 443, 6, 80, localIP)
	r := run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 42001, 443, tcpACK, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if dst := netip.AddrFrom4([4]byte(r.out[14+16 : 14+20])); dst != localIP {
		t.Fatalf("a packet to a service address went to %v, want its backend %v", dst, localIP)
	}
}

// A zone's first fragments record within its budget (CB_FRAG_RATE a second, CB_FRAG_BURST
// at once): past it they are dropped (drop_frag_limit) with nothing recorded, while another
// zone's datagrams still record and their later fragments pass; the budget refills.
func TestFragBudget(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc := objs.CbFromContainer
	first := func(id uint16) runResult {
		return run(t, objs, fc, firstFrag(17, srcIP, localIP, 40000, 53, 0, id), nil)
	}
	// No refill during the test: the burst, then refusals.
	if err := objs.CbFragRate.Set(uint32(0)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4096; i++ {
		if r := first(uint16(i)); r.diff[FwdLocal] != 1 {
			t.Fatalf("first fragment %d, within the burst: %v", i, r.diff)
		}
	}
	limited := uint16(4097)
	first(limited).expect(t, tcActShot, DropFragLimit)
	// Nothing recorded for the refused one: its later fragment has no first.
	run(t, objs, fc, laterFrag(17, srcIP, localIP, limited), nil).expect(t, tcActShot, DropFragNoFirst)

	// Another tenant (zone) is not touched by it.
	setZone(t, objs, testZone+1)
	first(limited).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, laterFrag(17, srcIP, localIP, limited), nil).expect(t, tcActRedirect, FwdLocal)

	// And the drained zone's budget refills with time (20,000 a second: 200 in 10 ms).
	setZone(t, objs, testZone)
	if err := objs.CbFragRate.Set(uint32(20000)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	first(limited+1).expect(t, tcActRedirect, FwdLocal)
}
