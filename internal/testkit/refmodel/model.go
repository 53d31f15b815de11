// Package refmodel is the Go reference model of the datapaths' stateful behaviour (policy
// verdicts, conntrack, service balancing and NAT, fragments, quotas, egress NAT): the
// differential tests run random packet sequences through the real eBPF programs and
// through it and fail on the first difference. Only tests import it; no production binary
// links it (docs/security.md, "Datapath").
package refmodel

import (
	"net/netip"
	"slices"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/policy"
)

// FragKind says whether a packet is an IPv4 fragment.
type FragKind uint8

// Fragment kinds.
const (
	FragNone  FragKind = iota // not a fragment
	FragFirst                 // MF set, offset 0
	FragLater                 // offset > 0
)

// Conntrack entry states.
const (
	CTNew         uint8 = 1
	CTEstablished uint8 = 2
	CTClosing     uint8 = 3
)

// Drop reasons of the model (the datapath's drop reason names).
const (
	DropPolicy        = "drop_policy"
	DropNetpol        = "drop_netpol" // the Kubernetes NetworkPolicy layer
	DropCTFull        = "drop_ct_full"
	DropCTQuota       = "drop_ct_quota" // the owner holds its per-endpoint quota of entries
	DropFragNoFirst   = "drop_frag_no_first"
	DropNoBackend     = "drop_no_backend"
	RejectNoBackend   = "reject_no_backend" // refused with ICMP port unreachable (a TCP SYN, a UDP datagram)
	DropFragToService = "drop_frag_to_service"
	DropUnknownDst    = "drop_unknown_dst" // to a VIP address that is neither a service port nor a reply
)

// Timeouts of docs/conntrack.md.
const (
	timeoutTCPNew     = 60 * time.Second
	timeoutTCPEst     = 6 * time.Hour
	timeoutTCPClosing = 10 * time.Second
	timeoutOther      = 60 * time.Second
	timeoutFrag       = 30 * time.Second
)

const (
	protoICMP uint8 = 1
	protoTCP  uint8 = 6
	protoUDP  uint8 = 17

	icmpEchoReply   uint8 = 0
	icmpEchoRequest uint8 = 8
)

// ModelPacket is one IPv4 packet as the datapath's policy/CT/LB stages see it.
type ModelPacket struct {
	Zone               uint32 // tenant routing domain of the packet's network
	Src, Dst           netip.Addr
	Proto              uint8  // 1 icmp, 6 tcp, 17 udp, other
	Sport, Dport       uint16 // TCP/UDP ports; ICMP echo (type 0/8): the echo id in both; else 0
	ICMPType           uint8
	SYN, ACK, FIN, RST bool   // TCP flags
	SeqNum, AckNum     uint32 // TCP sequence and acknowledgment numbers (egress NAT's window)
	Frag               FragKind
	IPID               uint16
	FromLocal          bool // sent by a local container (service LB applies only then)
	// Path is the way the packet entered (nodeport.go); PathDirect (0): between endpoints,
	// from a local container (FromLocal) or from another host over the overlay.
	Path Path
	// Quoted is the packet an ICMP error (types 3, 11, 12) quotes, as its sender sent it
	// (HasQuote false: not an error, or nothing quoted).
	Quoted   FlowKey
	HasQuote bool
}

// ModelResult is what the datapath did with a packet.
type ModelResult struct {
	Pass   bool
	Reason string         // "" when Pass; else one of the Drop* reasons
	DNAT   netip.AddrPort // valid when the destination was rewritten to a backend (service forward path)
	SNAT   netip.AddrPort // valid when the source was rewritten back to VIP:port (reply of a service flow)
	// QuotedDst is valid when the destination quoted in an ICMP error was rewritten back to
	// the VIP:port (an error from a service backend's side), QuotedSrc when the quoted source
	// was rewritten to the backend (a client's error about a service's reply; hairpin errors
	// rewrite both).
	QuotedDst netip.AddrPort
	QuotedSrc netip.AddrPort
	Tracked   bool // the packet went through conntrack (or the fragment table)
	// EchoReply: an ICMP echo request to a VIP, answered in place (from the VIP to its
	// sender), before policy and conntrack.
	EchoReply bool
	// Host: a packet from the wire that is no node port's, left to the host's stack
	// untouched (Pass false, Reason "").
	Host bool
}

// ModelService is one VIP:port/proto of a service in a zone.
type ModelService struct {
	ID         uint32
	Zone       uint32
	VIP        netip.Addr
	Port       uint16
	Proto      uint8 // 6 or 17
	TargetPort uint16
	Backends   []netip.Addr // order matters to nobody; membership does
	Draining   []netip.Addr // members that take no new flows
}

// Flow key kinds (docs/conntrack.md "Zones", enum cb_ct_kind): a tenant's node port
// flows (clients from the wire, a peer host's own address) live apart from its own.
const (
	KindTenant   uint8 = 0
	KindNodePort uint8 = 1
)

// FlowKey is a conntrack key.
type FlowKey struct {
	Zone         uint32
	Kind         uint8 // KindTenant or KindNodePort
	Src, Dst     netip.Addr
	Sport, Dport uint16
	Proto        uint8
}

// Reverse is the key of the opposite direction.
func (k FlowKey) Reverse() FlowKey {
	return FlowKey{Zone: k.Zone, Kind: k.Kind, Src: k.Dst, Dst: k.Src, Sport: k.Dport, Dport: k.Sport, Proto: k.Proto}
}

