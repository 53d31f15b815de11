package ovs

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// tableID names a stage of the pipeline. Table numbers leave gaps so stages can be added.
type tableID uint8

// Pipeline stages, in packet order.
const (
	tClassifier     tableID = 0  // in_port (+ tun_id / vlan) → network, EPG, VRF registers
	tQoS            tableID = 2  // an endpoint with a QoS: its egress meter and DSCP marking (qos.go)
	tOverlaySrc     tableID = 5  // overlay packets: inner source must live behind the outer source (tun_src)
	tARP            tableID = 10 // proxy ARP: every request answered here or dropped
	tConntrack      tableID = 20 // ct(nat) lookup in the zone where the packet would be a reply
	tCTOpener       tableID = 21 // not found there: ct(nat) lookup in the zone of its own side's openings
	tServiceLB      tableID = 30 // new connections to a tenant's VIP:port → 5-tuple hash picks a backend
	tServiceDNAT    tableID = 31 // commit DNAT to the chosen backend
	tServiceBackend tableID = 32 // (service, hash choice) → backend address and port
	tCTCheck        tableID = 33 // after a commit: refused by conntrack (zone limit, full table) → drop
	tServiceFrag    tableID = 34 // learned: later fragments of a new UDP flow to a VIP → their first fragment's choice
	tSrcEPG         tableID = 35 // source EPG of traffic from other hosts (tunnel id + source IP)
	tAnswer         tableID = 36 // a VIP's echo reply or a refusal to a container: its port's answer meter (portmeter.go)
	tAnswerShared   tableID = 37 // ... then an echo reply the responders' meter, shared by all ports
	tDstEPG         tableID = 40 // destination EPG by (VRF, destination IP)
	tPolicy         tableID = 50 // rules; established/related bypass; miss = allow
	tNetpolEgress   tableID = 52 // Kubernetes NetworkPolicy: the sender's egress allow-list (netpol.go)
	tNetpolIngress  tableID = 53 // ... and the receiver's ingress allow-list
	tCommit         tableID = 55 // commit new allowed connections
	tL3             tableID = 60 // same-network bridging or routed MAC rewrite + TTL
	tOutput         tableID = 70 // local port, VXLAN tunnel, or VLAN uplink
)

var allTables = []tableID{tClassifier, tQoS, tOverlaySrc, tARP, tConntrack, tCTOpener, tServiceLB, tServiceDNAT, tServiceBackend, tCTCheck, tServiceFrag, tSrcEPG, tAnswer, tAnswerShared, tDstEPG, tPolicy, tNetpolEgress, tNetpolIngress, tCommit, tL3, tOutput}

func (t tableID) String() string {
	switch t {
	case tClassifier:
		return "classifier"
	case tQoS:
		return "qos"
	case tOverlaySrc:
		return "overlay_src"
	case tARP:
		return "arp"
	case tConntrack:
		return "conntrack"
	case tCTOpener:
		return "ct_opener"
	case tServiceLB:
		return "service_lb"
	case tServiceDNAT:
		return "service_dnat"
	case tServiceBackend:
		return "service_backend"
	case tServiceFrag:
		return "service_frag"
	case tCTCheck:
		return "ct_check"
	case tSrcEPG:
		return "src_epg"
	case tAnswer:
		return "answer"
	case tAnswerShared:
		return "answer_shared"
	case tDstEPG:
		return "dst_epg"
	case tPolicy:
		return "policy"
	case tNetpolEgress:
		return "netpol_egress"
	case tNetpolIngress:
		return "netpol_ingress"
	case tCommit:
		return "commit"
	case tL3:
		return "l3_rewrite"
	case tOutput:
		return "output"
	}
	return fmt.Sprintf("%d", uint8(t))
}

// Registers.
const (
	regNet     = 0 // network key: tag, plus 1<<24 for VLAN networks
	regSrcEPG  = 1
	regDstEPG  = 2
	regVRF     = 3 // VRF (tenant) id, also its own conntrack zone (regOpenZone below)
	regFlags   = 4 // bit 0: arrived from another host; bit 1: DNAT committed; bits 2-5: below (hairpin, answers)
	regSvcIP   = 5 // chosen backend IP
	regSvcPort = 6 // chosen backend port
	regSvcSel  = 7 // service LB choice: service id in bits 16..31, backend index in bits 0..15
	// The tenant's conntrack zones as the packet's side sees them (vrf.go, "Opener
	// zones" below): the zone of the connections this side opens (where a new one is
	// committed) and the zone of those the other side opens (where this packet would be
	// a reply).
	regOpenZone  = 8
	regReplyZone = 9
)

// Opener zones: a conntrack zone limit (ctlimit.go) counts every connection of the zone,
// so connections opened from other hosts toward the tenant's local endpoints are committed
// in the tenant's inbound zone, apart from those its local endpoints open (its own zone):
// peers opening many flows toward an endpoint fill the inbound zone's limit only, and the
// endpoints still open their own. A packet is looked up first in the zone where it would
// be a reply (conntrack: a local endpoint's packet in the inbound zone, a packet from
// another host in the own zone); a connection found there (established or related) goes
// on with it, anything else is looked up again in its own side's zone (ct_opener), where
// a new connection is committed. The classifier loads both zones with the VRF.

// Hairpin (a client balanced to itself): the packet is DNATed in the tenant's zone as any
// service packet, then SNATed to the VIP in the tenant's hairpin zone (vrf|hairpinZoneBit)
// and sent back out the port it came from. Packets to a VIP are first looked up in the
// hairpin zone (undoing the SNAT of a reply), then in the tenant's zone as usual.
const (
	flagHairpinLookup = 2 // regFlags bit: the hairpin-zone lookup of conntrack is done
	flagHairpinSNAT   = 3 // regFlags bit: the hairpin-zone SNAT of l3_rewrite is done
	flagReject        = 4 // regFlags bit: sent to the agent to be refused with ICMP (reject.go)
	flagEchoReply     = 5 // regFlags bit: turned into a VIP's echo reply (echoResponderVRF)
	flagTTLExpired    = 6 // regFlags bit: sent to the agent to be answered time exceeded (reject.go)
)

// hairpinZone is the conntrack zone of vrf's hairpin SNAT entries; false when vrf is an
// id persisted before ids were capped at 0x7fff (no hairpin for that tenant then).
func hairpinZone(vrf uint32) (uint16, bool) {
	if vrf == 0 || vrf >= hairpinZoneBit {
		return 0, false
	}
	return uint16(vrf | hairpinZoneBit), true
}

// ports is what the OVSDB side resolved: OpenFlow port numbers.
type ports struct {
	endpoints map[string]uint32 // endpoint id → ofport
	tunnel    uint32            // 0 = none
	uplink    uint32            // 0 = none
}

