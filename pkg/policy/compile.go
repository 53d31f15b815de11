// Package policy owns Contiv policy semantics on the agent side: it compiles the policy
// state netmaster writes (state/endpointGroups, state/policy, state/policyRule) into one
// dataplane.PolicySet per endpoint group, evaluates packets against compiled sets (Decide,
// the executable specification both datapaths are tested against) and flattens sets into
// capacity-checked policy-map entries (Encode) for a datapath to install.
//
// It is pure: no etcd, no netlink, no clock. See docs/policy.md.
package policy

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// MinPriority and MaxPriority bound a rule's priority (higher wins).
const (
	MinPriority = 1
	MaxPriority = 100
)

// Directional rule kinds, the suffix netmaster gives every state/policyRule id.
const (
	DirInRx  = "inRx"  // traffic into the group (compiled: ingress)
	DirInTx  = "inTx"  // replies of an incoming rule (not compiled: the datapaths are stateful)
	DirOutTx = "outTx" // traffic out of the group (compiled: egress)
	DirOutRx = "outRx" // replies of an outgoing rule (not compiled)
)

// State is the decoded policy state of netmaster. Every field may be empty.
type State struct {
	// Groups are the state/endpointGroups records. When non-empty, every group id a rule
	// names must be one of theirs.
	Groups []model.EndpointGroupState
	// Policies are the state/policy records; the directional rules embedded in their
	// RuleMaps are compiled too, and must agree with Rules where both hold an id.
	Policies []model.EpgPolicy
	// Rules are the state/policyRule records.
	Rules []model.CfgPolicyRule
}

// RuleError is a record that could not be compiled; Compile leaves the record out.
type RuleError struct {
	RuleID string // policyRule id (or "endpointGroup <id>" for a bad group record)
	Field  string // offending field, JSON name
	Msg    string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("policy rule %s: %s: %s", e.RuleID, e.Field, e.Msg)
}

func ruleErr(id, field, format string, a ...any) *RuleError {
	return &RuleError{RuleID: id, Field: field, Msg: fmt.Sprintf(format, a...)}
}

// Compile turns the state into one PolicySet per endpoint group id, sorted by EPG id, each
// with its rules in evaluation order (see SortRules). Records that can't be compiled are
// left out and reported in the returned error (errors.Join of *RuleError, sorted by rule
// id); the sets are valid in either case, so a caller may install them and surface the
// error, or refuse them as a whole.
func Compile(s State) ([]dataplane.PolicySet, error) {
	var errs []*RuleError
	known := map[uint16]bool{}
	for _, g := range s.Groups {
		if g.EndpointGroupID < 1 || g.EndpointGroupID > 0xffff {
			errs = append(errs, ruleErr("endpointGroup "+g.ID, "endpointGroupId", "%d out of 1..65535", g.EndpointGroupID))
			continue
		}
		known[uint16(g.EndpointGroupID)] = true
	}

	// Merge the two sources of directional rules by id.
	recs := map[string]model.OfnetPolicyRule{}
	conflicted := map[string]bool{}
	add := func(id string, r model.OfnetPolicyRule) {
		if old, ok := recs[id]; ok && old != r {
			if !conflicted[id] {
				errs = append(errs, ruleErr(id, "id", "state/policy and state/policyRule hold different contents (%+v vs %+v)", old, r))
			}
			conflicted[id] = true
			return
		}
		recs[id] = r
	}
	for _, r := range s.Rules {
		id := r.ID
		switch {
		case id == "" && r.RuleId == "":
			errs = append(errs, ruleErr("(no id)", "id", "empty"))
			continue
		case id == "":
			id = r.RuleId
		case r.RuleId != "" && r.RuleId != id:
			errs = append(errs, ruleErr(id, "RuleId", "%q differs from the record id", r.RuleId))
			continue
		}
		r.RuleId = id
		add(id, r.OfnetPolicyRule)
	}
	for _, ep := range s.Policies {
		for _, key := range sortedKeys(ep.RuleMaps) {
			rm := ep.RuleMaps[key]
			if rm == nil {
				continue
			}
			for _, id := range sortedKeys(rm.OfnetRules) {
				r := rm.OfnetRules[id]
				if r == nil {
					continue
				}
				rr := *r
				if rr.RuleId == "" {
					rr.RuleId = id
				}
				if local, _, err := localGroup(rr); err == nil && local != ep.EndpointGroupID {
					errs = append(errs, ruleErr(id, "endpointGroupId", "rule is for group %d but sits in state/policy %s of group %d", local, ep.ID, ep.EndpointGroupID))
					continue
				}
				add(id, rr)
			}
		}
	}

	sets := map[uint16]*dataplane.PolicySet{}
	for id, r := range recs {
		if conflicted[id] {
			continue
		}
		epg, rules, err := CompileRule(r)
		if err != nil {
			var re *RuleError
			if !errors.As(err, &re) {
				re = ruleErr(id, "rule", "%v", err)
			}
			errs = append(errs, re)
			continue
		}
		if rules == nil {
			continue // reply rule
		}
		if len(known) > 0 {
			if !known[epg] {
				errs = append(errs, ruleErr(id, "endpointGroupId", "group id %d has no state/endpointGroups record", epg))
				continue
			}
			if re := rules[0].RemoteEPG; re != 0 && !known[re] {
				errs = append(errs, ruleErr(id, "endpointGroupId", "remote group id %d has no state/endpointGroups record", re))
				continue
			}
		}
		ps := sets[epg]
		if ps == nil {
			ps = &dataplane.PolicySet{EPGID: epg}
			sets[epg] = ps
		}
		ps.Rules = append(ps.Rules, rules...)
	}
	out := make([]dataplane.PolicySet, 0, len(sets))
	for _, ps := range sets {
		SortRules(ps.Rules)
		out = append(out, *ps)
	}
	slices.SortFunc(out, func(a, b dataplane.PolicySet) int { return cmp.Compare(a.EPGID, b.EPGID) })
	slices.SortFunc(errs, func(a, b *RuleError) int {
		return cmp.Or(strings.Compare(a.RuleID, b.RuleID), strings.Compare(a.Field, b.Field), strings.Compare(a.Msg, b.Msg))
	})
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e
	}
	return out, errors.Join(joined...)
}