// ModelEntry is one conntrack table entry.
type ModelEntry struct {
	State   uint8 // CTNew, CTEstablished, CTClosing; 0 for SVC entries
	Allowed bool
	SVC     bool
	DNAT    bool
	NAT     netip.AddrPort // SVC: backend:TargetPort; DNAT: VIP:port
	Epoch   uint32
	Expires time.Duration // live while now <= Expires
	SvcID   uint32        // SVC entries: the service id
	Hairpin bool          // DNAT entries: the client is its own backend (key VIP:cport → client)
	Owner   uint16        // counter slot of the local endpoint the entry counts against (0: none)
	// TCPAck is the acknowledgment number last noted from a segment of the entry's own
	// direction [0] and of the reply direction [1] (0: none): the window a FIN or RST
	// of the other direction must fall in (window).
	TCPAck [2]uint32
	// NodePort: a node port flow's DNAT entry (KindNodePort): the host port its client
	// used, from which the backend's replies leave.
	NodePort uint16
}

// window applies the TCP window (tcpwin.go) to segment p on e (reply: in e's reply
// direction; a hairpin flow's forward segments, whose source was rewritten to the VIP,
// are not judged, nor are a local endpoint's): true when p is a FIN or RST whose sequence
// number lies outside [ack, ack+TCPCloseWindow) (a RST: TCPRSTWindow) of the other
// direction's noted ack, which then moves nothing; otherwise p's acknowledgment is noted
// as due.
func (e *ModelEntry) window(p ModelPacket, proto uint8, reply bool) bool {
	if proto != protoTCP || e.SVC || (e.Hairpin && !reply) {
		return false
	}
	d := 0
	if reply {
		d = 1
	}
	// (A local endpoint's FIN or RST is never blind: it closes only its own flows.)
	if (p.FIN || p.RST) && !p.FromLocal && !inWindow(p.SeqNum, e.TCPAck[1-d], p.RST) {
		return true
	}
	if p.ACK {
		noteAck(&e.TCPAck[d], p.AckNum)
	}
	return false
}

type epKey struct {
	zone uint32
	ip   netip.Addr
}

type fragKey struct {
	zone     uint32
	src, dst netip.Addr
	id       uint16
	proto    uint8
}

type fragRec struct {
	pass    bool
	expires time.Duration
}

