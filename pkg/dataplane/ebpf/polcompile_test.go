package ebpf

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// polRand draws rule sets and packets from small domains, so that rules collide on keys,
// prefixes nest and overlap, and priorities tie.
type polRand struct{ r *rand.Rand }

// bases are the addresses prefixes are cut around and packets come from.
var polBases = []netip.Addr{
	netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.130"), netip.MustParseAddr("10.1.7.9"),
	netip.MustParseAddr("10.200.3.4"), netip.MustParseAddr("192.168.1.1"),
}

func (g polRand) addr() netip.Addr {
	b := polBases[g.r.IntN(len(polBases))].As4()
	// Flip some low bits now and then: neighbours inside and just outside prefixes.
	if g.r.IntN(2) == 0 {
		v := binary.BigEndian.Uint32(b[:]) ^ uint32(g.r.IntN(1<<uint(g.r.IntN(17))))
		binary.BigEndian.PutUint32(b[:], v)
	}
	return netip.AddrFrom4(b)
}

func (g polRand) rule(id int) dataplane.PolicyRule {
	r := dataplane.PolicyRule{ID: fmt.Sprintf("r%04d", id), Priority: 1 + g.r.IntN(6), Ingress: g.r.IntN(4) != 0, Action: dataplane.ActionAllow}
	if g.r.IntN(2) == 0 {
		r.Action = dataplane.ActionDeny
	}
	if g.r.IntN(3) == 0 {
		r.RemoteEPG = uint16(1 + g.r.IntN(3))
	}
	if g.r.IntN(2) == 0 {
		r.Remote = netip.PrefixFrom(g.addr(), []int{0, 1, 8, 16, 20, 24, 25, 28, 30, 31, 32}[g.r.IntN(11)]).Masked()
	}
	switch g.r.IntN(5) {
	case 0, 1:
		r.Proto = 6
		if g.r.IntN(3) == 0 {
			r.SynOnly = true
		}
	case 2:
		r.Proto = 17
	case 3:
		r.Proto = 1
	}
	if r.Proto != 1 && g.r.IntN(2) == 0 {
		r.Port = []uint16{53, 80, 443}[g.r.IntN(3)]
	}
	if r.Proto == 0 && g.r.IntN(4) == 0 {
		r.SynOnly = true // SynOnly without a protocol: never matches anything but a TCP SYN
	}
	return r
}

func (g polRand) packet() polPacket {
	p := polPacket{remoteEPG: uint16(g.r.IntN(5)), remoteIP: ip4(g.addr()), proto: []uint8{0, 1, 6, 6, 17, 47}[g.r.IntN(6)]}
	if p.proto == 6 || p.proto == 17 || g.r.IntN(8) == 0 {
		p.hasPorts = g.r.IntN(10) != 0 // a later fragment or a short header has none
		p.dport = nport([]uint16{0, 53, 80, 443, 8080}[g.r.IntN(5)])
	}
	p.syn = p.proto == 6 && g.r.IntN(2) == 0
	return p
}

