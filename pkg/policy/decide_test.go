package policy

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

const (
	gDB    = 1
	gWeb   = 2
	gOther = 3
)

var (
	ipDB    = netip.MustParseAddr("10.1.0.10")
	ipWeb   = netip.MustParseAddr("10.1.0.20")
	ipOther = netip.MustParseAddr("10.1.0.30")
	ipExt   = netip.MustParseAddr("192.168.5.5")
)

// conventional is Contiv's documented pattern on web: a low-priority deny of TCP
// connection setup plus a higher-priority allow of port 80 from db.
func conventional() []dataplane.PolicySet {
	return []dataplane.PolicySet{{EPGID: gWeb, Rules: []dataplane.PolicyRule{
		{ID: "allow-80-from-db", Priority: 10, Ingress: true, RemoteEPG: gDB, Proto: 6, Port: 80, Action: "allow"},
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: "deny"},
	}}}
}

func syn(src, dst uint16, sip, dip netip.Addr, port uint16) Packet {
	return Packet{SrcEPG: src, DstEPG: dst, SrcIP: sip, DstIP: dip, Proto: 6, DstPort: port, SYN: true}
}

func TestDecide(t *testing.T) {
	extra := func(rules ...dataplane.PolicyRule) []dataplane.PolicySet {
		return append(conventional(), dataplane.PolicySet{EPGID: gDB, Rules: rules})
	}
	for _, c := range []struct {
		name string
		sets []dataplane.PolicySet
		pkt  Packet
		want string // "allow <rule>" / "deny <rule>", rule "" = default
	}{
		{"db to web:80 syn", conventional(), syn(gDB, gWeb, ipDB, ipWeb, 80), "allow allow-80-from-db"},
		{"other to web:80 syn", conventional(), syn(gOther, gWeb, ipOther, ipWeb, 80), "deny deny-tcp"},
		{"external (no group) to web:80", conventional(), syn(0, gWeb, ipExt, ipWeb, 80), "deny deny-tcp"},
		{"db to web:22 syn", conventional(), syn(gDB, gWeb, ipDB, ipWeb, 22), "deny deny-tcp"},
		{"db to web:22 ack (established)", conventional(), Packet{SrcEPG: gDB, DstEPG: gWeb, SrcIP: ipDB, DstIP: ipWeb, Proto: 6, DstPort: 22, ACK: true}, "allow "},
		{"db to web:22 syn-ack (reply)", conventional(), Packet{SrcEPG: gDB, DstEPG: gWeb, SrcIP: ipDB, DstIP: ipWeb, Proto: 6, DstPort: 22, SYN: true, ACK: true}, "allow "},
		{"db to web udp", conventional(), Packet{SrcEPG: gDB, DstEPG: gWeb, SrcIP: ipDB, DstIP: ipWeb, Proto: 17, DstPort: 80}, "allow "},
		{"db to web icmp", conventional(), Packet{SrcEPG: gDB, DstEPG: gWeb, SrcIP: ipDB, DstIP: ipWeb, Proto: 1}, "allow "},
		{"web to db (no rules there)", conventional(), syn(gWeb, gDB, ipWeb, ipDB, 5432), "allow "},
		{"web to external", conventional(), syn(gWeb, 0, ipWeb, ipExt, 443), "allow "},
		{"IPv6 never filtered", conventional(), syn(gOther, gWeb, netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), 22), "allow "},
		{"no sets", nil, syn(gOther, gWeb, ipOther, ipWeb, 22), "allow "},
		{"sender's egress deny outranks receiver's allow", extra(dataplane.PolicyRule{ID: "db-no-web", Priority: 20, RemoteEPG: gWeb, Action: "deny"}),
			syn(gDB, gWeb, ipDB, ipWeb, 80), "deny db-no-web"},
		{"receiver's allow outranks sender's lower deny", extra(dataplane.PolicyRule{ID: "db-no-web", Priority: 5, RemoteEPG: gWeb, Action: "deny"}),
			syn(gDB, gWeb, ipDB, ipWeb, 80), "allow allow-80-from-db"},
		{"equal priority: deny wins", extra(dataplane.PolicyRule{ID: "zz-db-no-80", Priority: 10, Proto: 6, Port: 80, Action: "deny"}),
			syn(gDB, gWeb, ipDB, ipWeb, 80), "deny zz-db-no-80"},
		{"egress to address prefix", extra(dataplane.PolicyRule{ID: "no-dns", Priority: 5, Remote: pfx("8.8.8.0/24"), Proto: 17, Port: 53, Action: "deny"}),
			Packet{SrcEPG: gDB, SrcIP: ipDB, DstIP: netip.MustParseAddr("8.8.8.8"), Proto: 17, DstPort: 53}, "deny no-dns"},
		{"egress prefix miss", extra(dataplane.PolicyRule{ID: "no-dns", Priority: 5, Remote: pfx("8.8.8.0/24"), Proto: 17, Port: 53, Action: "deny"}),
			Packet{SrcEPG: gDB, SrcIP: ipDB, DstIP: netip.MustParseAddr("8.8.4.4"), Proto: 17, DstPort: 53}, "allow "},
		{"remote group must match", extra(dataplane.PolicyRule{ID: "no-other", Priority: 5, RemoteEPG: gOther, Action: "deny"}),
			syn(gDB, gWeb, ipDB, ipWeb, 80), "allow allow-80-from-db"},
		{"port ignored without tcp/udp", []dataplane.PolicySet{{EPGID: gWeb, Rules: []dataplane.PolicyRule{{ID: "any-80", Priority: 1, Ingress: true, Port: 80, Action: "deny"}}}},
			Packet{SrcEPG: gDB, DstEPG: gWeb, SrcIP: ipDB, DstIP: ipWeb, Proto: 1}, "deny any-80"},
		{"syn-only ignored with a port", []dataplane.PolicySet{{EPGID: gWeb, Rules: []dataplane.PolicyRule{{ID: "p80", Priority: 1, Ingress: true, Proto: 6, Port: 80, SynOnly: true, Action: "deny"}}}},
			Packet{SrcEPG: gDB, DstEPG: gWeb, SrcIP: ipDB, DstIP: ipWeb, Proto: 6, DstPort: 80, ACK: true}, "deny p80"},
		{"intra-group traffic sees both directions", []dataplane.PolicySet{{EPGID: gWeb, Rules: []dataplane.PolicyRule{
			{ID: "in", Priority: 3, Ingress: true, Action: "allow"}, {ID: "out", Priority: 3, Action: "allow"}}}},
			syn(gWeb, gWeb, ipWeb, ipWeb.Next(), 1), "allow in"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Decide(c.sets, c.pkt)
			if got := string(v.Action) + " " + v.RuleID; got != c.want {
				t.Fatalf("Decide = %q (%+v), want %q", got, v, c.want)
			}
			if (v.Action == dataplane.ActionAllow) != v.Allowed() {
				t.Fatal("Allowed disagrees with Action")
			}
			// The encoded map must agree.
			m, err := Encode(c.sets, 0)
			if err != nil {
				t.Fatal(err)
			}
			if lv := m.Lookup(c.pkt); lv != v {
				t.Fatalf("Lookup = %+v, Decide = %+v", lv, v)
			}
		})
	}
}

