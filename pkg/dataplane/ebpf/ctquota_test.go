package ebpf

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// setCTQuota writes the per-endpoint conntrack quota into the config (0: none).
func setCTQuota(t *testing.T, objs *contivbpfObjects, quota uint32) {
	t.Helper()
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.CtQuota = quota })
}

// expireCT sets the deadline of the entry under k in m (a conntrack table) to long ago.
func expireCT(t *testing.T, m *ebpf.Map, k contivbpfCbCtKey) {
	t.Helper()
	var v contivbpfCbCtEntry
	if err := m.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	v.Expires = 1
	if err := m.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
}

// ctOwned reads the count of the flows the endpoint with owner slot slot opened.
func ctOwned(t *testing.T, objs *contivbpfObjects, slot uint32) uint32 {
	t.Helper()
	return ctCount(t, objs.CbCtOwned, slot)
}

// ctCount reads slot's count in m (cb_ct_owned or cb_ct_owned_in).
func ctCount(t *testing.T, m *ebpf.Map, slot uint32) uint32 {
	t.Helper()
	var c contivbpfCbCtCount
	if err := m.Lookup(slot, &c); err != nil {
		t.Fatal(err)
	}
	return c.Count
}

// The per-endpoint quota: past it an endpoint's new flows are refused (drop_ct_quota),
// its established flows and the other endpoints' flows pass, repeated openings of one flow
// take the quota once, and the collector's recount frees what entries went away.
func TestConntrackQuota(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	a, b := testSlot(srcIP), testSlot(localIP)
	setCTQuota(t, objs, 2)
	wantCount := func(slot, want uint32) {
		t.Helper()
		if got := ctOwned(t, objs, slot); got != want {
			t.Fatalf("slot %d holds %d entries, want %d", slot, got, want)
		}
	}
	wantIn := func(slot, want uint32) {
		t.Helper()
		if got := ctCount(t, objs.CbCtOwnedIn, slot); got != want {
			t.Fatalf("slot %d holds %d entries opened to it, want %d", slot, got, want)
		}
	}

	// A (the sender, srcIP) opens two flows: both entries are A's.
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 41001, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	for _, p := range []struct {
		proto uint8
		sport uint16
		dport uint16
	}{{6, 41000, 443}, {17, 41001, 53}} {
		if e, ok := ctEntry(t, objs, testZone, p.proto, srcIP, remoteIP, p.sport, p.dport); !ok || uint32(e.Owner) != a {
			t.Fatalf("flow %d/%d: entry %+v (found %v), want owner %d", p.proto, p.sport, e, ok, a)
		}
	}
	wantCount(a, 2)

	// The third is refused, and leaves no entry; a bare ACK of an unknown flow too.
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41002, 443, tcpSYN, 0), nil).expect(t, tcActShot, DropCTQuota)
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 41003, 53, 0, 0), nil).expect(t, tcActShot, DropCTQuota)
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41004, 443, tcpACK, 0), nil).expect(t, tcActShot, DropCTQuota)
	for _, sport := range []uint16{41002, 41004} {
		if _, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, sport, 443); ok {
			t.Fatalf("a refused flow (port %d) left an entry", sport)
		}
	}
	wantCount(a, 2)

	// A's flows keep passing: retransmitted SYNs (also one that reopens the entry after a
	// policy change) take no more quota; the reply establishes the flow.
	for i := 0; i < 5; i++ {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	}
	setEpoch(t, objs, 7)
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	wantCount(a, 2)
	run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 41000, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpACK, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 41001, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	wantCount(a, 2)

	// B (localIP, receiving from the overlay) has a quota of its own, for the flows opened
	// to it.
	run(t, objs, ov, l4Frame(17, remoteIP, localIP, 5000, 53, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	if e, ok := ctEntry(t, objs, testZone, 17, remoteIP, localIP, 5000, 53); !ok || uint32(e.Owner) != b|ownerIn {
		t.Fatalf("B's flow: entry %+v (found %v), want owner %d|in", e, ok, b)
	}
	wantIn(b, 1)
	wantCount(b, 0)
	wantCount(a, 2)

	// One of A's entries goes (as a datapath deletion would, unseen by the count): the
	// collector's recount gives A room for one more flow.
	k := contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(remoteIP), Sport: nport(41001), Dport: nport(53), Proto: 17}
	if err := objs.CbCt.Delete(&k); err != nil {
		t.Fatal(err)
	}
	// A stale count on a slot no entry names is reset too.
	if err := objs.CbCtOwned.Put(uint32(9), &contivbpfCbCtCount{Count: 5}); err != nil {
		t.Fatal(err)
	}
	g := newCTGC(objs.CbCt, time.Hour)
	g.owned, g.ownedIn = objs.CbCtOwned, objs.CbCtOwnedIn
	if _, err := g.pass(); err != nil {
		t.Fatal(err)
	}
	wantCount(a, 1)
	wantIn(b, 1)
	wantCount(9, 0)
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41002, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	wantCount(a, 2)
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41005, 443, tcpSYN, 0), nil).expect(t, tcActShot, DropCTQuota)

	// Expired entries are not counted by the recount.
	expireCT(t, objs.CbCt, contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(remoteIP), Sport: nport(41002), Dport: nport(443), Proto: 6})
	if _, err := g.pass(); err != nil {
		t.Fatal(err)
	}
	wantCount(a, 1)

	// Quota 0: no limit (the count still follows).
	setCTQuota(t, objs, 0)
	for i := uint16(0); i < 3; i++ {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41010+i, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	}
	wantCount(a, 4)
}