// Direction is the kind suffix of a directional rule id ("…:inRx" → "inRx").
func Direction(ruleID string) string { return ruleID[strings.LastIndex(ruleID, ":")+1:] }

// RuleGroup is the endpoint group whose rule set a directional rule record compiles into
// (reply rules included), or false when its id or group fields do not say (Compile then
// reports it). A change of the record can only change that group's set.
func RuleGroup(r model.OfnetPolicyRule) (uint16, bool) {
	g, _, err := localGroup(r)
	if err != nil || g < 1 || g > 0xffff {
		return 0, false
	}
	return uint16(g), true
}

// localGroup is the group a directional rule belongs to, and whether it is a reply rule.
func localGroup(r model.OfnetPolicyRule) (int, bool, error) {
	switch Direction(r.RuleId) {
	case DirInRx:
		return r.DstEndpointGroup, false, nil
	case DirOutTx:
		return r.SrcEndpointGroup, false, nil
	case DirInTx:
		return r.SrcEndpointGroup, true, nil
	case DirOutRx:
		return r.DstEndpointGroup, true, nil
	}
	return 0, false, ruleErr(r.RuleId, "RuleId", "direction suffix %q is not inRx, inTx, outTx or outRx", Direction(r.RuleId))
}

// CompileRule compiles one directional rule into the group it belongs to and its rules,
// one per remote prefix (an address range may need several). Reply rules (inTx, outRx)
// are checked for their group and give nil rules: the datapaths are stateful and pass
// replies of allowed connections. The error is a *RuleError.
func CompileRule(r model.OfnetPolicyRule) (uint16, []dataplane.PolicyRule, error) {
	id := r.RuleId
	local, reply, err := localGroup(r)
	if err != nil {
		return 0, nil, err
	}
	dir := Direction(id)
	localField := map[string]string{DirInRx: "DstEndpointGroup", DirOutTx: "SrcEndpointGroup", DirInTx: "SrcEndpointGroup", DirOutRx: "DstEndpointGroup"}[dir]
	if local < 1 || local > 0xffff {
		return 0, nil, ruleErr(id, localField, "group id %d out of 1..65535", local)
	}
	if reply {
		return uint16(local), nil, nil
	}
	ingress := dir == DirInRx
	remoteEPG, remoteAddr, localAddr := r.SrcEndpointGroup, r.SrcIpAddr, r.DstIpAddr
	remoteGroupField, remoteAddrField, localAddrField := "SrcEndpointGroup", "SrcIpAddr", "DstIpAddr"
	if !ingress {
		remoteEPG, remoteAddr, localAddr = r.DstEndpointGroup, r.DstIpAddr, r.SrcIpAddr
		remoteGroupField, remoteAddrField, localAddrField = "DstEndpointGroup", "DstIpAddr", "SrcIpAddr"
	}
	switch {
	case remoteEPG < 0 || remoteEPG > 0xffff:
		return 0, nil, ruleErr(id, remoteGroupField, "group id %d out of 0..65535", remoteEPG)
	case localAddr != "":
		return 0, nil, ruleErr(id, localAddrField, "%q: an address inside the rule's own group (toIpAddress of an incoming rule) can't be enforced", localAddr)
	case r.SrcPort != 0:
		return 0, nil, ruleErr(id, "SrcPort", "%d: source ports can't be matched (only reply rules carry one)", r.SrcPort)
	case r.Priority < MinPriority || r.Priority > MaxPriority:
		return 0, nil, ruleErr(id, "Priority", "%d out of %d..%d", r.Priority, MinPriority, MaxPriority)
	case r.Action != string(dataplane.ActionAllow) && r.Action != string(dataplane.ActionDeny):
		return 0, nil, ruleErr(id, "Action", "%q must be allow or deny", r.Action)
	}
	port := r.DstPort
	if r.IpProtocol != 6 && r.IpProtocol != 17 {
		port = 0 // a port means nothing without TCP/UDP (netmaster stores it anyway)
	}
	var syn bool
	switch r.TcpFlags {
	case "":
	case "syn,!ack":
		if r.IpProtocol != 6 || port != 0 {
			return 0, nil, ruleErr(id, "TcpFlags", "syn,!ack needs protocol 6 and port 0 (have %d, %d)", r.IpProtocol, port)
		}
		syn = true
	default:
		return 0, nil, ruleErr(id, "TcpFlags", "%q: only \"syn,!ack\" is supported", r.TcpFlags)
	}
	prefixes := []netip.Prefix{{}}
	if remoteAddr != "" {
		if prefixes, err = ParseAddrs(remoteAddr); err != nil {
			return 0, nil, ruleErr(id, remoteAddrField, "%v", err)
		}
	}
	rules := make([]dataplane.PolicyRule, 0, len(prefixes))
	for _, p := range prefixes {
		rules = append(rules, dataplane.PolicyRule{ID: id, Priority: r.Priority, Ingress: ingress, RemoteEPG: uint16(remoteEPG),
			Remote: p, Proto: r.IpProtocol, Port: port, SynOnly: syn, Action: dataplane.PolicyAction(r.Action)})
	}
	return uint16(local), rules, nil
}

