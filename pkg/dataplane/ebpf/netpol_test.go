package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// putKPod writes (p != nil) or deletes the NetworkPolicy layer of ip in zone straight into
// the maps, each direction's rules as a set of its own.
func putKPod(t *testing.T, objs *contivbpfObjects, zone uint32, ip netip.Addr, p *dataplane.PodPolicy) {
	t.Helper()
	key := contivbpfCbKpodKey{Zone: zone, Addr: ip4(ip)}
	if p == nil {
		_ = objs.CbKpods.Delete(&key)
		return
	}
	v := contivbpfCbKpod{}
	base := ip4(ip)<<1 ^ zone // set ids of this address: base+1, base+2
	for i, dir := range []struct {
		iso   bool
		rules []dataplane.PodRule
		flag  uint32
		set   *uint32
	}{{p.IngressIsolated, p.Ingress, kpodInIsolated, &v.InSet}, {p.EgressIsolated, p.Egress, kpodOutIsolated, &v.OutSet}} {
		if !dir.iso {
			continue
		}
		v.Flags |= dir.flag
		if len(dir.rules) == 0 {
			continue
		}
		rules, _ := compileKRules(dir.rules)
		id := base + uint32(i) + 1
		putKSet(t, objs, id, rules)
		*dir.set = id
	}
	if err := objs.CbKpods.Put(&key, &v); err != nil {
		t.Fatal(err)
	}
}

