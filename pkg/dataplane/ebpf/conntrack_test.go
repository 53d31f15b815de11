package ebpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

const (
	tcpFIN = 0x01
	tcpRST = 0x04
)

// ctEntry reads the conntrack entry of a flow (zone testZone unless given).
func ctEntry(t *testing.T, objs *contivbpfObjects, zone uint32, proto uint8, src, dst netip.Addr, sport, dport uint16) (contivbpfCbCtEntry, bool) {
	t.Helper()
	return ctEntryKind(t, objs, zone, 0, proto, src, dst, sport, dport)
}

// ctEntryKind is ctEntry in zone's space kind (ctKindNodePort: a node port flow's).
func ctEntryKind(t *testing.T, objs *contivbpfObjects, zone uint32, kind, proto uint8, src, dst netip.Addr, sport, dport uint16) (contivbpfCbCtEntry, bool) {
	t.Helper()
	k := contivbpfCbCtKey{Zone: zone, Kind: kind, Saddr: ip4(src), Daddr: ip4(dst), Sport: nport(sport), Dport: nport(dport), Proto: proto}
	var v contivbpfCbCtEntry
	if err := objs.CbCt.Lookup(&k, &v); err != nil {
		return v, false
	}
	return v, true
}

// putTestService writes a service of the fixture's zone: VIP:port/proto → backends (all
// in the test network) on target, with membership and the VIP.
func putTestService(t *testing.T, objs *contivbpfObjects, id uint32, vip netip.Addr, port uint16, proto uint8, target uint16, backends ...netip.Addr) {
	t.Helper()
	errs := []error{objs.CbServices.Put(&contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip), Port: nport(port), Proto: proto},
		&contivbpfCbSvc{Id: id, Count: uint32(len(backends)), TargetPort: nport(target)})}
	for i, b := range backends {
		errs = append(errs,
			objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: id, Index: uint32(i)}, &contivbpfCbBackend{Ip: ip4(b), Net: testNet}),
			objs.CbMembers.Put(&contivbpfCbMemberKey{SvcId: id, Ip: ip4(b)}, &contivbpfCbMember{Net: testNet}))
	}
	errs = append(errs, objs.CbVips.Put(&contivbpfCbVipKey{Zone: testZone, Vip: ip4(vip)}, &contivbpfCbVip{}),
		svcRevBump(objs.CbSvcRevs, id))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A service on an endpoint's address stamps its group (Driver.UpsertService).
	var ep contivbpfCbEndpoint
	if objs.CbEndpoints.Lookup(&contivbpfCbEpKey{Net: testNet, Ip: ip4(vip)}, &ep) == nil {
		var epoch uint32
		if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
			t.Fatal(err)
		}
		setEpoch(t, objs, epoch+1)
	}
}

// removeMember takes backend ip out of service id as the driver does: the membership,
// then the service's revision (cb_svc_revs), so no flow keeps it on trust.
func removeMember(t *testing.T, objs *contivbpfObjects, id uint32, ip netip.Addr) {
	t.Helper()
	if err := objs.CbMembers.Delete(&contivbpfCbMemberKey{SvcId: id, Ip: ip4(ip)}); err != nil {
		t.Fatal(err)
	}
	if err := svcRevBump(objs.CbSvcRevs, id); err != nil {
		t.Fatal(err)
	}
}

func setZone(t *testing.T, objs *contivbpfObjects, zone uint32) {
	t.Helper()
	ifc, err := objs.ifaceTable().lookup(uint32(loIfindex))
	if err != nil {
		t.Fatal(err)
	}
	ifc.Vrf = zone
	if err := objs.ifaceTable().put(uint32(loIfindex), &ifc, nil); err != nil {
		t.Fatal(err)
	}
	var n contivbpfCbNetwork
	if err := objs.CbNetworks.Lookup(uint32(testNet), &n); err != nil {
		t.Fatal(err)
	}
	n.Vrf = zone
	if err := objs.CbNetworks.Put(uint32(testNet), &n); err != nil {
		t.Fatal(err)
	}
}

// setEpoch is a change of every group and zone in use (what one global policy epoch
// was): the groups of the endpoints and the zones of the networks stamped with epoch,
// then the clock set to it (stamps.go), so every entry recorded before is judged again.
func setEpoch(t *testing.T, objs *contivbpfObjects, epoch uint32) {
	t.Helper()
	var groups []uint16
	var zones []uint32
	var k contivbpfCbEpKey
	var ep contivbpfCbEndpoint
	it := objs.CbEndpoints.Iterate()
	for it.Next(&k, &ep) {
		if ep.Epg != 0 {
			groups = append(groups, ep.Epg)
		}
	}
	var nk uint32
	var n contivbpfCbNetwork
	nit := objs.CbNetworks.Iterate()
	for nit.Next(&nk, &n) {
		zones = append(zones, n.Vrf)
	}
	if err := errors.Join(it.Err(), nit.Err(), stampGroups(objs.CbEpgs, objs.CbZoneStamps, epoch, groups, zones),
		objs.CbPolicyEpoch.Set(epoch)); err != nil {
		t.Fatal(err)
	}
}

// remaining is how long an entry has left, from now.
func remaining(t *testing.T, e contivbpfCbCtEntry) time.Duration {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(int64(e.Expires) - int64(now))
}

// ctPolicyFixture: lo 10.1.0.2 in EPG 10, local 10.1.0.3 in EPG 20 (Contiv's pattern: deny
// tcp SYN, allow tcp 80 from 10), remote 10.1.0.4 in EPG 30; EPG 10 refuses new flows from
// EPG 30 and UDP in.
func ctPolicyFixture(t *testing.T) *contivbpfObjects {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 10)
	setEPG(t, objs, localIP, 20)
	setEPG(t, objs, remoteIP, 30)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-80", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
	}})
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "no-30-in", Priority: 9, Ingress: true, RemoteEPG: 30, Action: dataplane.ActionDeny},
		{ID: "no-udp-in", Priority: 5, Ingress: true, Proto: 17, Action: dataplane.ActionDeny},
	}})
	return objs
}