// Model is the Go reference model of one host's eBPF conntrack, policy and service
// load-balancing stages, as specified by docs/conntrack.md. The differential test feeds the
// same packets to it and to the BPF programs and compares verdicts, rewrites and table
// contents. It is deterministic: time only moves with Advance, and backend choice is
// delegated to Model.Choose.
//
// Readings chosen where docs/conntrack.md (and the brief that accompanies it) leave room:
//
//   - Flow key ports: TCP/UDP use Sport/Dport; ICMP echo request/reply (types 8/0) use
//     Sport/Dport as given (the echo id); every other packet is keyed with ports 0.
//     Policy sees DstPort only for TCP/UDP (0 otherwise).
//   - Group 0 means "no group": it never has RULES, SetDenyAll(0, …) is ignored.
//     RULES of a group = at least one rule in any PolicySet with that EPGID.
//   - All TCP verdicts are "as an opening" (SYN, no ACK); non-TCP verdicts use SYN=ACK=false.
//     Decide cannot see the ICMP type, so "the real packet" for ICMP non-openers equals this.
//   - One table, one entry per key, for flow entries and SVC entries alike (capacity counts
//     both). The conntrack algorithm sees only entries without SVC (an SVC entry at its key
//     counts as absent and is never deleted by it); the service stage sees only entries with
//     SVC. Whichever stage writes a key overwrites what is there; overwriting an existing key
//     (live or expired) never fails, inserting a new key into a full table does.
//   - A TCP SYN that policy denies deletes the forward flow entry, live or expired.
//   - An untracked TCP SYN (no ACK) that is not balanced deletes a CLOSING DNAT flow entry at
//     its key, live or expired (cb_ct_reuse).
//   - A client's packets balanced to itself (hairpin), and its packets that are replies of
//     such a flow (the reversed key has a live Hairpin DNAT entry), are never judged,
//     whichever entry they then use (the datapath's t.hairpin).
//   - "Entry used": the forward entry if live, else the live reverse entry, else the entry the
//     algorithm wrote. A DNATed packet sets DNAT and the VIP on the entry used only if it is
//     the forward (client→backend) key; the flags of an entry are otherwise kept, except that
//     a SYN rewrite starts from scratch (ALLOWED, plus DNAT when DNATed).
//   - Services: the service of a packet is the one at (Zone, Dst, Dport, Proto); if several
//     IDs share that key the lowest ID wins. An SVC entry's backend is valid only if that
//     service has the entry's service ID and still lists the backend; a different ID at the
//     key counts as "backend not a member" (re-balance). The DNAT port is always the current
//     service's TargetPort. The SVC entry is written or refreshed only when the conntrack
//     algorithm passed the packet and an entry was used (not for a passing TCP FIN/RST without
//     entry); its deadline is the used entry's deadline. SVC entries have State 0, Epoch 0
//     (the datapath keeps its backend revision there, or its fast path's memo of the flow
//     entry, docs/conntrack.md "The service fast path's memo": not modelled, they only
//     decide which of its equivalent paths checks the membership and the flow entry),
//     Allowed false, NAT = backend:TargetPort, SvcID = the service id.
//   - Reply SNAT: decided by a live DNAT flow entry at the reversed (post-DNAT) key looked up
//     before the algorithm runs (never for a TCP SYN without ACK, which opens a flow: a SYN on
//     the reverse of a live service flow passes, if allowed, without an entry); applied if
//     the packet passes (SNAT = that entry's VIP:port).
//   - Result.DNAT and Result.SNAT are set only on packets that pass.
//   - Result.Tracked is true when the packet reached the conntrack algorithm or the fragment
//     table; drop_frag_to_service, drop_no_backend and reject_no_backend are decided before
//     that (Tracked false). reject_no_backend (a TCP SYN or a UDP datagram to a service
//     without backends, answered with ICMP port unreachable) is a drop like the others.
//   - Fragments: the first fragment's final outcome (Pass) is recorded under the addresses it
//     arrived with (before DNAT/SNAT), only when it was tracked. A later fragment is tracked
//     when the group of (Zone, Src) or of (Zone, Dst) has RULES or DENY_ALL (no service
//     classification: it has no ports); it passes if the live record says pass, gets
//     drop_policy if the record says drop, drop_frag_no_first without a live record. Later
//     fragments refresh nothing; those of service datagrams follow their first fragment's
//     NAT (natFrag), a hairpin datagram's (either way) from the VIP back to the client.
//     Not modelled: the datapath's per-source and per-zone budgets of records
//     (drop_frag_limit: 1,024 at once and 5,000 a second per source, 4,096 and 20,000 per
//     zone), which the differential test never comes near.
//   - Policy epochs per group and per zone (docs/conntrack.md "Policy epochs"): one clock
//     counts changes (Epoch); an entry records the clock of the packet that judged it, and
//     is judged again only when a stamp its verdict depends on is newer: its source's and
//     its destination's group's (as they are now), and its zone's when a side has no group
//     or some address has a NetworkPolicy entry. SetPolicy stamps the groups whose rule
//     list changed, SetDenyAll its group, SetEndpoint a moved address's new group
//     ("no group" stamps the zone; a new address moves from no group), Set/DeletePodPolicy
//     the zone, BumpEpoch everything. The datapath shares a zone's stamp between zones
//     65,536 apart and stamps a new address's group only when it moves: more judgements,
//     never a different verdict.
//   - DeleteEndpoint also forgets the address's group; fragment records are not flushed.
//   - GC deletes expired table entries (returned count) and expired fragment records (not
//     counted). The epoch starts at 0. Clock starts at 0; Expires is a time since then.
//   - Per-endpoint quota (docs/conntrack.md "Per-endpoint quota"): every entry records an
//     owner, the counter slot (SetSlot) of the local endpoint it counts against: the sender
//     of a FromLocal packet (a flow it opens), else the receiver with ownerIn set (a flow
//     opened to it, counted apart: CTCountIn); 0 (none) when that address has no slot or a
//     slot past 32767. Writing an entry under a key not held by an entry of the same owner
//     (live or expired, flow or SVC) counts one against that owner, and with a quota
//     (SetCTQuota, 0 none) is refused first while the owner's count is at the quota
//     (drop_ct_quota, checked before the table's capacity). Overwriting an entry of the same
//     owner neither checks nor counts. The SVC entry of a service flow counts but is never
//     refused; rewriting a live one keeps its owner. Counts only grow: entries that expire or
//     are deleted (policy, tuple reuse, DeleteEndpoint, a service gone) still count until GC,
//     which recounts the entries it leaves, per owner (the agent's collector). SetSlot zeroes
//     the slot's count (a slot handed out).
type Model struct {
	// Choose picks the backend for a new or re-balanced service flow among cands (never
	// empty). The differential test sets it to return what the real datapath picked.
	// Default (nil): cands[0].
	Choose func(cands []netip.Addr) netip.Addr

	capacity int
	quota    uint32            // per-endpoint conntrack quota (0: none)
	inLimit  uint32            // entries of flows opened from outside, together (0: none)
	inTotal  uint32            // entries of flows opened from outside, counted (cb_ct_owned_in[0])
	slots    map[epKey]uint32  // counter slots of local endpoints
	owned    map[uint16]uint32 // entries counted per owner slot (cb_ct_owned)
	now      time.Duration
	epoch    uint32            // the policy clock: the last change's stamp
	floor    uint32            // stamp of BumpEpoch: every group and zone
	gstamp   map[uint16]uint32 // groups' stamps
	zstamp   map[uint32]uint32 // zones' stamps (NetworkPolicy, "no group")
	sets     []dataplane.PolicySet
	rules    map[uint16]bool
	denyAll  map[uint16]bool
	eps      map[epKey]uint16
	pods     map[epKey]*dataplane.PodPolicy // the NetworkPolicy layer
	svcs     map[uint32]ModelService
	ct       map[FlowKey]ModelEntry
	frags    map[fragKey]fragRec
	natfrags map[fragKey]natFrag
	// Node ports and peer hosts (nodeport.go).
	host       netip.Addr // this host's address (cb_config.snat_ip): node ports' replies leave from it
	nodePorts  map[npKey]ModelNodePort
	tenantNets []tenantNet
	peers      map[netip.Addr]bool
	peerFlows  map[FlowKey]PeerFlow
}

// NewModel returns an empty model whose conntrack table holds capacity entries (all kinds).
func NewModel(capacity int) *Model {
	return &Model{
		capacity:  capacity,
		slots:     map[epKey]uint32{},
		owned:     map[uint16]uint32{},
		rules:     map[uint16]bool{},
		denyAll:   map[uint16]bool{},
		gstamp:    map[uint16]uint32{},
		zstamp:    map[uint32]uint32{},
		eps:       map[epKey]uint16{},
		pods:      map[epKey]*dataplane.PodPolicy{},
		svcs:      map[uint32]ModelService{},
		ct:        map[FlowKey]ModelEntry{},
		frags:     map[fragKey]fragRec{},
		natfrags:  map[fragKey]natFrag{},
		nodePorts: map[npKey]ModelNodePort{},
		peers:     map[netip.Addr]bool{},
		peerFlows: map[FlowKey]PeerFlow{},
	}
}

// SetEndpoint sets the group of an address in a zone (0 = none). A change of group stamps
// the new one (every entry of the address's flows is checked against its group now).
func (m *Model) SetEndpoint(zone uint32, ip netip.Addr, epg uint16) {
	k := epKey{zone, ip.Unmap()}
	if m.eps[k] != epg {
		m.stamp(zone, epg)
	}
	if epg == 0 {
		delete(m.eps, k)
		return
	}
	m.eps[k] = epg
}

// SetSlot makes the address in zone a local endpoint with counter slot slot (0: not local,
// no slot). The slot's conntrack count starts at 0 (the driver zeroes a slot it hands out).
func (m *Model) SetSlot(zone uint32, ip netip.Addr, slot uint32) {
	k := epKey{zone, ip.Unmap()}
	if slot == 0 {
		delete(m.slots, k)
		return
	}
	m.slots[k] = slot
	if o := ctOwner(slot); o != 0 {
		delete(m.owned, o)
		delete(m.owned, o|ownerIn)
	}
}

