package ebpf

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// polRig is the fixture of the compiled-lookup tests: lo (10.1.0.2) in group 10 sends to
// remote endpoints 10.1.0.10-10.1.0.249 in groups 0, 30, 31 and 32 (no rules of their
// own), so group 10's egress rules alone decide; events (drops and allows) name the rule.
type polRig struct {
	objs  *contivbpfObjects
	pt    *polTables
	rd    *ringbuf.Reader
	dsts  []netip.Addr
	epgOf map[netip.Addr]uint16
	sport uint16
}

func newPolRig(t *testing.T) *polRig {
	objs := loadTestObjects(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_EVENTS|contivbpfCbFeaturesCB_FEAT_ALLOW_EVENTS))
	setEPG(t, objs, srcIP, 10)
	rd, err := ringbuf.NewReader(objs.CbEvents)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	pt, err := objsPolTables(objs)
	if err != nil {
		t.Fatal(err)
	}
	r := &polRig{objs: objs, pt: pt, rd: rd, epgOf: map[netip.Addr]uint16{}, sport: 20000}
	for i := 10; i < 250; i += 3 {
		ip := netip.AddrFrom4([4]byte{10, 1, 0, byte(i)})
		g := []uint16{0, 30, 31, 32}[i%4]
		v := contivbpfCbEndpoint{Vtep: ip4(netip.MustParseAddr(testVTEP)), Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE), Epg: g}
		copy(v.Mac[:], dataplane.ContivMAC(ip))
		if err := objs.CbEndpoints.Put(&contivbpfCbEpKey{Net: testNet, Ip: ip4(ip)}, &v); err != nil {
			t.Fatal(err)
		}
		r.dsts = append(r.dsts, ip)
		r.epgOf[ip] = g
	}
	return r
}

