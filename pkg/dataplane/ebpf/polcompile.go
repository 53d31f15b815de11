package ebpf

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sort"
)

// Compiled policy: the sorted rule list of one (EPG, direction) turned into the keys the
// programs look up (bpf/lib/policy.h "Compiled policy", docs/policy.md "Lookup"). The
// answer for a packet is the first rule of the list that matches it, as cb_rule_step's
// scan gave: scanRules is that scan in Go, and lookup answers from the compiled form the
// way cb_pol_lookup does.

// Wildcard classes of a rule (enum cb_pol_class): which fields it names.
const (
	polClsEPG   = 1
	polClsProto = 2
	polClsPort  = 4
)

// polCompiled is one rule list compiled: the classes present and one key per distinct
// (remote group, protocol, port) of its rules.
type polCompiled struct {
	classes uint8
	count   int
	keys    []polKey
}

// polKey is one cb_pol_rules entry before it gets a version and a slot: its answer for an
// address no prefix holds (any) and its prefixes (cidrs, each with the answer for the
// addresses it holds).
type polKey struct {
	remoteEPG uint16
	port      uint16 // network order, as cb_rule.port
	proto     uint8
	any       contivbpfCbPolCidr
	cidrs     []polCIDR
}

// polCIDR is one prefix of a key: ip as cb_rule.remote_ip (network order), bits its length.
type polCIDR struct {
	ip   uint32
	bits int
	best contivbpfCbPolCidr
}

// polPacket is what a rule is matched against: the other end's group and address, the
// protocol, the destination port (network order) if the packet has ports, and whether it
// is a SYN (syn, !ack).
type polPacket struct {
	remoteEPG uint16
	remoteIP  uint32 // network order, as cb_flow's addresses
	proto     uint8
	hasPorts  bool
	dport     uint16 // network order
	syn       bool
}

// beU32 is a cb_rule address or mask (network order bytes loaded natively) as a number.
func beU32(v uint32) uint32 {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return binary.BigEndian.Uint32(b[:])
}

// rulePrefix returns the length of r's prefix; matchable is false for a rule whose
// address has bits outside its mask (it can never match). A mask that is not a prefix is
// an error.
func rulePrefix(r contivbpfCbRule) (n int, matchable bool, err error) {
	m := beU32(r.RemoteMask)
	n = bits.LeadingZeros32(^m)
	if n < 32 && m<<n != 0 {
		return 0, false, fmt.Errorf("mask %#08x is not a prefix", m)
	}
	return n, r.RemoteIp&^r.RemoteMask == 0, nil
}

// ruleMatches is one step of the scan (cb_rule_step).
func ruleMatches(r contivbpfCbRule, p polPacket) bool {
	switch {
	case r.RemoteEpg != 0 && r.RemoteEpg != p.remoteEPG:
	case p.remoteIP&r.RemoteMask != r.RemoteIp:
	case r.Proto != 0 && r.Proto != p.proto:
	case r.Port != 0 && (!p.hasPorts || r.Port != p.dport):
	case r.Flags&1 != 0 && !p.syn:
	default:
		return true
	}
	return false
}

// scanRules is the linear scan: the first matching rule's best, or no action.
func scanRules(rules []contivbpfCbRule, p polPacket) contivbpfCbPolBest {
	for i, r := range rules {
		if ruleMatches(r, p) {
			return contivbpfCbPolBest{Prio: r.Prio, Index: uint16(i), Action: r.Action}
		}
	}
	return contivbpfCbPolBest{}
}

