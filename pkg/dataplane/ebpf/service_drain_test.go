package ebpf

import (
	"net/netip"
	"testing"
)

// TestServiceAffinityAndDraining: with session affinity a client's flows all go to one
// backend whatever their ports; a draining backend (a member outside the selection) keeps
// the flows it has and gets no new one; once it is no member its flows are re-balanced.
func TestServiceAffinityAndDraining(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_LB))
	vip := netip.MustParseAddr("10.1.0.100")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	putTestService(t, objs, 1, vip, 80, 17, 8080, localIP, remoteIP)
	svcKey := contivbpfCbSvcKey{Zone: testZone, Vip: ip4(vip), Port: nport(80), Proto: 17}
	fc := objs.CbFromContainer
	dst := func(sport uint16) netip.Addr {
		t.Helper()
		r := run(t, objs, fc, l4Frame(17, srcIP, vip, sport, 80, 0, 0), nil)
		if r.ret != tcActRedirect {
			t.Fatalf("sport %d: verdict %d (%v)", sport, r.ret, r.diff)
		}
		_, d, _, _ := checkSums(t, r.out)
		return d
	}

	// Without affinity, 24 flows of one client use both backends.
	seen := map[netip.Addr]int{}
	for p := uint16(46000); p < 46024; p++ {
		seen[dst(p)]++
	}
	if len(seen) != 2 {
		t.Fatalf("per-flow balancing used %v", seen)
	}
	// With affinity, every new flow of the client goes to one backend.
	var svc contivbpfCbSvc
	must(objs.CbServices.Lookup(&svcKey, &svc))
	svc.Flags = svcAffinity
	must(objs.CbServices.Put(&svcKey, &svc))
	seen = map[netip.Addr]int{}
	for p := uint16(47000); p < 47024; p++ {
		seen[dst(p)]++
	}
	if len(seen) != 1 {
		t.Fatalf("with ClientIP affinity one client's flows went to %v", seen)
	}
	svc.Flags = 0
	must(objs.CbServices.Put(&svcKey, &svc))

	// A flow on the remote backend; then the remote backend drains: it is no longer
	// selectable (count 1, slot 0 = local) but stays a member.
	var onRemote uint16
	for p := uint16(48000); p < 48100 && onRemote == 0; p++ {
		if dst(p) == remoteIP {
			onRemote = p
		}
	}
	if onRemote == 0 {
		t.Fatal("no flow went to the remote backend")
	}
	must(objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: 1, Index: 0}, &contivbpfCbBackend{Ip: ip4(localIP), Net: testNet}))
	must(objs.CbBackends.Delete(&contivbpfCbBackendKey{SvcId: 1, Index: 1}))
	svc.Count = 1
	must(objs.CbServices.Put(&svcKey, &svc))
	if d := dst(onRemote); d != remoteIP {
		t.Fatalf("the draining backend's flow moved to %v", d)
	}
	for p := uint16(49000); p < 49024; p++ {
		if d := dst(p); d != localIP {
			t.Fatalf("new flow %d went to %v while %v drains", p, d, remoteIP)
		}
	}
	// Drained: no member any more, its flow is re-balanced.
	removeMember(t, objs, 1, remoteIP)
	if d := dst(onRemote); d != localIP {
		t.Fatalf("after the drain the flow still goes to %v", d)
	}
}