// set installs group 10's egress rules (as the driver sorts them, replacing the previous
// ones as the driver does) and returns the list.
func (r *polRig) set(t *testing.T, rules []dataplane.PolicyRule) []contivbpfCbRule {
	t.Helper()
	eg, _, err := compileRules(dataplane.PolicySet{EPGID: 10, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.pt.install(contivbpfCbPolKey{Epg: 10}, eg, 0); err != nil {
		t.Fatal(err)
	}
	st := contivbpfCbEpgState{Flags: uint32(contivbpfCbEpgFlagsCB_EPG_RULES)}
	if err := r.objs.CbEpgs.Put(uint32(10), &st); err != nil {
		t.Fatal(err)
	}
	return eg
}

// send runs one opening packet from lo to dst (a fresh source port or echo id each time:
// no conntrack entry decides it) and checks the verdict and the rule the event names
// against the scan of list. what labels failures.
func (r *polRig) send(t *testing.T, list []contivbpfCbRule, dst netip.Addr, proto uint8, dport uint16, flags uint8, what string) contivbpfCbPolBest {
	t.Helper()
	r.sport++
	var pkt []byte
	p := polPacket{remoteEPG: r.epgOf[dst], remoteIP: ip4(dst), proto: proto}
	switch proto {
	case 1:
		pkt = icmpEcho(srcIP, dst, 8, r.sport)
	default:
		pkt = l4Frame(proto, srcIP, dst, r.sport, dport, flags, 0)
		p.hasPorts, p.dport = true, nport(dport)
	}
	p.syn = proto == 6 // a TCP packet is judged as the SYN of its connection
	want := scanRules(list, p)
	res := run(t, r.objs, r.objs.CbFromContainer, pkt, nil)
	if want.Action == uint8(contivbpfCbRuleActionCB_ACT_DENY) {
		res.expect(t, tcActShot, DropPolicy)
	} else {
		res.expect(t, tcActRedirect, FwdTunnel)
	}
	if want.Action == 0 {
		return want
	}
	ev := r.event(t)
	if ev.RuleEPG != 10 || ev.RuleDir != "egress" || ev.RuleIndex != uint32(want.Index) {
		t.Errorf("%s: %v to %v (group %d) proto %d port %d: event names epg %d %s #%d, want the scan's rule #%d %+v",
			what, srcIP, dst, p.remoteEPG, proto, dport, ev.RuleEPG, ev.RuleDir, ev.RuleIndex, want.Index, list[want.Index])
	}
	return want
}

func (r *polRig) event(t *testing.T) DropEvent {
	t.Helper()
	r.rd.SetDeadline(time.Now().Add(time.Second))
	rec, err := r.rd.Read()
	if err != nil {
		t.Fatalf("no event: %v", err)
	}
	ev, ok := decodeEvent(rec.RawSample)
	if !ok {
		t.Fatal("undecodable event")
	}
	return ev
}

// noEvent checks that nothing was reported.
func (r *polRig) noEvent(t *testing.T) {
	t.Helper()
	r.rd.SetDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("unexpected event: %v", err)
	}
}

// TestPolicyLookupProgram: crafted packets through cb_from_container against group rule
// sets built to exercise the compiled lookup; every verdict and every reported rule
// position is the linear scan's.
func TestPolicyLookupProgram(t *testing.T) {
	r := newPolRig(t)
	pfx := netip.MustParsePrefix
	d := func(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 1, 0, byte(n)}) }
	allow, deny := dataplane.ActionAllow, dataplane.ActionDeny
	expect := func(t *testing.T, list []contivbpfCbRule, dst netip.Addr, proto uint8, dport uint16, wantAct dataplane.PolicyAction, wantIdx int) {
		t.Helper()
		got := r.send(t, list, dst, proto, dport, tcpSYN, "case")
		switch {
		case wantAct == "" && got.Action != 0:
			t.Errorf("to %v proto %d port %d: scan says rule #%d, the case expects none", dst, proto, dport, got.Index)
		case wantAct == allow && (got.Action != 1 || int(got.Index) != wantIdx), wantAct == deny && (got.Action != 2 || int(got.Index) != wantIdx):
			t.Errorf("to %v proto %d port %d: scan says %+v, the case expects %s #%d", dst, proto, dport, got, wantAct, wantIdx)
		}
	}
	t.Run("overlapping-prefixes", func(t *testing.T) {
		// Sorted: allow-28 (p9), deny-24 (p5), allow-32 (p3), deny-0 (p1).
		list := r.set(t, []dataplane.PolicyRule{
			{ID: "deny-24", Priority: 5, Remote: pfx("10.1.0.0/24"), Action: deny},
			{ID: "allow-28", Priority: 9, Remote: pfx("10.1.0.16/28"), Proto: 6, Action: allow},
			{ID: "allow-32", Priority: 3, Remote: pfx("10.1.0.37/32"), Action: allow},
			{ID: "deny-0", Priority: 1, Remote: pfx("0.0.0.0/0"), Proto: 17, Action: deny},
		})
		expect(t, list, d(19), 6, 80, allow, 0)  // in the /28 and the /24: the /28's higher priority
		expect(t, list, d(19), 17, 80, deny, 1)  // the /28 is TCP only
		expect(t, list, d(37), 6, 80, deny, 1)   // the /32 is below the /24
		expect(t, list, d(34), 1, 0, deny, 1)    // ICMP, in the /24
		expect(t, list, d(16), 6, 443, allow, 0) // the /28's first address
		expect(t, list, d(34), 6, 443, deny, 1)  // past it
		r.noEvent(t)
	})
	t.Run("ties-and-combinations", func(t *testing.T) {
		// Sorted by effective priority (deny first in a tie, then id).
		list := r.set(t, []dataplane.PolicyRule{
			{ID: "a-allow-30-udp-53", Priority: 6, RemoteEPG: 30, Proto: 17, Port: 53, Action: allow},
			{ID: "b-deny-udp-53", Priority: 6, Proto: 17, Port: 53, Action: deny},
			{ID: "c-allow-31-prefix-tcp-80", Priority: 8, RemoteEPG: 31, Remote: pfx("10.1.0.0/25"), Proto: 6, Port: 80, Action: allow},
			{ID: "d-deny-tcp-80", Priority: 7, Proto: 6, Port: 80, Action: deny},
			{ID: "e-deny-port-443", Priority: 4, Port: 443, Action: deny},
			{ID: "f-allow-32", Priority: 4, RemoteEPG: 32, Action: allow},
		})
		// Sorted: c (16), d (15), b (13), a (12), e (9), f (8). Groups: .10, .22, .130
		// in 31; .13 in 30; .16 in none; .19 in 32.
		expect(t, list, d(13), 17, 53, deny, 2)  // group 30: the tie's deny beats a's allow
		expect(t, list, d(16), 17, 53, deny, 2)  // no group: the same deny
		expect(t, list, d(22), 6, 80, allow, 0)  // group 31 inside the /25
		expect(t, list, d(130), 6, 80, deny, 1)  // group 31 outside it
		expect(t, list, d(19), 6, 80, deny, 1)   // group 32 inside it
		expect(t, list, d(22), 17, 443, deny, 4) // any protocol with ports to 443
		expect(t, list, d(19), 1, 0, allow, 5)   // group 32, ICMP: no port rule matches
		expect(t, list, d(10), 1, 0, "", 0)      // group 31, ICMP: nothing
		expect(t, list, d(10), 6, 8080, "", 0)   // nothing either
	})
	t.Run("syn-only", func(t *testing.T) {
		list := r.set(t, []dataplane.PolicyRule{
			{ID: "deny-syn", Priority: 5, Proto: 6, SynOnly: true, Action: deny},
			{ID: "allow-80", Priority: 3, Proto: 6, Port: 80, Action: allow},
		})
		// Judged as an opening: a SYN, a bare ACK and a RST alike.
		for _, fl := range []uint8{tcpSYN, tcpACK, tcpRST} {
			if got := r.send(t, list, d(13), 6, 80, fl, "syn-only"); got.Action != 2 || got.Index != 0 {
				t.Errorf("flags %#x: %+v, want the SYN-only deny", fl, got)
			}
		}
		r.send(t, list, d(13), 17, 80, 0, "syn-only udp") // not TCP: no rule
	})
	t.Run("rule-set-replaced", func(t *testing.T) {
		a := r.set(t, []dataplane.PolicyRule{{ID: "deny-udp", Priority: 5, Proto: 17, Remote: pfx("10.1.0.0/26"), Action: deny}})
		r.send(t, a, d(13), 17, 53, 0, "before")
		b := r.set(t, []dataplane.PolicyRule{{ID: "allow-udp", Priority: 5, Proto: 17, Port: 53, Action: allow},
			{ID: "deny-tcp", Priority: 2, Proto: 6, Action: deny}})
		if got := r.send(t, b, d(13), 17, 53, 0, "after"); got.Action != 1 {
			t.Errorf("after the replacement: %+v", got)
		}
		r.send(t, b, d(13), 6, 53, tcpSYN, "after tcp")
		// What the replaced set wrote is gone: the maps hold exactly the new version.
		c, err := compilePolicy(b)
		if err != nil {
			t.Fatal(err)
		}
		cidrs := 0
		for _, k := range c.keys {
			cidrs += len(k.cidrs)
		}
		if n, m := countEntries(t, r.objs.CbPolRules), countEntries(t, r.objs.CbPolCidrs); n != len(c.keys) || m != cidrs {
			t.Errorf("after the replacement: %d keys and %d prefixes, want %d and %d", n, m, len(c.keys), cidrs)
		}
	})
	t.Run("random", func(t *testing.T) {
		g := rand.New(rand.NewPCG(7, 33))
		pfxs := []string{"10.1.0.0/16", "10.1.0.0/24", "10.1.0.0/25", "10.1.0.128/25", "10.1.0.0/27", "10.1.0.32/27",
			"10.1.0.16/28", "10.1.0.64/26", "10.1.0.28/30", "10.1.0.40/31", "10.1.0.13/32", "10.1.0.100/32", "0.0.0.0/1", "0.0.0.0/0", "10.2.0.0/16"}
		for set := 0; set < 8; set++ {
			n := []int{1, 3, 10, 40, 120, MaxRules, 7, 25}[set]
			var rules []dataplane.PolicyRule
			for i := 0; i < n; i++ {
				rr := dataplane.PolicyRule{ID: fmt.Sprintf("r%04d", i), Priority: 1 + g.IntN(8), Action: []dataplane.PolicyAction{allow, deny}[g.IntN(2)]}
				if g.IntN(3) == 0 {
					rr.RemoteEPG = uint16(30 + g.IntN(3))
				}
				if g.IntN(2) == 0 {
					rr.Remote = pfx(pfxs[g.IntN(len(pfxs))])
				}
				rr.Proto = []uint8{0, 6, 6, 17, 1}[g.IntN(5)]
				if rr.Proto != 1 && g.IntN(2) == 0 {
					rr.Port = []uint16{53, 80, 443}[g.IntN(3)]
				}
				if rr.Proto == 6 && rr.Port == 0 && g.IntN(3) == 0 {
					rr.SynOnly = true
				}
				if n == MaxRules && i < MaxRules-8 {
					rr.Port = uint16(1000 + i) // mostly rules that miss, a few that decide
				}
				rules = append(rules, rr)
			}
			list := r.set(t, rules)
			for i := 0; i < 150; i++ {
				proto := []uint8{6, 17, 1}[g.IntN(3)]
				r.send(t, list, r.dsts[g.IntN(len(r.dsts))], proto, []uint16{53, 80, 443, 8080}[g.IntN(4)], []uint8{tcpSYN, tcpACK, tcpRST}[g.IntN(3)], fmt.Sprintf("set %d (%d rules)", set, n))
			}
		}
		r.noEvent(t)
	})
}

