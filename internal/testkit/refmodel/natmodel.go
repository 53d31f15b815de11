package refmodel

import (
	"net/netip"
	"time"
)

// Drop reasons of the egress NAT model (the datapath's names).
const (
	DropEgressNoPort      = "drop_egress_no_port"
	DropEgressUnsupported = "drop_egress_unsupported"
	DropEgressNoFlow      = "drop_egress_no_flow"
)

// NATFlowKey is an egress flow as its endpoint sent it (ICMP echo: both ports hold the id).
type NATFlowKey struct {
	Zone         uint32
	Src, Dst     netip.Addr
	Sport, Dport uint16
	Proto        uint8
}

// NATFlow is one egress flow's state.
type NATFlow struct {
	Port     uint16 // on the NAT address (ICMP: the echo id)
	State    uint8  // CTNew, CTEstablished, CTClosing
	Deadline time.Duration
	// RefKind and Ref: what a FIN or RST from outside must carry to close a TCP flow
	// (TCPRefNone: nothing seen, believed; TCPRefSYN: the ACK of the endpoint's SYN;
	// TCPRefACK: Ref is the endpoint's noted acknowledgment, noted and judged by the
	// window's rule, tcpwin.go, as conntrack's are).
	RefKind uint8
	Ref     uint32
}

// The TCP close reference of an egress flow (bpf/lib/nat.h enum cb_tcp_ref).
const (
	TCPRefNone = 0
	TCPRefSYN  = 1
	TCPRefACK  = 2
)

// note records what endpoint packet p says a closing segment from outside must carry.
func (f *NATFlow) note(p ModelPacket) {
	switch {
	case p.Proto != protoTCP:
	case p.ACK:
		// (After a SYN's reference the first acknowledgment is noted whatever it is.)
		ref := f.Ref
		if f.RefKind != TCPRefACK {
			ref = 0
		}
		if noteAck(&ref, p.AckNum) {
			f.RefKind, f.Ref = TCPRefACK, ref
		}
	case p.SYN:
		f.RefKind, f.Ref = TCPRefSYN, p.SeqNum+1
	}
}

// answers says whether reply p may make f established: a TCP segment must acknowledge the
// endpoint's SYN while that is unanswered (TCPRefSYN).
func (f *NATFlow) answers(p ModelPacket) bool {
	return p.Proto != protoTCP || f.RefKind != TCPRefSYN || (p.ACK && p.AckNum == f.Ref)
}

// closeBelieved says whether a FIN or RST from outside may close f.
func (f *NATFlow) closeBelieved(p ModelPacket) bool {
	switch f.RefKind {
	case TCPRefSYN:
		return p.ACK && p.AckNum == f.Ref
	case TCPRefACK:
		return inWindow(p.SeqNum, f.Ref, p.RST)
	}
	return true
}

// natReplyKey is how a reply arrives at the NAT address (ICMP echo: Rport 0).
type natReplyKey struct {
	Remote      netip.Addr
	Rport, Port uint16
	Proto       uint8
}

// NATModel is the Go reference model of egress source NAT (bpf/lib/nat.h,
// docs/host-routing.md), for the differential test. Policy is not its business (the
// conntrack model judges flows); it owns the port mapping and its state:
//   - only a TCP SYN (without ACK, FIN, RST), any UDP datagram or an ICMP echo request opens a
//     flow; IP fragments and other protocols are never carried;
//   - a live flow keeps its port; a new flow gets a port of [PortMin, PortMax] not held by a
//     live flow towards the same (remote address, remote port, protocol); when there is none,
//     a new TCP flow takes over the port of a CLOSING TCP flow of the same endpoint (zone
//     and address; that flow is deleted), as the kernel reuses TIME_WAIT tuples. Which port
//     is the datapath's choice (Egress's choose);
//   - a reply (TCP/UDP from the flow's remote address and port to its port, ICMP echo reply
//     from the remote address with its port as id) belongs to the flow if the flow is live
//     and still holds that port;
//   - TCP FIN/RST in either direction → CLOSING, a reply to a NEW flow → ESTABLISHED, every
//     packet of the flow refreshes its deadline with conntrack's timeouts; a FIN or RST from
//     outside counts only when closeBelieved (the endpoint's last SYN, or its acknowledgment
//     noted by the window's rule, tcpwin.go, sets what it must carry), else it is a plain
//     reply; while the endpoint's SYN is unanswered only a
//     segment acknowledging it makes the flow ESTABLISHED (answers);
//   - a flow is live until its deadline (inclusive), like conntrack.
type NATModel struct {
	Now              time.Duration
	PortMin, PortMax uint16
	Flows            map[NATFlowKey]*NATFlow
	replies          map[natReplyKey]NATFlowKey
}

// NewNATModel returns an empty model with the given port range.
func NewNATModel(portMin, portMax uint16) *NATModel {
	return &NATModel{PortMin: portMin, PortMax: portMax, Flows: map[NATFlowKey]*NATFlow{}, replies: map[natReplyKey]NATFlowKey{}}
}

func (m *NATModel) live(f *NATFlow) bool { return f != nil && f.Deadline >= m.Now }