func netKey(n dataplane.Network) uint32 {
	if n.Encap == dataplane.EncapVLAN {
		return n.Tag | 1<<24
	}
	return n.Tag
}

// tenantOf returns the tenant part of a Contiv network id "<net>.<tenant>".
func tenantOf(netID string) string {
	if i := strings.LastIndexByte(netID, '.'); i >= 0 {
		return netID[i+1:]
	}
	return netID
}

// pipeline builds flows against the NXM fields it resolved once, at construction.
type pipeline struct {
	fields *nxFields
}

// newPipeline resolves every field the pipeline's flows use; it fails (instead of a
// flow failing later) when libOpenflow lacks one.
func newPipeline() (*pipeline, error) {
	plain, masked := pipelineFields()
	fields, err := resolveFields(plain, masked)
	if err != nil {
		return nil, fmt.Errorf("ovs pipeline: %w", err)
	}
	return &pipeline{fields: fields}, nil
}

func (pl *pipeline) newFlow(t tableID, prio int) *flow { return newFlow(pl.fields, t, prio) }

// idTables are the stable ids compile allocates from and extends for new keys: service
// LB keys ("service/proto/port") and tenant VRFs (conntrack zones, see vrf.go).
type idTables struct {
	svc map[string]uint32
	vrf map[string]uint32
}

func newIDs() idTables { return idTables{svc: map[string]uint32{}, vrf: map[string]uint32{}} }

// unitEnv is what compiling a unit needs beyond its own object: the state, the ports,
// the tenants' VRFs and the service ids.
type unitEnv struct {
	d       *dataplane.Index
	host    dataplane.HostConfig
	p       ports
	vrf     map[string]uint32 // tenant → VRF of the tenants that have a network here
	inbound map[uint32]uint32 // VRF → its inbound zone, among every held id (vrf.go)
	svcIDs  map[string]uint32
	peer    map[string]bool     // hosts with a peer
	vtep    map[netip.Addr]bool // peers' VTEPs
	local   map[uint32]map[netip.Addr]bool
}

// newUnitEnv: inbound is inboundZones of every VRF id held (startCompile); nil computes it
// from vrf alone.
func newUnitEnv(d *dataplane.Index, host dataplane.HostConfig, p ports, vrf map[string]uint32, inbound map[uint32]uint32, svcIDs map[string]uint32) *unitEnv {
	if inbound == nil {
		inbound = inboundZones(vrf)
	}
	env := &unitEnv{d: d, host: host, p: p, vrf: vrf, inbound: inbound, svcIDs: svcIDs,
		peer: map[string]bool{}, vtep: map[netip.Addr]bool{}}
	for _, p := range d.Peers {
		env.peer[p.Host] = true
		env.vtep[p.VTEP] = true
	}
	return env
}

func (env *unitEnv) netVRF(n dataplane.Network) uint32 { return env.vrf[tenantOf(n.ID)] }

// netInbound is the inbound zone of n's tenant (vrf.go).
func (env *unitEnv) netInbound(n dataplane.Network) uint32 { return env.inbound[env.netVRF(n)] }

// fromOtherHosts loads what a packet of network n from another host carries: the network,
// the VRF, regFlags bit 0, and as its zones the tenant's inbound zone (what it opens) and
// the tenant's own (where it would be a reply).
func (env *unitEnv) fromOtherHosts(f *flow, n dataplane.Network) *flow {
	return f.load(regNet, netKey(n)).load(regVRF, env.netVRF(n)).loadBits(regFlags, 0, 0, 1).
		load(regOpenZone, env.netInbound(n)).load(regReplyZone, env.netVRF(n))
}

// localIPs returns the addresses of local endpoints in VRF v (hairpin candidates).
func (env *unitEnv) localIPs(v uint32) map[netip.Addr]bool {
	if env.local == nil {
		env.local = map[uint32]map[netip.Addr]bool{}
		for _, ep := range env.d.Endpoints {
			n, ok := env.d.Networks[ep.NetworkID]
			if !ok {
				continue
			}
			lv := env.netVRF(n)
			if env.local[lv] == nil {
				env.local[lv] = map[netip.Addr]bool{}
			}
			env.local[lv][ep.IP] = true
		}
	}
	return env.local[v]
}

// tenantVRFs returns the VRF of every tenant with a network in d, allocating ids in ids
// for new tenants (in name order, so allocation is deterministic).
func tenantVRFs(d *dataplane.Index, ids map[string]uint32) (map[string]uint32, error) {
	tenants := map[string]bool{}
	for id := range d.Networks {
		tenants[tenantOf(id)] = true
	}
	vrf := map[string]uint32{}
	for _, t := range slices.Sorted(maps.Keys(tenants)) {
		id, err := assignVRF(ids, t)
		if err != nil {
			return nil, err
		}
		vrf[t] = id
	}
	return vrf, nil
}

// startCompile allocates the VRFs of d's tenants (tenantVRFs) and returns the environment
// and the empty result of a full compile of d. Inbound zones are chosen among every id ids
// holds, those of tenants without a network here too (inboundZones).
func startCompile(d *dataplane.Index, host dataplane.HostConfig, p ports, ids idTables) (*unitEnv, *compiled, error) {
	vrf, err := tenantVRFs(d, ids.vrf)
	if err != nil {
		return nil, nil, err
	}
	c := newCompiled(vrf)
	c.inbound = inboundZones(ids.vrf)
	return newUnitEnv(d, host, p, vrf, c.inbound, ids.svc), c, nil
}

// compile turns the desired state into the pipeline's flows, unit by unit (units.go).
func (pl *pipeline) compile(d *dataplane.Index, host dataplane.HostConfig, p ports, ids idTables) (*compiled, error) {
	env, c, err := startCompile(d, host, p, ids)
	if err != nil {
		return nil, err
	}
	names := unitNames(d)
	units := make(map[string][]*flow, len(names))
	for _, u := range names {
		flows, keys, err := pl.compileUnit(env, u)
		if err != nil {
			return nil, err
		}
		if _, err := c.claimService(u, d, env, keys); err != nil {
			return nil, err
		}
		units[u] = flows
	}
	log, changes := newUndoLog(), map[string]*flowChange{}
	for _, u := range names {
		c.setUnit(u, units[u], log, changes)
	}
	return c, nil
}

// unitNames lists the units of d in merge order.
func unitNames(d *dataplane.Index) []string {
	names := []string{unitBase, unitNetpol}
	for id := range d.Networks {
		names = append(names, unitNet(id))
	}
	for id := range d.Endpoints {
		names = append(names, unitEp(id))
	}
	for id := range d.RemoteEndpoints {
		names = append(names, unitRem(id))
	}
	for epg := range d.Policies {
		names = append(names, unitPol(epg))
	}
	for id := range d.Services {
		names = append(names, unitSvc(id))
	}
	slices.Sort(names)
	return names
}

