package ebpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

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
	// No refill during the test: the bursts, then refusals.
	for _, v := range []*ebpf.Variable{objs.CbFragRate, objs.CbFragSrcRate} {
		if err := v.Set(uint32(0)); err != nil {
			t.Fatal(err)
		}
	}
	// The source's own budget first: 1,024 at once.
	for i := 1; i <= 1024; i++ {
		if r := first(uint16(i)); r.diff[FwdLocal] != 1 {
			t.Fatalf("first fragment %d, within the source's burst: %v", i, r.diff)
		}
	}
	limited := uint16(1025)
	first(limited).expect(t, tcActShot, DropFragLimit)
	// Nothing recorded for the refused one: its later fragment has no first.
	run(t, objs, fc, laterFrag(17, srcIP, localIP, limited), nil).expect(t, tcActShot, DropFragNoFirst)

	// Another endpoint of the same tenant still records: its own budget, and the zone's
	// 3,072 left (the sender on this veth becomes localIP; its datagram to srcIP is denied
	// by srcIP's group, after the budget admitted it).
	self, err := objs.ifaceTable().lookup(uint32(loIfindex))
	if err != nil {
		t.Fatal(err)
	}
	other, err := objs.ifaceTable().lookup(uint32(peerIfindex))
	if err != nil {
		t.Fatal(err)
	}
	other.Vrf = self.Vrf
	if err := objs.ifaceTable().put(uint32(loIfindex), &other, nil); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 1023; i++ {
		r := run(t, objs, fc, firstFrag(17, localIP, srcIP, 40000, 53, 0, uint16(i)), nil)
		if r.diff[DropFragLimit] != 0 || r.diff[DropPolicy] != 1 {
			t.Fatalf("another endpoint's first fragment %d: %v", i, r.diff)
		}
	}
	// A zone whose budget is spent refuses every source, one with a token left too.
	zb := contivbpfCbFragBudget{Stamp: 0, Tokens: 0}
	if err := objs.CbFragBudgets.Put(contivbpfCbFragZoneKey{Zone: self.Vrf}, &zb); err != nil {
		t.Fatal(err)
	}
	run(t, objs, fc, firstFrag(17, localIP, srcIP, 40000, 53, 0, 2000), nil).expect(t, tcActShot, DropFragLimit)
	if err := objs.ifaceTable().put(uint32(loIfindex), &self, nil); err != nil {
		t.Fatal(err)
	}

	// Another tenant (zone) is not touched by it (the source's budget there is its own too).
	setZone(t, objs, testZone+1)
	first(limited).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, laterFrag(17, srcIP, localIP, limited), nil).expect(t, tcActRedirect, FwdLocal)

	// And the drained budgets refill with time (20,000 and 5,000 a second: 200 and 50 in
	// 10 ms).
	setZone(t, objs, testZone)
	if err := objs.CbFragRate.Set(uint32(20000)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	first(limited+1).expect(t, tcActShot, DropFragLimit) // the source's budget: no refill yet
	if err := objs.CbFragSrcRate.Set(uint32(5000)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	first(limited+2).expect(t, tcActRedirect, FwdLocal)
}

// An established service flow's packets (cb_svc_fast) and its backend's replies
// (cb_fast_pass's reply case) keep every state change and rewrite of the full stage: the
// destination becomes backend:target (checksums right), the flow's entry is refreshed and
// the client→VIP entry follows its deadline; a backend that is no longer a member is
// replaced on the next packet; a policy change re-judges the flow; a reply leaves from
// VIP:port and makes the flow ESTABLISHED.
func TestServiceFastPath(t *testing.T) {
	// Service ids only grow; one past the revision slots shares slot 9 (bpf/lib/lb.h) and
	// must get the same revision, memo and re-balancing.
	for _, id := range []uint32{9, svcRevSlots + 9} {
		t.Run(fmt.Sprintf("id-%d", id), func(t *testing.T) { testServiceFastPath(t, id) })
	}
}

func testServiceFastPath(t *testing.T, id uint32) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-8080", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 8080, Action: dataplane.ActionAllow}}})
	vip := netip.MustParseAddr("10.1.0.101")
	putTestService(t, objs, id, vip, 80, 6, 8080, localIP)
	fc := objs.CbFromContainer
	entries := func(backend netip.Addr) (svc, flow contivbpfCbCtEntry) {
		t.Helper()
		svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, 43000, 80)
		flow, ok2 := ctEntry(t, objs, testZone, 6, srcIP, backend, 43000, 8080)
		if !ok || !ok2 {
			t.Fatalf("service entry found %v, flow entry found %v", ok, ok2)
		}
		return svc, flow
	}
	age := func(backend netip.Addr, d time.Duration) {
		t.Helper()
		for _, k := range []contivbpfCbCtKey{
			{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(vip), Sport: nport(43000), Dport: nport(80), Proto: 6},
			{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(backend), Sport: nport(43000), Dport: nport(8080), Proto: 6}} {
			var e contivbpfCbCtEntry
			if err := objs.CbCt.Lookup(&k, &e); err != nil {
				t.Fatal(err)
			}
			e.Expires -= uint64(d)
			if err := objs.CbCt.Put(&k, &e); err != nil {
				t.Fatal(err)
			}
		}
	}
	send := func(flags uint8) runResult {
		t.Helper()
		return run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, flags, 0), nil)
	}
	r := send(tcpSYN)
	r.expect(t, tcActRedirect, FwdLocal)
	if _, dst, _, dport := checkSums(t, r.out); dst != localIP || dport != 8080 {
		t.Fatalf("the SYN went to %v:%d, want %v:8080", dst, dport, localIP)
	}

	// An ACK 20 s later: to the backend, both entries back to the flow's full timeout.
	age(localIP, 20*time.Second)
	r = send(tcpACK)
	r.expect(t, tcActRedirect, FwdLocal)
	if _, dst, sport, dport := checkSums(t, r.out); dst != localIP || sport != 43000 || dport != 8080 {
		t.Fatalf("the ACK went to %v:%d from port %d, want %v:8080 from 43000", dst, dport, sport, localIP)
	}
	svc, flow := entries(localIP)
	if rem := remaining(t, flow); rem < 55*time.Second || svc.Expires != flow.Expires {
		t.Fatalf("after the ACK: flow entry %v left, service entry deadline %d vs flow's %d; want ~60 s and equal", rem, svc.Expires, flow.Expires)
	}
	if flow.State != uint8(contivbpfCbCtStateCB_CTS_NEW) {
		t.Fatalf("a client's ACK moved the flow to state %d, want NEW", flow.State)
	}
	// Its backend was checked (the SYN chose it; the ACK found it a member) and the flow's
	// entry with it: the entry holds their memo, stamped with the service's revision, the
	// policy epoch and the memo generation.
	if want := memoStamp(t, objs, id); svc.State != memoOf(contivbpfCbCtStateCB_CTS_NEW) || svc.Epoch != want {
		t.Fatalf("service entry state %#x stamp %d, want a memo of a NEW flow stamped %d", svc.State, svc.Epoch, want)
	}

	// The backend's reply (sent from its own interface) leaves from VIP:80 and makes the
	// flow ESTABLISHED.
	client, backend, setIfc := backendIfaces(t, objs)
	setIfc(backend)
	age(localIP, 20*time.Second)
	r = run(t, objs, fc, l4Frame(6, localIP, srcIP, 8080, 43000, tcpACK, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if src, dst, sport, dport := checkSums(t, r.out); src != vip || sport != 80 || dst != srcIP || dport != 43000 {
		t.Fatalf("the reply left as %v:%d → %v:%d, want %v:80 → %v:43000", src, sport, dst, dport, vip, srcIP)
	}
	if _, flow = entries(localIP); flow.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) || remaining(t, flow) < 5*time.Hour {
		t.Fatalf("after the reply: %+v, want ESTABLISHED for 6 h", flow)
	}
	setIfc(client)

	// The backend leaves the service (another takes its place): the next packet goes to
	// the new one.
	removeMember(t, objs, id, localIP)
	putTestService(t, objs, id, vip, 80, 6, 8080, remoteIP)
	r = send(tcpACK)
	r.expect(t, tcActRedirect, FwdTunnel)
	if svc, _ := entries(remoteIP); svc.NatIp != ip4(remoteIP) {
		t.Fatalf("the service entry still names backend %v", svc.NatIp)
	}
	send(tcpACK).expect(t, tcActRedirect, FwdTunnel)

	// A policy change: the flow is judged again on its next packet (group 10 now refuses
	// TCP 8080 out) and its entry goes.
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "no-8080-out", Priority: 9, Proto: 6, Port: 8080, Action: dataplane.ActionDeny}}})
	var epoch uint32
	if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
		t.Fatal(err)
	}
	setEpoch(t, objs, epoch+1)
	send(tcpACK).expect(t, tcActShot, DropPolicy)
	if _, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 43000, 8080); ok {
		t.Fatal("the denied service flow kept its entry")
	}
}