// TestPolicyCompileMatchesScan: on many random rule sets (up to MaxRules rules) the
// compiled lookup answers every random packet exactly as the linear scan over the sorted
// list does: action, priority and rule position.
func TestPolicyCompileMatchesScan(t *testing.T) {
	g := polRand{rand.New(rand.NewPCG(33, 3))}
	sets, packets := 10000, 300
	if testing.Short() {
		sets = 300
	}
	checked := map[string]int{}
	for s := 0; s < sets; s++ {
		n := []int{1, 2, 3, 5, 8, 20, 60, 200}[g.r.IntN(8)]
		if s%500 == 0 {
			n = MaxRules
		}
		var rules []dataplane.PolicyRule
		for i := 0; i < n; i++ {
			rules = append(rules, g.rule(i))
		}
		eg, in, err := compileRules(dataplane.PolicySet{EPGID: 7, Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range [][]contivbpfCbRule{eg, in} {
			c, err := compilePolicy(list)
			if err != nil {
				t.Fatalf("set %d: %v", s, err)
			}
			if len(c.keys) > len(list) {
				t.Fatalf("set %d: %d keys for %d rules", s, len(c.keys), len(list))
			}
			for i := 0; i < packets; i++ {
				p := g.packet()
				want, got := scanRules(list, p), c.lookup(p)
				if got != want {
					t.Fatalf("set %d (%d rules), packet %+v: compiled %+v, scan %+v\nrules: %+v", s, len(list), p, got, want, list)
				}
				switch {
				case want.Action == 0:
					checked["no match"]++
				case want.Index > 0:
					checked["match after the first rule"]++
				default:
					checked["first rule"]++
				}
			}
		}
	}
	t.Logf("answers compared: %v", checked)
}

// TestPolicyCompileCases: hand-made lists whose answers are known.
func TestPolicyCompileCases(t *testing.T) {
	pfx := netip.MustParsePrefix
	src := netip.MustParseAddr("10.1.2.3")
	rules := []dataplane.PolicyRule{
		{ID: "a-deny-24", Priority: 5, Ingress: true, Remote: pfx("10.1.2.0/24"), Proto: 6, Action: dataplane.ActionDeny},
		{ID: "b-allow-16", Priority: 9, Ingress: true, Remote: pfx("10.1.0.0/16"), Proto: 6, Port: 80, Action: dataplane.ActionAllow},
		{ID: "c-allow-32", Priority: 3, Ingress: true, Remote: pfx("10.1.2.3/32"), Proto: 6, Action: dataplane.ActionAllow},
		{ID: "d-tie-allow", Priority: 5, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionAllow},
		{ID: "e-tie-deny", Priority: 5, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionDeny},
		{ID: "f-syn-only", Priority: 7, Ingress: true, RemoteEPG: 4, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "g-port-any-proto", Priority: 8, Ingress: true, Port: 8080, Action: dataplane.ActionDeny},
	}
	_, in, err := compileRules(dataplane.PolicySet{EPGID: 7, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	c, err := compilePolicy(in)
	if err != nil {
		t.Fatal(err)
	}
	// Sorted: b (18), g (17), f (15), a (11), e (11, deny first of the tie), d (10), c (6).
	order := []string{"b", "g", "f", "a", "e", "d", "c"}
	name := func(b contivbpfCbPolBest) string {
		if b.Action == 0 {
			return "-"
		}
		return order[b.Index]
	}
	for _, tc := range []struct {
		what string
		p    polPacket
		want string
	}{
		{"port 80 from inside the /16 beats the /24 deny", polPacket{remoteIP: ip4(src), proto: 6, hasPorts: true, dport: nport(80)}, "b"},
		{"port 22: the /24 deny beats the /32 allow", polPacket{remoteIP: ip4(src), proto: 6, hasPorts: true, dport: nport(22)}, "a"},
		{"outside the /24 and the /32: no rule", polPacket{remoteIP: ip4(netip.MustParseAddr("10.1.3.3")), proto: 6, hasPorts: true, dport: nport(22)}, "-"},
		{"deny wins the tie", polPacket{remoteIP: ip4(src), proto: 17, hasPorts: true, dport: nport(53)}, "e"},
		{"a SYN of group 4", polPacket{remoteEPG: 4, remoteIP: ip4(src), proto: 6, hasPorts: true, dport: nport(22), syn: true}, "f"},
		{"a non-SYN of group 4", polPacket{remoteEPG: 4, remoteIP: ip4(src), proto: 6, hasPorts: true, dport: nport(22)}, "a"},
		{"port 8080, any protocol", polPacket{remoteIP: ip4(src), proto: 17, hasPorts: true, dport: nport(8080)}, "g"},
		{"no ports: no port rule", polPacket{remoteIP: ip4(src), proto: 17, dport: nport(8080)}, "-"},
		{"no ports, TCP: the /24 deny", polPacket{remoteIP: ip4(src), proto: 6, dport: nport(80)}, "a"},
	} {
		got, want := c.lookup(tc.p), scanRules(in, tc.p)
		if name(got) != tc.want || got != want {
			t.Errorf("%s: compiled %s %+v, scan %s %+v, want %s", tc.what, name(got), got, name(want), want, tc.want)
		}
	}
}

// TestPolicyCompileRefuses: what the programs could not answer as the scan did is an
// error (the driver fails the group closed), and a rule whose address lies outside its
// mask (it never matches) is left out.
func TestPolicyCompileRefuses(t *testing.T) {
	ok := contivbpfCbRule{Action: uint8(contivbpfCbRuleActionCB_ACT_ALLOW), Prio: 2}
	bad := ok
	bad.RemoteMask = binaryNative([]byte{255, 0, 255, 0})
	noAct := ok
	noAct.Action = 0
	for what, rules := range map[string][]contivbpfCbRule{
		"not a prefix": {ok, bad},
		"no action":    {noAct},
		"too many":     make([]contivbpfCbRule, MaxRules+1),
	} {
		if _, err := compilePolicy(rules); err == nil {
			t.Errorf("%s: compiled", what)
		}
	}
	never := ok
	never.RemoteIp = binaryNative([]byte{10, 0, 0, 1})
	never.RemoteMask = binaryNative([]byte{255, 0, 0, 0})
	c, err := compilePolicy([]contivbpfCbRule{never, ok})
	if err != nil {
		t.Fatal(err)
	}
	p := polPacket{remoteIP: never.RemoteIp, proto: 6}
	if got, want := c.lookup(p), scanRules([]contivbpfCbRule{never, ok}, p); got != want || got.Index != 1 {
		t.Errorf("address outside its mask: compiled %+v, scan %+v", got, want)
	}
	if c, err := compilePolicy(nil); err != nil || c.classes != 0 || len(c.keys) != 0 {
		t.Errorf("empty list: %+v, %v", c, err)
	}
}