// compileUnit compiles one unit's flows from env's state (none when its object is not
// there), and for a service unit its LB keys.
func (pl *pipeline) compileUnit(env *unitEnv, u string) ([]*flow, []string, error) {
	kind, id := splitUnit(u)
	d := env.d
	var flows []*flow
	switch kind {
	case unitBase:
		flows = pl.baseFlows()
	case "net":
		n, ok := d.Networks[id]
		if !ok {
			return nil, nil, nil
		}
		flows = pl.networkFlows(env, n)
	case "ep":
		ep, ok := d.Endpoints[id]
		if !ok {
			return nil, nil, nil
		}
		n, ok := d.Networks[ep.NetworkID]
		if !ok {
			return nil, nil, fmt.Errorf("endpoint %s: network %s is not known", ep.ID, ep.NetworkID)
		}
		port, ok := env.p.endpoints[ep.ID]
		if !ok {
			return nil, nil, fmt.Errorf("endpoint %s: no OVS port", ep.ID)
		}
		if _, err := qosMeters(port, ep.QoS); err != nil {
			return nil, nil, qosRefused{ep.ID: fmt.Errorf("endpoint %s: %w", ep.ID, err)} // (Sync installs the rest)
		}
		flows = append(pl.endpointClassifier(port, ep, n, env.netVRF(n), env.netInbound(n)), pl.answers(port)...)
		flows = append(flows, pl.qosFlows(port, ep.QoS)...)
		fw, err := pl.forwarding(env, endpoint{id: ep.ID, net: n, ip: ep.IP, mac: ep.MAC, epg: ep.EPGID, local: true, port: port,
			ingressRate: ep.QoS.IngressRate})
		if err != nil {
			return nil, nil, err
		}
		flows = append(flows, fw...)
	case "rem":
		r, ok := d.RemoteEndpoints[id]
		if !ok {
			return nil, nil, nil
		}
		n, ok := d.Networks[r.NetworkID]
		if !ok {
			return nil, nil, fmt.Errorf("remote endpoint %s: network %s is not known", r.ID, r.NetworkID)
		}
		if err := r.Validate(n.Encap); err != nil {
			return nil, nil, err
		}
		if n.Encap == dataplane.EncapVXLAN && !env.peer[r.Host] && !env.vtep[r.VTEP] {
			// Reachable only through a known peer: wait for it (the agent may send the
			// endpoint first), forwarding nothing meanwhile.
			return nil, nil, nil
		}
		if n.Encap == dataplane.EncapVXLAN {
			flows = pl.overlaySource(r, env.netVRF(n))
		}
		if r.EPGID != 0 {
			flows = append(flows, pl.newFlow(tSrcEPG, 100).regBits(regFlags, 0, 0, 1).reg(regVRF, env.netVRF(n)).ip().
				ipSrc(netip.PrefixFrom(r.IP, 32)).load(regSrcEPG, uint32(r.EPGID)).goTo(tDstEPG))
		}
		fw, err := pl.forwarding(env, endpoint{id: r.ID, net: n, ip: r.IP, mac: r.MAC, epg: r.EPGID, vtep: r.VTEP})
		if err != nil {
			return nil, nil, err
		}
		flows = append(flows, fw...)
	case "pol":
		epg, err := strconv.ParseUint(id, 10, 16)
		if err != nil {
			return nil, nil, fmt.Errorf("unit %s: %w", u, err)
		}
		ps, ok := d.Policies[uint16(epg)]
		if !ok {
			return nil, nil, nil
		}
		if flows, err = pl.policyFlows(ps); err != nil {
			return nil, nil, err
		}
	case unitNetpol:
		var err error
		if flows, err = pl.netpolFlows(d, env.vrf); err != nil {
			return nil, nil, err
		}
	case "svc":
		s, ok := d.Services[id]
		if !ok {
			return nil, nil, nil
		}
		var keys []string
		var err error
		if flows, keys, err = pl.service(env, s); err != nil {
			return nil, nil, err
		}
		return dedupeFlows(flows), keys, checkFlows(flows)
	default:
		return nil, nil, fmt.Errorf("unit %q: unknown kind", u)
	}
	return dedupeFlows(flows), nil, checkFlows(flows)
}

// checkFlows returns the first build error of flows (a field the pipeline did not resolve).
func checkFlows(flows []*flow) error {
	for _, f := range flows {
		if f.err != nil {
			return f.err
		}
	}
	return nil
}

// baseFlows are the flows no object owns: each table drops what no flow claims, except
// the pass-through stages; established and related traffic bypasses policy.
func (pl *pipeline) baseFlows() []*flow {
	flows := []*flow{
		pl.newFlow(tClassifier, 0),
		// Only endpoints with a QoS are sent here, each with its flow in the same unit: a
		// packet without one lost its flow (its meter deleted in vswitchd): drop, never
		// pass it unlimited and unmarked.
		pl.newFlow(tQoS, 0),
		pl.newFlow(tOverlaySrc, 0), // inner source not behind the sending VTEP: drop
		pl.newFlow(tARP, 0),
		pl.newFlow(tARP, 5).ip().goTo(tConntrack),
		pl.newFlow(tARP, 10).ethType(0x0806),                             // unknown ARP target: drop
		pl.newFlow(tARP, 200).ethType(0x0806).regBits(regFlags, 0, 0, 1), // never answer other hosts
		pl.newFlow(tConntrack, 0),
		pl.newFlow(tConntrack, 10).ip().ctZoneFromReg(regReplyZone, int(tCTOpener), false, nil, ""),
		pl.newFlow(tCTOpener, 0).ip().ctZoneFromReg(regOpenZone, int(tServiceLB), false, nil, ""),
		pl.newFlow(tCTOpener, 100).ip().ctState("+est+trk", []int{of.NX_CT_STATE_EST_OFS, of.NX_CT_STATE_TRK_OFS}, nil).goTo(tServiceLB),
		pl.newFlow(tCTOpener, 100).ip().ctState("+rel+trk", []int{of.NX_CT_STATE_REL_OFS, of.NX_CT_STATE_TRK_OFS}, nil).goTo(tServiceLB),
		pl.newFlow(tServiceLB, 0).goTo(tSrcEPG),
		pl.newFlow(tServiceDNAT, 0).goTo(tSrcEPG),
		pl.newFlow(tServiceBackend, 0),
		pl.newFlow(tServiceFrag, 0), // no choice learned: the caller's reg7 stays 0, nothing is balanced
		pl.newFlow(tSrcEPG, 0).goTo(tDstEPG),
		pl.newFlow(tAnswer, 0), // not an answer to a local port: drop
		pl.newFlow(tAnswerShared, 0),
		pl.newFlow(tAnswerShared, 100).regBits(regFlags, flagEchoReply, flagEchoReply, 1).metered(responderMeter).output(of.P_IN_PORT),
		pl.newFlow(tDstEPG, 0).goTo(tPolicy),
		pl.newFlow(tPolicy, 0).goTo(tNetpolEgress),
		pl.newFlow(tPolicy, 65000).ip().ctState("-new+est+trk", []int{of.NX_CT_STATE_EST_OFS, of.NX_CT_STATE_TRK_OFS}, []int{of.NX_CT_STATE_NEW_OFS}).goTo(tL3),
		pl.newFlow(tPolicy, 65000).ip().ctState("+rel+trk", []int{of.NX_CT_STATE_REL_OFS, of.NX_CT_STATE_TRK_OFS}, nil).goTo(tL3),
	}
	flows = append(flows, pl.laterFragments()...)
	flows = append(flows, pl.commitFlows()...)
	flows = append(flows, pl.ctCheckFlows()...)
	return append(flows, pl.newFlow(tL3, 0), pl.newFlow(tOutput, 0))
}