// TestPolicyLookupVersions: a rule set's change is seen by packets only when the head
// moves; the new keys written before it change nothing, the old ones deleted after it are
// not needed any more, and a deleted direction leaves no key behind.
func TestPolicyLookupVersions(t *testing.T) {
	r := newPolRig(t)
	old := r.set(t, []dataplane.PolicyRule{{ID: "deny-udp", Priority: 5, Proto: 17, Action: dataplane.ActionDeny}})
	pt := r.pt
	newList, _, err := compileRules(dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "allow-udp", Priority: 5, Proto: 17, Remote: netip.MustParsePrefix("10.1.0.0/26"), Action: dataplane.ActionAllow}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := compilePolicy(newList)
	if err != nil {
		t.Fatal(err)
	}
	key := contivbpfCbPolKey{Epg: 10}
	var h contivbpfCbPolHead
	if err := r.objs.CbPolHeads.Lookup(&key, &h); err != nil {
		t.Fatal(err)
	}
	// Step 1: the new version's keys, head untouched: the old answer.
	l := &polLive{ver: h.Ver + 100}
	if err := pt.write(l, c); err != nil {
		t.Fatal(err)
	}
	r.send(t, old, netip.MustParseAddr("10.1.0.13"), 17, 53, 0, "new keys written, head not moved")
	// Step 2: the head moves: the new answer, with the old keys still there.
	nh := contivbpfCbPolHead{Ver: l.ver, Classes: c.classes, Count: uint32(c.count)}
	if err := r.objs.CbPolHeads.Put(&key, &nh); err != nil {
		t.Fatal(err)
	}
	if got := r.send(t, newList, netip.MustParseAddr("10.1.0.13"), 17, 53, 0, "head moved"); got.Action != 1 {
		t.Errorf("head moved: %+v", got)
	}
	// Step 3: the old keys go: nothing changes.
	if errs := pt.sweepOrphans(); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	r.send(t, newList, netip.MustParseAddr("10.1.0.13"), 17, 53, 0, "old keys deleted")
	r.send(t, newList, netip.MustParseAddr("10.1.0.133"), 17, 53, 0, "outside the prefix")
	if n := countEntries(t, r.objs.CbPolRules); n != len(c.keys) {
		t.Errorf("%d keys left, want %d", n, len(c.keys))
	}
	// The direction deleted: head first, then its keys; nothing left.
	pt.live[key] = l
	if err := pt.remove(key); err != nil {
		t.Fatal(err)
	}
	r.send(t, nil, netip.MustParseAddr("10.1.0.13"), 17, 53, 0, "deleted")
	for _, m := range []*ebpf.Map{r.objs.CbPolHeads, r.objs.CbPolRules, r.objs.CbPolCidrs} {
		if n := countEntries(t, m); n != 0 {
			t.Errorf("%v: %d entries left", m, n)
		}
	}
}