// backendIfaces returns the test interface's entry as the client's (srcIP, group 10) and
// as the backend's (localIP, group 20), and a function that puts one of them in place: a
// packet run on it then comes from that endpoint.
func backendIfaces(t *testing.T, objs *contivbpfObjects) (client, backend contivbpfCbIface, set func(contivbpfCbIface)) {
	t.Helper()
	client, err := objs.ifaceTable().lookup(uint32(loIfindex))
	if err != nil {
		t.Fatal(err)
	}
	backend = client
	backend.Ip, backend.Epg, backend.Slot = ip4(localIP), 20, 0
	copy(backend.Mac[:], dataplane.ContivMAC(localIP))
	set = func(ifc contivbpfCbIface) {
		t.Helper()
		if err := objs.ifaceTable().put(uint32(loIfindex), &ifc, nil); err != nil {
			t.Fatal(err)
		}
	}
	return client, backend, set
}

// memoOf is a client→VIP entry's state holding a memo of a flow entry in state st.
func memoOf(st contivbpfCbCtState) uint8 { return ctMemo | uint8(st) }

// memoStamp is the stamp a memo taken now of a flow of service id carries: the service's
// revision, the policy epoch and the memo generation, summed (cb_svc_memo_stamp).
func memoStamp(t *testing.T, objs *contivbpfObjects, id uint32) uint32 {
	t.Helper()
	var rev contivbpfCbSvcRev
	var epoch uint32
	var gen contivbpfCbCtGen
	if err := objs.CbSvcRevs.Lookup(id%svcRevSlots, &rev); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbCtGens.Lookup(uint32(0), &gen); err != nil {
		t.Fatal(err)
	}
	return rev.Rev + epoch + gen.Gen
}