// putKSet writes rule set id as the driver does: its compiled form (what the programs
// look up), then its record.
func putKSet(t *testing.T, objs *contivbpfObjects, id uint32, rules []contivbpfCbKrule) {
	t.Helper()
	// (The tests reuse a pod's set ids: what an earlier content left goes first.)
	var k contivbpfCbKcidrKey
	var v contivbpfCbKcidr
	var old []contivbpfCbKcidrKey
	it := objs.CbKcidrs.Iterate()
	for it.Next(&k, &v) {
		if k.Set == id {
			old = append(old, k)
		}
	}
	for i := range old {
		if err := objs.CbKcidrs.Delete(&old[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeKSet(plainPut, objs, id, rules, 0); err != nil {
		t.Fatal(err)
	}
	s := contivbpfCbKset{Count: uint32(len(rules))}
	copy(s.Rules[:], rules)
	if err := objs.CbKsets.Put(&id, &s); err != nil {
		t.Fatal(err)
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestNetpol: the NetworkPolicy layer on crafted packets (fixture of loadTestObjects:
// srcIP sends from lo, localIP is local, remoteIP behind the peer VTEP).
func TestNetpol(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NETPOL))
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	epoch := uint32(1)
	set := func(ip netip.Addr, p *dataplane.PodPolicy) {
		t.Helper()
		putKPod(t, objs, testZone, ip, p)
		epoch++
		setEpoch(t, objs, epoch)
	}

	t.Run("no entry: untracked, no conntrack", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		if _, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 40000, 80); ok {
			t.Fatal("a flow between pods without NetworkPolicy was tracked")
		}
	})

	// remoteIP admits TCP 80 and UDP 5000-5010 from srcIP's /32 only.
	set(remoteIP, &dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{
		{Remote: netip.PrefixFrom(srcIP, 32), Proto: 6, PortMin: 80, PortMax: 80},
		{Remote: netip.PrefixFrom(srcIP, 32), Proto: 17, PortMin: 5000, PortMax: 5010},
	}})
	t.Run("ingress allow-list", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40001, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40001, 81, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40001, 80, 0, 0), nil).expect(t, tcActShot, DropNetpol)
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40001, 5000, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40001, 5010, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40001, 5011, 0, 0), nil).expect(t, tcActShot, DropNetpol)
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40001, 4999, 0, 0), nil).expect(t, tcActShot, DropNetpol)
		// ICMP has no ports: a rule with ports never admits it.
		run(t, objs, fc, icmpEcho(srcIP, remoteIP, 8, 7), nil).expect(t, tcActShot, DropNetpol)
		// Another sender is not on the list (localIP → remoteIP arrives on the overlay
		// side only as a reply; judge it from the remote's view instead: remote → local
		// is egress of an unisolated pod to a pod without entry, so it passes).
		run(t, objs, ov, l4Frame(6, remoteIP, localIP, 80, 40002, tcpSYN, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("replies of allowed flows pass, forged replies do not open", func(t *testing.T) {
		// The SYN-ACK of the allowed flow passes although remoteIP may not open flows to
		// srcIP's port 40001... (srcIP is not isolated, so nothing would stop it anyway);
		// isolate srcIP for ingress with no rules: the reply still passes (conntrack), a
		// bare ACK from the remote on a flow that does not exist is judged and dropped.
		set(srcIP, &dataplane.PodPolicy{IngressIsolated: true})
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40003, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 80, 40003, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 80, 40004, tcpACK, 0), ovl).expect(t, tcActShot, DropNetpol)
		run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 80, 40004, tcpSYN, 0), ovl).expect(t, tcActShot, DropNetpol)
		run(t, objs, ov, l4Frame(17, remoteIP, srcIP, 53, 40004, 0, 0), ovl).expect(t, tcActShot, DropNetpol)
	})
	t.Run("a policy change cuts established flows it no longer allows", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40003, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		set(remoteIP, &dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{{Remote: pfx("10.9.0.0/16")}}})
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40003, 80, tcpACK, 0), nil).expect(t, tcActShot, DropNetpol)
		if _, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 40003, 80); ok {
			t.Fatal("the cut flow's entry is still there")
		}
	})
	t.Run("egress isolation: only the listed prefix, any protocol", func(t *testing.T) {
		set(srcIP, &dataplane.PodPolicy{EgressIsolated: true, Egress: []dataplane.PodRule{{Remote: pfx("10.1.0.2/31")}}}) // .2 and .3
		set(remoteIP, nil)
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40005, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
		run(t, objs, fc, icmpEcho(srcIP, remoteIP, 8, 9), nil).expect(t, tcActShot, DropNetpol)
		run(t, objs, fc, l4Frame(17, srcIP, localIP, 40005, 9, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, fc, icmpEcho(srcIP, localIP, 8, 9), nil).expect(t, tcActRedirect, FwdLocal)
		// Isolated with no rules: nothing at all.
		set(srcIP, &dataplane.PodPolicy{EgressIsolated: true})
		run(t, objs, fc, l4Frame(17, srcIP, localIP, 40006, 9, 0, 0), nil).expect(t, tcActShot, DropNetpol)
		set(srcIP, nil)
		run(t, objs, fc, l4Frame(17, srcIP, localIP, 40006, 9, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("both sides must allow", func(t *testing.T) {
		set(srcIP, &dataplane.PodPolicy{EgressIsolated: true, Egress: []dataplane.PodRule{{Remote: pfx("0.0.0.0/0"), Proto: 6, PortMin: 443, PortMax: 443}}})
		set(remoteIP, &dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{{Remote: pfx("0.0.0.0/0"), Proto: 6, PortMin: 80, PortMax: 80}}})
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40007, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40007, 443, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
		set(remoteIP, &dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{{Remote: pfx("0.0.0.0/0"), Proto: 6, PortMin: 1, PortMax: 65535}}})
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40007, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		set(srcIP, nil)
		set(remoteIP, nil)
	})
	t.Run("group rules still decide first", func(t *testing.T) {
		setEPG(t, objs, srcIP, 10)
		putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
			{ID: "no-22", Priority: 5, Proto: 6, Port: 22, Action: dataplane.ActionDeny},
		}})
		var st contivbpfCbEpgState
		st.Flags = uint32(contivbpfCbEpgFlagsCB_EPG_RULES)
		if err := objs.CbEpgs.Put(uint32(10), &st); err != nil {
			t.Fatal(err)
		}
		set(remoteIP, &dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{{Remote: pfx("0.0.0.0/0")}}})
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40008, 22, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 40008, 23, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		set(remoteIP, nil)
	})
	t.Run("zones: another tenant's entry for the same address does nothing", func(t *testing.T) {
		putKPod(t, objs, testZone+1, remoteIP, &dataplane.PodPolicy{IngressIsolated: true})
		run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40009, 9, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		putKPod(t, objs, testZone+1, remoteIP, nil)
	})
	t.Run("fragments follow their first fragment", func(t *testing.T) {
		set(remoteIP, &dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{{Remote: pfx("0.0.0.0/0"), Proto: 17, PortMin: 53, PortMax: 53}}})
		first := l4Frame(17, srcIP, remoteIP, 40010, 54, 0, 0x2000) // MF, offset 0
		run(t, objs, fc, first, nil).expect(t, tcActShot, DropNetpol)
		later := l4Frame(17, srcIP, remoteIP, 40010, 53, 0, 0x0003) // offset 24: its "ports" are payload
		run(t, objs, fc, later, nil).expect(t, tcActShot, DropPolicy)
		set(remoteIP, nil)
	})
}