// TestLookupMatchesDecide checks on random policies that one longest-prefix lookup per
// probe (what a datapath does) gives exactly Decide's verdict.
func TestLookupMatchesDecide(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := []netip.Prefix{{}, pfx("10.0.0.0/8"), pfx("10.1.0.0/16"), pfx("10.1.2.0/24"), pfx("10.1.2.3/32"), pfx("10.1.2.128/25"), pfx("10.2.0.0/16")}
	addrs := []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.1.2.200"), netip.MustParseAddr("10.1.9.9"),
		netip.MustParseAddr("10.2.0.1"), netip.MustParseAddr("11.0.0.1")}
	protos := []uint8{0, 6, 17, 1}
	ports := []uint16{0, 80, 443}
	pick := func(n int) int { return rng.IntN(n) }
	checked, denied := 0, 0
	for iter := 0; iter < 300; iter++ {
		var sets []dataplane.PolicySet
		for epg := uint16(1); epg <= 3; epg++ {
			if pick(4) == 0 {
				continue
			}
			s := dataplane.PolicySet{EPGID: epg}
			for i := 0; i < 1+pick(8); i++ {
				s.Rules = append(s.Rules, dataplane.PolicyRule{ID: fmt.Sprintf("r%d", pick(6)), Priority: []int{1, 2, 3, 50}[pick(4)],
					Ingress: pick(2) == 0, RemoteEPG: uint16(pick(4)), Remote: prefixes[pick(len(prefixes))], Proto: protos[pick(4)],
					Port: ports[pick(3)], SynOnly: pick(3) == 0, Action: []dataplane.PolicyAction{"allow", "deny"}[pick(2)]})
			}
			sets = append(sets, s)
		}
		m, err := Encode(sets, 0)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 60; j++ {
			p := Packet{SrcEPG: uint16(pick(4)), DstEPG: uint16(pick(4)), SrcIP: addrs[pick(len(addrs))], DstIP: addrs[pick(len(addrs))],
				Proto: protos[pick(4)], DstPort: ports[pick(3)], SYN: pick(2) == 0, ACK: pick(2) == 0}
			d, l := Decide(sets, p), m.Lookup(p)
			if d != l {
				t.Fatalf("packet %+v\nsets %+v\nDecide %+v\nLookup %+v", p, sets, d, l)
			}
			checked++
			if !d.Allowed() {
				denied++
			}
		}
	}
	if denied == 0 || denied == checked {
		t.Fatalf("random cases not varied: %d of %d denied", denied, checked)
	}
}