// oneTick runs try until one run of it starts and ends in the same tick of the conntrack
// clock (cb_now: CLOCK_MONOTONIC_COARSE), where a service flow's client packets trust
// their memo of the flow's entry without looking it up: try(i) sets up its own flow from
// attempt number i and returns what it saw wrong ("" for nothing).
func oneTick(t *testing.T, try func(i int) string) {
	t.Helper()
	for i := 0; i < 50; i++ {
		start, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		bad := try(i)
		end, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		if start == end {
			if bad != "" {
				t.Fatal(bad)
			}
			return
		}
	}
	t.Fatal("no attempt ran within one tick of the clock")
}

// Within one tick a service flow's client packets trust the memo their client→VIP entry
// holds of the flow's own entry (cb_svc_fast: no lookup, no refresh to write). Every change
// of that entry in between makes the next client packet do exactly what the full stage
// would: a reply that establishes the flow or a FIN that closes it (the client→VIP entry
// follows the flow's new deadline), a policy change that now refuses it, its backend
// leaving the service.
// memoFixture is the fixture of the memo tests: policy and services on, group 20 admits
// group 10 on TCP 8080, and service id (vip:80/TCP) balances to localIP:8080.
func memoFixture(t *testing.T, id uint32, vip netip.Addr) *contivbpfObjects {
	t.Helper()
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "allow-8080", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 8080, Action: dataplane.ActionAllow}}})
	putTestService(t, objs, id, vip, 80, 6, 8080, localIP)
	return objs
}

func TestServiceFastPathMemo(t *testing.T) {
	vip := netip.MustParseAddr("10.1.0.103")
	objs := memoFixture(t, 12, vip)
	fc := objs.CbFromContainer
	client, backend, as := backendIfaces(t, objs)
	// open starts flow number i (its own client port) and takes its memo: the SYN through
	// the full stage, then an ACK through the fast path.
	open := func(i int) uint16 {
		t.Helper()
		cport := uint16(44000 + i)
		run(t, objs, fc, l4Frame(6, srcIP, vip, cport, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, l4Frame(6, srcIP, vip, cport, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
		return cport
	}
	ack := func(cport uint16) runResult {
		t.Helper()
		return run(t, objs, fc, l4Frame(6, srcIP, vip, cport, 80, tcpACK, 0), nil)
	}
	// followed says what is wrong with the flow's two entries after a client packet.
	followed := func(cport uint16, state contivbpfCbCtState, min, max time.Duration) string {
		t.Helper()
		svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, cport, 80)
		flow, ok2 := ctEntry(t, objs, testZone, 6, srcIP, localIP, cport, 8080)
		switch rem := remaining(t, flow); {
		case !ok || !ok2:
			return "an entry of the flow is gone"
		case flow.State != uint8(state) || rem < min || rem > max:
			return fmt.Sprintf("flow entry state %d with %v left, want state %d with %v..%v", flow.State, rem, state, min, max)
		case svc.Expires != flow.Expires:
			return fmt.Sprintf("client→VIP entry deadline %v from the flow's", time.Duration(int64(svc.Expires)-int64(flow.Expires)))
		case svc.State != memoOf(state) || svc.Epoch != memoStamp(t, objs, 12):
			return fmt.Sprintf("client→VIP entry state %#x stamp %d: no current memo", svc.State, svc.Epoch)
		}
		return ""
	}

	// The backend's reply (an ACK: the fast path's reply case; a FIN: the full stage).
	for n, c := range []struct {
		name     string
		flags    uint8
		state    contivbpfCbCtState
		min, max time.Duration
	}{
		{"reply establishes", tcpACK, contivbpfCbCtStateCB_CTS_ESTABLISHED, 5 * time.Hour, 7 * time.Hour},
		{"FIN closes", tcpFIN | tcpACK, contivbpfCbCtStateCB_CTS_CLOSING, 5 * time.Second, 11 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			oneTick(t, func(i int) string {
				cport := open(100*n + i)
				as(backend)
				run(t, objs, fc, l4Frame(6, localIP, srcIP, 8080, cport, c.flags, 0), nil).expect(t, tcActRedirect, FwdLocal)
				as(client)
				ack(cport).expect(t, tcActRedirect, FwdLocal)
				return followed(cport, c.state, c.min, c.max)
			})
		})
	}
	t.Run("policy refuses", func(t *testing.T) {
		oneTick(t, func(i int) string {
			cport := open(200 + i)
			putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
				{ID: "deny-8080", Priority: 10, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionDeny}}})
			var epoch uint32
			if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
				t.Fatal(err)
			}
			setEpoch(t, objs, epoch+1)
			r := ack(cport)
			putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
				{ID: "allow-8080", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 8080, Action: dataplane.ActionAllow}}})
			setEpoch(t, objs, epoch+2)
			if r.ret != tcActShot || r.diff[DropPolicy] != 1 {
				return fmt.Sprintf("after the policy change the flow's packet got %d (%v), want a drop_policy", r.ret, r.diff)
			}
			return ""
		})
	})
	// Switched off (the agent does on machines where loads may pass loads): no memo is
	// written, the entry keeps the bare revision, the flow goes on.
	t.Run("off", func(t *testing.T) {
		if err := objs.CbSvcMemoOff.Set(uint32(1)); err != nil {
			t.Fatal(err)
		}
		defer objs.CbSvcMemoOff.Set(uint32(0))
		cport := open(400)
		ack(cport).expect(t, tcActRedirect, FwdLocal)
		svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, cport, 80)
		var rev contivbpfCbSvcRev
		if err := objs.CbSvcRevs.Lookup(uint32(12), &rev); err != nil {
			t.Fatal(err)
		}
		if !ok || svc.State != uint8(contivbpfCbCtStateCB_CTS_NEW) || svc.Epoch != rev.Rev {
			t.Fatalf("client→VIP entry state %#x epoch %d (found %v), want NEW at revision %d", svc.State, svc.Epoch, ok, rev.Rev)
		}
	})
	t.Run("backend leaves", func(t *testing.T) {
		oneTick(t, func(i int) string {
			cport := open(300 + i)
			removeMember(t, objs, 12, localIP)
			putTestService(t, objs, 12, vip, 80, 6, 8080, remoteIP)
			r := ack(cport)
			putTestService(t, objs, 12, vip, 80, 6, 8080, localIP)
			removeMember(t, objs, 12, remoteIP)
			if r.ret != tcActRedirect || r.diff[FwdTunnel] != 1 {
				return fmt.Sprintf("after its backend left the flow's packet got %d (%v), want it sent to the new backend", r.ret, r.diff)
			}
			return ""
		})
	})
}