func TestConntrackTCPStates(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}

	// SYN out → NEW (60 s); SYN-ACK back → ESTABLISHED (6 h); FIN → CLOSING (10 s).
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	e, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 41000, 443)
	if !ok || e.State != uint8(contivbpfCbCtStateCB_CTS_NEW) || remaining(t, e) > 61*time.Second || remaining(t, e) < 55*time.Second {
		t.Fatalf("after SYN: entry %+v (found %v), want NEW with ~60 s", e, ok)
	}
	run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 41000, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	e, _ = ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 41000, 443)
	if e.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) || remaining(t, e) < 5*time.Hour {
		t.Fatalf("after SYN-ACK: entry %+v, want ESTABLISHED with ~6 h", e)
	}
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpACK, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 41000, tcpFIN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	e, _ = ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 41000, 443)
	if e.State != uint8(contivbpfCbCtStateCB_CTS_CLOSING) || remaining(t, e) > 11*time.Second {
		t.Fatalf("after FIN: entry %+v, want CLOSING with ~10 s", e)
	}
	// The last ACK still passes; the entry stays CLOSING.
	run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41000, 443, tcpACK, 0), nil).expect(t, tcActRedirect, FwdTunnel)

	t.Run("new-flow-from-denied-side", func(t *testing.T) {
		// EPG 30 may not open flows into EPG 10, with or without SYN.
		run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 5555, 22, tcpSYN, 0), ovl).expect(t, tcActShot, DropPolicy)
		run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 5555, 22, tcpACK, 0), ovl).expect(t, tcActShot, DropPolicy)
		if _, ok := ctEntry(t, objs, testZone, 6, remoteIP, srcIP, 5555, 22); ok {
			t.Error("a denied packet created an entry")
		}
	})
	t.Run("rst-without-entry-creates-none", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41001, 443, tcpRST, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		if _, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, 41001, 443); ok {
			t.Error("a RST created an entry")
		}
	})
	t.Run("expired-entry-is-absent", func(t *testing.T) {
		run(t, objs, fc, l4Frame(6, srcIP, remoteIP, 41002, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		expireCT(t, objs.CbCt, contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(remoteIP), Sport: nport(41002), Dport: nport(443), Proto: 6})
		// The reply of an expired flow is a new flow from EPG 30: denied.
		run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 443, 41002, tcpSYN|tcpACK, 0), ovl).expect(t, tcActShot, DropPolicy)
	})
}

// The Contiv pattern deny-tcp + allow-80: neither a bare ACK nor a SYN after it reaches
// port 22; a RST then a policy change then a SYN on the same tuple is judged again.
func TestConntrackBareACKAndRejudge(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc := objs.CbFromContainer
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40000, 22, tcpACK, 0), nil).expect(t, tcActShot, DropPolicy)
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40000, 22, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
	if _, ok := ctEntry(t, objs, testZone, 6, srcIP, localIP, 40000, 22); ok {
		t.Fatal("bare ACK or denied SYN left an entry")
	}

	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40001, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40001, 80, tcpRST, 0), nil).expect(t, tcActRedirect, FwdLocal)
	// Port 80 is no longer allowed: the next SYN on the same tuple is judged, not waved through.
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
	}})
	setEpoch(t, objs, 1)
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40001, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
}

// A policy change reaches established flows: those the new rules deny are cut on their next
// packet (and their entry removed); those they allow go on.
func TestConntrackEpoch(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc := objs.CbFromContainer
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40100, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, l4Frame(17, srcIP, localIP, 40101, 53, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-80", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
		{ID: "deny-udp", Priority: 10, Ingress: true, Proto: 17, Action: dataplane.ActionDeny},
	}})
	// Without an epoch change established flows are not re-judged.
	run(t, objs, fc, l4Frame(17, srcIP, localIP, 40101, 53, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
	setEpoch(t, objs, 7)
	run(t, objs, fc, l4Frame(17, srcIP, localIP, 40101, 53, 0, 0), nil).expect(t, tcActShot, DropPolicy)
	if _, ok := ctEntry(t, objs, testZone, 17, srcIP, localIP, 40101, 53); ok {
		t.Error("the cut flow kept its entry")
	}
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40100, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	if e, _ := ctEntry(t, objs, testZone, 6, srcIP, localIP, 40100, 80); e.Epoch != 7 {
		t.Errorf("allowed flow's epoch %d, want 7", e.Epoch)
	}

	t.Run("deny-all", func(t *testing.T) {
		// A group whose rule set failed is closed: established flows are cut too.
		if err := objs.CbEpgs.Put(uint32(20), &contivbpfCbEpgState{Flags: uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL)}); err != nil {
			t.Fatal(err)
		}
		setEpoch(t, objs, 8)
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40100, 80, tcpACK, 0), nil).expect(t, tcActShot, DropPolicy)
		run(t, objs, fc, l4Frame(6, srcIP, localIP, 40102, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
		run(t, objs, fc, icmpEcho(srcIP, localIP, 8, 3), nil).expect(t, tcActShot, DropPolicy)
	})
}

// Replies are recognised whichever side has the rules: EPG 10 refuses UDP in, yet the
// answer to its own query from a group without rules passes.
func TestConntrackReplyWhenOnlyReplySideHasRules(t *testing.T) {
	objs := ctPolicyFixture(t)
	setEPG(t, objs, remoteIP, 40) // no rules
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	run(t, objs, objs.CbFromContainer, l4Frame(17, srcIP, remoteIP, 40200, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, objs.CbTestOverlay, l4Frame(17, remoteIP, srcIP, 53, 40200, 0, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, objs.CbTestOverlay, l4Frame(17, remoteIP, srcIP, 53, 40201, 0, 0), ovl).expect(t, tcActShot, DropPolicy)
}

// Two tenants with the same addresses never share an entry.
func TestConntrackZones(t *testing.T) {
	objs := ctPolicyFixture(t)
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, remoteIP, 40300, 443, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, srcIP, 443, 40300, tcpSYN|tcpACK, 0), ovl).expect(t, tcActRedirect, FwdLocal)
	setZone(t, objs, testZone+1)
	defer setZone(t, objs, testZone)
	// Same tuple, other tenant: a new flow from EPG 30, denied.
	run(t, objs, objs.CbTestOverlay, l4Frame(6, remoteIP, srcIP, 443, 40300, tcpSYN|tcpACK, 0), ovl).expect(t, tcActShot, DropPolicy)
	if _, ok := ctEntry(t, objs, testZone+1, 6, srcIP, remoteIP, 40300, 443); ok {
		t.Error("an entry appeared in the other zone")
	}
}

