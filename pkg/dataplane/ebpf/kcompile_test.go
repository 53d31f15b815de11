package ebpf

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/policy"
)

// kRand draws NetworkPolicy rules and flows from small domains: prefixes nest and
// overlap around a few addresses, port ranges share edges and straddle block boundaries.
type kRand struct{ polRand }

var kPorts = []uint16{1, 2, 53, 79, 80, 81, 443, 1023, 1024, 1025, 5000, 5010, 32767, 32768, 65534, 65535}

func (g kRand) port() uint16 {
	if g.r.IntN(3) == 0 {
		return uint16(1 + g.r.IntN(65535))
	}
	return kPorts[g.r.IntN(len(kPorts))]
}

func (g kRand) rule() dataplane.PodRule {
	r := dataplane.PodRule{Remote: netip.PrefixFrom(g.addr(), []int{0, 1, 8, 16, 24, 25, 30, 31, 32}[g.r.IntN(9)]).Masked()}
	r.Proto = []uint8{0, 6, 6, 17, 17, 1, 132}[g.r.IntN(7)]
	switch g.r.IntN(4) {
	case 0: // any port
	case 1:
		r.PortMin = g.port()
		r.PortMax = r.PortMin
	default:
		a, b := g.port(), g.port()
		if g.r.IntN(8) != 0 && a > b {
			a, b = b, a // (now and then an empty range: never matches)
		}
		r.PortMin, r.PortMax = a, b
	}
	return r
}

// kLookup answers for the compiled set as cb_kset_allows does, the LPM trie being the
// longest of the keys whose fixed part is the flow's and whose prefix holds remote.
func kLookup(head contivbpfCbKsetHead, keys []contivbpfCbKcidrKey, remote netip.Addr, proto uint8, dport uint16) bool {
	has := func(p uint8, k uint8) bool {
		for _, c := range keys {
			if c.Proto != p || c.K != k || c.Block != dport>>k {
				continue
			}
			pl := int(c.Prefixlen) - 64
			if netip.PrefixFrom(addrFrom(c.Remote), pl).Contains(remote) {
				return true
			}
		}
		return false
	}
	for any := 0; any < 2; any++ {
		sizes, p := head.Sizes, proto
		if any == 1 {
			sizes, p = head.SizesAny, 0
		} else if proto == 0 {
			continue
		}
		for k := uint8(0); k <= kAnyPortBits; k++ {
			if sizes&(1<<k) != 0 && has(p, k) {
				return true
			}
		}
	}
	return false
}

// TestKSetCompileMatchesScan: for random sets of up to 1,024 rules, the compiled form
// answers every flow as the reference model's scan (policy.NetpolAllows) does.
func TestKSetCompileMatchesScan(t *testing.T) {
	g := kRand{polRand{rand.New(rand.NewPCG(7, 33))}}
	for set := 0; set < 400; set++ {
		n := []int{0, 1, 2, 5, 20, 100, 1024}[g.r.IntN(7)]
		rules := make([]dataplane.PodRule, n)
		for i := range rules {
			rules[i] = g.rule()
		}
		kr, _ := compileKRules(rules)
		head, keys, err := compileKSet(uint32(set+1), kr)
		if err != nil {
			t.Fatal(err)
		}
		pod := &dataplane.PodPolicy{IngressIsolated: true, Ingress: rules}
		for f := 0; f < 200; f++ {
			remote, to := g.addr(), g.addr()
			proto := []uint8{6, 17, 1, 132}[g.r.IntN(4)]
			var dport uint16
			if proto != 1 {
				dport = g.port()
			}
			want := policy.NetpolAllows(nil, pod, remote, to, proto, dport)
			if got := kLookup(head, keys, remote, proto, dport); got != want {
				t.Fatalf("set %d (%d rules %v): %v proto %d port %d: compiled %v, scan %v", set, n, rules, remote, proto, dport, got, want)
			}
		}
	}
}

// TestPortBlocks: blocks are aligned, disjoint, and cover the range exactly.
func TestPortBlocks(t *testing.T) {
	for _, c := range []struct{ lo, hi uint16 }{{1, 1}, {1, 65535}, {80, 80}, {80, 90}, {1024, 2047}, {5000, 5010}, {32768, 65535}, {65535, 65535}, {9, 8}} {
		var covered int
		for _, b := range portBlocks(c.lo, c.hi) {
			lo := int(b.block) << b.k
			hi := lo + 1<<b.k - 1
			if lo < int(c.lo) || hi > int(c.hi) {
				t.Errorf("[%d,%d]: block %d of 2^%d = [%d,%d] outside", c.lo, c.hi, b.block, b.k, lo, hi)
			}
			covered += 1 << b.k
		}
		if want := max(int(c.hi)-int(c.lo)+1, 0); covered != want {
			t.Errorf("[%d,%d]: blocks cover %d ports, want %d", c.lo, c.hi, covered, want)
		}
	}
	if b := portBlocks(0, 0); len(b) != 1 || b[0].k != kAnyPortBits {
		t.Errorf("any port: %v", b)
	}
	if n := len(portBlocks(1, 65535)); n != 16 {
		t.Errorf("[1,65535] in %d blocks, want 16", n)
	}
}