// ParseAddrs parses a rule address in netmaster's forms — "a.b.c.d", "a.b.c.d/len",
// "a.b.c.d-e" (a.b.c.d up to a.b.c.e) or "a.b.c.d-e/len" (the range, which must lie inside
// a.b.c.d/len) — into the smallest list of masked IPv4 prefixes covering exactly those
// addresses, in address order. A /0 prefix means any address.
func ParseAddrs(s string) ([]netip.Prefix, error) {
	addr, bits := s, -1
	if i := strings.IndexByte(s, '/'); i >= 0 {
		n, err := strconv.Atoi(s[i+1:])
		if err != nil || n < 0 || n > 32 {
			return nil, fmt.Errorf("%q: prefix length must be 0..32", s)
		}
		addr, bits = s[:i], n
	}
	last := ""
	if i := strings.IndexByte(addr, '-'); i >= 0 {
		addr, last = addr[:i], addr[i+1:]
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is4() {
		return nil, fmt.Errorf("%q: %q is not an IPv4 address", s, addr)
	}
	if last == "" {
		if bits < 0 {
			bits = 32
		}
		return []netip.Prefix{netip.PrefixFrom(a, bits).Masked()}, nil
	}
	n, err := strconv.Atoi(last)
	b4 := a.As4()
	if err != nil || n < int(b4[3]) || n > 255 {
		return nil, fmt.Errorf("%q: range end %q must be a last octet %d..255", s, last, b4[3])
	}
	b4[3] = byte(n)
	end := netip.AddrFrom4(b4)
	if bits >= 0 {
		if p := netip.PrefixFrom(a, bits).Masked(); !p.Contains(end) {
			return nil, fmt.Errorf("%q: range %v-%v is not inside %v", s, a, end, p)
		}
	}
	return RangePrefixes(a, end), nil
}

// RangePrefixes covers the IPv4 range [first, last] with the fewest prefixes, in order.
func RangePrefixes(first, last netip.Addr) []netip.Prefix {
	lo, hi := u32(first), u32(last)
	var out []netip.Prefix
	for lo <= hi {
		size := 0 // log2 of the block
		for size < 32 {
			next := uint64(1) << (size + 1)
			if uint64(lo)%next != 0 || uint64(lo)+next-1 > uint64(hi) {
				break
			}
			size++
		}
		out = append(out, netip.PrefixFrom(addr4(lo), 32-size))
		end := uint64(lo) + uint64(1)<<size
		if end > uint64(hi) {
			break
		}
		lo = uint32(end)
	}
	return out
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// SortRules puts rules in evaluation order: priority descending, deny before allow at
// equal priority, then id, egress before ingress, and remote prefix.
func SortRules(rules []dataplane.PolicyRule) {
	slices.SortStableFunc(rules, func(a, b dataplane.PolicyRule) int {
		return cmp.Or(
			cmp.Compare(b.Priority, a.Priority),
			cmp.Compare(actionRank(a.Action), actionRank(b.Action)),
			strings.Compare(a.ID, b.ID),
			cmpBool(a.Ingress, b.Ingress),
			comparePrefix(a.Remote, b.Remote),
		)
	})
}

func actionRank(a dataplane.PolicyAction) int {
	if a == dataplane.ActionDeny {
		return 0
	}
	return 1
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