// A full table refuses new flows, visibly, and keeps the established ones.
func TestConntrackFull(t *testing.T) {
	testroot.Need(t)
	objs := ctPolicyFixture(t)
	small, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: objs.CbCt.KeySize(), ValueSize: objs.CbCt.ValueSize(), MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	// Replace the program's table with the small one: reload against it.
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	spec.Maps[contivbpfMapCbCt].MaxEntries = 3
	repl := map[string]*ebpf.Map{contivbpfMapCbCt: small}
	for name, m := range map[string]*ebpf.Map{
		contivbpfMapCbIfaces: objs.CbIfaces, contivbpfMapCbIfaceDirect: objs.CbIfaceDirect, contivbpfMapCbEndpoints: objs.CbEndpoints, contivbpfMapCbNetworks: objs.CbNetworks,
		contivbpfMapCbCfg: objs.CbCfg, contivbpfMapCbPeers: objs.CbPeers, contivbpfMapCbPolicies: objs.CbPolicies,
		contivbpfMapCbEpgs: objs.CbEpgs, contivbpfMapCbReasons: objs.CbReasons, contivbpfMapCbEpCounters: objs.CbEpCounters,
	} {
		repl[name] = m
	}
	var o2 contivbpfObjects
	if err := spec.LoadAndAssign(&o2, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if err := o2.CbFeatures.Set(uint32(contivbpfCbFeaturesCB_FEAT_POLICY)); err != nil {
		t.Fatal(err)
	}
	fc := o2.CbFromContainer
	for i := uint16(0); i < 3; i++ {
		run(t, &o2, fc, l4Frame(6, srcIP, localIP, 40400+i, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	}
	run(t, &o2, fc, l4Frame(6, srcIP, localIP, 40410, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropCTFull)
	run(t, &o2, fc, l4Frame(17, srcIP, localIP, 40411, 80, 0, 0), nil).expect(t, tcActShot, DropCTFull)
	// Established flows keep passing, a retransmitted SYN too.
	run(t, &o2, fc, l4Frame(6, srcIP, localIP, 40401, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, &o2, fc, l4Frame(6, srcIP, localIP, 40402, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)

	// The collector frees expired entries; then new flows get in again.
	expireCT(t, small, contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(localIP), Sport: nport(40400), Dport: nport(80), Proto: 6})
	g := newCTGC(small, time.Hour)
	if n, err := g.pass(); err != nil || n != 1 {
		t.Fatalf("gc pass deleted %d (%v), want 1", n, err)
	}
	if st := g.stats; st.Entries != 2 || st.Runs != 1 || st.Deleted != 1 || st.Capacity != 3 {
		t.Errorf("gc stats %+v", st)
	}
	run(t, &o2, fc, l4Frame(6, srcIP, localIP, 40410, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)

	// A flush removes every entry of an address in its zone, and only in its zone.
	g.flush(testZone+1, localIP)
	if n, _ := g.pass(); n != 0 {
		t.Errorf("flush of another zone deleted %d entries", n)
	}
	g.flush(testZone, localIP)
	if n, _ := g.pass(); n != 3 {
		t.Errorf("flush deleted %d entries, want 3", n)
	}
}

// Service flows: a VIP belongs to its tenant; a removed backend's flow is re-balanced on its
// next packet.
func TestServiceScopeAndBackendRemoval(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.100")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// vip:80/udp → 10.1.0.3:8080 (local) and 10.1.0.4:8080 (remote).
	putTestService(t, objs, 1, vip, 80, 17, 8080, localIP, remoteIP)
	fc := objs.CbFromContainer

	// Find a source port balanced to the local backend.
	var sport uint16
	for p := uint16(45000); p < 45100; p++ {
		r := run(t, objs, fc, l4Frame(17, srcIP, vip, p, 80, 0, 0), nil)
		if _, d, _, _ := checkSums(t, r.out); d == localIP {
			sport = p
			break
		}
	}
	if sport == 0 {
		t.Fatal("no flow went to the local backend")
	}
	r := run(t, objs, fc, l4Frame(17, srcIP, vip, sport, 80, 0, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	// The local backend leaves the service: the same flow moves to the remote one.
	removeMember(t, objs, 1, localIP)
	must(objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: 1, Index: 0}, &contivbpfCbBackend{Ip: ip4(remoteIP), Net: testNet}))
	must(objs.CbServices.Put(&contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip), Port: nport(80), Proto: 17}, &contivbpfCbSvc{Id: 1, Count: 1, TargetPort: nport(8080)}))
	must(objs.CbBackends.Delete(&contivbpfCbBackendKey{SvcId: 1, Index: 1}))
	r = run(t, objs, fc, l4Frame(17, srcIP, vip, sport, 80, 0, 0), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	if _, d, _, dp := checkSums(t, r.out); d != remoteIP || dp != 8080 {
		t.Errorf("after backend removal the flow goes to %v:%d, want %v:8080", d, dp, remoteIP)
	}

	t.Run("other-tenant", func(t *testing.T) {
		setZone(t, objs, testZone+1)
		defer setZone(t, objs, testZone)
		run(t, objs, fc, l4Frame(17, srcIP, vip, 46000, 80, 0, 0), nil).expect(t, tcActShot, DropUnknownDst)
		run(t, objs, fc, arpFrame(1, dataplane.ContivMAC(srcIP), srcIP, vip), nil).expect(t, tcActShot, DropARPUnknownTarget)
	})
	t.Run("service-gone", func(t *testing.T) {
		must(objs.CbServices.Delete(&contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip), Port: nport(80), Proto: 17}))
		removeMember(t, objs, 1, remoteIP)
		run(t, objs, fc, l4Frame(17, srcIP, vip, sport, 80, 0, 0), nil).expect(t, tcActShot, DropUnknownDst)
	})
}

// icmpError builds an ICMP error (type typ) from src to dst quoting a UDP packet
// qsrc:qsport → qdst:qdport (its IPv4 header and 8 bytes of UDP).
func icmpError(src, dst netip.Addr, typ uint8, qsrc, qdst netip.Addr, qsport, qdport uint16) []byte {
	return icmpErrorOf(src, dst, typ, 17, qsrc, qdst, qsport, qdport)
}

// checkICMPError verifies the checksums of an ICMP error frame and returns its outer source
// and the quoted destination.
func checkICMPError(t *testing.T, f []byte) (src netip.Addr, qdst netip.AddrPort) {
	t.Helper()
	ip := f[14:]
	n := int(binary.BigEndian.Uint16(ip[2:]))
	if csum(ip[:20], 0) != 0 {
		t.Error("bad outer IP checksum")
	}
	icmp := ip[20:n]
	if csum(icmp, 0) != 0 {
		t.Error("bad ICMP checksum")
	}
	q := icmp[8:]
	if csum(q[:20], 0) != 0 {
		t.Error("bad quoted IP checksum")
	}
	return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrPortFrom(netip.AddrFrom4([4]byte(q[16:20])), binary.BigEndian.Uint16(q[22:]))
}

// ICMP errors are related to the flow they quote: they pass with it (and only then), and
// for a service flow the VIP is restored in them.
func TestConntrackICMPRelated(t *testing.T) {
	objs := ctPolicyFixture(t)
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	// EPG 10 refuses everything new from EPG 30, ICMP included.
	run(t, objs, fc, l4Frame(17, srcIP, remoteIP, 40500, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
	run(t, objs, ov, icmpError(remoteIP, srcIP, 3, srcIP, remoteIP, 40500, 53), ovl).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, ov, icmpError(remoteIP, srcIP, 11, srcIP, remoteIP, 40500, 53), ovl).expect(t, tcActRedirect, FwdLocal)
	// A third party (here the orphan's address would be spoofed, so another remote endpoint
	// of the same VTEP: the fixture has one, 10.1.0.4 itself is the peer) quoting the flow
	// to someone else is not related: judged on its own, denied.
	run(t, objs, ov, icmpError(remoteIP, srcIP, 3, srcIP, localIP, 40500, 53), ovl).expect(t, tcActShot, DropPolicy)
	// Quoting a flow that does not exist: judged on its own, denied.
	run(t, objs, ov, icmpError(remoteIP, srcIP, 3, srcIP, remoteIP, 40501, 53), ovl).expect(t, tcActShot, DropPolicy)
	// A truncated quote is malformed.
	p := icmpError(remoteIP, srcIP, 3, srcIP, remoteIP, 40500, 53)
	p = p[:len(p)-4]
	binary.BigEndian.PutUint16(p[16:], uint16(len(p)-14))
	run(t, objs, ov, p, ovl).expect(t, tcActShot, DropMalformedL4)
	if _, ok := ctEntry(t, objs, testZone, 1, remoteIP, srcIP, 0, 0); ok {
		t.Error("an ICMP error created an entry")
	}

	t.Run("service", func(t *testing.T) {
		setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
		vip := netip.MustParseAddr("10.1.0.101")
		putTestService(t, objs, 2, vip, 53, 17, 5353, remoteIP)
		run(t, objs, fc, l4Frame(17, srcIP, vip, 40600, 53, 0, 0), nil).expect(t, tcActRedirect, FwdTunnel)
		// The backend answers with port unreachable about client → backend:5353.
		r := run(t, objs, ov, icmpError(remoteIP, srcIP, 3, srcIP, remoteIP, 40600, 5353), ovl)
		r.expect(t, tcActRedirect, FwdLocal)
		src, _, qs, q := quoteOf(t, r.out) // the quoted UDP checksum follows too
		if src != vip || q != netip.AddrPortFrom(vip, 53) || qs != netip.AddrPortFrom(srcIP, 40600) {
			t.Errorf("error from %v quoting %v → %v, want from and quoting the VIP %v:53", src, qs, q, vip)
		}
		// Time exceeded, also about the flow: the quote is fixed the same way.
		r = run(t, objs, ov, icmpError(remoteIP, srcIP, 11, srcIP, remoteIP, 40600, 5353), ovl)
		r.expect(t, tcActRedirect, FwdLocal)
		if _, q := checkICMPError(t, r.out); q != netip.AddrPortFrom(vip, 53) {
			t.Errorf("time exceeded quotes %v, want the VIP", q)
		}
	})
}

// A VIP outside the client's network (Contiv takes VIPs from a network of their own) is
// the tenant's: pinged, it answers in place (icmp_vip_reply, from the VIP, checksums
// right); a port or protocol without a service, or a fragmented ping, goes nowhere
// (drop_unknown_dst), never out as traffic to the outside; another tenant's VIP is just an
// address outside for this one.
func TestVIPAnswers(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.96.0.10")
	putTestService(t, objs, 1, vip, 80, 6, 8080, localIP)
	fc := objs.CbFromContainer

	ping := icmpEcho(srcIP, vip, 8, 7)
	r := run(t, objs, fc, ping, nil)
	r.expect(t, tcActRedirect, ICMPVIPReply)
	ip := r.out[14:]
	if src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])); src != vip || dst != srcIP || ip[20] != 0 {
		t.Fatalf("the answer is type %d from %v to %v, want an echo reply (0) from %v to %v", ip[20], src, dst, vip, srcIP)
	}
	if n := int(binary.BigEndian.Uint16(ip[2:])); csum(ip[:20], 0) != 0 || csum(ip[20:n], 0) != 0 {
		t.Fatal("the echo reply's checksums are wrong")
	}
	if !bytes.Equal(r.out[:6], dataplane.ContivMAC(srcIP)) {
		t.Fatalf("the echo reply goes to MAC %v, want the sender's", net.HardwareAddr(r.out[:6]))
	}

	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 81, tcpSYN, 0), nil).expect(t, tcActShot, DropUnknownDst)
	run(t, objs, fc, l4Frame(17, srcIP, vip, 43000, 80, 0, 0), nil).expect(t, tcActShot, DropUnknownDst)
	run(t, objs, fc, l4Frame(47, srcIP, vip, 0, 0, 0, 0), nil).expect(t, tcActShot, DropUnknownDst)
	run(t, objs, fc, asFirstFragment(icmpEcho(srcIP, vip, 8, 7)), nil).expect(t, tcActShot, DropUnknownDst)
	// The service port itself still balances.
	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)

	// Another tenant: the VIP is not its own, the packet is traffic to the outside (no
	// egress here: refused at the gateway).
	setZone(t, objs, testZone+1)
	run(t, objs, fc, ping, nil).expect(t, tcActShot, DropToGateway)
	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 81, tcpSYN, 0), nil).expect(t, tcActShot, DropToGateway)
}