// A client→VIP entry that recorded its service's revision without a memo (the full
// stage's check, cb_lb_forward; the fast path's with the memo off) holds its backend
// without a membership lookup only while that revision is current: after the backend
// left (its membership deleted, the revision bumped) the flow's next packet is
// re-balanced, through the full stage (an IPv4 option: the fast path never sees it) as
// through the fast path with the memo off. (With a memo the membership is looked up
// anyway: TestServiceFastPathMemo "backend leaves" cannot see the revision rule.)
func TestServiceRevisionHoldsNoLeftBackend(t *testing.T) {
	vip := netip.MustParseAddr("10.1.0.105")
	objs := memoFixture(t, 14, vip)
	for i, c := range []struct {
		name    string
		opts    []byte
		memoOff uint32
	}{
		{"full stage", []byte{1, 1, 1, 0}, 0},
		{"fast path, memo off", nil, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ack := openAtRevision(t, objs, 14, vip, uint16(47000+i), c.opts, c.memoOff)
			removeMember(t, objs, 14, localIP)
			putTestService(t, objs, 14, vip, 80, 6, 8080, remoteIP)
			defer func() {
				putTestService(t, objs, 14, vip, 80, 6, 8080, localIP)
				removeMember(t, objs, 14, remoteIP)
			}()
			if r := ack(); r.ret != tcActRedirect || r.diff[FwdTunnel] != 1 {
				t.Errorf("after its backend left the flow's packet got %d (%v), want it sent to the new backend", r.ret, r.diff)
			}
		})
	}
}

// A service flow's own acknowledgment noted by the fast path is carried into its memo
// (the copy of tcp_ack[0] in the client→VIP entry), so it stales no memo: neither its own
// nor the host's other service flows'. Were the note to move the memo generation, every
// MiB a service flow acknowledged would cost every other service flow of the host its
// memo (one membership and one conntrack lookup more on its next packet), a cost growing
// with the number of flows times their throughput.
func TestServiceFastPathNoteKeepsMemos(t *testing.T) {
	vip := netip.MustParseAddr("10.1.0.104")
	objs := memoFixture(t, 13, vip)
	fc := objs.CbFromContainer
	ack := func(cport uint16, seq, ack uint32) {
		t.Helper()
		run(t, objs, fc, withSeq(l4Frame(6, srcIP, vip, cport, 80, tcpACK, 0), seq, ack), nil).expect(t, tcActRedirect, FwdLocal)
	}
	memo := func(cport uint16) (contivbpfCbCtEntry, contivbpfCbCtEntry) {
		t.Helper()
		svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, cport, 80)
		flow, ok2 := ctEntry(t, objs, testZone, 6, srcIP, localIP, cport, 8080)
		if !ok || !ok2 {
			t.Fatalf("flow from port %d: an entry is gone", cport)
		}
		return svc, flow
	}
	for _, cport := range []uint16{46000, 46001} {
		run(t, objs, fc, withSeq(l4Frame(6, srcIP, vip, cport, 80, tcpSYN, 0), 1000, 0), nil).expect(t, tcActRedirect, FwdLocal)
		ack(cport, 1001, 5000) // the fast path: membership looked up, the first note
	}
	for _, cport := range []uint16{46000, 46001} {
		ack(cport, 1001, 5000) // nothing due: both memos taken at the current stamp
	}
	var g0 contivbpfCbCtGen
	if err := objs.CbCtGens.Lookup(uint32(0), &g0); err != nil {
		t.Fatal(err)
	}
	ack(46000, 1001, 5000+3<<20) // a note due, on the fast path
	var g1 contivbpfCbCtGen
	if err := objs.CbCtGens.Lookup(uint32(0), &g1); err != nil {
		t.Fatal(err)
	}
	if g1.Gen != g0.Gen {
		t.Errorf("the fast path's note moved the memo generation %d -> %d", g0.Gen, g1.Gen)
	}
	svc, flow := memo(46000)
	if flow.TcpAck[0] != 5000+3<<20 || svc.TcpAck[0] != flow.TcpAck[0] || svc.Epoch != memoStamp(t, objs, 13) {
		t.Errorf("noting flow: entry's note %d, memo's copy %d, stamp %d (current %d)", flow.TcpAck[0], svc.TcpAck[0], svc.Epoch, memoStamp(t, objs, 13))
	}
	if other, _ := memo(46001); other.State&ctMemo == 0 || other.Epoch != memoStamp(t, objs, 13) {
		t.Errorf("another service flow's memo is stale after the note: state %#x stamp %d, current %d", other.State, other.Epoch, memoStamp(t, objs, 13))
	}
}