// SetCTQuota sets the per-endpoint conntrack quota (0: none).
func (m *Model) SetCTQuota(q uint32) { m.quota = q }

// CTCount is the conntrack count of the flows the endpoint with counter slot slot opened
// (cb_ct_owned), as the datapath checks it.
func (m *Model) CTCount(slot uint32) uint32 {
	o := ctOwner(slot)
	if o == 0 {
		return 0
	}
	return m.owned[o]
}

// SetCTInLimit sets how many entries flows opened from outside may hold together
// (cb_config.ct_in_limit, checked with a quota; 0: none).
func (m *Model) SetCTInLimit(n uint32) { m.inLimit = n }

// CTCountInTotal is the count of every entry of a flow opened from outside
// (cb_ct_owned_in[0]).
func (m *Model) CTCountInTotal() uint32 { return m.inTotal }

// CTCountIn is the conntrack count of the flows others opened to the endpoint with counter
// slot slot (cb_ct_owned_in).
func (m *Model) CTCountIn(slot uint32) uint32 {
	o := ctOwner(slot)
	if o == 0 {
		return 0
	}
	return m.owned[o|ownerIn]
}

// ownerIn marks an owner as the endpoint a flow was opened to (CB_OWNER_IN).
const ownerIn = 0x8000

// ctOwner is the owner an entry records for the flows the endpoint with counter slot s
// opens (cb_ct_owner): entries hold 16 bits and the top one says "opened to it", so a
// slot past 15 bits is not counted.
func ctOwner(s uint32) uint16 {
	if s < ownerIn {
		return uint16(s)
	}
	return 0
}

// ownerOf is the owner of the entries packet p writes: its sender's slot when a local
// container sent it (a flow it opens), else its local receiver's with ownerIn (a flow
// opened to it: from another host, the wire, a node port).
func (m *Model) ownerOf(p ModelPacket) uint16 {
	if p.FromLocal {
		return ctOwner(m.slots[epKey{p.Zone, p.Src}])
	}
	return ctOwner(m.slots[epKey{p.Zone, p.Dst}]) | ownerIn // ownerIn alone: the host's total only
}

// DeleteEndpoint forgets the address (its group and slot) and deletes every table entry with
// it on either side of the key in that zone (their owner's count keeps them until GC).
func (m *Model) DeleteEndpoint(zone uint32, ip netip.Addr) {
	ip = ip.Unmap()
	delete(m.eps, epKey{zone, ip})
	delete(m.slots, epKey{zone, ip})
	for k, e := range m.ct {
		// Its flows, and the service flows balanced to it (they re-balance).
		if k.Zone == zone && (k.Src == ip || k.Dst == ip || (e.SVC && e.NAT.Addr() == ip)) {
			delete(m.ct, k)
		}
	}
}

// SetPolicy replaces the rule sets and stamps the groups whose rules changed.
func (m *Model) SetPolicy(sets []dataplane.PolicySet) {
	m.stamp(0, ChangedGroups(m.sets, sets)...)
	m.sets = slices.Clone(sets)
	m.rules = map[uint16]bool{}
	for _, s := range sets {
		if s.EPGID != 0 && len(s.Rules) > 0 {
			m.rules[s.EPGID] = true
		}
	}
}

// SetDenyAll sets the fail-closed state of a group and stamps it.
func (m *Model) SetDenyAll(epg uint16, on bool) {
	if epg != 0 {
		if on {
			m.denyAll[epg] = true
		} else {
			delete(m.denyAll, epg)
		}
		m.stamp(0, epg)
	}
}

// BumpEpoch stamps every group and zone: every entry is judged again on its next packet.
func (m *Model) BumpEpoch() {
	m.epoch++
	m.floor = m.epoch
}

// Epoch is the policy clock, the stamp of the last change (0 at start).
func (m *Model) Epoch() uint32 { return m.epoch }

// stamp takes the clock's next value and stamps groups (0: zone's "no group").
func (m *Model) stamp(zone uint32, groups ...uint16) {
	if len(groups) == 0 {
		return
	}
	m.epoch++
	for _, g := range groups {
		if g == 0 {
			m.zstamp[zone] = m.epoch
		} else {
			m.gstamp[g] = m.epoch
		}
	}
}

// current says whether an entry of key k recorded at clock epoch may be trusted: no stamp
// its verdict depends on is newer (serial numbers, as the datapath compares them).
func (m *Model) current(k FlowKey, epoch uint32) bool {
	need := m.floor
	zone := len(m.pods) > 0
	for _, g := range []uint16{m.group(k.Zone, k.Src), m.group(k.Zone, k.Dst)} {
		if g == 0 {
			zone = true
		} else if int32(m.gstamp[g]-need) > 0 {
			need = m.gstamp[g]
		}
	}
	if zone && int32(m.zstamp[k.Zone]-need) > 0 {
		need = m.zstamp[k.Zone]
	}
	return int32(epoch-need) >= 0
}