// Hairpin: a client balanced to itself gets its packet from the VIP (not from its own
// address, which its kernel would drop as a martian), and the reply back from VIP:port.
func TestServiceHairpin(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB|contivbpfCbFeaturesCB_FEAT_POLICY))
	setEPG(t, objs, srcIP, 10)
	// Group 10 refuses TCP in: hairpin traffic is the client talking to itself, not judged.
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny}}})
	vip := netip.MustParseAddr("10.1.0.100")
	putTestService(t, objs, 1, vip, 80, 6, 8080, srcIP)
	fc := objs.CbFromContainer
	r := run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpSYN, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, d, sp, dp := checkSums(t, r.out); s != vip || sp != 43000 || d != srcIP || dp != 8080 {
		t.Errorf("hairpin forward %v:%d → %v:%d, want %v:43000 → %v:8080", s, sp, d, dp, vip, srcIP)
	}
	r = run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 43000, tcpSYN|tcpACK, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, d, sp, dp := checkSums(t, r.out); s != vip || sp != 80 || d != srcIP || dp != 43000 {
		t.Errorf("hairpin reply %v:%d → %v:%d, want %v:80 → %v:43000", s, sp, d, dp, vip, srcIP)
	}
	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	if e, ok := ctEntry(t, objs, testZone, 6, vip, srcIP, 43000, 8080); !ok || e.Flags&uint8(contivbpfCbCtFlagsCB_CT_HAIRPIN) == 0 || e.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) {
		t.Errorf("hairpin entry %+v (found %v), want HAIRPIN, ESTABLISHED", e, ok)
	}
}

