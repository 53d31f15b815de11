package policy

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// DefaultCapacity is the policy map size Encode assumes when given 0.
const DefaultCapacity = 4096

// MaxRuleRefs bounds the rule table (Value.Rule is 16 bits).
const MaxRuleRefs = 1 << 16

// ErrCapacity is wrapped by every *CapacityError.
var ErrCapacity = errors.New("policy map capacity exceeded")

// CapacityError says the compiled policy needs more map entries than the map holds.
// Nothing must be installed when it is returned: a partial policy map changes verdicts.
type CapacityError struct {
	What     string         // "entries" or "rules"
	Need     int            // entries (or rule references) the policy needs
	Capacity int            // what the map holds
	PerEPG   map[uint16]int // entries per group, to show who uses the space
}

func (e *CapacityError) Error() string {
	type kv struct {
		epg uint16
		n   int
	}
	var top []kv
	for g, n := range e.PerEPG {
		top = append(top, kv{g, n})
	}
	slices.SortFunc(top, func(a, b kv) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.epg, b.epg)) })
	var parts []string
	for i, t := range top {
		if i == 3 {
			parts = append(parts, "…")
			break
		}
		parts = append(parts, fmt.Sprintf("epg %d: %d", t.epg, t.n))
	}
	return fmt.Sprintf("%v: policy needs %d %s, capacity %d (largest: %s)", ErrCapacity, e.Need, e.What, e.Capacity, strings.Join(parts, ", "))
}

// Unwrap makes errors.Is(err, ErrCapacity) true.
func (e *CapacityError) Unwrap() error { return ErrCapacity }

// Key is one policy-map key: a match on everything but the remote address, which is a
// prefix (longest-prefix match). Port 0 = any port, Proto 0 = any protocol, RemoteEPG 0 =
// any group, Prefix /0 = any address.
type Key struct {
	EPG       uint16
	Ingress   bool
	SynOnly   bool
	Proto     uint8
	Port      uint16
	RemoteEPG uint16
	Prefix    netip.Prefix // IPv4, masked
}

// Value is what a key maps to: the best rule among those whose prefix contains the key's.
type Value struct {
	Rule     uint16 // index into Map.Rules
	Priority uint8
	Action   dataplane.PolicyAction
}

// Entry is one map entry.
type Entry struct {
	Key   Key
	Value Value
}

// RuleRef identifies a compiled rule for verdicts and per-rule counters.
type RuleRef struct {
	ID       string
	Ingress  bool
	EPGID    uint16
	Priority int
	Action   dataplane.PolicyAction
}

// Map is the flattened policy: entries sorted by key, and the rule table their values
// index, sorted so that among equal priority and action the lower index wins.
type Map struct {
	Entries []Entry
	Rules   []RuleRef
}