// A client that is its own backend can make one tuple both a service flow's packet and
// its hairpin flow's reply: the full stage takes it as the reply (cb_lb_reply first). The
// hairpin flow's entry marks the service flow's client→VIP entry (CB_CT_SHADOW), so the
// service fast path leaves such packets to the full stage.
func TestServiceFastPathShadow(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.102")
	putTestService(t, objs, 11, vip, 80, 6, 8080, srcIP)      // the client serves VIP:80 itself
	putTestService(t, objs, 12, vip, 5000, 6, 5000, remoteIP) // VIP:5000 is another host's
	fc := objs.CbFromContainer
	// The service flow src:8080 → VIP:5000, then the hairpin flow src:5000 → VIP:80 →
	// src:8080, whose balanced packet is VIP:5000 → src:8080.
	run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 5000, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	if svc, _ := ctEntry(t, objs, testZone, 6, srcIP, vip, 8080, 5000); svc.Flags&uint8(contivbpfCbCtFlagsCB_CT_SHADOW) != 0 {
		t.Fatalf("a service entry with nothing under its reverse tuple is shadowed: %+v", svc)
	}
	run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 5000, tcpACK, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	r := run(t, objs, fc, l4Frame(6, srcIP, vip, 5000, 80, tcpSYN, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if src, dst, sport, dport := checkSums(t, r.out); src != vip || sport != 5000 || dst != srcIP || dport != 8080 {
		t.Fatalf("the hairpin SYN left as %v:%d → %v:%d, want %v:5000 → %v:8080", src, sport, dst, dport, vip, srcIP)
	}
	if svc, _ := ctEntry(t, objs, testZone, 6, srcIP, vip, 8080, 5000); svc.Flags&uint8(contivbpfCbCtFlagsCB_CT_SHADOW) == 0 {
		t.Fatalf("the hairpin flow's entry did not shadow the service entry under its reverse tuple: %+v", svc)
	}
	// src:8080 → VIP:5000 is now the hairpin flow's reply: back to src:5000 from VIP:80.
	r = run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 5000, tcpACK, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if src, dst, sport, dport := checkSums(t, r.out); src != vip || sport != 80 || dst != srcIP || dport != 5000 {
		t.Fatalf("the hairpin reply left as %v:%d → %v:%d, want %v:80 → %v:5000", src, sport, dst, dport, vip, srcIP)
	}
}

// The other order: a client→VIP entry made while a service flow's entry lies under its
// reverse tuple (here an expired one, which the full stage does not take the packet as a
// reply of; on another CPU, one made after this packet looked) is shadowed at once
// (cb_ct_shadow).
func TestServiceFastPathShadowNew(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.102")
	putTestService(t, objs, 11, vip, 80, 6, 8080, srcIP)
	putTestService(t, objs, 12, vip, 5000, 6, 5000, remoteIP)
	fc := objs.CbFromContainer
	// The hairpin flow src:5000 → VIP:80 → src:8080 (its entry: VIP:5000 → src:8080), expired.
	run(t, objs, fc, l4Frame(6, srcIP, vip, 5000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	k := contivbpfCbCtKey{Zone: testZone, Saddr: ip4(vip), Daddr: ip4(srcIP), Sport: nport(5000), Dport: nport(8080), Proto: 6}
	var e contivbpfCbCtEntry
	if err := objs.CbCt.Lookup(&k, &e); err != nil {
		t.Fatalf("the hairpin flow's entry: %v", err)
	}
	e.Expires = 1
	if err := objs.CbCt.Put(&k, &e); err != nil {
		t.Fatal(err)
	}
	// The service flow src:8080 → VIP:5000 is balanced (no live reply entry) and shadowed.
	run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 5000, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	if svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, 8080, 5000); !ok || svc.Flags&uint8(contivbpfCbCtFlagsCB_CT_SHADOW) == 0 {
		t.Fatalf("a client→VIP entry made over a service flow's reverse entry is not shadowed: %+v (found %v)", svc, ok)
	}
}

// The fast path notes in a flow's entry the host veth of its local destination
// (cb_dst_note: a client→VIP entry notes its backend's) and finds the destination there on
// the next packet (cb_dst_noted), an array read instead of the endpoint table's hash
// lookup. It trusts the note only while the interface table holds that endpoint behind
// it: an endpoint that moves to another veth, a veth reused by another endpoint, another
// tenant's endpoint of the same address there, an endpoint that went elsewhere (now
// remote) each get what the endpoint table says. Direct flows and service flows.
func TestFastPathDstNote(t *testing.T) {
	for _, svc := range []bool{false, true} {
		name := "direct"
		if svc {
			name = "service"
		}
		t.Run(name, func(t *testing.T) { testFastPathDstNote(t, svc) })
	}
}

func testFastPathDstNote(t *testing.T, svc bool) {
	objs := ctPolicyFixture(t)
	fc := objs.CbFromContainer
	dst, dport := localIP, uint16(80)
	if svc {
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
		dst = netip.MustParseAddr("10.1.0.101")
		putTestService(t, objs, 9, dst, 80, 6, 80, localIP)
	}
	// macAt is the MAC local endpoint ip has behind ifindex here: each place its own, so
	// that the frame shows where it went.
	macAt := func(ip netip.Addr, ifindex uint32) []byte {
		m := dataplane.ContivMAC(ip)
		m[1] = byte(ifindex)
		return m
	}
	// place puts localIP behind ifindex (net: its network's key) as the agent does: its
	// interface entry, then its endpoint entry.
	place := func(ip netip.Addr, net, ifindex uint32) {
		t.Helper()
		ifc := contivbpfCbIface{Net: net, Ip: ip4(ip), Epg: 20, Slot: testSlot(ip), Vrf: testZone}
		copy(ifc.Mac[:], macAt(ip, ifindex))
		ep := contivbpfCbEndpoint{Ifindex: ifindex, Epg: 20, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL), Slot: testSlot(ip)}
		copy(ep.Mac[:], macAt(ip, ifindex))
		if err := objs.ifaceTable().put(ifindex, &ifc, nil); err != nil {
			t.Fatal(err)
		}
		if err := objs.CbEndpoints.Put(&contivbpfCbEpKey{Net: net, Ip: ip4(ip)}, &ep); err != nil {
			t.Fatal(err)
		}
	}
	unplace := func(ifindex uint32) {
		t.Helper()
		if err := objs.ifaceTable().del(ifindex); err != nil {
			t.Fatal(err)
		}
	}
	note := func() uint16 {
		t.Helper()
		e, ok := ctEntry(t, objs, testZone, 6, srcIP, dst, 43000, dport)
		if !ok {
			t.Fatal("the flow's entry is gone")
		}
		return e.Nodeport // the field's other name: dst_ifindex
	}
	// sent sends the flow's next ACK and checks where it went.
	sent := func(what string, reason Reason, mac []byte, noted uint16) {
		t.Helper()
		r := run(t, objs, fc, l4Frame(6, srcIP, dst, 43000, dport, tcpACK, 0), nil)
		r.expect(t, tcActRedirect, reason)
		if _, to, _, _ := checkSums(t, r.out); to != localIP && reason == FwdLocal {
			t.Fatalf("%s: went to %v, want %v", what, to, localIP)
		}
		if mac != nil && !bytes.Equal(r.out[:6], mac) {
			t.Fatalf("%s: went to MAC %v, want %v", what, net.HardwareAddr(r.out[:6]), net.HardwareAddr(mac))
		}
		if n := note(); n != noted {
			t.Fatalf("%s: the entry notes ifindex %d, want %d", what, n, noted)
		}
	}
	place(localIP, testNet, peerIfindex)
	run(t, objs, fc, l4Frame(6, srcIP, dst, 43000, dport, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	if n := note(); n != 0 {
		t.Fatalf("a new entry notes ifindex %d", n)
	}
	sent("fast ACK", FwdLocal, macAt(localIP, peerIfindex), peerIfindex)
	sent("noted", FwdLocal, macAt(localIP, peerIfindex), peerIfindex)

	// It moves to another veth: the note (its old veth has no entry) is looked past.
	unplace(peerIfindex)
	place(localIP, testNet, 11)
	sent("moved", FwdLocal, macAt(localIP, 11), 11)
	sent("noted again", FwdLocal, macAt(localIP, 11), 11)

	// It moves to 12 and its old veth's index goes to another endpoint.
	unplace(11)
	place(netip.MustParseAddr("10.1.0.6"), testNet, 11)
	place(localIP, testNet, 12)
	sent("veth reused", FwdLocal, macAt(localIP, 12), 12)

	// Another tenant's endpoint of the same address behind the noted veth.
	unplace(12)
	place(localIP, testNet+1, 12)
	place(localIP, testNet, 13)
	sent("other tenant's", FwdLocal, macAt(localIP, 13), 13)

	// It went to another host: the endpoint table says remote; the note is left (no local
	// endpoint to name) and not trusted.
	unplace(13)
	if err := objs.CbEndpoints.Put(&contivbpfCbEpKey{Net: testNet, Ip: ip4(localIP)},
		&contivbpfCbEndpoint{Vtep: ip4(netip.MustParseAddr(testVTEP)), Epg: 20, Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)}); err != nil {
		t.Fatal(err)
	}
	sent("remote", FwdTunnel, nil, 13)
}

// With services on, the fast path trusts a direct flow's entry under the packet's own tuple
// to be no service flow's reply without looking at the reverse tuple: a service flow's
// entry (DNAT) made there marks it (CB_CT_SHADOW), as does the direct entry itself when it
// is written second, and the full stage then takes its packets. A direct flow with
// nothing under its reverse is not marked.
func TestFastPathShadowDirect(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.101")
	putTestService(t, objs, 9, vip, 80, 6, 80, localIP)
	fc := objs.CbFromContainer
	client, err := objs.ifaceTable().lookup(uint32(loIfindex))
	if err != nil {
		t.Fatal(err)
	}
	backend := client
	backend.Ip, backend.Epg, backend.Slot = ip4(localIP), 20, testSlot(localIP)
	copy(backend.Mac[:], dataplane.ContivMAC(localIP))
	sendAs := func(ifc contivbpfCbIface, pkt []byte) runResult {
		t.Helper()
		if err := objs.ifaceTable().put(uint32(loIfindex), &ifc, nil); err != nil {
			t.Fatal(err)
		}
		return run(t, objs, fc, pkt, nil)
	}
	flags := func(from, to netip.Addr, sport, dport uint16) uint8 {
		t.Helper()
		e, ok := ctEntry(t, objs, testZone, 6, from, to, sport, dport)
		if !ok {
			t.Fatalf("no entry %v:%d → %v:%d", from, sport, to, dport)
		}
		return e.Flags
	}
	shadow := uint8(contivbpfCbCtFlagsCB_CT_SHADOW)

	// A direct flow backend:80 → client:43000, then the client's service flow on the
	// reverse tuple (client:43000 → VIP:80 → backend:80): its entry marks the direct one.
	sendAs(backend, l4Frame(6, localIP, srcIP, 80, 43000, tcpSYN, 0)).expect(t, tcActRedirect, FwdLocal)
	sendAs(backend, l4Frame(6, localIP, srcIP, 80, 43000, tcpACK, 0)).expect(t, tcActRedirect, FwdLocal)
	if f := flags(localIP, srcIP, 80, 43000); f != uint8(contivbpfCbCtFlagsCB_CT_ALLOWED) {
		t.Fatalf("a direct flow with nothing under its reverse tuple has flags %#x", f)
	}
	sendAs(client, l4Frame(6, srcIP, vip, 43000, 80, tcpSYN, 0)).expect(t, tcActRedirect, FwdLocal)
	if f := flags(localIP, srcIP, 80, 43000); f&shadow == 0 {
		t.Fatalf("the direct flow's entry under a service flow's reverse tuple is not marked: flags %#x", f)
	}
	// The backend's next packet on that tuple passes (the full stage decides it).
	sendAs(backend, l4Frame(6, localIP, srcIP, 80, 43000, tcpACK, 0)).expect(t, tcActRedirect, FwdLocal)

	// The other order: the service flow's entry first (expired, so the backend's SYN is
	// no reply of it), then the direct flow's, which marks itself.
	sendAs(client, l4Frame(6, srcIP, vip, 43001, 80, tcpSYN, 0)).expect(t, tcActRedirect, FwdLocal)
	k := contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(localIP), Sport: nport(43001), Dport: nport(80), Proto: 6}
	var e contivbpfCbCtEntry
	if err := objs.CbCt.Lookup(&k, &e); err != nil {
		t.Fatalf("the service flow's entry: %v", err)
	}
	e.Expires = 1
	if err := objs.CbCt.Put(&k, &e); err != nil {
		t.Fatal(err)
	}
	sendAs(backend, l4Frame(6, localIP, srcIP, 80, 43001, tcpSYN, 0)).expect(t, tcActRedirect, FwdLocal)
	if f := flags(localIP, srcIP, 80, 43001); f&shadow == 0 {
		t.Fatalf("a direct flow's entry made over a service flow's reverse entry is not marked: flags %#x", f)
	}
}

// Entries an earlier build wrote carry no CB_CT_SHADOW: the driver's start pass
// (markShadowed) marks every entry whose reverse tuple holds a service flow's entry, and
// nothing else.
func TestMarkShadowed(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.101")
	allowed, dnat := uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), uint8(contivbpfCbCtFlagsCB_CT_DNAT)
	shadow := uint8(contivbpfCbCtFlagsCB_CT_SHADOW)
	key := func(src, dst netip.Addr, sport, dport uint16) contivbpfCbCtKey {
		return contivbpfCbCtKey{Zone: testZone, Saddr: ip4(src), Daddr: ip4(dst), Sport: nport(sport), Dport: nport(dport), Proto: 6}
	}
	// As an earlier build left them: a service flow (client → backend, DNAT) with a direct
	// flow under its reverse tuple, a service flow alone, a direct flow alone.
	entries := []struct {
		k     contivbpfCbCtKey
		flags uint8
		want  uint8
	}{
		{key(srcIP, localIP, 43000, 80), allowed | dnat, allowed | dnat},
		{key(localIP, srcIP, 80, 43000), allowed, allowed | shadow},
		{key(srcIP, localIP, 43001, 80), allowed | dnat, allowed | dnat},
		{key(srcIP, localIP, 43002, 80), allowed, allowed},
	}
	for _, e := range entries {
		v := contivbpfCbCtEntry{Flags: e.flags, State: uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED), Expires: ^uint64(0) >> 1,
			NatIp: ip4(vip), NatPort: nport(80), NatNet: testNet}
		if e.flags&dnat == 0 {
			v.NatIp, v.NatPort, v.NatNet = 0, 0, 0
		}
		if err := objs.CbCt.Put(&e.k, &v); err != nil {
			t.Fatal(err)
		}
	}
	n, err := markShadowed(objs.CbCt)
	if err != nil || n != 1 {
		t.Fatalf("markShadowed marked %d (%v), want 1", n, err)
	}
	for _, e := range entries {
		var v contivbpfCbCtEntry
		if err := objs.CbCt.Lookup(&e.k, &v); err != nil {
			t.Fatal(err)
		}
		if v.Flags != e.want {
			t.Errorf("entry %+v: flags %#x, want %#x", e.k, v.Flags, e.want)
		}
	}
	if n, err := markShadowed(objs.CbCt); err != nil || n != 0 {
		t.Fatalf("a second pass marked %d (%v), want none", n, err)
	}
}