// laterFragments let the later fragments of a new UDP or ICMP datagram (no ports, no
// ICMP type: nothing to judge) skip the rules, to the commit its first fragment reaches
// only if the rules passed it (a direct flow's, or its service port and backend's DNAT):
// conntrack (dpctl/ipf-set-enabled, reassembly.go) holds fragments until their datagram
// is whole, so a datagram whose first fragment was dropped is never released and
// expires there. Established flows' fragments pass as their flow does (65000); a
// client's fragments to itself through its service skip the rules anyway (64001).
func (pl *pipeline) laterFragments() []*flow {
	var flows []*flow
	for _, proto := range []uint8{1, 17} {
		flows = append(flows, pl.newFlow(tPolicy, 63000).ip().proto(proto).nwFrag(fragLater).
			ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).goTo(tCommit))
	}
	return flows
}

// ctMarkCommitted is the ct_mark bit every commit of a tenant's connection sets (exec in
// its ct action): the commit's recirculation into ct_check carries it only when conntrack
// took the connection. The userspace datapath lets a packet whose commit it refused (the
// zone at its dpctl/ct-set-limits limit, or the table at ct-get-maxconns) go on as an
// untracked new one; without the check it would pass with no entry (and its replies
// would be judged as new connections of their own).
const ctMarkCommitted = 1

// ctCheckFlows drop the packets whose commit conntrack refused (ct_mark without
// ctMarkCommitted after the commit); the others go on to l3_rewrite (every commit, a
// service connection's DNAT too, comes after policy).
func (pl *pipeline) ctCheckFlows() []*flow {
	committed := func(prio int) *flow {
		return pl.newFlow(tCTCheck, prio).ip().ctMark(ctMarkCommitted, ctMarkCommitted)
	}
	return []*flow{
		pl.newFlow(tCTCheck, 0), // refused: drop (drop_ct_quota)
		committed(90).goTo(tL3),
	}
}

// networkFlows: traffic of network n from other hosts (VNI or VLAN tag) and ARP for its
// gateway.
func (pl *pipeline) networkFlows(env *unitEnv, n dataplane.Network) []*flow {
	var flows []*flow
	if n.Encap == dataplane.EncapVXLAN && env.p.tunnel != 0 {
		flows = append(flows, env.fromOtherHosts(pl.newFlow(tClassifier, 100).inPort(env.p.tunnel).tunID(n.Tag), n).goTo(tOverlaySrc))
	}
	if n.Encap == dataplane.EncapVLAN && env.p.uplink != 0 {
		flows = append(flows, env.fromOtherHosts(pl.newFlow(tClassifier, 100).inPort(env.p.uplink).vlanVID(uint16(n.Tag)).popVLAN(), n).goTo(tARP))
	}
	if n.Gateway.IsValid() {
		flows = append(flows, pl.arpResponder(netKey(n), n.Gateway, dataplane.RouterMAC))
	}
	if env.host.FwdMode == dataplane.FwdRouting && n.Gateway.IsValid() {
		flows = append(flows, pl.ttlExpiredFlows(n)...)
	}
	return flows
}

// ttlExpiredFlows send a packet of a local endpoint of network n that l3_rewrite would
// route with a TTL of 1 or 0 (not one from another host, not a translated one: neither a
// new service connection's, reg4[1], nor an established one's, ct_state +dnat or +snat) to
// the answer table (a resubmit: it lies before this one) with n's gateway in regSvcIP, to be answered time exceeded by the agent
// through the sending port's answer meter and the reject meter (answers, reject.go),
// instead of letting dec_ttl drop it silently.
func (pl *pipeline) ttlExpiredFlows(n dataplane.Network) []*flow {
	var flows []*flow
	for _, ttl := range []uint8{0, 1} {
		flows = append(flows, pl.newFlow(tL3, 150).ip().reg(regNet, netKey(n)).regBits(regFlags, 0, 1, 0).
			ctState("-snat-dnat", nil, []int{of.NX_CT_STATE_SNAT_OFS, of.NX_CT_STATE_DNAT_OFS}).
			ethDst(dataplane.RouterMAC).ipTTL(ttl).load(regSvcIP, ipU32(n.Gateway)).
			loadBits(regFlags, flagTTLExpired, flagTTLExpired, 1).resubmit(tAnswer))
	}
	return flows
}

// endpoint is the common view of a local or remote endpoint for the forwarding tables.
type endpoint struct {
	id    string
	net   dataplane.Network
	ip    netip.Addr
	mac   net.HardwareAddr
	epg   uint16
	local bool
	port  uint32
	vtep  netip.Addr
	// ingressRate: a local endpoint's QoS limits what it receives (its ingress meter).
	ingressRate uint64
}