// Encode flattens compiled sets into policy-map entries. Rules are normalised the way
// Decide reads them; rules with the same key fields and prefix collapse into one entry
// holding the best of them, and every entry carries the best rule among all rules of its
// key whose prefix contains its prefix, so one longest-prefix lookup per probe gives the
// right answer (see Lookup). capacity 0 means DefaultCapacity. More entries than capacity
// is a *CapacityError, never a truncated map.
func Encode(sets []dataplane.PolicySet, capacity int) (*Map, error) {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	type item struct {
		key Key
		ref RuleRef
	}
	var items []item
	seenEPG := map[uint16]bool{}
	for _, s := range sets {
		if s.EPGID == 0 {
			return nil, fmt.Errorf("policy set: epg id 0 is not a group")
		}
		if seenEPG[s.EPGID] {
			return nil, fmt.Errorf("policy set %d: given twice", s.EPGID)
		}
		seenEPG[s.EPGID] = true
		for _, r := range s.Rules {
			if err := ValidateRule(r); err != nil {
				return nil, fmt.Errorf("policy set %d: %w", s.EPGID, err)
			}
			items = append(items, item{key: keyOf(s.EPGID, r), ref: RuleRef{ID: r.ID, Ingress: r.Ingress, EPGID: s.EPGID, Priority: r.Priority, Action: r.Action}})
		}
	}

	// Rule table.
	refs := make([]RuleRef, 0, len(items))
	for _, it := range items {
		refs = append(refs, it.ref)
	}
	slices.SortFunc(refs, compareRef)
	refs = slices.Compact(refs)
	if len(refs) > MaxRuleRefs {
		return nil, &CapacityError{What: "rules", Need: len(refs), Capacity: MaxRuleRefs, PerEPG: countRefs(refs)}
	}
	index := make(map[RuleRef]uint16, len(refs))
	for i, r := range refs {
		index[r] = uint16(i)
	}

	// Group by everything but the prefix; resolve nested prefixes.
	type group struct {
		epg, remote uint16
		ingress     bool
		syn         bool
		proto       uint8
		port        uint16
	}
	byGroup := map[group]map[netip.Prefix]Value{}
	for _, it := range items {
		g := group{it.key.EPG, it.key.RemoteEPG, it.key.Ingress, it.key.SynOnly, it.key.Proto, it.key.Port}
		v := Value{Rule: index[it.ref], Priority: uint8(it.ref.Priority), Action: it.ref.Action}
		m := byGroup[g]
		if m == nil {
			m = map[netip.Prefix]Value{}
			byGroup[g] = m
		}
		if old, ok := m[it.key.Prefix]; !ok || valueBetter(v, old) {
			m[it.key.Prefix] = v
		}
	}
	out := &Map{Rules: refs}
	perEPG := map[uint16]int{}
	for g, m := range byGroup {
		for p, v := range m {
			best := v
			for q, w := range m {
				if q.Bits() < p.Bits() && q.Contains(p.Addr()) && valueBetter(w, best) {
					best = w
				}
			}
			out.Entries = append(out.Entries, Entry{Key: Key{EPG: g.epg, Ingress: g.ingress, SynOnly: g.syn, Proto: g.proto, Port: g.port, RemoteEPG: g.remote, Prefix: p}, Value: best})
			perEPG[g.epg]++
		}
	}
	if len(out.Entries) > capacity {
		return nil, &CapacityError{What: "entries", Need: len(out.Entries), Capacity: capacity, PerEPG: perEPG}
	}
	slices.SortFunc(out.Entries, func(a, b Entry) int { return compareKey(a.Key, b.Key) })
	return out, nil
}

// ValidateRule checks a rule against the dataplane contract.
func ValidateRule(r dataplane.PolicyRule) error {
	switch {
	case r.ID == "":
		return fmt.Errorf("rule: id is empty")
	case r.Priority < MinPriority || r.Priority > MaxPriority:
		return fmt.Errorf("rule %s: priority %d out of %d..%d", r.ID, r.Priority, MinPriority, MaxPriority)
	case r.Action != dataplane.ActionAllow && r.Action != dataplane.ActionDeny:
		return fmt.Errorf("rule %s: action %q must be allow or deny", r.ID, r.Action)
	case r.Remote.IsValid() && !r.Remote.Addr().Is4():
		return fmt.Errorf("rule %s: remote %v is not IPv4", r.ID, r.Remote)
	}
	return nil
}

// keyOf normalises a rule into its map key.
func keyOf(epg uint16, r dataplane.PolicyRule) Key {
	k := Key{EPG: epg, Ingress: r.Ingress, Proto: r.Proto, RemoteEPG: r.RemoteEPG, Prefix: netip.PrefixFrom(netip.IPv4Unspecified(), 0)}
	if r.Remote.IsValid() {
		k.Prefix = r.Remote.Masked()
	}
	if r.Proto == 6 || r.Proto == 17 {
		k.Port = r.Port
	}
	k.SynOnly = r.SynOnly && r.Proto == 6 && k.Port == 0
	return k
}

func compareRef(a, b RuleRef) int {
	return cmp.Or(strings.Compare(a.ID, b.ID), cmpBool(a.Ingress, b.Ingress), cmp.Compare(a.EPGID, b.EPGID),
		cmp.Compare(a.Priority, b.Priority), strings.Compare(string(a.Action), string(b.Action)))
}

func countRefs(refs []RuleRef) map[uint16]int {
	m := map[uint16]int{}
	for _, r := range refs {
		m[r.EPGID]++
	}
	return m
}

// valueBetter is the datapath's comparison: priority, deny over allow, lower rule index.
func valueBetter(a, b Value) bool {
	return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(actionRank(a.Action), actionRank(b.Action)), cmp.Compare(a.Rule, b.Rule)) < 0
}

func compareKey(a, b Key) int {
	return cmp.Or(cmp.Compare(a.EPG, b.EPG), cmpBool(a.Ingress, b.Ingress), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port),
		cmpBool(a.SynOnly, b.SynOnly), cmp.Compare(a.RemoteEPG, b.RemoteEPG), comparePrefix(a.Prefix, b.Prefix))
}