// The collector deletes entries it read a moment before (one may have been refreshed
// since) and every entry of a flushed address: after a pass that deleted a service flow's
// entry (DNAT) no memo of one taken before stays current (the memo generation jumps).
// A pass that deleted only other entries leaves the generation alone.
func TestGCMovesMemoGeneration(t *testing.T) {
	objs := loadTestObjects(t)
	gen := func() uint32 {
		t.Helper()
		var g contivbpfCbCtGen
		if err := objs.CbCtGens.Lookup(uint32(0), &g); err != nil {
			t.Fatal(err)
		}
		return g.Gen
	}
	put := func(sport uint16, flags uint8) {
		t.Helper()
		k := contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(localIP), Sport: nport(sport), Dport: nport(80), Proto: 6}
		v := contivbpfCbCtEntry{Flags: flags, State: uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED), Expires: 1}
		if err := objs.CbCt.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	g := newCTGC(objs.CbCt, time.Hour)
	g.gens = objs.CbCtGens
	before := gen()
	put(40500, uint8(contivbpfCbCtFlagsCB_CT_ALLOWED))
	if n, err := g.pass(); err != nil || n != 1 || gen() != before {
		t.Fatalf("a pass deleting a direct flow's entry: %d deleted (%v), generation moved by %d", n, err, gen()-before)
	}
	put(40501, uint8(contivbpfCbCtFlagsCB_CT_ALLOWED|contivbpfCbCtFlagsCB_CT_DNAT))
	if n, err := g.pass(); err != nil || n != 1 || gen()-before != 1<<20 {
		t.Fatalf("a pass deleting a service flow's entry: %d deleted (%v), generation moved by %d, want %d", n, err, gen()-before, 1<<20)
	}
}