// forwarding compiles ARP, destination EPG, L3 and output flows of endpoint e.
func (pl *pipeline) forwarding(env *unitEnv, e endpoint) ([]*flow, error) {
	var flows []*flow
	add := func(f *flow) { flows = append(flows, f) }
	nv := env.netVRF(e.net)
	mac := e.mac
	if env.host.FwdMode == dataplane.FwdRouting {
		mac = dataplane.RouterMAC
	}
	add(pl.arpResponder(netKey(e.net), e.ip, mac))
	if e.epg != 0 {
		add(pl.newFlow(tDstEPG, 100).reg(regVRF, nv).ip().ipDst(netip.PrefixFrom(e.ip, 32)).
			load(regDstEPG, uint32(e.epg)).goTo(tPolicy))
	}
	add(pl.newFlow(tL3, 200).reg(regNet, netKey(e.net)).ethDst(e.mac).goTo(tOutput))
	// Routed (to the gateway/router MAC or a VIP's MAC): within the network in bridge
	// mode, within the tenant (VRF) in routing mode; DNATed service traffic may cross
	// networks of the tenant in both.
	routed := pl.newFlow(tL3, 100).ip()
	if env.host.FwdMode == dataplane.FwdRouting {
		routed.reg(regVRF, nv)
	} else {
		routed.reg(regNet, netKey(e.net))
	}
	add(routed.ipDst(netip.PrefixFrom(e.ip, 32)).
		setEthSrc(dataplane.RouterMAC).setEthDst(e.mac).decTTL().load(regNet, netKey(e.net)).goTo(tOutput))
	if env.host.FwdMode != dataplane.FwdRouting {
		add(pl.newFlow(tL3, 90).ip().reg(regVRF, nv).regBits(regFlags, 1, 1, 1).ipDst(netip.PrefixFrom(e.ip, 32)).
			setEthSrc(dataplane.RouterMAC).setEthDst(e.mac).decTTL().load(regNet, netKey(e.net)).goTo(tOutput))
	}
	if hz, ok := hairpinZone(nv); ok && e.local {
		flows = append(flows, pl.hairpinEndpoint(e.ip, e.mac, e.port, netKey(e.net), nv, hz)...)
	}
	out := pl.newFlow(tOutput, 100).reg(regNet, netKey(e.net)).ethDst(e.mac)
	switch {
	case e.local:
		if e.ingressRate != 0 {
			out.metered(qosIngressMeterID(e.port))
		}
		out.output(e.port)
	case e.net.Encap == dataplane.EncapVXLAN:
		if env.p.tunnel == 0 {
			return nil, fmt.Errorf("remote endpoint %s: no VXLAN tunnel port (host VTEP not configured)", e.id)
		}
		out.setTunnel(e.net.Tag, e.vtep).output(env.p.tunnel)
	default:
		if env.p.uplink == 0 {
			return nil, fmt.Errorf("remote endpoint %s: VLAN network %s but no VLAN uplink configured", e.id, e.net.ID)
		}
		out.pushVLAN(uint16(e.net.Tag)).output(env.p.uplink)
	}
	add(out)
	return flows, nil
}

// policyFlows compiles one group's rules: priority 100 + 2·prio (+1 for deny, so deny
// wins ties).
func (pl *pipeline) policyFlows(ps dataplane.PolicySet) ([]*flow, error) {
	if err := ps.Validate(); err != nil {
		return nil, err
	}
	var flows []*flow
	for _, r := range ps.Rules {
		prio := 100 + 2*r.Priority
		if r.Action == dataplane.ActionDeny {
			prio++
		}
		f := pl.newFlow(tPolicy, prio).ip()
		f.rule, f.ruleOf = r.ID, fmt.Sprintf("group %d egress", ps.EPGID)
		if r.Ingress {
			f.ruleOf = fmt.Sprintf("group %d ingress", ps.EPGID)
			f.reg(regDstEPG, uint32(ps.EPGID))
			if r.RemoteEPG != 0 {
				f.reg(regSrcEPG, uint32(r.RemoteEPG))
			}
			if r.Remote.IsValid() {
				f.ipSrc(r.Remote)
			}
		} else {
			f.reg(regSrcEPG, uint32(ps.EPGID))
			if r.RemoteEPG != 0 {
				f.reg(regDstEPG, uint32(r.RemoteEPG))
			}
			if r.Remote.IsValid() {
				f.ipDst(r.Remote)
			}
		}
		if r.Proto != 0 {
			f.proto(r.Proto)
			if r.Port != 0 && (r.Proto == 6 || r.Proto == 17) {
				f.tpDst(r.Proto, r.Port)
			}
			// SynOnly (TCP setup): established and related packets bypassed this
			// table above, so every TCP packet still here would open state: a bare
			// ACK or FIN is judged as the SYN it pretends to follow.
		}
		switch r.Action {
		case dataplane.ActionAllow:
			f.goTo(tNetpolEgress)
		}
		flows = append(flows, f)
	}
	return flows, nil
}

// dedupeFlows drops flows whose key repeats within one unit (e.g. a DNAT flow shared
// by two ports of a service).
func dedupeFlows(flows []*flow) []*flow {
	seen := make(map[string]bool, len(flows))
	out := flows[:0]
	for _, f := range flows {
		if k := f.key(); !seen[k] {
			seen[k] = true
			out = append(out, f)
		}
	}
	return out
}

// commitFlows: only a packet that can open a flow creates conntrack state, after policy
// allowed it: any new non-TCP packet, and for TCP a SYN without ACK. An allowed new TCP
// packet without SYN is forwarded but commits nothing. A service packet (rewritten to its
// backend by service_dnat, regFlags bit 1) is committed with its DNAT by its service
// port and backend's flow (servicePort, priority 130); one no such flow takes is dropped
// (120): no translation leaves without its conntrack entry.
func (pl *pipeline) commitFlows() []*flow {
	newConn := func(prio int) *flow {
		return pl.newFlow(tCommit, prio).ip().ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).
			regBits(regFlags, 1, 1, 0)
	}
	return []*flow{
		pl.newFlow(tCommit, 0).goTo(tL3),
		pl.newFlow(tCommit, 120).regBits(regFlags, 1, 1, 1),
		newConn(110).proto(6).tcpFlags(0x002, 0x012, "+syn-ack").ctZoneFromReg(regOpenZone, int(tCTCheck), true, nil, ""),
		newConn(105).proto(6).goTo(tL3),
		newConn(100).ctZoneFromReg(regOpenZone, int(tCTCheck), true, nil, ""),
	}
}

// endpointClassifier admits from a container's port only untagged IPv4 with the
// endpoint's source IP and MAC, and ARP whose Ethernet and ARP sender are the endpoint.
// Everything else from the port (forged addresses, 802.1Q/802.1ad tags, other
// ethertypes) is dropped here, where it enters. What it admits opens connections in the
// tenant's own zone vrf and is a reply in its inbound zone (inbound).
func (pl *pipeline) endpointClassifier(port uint32, ep dataplane.Endpoint, n dataplane.Network, vrf, inbound uint32) []*flow {
	next := tARP
	if marksEgress(ep.QoS) {
		next = tQoS // its IPv4 through its egress meter and DSCP marking (qos.go)
	}
	admit := func(f *flow) *flow {
		return f.load(regNet, netKey(n)).load(regSrcEPG, uint32(ep.EPGID)).load(regVRF, vrf).
			load(regOpenZone, vrf).load(regReplyZone, inbound)
	}
	return []*flow{
		pl.newFlow(tClassifier, 110).inPort(port).anyVLAN(),
		// Fragments pass the port's fragment meter (portmeter.go) before anything can
		// hold them for reassembly.
		admit(pl.newFlow(tClassifier, 105).inPort(port).noVLAN().ip().ethSrc(ep.MAC).ipSrc(netip.PrefixFrom(ep.IP, 32)).
			nwFrag(fragAny).metered(fragMeterID(port))).goTo(next),
		admit(pl.newFlow(tClassifier, 100).inPort(port).noVLAN().ip().ethSrc(ep.MAC).ipSrc(netip.PrefixFrom(ep.IP, 32))).goTo(next),
		admit(pl.newFlow(tClassifier, 100).inPort(port).noVLAN().ethType(0x0806).ethSrc(ep.MAC).arpSPA(ep.IP).arpSHA(ep.MAC)).goTo(tARP),
		pl.newFlow(tClassifier, 10).inPort(port),
	}
}