// compilePolicy compiles a sorted rule list (at most MaxRules; actions allow or deny;
// prefix masks).
func compilePolicy(rules []contivbpfCbRule) (*polCompiled, error) {
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("%d rules, at most %d", len(rules), MaxRules)
	}
	type gkey struct {
		epg   uint16
		port  uint16
		proto uint8
	}
	type group struct {
		members []int // rule indexes, in list order
		plen    []int // their prefix lengths
		pfx     map[[2]uint32]bool
	}
	groups := map[gkey]*group{}
	var order []gkey
	c := &polCompiled{count: len(rules)}
	plen := make([]int, len(rules))
	for i, r := range rules {
		if r.Action != uint8(contivbpfCbRuleActionCB_ACT_ALLOW) && r.Action != uint8(contivbpfCbRuleActionCB_ACT_DENY) {
			return nil, fmt.Errorf("rule #%d: action %d is neither allow nor deny", i+1, r.Action)
		}
		n, ok, err := rulePrefix(r)
		if err != nil {
			return nil, fmt.Errorf("rule #%d: %w", i+1, err)
		}
		if !ok {
			continue // matches no address: no answer anywhere
		}
		plen[i] = n
		k := gkey{r.RemoteEpg, r.Port, r.Proto}
		g := groups[k]
		if g == nil {
			g = &group{pfx: map[[2]uint32]bool{}}
			groups[k] = g
			order = append(order, k)
		}
		g.members = append(g.members, i)
		if n > 0 {
			g.pfx[[2]uint32{r.RemoteIp, uint32(n)}] = true
		}
	}
	// best is the first member of g whose prefix holds prefix (ip, n), for a SYN and for
	// other packets (CB_RULE_SYN_ONLY rules only for a SYN).
	best := func(g *group, ip uint32, n int) contivbpfCbPolCidr {
		var out contivbpfCbPolCidr
		var synSet, otherSet bool
		for _, i := range g.members {
			r := rules[i]
			if plen[i] > n || ip&r.RemoteMask != r.RemoteIp {
				continue
			}
			b := contivbpfCbPolBest{Prio: r.Prio, Index: uint16(i), Action: r.Action}
			if !synSet {
				out.Syn, synSet = b, true
			}
			if !otherSet && r.Flags&1 == 0 {
				out.Other, otherSet = b, true
			}
			if synSet && otherSet {
				break
			}
		}
		return out
	}
	for _, k := range order {
		g := groups[k]
		cls := uint8(0)
		if k.epg != 0 {
			cls |= polClsEPG
		}
		if k.proto != 0 {
			cls |= polClsProto
		}
		if k.port != 0 {
			cls |= polClsPort
		}
		c.classes |= 1 << cls
		pk := polKey{remoteEPG: k.epg, port: k.port, proto: k.proto, any: best(g, 0, 0)}
		for p := range g.pfx {
			pk.cidrs = append(pk.cidrs, polCIDR{ip: p[0], bits: int(p[1]), best: best(g, p[0], int(p[1]))})
		}
		sort.Slice(pk.cidrs, func(i, j int) bool {
			if pk.cidrs[i].bits != pk.cidrs[j].bits {
				return pk.cidrs[i].bits < pk.cidrs[j].bits
			}
			return beU32(pk.cidrs[i].ip) < beU32(pk.cidrs[j].ip)
		})
		c.keys = append(c.keys, pk)
	}
	return c, nil
}

// lookup answers p from the compiled form as cb_pol_lookup does: for each class present
// (and possible for p) one key, its longest prefix holding the address, the best answer.
func (c *polCompiled) lookup(p polPacket) contivbpfCbPolBest {
	classes := c.classes
	if p.remoteEPG == 0 {
		classes &= 0x55
	}
	if p.proto == 0 {
		classes &= 0x33
	}
	if !p.hasPorts || p.dport == 0 {
		classes &= 0x0f
	}
	var out contivbpfCbPolBest
	index := uint32(1 << 16)
	for i := uint8(0); i < 8; i++ {
		if classes&(1<<i) == 0 {
			continue
		}
		var want polKey
		if i&polClsEPG != 0 {
			want.remoteEPG = p.remoteEPG
		}
		if i&polClsProto != 0 {
			want.proto = p.proto
		}
		if i&polClsPort != 0 {
			want.port = p.dport
		}
		for _, k := range c.keys {
			if k.remoteEPG != want.remoteEPG || k.proto != want.proto || k.port != want.port {
				continue
			}
			ans, n := k.any, -1
			for _, cd := range k.cidrs {
				m := uint32(0)
				if cd.bits > 0 {
					m = ^uint32(0) << (32 - cd.bits)
				}
				if beU32(p.remoteIP)&m == beU32(cd.ip) && cd.bits > n {
					ans, n = cd.best, cd.bits
				}
			}
			b := ans.Other
			if p.syn {
				b = ans.Syn
			}
			if b.Action != 0 && uint32(b.Index) < index {
				out, index = b, uint32(b.Index)
			}
		}
	}
	return out
}