// Fragments of service flows: the later fragments of a balanced datagram follow its first
// fragment to the same backend, and the later fragments of the reply come back from the
// VIP; a later fragment to a VIP without a first one is still dropped.
func TestServiceFragments(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.101")
	putTestService(t, objs, 2, vip, 53, 17, 5353, remoteIP)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	addrs := func(f []byte) (netip.Addr, netip.Addr) {
		ip := f[14:]
		if csum(ip[:20], 0) != 0 {
			t.Error("bad IP checksum")
		}
		return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	}

	run(t, objs, fc, laterFrag(17, srcIP, vip, 0x77), nil).expect(t, tcActShot, DropFragToService)
	r := run(t, objs, fc, firstFrag(17, srcIP, vip, 41000, 53, 0, 0x77), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	if _, d := addrs(r.out); d != remoteIP {
		t.Fatalf("first fragment to %v, want the backend %v", d, remoteIP)
	}
	r = run(t, objs, fc, laterFrag(17, srcIP, vip, 0x77), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	if s, d := addrs(r.out); s != srcIP || d != remoteIP {
		t.Errorf("later fragment %v → %v, want %v → %v", s, d, srcIP, remoteIP)
	}
	// Another datagram's later fragment finds no first fragment.
	run(t, objs, fc, laterFrag(17, srcIP, vip, 0x78), nil).expect(t, tcActShot, DropFragToService)

	// The reply, fragmented by the backend.
	r = run(t, objs, ov, firstFrag(17, remoteIP, srcIP, 5353, 41000, 0, 0x99), ovl)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, _ := addrs(r.out); s != vip {
		t.Fatalf("reply first fragment from %v, want the VIP", s)
	}
	r = run(t, objs, ov, laterFrag(17, remoteIP, srcIP, 0x99), ovl)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, d := addrs(r.out); s != vip || d != srcIP {
		t.Errorf("reply later fragment %v → %v, want %v → %v", s, d, vip, srcIP)
	}
}

// TestServiceTupleReuse: a client's kernel sees VIP:80 and backend:8080 as different
// peers, so a direct connection to the backend may reuse the source port of a service
// connection that just closed. The closed service entry must not capture it: the
// direct connection's replies come from the backend's own address, not the VIP. (Found
// by the svcscale bench: the first direct connect after a burst of VIP connects hung.)
func TestServiceTupleReuse(t *testing.T) {
	for _, withPolicy := range []bool{false, true} {
		t.Run(map[bool]string{false: "untracked", true: "tracked"}[withPolicy], func(t *testing.T) {
			objs := loadTestObjects(t)
			feat := uint32(contivbpfCbFeaturesCB_FEAT_LB)
			if withPolicy {
				feat |= uint32(contivbpfCbFeaturesCB_FEAT_POLICY)
				setEPG(t, objs, srcIP, 10)
				putPolicy(t, objs, dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
					{ID: "no-udp-in", Priority: 5, Ingress: true, Proto: 17, Action: dataplane.ActionDeny}}})
			}
			setFeatures(t, objs, feat)
			ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
			fc, ov := objs.CbFromContainer, objs.CbTestOverlay
			vip := netip.MustParseAddr("10.1.0.102")
			putTestService(t, objs, 3, vip, 80, 6, 8080, remoteIP)
			const sport = 41000
			// The service connection: SYN, SYN-ACK (from the VIP), then the client's RST.
			r := run(t, objs, fc, l4Frame(6, srcIP, vip, sport, 80, tcpSYN, 0), nil)
			r.expect(t, tcActRedirect, FwdTunnel)
			r = run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 8080, sport, tcpSYN|tcpACK, 0), ovl)
			r.expect(t, tcActRedirect, FwdLocal)
			if s, _, sp, _ := checkSums(t, r.out); s != vip || sp != 80 {
				t.Fatalf("service reply from %v:%d, want the VIP", s, sp)
			}
			dnatEntry := func(when string, wantState uint8) {
				t.Helper()
				e, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, sport, 8080)
				if !ok || e.Flags&uint8(contivbpfCbCtFlagsCB_CT_DNAT) == 0 || e.State != wantState {
					t.Fatalf("%s: service flow entry %+v (found %v), want DNAT in state %d", when, e, ok, wantState)
				}
			}
			// A still-open service flow keeps its entry: a direct SYN on its tuple does not
			// take it over (and its replies still come from the VIP).
			dnatEntry("established", uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED))
			run(t, objs, fc, l4Frame(6, srcIP, remoteIP, sport, 8080, tcpSYN, 0), nil)
			dnatEntry("direct SYN while the service flow is open", uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED))
			r = run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 8080, sport, tcpACK, 0), ovl)
			if s, _, sp, _ := checkSums(t, r.out); s != vip || sp != 80 {
				t.Fatalf("open service flow's reply from %v:%d after a direct SYN, want the VIP", s, sp)
			}
			run(t, objs, fc, l4Frame(6, srcIP, vip, sport, 80, tcpRST, 0), nil).expect(t, tcActRedirect, FwdTunnel)
			// Another tenant's client with the same addresses and ports cannot remove it.
			setZone(t, objs, testZone+1)
			run(t, objs, fc, l4Frame(6, srcIP, remoteIP, sport, 8080, tcpSYN, 0), nil)
			setZone(t, objs, testZone)
			dnatEntry("SYN on the same tuple from another tenant", uint8(contivbpfCbCtStateCB_CTS_CLOSING))
			// The direct connection on the same tuple as the service flow's backend side.
			run(t, objs, fc, l4Frame(6, srcIP, remoteIP, sport, 8080, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdTunnel)
			r = run(t, objs, ov, l4Frame(6, remoteIP, srcIP, 8080, sport, tcpSYN|tcpACK, 0), ovl)
			r.expect(t, tcActRedirect, FwdLocal)
			if s, _, sp, _ := checkSums(t, r.out); s != remoteIP || sp != 8080 {
				t.Errorf("direct connection's reply rewritten to %v:%d, want %v:8080", s, sp, remoteIP)
			}
		})
	}
}