// ChangedGroups are the groups whose rule list differs between two sets of rule sets.
func ChangedGroups(old, new []dataplane.PolicySet) []uint16 {
	rules := func(sets []dataplane.PolicySet) map[uint16][]dataplane.PolicyRule {
		out := map[uint16][]dataplane.PolicyRule{}
		for _, s := range sets {
			out[s.EPGID] = append(out[s.EPGID], s.Rules...)
		}
		return out
	}
	o, n := rules(old), rules(new)
	var out []uint16
	for g, rs := range n {
		if !slices.Equal(o[g], rs) {
			out = append(out, g)
		}
	}
	for g, rs := range o {
		if _, ok := n[g]; !ok && len(rs) > 0 {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// SetService upserts a service by ID.
func (m *Model) SetService(s ModelService) {
	s.VIP = s.VIP.Unmap()
	b := make([]netip.Addr, len(s.Backends))
	for i, a := range s.Backends {
		b[i] = a.Unmap()
	}
	s.Backends = b
	m.svcs[s.ID] = s
}

// DeleteService removes a service; its SVC entries are dropped lazily by the next packet.
func (m *Model) DeleteService(id uint32) { delete(m.svcs, id) }

// Advance moves the clock.
func (m *Model) Advance(d time.Duration) { m.now += d }

// GC deletes expired entries and returns how many table entries it deleted; then it
// recounts the entries left per owner (the collector's sweep).
func (m *Model) GC() int {
	n := 0
	for k, e := range m.ct {
		if m.now > e.Expires {
			delete(m.ct, k)
			n++
		}
	}
	m.owned = map[uint16]uint32{}
	m.inTotal = 0
	for _, e := range m.ct {
		if e.Owner != 0 && e.Owner != ownerIn {
			m.owned[e.Owner]++
		}
		if e.Owner&ownerIn != 0 {
			m.inTotal++
		}
	}
	for k, r := range m.frags {
		if m.now > r.expires {
			delete(m.frags, k)
		}
	}
	return n
}

// Entries is the number of table entries, live or expired but not yet collected.
func (m *Model) Entries() int { return len(m.ct) }

// Lookup returns the table entry at k, live or expired.
func (m *Model) Lookup(k FlowKey) (ModelEntry, bool) {
	e, ok := m.ct[k]
	return e, ok
}

// Keys returns every key in the table (in no particular order).
func (m *Model) Keys() []FlowKey {
	ks := make([]FlowKey, 0, len(m.ct))
	for k := range m.ct {
		ks = append(ks, k)
	}
	return ks
}

func (m *Model) group(zone uint32, ip netip.Addr) uint16 { return m.eps[epKey{zone, ip}] }

func (m *Model) groupTracked(epg uint16) bool { return m.rules[epg] || m.denyAll[epg] }

// insert writes e at k (cb_ct_insert): "" or the drop reason. An entry taking a key not
// held by an entry of its owner counts against the owner, refused first (quota, 0: none)
// while the owner is at it; a new key fails when the table is full; overwriting never does.
func (m *Model) insert(k FlowKey, e ModelEntry, quota uint32) string {
	old, exists := m.ct[k]
	counts := e.Owner != 0 && (!exists || old.Owner != e.Owner)
	slotCounts := counts && e.Owner != ownerIn // ownerIn alone: the host's total only
	in := counts && e.Owner&ownerIn != 0
	if slotCounts && quota != 0 && m.owned[e.Owner] >= quota {
		return DropCTQuota
	}
	if in && quota != 0 && m.inLimit != 0 && m.inTotal >= m.inLimit {
		return DropCTQuota
	}
	if !exists && len(m.ct) >= m.capacity {
		return DropCTFull
	}
	m.ct[k] = e
	if slotCounts {
		m.owned[e.Owner]++
	}
	if in {
		m.inTotal++
	}
	return ""
}

// flow returns the live flow (non-SVC) entry at k.
func (m *Model) flow(k FlowKey) (ModelEntry, bool) {
	e, ok := m.ct[k]
	if !ok || e.SVC || m.now > e.Expires {
		return ModelEntry{}, false
	}
	return e, true
}

// svcEntry returns the live SVC entry at k.
func (m *Model) svcEntry(k FlowKey) (ModelEntry, bool) {
	e, ok := m.ct[k]
	if !ok || !e.SVC || m.now > e.Expires {
		return ModelEntry{}, false
	}
	return e, true
}

// service returns the service at (zone, vip, port, proto), lowest ID first.
func (m *Model) service(zone uint32, vip netip.Addr, port uint16, proto uint8) (ModelService, bool) {
	var best ModelService
	found := false
	for _, s := range m.svcs {
		if s.Zone == zone && s.VIP == vip && s.Port == port && s.Proto == proto && (!found || s.ID < best.ID) {
			best, found = s, true
		}
	}
	return best, found
}

func (m *Model) isVIP(zone uint32, ip netip.Addr) bool {
	for _, s := range m.svcs {
		if s.Zone == zone && s.VIP == ip {
			return true
		}
	}
	return false
}

func (m *Model) choose(cands []netip.Addr) netip.Addr {
	if m.Choose == nil {
		return cands[0]
	}
	return m.Choose(slices.Clone(cands)).Unmap()
}

func timeout(proto, state uint8) time.Duration {
	if proto != protoTCP {
		return timeoutOther
	}
	switch state {
	case CTEstablished:
		return timeoutTCPEst
	case CTClosing:
		return timeoutTCPClosing
	}
	return timeoutTCPNew
}

// icmpError handles an ICMP error (docs/conntrack.md "Related ICMP errors"): related to
// the live flow its quote belongs to (either direction), it passes without touching the
// entry, and an error about a client's packet to a service backend gets the VIP back in its
// quote (and as its source, when the backend sent it). Otherwise it is judged like any
// non-opener. It is tracked when a group has rules or it belongs to a service flow.
func (m *Model) icmpError(p ModelPacket, k FlowKey) ModelResult {
	q := p.Quoted
	q.Zone = p.Zone
	q.Src, q.Dst = q.Src.Unmap(), q.Dst.Unmap()
	// Only an error from the quoted packet's destination back to its sender is related.
	fromPeer := k.Src == q.Dst && k.Dst == q.Src
	if res, ok := m.clientICMPError(p, k, q); ok && fromPeer {
		return res
	}
	fwd, haveFwd := m.flow(q)
	haveFwd = haveFwd && fromPeer
	if !(haveFwd && fwd.DNAT) && m.isVIP(k.Zone, k.Dst) {
		return ModelResult{Reason: DropUnknownDst} // a VIP is no endpoint
	}
	if !(haveFwd && fwd.DNAT) && !m.tracked(k.Zone, k.Src) && !m.tracked(k.Zone, k.Dst) {
		return ModelResult{Pass: true}
	}
	res := ModelResult{Pass: true, Tracked: true}
	if haveFwd {
		if fwd.DNAT {
			res.QuotedDst = fwd.NAT
			if k.Src == q.Dst {
				res.SNAT = netip.AddrPortFrom(fwd.NAT.Addr(), 0)
			}
			if fwd.Hairpin {
				// The hairpin client's own error about its balanced packet: back to it,
				// from the VIP, about client:cport → VIP:port.
				res.QuotedSrc = netip.AddrPortFrom(k.Src, q.Sport)
				res.DNAT = netip.AddrPortFrom(k.Src, 0)
			}
		}
		return res
	}
	if _, ok := m.flow(q.Reverse()); ok && fromPeer {
		return res
	}
	if why := m.judge(k); why != "" {
		return ModelResult{Reason: why, Tracked: true}
	}
	return res
}

// clientICMPError is an ICMP error a local client sends to a VIP about a reply of its
// service flow (quoting VIP:port → client:cport, key k, quote q): with the flow's SVC entry
// and its live DNAT entry restoring that VIP:port, it goes to the backend about the packet
// the backend sent (a hairpin's back to the client from the VIP, about
// client:target → VIP:cport), related to the flow. ok false: no such error.
func (m *Model) clientICMPError(p ModelPacket, k, q FlowKey) (ModelResult, bool) {
	if !p.FromLocal || p.Frag != FragNone || (q.Proto != protoTCP && q.Proto != protoUDP) {
		return ModelResult{}, false
	}
	svc, ok := m.svcEntry(FlowKey{Zone: k.Zone, Src: k.Src, Dst: k.Dst, Sport: q.Dport, Dport: q.Sport, Proto: q.Proto})
	if !ok {
		return ModelResult{}, false
	}
	be := svc.NAT
	// The datapath also asks the backend's network to be the client's (lb.h
	// cb_lb_icmp_client); the model knows zones, not networks: sequences must not give two
	// networks of a zone the same address (the differential test's endpoints do not).
	hairpin := be.Addr() == k.Src
	fk := FlowKey{Zone: k.Zone, Src: k.Src, Dst: be.Addr(), Sport: q.Dport, Dport: be.Port(), Proto: q.Proto}
	if hairpin {
		fk.Src = k.Dst
	}
	e, ok := m.flow(fk)
	if !ok || !e.DNAT || e.Hairpin != hairpin || e.NAT != netip.AddrPortFrom(q.Src, q.Sport) {
		return ModelResult{}, false
	}
	res := ModelResult{Pass: true, Tracked: true, DNAT: netip.AddrPortFrom(be.Addr(), 0), QuotedSrc: be}
	if hairpin {
		res.SNAT = netip.AddrPortFrom(k.Dst, 0)
		res.QuotedDst = netip.AddrPortFrom(k.Dst, q.Dport)
	}
	return res, true
}

// judge is decide(flow, src_epg, dst_epg) of docs/conntrack.md: policy.Decide as a
// connection opening, denied when either group is DENY_ALL (DropPolicy); then the
// NetworkPolicy layer (DropNetpol). "" allows.
func (m *Model) judge(k FlowKey) string {
	// A hairpin flow (its key comes from a VIP) is a client talking to itself: not judged.
	if m.isVIP(k.Zone, k.Src) {
		return ""
	}
	sg, dg := m.group(k.Zone, k.Src), m.group(k.Zone, k.Dst)
	if m.denyAll[sg] || m.denyAll[dg] {
		return DropPolicy
	}
	p := policy.Packet{SrcEPG: sg, DstEPG: dg, SrcIP: k.Src, DstIP: k.Dst, Proto: k.Proto, SYN: k.Proto == protoTCP}
	if k.Proto == protoTCP || k.Proto == protoUDP {
		p.DstPort = k.Dport
	}
	if !policy.Decide(m.sets, p).Allowed() {
		return DropPolicy
	}
	if !policy.NetpolAllows(m.pods[epKey{k.Zone, k.Src}], m.pods[epKey{k.Zone, k.Dst}], k.Src, k.Dst, k.Proto, p.DstPort) {
		return DropNetpol
	}
	return ""
}

// SetPodPolicy sets the NetworkPolicy layer of address p.IP in zone and stamps the zone.
func (m *Model) SetPodPolicy(zone uint32, p dataplane.PodPolicy) {
	m.pods[epKey{zone, p.IP.Unmap()}] = &p
	m.stampZone(zone)
}

// DeletePodPolicy forgets the NetworkPolicy layer of ip in zone and stamps the zone.
func (m *Model) DeletePodPolicy(zone uint32, ip netip.Addr) {
	delete(m.pods, epKey{zone, ip.Unmap()})
	m.stampZone(zone)
}

// stampZone takes the clock's next value and stamps zone.
func (m *Model) stampZone(zone uint32) {
	m.epoch++
	m.zstamp[zone] = m.epoch
}

// tracked says whether flows from or to ip in zone go through conntrack: its group has
// rules or is failed closed, or it has a NetworkPolicy entry.
func (m *Model) tracked(zone uint32, ip netip.Addr) bool {
	if m.groupTracked(m.group(zone, ip)) {
		return true
	}
	_, ok := m.pods[epKey{zone, ip}]
	return ok
}

// rejectable says whether a TCP or UDP packet to a service without backends is refused
// with an ICMP error rather than dropped: a UDP datagram or a bare TCP SYN (the datapath
// answers only what opens a flow; it never answers a non-first fragment, ICMP, or a
// link-layer broadcast either, which never get here).
func (p ModelPacket) rejectable() bool {
	return p.Proto == protoUDP || p.SYN && !p.ACK && !p.FIN && !p.RST
}

// Packet runs one packet through the model and updates its state.
func (m *Model) Packet(p ModelPacket) ModelResult {
	p.Src, p.Dst = p.Src.Unmap(), p.Dst.Unmap()
	var np *ModelNodePort
	switch p.Path {
	case PathPeerHost:
		return m.peerHost(p)
	case PathToOutside:
		return m.toOutside(p)
	case PathNodePort:
		n, res, ok := m.nodePortIn(p)
		if !ok {
			return res
		}
		np = &n
		p.Zone, p.Dst, p.Dport = n.Zone, n.VIP, n.SvcPort
	}
	if p.Frag == FragLater {
		return m.laterFragment(p)
	}
	k := flowKeyOf(p)
	if np != nil {
		k.Kind = KindNodePort
	}

	if p.Proto == protoICMP && p.HasQuote {
		return m.icmpError(p, k)
	}

	// Service forward path.
	svcKey := k
	var (
		isSvc   bool
		svc     ModelService
		backend netip.Addr
		vip     netip.AddrPort
		hairpin bool
	)
	// A reply of a service flow is never balanced (the datapath matches replies first; a
	// hairpin reply is addressed to the VIP). A TCP SYN without ACK opens a flow: it is
	// nobody's reply.
	opening := p.Proto == protoTCP && p.SYN && !p.ACK
	revFirst, isReplyFirst := m.flow(k.Reverse())
	isReplyFirst = isReplyFirst && revFirst.DNAT && !opening
	if (p.FromLocal || np != nil) && (p.Proto == protoTCP || p.Proto == protoUDP) && !isReplyFirst {
		s, haveSvc := m.service(p.Zone, p.Dst, p.Dport, p.Proto)
		e, haveEntry := m.svcEntry(svcKey)
		switch {
		case haveEntry && !haveSvc:
			delete(m.ct, svcKey)
		case haveEntry && e.SvcID == s.ID && (slices.Contains(s.Backends, e.NAT.Addr()) || slices.Contains(s.Draining, e.NAT.Addr())):
			isSvc, svc, backend = true, s, e.NAT.Addr()
		case !haveSvc:
		case len(s.Backends) == 0 && p.rejectable():
			return ModelResult{Reason: RejectNoBackend}
		case len(s.Backends) == 0:
			return ModelResult{Reason: DropNoBackend}
		default:
			isSvc, svc, backend = true, s, m.choose(s.Backends)
		}
		if isSvc {
			vip = netip.AddrPortFrom(p.Dst, p.Dport)
			k.Dst, k.Dport = backend, svc.TargetPort
			if backend == p.Src {
				// Hairpin: the client is its own backend; it gets the packet from the VIP.
				hairpin = true
				k.Src = p.Dst
			}
		}
	}

	if np != nil {
		if why := m.nodePortJudge(p, k, isSvc); why != "" {
			return ModelResult{Reason: why}
		}
	}
	// A VIP is no endpoint: what is neither balanced nor a reply has nowhere to go, but a
	// whole echo request from a local endpoint is answered, as the gateway answers it.
	if !isSvc && !isReplyFirst && m.isVIP(k.Zone, k.Dst) {
		if p.FromLocal && p.Proto == protoICMP && p.ICMPType == icmpEchoRequest && p.Frag == FragNone {
			return ModelResult{Pass: true, EchoReply: true}
		}
		return ModelResult{Reason: DropUnknownDst}
	}
	rev, replyDNAT := m.flow(k.Reverse())
	replyDNAT = replyDNAT && rev.DNAT && !opening
	if !isSvc && !replyDNAT && !m.tracked(k.Zone, k.Src) && !m.tracked(k.Zone, k.Dst) {
		m.reuseTuple(k, p)
		return ModelResult{Pass: true}
	}

	res := ModelResult{Tracked: true}
	var used FlowKey
	var haveUsed bool
	owner := m.ownerOf(p)
	if np != nil {
		owner = ctOwner(m.slots[epKey{p.Zone, backend}]) | ownerIn // opened to its backend
	}
	// A client talking to itself through its service is not judged: its balanced packets
	// and the replies of such a flow (whatever entry they then use).
	self := hairpin || (p.FromLocal && isReplyFirst && revFirst.Hairpin)
	res.Pass, res.Reason, used, haveUsed = m.track(k, p, isSvc, vip, hairpin, self, owner)
	trackPass := res.Pass
	if np != nil && res.Pass && haveUsed && used == k {
		e := m.ct[k]
		e.NodePort = np.Port // its replies leave from this host's address and node port
		m.ct[k] = e
	}
	if res.Pass && isSvc && haveUsed {
		e := ModelEntry{SVC: true, NAT: netip.AddrPortFrom(backend, svc.TargetPort), Expires: m.ct[used].Expires, SvcID: svc.ID, Owner: owner}
		if cur, ok := m.svcEntry(svcKey); ok {
			e.Owner = cur.Owner // rewritten in place
			m.ct[svcKey] = e
		} else if why := m.insert(svcKey, e, 0); why != "" {
			res.Pass, res.Reason = false, why
		}
	}
	fk := fragKey{p.Zone, p.Src, p.Dst, p.IPID, p.Proto}
	if p.Frag == FragFirst {
		// The verdict of conntrack and policy (a full table refusing the service choice
		// afterwards does not change it).
		m.frags[fk] = fragRec{pass: trackPass, expires: m.now + timeoutFrag}
	}
	if res.Pass {
		if isSvc {
			res.DNAT = netip.AddrPortFrom(backend, svc.TargetPort)
			if hairpin {
				res.SNAT = netip.AddrPortFrom(vip.Addr(), p.Sport)
			}
		}
		// Un-DNAT only when the entry the packet used is the reversed one (a packet whose
		// key is its own reverse, src == dst, uses its forward entry).
		if replyDNAT && haveUsed && used == k.Reverse() && used != k {
			res.SNAT = rev.NAT
			if m.ct[used].Hairpin {
				res.DNAT = netip.AddrPortFrom(p.Src, p.Dport) // back to the client itself
				if p.Frag == FragFirst {
					m.natfrags[fk] = natFrag{hairpin: true, addr: p.Src, expires: m.now + timeoutFrag}
				}
			} else if p.Frag == FragFirst {
				m.natfrags[fk] = natFrag{src: true, addr: rev.NAT.Addr(), expires: m.now + timeoutFrag}
			}
		}
		if isSvc && p.Frag == FragFirst {
			m.natfrags[fk] = natFrag{addr: backend, hairpin: hairpin, expires: m.now + timeoutFrag}
		}
	}
	return res
}

// natFrag says where the later fragments of a service datagram go: their destination to
// the backend (src false), or, for a reply, their source back to the VIP (src true); those
// of a hairpin datagram, either way, from the VIP to the client addr (hairpin true).
type natFrag struct {
	src     bool
	hairpin bool
	addr    netip.Addr
	expires time.Duration
}

func (m *Model) laterFragment(p ModelPacket) ModelResult {
	fk := fragKey{p.Zone, p.Src, p.Dst, p.IPID, p.Proto}
	nf, haveNF := m.natfrags[fk]
	haveNF = haveNF && m.now <= nf.expires && (nf.src || p.FromLocal) && (!nf.hairpin || nf.addr == p.Src)
	if !haveNF && p.FromLocal && m.isVIP(p.Zone, p.Dst) {
		return ModelResult{Reason: DropFragToService}
	}
	if !haveNF && !m.tracked(p.Zone, p.Src) && !m.tracked(p.Zone, p.Dst) {
		return ModelResult{Pass: true}
	}
	r, ok := m.frags[fk]
	switch {
	case !ok || m.now > r.expires:
		return ModelResult{Reason: DropFragNoFirst, Tracked: true}
	case !r.pass:
		return ModelResult{Reason: DropPolicy, Tracked: true}
	}
	res := ModelResult{Pass: true, Tracked: true}
	switch {
	case haveNF && nf.hairpin:
		res.SNAT, res.DNAT = netip.AddrPortFrom(p.Dst, 0), netip.AddrPortFrom(nf.addr, 0)
	case haveNF && nf.src:
		res.SNAT = netip.AddrPortFrom(nf.addr, 0)
	case haveNF:
		res.DNAT = netip.AddrPortFrom(nf.addr, 0)
	}
	return res
}

// track is the conntrack algorithm of docs/conntrack.md for one tracked packet with flow
// key k (post-DNAT). dnat says the packet was DNATed from vip. It returns the verdict and
// the key of the entry the packet used or wrote, if any.
func (m *Model) track(k FlowKey, p ModelPacket, dnat bool, vip netip.AddrPort, hairpin, self bool, owner uint16) (bool, string, FlowKey, bool) {
	judge := m.judge
	if self {
		judge = func(FlowKey) string { return "" }
	}
	tcp := k.Proto == protoTCP
	syn := tcp && p.SYN && !p.ACK
	closing := tcp && (p.FIN || p.RST)
	mark := func(e *ModelEntry) {
		if dnat {
			e.DNAT, e.NAT = true, vip
			e.Hairpin = e.Hairpin || hairpin
		}
	}
	fwd, haveFwd := m.flow(k)
	// A SYN on an established flow with a window is a plain segment.
	if syn && haveFwd && fwd.State == CTEstablished && fwd.TCPAck[1] != 0 {
		syn = false
	}

	if syn {
		if haveFwd && fwd.State == CTNew && m.current(k, fwd.Epoch) && (dnat || !fwd.DNAT) {
			fwd.Expires = m.now + timeout(k.Proto, fwd.State)
			mark(&fwd)
			m.ct[k] = fwd
			return true, "", k, true
		}
		if why := judge(k); why != "" {
			if e, ok := m.ct[k]; ok && !e.SVC {
				delete(m.ct, k)
			}
			return false, why, k, false
		}
		if !dnat && haveFwd && fwd.DNAT && fwd.State != CTClosing {
			// A direct SYN on a live service flow's tuple does not take its entry over.
			return true, "", k, false
		}
		if rev, ok := m.flow(k.Reverse()); !dnat && ok && rev.DNAT && rev.State != CTClosing {
			// Nor one on its reverse (a backend's): its replies stay the flow's.
			return true, "", k, false
		}
		e := ModelEntry{State: CTNew, Allowed: true, Epoch: m.epoch, Expires: m.now + timeout(k.Proto, CTNew), Owner: owner}
		mark(&e)
		if why := m.insert(k, e, m.quota); why != "" {
			return false, why, k, false
		}
		return true, "", k, true
	}

	ek, e, found, reply := k, fwd, haveFwd, false
	if !found {
		ek = k.Reverse()
		e, found = m.flow(ek)
		reply = found
	}
	if found {
		if !m.current(ek, e.Epoch) {
			if why := judge(ek); why != "" {
				delete(m.ct, ek)
				return false, why, ek, false
			}
			e.Epoch = m.epoch
		}
		if !e.window(p, k.Proto, reply) {
			switch {
			case closing:
				e.State = CTClosing
			case reply && e.State == CTNew:
				e.State = CTEstablished
			}
			e.Expires = m.now + timeout(k.Proto, e.State)
		}
		if !reply {
			mark(&e)
		}
		m.ct[ek] = e
		return true, "", ek, true
	}

	if why := judge(k); why != "" {
		return false, why, k, false
	}
	if closing || (k.Proto == protoICMP && p.ICMPType != 8) {
		return true, "", k, false // passes, no entry
	}
	e = ModelEntry{State: CTNew, Allowed: true, Epoch: m.epoch, Expires: m.now + timeout(k.Proto, CTNew), Owner: owner}
	mark(&e)
	e.window(p, k.Proto, false) // (a segment opening mid-flow: its ACK noted)
	if why := m.insert(k, e, m.quota); why != "" {
		return false, why, k, false
	}
	return true, "", k, true
}