func natReplyOf(k NATFlowKey, port uint16) natReplyKey {
	r := natReplyKey{Remote: k.Dst, Rport: k.Dport, Port: port, Proto: k.Proto}
	if k.Proto == protoICMP {
		r.Rport = 0
	}
	return r
}

// held says whether port is taken towards (remote, rport, proto) by a live flow.
func (m *NATModel) held(r natReplyKey) bool {
	k, ok := m.replies[r]
	if !ok {
		return false
	}
	f := m.Flows[k]
	return m.live(f) && f.Port == r.Port
}

// Egress translates endpoint packet p (zone p.Zone) leaving for the outside. choose is
// asked for the port of a new flow, given which ports it may take (the free ones, or when
// none is free and p is TCP, those of closing flows); ok=false: it found none. It returns
// the flow's port or a drop reason.
func (m *NATModel) Egress(p ModelPacket, choose func(allowed func(uint16) bool) (uint16, bool)) (uint16, string) {
	echo := p.Proto == protoICMP && p.ICMPType == 8
	if p.Frag != FragNone || !(p.Proto == protoTCP || p.Proto == protoUDP || echo) {
		return 0, DropEgressUnsupported
	}
	k := NATFlowKey{Zone: p.Zone, Src: p.Src, Dst: p.Dst, Sport: p.Sport, Dport: p.Dport, Proto: p.Proto}
	if f := m.Flows[k]; m.live(f) {
		if p.Proto == protoTCP && (p.FIN || p.RST) {
			f.State = CTClosing
		}
		f.note(p)
		f.Deadline = m.Now + timeout(p.Proto, f.State)
		return f.Port, ""
	}
	if p.Proto == protoTCP && (!p.SYN || p.ACK || p.FIN || p.RST) {
		return 0, DropEgressNoFlow
	}
	free := func(port uint16) bool {
		return port >= m.PortMin && port <= m.PortMax && !m.held(natReplyOf(k, port))
	}
	anyFree := false
	for q := uint32(m.PortMin); q <= uint32(m.PortMax); q++ {
		anyFree = anyFree || free(uint16(q))
	}
	allowed := free
	if !anyFree && p.Proto == protoTCP {
		allowed = func(port uint16) bool {
			if port < m.PortMin || port > m.PortMax {
				return false
			}
			r := natReplyOf(k, port)
			if !m.held(r) {
				return true
			}
			owner := m.replies[r]
			return m.Flows[owner].State == CTClosing && owner.Zone == k.Zone && owner.Src == k.Src
		}
	}
	port, ok := choose(allowed)
	if !ok {
		return 0, DropEgressNoPort
	}
	if r := natReplyOf(k, port); m.held(r) { // a closing flow's port: that flow goes
		delete(m.Flows, m.replies[r])
	}
	f := &NATFlow{Port: port, State: CTNew, Deadline: m.Now + timeout(p.Proto, CTNew)}
	f.note(p)
	m.Flows[k] = f
	m.replies[natReplyOf(k, port)] = k
	return port, ""
}

// DropEgressUnanswered: a TCP segment from outside that does not answer the endpoint's
// unanswered SYN (NATFlow.answers).
const DropEgressUnanswered = "drop_egress_unanswered"

// Reply matches packet p arriving at the NAT address (p.Dport: the NAT port; ICMP echo
// reply: the id in Sport/Dport) and returns the flow it belongs to (ok=false: not a reply
// of an egress flow; the host's), or a drop reason: a segment of a NEW flow that does
// not answer its SYN.
func (m *NATModel) Reply(p ModelPacket) (NATFlowKey, bool, string) {
	r := natReplyKey{Remote: p.Src, Rport: p.Sport, Port: p.Dport, Proto: p.Proto}
	switch {
	case p.Frag != FragNone:
		return NATFlowKey{}, false, ""
	case p.Proto == protoTCP || p.Proto == protoUDP:
	case p.Proto == protoICMP && p.ICMPType == 0:
		r.Rport = 0
	default:
		return NATFlowKey{}, false, ""
	}
	if !m.held(r) {
		return NATFlowKey{}, false, ""
	}
	k := m.replies[r]
	f := m.Flows[k]
	if f.State == CTNew && !f.answers(p) {
		return k, false, DropEgressUnanswered
	}
	if p.Proto == protoTCP && (p.FIN || p.RST) && !f.closeBelieved(p) {
		p.FIN, p.RST = false, false // a plain reply
	}
	if p.Proto == protoTCP && (p.FIN || p.RST) {
		f.State = CTClosing
	} else if f.State == CTNew {
		f.State = CTEstablished
	}
	f.Deadline = m.Now + timeout(p.Proto, f.State)
	return k, true, ""
}

// Advance moves the model's clock.
func (m *NATModel) Advance(d time.Duration) { m.Now += d }

// GC deletes what the agent's collector deletes: expired flows, and reply mappings whose
// flow is gone, expired or holds another port. It returns how many flows it deleted.
func (m *NATModel) GC() int {
	n := 0
	for k, f := range m.Flows {
		if f.Deadline < m.Now {
			delete(m.Flows, k)
			n++
		}
	}
	for r := range m.replies {
		if !m.held(r) {
			delete(m.replies, r)
		}
	}
	return n
}