// TestConntrackGCKeepsReopened: an entry the collector read as expired, whose flow opened
// again before the delete (the datapath overwrote it), survives the pass; an entry of a
// flushed address goes whatever its state. The race is set up between the pass's read
// (scan) and its deletes (apply).
func TestConntrackGCKeepsReopened(t *testing.T) {
	objs := loadTestObjects(t)
	g := newCTGC(objs.CbCt, time.Hour)
	g.owned = objs.CbCtOwned
	key := func(sport uint16, dst netip.Addr) contivbpfCbCtKey {
		return contivbpfCbCtKey{Zone: testZone, Saddr: ip4(srcIP), Daddr: ip4(dst), Sport: nport(sport), Dport: nport(53), Proto: 17}
	}
	reopened, gone, flushed := key(5000, localIP), key(5001, localIP), key(5002, remoteIP)
	put := func(k contivbpfCbCtKey, expires uint64) {
		t.Helper()
		v := contivbpfCbCtEntry{Flags: uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), State: uint8(contivbpfCbCtStateCB_CTS_NEW), Expires: expires, Owner: 7}
		if err := objs.CbCt.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []contivbpfCbCtKey{reopened, gone, flushed} {
		put(k, 1)
	}
	plan, err := g.scan([]ctFlush{{testZone, ip4(remoteIP)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.expired) != 2 || len(plan.flushed) != 1 {
		t.Fatalf("scan found %d expired and %d flushed, want 2 and 1", len(plan.expired), len(plan.flushed))
	}
	// Meanwhile the datapath opens two of the flows again.
	fresh := plan.now + uint64(time.Hour)
	put(reopened, fresh)
	put(flushed, fresh)
	n, err := g.apply(plan)
	if err != nil || n != 2 {
		t.Fatalf("apply deleted %d (%v), want 2", n, err)
	}
	var v contivbpfCbCtEntry
	if err := objs.CbCt.Lookup(&reopened, &v); err != nil || v.Expires != fresh {
		t.Errorf("the reopened flow's entry: %+v, %v; want it kept", v, err)
	}
	for _, k := range []contivbpfCbCtKey{gone, flushed} {
		if err := objs.CbCt.Lookup(&k, &v); err == nil {
			t.Errorf("entry %+v kept, want it deleted", k)
		}
	}
	// The counts are the scan's, written before the deletes: the reopened entry counts from
	// the next pass on.
	if c := ctOwned(t, objs, 7); c != 0 {
		t.Errorf("owner 7 counts %d entries after the pass, want 0 (as scanned)", c)
	}
	if n, err := g.pass(); err != nil || n != 0 {
		t.Fatalf("next pass deleted %d (%v), want 0", n, err)
	}
	if c := ctOwned(t, objs, 7); c != 1 {
		t.Errorf("owner 7 counts %d entries after the next pass, want 1 (the reopened flow)", c)
	}
}

// TestConntrackBlindClose (Datapath v3 issue, hole 5 for flows without NAT): a FIN or RST
// closes a flow only with a sequence number in the window the other side's last noted
// acknowledgment sets, whichever way the flow goes; a blind one (here from a peer host
// forging a remote endpoint over the overlay) is delivered but moves nothing, and a SYN
// on the established tuple neither replaces its entry nor clears its window. The local
// endpoint's acknowledgments are noted by the fast path too, once per note step.
func TestConntrackBlindClose(t *testing.T) {
	objs := ctPolicyFixture(t)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	const window, step = 1 << 23, 1 << 20
	entry := func(sport uint16) contivbpfCbCtEntry {
		t.Helper()
		e, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, sport, 443)
		if !ok {
			t.Fatalf("entry of port %d missing", sport)
		}
		return e
	}
	out := func(sport uint16, flags uint8, seq, ack uint32) {
		t.Helper()
		run(t, objs, fc, withSeq(l4Frame(6, srcIP, remoteIP, sport, 443, flags, 0), seq, ack), nil).expect(t, tcActRedirect, FwdTunnel)
	}
	in := func(sport uint16, flags uint8, seq, ack uint32) {
		t.Helper()
		run(t, objs, ov, withSeq(l4Frame(6, remoteIP, srcIP, 443, sport, flags, 0), seq, ack), ovl).expect(t, tcActRedirect, FwdLocal)
	}
	established := uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED)
	closing := uint8(contivbpfCbCtStateCB_CTS_CLOSING)
	open := func(sport uint16) {
		t.Helper()
		out(sport, tcpSYN, 1000, 0)
		in(sport, tcpSYN|tcpACK, 50000, 1001)
		out(sport, tcpACK, 1001, 50001)
		if e := entry(sport); e.State != established || e.TcpAck != [2]uint32{50001, 1001} {
			t.Fatalf("after the handshake: state %d, noted acks %v, want established, [50001 1001]", e.State, e.TcpAck)
		}
	}

	open(42000)
	for _, seq := range []uint32{50000, 50001 + window, 50001 - step + 1<<32, 0x80000000} {
		in(42000, tcpRST, seq, 0)
		in(42000, tcpFIN|tcpACK, seq, 1001)
	}
	if e := entry(42000); e.State != established {
		t.Fatalf("blind FINs and RSTs moved the flow to state %d", e.State)
	}
	// A spoofed SYN on the tuple: a plain segment, the entry and its window stay.
	out(42000, tcpSYN, 777, 0)
	if e := entry(42000); e.State != established || e.TcpAck != [2]uint32{50001, 1001} {
		t.Fatalf("a SYN on the established flow: state %d, acks %v", e.State, e.TcpAck)
	}
	in(42000, tcpRST, 0x80000000, 0)
	if e := entry(42000); e.State != established {
		t.Fatalf("a blind RST after a SYN moved the flow to state %d", e.State)
	}
	// In the window (data in flight past the last acknowledgment): closed.
	in(42000, tcpRST, 50001+100000, 0)
	if e := entry(42000); e.State != closing {
		t.Fatalf("an in-window RST left state %d", e.State)
	}

	// The fast path notes the local endpoint's acknowledgments once they moved a step:
	// a FIN in the window of the newest is believed, one behind the old reference not.
	open(42001)
	out(42001, tcpACK, 1001, 50001+step-1) // (less than a step: not noted)
	if e := entry(42001); e.TcpAck[0] != 50001 {
		t.Fatalf("an acknowledgment less than a step on was noted: %v", e.TcpAck)
	}
	out(42001, tcpACK, 1001, 50001+3*step)
	if e := entry(42001); e.TcpAck[0] != 50001+3*step {
		t.Fatalf("the fast path did not note an acknowledgment three steps on: %v", e.TcpAck)
	}
	in(42001, tcpFIN|tcpACK, 50001+step, 1001) // behind the new reference
	if e := entry(42001); e.State != established {
		t.Fatalf("a FIN behind the noted acknowledgment moved the flow to state %d", e.State)
	}
	in(42001, tcpFIN|tcpACK, 50001+3*step+10, 1001)
	if e := entry(42001); e.State != closing {
		t.Fatalf("a FIN in the window left state %d", e.State)
	}

	// The local endpoint's own FIN closes in its window; before the other side has
	// acknowledged anything, a RST is believed (a new flow).
	open(42002)
	out(42002, tcpFIN|tcpACK, 1001, 50001)
	if e := entry(42002); e.State != closing {
		t.Fatalf("the endpoint's own FIN left state %d", e.State)
	}
	out(42003, tcpSYN, 9000, 0)
	in(42003, tcpRST|tcpACK, 0x80000000, 9001)
	if e := entry(42003); e.State != closing {
		t.Fatalf("the refusal of a SYN left state %d", e.State)
	}
}

