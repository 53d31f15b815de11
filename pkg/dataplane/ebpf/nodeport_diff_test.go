package ebpf

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/refmodel"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// The differential test's ways in and out of the host beside the endpoints' own
// (refmodel.Path): packets a peer host sends from its own address over the overlay
// (cb_peer_host_rx) and the endpoints' replies to it (cb_outside), clients from the wire
// at a node port (cb_uplink_nodeport, cb_nodeport_judge), spoofing an address of the
// tenant's networks too, and the backends' replies to them (cb_nodeport_out), mixed with
// the other steps (policy, NetworkPolicy, services, endpoints moving, time, the
// collector). Each is judged against the model like the others: verdict, drop reason,
// rewrite, conntrack entries (keys with their kind, owners, states, notes), counts, and
// the peer flow records (state, note).

// diffNodePort is TestDifferentialNodePortPeerHost's fixture.
var diffNodePort = diffConfig{ctEntries: 40, bigSlot: -1, nodePort: true, stream: 0x90de}

const diffNodePortPort = 30080 // the service's node port, TCP and UDP

// diffClients are the clients from the wire: two outside addresses, then two that claim
// an address of tenant A's network (b's, and one no endpoint holds).
var diffClients = []netip.Addr{worldIP, netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("10.1.0.3"), netip.MustParseAddr("10.1.0.77")}

// diffOutsidePrefixes are the remote prefixes the rules and NetworkPolicy of the node port
// test also name: the peer host, the outside clients.
var diffOutsidePrefixes = []string{testVTEP + "/32", "198.51.100.0/24", "203.0.113.9/32"}

// diffNodePortBackends are the first backends of the node port test's service: the model
// balances node port flows to local backends only (refmodel.PathNodePort).
var diffNodePortBackends = []int{0, 1}

// diffPrograms are the entry programs a fixture needs beside the endpoints' and the
// overlay's.
func diffPrograms(cfg diffConfig) []string {
	if cfg.nodePort {
		return []string{contivbpfProgCbFromUplink}
	}
	return nil
}

// pathOf is the model's path of a step's packet.
func pathOf(s diffStep) refmodel.Path {
	switch s.path {
	case "peer":
		return refmodel.PathPeerHost
	case "topeer", "npreply":
		return refmodel.PathToOutside
	case "np":
		return refmodel.PathNodePort
	}
	return refmodel.PathDirect
}

func (s diffStep) pathString() string {
	if s.path == "" {
		return ""
	}
	return fmt.Sprintf("%s client %d ", s.path, s.client)
}

// ends are the source and destination addresses of a step's packet.
func (w *diffWorld) ends(s diffStep) (netip.Addr, netip.Addr) {
	peer := netip.MustParseAddr(testVTEP)
	switch s.path {
	case "peer":
		return peer, w.eps[s.to].ip
	case "topeer":
		return w.eps[s.from].ip, peer
	case "np":
		return diffClients[s.client], hostIP
	case "npreply":
		return w.eps[s.from].ip, diffClients[s.client]
	}
	return w.eps[s.from].ip, w.addr(s.to)
}

// zoneOf is the zone a step's packet arrives in (a node port's is its service's).
func (w *diffWorld) zoneOf(s diffStep) uint32 {
	switch s.path {
	case "peer":
		return w.eps[s.to].zone
	case "np":
		return diffZoneA
	}
	return w.eps[s.from].zone
}

// fromLocal says whether a step's packet comes from a local endpoint's veth.
func (w *diffWorld) fromLocal(s diffStep) bool {
	switch s.path {
	case "peer", "np":
		return false
	case "topeer", "npreply":
		return true
	}
	return w.eps[s.from].local
}

// setupNodePorts gives the world this host's address (egress device: lo), the node port
// of the service (TCP and UDP), the tenants' subnets and the node port feature, on both
// sides; the peer host (testVTEP) is one of the fixture's peers already.
func (w *diffWorld) setupNodePorts(features uint32) {
	t, objs := w.t, w.objs
	editConfig(t, objs, func(c *contivbpfCbConfig) {
		c.SnatIp = ip4(hostIP)
		c.EgressIfindex = loIfindex
	})
	setFeatures(t, objs, features|uint32(contivbpfCbFeaturesCB_FEAT_NODEPORT))
	for _, proto := range []uint8{6, 17} {
		if err := objs.CbNodeports.Put(&contivbpfCbNpKey{Port: nport(diffNodePortPort), Proto: proto},
			&contivbpfCbNp{Zone: diffZoneA, Vip: ip4(diffVIP), SvcPort: nport(80)}); err != nil {
			t.Fatal(err)
		}
		w.model.SetNodePort(refmodel.ModelNodePort{Port: diffNodePortPort, Proto: proto, Zone: diffZoneA, VIP: diffVIP, SvcPort: 80})
	}
	subnet := netip.MustParsePrefix("10.1.0.0/24")
	for _, n := range []struct{ key, zone uint32 }{{diffNetA, diffZoneA}, {diffNetB, diffZoneB}} {
		k := contivbpfCbTnetKey{Prefixlen: 32 + uint32(subnet.Bits()), Zone: n.zone, Addr: ip4(subnet.Addr())}
		if err := objs.CbTenantNets.Put(&k, &contivbpfCbTnet{Net: n.key}); err != nil {
			t.Fatal(err)
		}
		w.model.SetTenantNet(n.zone, subnet)
	}
	w.model.SetHostAddr(hostIP)
	w.model.SetPeer(netip.MustParseAddr(testVTEP))
}