// overlaySource admits a decapsulated packet whose inner source (IPv4 source or ARP
// sender) is remote endpoint r only when it came from r's VTEP. The match is on the
// tenant (VRF), not the network: routed and DNATed traffic arrives with the VNI of the
// destination's network, which may be another network of the tenant.
func (pl *pipeline) overlaySource(r dataplane.RemoteEndpoint, vrf uint32) []*flow {
	match := func() *flow {
		return pl.newFlow(tOverlaySrc, 100).reg(regVRF, vrf).tunSrc(r.VTEP)
	}
	return []*flow{
		match().ip().ipSrc(netip.PrefixFrom(r.IP, 32)).goTo(tARP),
		match().ethType(0x0806).arpSPA(r.IP).goTo(tARP),
	}
}

// service compiles service s into its tenant's VRF: the VIP is answered (ARP) and
// translated only for packets from that tenant's networks, so two tenants may use the
// same VIP:port. A service whose tenant has no network on this host has no flows. The
// keys are its LB keys ("service/proto/port"); one VIP:port per VRF is checked by
// compiled.claimService.
func (pl *pipeline) service(env *unitEnv, s dataplane.Service) ([]*flow, []string, error) {
	if err := s.Validate(); err != nil {
		return nil, nil, err
	}
	tenant, _ := dataplane.ServiceTenant(s.ID)
	v, ok := env.vrf[tenant]
	if !ok {
		return nil, nil, nil
	}
	flows := []*flow{pl.arpResponderVRF(v, s.VIP, dataplane.ContivMAC(s.VIP)), pl.echoResponderVRF(v, s.VIP)}
	if hz, ok := hairpinZone(v); ok {
		// Replies of hairpin connections come back to the VIP: undo the SNAT first.
		flows = append(flows, pl.newFlow(tConntrack, 20).ip().reg(regVRF, v).ipDst(netip.PrefixFrom(s.VIP, 32)).
			regBits(regFlags, flagHairpinLookup, flagHairpinLookup, 0).loadBits(regFlags, flagHairpinLookup, flagHairpinLookup, 1).
			ctZone(hz, int(tConntrack), false, of.NewNXActionCTNAT(), "nat"))
	}
	var keys []string
	var udp []uint32 // the service ids of its UDP ports
	targets := map[uint16]bool{}
	for _, sp := range s.Ports {
		key := serviceKey(s.ID, sp)
		sid, err := serviceID(env.svcIDs, key)
		if err != nil {
			return nil, nil, err
		}
		keys = append(keys, key)
		flows = append(flows, pl.servicePort(s, sp, v, sid, env.localIPs(v))...)
		if sp.Proto == 17 {
			udp = append(udp, sid)
			targets[targetPort(sp)] = true
		}
	}
	if len(udp) > 0 {
		flows = append(flows, pl.serviceLaterFragments(s, v, udp[0], len(targets) == 1 && !sharesUDPVIP(env.d, s)))
	}
	return flows, keys, nil
}

// fragLearnSeconds is how long a first fragment's choice stays for its later fragments:
// as long as vswitchd holds fragments for reassembly.
const fragLearnSeconds = 15

// sharesUDPVIP says whether another service of s's tenant has UDP ports on s's VIP. Their
// later fragments (no ports) all meet one flow (same VRF, VIP and priority: the unit
// sorting first would install its own), so one service's datagrams would be balanced and
// translated by another's, behind its first fragment's policy verdict: such a VIP's later
// fragments are dropped by every service on it (the same flow), and a change to one of
// them recompiles the others (serviceUnits).
func sharesUDPVIP(d *dataplane.Index, s dataplane.Service) bool {
	if d == nil {
		return false
	}
	tenant, _ := dataplane.ServiceTenant(s.ID)
	for id, o := range d.Services {
		if id == s.ID || o.VIP != s.VIP {
			continue
		}
		if t, _ := dataplane.ServiceTenant(id); t != tenant {
			continue
		}
		for _, sp := range o.Ports {
			if sp.Proto == 17 {
				return true
			}
		}
	}
	return false
}

// targetPort is the backend port of service port sp.
func targetPort(sp dataplane.ServicePort) uint16 {
	if sp.TargetPort == 0 {
		return sp.Port
	}
	return sp.TargetPort
}

// serviceLaterFragments sends the later fragments of a new UDP flow to s's VIP the way
// its first fragment went (servicePort), so they reach the same DNAT commit. They carry
// no ports (nor does OVS give them the reassembled datagram's as ct_tp_dst). When s's UDP
// ports all have one target port and no other service of its tenant has UDP ports on its
// VIP (oneTarget), the same address hash picks the backend and sid (one of s's UDP ports)
// gives the target port. Otherwise the port, even the service, is not theirs to know:
// they take the choice their first fragment's commit taught service_frag once policy had
// passed it (learnFragChoice; nothing learned: nothing balanced, they and their datagram
// are dropped).
func (pl *pipeline) serviceLaterFragments(s dataplane.Service, v, sid uint32, oneTarget bool) *flow {
	f := pl.newFlow(tServiceLB, 110).ip().ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).
		reg(regVRF, v).ipDst(netip.PrefixFrom(s.VIP, 32)).proto(17).nwFrag(fragLater)
	if !oneTarget || len(s.Backends) == 0 {
		return f.resubmit(tServiceFrag).resubmit(tServiceBackend)
	}
	hash := mpHash(nxHashFieldsSymmetricL3)
	if s.AffinityClientIP {
		hash = nxHashFieldsNwSrc
	}
	return f.loadBits(regSvcSel, 16, 31, sid).multipath(len(s.Backends), regSvcSel, 0, 15, hash).resubmit(tServiceBackend)
}

// serviceKey is the LB key of one port of service id.
func serviceKey(id string, sp dataplane.ServicePort) string {
	return fmt.Sprintf("%s/%d/%d", id, sp.Proto, sp.Port)
}

