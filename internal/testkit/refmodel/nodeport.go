package refmodel

import (
	"net/netip"
	"time"
)

// Path is the way a packet entered the host (the datapath's entry program and stage). The
// model's semantics of the paths beyond PathDirect are those of docs/host-routing.md
// "Node ports" and docs/conntrack.md, as the datapath implements them in
// cb_peer_host_rx, cb_uplink_nodeport/cb_nodeport_judge, cb_nodeport_out and cb_outside.
type Path uint8

// Paths.
const (
	// PathDirect: between endpoints, from a local container (FromLocal) or from another
	// host's endpoint over the overlay.
	PathDirect Path = iota
	// PathPeerHost: over the overlay from a peer host's own address (Src: its VTEP) to a
	// local endpoint (Dst): a node port flow that peer balanced here, or anyone on that
	// host. Judged like a flow from outside (the destination's in-rules and
	// NetworkPolicy, the peer's address in no group), its entry of KindNodePort owned by
	// the receiver (ownerIn), and remembered as a peer flow (PeerFlow) whatever the
	// verdict's tracking, so the endpoint's replies go back to the peer. Only whole TCP
	// and UDP packets: anything else is drop_overlay_spoof; to an address that is no
	// local endpoint (SetSlot), drop_unknown_dst.
	PathPeerHost
	// PathToOutside: a local endpoint's packet (FromLocal) to an address beyond its
	// network: a node port flow's reply (its reversed KindNodePort key holds a live DNAT
	// entry with a node port, and it opens nothing: its source leaves as this host's
	// address and node port), else a peer flow's reply (to a peer host's address,
	// SetPeer, with a live PeerFlow under its reversed tuple: back through the tunnel,
	// unchanged, judged as the KindNodePort flow it is), else drop_to_gateway (the model
	// has no egress NAT: the differential test's networks have none).
	PathToOutside
	// PathNodePort: a client from the wire (Src) to this host's address at a node port
	// (Dport). A client claiming an address of the service's tenant's networks
	// (SetTenantNet) is drop_nodeport_internal_src before any state; otherwise the packet
	// goes to the service's VIP:port and is balanced like a local client's (no backends:
	// reject_no_backend or drop_no_backend), in KindNodePort, judged by the backend's
	// in-rules and NetworkPolicy (the client's address in no group), owned by the
	// backend (ownerIn). The client's FIN or RST outside the window of the backend's
	// noted acknowledgment is drop_nodeport_blind before conntrack. Not modelled:
	// fragments and ICMP errors of node port flows, and backends on other hosts (the
	// flow leaves through the overlay from a NAT port): the differential test sends no
	// such fragments or errors and gives node port services local backends only.
	PathNodePort
)

// Drop reasons of the node port and peer host paths (the datapath's names).
const (
	DropOverlaySpoof        = "drop_overlay_spoof"
	DropNodePortInternalSrc = "drop_nodeport_internal_src"
	DropNodePortBlind       = "drop_nodeport_blind"
	DropToGateway           = "drop_to_gateway"
)

// ModelNodePort is a node port: Port/Proto on this host's address go to the service
// VIP:SvcPort of zone Zone.
type ModelNodePort struct {
	Port    uint16
	Proto   uint8
	Zone    uint32
	VIP     netip.Addr
	SvcPort uint16
}

type npKey struct {
	port  uint16
	proto uint8
}

type tenantNet struct {
	zone   uint32
	prefix netip.Prefix
}

// PeerFlow is a flow a peer host started from its own address to a local endpoint
// (cb_peer_flows; keyed by the tuple as it arrived, KindNodePort): State NEW until the
// endpoint answered, TCPAck the endpoint's acknowledgment last noted (the window the
// peer's FIN or RST must fall in, tcpwin.go). Records are never deleted (an LRU table
// the collector does not sweep); one that expired is replaced by the next packet.
type PeerFlow struct {
	State   uint8
	Expires time.Duration
	TCPAck  uint32
}

// step moves the record with packet p (reply: the endpoint's): a blind FIN or RST from
// the peer moves nothing, not even the deadline.
func (f *PeerFlow) step(p ModelPacket, reply bool, now time.Duration) {
	if p.Proto == protoTCP {
		if !reply && (p.FIN || p.RST) && !inWindow(p.SeqNum, f.TCPAck, p.RST) {
			return
		}
		if reply && p.ACK {
			noteAck(&f.TCPAck, p.AckNum)
		}
	}
	switch {
	case p.Proto == protoTCP && (p.FIN || p.RST):
		f.State = CTClosing
	case reply && f.State == CTNew:
		f.State = CTEstablished
	}
	f.Expires = now + timeout(p.Proto, f.State)
}

// SetHostAddr sets this host's address (node ports' replies leave from it).
func (m *Model) SetHostAddr(a netip.Addr) { m.host = a.Unmap() }

// SetNodePort adds or replaces a node port.
func (m *Model) SetNodePort(n ModelNodePort) {
	n.VIP = n.VIP.Unmap()
	m.nodePorts[npKey{n.Port, n.Proto}] = n
}

// SetTenantNet records a subnet of a network of the tenant with zone zone.
func (m *Model) SetTenantNet(zone uint32, p netip.Prefix) {
	m.tenantNets = append(m.tenantNets, tenantNet{zone, p.Masked()})
}

// SetPeer records a peer host's address (cb_peers).
func (m *Model) SetPeer(a netip.Addr) { m.peers[a.Unmap()] = true }