// With the shortcuts switched off (cb_svc_memo_off: the agent's setting where loads may
// pass loads), the revision rule is off too: a client→VIP entry at the current revision
// does not vouch for its backend, whose membership is looked up on every packet. The
// membership is deleted here without the revision's bump, as a weakly ordered reader can
// see it: with the switch on (x86) the recorded revision still holds the backend, with it
// off the flow's next packet is re-balanced, through the full stage (an IPv4 option) as
// through the fast path.
func TestMemoOffLooksMembershipUp(t *testing.T) {
	svcEpoch := func(t *testing.T, objs *contivbpfObjects, cport uint16, vip netip.Addr) uint32 {
		t.Helper()
		svc, _ := ctEntry(t, objs, testZone, 6, srcIP, vip, cport, 80)
		return svc.Epoch
	}
	vip := netip.MustParseAddr("10.1.0.106")
	objs := memoFixture(t, 15, vip)
	for i, c := range []struct {
		name    string
		opts    []byte
		memoOff uint32
		want    Reason // counter the ACK after the unbumped removal moves
	}{
		{"full stage, shortcuts on", []byte{1, 1, 1, 0}, 0, FwdLocal},
		{"full stage, shortcuts off", []byte{1, 1, 1, 0}, 1, FwdTunnel},
		{"fast path, shortcuts off", nil, 1, FwdTunnel},
	} {
		t.Run(c.name, func(t *testing.T) {
			cport := uint16(48000 + i)
			ack := openAtRevision(t, objs, 15, vip, cport, c.opts, c.memoOff)
			var rev contivbpfCbSvcRev
			// The membership gone and another backend in its place, the revision not
			// (yet) bumped.
			for _, err := range []error{
				objs.CbMembers.Delete(&contivbpfCbMemberKey{SvcId: 15, Ip: ip4(localIP)}),
				objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: 15, Index: 0}, &contivbpfCbBackend{Ip: ip4(remoteIP), Net: testNet}),
				objs.CbMembers.Put(&contivbpfCbMemberKey{SvcId: 15, Ip: ip4(remoteIP)}, &contivbpfCbMember{Net: testNet}),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := objs.CbSvcRevs.Lookup(uint32(15), &rev); err != nil || rev.Rev != svcEpoch(t, objs, cport, vip) {
				t.Fatalf("the revision moved (%v): the case needs it unchanged", err)
			}
			defer func() {
				putTestService(t, objs, 15, vip, 80, 6, 8080, localIP)
				removeMember(t, objs, 15, remoteIP)
			}()
			if r := ack(); r.ret != tcActRedirect || r.diff[c.want] != 1 {
				t.Errorf("after its backend's membership went (revision unchanged) the flow's packet got %d (%v), want %v", r.ret, r.diff, c.want)
			}
		})
	}
}