// servicePort balances new connections from VRF v to one VIP:port over the backends by
// a hash of the 5-tuple (UDP ports included; with session affinity, of the client's
// address). A new TCP packet without SYN opens nothing. Draining backends get no new
// connection; their established ones keep their translation (ct state, not flows).
func (pl *pipeline) servicePort(s dataplane.Service, sp dataplane.ServicePort, v, sid uint32, local map[netip.Addr]bool) []*flow {
	target := targetPort(sp)
	match := func(prio int) *flow {
		return pl.newFlow(tServiceLB, prio).ip().ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).
			reg(regVRF, v).ipDst(netip.PrefixFrom(s.VIP, 32)).proto(sp.Proto).tpDst(sp.Proto, sp.Port)
	}
	if len(s.Backends) == 0 {
		// No provider: what a local container opens (a UDP datagram, a bare SYN) is refused
		// with ICMP port unreachable by the agent (reject.go); anything else drops. Packets
		// from other hosts (regFlags bit 0) are never answered: the error would leave the
		// uplink untagged, to an address the sender chose.
		reject := match(100).regBits(regFlags, 0, 0, 0)
		if sp.Proto == 6 {
			reject.tcpFlags(0x002, 0x017, "+syn-fin-rst-ack")
		}
		reject.loadBits(regFlags, flagReject, flagReject, 1).goTo(tAnswer)
		return []*flow{reject, match(90)}
	}
	lb := match(100)
	flows := []*flow{lb}
	if sp.Proto == 6 {
		lb.tcpFlags(0x002, 0x012, "+syn-ack")
		flows = append(flows, match(90)) // new TCP without SYN: drop
	}
	hash := mpHash(nxHashFieldsSymmetricL3L4UDP)
	if s.AffinityClientIP {
		hash = nxHashFieldsNwSrc
	}
	lb.loadBits(regSvcSel, 16, 31, sid).multipath(len(s.Backends), regSvcSel, 0, 15, hash).resubmit(tServiceBackend)
	if sp.Proto == 17 {
		// A new flow whose first datagram came in fragments: conntrack reassembled it and
		// released its fragments, and all of them must reach this port's DNAT commit,
		// where conntrack reassembles them again. Later fragments carry no ports, so the
		// choice hashes the addresses alone, for the first fragment too (serviceFragments
		// sends the later ones).
		if !s.AffinityClientIP {
			hash = nxHashFieldsSymmetricL3
		}
		first := pl.newFlow(tServiceLB, 110).ip().ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).
			reg(regVRF, v).ipDst(netip.PrefixFrom(s.VIP, 32)).proto(sp.Proto).nwFrag(fragFirst).tpDst(sp.Proto, sp.Port)
		flows = append(flows, first.loadBits(regSvcSel, 16, 31, sid).multipath(len(s.Backends), regSvcSel, 0, 15, hash).resubmit(tServiceBackend))
	}
	for i, b := range s.Backends {
		flows = append(flows, pl.newFlow(tServiceBackend, 100).reg(regSvcSel, sid<<16|uint32(i)).
			load(regSvcIP, ipU32(b)).load(regSvcPort, uint32(target)).resubmit(tServiceDNAT))
		nat := of.NewNXActionCTNAT()
		_ = nat.SetDNAT()
		nat.SetRangeIPv4Min(ip4(b))
		nat.SetRangeIPv4Max(ip4(b))
		pt := target
		nat.SetRangeProtoMin(&pt)
		nat.SetRangeProtoMax(&pt)
		// Policy judges the packet as the backend gets it (rewritten here, statelessly);
		// only once the rules passed it is the translation committed (commit), from the
		// VIP:port put back, so a denied packet leaves no conntrack entry.
		commit := func(prio int) *flow {
			return pl.newFlow(tCommit, prio).ip().ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).
				regBits(regFlags, 1, 1, 1).reg(regSvcSel, sid<<16|uint32(i)).proto(sp.Proto)
		}
		natText := fmt.Sprintf("nat(dst=%s:%d)", b, target)
		flows = append(flows, pl.newFlow(tServiceDNAT, 100).ip().proto(sp.Proto).reg(regSvcIP, ipU32(b)).reg(regSvcPort, uint32(target)).
			loadBits(regFlags, 1, 1, 1).setDst(sp.Proto, b, target).goTo(tSrcEPG),
			commit(130).setDst(sp.Proto, s.VIP, sp.Port).ctZoneFromReg(regOpenZone, int(tCTCheck), true, nat, natText))
		if sp.Proto == 17 {
			// A new flow's first fragment, policy passed: its later fragments are to
			// take this choice (serviceLaterFragments).
			flows = append(flows, commit(131).nwFrag(fragFirst).setDst(sp.Proto, s.VIP, sp.Port).
				learnFragChoice(fragLearnSeconds).ctZoneFromReg(regOpenZone, int(tCTCheck), true, nat, natText))
		}
		if hz, ok := hairpinZone(v); ok && local[b] {
			// The client was balanced to itself: commit the SNAT to the VIP.
			snat := of.NewNXActionCTNAT()
			_ = snat.SetSNAT()
			snat.SetRangeIPv4Min(ip4(s.VIP))
			snat.SetRangeIPv4Max(ip4(s.VIP))
			flows = append(flows, pl.newFlow(tL3, 300).ip().reg(regSvcSel, sid<<16|uint32(i)).
				ipSrc(netip.PrefixFrom(b, 32)).ipDst(netip.PrefixFrom(b, 32)).
				regBits(regFlags, flagHairpinSNAT, flagHairpinSNAT, 0).loadBits(regFlags, flagHairpinSNAT, flagHairpinSNAT, 1).
				ctZone(hz, int(tL3), true, snat, fmt.Sprintf("nat(src=%s)", s.VIP)))
		}
	}
	return flows
}

// hairpinEndpoint lets local endpoint ip (on port, in network net of VRF vrf) reach
// itself through a service: such a packet (source = destination = ip, after DNAT) skips
// policy (a client talking to itself is not policy's business), gets the hairpin zone's
// SNAT to the VIP applied (committed by the service's flow for a new connection) and
// leaves through the port it came in on.
func (pl *pipeline) hairpinEndpoint(ip netip.Addr, mac net.HardwareAddr, port, net, vrf uint32, zone uint16) []*flow {
	self := func(t tableID, prio int) *flow {
		return pl.newFlow(t, prio).ip().reg(regVRF, vrf).ipSrc(netip.PrefixFrom(ip, 32)).ipDst(netip.PrefixFrom(ip, 32))
	}
	return []*flow{
		// Its service's DNAT (regFlags bit 1) is committed in commit; a packet that came
		// to its own address directly (a raw socket's) skips the rules too but commits
		// nothing: policy passed no connection, so it may create no conntrack state.
		self(tPolicy, 64001).regBits(regFlags, 1, 1, 1).goTo(tCommit),
		self(tPolicy, 64000).goTo(tL3),
		self(tL3, 290).regBits(regFlags, flagHairpinSNAT, flagHairpinSNAT, 0).loadBits(regFlags, flagHairpinSNAT, flagHairpinSNAT, 1).
			ctZone(zone, int(tL3), false, of.NewNXActionCTNAT(), "nat"),
		pl.newFlow(tOutput, 110).reg(regNet, net).ethDst(mac).inPort(port).output(of.P_IN_PORT),
	}
}