// PeerFlows returns the peer flow records (live or expired), by key.
func (m *Model) PeerFlows() map[FlowKey]PeerFlow {
	out := make(map[FlowKey]PeerFlow, len(m.peerFlows))
	for k, f := range m.peerFlows {
		out[k] = f
	}
	return out
}

// flowKeyOf is p's conntrack key in its zone (KindTenant): TCP/UDP and ICMP echo keep
// their ports (the echo id), every other packet has none.
func flowKeyOf(p ModelPacket) FlowKey {
	k := FlowKey{Zone: p.Zone, Src: p.Src, Dst: p.Dst, Proto: p.Proto}
	switch {
	case p.Proto == protoTCP || p.Proto == protoUDP,
		p.Proto == protoICMP && (p.ICMPType == icmpEchoReply || p.ICMPType == icmpEchoRequest):
		k.Sport, k.Dport = p.Sport, p.Dport
	}
	return k
}

// reuseTuple is cb_ct_reuse for an untracked packet p with key k: a TCP SYN (no ACK) does
// not inherit a closed service flow's entry on its tuple; live or expired, it goes.
func (m *Model) reuseTuple(k FlowKey, p ModelPacket) {
	if p.Proto != protoTCP || !p.SYN || p.ACK {
		return
	}
	if e, ok := m.ct[k]; ok && !e.SVC && e.DNAT && e.State == CTClosing {
		delete(m.ct, k)
	}
}

// stateful is the policy and conntrack stage for a packet that no service touches
// (key k, owner owner): tracked when an address's group has rules or is failed closed or
// it has a NetworkPolicy entry (or always, with always), else it passes untracked.
func (m *Model) stateful(k FlowKey, p ModelPacket, owner uint16, always bool) (ModelResult, bool) {
	if !always && !m.tracked(k.Zone, k.Src) && !m.tracked(k.Zone, k.Dst) {
		m.reuseTuple(k, p)
		return ModelResult{Pass: true}, true
	}
	pass, why, _, _ := m.track(k, p, false, netip.AddrPort{}, false, false, owner)
	return ModelResult{Pass: pass, Reason: why, Tracked: true}, pass
}

// peerHost is PathPeerHost.
func (m *Model) peerHost(p ModelPacket) ModelResult {
	if p.Frag != FragNone || (p.Proto != protoTCP && p.Proto != protoUDP) {
		return ModelResult{Reason: DropOverlaySpoof}
	}
	if _, local := m.slots[epKey{p.Zone, p.Dst}]; !local {
		return ModelResult{Reason: DropUnknownDst}
	}
	k := flowKeyOf(p)
	k.Kind = KindNodePort
	res, ok := m.stateful(k, p, m.ownerOf(p), false)
	if !ok {
		return res
	}
	f, live := m.peerFlows[k]
	if !live || m.now > f.Expires {
		f = PeerFlow{State: CTNew}
	}
	f.step(p, false, m.now)
	m.peerFlows[k] = f
	return res
}

// toOutside is PathToOutside.
func (m *Model) toOutside(p ModelPacket) ModelResult {
	k := flowKeyOf(p)
	k.Kind = KindNodePort
	owner := m.ownerOf(p)
	opening := p.Proto == protoTCP && p.SYN && !p.ACK
	if rev, ok := m.flow(k.Reverse()); ok && rev.DNAT && rev.NodePort != 0 && !opening && m.host.IsValid() {
		res, ok := m.stateful(k, p, owner, true)
		if ok {
			res.SNAT = netip.AddrPortFrom(m.host, rev.NodePort)
		}
		return res
	}
	if m.peers[p.Dst] && (p.Proto == protoTCP || p.Proto == protoUDP) && p.Frag != FragLater {
		if f, live := m.peerFlows[k.Reverse()]; live && m.now <= f.Expires {
			res, ok := m.stateful(k, p, owner, false)
			if ok {
				f.step(p, true, m.now)
				m.peerFlows[k.Reverse()] = f
			}
			return res
		}
	}
	return ModelResult{Reason: DropToGateway}
}

// nodePortIn finds the node port of PathNodePort packet p and refuses a client claiming
// an address of its tenant; ok false: the result is final.
func (m *Model) nodePortIn(p ModelPacket) (ModelNodePort, ModelResult, bool) {
	n, found := m.nodePorts[npKey{p.Dport, p.Proto}]
	if !found || p.Dst != m.host || p.Frag != FragNone || p.HasQuote {
		return ModelNodePort{}, ModelResult{Host: true}, false
	}
	for _, t := range m.tenantNets {
		if t.zone == n.Zone && t.prefix.Contains(p.Src) {
			return ModelNodePort{}, ModelResult{Reason: DropNodePortInternalSrc}, false
		}
	}
	return n, ModelResult{}, true
}

// nodePortJudge is what a node port flow's packet p (post-DNAT key k, balanced: isSvc)
// meets before conntrack: no backend, or the client's blind FIN or RST. "" goes on.
func (m *Model) nodePortJudge(p ModelPacket, k FlowKey, isSvc bool) string {
	switch {
	case !isSvc && p.rejectable():
		return RejectNoBackend
	case !isSvc:
		return DropNoBackend
	case p.Proto != protoTCP || !(p.FIN || p.RST):
		return ""
	}
	if e, ok := m.flow(k); ok && e.DNAT && e.TCPAck[1] != 0 && !inWindow(p.SeqNum, e.TCPAck[1], p.RST) {
		return DropNodePortBlind
	}
	return ""
}