// openAtRevision sets the memo switch (memoOff; set back to on at the end of t), opens a
// service flow from srcIP:cport to vip:80 of service id (its SYN, then an ACK with IPv4
// options opts: nil takes the fast path) and checks that its client→VIP entry recorded
// the service's revision without a memo. It returns the flow's ACK, sent the same way.
func openAtRevision(t *testing.T, objs *contivbpfObjects, id uint32, vip netip.Addr, cport uint16, opts []byte, memoOff uint32) func() runResult {
	t.Helper()
	if err := objs.CbSvcMemoOff.Set(memoOff); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = objs.CbSvcMemoOff.Set(uint32(0)) })
	fc := objs.CbFromContainer
	ack := func() runResult {
		t.Helper()
		return run(t, objs, fc, l4FrameOpts(6, srcIP, vip, cport, 80, tcpACK, ipOpts{options: opts}), nil)
	}
	run(t, objs, fc, l4Frame(6, srcIP, vip, cport, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	ack().expect(t, tcActRedirect, FwdLocal)
	var rev contivbpfCbSvcRev
	if err := objs.CbSvcRevs.Lookup(id, &rev); err != nil {
		t.Fatal(err)
	}
	if svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, cport, 80); !ok || svc.Epoch != rev.Rev || svc.State&ctMemo != 0 {
		t.Fatalf("client→VIP entry epoch %d state %#x (found %v), want revision %d without a memo", svc.Epoch, svc.State, ok, rev.Rev)
	}
	return ack
}
