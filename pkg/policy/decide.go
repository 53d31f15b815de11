package policy

import (
	"cmp"
	"net/netip"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Packet is what a datapath knows about a packet when it applies policy: both groups
// (the sender's from its endpoint, the receiver's resolved by destination IP; 0 = none
// or unknown) and the IPv4 5-tuple essentials.
type Packet struct {
	SrcEPG, DstEPG uint16
	SrcIP, DstIP   netip.Addr
	Proto          uint8
	DstPort        uint16 // TCP/UDP only
	SYN, ACK       bool   // TCP flags
}

// Verdict is the outcome of Decide.
type Verdict struct {
	Action   dataplane.PolicyAction
	RuleID   string // "" when no rule matched (default allow)
	EPGID    uint16 // set of the matching rule
	Ingress  bool   // direction of the matching rule
	Priority int
}

// Allowed reports whether the packet passes.
func (v Verdict) Allowed() bool { return v.Action != dataplane.ActionDeny }

// defaultVerdict is what a packet no rule matches gets.
var defaultVerdict = Verdict{Action: dataplane.ActionAllow}

// Decide evaluates a packet that does not belong to an already allowed connection, the
// way Contiv's single policy table does on the sending host: the egress rules of the
// sender's group and the ingress rules of the receiver's group compete, the highest
// priority wins, deny beats allow at equal priority, then the lower rule id, then egress
// before ingress. No match, or a non-IPv4 packet, is allowed.
//
// sets need not come from Compile: rule fields are read as the dataplane contract
// defines them (Port only with Proto 6/17, SynOnly only with Proto 6 and Port 0).
func Decide(sets []dataplane.PolicySet, p Packet) Verdict {
	if !p.SrcIP.Unmap().Is4() || !p.DstIP.Unmap().Is4() {
		return defaultVerdict
	}
	best, found := Verdict{}, false
	for _, s := range sets {
		if s.EPGID == 0 || (s.EPGID != p.SrcEPG && s.EPGID != p.DstEPG) {
			continue
		}
		for _, r := range s.Rules {
			if !Matches(s.EPGID, r, p) {
				continue
			}
			v := Verdict{Action: r.Action, RuleID: r.ID, EPGID: s.EPGID, Ingress: r.Ingress, Priority: r.Priority}
			if !found || better(v, best) {
				best, found = v, true
			}
		}
	}
	if !found {
		return defaultVerdict
	}
	return best
}

// better orders verdicts: priority, deny over allow, rule id, egress, group id.
func better(a, b Verdict) bool {
	return cmp.Or(
		cmp.Compare(b.Priority, a.Priority),
		cmp.Compare(actionRank(a.Action), actionRank(b.Action)),
		strings.Compare(a.RuleID, b.RuleID),
		cmpBool(a.Ingress, b.Ingress),
		cmp.Compare(a.EPGID, b.EPGID),
	) < 0
}

// Matches reports whether rule r of group epg matches packet p.
func Matches(epg uint16, r dataplane.PolicyRule, p Packet) bool {
	if epg == 0 {
		return false
	}
	local, remote, remoteIP := p.SrcEPG, p.DstEPG, p.DstIP
	if r.Ingress {
		local, remote, remoteIP = p.DstEPG, p.SrcEPG, p.SrcIP
	}
	switch {
	case local != epg:
		return false
	case r.RemoteEPG != 0 && r.RemoteEPG != remote:
		return false
	case r.Remote.IsValid() && !r.Remote.Contains(remoteIP.Unmap()):
		return false
	case r.Proto != 0 && r.Proto != p.Proto:
		return false
	}
	l4 := r.Proto == 6 || r.Proto == 17
	if l4 && r.Port != 0 && r.Port != p.DstPort {
		return false
	}
	if r.SynOnly && r.Proto == 6 && r.Port == 0 && !(p.SYN && !p.ACK) {
		return false
	}
	return true
}

// NetpolAllows is the NetworkPolicy layer's verdict on a flow opening from src to dst
// (docs/kubernetes.md "NetworkPolicy"): the sender's egress rules, when it is isolated
// for egress, must match dst, and the receiver's ingress rules, when it is isolated for
// ingress, must match src. nil = no entry (isolated in neither direction). dport is 0
// for packets without ports (a rule with ports never matches them).
func NetpolAllows(from, to *dataplane.PodPolicy, src, dst netip.Addr, proto uint8, dport uint16) bool {
	match := func(rs []dataplane.PodRule, remote netip.Addr) bool {
		for _, r := range rs {
			if !r.Remote.Contains(remote) || (r.Proto != 0 && r.Proto != proto) {
				continue
			}
			if r.PortMin != 0 && (dport == 0 || dport < r.PortMin || dport > r.PortMax) {
				continue
			}
			return true
		}
		return false
	}
	if from != nil && from.EgressIsolated && !match(from.Egress, dst) {
		return false
	}
	if to != nil && to.IngressIsolated && !match(to.Ingress, src) {
		return false
	}
	return true
}