func TestEncodeEntriesAndCapacity(t *testing.T) {
	sets := []dataplane.PolicySet{{EPGID: gWeb, Rules: []dataplane.PolicyRule{
		{ID: "wide", Priority: 50, Ingress: true, Remote: pfx("10.0.0.0/8"), Proto: 6, Port: 22, Action: "deny"},
		{ID: "narrow", Priority: 10, Ingress: true, Remote: pfx("10.1.0.0/16"), Proto: 6, Port: 22, Action: "allow"},
		{ID: "narrow-dup", Priority: 5, Ingress: true, Remote: pfx("10.1.0.0/16"), Proto: 6, Port: 22, Action: "allow"},
		{ID: "icmp-port", Priority: 1, Proto: 1, Port: 99, SynOnly: true, Action: "deny"},
	}}}
	m, err := Encode(sets, 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range m.Entries {
		got = append(got, fmt.Sprintf("%d in=%v syn=%v p=%d/%d r=%d %v -> %s/%d/%s", e.Key.EPG, e.Key.Ingress, e.Key.SynOnly, e.Key.Proto, e.Key.Port,
			e.Key.RemoteEPG, e.Key.Prefix, m.Rules[e.Value.Rule].ID, e.Value.Priority, e.Value.Action))
	}
	want := []string{
		"2 in=false syn=false p=1/0 r=0 0.0.0.0/0 -> icmp-port/1/deny",
		// The /16 entry carries the /8 deny: it outranks everything the /16 holds.
		"2 in=true syn=false p=6/22 r=0 10.0.0.0/8 -> wide/50/deny",
		"2 in=true syn=false p=6/22 r=0 10.1.0.0/16 -> wide/50/deny",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("entries\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(m.Rules) != 4 {
		t.Fatalf("rule table %+v", m.Rules)
	}

	_, err = Encode(sets, 2)
	var ce *CapacityError
	if !errors.Is(err, ErrCapacity) || !errors.As(err, &ce) || ce.Need != 3 || ce.Capacity != 2 || ce.PerEPG[gWeb] != 3 ||
		!strings.Contains(err.Error(), "policy needs 3 entries, capacity 2 (largest: epg 2: 3)") {
		t.Fatalf("over capacity: %v", err)
	}

	// Many groups: the message names the largest users.
	var big []dataplane.PolicySet
	for g := uint16(1); g <= 5; g++ {
		s := dataplane.PolicySet{EPGID: g}
		for i := 0; i < int(g)*10; i++ {
			s.Rules = append(s.Rules, dataplane.PolicyRule{ID: fmt.Sprintf("g%d-%d", g, i), Priority: 1, Remote: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(g), 0, byte(i)}), 32), Action: "deny"})
		}
		big = append(big, s)
	}
	if _, err := Encode(big, 100); !errors.Is(err, ErrCapacity) || !strings.Contains(err.Error(), "needs 150 entries, capacity 100 (largest: epg 5: 50, epg 4: 40, epg 3: 30, …)") {
		t.Fatalf("big: %v", err)
	}
	if m, err := Encode(big, 150); err != nil || len(m.Entries) != 150 {
		t.Fatalf("exactly at capacity: %v", err)
	}
	if m, err := Encode(big, 0); err != nil || len(m.Entries) != 150 {
		t.Fatalf("default capacity: %v", err)
	}

	for _, c := range []struct {
		sets []dataplane.PolicySet
		err  string
	}{
		{[]dataplane.PolicySet{{EPGID: 0}}, "epg id 0"},
		{[]dataplane.PolicySet{{EPGID: 1}, {EPGID: 1}}, "given twice"},
		{[]dataplane.PolicySet{{EPGID: 1, Rules: []dataplane.PolicyRule{{ID: "x", Priority: 0, Action: "allow"}}}}, "rule x: priority 0"},
		{[]dataplane.PolicySet{{EPGID: 1, Rules: []dataplane.PolicyRule{{ID: "x", Priority: 1, Action: "drop"}}}}, `rule x: action "drop"`},
		{[]dataplane.PolicySet{{EPGID: 1, Rules: []dataplane.PolicyRule{{ID: "x", Priority: 1, Action: "deny", Remote: pfx("fd00::/8")}}}}, "not IPv4"},
		{[]dataplane.PolicySet{{EPGID: 1, Rules: []dataplane.PolicyRule{{Priority: 1, Action: "deny"}}}}, "id is empty"},
	} {
		if _, err := Encode(c.sets, 0); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Encode(%+v) = %v, want %q", c.sets, err, c.err)
		}
	}
}