// comparePeerFlows compares the peer flow records (keys, states, notes) with the model's.
func (w *diffWorld) comparePeerFlows() []string {
	want := w.model.PeerFlows()
	var diffs []string
	var k contivbpfCbPeerFlowKey
	var v contivbpfCbPeerFlow
	n := 0
	it := w.objs.CbPeerFlows.Iterate()
	for it.Next(&k, &v) {
		n++
		fk := refmodel.FlowKey{Zone: k.Zone, Kind: refmodel.KindNodePort, Src: addrFrom(k.Saddr), Dst: addrFrom(k.Daddr), Sport: hport(k.Sport), Dport: hport(k.Dport), Proto: k.Proto}
		m, ok := want[fk]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("peer flow %+v not in the model", fk))
		case m.State != v.State || m.TCPAck != v.TcpAck:
			diffs = append(diffs, fmt.Sprintf("peer flow %+v: state %d note %#x, model %d %#x", fk, v.State, v.TcpAck, m.State, m.TCPAck))
		}
	}
	if err := it.Err(); err != nil {
		w.t.Fatal(err)
	}
	if n != len(want) {
		diffs = append(diffs, fmt.Sprintf("%d peer flows, model %d", n, len(want)))
	}
	return diffs
}

// tallyPath counts the outcome of a path's packet.
func (w *diffWorld) tallyPath(s diffStep, o outcome) {
	r := o.reason
	if o.pass {
		r = "pass"
	}
	w.tally[s.path+"_"+r]++
}

// pathPkt is a packet of the peer host, an outside client or their endpoints: half of
// them answer (or carry on) a recent one.
func (g *diffGen) pathPkt() diffStep {
	if len(g.recentPath) > 0 && g.r.IntN(2) == 0 {
		if s, ok := g.pathReply(); ok {
			g.rememberPath(s)
			return s
		}
	}
	s := diffStep{kind: "pkt", ipid: uint16(1 + g.r.IntN(3)), sport: []uint16{40000, 40001, 61000}[g.r.IntN(3)], proto: 17}
	if g.r.IntN(5) < 3 {
		s.proto = 6
		s.flags = []uint8{0x02, 0x02, 0x12, 0x10, 0x11, 0x04, 0x18}[g.r.IntN(7)]
	}
	switch n := g.r.IntN(20); {
	case n < 9:
		// From the peer host's own address: to a local endpoint of either tenant, now and
		// then to a remote one (no way) or as what the path does not take.
		s.path, s.to, s.dport = "peer", []int{0, 1, 4}[g.r.IntN(3)], []uint16{8080, 53, 443}[g.r.IntN(3)]
		switch g.r.IntN(12) {
		case 0:
			s.to = 2
		case 1:
			s.proto, s.flags, s.sport, s.dport = 1, 8, 7, 7 // an echo request: no ports
		case 2:
			s.frag = refmodel.FragFirst
		}
	case n < 18:
		// (A client claiming a tenant address one time in four.)
		s.path, s.client, s.dport = "np", []int{0, 1, 0, 1, 0, 1, 2, 3}[g.r.IntN(8)], diffNodePortPort
	case n < 19:
		// A local endpoint's packet to the peer host's address, of no flow it started.
		s.path, s.from, s.dport = "topeer", []int{0, 1, 4}[g.r.IntN(3)], []uint16{8080, 40000}[g.r.IntN(2)]
	default:
		// A local endpoint's packet to an outside client, of no node port flow.
		s.path, s.from, s.client, s.sport, s.dport = "npreply", g.r.IntN(2), g.r.IntN(2), 8080, 40000
	}
	g.rememberPath(s)
	return s
}