// Probes lists the keys a datapath looks up for a packet, at most 8 per direction: the
// sender group's egress keys (remote = receiver) and the receiver group's ingress keys
// (remote = sender), each for (proto, port), (proto, any port), TCP setup (syn without
// ack), (any proto), each with the exact remote group and with any group. Prefix is the
// remote address as /32. A non-IPv4 packet gives none.
func Probes(p Packet) []Key {
	if !p.SrcIP.Unmap().Is4() || !p.DstIP.Unmap().Is4() {
		return nil
	}
	type pp struct {
		proto uint8
		port  uint16
		syn   bool
	}
	var pps []pp
	if p.Proto == 6 || p.Proto == 17 {
		if p.DstPort != 0 {
			pps = append(pps, pp{p.Proto, p.DstPort, false})
		}
	}
	if p.Proto != 0 {
		pps = append(pps, pp{p.Proto, 0, false})
	}
	if p.Proto == 6 && p.SYN && !p.ACK {
		pps = append(pps, pp{6, 0, true})
	}
	pps = append(pps, pp{0, 0, false})
	var out []Key
	for _, d := range []struct {
		ingress     bool
		epg, remote uint16
		addr        netip.Addr
	}{{false, p.SrcEPG, p.DstEPG, p.DstIP}, {true, p.DstEPG, p.SrcEPG, p.SrcIP}} {
		if d.epg == 0 {
			continue
		}
		remotes := []uint16{0}
		if d.remote != 0 {
			remotes = []uint16{d.remote, 0}
		}
		for _, x := range pps {
			for _, r := range remotes {
				out = append(out, Key{EPG: d.epg, Ingress: d.ingress, SynOnly: x.syn, Proto: x.proto, Port: x.port, RemoteEPG: r,
					Prefix: netip.PrefixFrom(d.addr.Unmap(), 32)})
			}
		}
	}
	return out
}

// Lookup evaluates a packet the way a datapath holding m does: one longest-prefix lookup
// per probe, the best value wins (priority, deny over allow, lower rule index), no hit
// allows. It gives the same verdict as Decide on the sets m was encoded from.
func (m *Map) Lookup(p Packet) Verdict {
	var best Value
	found := false
	for _, k := range Probes(p) {
		v, ok := m.lpm(k)
		if ok && (!found || valueBetter(v, best)) {
			best, found = v, true
		}
	}
	if !found {
		return defaultVerdict
	}
	r := m.Rules[best.Rule]
	return Verdict{Action: best.Action, RuleID: r.ID, EPGID: r.EPGID, Ingress: r.Ingress, Priority: r.Priority}
}

// lpm finds the entry with the longest prefix containing k.Prefix.Addr() among entries
// whose other key fields equal k's.
func (m *Map) lpm(k Key) (Value, bool) {
	lo, _ := slices.BinarySearchFunc(m.Entries, k, func(e Entry, k Key) int {
		return compareKey(Key{e.Key.EPG, e.Key.Ingress, e.Key.SynOnly, e.Key.Proto, e.Key.Port, e.Key.RemoteEPG, netip.Prefix{}},
			Key{k.EPG, k.Ingress, k.SynOnly, k.Proto, k.Port, k.RemoteEPG, netip.Prefix{}})
	})
	var best Value
	bits := -1
	for _, e := range m.Entries[lo:] {
		ek := e.Key
		if ek.EPG != k.EPG || ek.Ingress != k.Ingress || ek.SynOnly != k.SynOnly || ek.Proto != k.Proto || ek.Port != k.Port || ek.RemoteEPG != k.RemoteEPG {
			break
		}
		if ek.Prefix.Contains(k.Prefix.Addr()) && ek.Prefix.Bits() > bits {
			best, bits = e.Value, ek.Prefix.Bits()
		}
	}
	return best, bits >= 0
}

// Key and value binary layouts for a BPF_MAP_TYPE_LPM_TRIE (BPF_F_NO_PREALLOC):
//
//	struct cb_policy_key {      // 16 bytes
//		__u32  prefixlen;      // host order: KeyFixedBits + remote prefix length
//		__be16 epg;
//		__u8   flags;          // KeyFlagIngress | KeyFlagSynOnly
//		__u8   proto;
//		__be16 port;
//		__be16 remote_epg;
//		__be32 remote_ip;
//	};
//	struct cb_policy_value {    // 4 bytes, host order
//		__u16 rule;            // index into the rule table
//		__u8  priority;
//		__u8  action;          // ValueAllow or ValueDeny
//	};
const (
	KeySize        = 16
	ValueSize      = 4
	KeyFixedBits   = 64 // bits of the key data before remote_ip
	KeyFlagIngress = 1
	KeyFlagSynOnly = 2
	ValueAllow     = 1
	ValueDeny      = 2
)