// TestNetpolSets: the driver's shared rule sets (by content) and their reference counts.
func TestNetpolKRules(t *testing.T) {
	a, ka := compileKRules([]dataplane.PodRule{{Remote: pfx("10.0.0.0/8"), Proto: 6, PortMin: 80, PortMax: 90}})
	_, kb := compileKRules([]dataplane.PodRule{{Remote: pfx("10.0.0.0/8"), Proto: 6, PortMin: 80, PortMax: 91}})
	if ka == kb {
		t.Fatalf("different rules share a content key %q", ka)
	}
	if a[0].PortMin != 80 || a[0].PortMax != 90 || a[0].Proto != 6 || a[0].RemoteIp != ip4(netip.MustParseAddr("10.0.0.0")) {
		t.Fatalf("compiled %+v", a[0])
	}
}

// TestNetpolNodeAndOutside: a pod isolated both ways with no rules still talks with its
// own node (probes, kubelet), while egress to the outside (NAT) is judged like any flow.
func TestNetpolNodeAndOutside(t *testing.T) {
	objs := natFixture(t, 64)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NETPOL))
	fc := objs.CbFromContainer
	if err := objs.CbHostRoutes.Put(ip4(srcIP), &contivbpfCbHostRoute{Ifindex: loIfindex}); err != nil {
		t.Fatal(err)
	}
	putKPod(t, objs, testZone, srcIP, &dataplane.PodPolicy{IngressIsolated: true, EgressIsolated: true})
	setEpoch(t, objs, 7)
	run(t, objs, fc, l4Frame(6, srcIP, hostIP, 40000, 10250, tcpSYN, 0), nil).expect(t, 0, FwdHost)
	run(t, objs, fc, l4Frame(6, srcIP, hostIP, 8080, 51000, tcpSYN|tcpACK, 0), nil).expect(t, 0, FwdHost) // a probe's answer
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40001, 443, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
	putKPod(t, objs, testZone, srcIP, &dataplane.PodPolicy{EgressIsolated: true, Egress: []dataplane.PodRule{{Remote: netip.PrefixFrom(worldIP, 32), Proto: 6, PortMin: 443, PortMax: 443}}})
	setEpoch(t, objs, 8)
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40001, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdEgress)
	run(t, objs, fc, l4Frame(6, srcIP, worldIP, 40002, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
}

// countKSets is the number of rule sets in the map.
func countKSets(t *testing.T, objs *contivbpfObjects) int {
	t.Helper()
	n := 0
	var k uint32
	var v contivbpfCbKset
	it := objs.CbKsets.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPodPolicyDriver: the driver shares rule sets between pods with equal rules, frees a
// set with its last pod, fails an unusable policy closed, keeps what a Sync names and
// sweeps what it does not, and lists it all for operators (netctl bpf netpol).
func TestPodPolicyDriver(t *testing.T) {
	ctx := context.Background()
	h, a, b, _, state := opsHost(t)
	rules := []dataplane.PodRule{{Remote: pfx("10.50.0.0/24"), Proto: 6, PortMin: 8080, PortMax: 8090}}
	pa := dataplane.PodPolicy{ID: a.ID, NetworkID: a.NetworkID, IP: a.IP, IngressIsolated: true, Ingress: rules}
	pb := dataplane.PodPolicy{ID: b.ID, NetworkID: b.NetworkID, IP: b.IP, IngressIsolated: true, Ingress: rules, EgressIsolated: true}
	for _, p := range []dataplane.PodPolicy{pa, pb} {
		if err := h.d.UpsertPodPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if n := countKSets(t, &h.d.objs); n != 1 {
		t.Fatalf("%d rule sets for two pods with equal rules, want 1", n)
	}
	l, err := h.d.Listing(dataplane.ListQuery{Kind: "netpol"})
	if err != nil || len(l.Rows) != 3 {
		t.Fatalf("listing: %v %v", l, err)
	}
	if r := l.Rows[0]; r[1] != "10.50.0.2" || r[2] != a.ID || r[3] != "ingress" || r[6] != "10.50.0.0/24" || r[7] != "tcp" || r[8] != "8080-8090" {
		t.Errorf("row %v", r)
	}
	if r := l.Rows[2]; r[1] != "10.50.0.3" || r[3] != "egress" || r[6] != "(no rule: deny all)" {
		t.Errorf("row %v", r)
	}
	if err := h.d.DeletePodPolicy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if n := countKSets(t, &h.d.objs); n != 1 {
		t.Fatalf("%d rule sets while b still uses it, want 1", n)
	}
	// Unusable: failed closed, both ways, no rules; the set is released.
	bad := pb
	bad.Ingress = []dataplane.PodRule{{Remote: netip.Prefix{}}}
	var perr *PodPolicyError
	if err := h.d.UpsertPodPolicy(ctx, bad); !errors.As(err, &perr) {
		t.Fatalf("bad policy: %v", err)
	}
	var v contivbpfCbKpod
	if err := h.d.objs.CbKpods.Lookup(&contivbpfCbKpodKey{Zone: vrfOf(b.NetworkID), Addr: ip4(b.IP)}, &v); err != nil ||
		v.Flags != kpodInIsolated|kpodOutIsolated || v.InSet != 0 || v.OutSet != 0 {
		t.Fatalf("failed-closed entry %+v %v", v, err)
	}
	if n := countKSets(t, &h.d.objs); n != 0 {
		t.Fatalf("%d rule sets after the last user failed closed, want 0", n)
	}
	// An address reused in the zone: deleting the first pod's policy leaves the second's.
	reuse := pb
	reuse.ID = "red.t-b2"
	if err := h.d.UpsertPodPolicy(ctx, reuse); err != nil {
		t.Fatal(err)
	}
	if err := h.d.DeletePodPolicy(ctx, pb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.d.objs.CbKpods.Lookup(&contivbpfCbKpodKey{Zone: vrfOf(b.NetworkID), Addr: ip4(b.IP)}, &v); err != nil || v.InSet == 0 {
		t.Fatalf("the reused address lost its entry with the other pod's deletion: %+v %v", v, err)
	}
	if err := h.d.DeletePodPolicy(ctx, reuse.ID); err != nil {
		t.Fatal(err)
	}
	// Set ids are never handed out while in use, also when the counter wraps.
	h.d.np.mu.Lock()
	h.d.np.nextKSetID = ^uint32(0) - 1
	h.d.np.mu.Unlock()
	for i, r := range []dataplane.PodRule{{Remote: pfx("10.1.0.0/16")}, {Remote: pfx("10.2.0.0/16")}, {Remote: pfx("10.3.0.0/16")}} {
		p := dataplane.PodPolicy{ID: fmt.Sprintf("w%d", i), NetworkID: a.NetworkID, IP: netip.AddrFrom4([4]byte{10, 50, 0, byte(50 + i)}), IngressIsolated: true, Ingress: []dataplane.PodRule{r}}
		if err := h.d.UpsertPodPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[uint32]bool{}
	for id := range h.d.np.ksetIDs {
		if id == 0 || ids[id] {
			t.Fatalf("set id %d handed out twice or zero: %v", id, h.d.np.ksetIDs)
		}
		ids[id] = true
	}
	if len(ids) != 3 || countKSets(t, &h.d.objs) != 3 {
		t.Fatalf("%d ids, %d sets after the wrap; want 3", len(ids), countKSets(t, &h.d.objs))
	}
	for i := range 3 {
		if err := h.d.DeletePodPolicy(ctx, fmt.Sprintf("w%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	// A Sync keeps what it names (also across a driver restart) and sweeps the rest.
	state.PodPolicies = []dataplane.PodPolicy{pa}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = h.start(t)
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	n := 0
	var k contivbpfCbKpodKey
	it := h.d.objs.CbKpods.Iterate()
	for it.Next(&k, &v) {
		n++
		if k.Addr != ip4(a.IP) || v.InSet == 0 {
			t.Errorf("entry %+v %+v after Sync", k, v)
		}
	}
	if n != 1 || countKSets(t, &h.d.objs) != 1 {
		t.Fatalf("after Sync and restart: %d pods, %d sets; want 1, 1", n, countKSets(t, &h.d.objs))
	}
}

// TestNetpolOffMovesMemoGeneration (found by review): with NetworkPolicy off, flows' stamps
// stop counting their zones', so a service memo's stamp could come back to an earlier value
// while the service's revision moved; the driver moves the memo generation on when the
// feature goes off, and only then.
func TestNetpolOffMovesMemoGeneration(t *testing.T) {
	ctx := context.Background()
	h, a, _, _, _ := opsHost(t)
	gen := func() uint32 {
		t.Helper()
		var g contivbpfCbCtGen
		if err := h.d.objs.CbCtGens.Lookup(uint32(0), &g); err != nil {
			t.Fatal(err)
		}
		return uint32(g.Gen)
	}
	p := dataplane.PodPolicy{ID: a.ID, NetworkID: a.NetworkID, IP: a.IP, IngressIsolated: true}
	if err := h.d.UpsertPodPolicy(ctx, p); err != nil {
		t.Fatal(err)
	}
	before := gen()
	if err := h.d.UpsertPodPolicy(ctx, p); err != nil { // still on: no jump
		t.Fatal(err)
	}
	if g := gen(); g != before {
		t.Errorf("memo generation moved from %d to %d while NetworkPolicy stayed on", before, g)
	}
	if err := h.d.DeletePodPolicy(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g-before < 1<<20 {
		t.Errorf("memo generation %d after NetworkPolicy went off, was %d: no jump", g, before)
	}
}