func TestBinaryLayout(t *testing.T) {
	k := Key{EPG: 0x0102, Ingress: true, SynOnly: true, Proto: 6, Port: 80, RemoteEPG: 7, Prefix: pfx("10.1.2.0/24")}
	b, err := k.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{88, 0, 0, 0, 0x01, 0x02, 3, 6, 0, 80, 0, 7, 10, 1, 2, 0} // little-endian prefixlen 64+24
	if !bytes.Equal(b, want) {
		t.Fatalf("key bytes % x, want % x", b, want)
	}
	var back Key
	if err := back.UnmarshalBinary(b); err != nil || back != k {
		t.Fatalf("round trip %+v %v", back, err)
	}
	v := Value{Rule: 0x0304, Priority: 100, Action: "deny"}
	vb, err := v.MarshalBinary()
	if err != nil || !bytes.Equal(vb, []byte{4, 3, 100, ValueDeny}) {
		t.Fatalf("value bytes % x %v", vb, err)
	}
	var vback Value
	if err := vback.UnmarshalBinary(vb); err != nil || vback != v {
		t.Fatalf("value round trip %+v %v", vback, err)
	}
	if _, err := (Key{Prefix: pfx("fd00::/8")}).MarshalBinary(); err == nil {
		t.Fatal("IPv6 key encoded")
	}
	if err := back.UnmarshalBinary(append([]byte{200}, b[1:]...)); err == nil {
		t.Fatal("prefixlen 200 decoded")
	}
	if err := vback.UnmarshalBinary([]byte{0, 0, 1, 9}); err == nil {
		t.Fatal("action 9 decoded")
	}
}

func TestDiff(t *testing.T) {
	old, err := Encode(conventional(), 0)
	if err != nil {
		t.Fatal(err)
	}
	next := conventional()
	next[0].Rules[0].Port = 8080                                                                      // changes one key
	next[0].Rules = append(next[0].Rules, dataplane.PolicyRule{ID: "x", Priority: 1, Action: "deny"}) // adds one
	m, err := Encode(next, 0)
	if err != nil {
		t.Fatal(err)
	}
	up, del := m.Diff(old)
	if len(up) != 2 || up[0].Key.Proto != 0 || up[1].Key.Port != 8080 || len(del) != 1 || del[0].Port != 80 {
		t.Fatalf("upserts %+v deletes %+v", up, del)
	}
	if up, del := m.Diff(m); len(up) != 0 || len(del) != 0 {
		t.Fatal("diff with itself not empty")
	}
	if up, del := m.Diff(nil); len(up) != len(m.Entries) || len(del) != 0 {
		t.Fatal("diff from nil")
	}
}

// bigPolicy is 20 groups of 50 rules each, half of them with /24 remote prefixes.
func bigPolicy() []dataplane.PolicySet {
	var sets []dataplane.PolicySet
	for g := uint16(1); g <= 20; g++ {
		s := dataplane.PolicySet{EPGID: g}
		for i := 0; i < 50; i++ {
			r := dataplane.PolicyRule{ID: fmt.Sprintf("g%d-r%d", g, i), Priority: 1 + i%100, Ingress: i%2 == 0, RemoteEPG: uint16(i % 5),
				Proto: 6, Port: uint16(1000 + i), Action: []dataplane.PolicyAction{"allow", "deny"}[i%2]}
			if i%2 == 1 {
				r.Remote = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(g), byte(i), 0}), 24)
			}
			s.Rules = append(s.Rules, r)
		}
		sets = append(sets, s)
	}
	return sets
}

func BenchmarkEncode1000Rules(b *testing.B) {
	sets := bigPolicy()
	for b.Loop() {
		if _, err := Encode(sets, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecide1000Rules(b *testing.B) {
	sets := bigPolicy()
	p := syn(3, 4, netip.MustParseAddr("10.3.7.1"), netip.MustParseAddr("10.4.9.9"), 1007)
	for b.Loop() {
		Decide(sets, p)
	}
}

func BenchmarkLookup1000Rules(b *testing.B) {
	m, err := Encode(bigPolicy(), 0)
	if err != nil {
		b.Fatal(err)
	}
	p := syn(3, 4, netip.MustParseAddr("10.3.7.1"), netip.MustParseAddr("10.4.9.9"), 1007)
	for b.Loop() {
		m.Lookup(p)
	}
}