// MarshalBinary encodes the key in the cb_policy_key layout (prefixlen in host order).
func (k Key) MarshalBinary() ([]byte, error) {
	if !k.Prefix.IsValid() || !k.Prefix.Addr().Is4() {
		return nil, fmt.Errorf("policy key: prefix %v is not IPv4", k.Prefix)
	}
	b := make([]byte, KeySize)
	binary.NativeEndian.PutUint32(b[0:], uint32(KeyFixedBits+k.Prefix.Bits()))
	binary.BigEndian.PutUint16(b[4:], k.EPG)
	if k.Ingress {
		b[6] |= KeyFlagIngress
	}
	if k.SynOnly {
		b[6] |= KeyFlagSynOnly
	}
	b[7] = k.Proto
	binary.BigEndian.PutUint16(b[8:], k.Port)
	binary.BigEndian.PutUint16(b[10:], k.RemoteEPG)
	a := k.Prefix.Masked().Addr().As4()
	copy(b[12:], a[:])
	return b, nil
}

// UnmarshalBinary decodes the cb_policy_key layout.
func (k *Key) UnmarshalBinary(b []byte) error {
	if len(b) != KeySize {
		return fmt.Errorf("policy key: %d bytes, want %d", len(b), KeySize)
	}
	plen := int(binary.NativeEndian.Uint32(b)) - KeyFixedBits
	if plen < 0 || plen > 32 || b[6]&^(KeyFlagIngress|KeyFlagSynOnly) != 0 {
		return fmt.Errorf("policy key: bad prefixlen %d or flags %#x", plen+KeyFixedBits, b[6])
	}
	*k = Key{EPG: binary.BigEndian.Uint16(b[4:]), Ingress: b[6]&KeyFlagIngress != 0, SynOnly: b[6]&KeyFlagSynOnly != 0, Proto: b[7],
		Port: binary.BigEndian.Uint16(b[8:]), RemoteEPG: binary.BigEndian.Uint16(b[10:]),
		Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte(b[12:16])), plen)}
	return nil
}

// MarshalBinary encodes the value in the cb_policy_value layout.
func (v Value) MarshalBinary() ([]byte, error) {
	b := make([]byte, ValueSize)
	binary.NativeEndian.PutUint16(b, v.Rule)
	b[2] = v.Priority
	switch v.Action {
	case dataplane.ActionAllow:
		b[3] = ValueAllow
	case dataplane.ActionDeny:
		b[3] = ValueDeny
	default:
		return nil, fmt.Errorf("policy value: action %q must be allow or deny", v.Action)
	}
	return b, nil
}

// UnmarshalBinary decodes the cb_policy_value layout.
func (v *Value) UnmarshalBinary(b []byte) error {
	if len(b) != ValueSize {
		return fmt.Errorf("policy value: %d bytes, want %d", len(b), ValueSize)
	}
	var a dataplane.PolicyAction
	switch b[3] {
	case ValueAllow:
		a = dataplane.ActionAllow
	case ValueDeny:
		a = dataplane.ActionDeny
	default:
		return fmt.Errorf("policy value: action byte %d", b[3])
	}
	*v = Value{Rule: binary.NativeEndian.Uint16(b), Priority: b[2], Action: a}
	return nil
}

// Diff lists what turns a map holding old into one holding m: entries to write (new or
// changed value) and keys to delete. old may be nil. Write before deleting, so a lookup
// never sees neither the old nor the new best entry for a key.
func (m *Map) Diff(old *Map) (upserts []Entry, deletes []Key) {
	prev := map[Key]Value{}
	if old != nil {
		for _, e := range old.Entries {
			prev[e.Key] = e.Value
		}
	}
	for _, e := range m.Entries {
		if v, ok := prev[e.Key]; !ok || v != e.Value {
			upserts = append(upserts, e)
		}
		delete(prev, e.Key)
	}
	if old != nil {
		for _, e := range old.Entries {
			if _, ok := prev[e.Key]; ok {
				deletes = append(deletes, e.Key)
			}
		}
	}
	return upserts, deletes
}