// TestConntrackBlindCloseService: a service flow to a backend on a peer host keeps the
// window in its flow entry (client→backend, DNAT): the client's acknowledgments are noted
// by the service fast path, memo or not (and copied into the client→VIP entry), and a
// blind FIN or RST from the peer, forging the backend, moves nothing.
func TestConntrackBlindCloseService(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.103")
	putTestService(t, objs, 13, vip, 80, 6, 8080, remoteIP)
	fc, ov := objs.CbFromContainer, objs.CbTestOverlay
	ovl := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	const window, step = 1 << 23, 1 << 20
	const cport = 42100
	out := func(flags uint8, seq, ack uint32) {
		t.Helper()
		run(t, objs, fc, withSeq(l4Frame(6, srcIP, vip, cport, 80, flags, 0), seq, ack), nil).expect(t, tcActRedirect, FwdTunnel)
	}
	in := func(flags uint8, seq, ack uint32) {
		t.Helper()
		run(t, objs, ov, withSeq(l4Frame(6, remoteIP, srcIP, 8080, cport, flags, 0), seq, ack), ovl).expect(t, tcActRedirect, FwdLocal)
	}
	flow := func() contivbpfCbCtEntry {
		t.Helper()
		e, ok := ctEntry(t, objs, testZone, 6, srcIP, remoteIP, cport, 8080)
		if !ok {
			t.Fatal("the flow's entry is missing")
		}
		return e
	}
	out(tcpSYN, 1000, 0)
	in(tcpSYN|tcpACK, 50000, 1001)
	for i := uint32(0); i < 4; i++ { // (the fast path: its memo taken, then kept)
		out(tcpACK, 1001, 50001+i)
	}
	if e := flow(); e.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) || e.TcpAck != [2]uint32{50001, 1001} {
		t.Fatalf("after the handshake: state %d, acks %v", e.State, e.TcpAck)
	}
	out(tcpACK, 1001, 50001+3*step) // due: noted through the memo too
	if e := flow(); e.TcpAck[0] != 50001+3*step {
		t.Fatalf("the service fast path did not note the client's acknowledgment: %v", e.TcpAck)
	}
	if svc, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, cport, 80); !ok || svc.TcpAck[0] != 50001+3*step {
		t.Errorf("client→VIP entry's copy %v (found %v), want the flow entry's note", svc.TcpAck, ok)
	}
	for _, seq := range []uint32{50001 + 3*step - 1, 50001 + 3*step + window, 0x80000000} {
		in(tcpRST, seq, 0)
		in(tcpFIN|tcpACK, seq, 1001)
	}
	if e := flow(); e.State != uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED) {
		t.Fatalf("blind FINs and RSTs from the backend's host moved the service flow to state %d", e.State)
	}
	in(tcpRST, 50001+3*step+5000, 0)
	if e := flow(); e.State != uint8(contivbpfCbCtStateCB_CTS_CLOSING) {
		t.Fatalf("an in-window RST left state %d", e.State)
	}
}