// TestConntrackQuotaOpener (Datapath v3 issue, hole 3): the quota charges the flow's
// opener. A remote peer that may open flows to an endpoint fills only the endpoint's
// quota of flows opened to it: past it the peer's new flows are refused, while the
// endpoint still opens its own (its DNS included) and its established flows pass.
func TestConntrackQuotaOpener(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	a := testSlot(srcIP)
	setCTQuota(t, objs, 3)
	// The endpoint's group takes UDP from the peer (its flows are tracked).
	setEPG(t, objs, srcIP, 40)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 40, Rules: []dataplane.PolicyRule{
		{ID: "udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionAllow}}})
	for i := uint16(0); i < 3; i++ {
		run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 6000+i, 7000, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	}
	for i := uint16(3); i < 6; i++ {
		run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 6000+i, 7000, 0, 0), ovl).expect(t, tcActShot, DropCTQuota)
	}
	if got, in := ctOwned(t, objs, a), ctCount(t, objs.CbCtOwnedIn, a); got != 0 || in != 3 {
		t.Fatalf("counts after the peer's flood: %d opened, %d opened to it; want 0 and 3", got, in)
	}
	// The endpoint's own flows: unaffected.
	for i := uint16(0); i < 3; i++ {
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 5300+i, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	}
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 5303, 53, 0, 0), nil).expect(t, tcActShot, DropCTQuota)
	// Flows the peer opened keep passing both ways.
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 7000, 6000, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 6000, 7000, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	// Their replies take nothing more of either count.
	if got, in := ctOwned(t, objs, a), ctCount(t, objs.CbCtOwnedIn, a); got != 3 || in != 3 {
		t.Fatalf("counts: %d opened, %d opened to it; want 3 and 3", got, in)
	}
}