// TestKSetLookupProgram: the programs' lookup (cb_kset_allows, through cb_from_container)
// admits exactly the flows the reference model's scan admits, for random sets of up to
// 1,024 rules whose prefixes nest around the sender's address.
func TestKSetLookupProgram(t *testing.T) {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NETPOL))
	g := kRand{polRand{rand.New(rand.NewPCG(11, 5))}}
	sport := uint16(20000)
	allowed, denied := 0, 0
	for set := 0; set < 6; set++ {
		rules := make([]dataplane.PodRule, []int{1, 3, 10, 60, 300, 1024}[set])
		for i := range rules {
			rules[i] = g.rule()
		}
		pod := &dataplane.PodPolicy{IngressIsolated: true, Ingress: rules}
		putKPod(t, objs, testZone, remoteIP, pod)
		for f := 0; f < 120; f++ {
			sport++
			proto := []uint8{6, 17, 1}[g.r.IntN(3)]
			var frame []byte
			var dport uint16
			switch proto {
			case 1:
				frame = icmpEcho(srcIP, remoteIP, 8, sport)
			case 6:
				dport = g.port()
				frame = l4Frame(6, srcIP, remoteIP, sport, dport, tcpSYN, 0)
			default:
				dport = g.port()
				frame = l4Frame(17, srcIP, remoteIP, sport, dport, 0, 0)
			}
			r := run(t, objs, objs.CbFromContainer, frame, nil)
			if policy.NetpolAllows(nil, pod, srcIP, remoteIP, proto, dport) {
				allowed++
				r.expect(t, tcActRedirect, FwdTunnel)
			} else {
				denied++
				r.expect(t, tcActShot, DropNetpol)
			}
			if t.Failed() {
				t.Fatalf("set %d (%d rules), proto %d port %d", set, len(rules), proto, dport)
			}
		}
	}
	putKPod(t, objs, testZone, remoteIP, nil)
	t.Logf("%d flows allowed, %d denied, as the scan says", allowed, denied)
	if allowed < 50 || denied < 50 {
		t.Errorf("the draw exercises too little: %d allowed, %d denied", allowed, denied)
	}
}

// bareKDriver is a driver over objs with what the NetworkPolicy layer's writes use.
func bareKDriver(objs *contivbpfObjects, gen uint32) *Driver {
	return &Driver{objs: *objs, log: slog.New(slog.NewTextHandler(io.Discard, nil)), gen: gen,
		np: netpolIndex{ksets: map[string]*kset{}, ksetIDs: map[uint32]string{}, podPols: map[string]*podPolRec{},
			kpodOwner: map[contivbpfCbKpodKey]string{}}, mapFull: map[string]uint64{}}
}

// TestKSetIDAfterRestartFindsNoLeftovers (found by review): a set whose prefixes could
// not all be written (cb_kcidrs full) leaves none behind, and after a restart a new set
// never takes an id whose prefixes an earlier set left (a crash between its writes): the
// start removes heads and prefixes without a record and hands out ids above all three
// maps'. Before, the next set after a restart took the dead set's id and its prefixes
// admitted srcIP to a pod that allows only 10.9.0.0/16.
func TestKSetIDAfterRestartFindsNoLeftovers(t *testing.T) {
	objs := loadTestObjectsSpec(t, func(s *ebpf.CollectionSpec) { s.Maps[contivbpfMapCbKcidrs].MaxEntries = 8 })
	const gen = 5
	rules := func(prefixes ...string) []dataplane.PodRule {
		var out []dataplane.PodRule
		for _, p := range prefixes {
			out = append(out, dataplane.PodRule{Remote: netip.MustParsePrefix(p), Proto: 6})
		}
		return out
	}
	d := bareKDriver(objs, gen)
	acquire := func(d *Driver, rs []dataplane.PodRule) (uint32, string, error) {
		kr, key := compileKRules(rs)
		id, err := d.acquireSet(kr, key)
		return id, key, err
	}
	_, filler, err := acquire(d, rules("10.200.0.1/32", "10.200.0.2/32", "10.200.0.3/32")) // set 1
	if err != nil {
		t.Fatal(err)
	}
	big := rules(netip.PrefixFrom(srcIP, 32).String()) // set 2: srcIP first, then too many
	for i := 1; i <= 10; i++ {
		big = append(big, rules(netip.AddrFrom4([4]byte{10, 202, 0, byte(i)}).String()+"/32")...)
	}
	if id, _, err := acquire(d, big); err == nil {
		t.Fatalf("setup: set %d fit", id)
	}
	if n := countEntries(t, objs.CbKcidrs); n != 3 {
		t.Errorf("after the failed set: %d prefixes, want set 1's 3", n)
	}
	// A crash between a set's prefixes and its record: prefixes of id 7 with no record.
	stray := contivbpfCbKcidrKey{Prefixlen: 64 + 32, Set: 7, K: kAnyPortBits, Proto: 6, Remote: ip4(srcIP)}
	if err := objs.CbKcidrs.Put(&stray, &contivbpfCbKcidr{}); err != nil {
		t.Fatal(err)
	}
	if err := d.releaseSet(filler); err != nil {
		t.Fatal(err)
	}
	d = bareKDriver(objs, gen+1) // the restart
	if err := d.compilePinnedKSets(); err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, objs.CbKcidrs); n != 0 {
		t.Errorf("after the start: %d prefixes left without a set", n)
	}
	victim := &dataplane.PodPolicy{ID: "victim", IngressIsolated: true, Ingress: rules("10.9.0.0/16")}
	id, _, err := acquire(d, victim.Ingress)
	if err != nil {
		t.Fatal(err)
	}
	if id <= 7 {
		t.Errorf("the new set took id %d, at or below an id the maps held", id)
	}
	rec := &podPolRec{p: *victim, key: contivbpfCbKpodKey{Zone: testZone, Addr: ip4(remoteIP)}}
	if err := d.writeKPodSets(rec, [2]uint32{id, 0}); err != nil {
		t.Fatal(err)
	}
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NETPOL))
	run(t, objs, objs.CbFromContainer, l4Frame(6, srcIP, remoteIP, 40000, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropNetpol)
}