// pathReply answers a recent path packet, or carries its flow on in the same direction.
func (g *diffGen) pathReply() (diffStep, bool) {
	r := g.recentPath[g.r.IntN(len(g.recentPath))]
	if r.proto != 6 && r.proto != 17 || r.frag != refmodel.FragNone {
		return diffStep{}, false
	}
	s := r
	s.ipid = uint16(1 + g.r.IntN(3))
	if g.r.IntN(3) == 0 {
		// The same direction again (an ACK, data, a FIN or a RST: a client's, blind or not).
		if s.proto == 6 {
			s.flags = []uint8{0x10, 0x18, 0x11, 0x04, 0x14}[g.r.IntN(5)]
		}
		return s, true
	}
	s.sport, s.dport = r.dport, r.sport
	switch r.path {
	case "peer":
		s.path, s.from = "topeer", r.to
	case "topeer":
		s.path, s.to = "peer", r.from
	case "np":
		// (A client claiming a tenant address gets no answer: that address is an
		// endpoint's, the path between endpoints.)
		if len(g.backends) == 0 || r.client >= 2 {
			return diffStep{}, false
		}
		s.path, s.from, s.sport = "npreply", g.backends[g.r.IntN(len(g.backends))], 8080
	case "npreply":
		s.path, s.dport = "np", diffNodePortPort
	}
	if s.path == "peer" && !g.eps[s.to].local || s.path == "topeer" && !g.eps[s.from].local {
		return diffStep{}, false
	}
	if s.proto == 6 {
		// (A bare SYN too: a new flow on the reverse tuple, nobody's reply.)
		s.flags = []uint8{0x12, 0x12, 0x10, 0x11, 0x04, 0x18, 0x02}[g.r.IntN(7)]
	}
	return s, true
}

// rememberPath keeps the last 8 path packets for replies.
func (g *diffGen) rememberPath(s diffStep) {
	if len(g.recentPath) == 8 {
		g.recentPath = g.recentPath[1:]
	}
	g.recentPath = append(g.recentPath, s)
}

// TestDifferentialNodePortPeerHost is the differential test with node ports, the peer
// host's own address and outside clients (issue 33, holes 1, 2 and 4 and the node port
// window): a peer host's packets judged by the destination's in-rules and NetworkPolicy,
// node port flows by the backend's NetworkPolicy, clients claiming a tenant address
// dropped, the client's blind FIN or RST dropped, mixed with every other step.
func TestDifferentialNodePortPeerHost(t *testing.T) {
	testroot.Need(t)
	runDifferential(t, diffNodePort, envInt("CONTIVBPF_DIFF_SEQS", 30), envInt("CONTIVBPF_DIFF_LEN", 150))
}

// TestDifferentialNodePortWindow: the window's edges on a node port flow (the client's
// RST one step past the backend's noted acknowledgment and its FIN at the close window's
// end are drop_nodeport_blind; a RST a byte inside closes) and on a peer host's flow to a
// tracked endpoint (b, group 10 with a rule: the peer's RST one step out is blind, moves
// neither the entry nor the peer flow record; one inside closes both), replayed on the
// datapath and the model (the random sequences draw such segments too).
func TestDifferentialNodePortWindow(t *testing.T) {
	testroot.Need(t)
	const step, win = refmodel.TCPNoteStep, refmodel.TCPCloseWindow
	tcp := func(path string, from, to int, sport, dport uint16, flags uint8, seq, ack uint32) diffStep {
		return diffStep{kind: "pkt", path: path, from: from, to: to, proto: 6, sport: sport, dport: dport, flags: flags, seq: seq, ack: ack, ipid: 1}
	}
	np := func(flags uint8, seq, ack uint32) diffStep {
		return tcp("np", 0, 0, 41000, diffNodePortPort, flags, seq, ack)
	}
	peer := func(flags uint8, seq, ack uint32) diffStep { return tcp("peer", 0, 1, 42000, 8080, flags, seq, ack) }
	steps := []diffStep{
		{kind: "svc", backend: []int{0}},
		np(0x02, 1000, 0), tcp("npreply", 0, 0, 8080, 41000, 0x12, 9000, 1001), np(0x10, 1001, 9001),
		np(0x04, 1001+step, 0), np(0x11, 1001+win, 9001), np(0x04, 1001+step-1, 0), tcp("npreply", 0, 0, 8080, 41000, 0x10, 9001, 1001),
		{kind: "policy", rules: []dataplane.PolicySet{{EPGID: 10, Rules: []dataplane.PolicyRule{{ID: "all", Priority: 1, Ingress: true, Action: dataplane.ActionAllow}}}}},
		peer(0x02, 5000, 0), tcp("topeer", 1, 0, 8080, 42000, 0x12, 7000, 5001), peer(0x10, 5001, 7001),
		peer(0x04, 5001+step, 0), peer(0x10, 5001, 7001), peer(0x04, 5001+step-1, 0), tcp("topeer", 1, 0, 8080, 42000, 0x10, 7001, 5001),
	}
	tally := map[string]int{}
	if at, diff := replayTally(t, newDiffRig(t, diffNodePort), steps, tally); at >= 0 {
		t.Fatalf("step %d (%v): %s", at, steps[at], diff)
	}
	if tally["np_drop_nodeport_blind"] != 2 || tally["np_pass"] != 3 || tally["peer_pass"] != 5 {
		t.Errorf("outcomes %v, want 2 blind node port segments dropped, 3 passed, 5 of the peer's passed", tally)
	}
}