// A service flow holds two entries of its client's (client→backend and client→VIP); the
// quota is checked when the flow opens, so it may end one past it.
func TestConntrackQuotaService(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.101")
	putTestService(t, objs, 2, vip, 53, 17, 5353, remoteIP)
	fc := objs.CbFromContainer
	a := testSlot(srcIP)
	setCTQuota(t, objs, 3)

	run(t, objs, fc, l4Frame(17, srcIP, vip, 42000, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	if got := ctOwned(t, objs, a); got != 2 {
		t.Fatalf("one service flow: %d entries counted, want 2", got)
	}
	if e, ok := ctEntry(t, objs, testZone, 17, srcIP, vip, 42000, 53); !ok || uint32(e.Owner) != a {
		t.Fatalf("client→VIP entry %+v (found %v), want owner %d", e, ok, a)
	}
	run(t, objs, fc, l4Frame(17, srcIP, vip, 42000, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, fc, l4Frame(17, srcIP, vip, 42001, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	if got := ctOwned(t, objs, a); got != 4 {
		t.Fatalf("two service flows: %d entries counted, want 4", got)
	}
	run(t, objs, fc, l4Frame(17, srcIP, vip, 42002, 53, 0, 0), nil).expect(t, tcActShot, DropCTQuota)
	if _, ok := ctEntry(t, objs, testZone, 17, srcIP, vip, 42002, 53); ok {
		t.Fatal("a refused service flow left its client→VIP entry")
	}
	g := newCTGC(objs.CbCt, time.Hour)
	g.owned = objs.CbCtOwned
	if _, err := g.pass(); err != nil {
		t.Fatal(err)
	}
	if got := ctOwned(t, objs, a); got != 4 {
		t.Fatalf("recount: %d entries, want 4", got)
	}
}

// A slot handed out starts at 0 entries, and the counts are sized like the slots.
func TestConntrackQuotaDriver(t *testing.T) {
	testroot.Need(t)
	objs := loadTestObjects(t)
	d := &Driver{objs: *objs, eps: endpointIndex{slots: map[uint32]string{}}, mapFull: map[string]uint64{}}
	if err := objs.CbCtOwned.Put(uint32(1), &contivbpfCbCtCount{Count: 42}); err != nil {
		t.Fatal(err)
	}
	s, err := d.allocSlot("ep")
	if err != nil || s != 1 {
		t.Fatalf("allocSlot = %d, %v; want 1", s, err)
	}
	if got := ctOwned(t, objs, s); got != 0 {
		t.Fatalf("a new slot holds %d entries, want 0", got)
	}
	if err := objs.CbCtOwnedIn.Put(uint32(2), &contivbpfCbCtCount{Count: 42}); err != nil {
		t.Fatal(err)
	}
	if s, err := d.allocSlot("ep2"); err != nil || s != 2 || ctCount(t, objs.CbCtOwnedIn, s) != 0 {
		t.Fatalf("allocSlot = %d, %v; want 2 with no entries opened to it", s, err)
	}
	if objs.CbCtOwned.MaxEntries() != objs.CbEpCounters.MaxEntries() {
		t.Fatalf("%s has %d entries, %s %d", contivbpfMapCbCtOwned, objs.CbCtOwned.MaxEntries(), contivbpfMapCbEpCounters, objs.CbEpCounters.MaxEntries())
	}
}

// The driver writes HostConfig.CTQuota into cb_config (a restart changes it) and refuses a
// negative one.
func TestConntrackQuotaConfig(t *testing.T) {
	h := newOneHost(t)
	quota := func() uint32 {
		t.Helper()
		var c contivbpfCbConfig
		if err := h.d.objs.CbCfg.Lookup(uint32(0), &c); err != nil {
			t.Fatal(err)
		}
		return c.CtQuota
	}
	if q := quota(); q != 0 {
		t.Fatalf("quota %d without CTQuota, want 0", q)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.cfg.CTQuota = 3
	h.d = h.start(t)
	if q := quota(); q != 3 {
		t.Fatalf("quota %d, want 3", q)
	}
	bad := h.cfg
	bad.CTQuota = -1
	if d, err := New(context.Background(), bad.HostConfig, bad.Options); err == nil {
		_ = d.Close()
		t.Fatal("New accepted CTQuota -1")
	}
}

// TestMarkInbound (found by review): entries an earlier build wrote for flows opened to an
// endpoint carry its slot without the ownerIn mark; at start the driver marks them
// (markInbound), so the collector counts them as opened to it and the endpoint keeps its
// own quota after an upgrade. Entries of flows it opened, of other zones or other
// endpoints, and ones already marked are left as they are.
func TestMarkInbound(t *testing.T) {
	objs := loadTestObjects(t)
	a := uint16(testSlot(srcIP))
	put := func(zone uint32, kind uint8, src, dst netip.Addr, owner uint16) contivbpfCbCtKey {
		t.Helper()
		k := contivbpfCbCtKey{Zone: zone, Kind: kind, Saddr: ip4(src), Daddr: ip4(dst), Sport: nport(5000), Dport: nport(53), Proto: 17}
		v := contivbpfCbCtEntry{Expires: 1 << 62, Flags: uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), State: 1, Owner: owner}
		if err := objs.CbCt.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
		return k
	}
	in := put(testZone, 0, remoteIP, srcIP, a)             // opened to srcIP by a remote peer
	np := put(testZone, ctKindNodePort, worldIP, srcIP, a) // a node port client's, to srcIP
	own := put(testZone, 0, srcIP, remoteIP, a)            // srcIP's own
	other := put(testZone+1, 0, remoteIP, srcIP, a)        // another zone's address
	done := put(testZone, 0, localIP, srcIP, a|ownerIn)    // already marked
	n, err := markInbound(objs.CbCt, map[uint16]ownerAddr{a: {zone: testZone, ip: ip4(srcIP)}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("marked %d entries, want 2", n)
	}
	for k, want := range map[contivbpfCbCtKey]uint16{in: a | ownerIn, np: a | ownerIn, own: a, other: a, done: a | ownerIn} {
		var v contivbpfCbCtEntry
		if err := objs.CbCt.Lookup(&k, &v); err != nil {
			t.Fatal(err)
		}
		if v.Owner != want {
			t.Errorf("entry %+v: owner %#x, want %#x", k, v.Owner, want)
		}
	}
	g := newCTGC(objs.CbCt, time.Hour)
	g.owned, g.ownedIn = objs.CbCtOwned, objs.CbCtOwnedIn
	if _, err := g.pass(); err != nil {
		t.Fatal(err)
	}
	if got, gotIn := ctOwned(t, objs, uint32(a)), ctCount(t, objs.CbCtOwnedIn, uint32(a)); got != 2 || gotIn != 3 {
		t.Errorf("counts after the recount: %d own, %d opened to it; want 2 and 3", got, gotIn)
	}
}

// TestConntrackInLimit (found by review): the quotas of flows opened to each endpoint
// added up to the whole table, so a peer reaching enough endpoints filled it and every
// endpoint lost its own flows. Flows opened from outside now also count together
// (cb_ct_owned_in[0]) against cb_config.ct_in_limit (the driver: half the table): past it
// the next one is refused whatever its receiver holds, and the endpoints' own flows
// still open. A node port flow to a backend on another host, which has no local owner,
// counts there too.
func TestConntrackInLimit(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	setCTQuota(t, objs, 10)
	editConfig(t, objs, func(c *contivbpfCbConfig) { c.CtInLimit = 3 })
	setEPG(t, objs, srcIP, 40)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 40, Rules: []dataplane.PolicyRule{
		{ID: "udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionAllow}}})
	run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 6000, 7000, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 6001, 7000, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, ov, l4Frame(17, remoteIP, localIP, 6002, 7000, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	// At the limit: another receiver, far under its own quota, is refused all the same.
	run(t, objs, ov, l4Frame(17, remoteIP, localIP, 6003, 7000, 0, 0), ovl).expect(t, tcActShot, DropCTQuota)
	if total, b := ctCount(t, objs.CbCtOwnedIn, 0), ctCount(t, objs.CbCtOwnedIn, testSlot(localIP)); total != 3 || b != 1 {
		t.Errorf("counts of flows opened from outside: %d together, %d to localIP; want 3 and 1", total, b)
	}
	// The endpoints' own flows open.
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 5300, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	// The collector's recount keeps the total.
	g := newCTGC(objs.CbCt, time.Hour)
	g.owned, g.ownedIn = objs.CbCtOwned, objs.CbCtOwnedIn
	if _, err := g.pass(); err != nil {
		t.Fatal(err)
	}
	if total := ctCount(t, objs.CbCtOwnedIn, 0); total != 3 {
		t.Errorf("recount: %d flows opened from outside, want 3", total)
	}
}