// TestServiceHairpinSYNOnReplyTuple: a TCP SYN without ACK opens a flow; it is never a
// service flow's reply, even when its tuple is the reverse of a live service flow's entry.
// A client that is its own backend (hairpin: client:43000 → VIP:80 → client:8080, entry
// VIP:43000 → client:8080) sending a SYN client:8080 → VIP:43000 opens a new flow to
// VIP:43000: no service there, so drop_unknown_dst (it was taken for the hairpin flow's
// reply and delivered to the client still addressed to the VIP, writing an entry), and
// once VIP:43000 is a service, balanced to its backend. A local backend's SYN on the
// reverse tuple of its live service flow is judged as a direct flow and passes without
// taking the service flow's replies (they still come from the VIP).
func TestServiceHairpinSYNOnReplyTuple(t *testing.T) {
	objs, vip := hairpinFixture(t)
	putTestService(t, objs, 4, vip, 80, 6, 8080, srcIP)
	fc := objs.CbFromContainer
	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 43000, tcpSYN|tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	before, _ := ctEntry(t, objs, testZone, 6, vip, srcIP, 43000, 8080)

	r := run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 43000, tcpSYN, 0), nil)
	if r.ret != tcActShot || r.diff[DropUnknownDst] != 1 {
		s, d, sp, dp := checkSums(t, r.out)
		t.Errorf("a SYN on the hairpin flow's reply tuple got %d (%v), left as %v:%d → %v:%d; want drop_unknown_dst", r.ret, r.diff, s, sp, d, dp)
	}
	if e, ok := ctEntry(t, objs, testZone, 6, srcIP, vip, 8080, 43000); ok {
		t.Errorf("the SYN wrote an entry: %+v", e)
	}
	if after, _ := ctEntry(t, objs, testZone, 6, vip, srcIP, 43000, 8080); after.State != before.State || after.Flags != before.Flags {
		t.Errorf("the hairpin entry went from %+v to %+v", before, after)
	}
	// The hairpin flow's replies still go back from VIP:80.
	r = run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 43000, tcpACK, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, d, sp, dp := checkSums(t, r.out); s != vip || sp != 80 || d != srcIP || dp != 43000 {
		t.Errorf("hairpin reply after the SYN %v:%d → %v:%d, want %v:80 → %v:43000", s, sp, d, dp, vip, srcIP)
	}
	// VIP:43000 a service of another host's: the SYN is balanced there.
	putTestService(t, objs, 2, vip, 43000, 6, 9000, remoteIP)
	r = run(t, objs, fc, l4Frame(6, srcIP, vip, 8080, 43000, tcpSYN, 0), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	if s, d, sp, dp := checkSums(t, r.out); s != srcIP || sp != 8080 || d != remoteIP || dp != 9000 {
		t.Errorf("the SYN to service VIP:43000 left as %v:%d → %v:%d, want %v:8080 → %v:9000", s, sp, d, dp, srcIP, remoteIP)
	}

	// A local backend (localIP, group 20 without rules) of VIP:81.
	putTestService(t, objs, 3, vip, 81, 6, 8080, localIP)
	client, backend, as := backendIfaces(t, objs)
	run(t, objs, fc, l4Frame(6, srcIP, vip, 41000, 81, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	as(backend)
	run(t, objs, fc, l4Frame(6, localIP, srcIP, 8080, 41000, tcpSYN|tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	r = run(t, objs, fc, l4Frame(6, localIP, srcIP, 8080, 41000, tcpSYN, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, _, sp, _ := checkSums(t, r.out); s != localIP || sp != 8080 {
		t.Errorf("the backend's SYN on its flow's reply tuple left from %v:%d, want %v:8080 (a direct flow's)", s, sp, localIP)
	}
	if e, ok := ctEntry(t, objs, testZone, 6, localIP, srcIP, 8080, 41000); ok {
		t.Errorf("the backend's SYN wrote an entry under its service flow's reply tuple: %+v", e)
	}
	r = run(t, objs, fc, l4Frame(6, localIP, srcIP, 8080, 41000, tcpACK, 0), nil)
	r.expect(t, tcActRedirect, FwdLocal)
	if s, _, sp, _ := checkSums(t, r.out); s != vip || sp != 81 {
		t.Errorf("the service flow's reply after the backend's SYN left from %v:%d, want the VIP:81", s, sp)
	}
	as(client)
}

// TestNodePortRemoteBackendSYNOnReplyTuple: a remote backend's TCP SYN without ACK on the
// reverse tuple of its node port flow (backend:8080 → this host:NAT port, from the
// overlay) opens a flow of its own to this host, which has none there: it is no reply of
// the node port flow, never sent to the client from the node port (before, it was, and a
// local backend's was not: cb_nodeport_out finds no reply for a SYN, cb_lb_reply). The
// flow's own replies still go back.
func TestNodePortRemoteBackendSYNOnReplyTuple(t *testing.T) {
	objs, vip := nodePortFixture(t, 6, 80, 8080, 30080)
	putTestService(t, objs, 1, vip, 80, 6, 8080, remoteIP)
	fromPeer := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	const cport = 5970
	r := run(t, objs, objs.CbFromUplink, withSeq(l4Frame(6, worldIP, hostIP, cport, 30080, tcpSYN, 0), 2000, 0), nil)
	r.expect(t, tcActRedirect, FwdTunnel)
	_, _, natPort, _ := checkSums(t, r.out)
	peer := func(flags uint8, seq, ack uint32) runResult {
		t.Helper()
		return run(t, objs, objs.CbTestOverlay, withSeq(l4Frame(6, remoteIP, hostIP, 8080, natPort, flags, 0), seq, ack), fromPeer)
	}
	peer(tcpSYN|tcpACK, 5000, 2001).expect(t, tcActRedirect, FwdNodePortReply)
	run(t, objs, objs.CbFromUplink, withSeq(l4Frame(6, worldIP, hostIP, cport, 30080, tcpACK, 0), 2001, 5001), nil).expect(t, tcActRedirect, FwdTunnel)
	before, _ := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, remoteIP, cport, 8080)

	r = peer(tcpSYN, 7000, 0)
	if r.ret != tcActShot || r.diff[DropUnknownDst] != 1 {
		s, d, sp, dp := checkSums(t, r.out)
		t.Errorf("the remote backend's SYN on its node port flow's reply tuple got %d (%v), left as %v:%d → %v:%d; want drop_unknown_dst", r.ret, r.diff, s, sp, d, dp)
	}
	if after, _ := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, remoteIP, cport, 8080); after.State != before.State || after.Flags != before.Flags {
		t.Errorf("the node port entry went from %+v to %+v", before, after)
	}
	peer(tcpACK, 5001, 2001).expect(t, tcActRedirect, FwdNodePortReply)
}