// serviceID returns the stable 16-bit id of a service LB key, allocating the smallest
// free one for a new key.
func serviceID(ids map[string]uint32, key string) (uint32, error) {
	if id, ok := allocID(ids, key, 0xffff); ok {
		return id, nil
	}
	return 0, fmt.Errorf("service %s: more than 65535 service ports", key)
}

func ipU32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func macU64(m net.HardwareAddr) uint64 {
	var v uint64
	for _, b := range m {
		v = v<<8 | uint64(b)
	}
	return v
}

// arpResponder answers ARP requests for ip inside network key with mac, in place.
func (pl *pipeline) arpResponder(key uint32, ip netip.Addr, mac net.HardwareAddr) *flow {
	return arpReply(pl.newFlow(tARP, 100).reg(regNet, key).arpOp(1).arpTPA(ip), ip, mac)
}

// arpResponderVRF answers for ip to requesters of one tenant (service VIPs).
func (pl *pipeline) arpResponderVRF(vrf uint32, ip netip.Addr, mac net.HardwareAddr) *flow {
	return arpReply(pl.newFlow(tARP, 90).reg(regVRF, vrf).arpOp(1).arpTPA(ip), ip, mac)
}

// echoResponderVRF answers a whole ICMP echo request to ip (a service VIP) from a local
// endpoint of one tenant, in place: from ip and the router MAC, back out the port it came
// in (OVS fixes the checksums of the fields it sets). Before conntrack and policy, as the
// eBPF datapath answers it (icmp_vip_reply). vswitchd runs it for every packet: through
// the port's answer meter, then the responders' meter (answers).
func (pl *pipeline) echoResponderVRF(vrf uint32, ip netip.Addr) *flow {
	return pl.newFlow(tARP, 90).reg(regVRF, vrf).ip().regBits(regFlags, 0, 0, 0).ipDst(netip.PrefixFrom(ip, 32)).
		proto(1).nwFrag(fragNone).icmpType(8).
		move("NXM_OF_ETH_SRC", "NXM_OF_ETH_DST", 48).
		setEthSrc(dataplane.RouterMAC).
		move("NXM_OF_IP_SRC", "NXM_OF_IP_DST", 32).
		loadField("NXM_OF_IP_SRC", 32, uint64(ipU32(ip)), "load:"+ip.String()+"->NXM_OF_IP_SRC[]").
		loadField("NXM_OF_ICMP_TYPE", 8, 0, "load:0->NXM_OF_ICMP_TYPE[]").
		loadBits(regFlags, flagEchoReply, flagEchoReply, 1).goTo(tAnswer)
}

// answers passes what is answered to the container at port (a VIP's echo reply, a packet
// the agent refuses) through the port's answer meter first, then the shared meter of its
// kind (the reject meter is the controller action's), then out of that port or to the
// agent (portmeter.go): one container flooding VIPs spends its own budget before it can
// spend the shared one.
func (pl *pipeline) answers(port uint32) []*flow {
	return []*flow{
		pl.newFlow(tAnswer, 100).inPort(port).regBits(regFlags, flagReject, flagReject, 1).
			metered(answerMeterID(port)).toAgentReject(),
		pl.newFlow(tAnswer, 90).inPort(port).regBits(regFlags, flagEchoReply, flagEchoReply, 1).
			metered(answerMeterID(port)).goTo(tAnswerShared),
		pl.newFlow(tAnswer, 80).inPort(port).regBits(regFlags, flagTTLExpired, flagTTLExpired, 1).
			metered(answerMeterID(port)).toAgentTTL(),
	}
}

func arpReply(f *flow, ip netip.Addr, mac net.HardwareAddr) *flow {
	return f.move("NXM_OF_ETH_SRC", "NXM_OF_ETH_DST", 48).
		setEthSrc(mac).
		loadField("NXM_OF_ARP_OP", 16, 2, "load:2->NXM_OF_ARP_OP[]").
		move("NXM_NX_ARP_SHA", "NXM_NX_ARP_THA", 48).
		move("NXM_OF_ARP_SPA", "NXM_OF_ARP_TPA", 32).
		loadField("NXM_NX_ARP_SHA", 48, macU64(mac), "load:"+mac.String()+"->NXM_NX_ARP_SHA[]").
		loadField("NXM_OF_ARP_SPA", 32, uint64(ipU32(ip)), "load:"+ip.String()+"->NXM_OF_ARP_SPA[]").
		output(of.P_IN_PORT)
}

// ctZoneFromReg adds ct() with the zone taken from register reg (regOpenZone or
// regReplyZone). A commit (of a tenant's connection) also sets ctMarkCommitted, for
// ct_check.
func (f *flow) ctZoneFromReg(reg, table int, commit bool, nat *of.NXActionCTNAT, natText string) *flow {
	zone := f.hdr(fmt.Sprintf("NXM_NX_REG%d", reg))
	if zone == nil {
		return f
	}
	if nat == nil && !commit {
		// Lookup with "nat": established connections get their translation applied.
		nat = of.NewNXActionCTNAT()
		natText = "nat"
	}
	a := of.NewNXActionConnTrack().ZoneRange(zone, of.NewNXRange(0, 15))
	f.ct(a, fmt.Sprintf("zone=reg%d[0..15]", reg), table, commit, nat, natText)
	if commit {
		if mark := f.hdr("NXM_NX_CT_MARK"); mark != nil {
			a.AddAction(of.NewNXActionRegLoad(of.NewNXRange(0, 0).ToOfsBits(), mark, ctMarkCommitted))
			i := len(f.actText) - 1
			f.actText[i] = strings.TrimSuffix(f.actText[i], ")") + fmt.Sprintf(",exec(load:%d->NXM_NX_CT_MARK[0]))", ctMarkCommitted)
		}
	}
	return f
}

// ctZone adds ct() in a fixed zone (a tenant's hairpin zone).
func (f *flow) ctZone(zone uint16, table int, commit bool, nat *of.NXActionCTNAT, natText string) *flow {
	return f.ct(of.NewNXActionConnTrack().ZoneImm(zone), fmt.Sprintf("zone=%d", zone), table, commit, nat, natText)
}

func (f *flow) ct(a *of.NXActionConnTrack, zoneText string, table int, commit bool, nat *of.NXActionCTNAT, natText string) *flow {
	parts := []string{}
	if commit {
		a.Commit()
		parts = append(parts, "commit")
	}
	if table >= 0 {
		a.Table(uint8(table))
		parts = append(parts, "table="+tableID(table).String())
	}
	parts = append(parts, zoneText)
	if nat != nil {
		a.AddAction(nat)
		parts = append(parts, natText)
	}
	return f.a(a, "ct("+strings.Join(parts, ",")+")")
}

func sortedValues[K comparable, V any](m map[K]V, key func(V) string) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b V) int { return cmp.Compare(key(a), key(b)) })
	return out
}
