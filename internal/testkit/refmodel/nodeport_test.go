package refmodel

import (
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

var (
	mPeer   = netip.MustParseAddr("192.168.0.2")  // a peer host (its VTEP)
	mHost   = netip.MustParseAddr("192.168.0.1")  // this host's address
	mClient = netip.MustParseAddr("198.51.100.7") // a client on the wire
)

func npKind(k FlowKey) FlowKey { k.Kind = KindNodePort; return k }

func onPath(p *ModelPacket, path Path) *ModelPacket {
	p.Path = path
	p.FromLocal = path == PathToOutside
	return p
}

func withSeq(p *ModelPacket, seq, ack uint32) *ModelPacket { p.SeqNum, p.AckNum = seq, ack; return p }

// npSetup: zone 1's network 10.0.0.0/24 holds mB (group 2, local, slot 5); its in-rules
// take TCP 8080 and nothing else; service mVIP:80 → mB:8080 at node port 30080.
func npSetup(m *Model) {
	m.SetEndpoint(1, mB, 2)
	m.SetSlot(1, mB, 5)
	m.SetPolicy([]dataplane.PolicySet{{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "deny-in", Priority: 1, Ingress: true, Action: dataplane.ActionDeny},
		{ID: "web", Priority: 10, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
	}}})
	m.SetService(ModelService{ID: 1, Zone: 1, VIP: mVIP, Port: 80, Proto: 6, TargetPort: 8080, Backends: []netip.Addr{mB}})
	m.SetNodePort(ModelNodePort{Port: 30080, Proto: 6, Zone: 1, VIP: mVIP, SvcPort: 80})
	m.SetTenantNet(1, netip.MustParsePrefix("10.0.0.0/24"))
	m.SetHostAddr(mHost)
	m.SetPeer(mPeer)
}

// TestModelNodePortPeerHost: the model's paths of issue 33's holes 1, 2 and 4 and the node
// port window (Path), as docs/host-routing.md "Node ports" states them.
func TestModelNodePortPeerHost(t *testing.T) {
	const in = ownerIn | 5
	wantOwner := func(k FlowKey, owner uint16) func(*testing.T, *Model) {
		return func(t *testing.T, m *Model) {
			t.Helper()
			if e, ok := m.Lookup(k); !ok || e.Owner != owner {
				t.Fatalf("entry at %+v = %+v (found %v), want owner %#x", k, e, ok, owner)
			}
		}
	}
	peerState := func(k FlowKey, state uint8) func(*testing.T, *Model) {
		return func(t *testing.T, m *Model) {
			t.Helper()
			if f, ok := m.PeerFlows()[k]; !ok || f.State != state {
				t.Fatalf("peer flow %+v = %+v (found %v), want state %d", k, f, ok, state)
			}
		}
	}
	pk := npKind(fk(1, mPeer, 61000, mB, 8080, 6))
	runScenarios(t, []mscenario{
		{
			name:  "peer host judged by the destination's in-rules",
			setup: npSetup,
			steps: []mstep{
				{name: "denied port", pkt: onPath(udpPkt(1, mPeer, 61000, mB, 53), PathPeerHost), want: dropPol},
				{name: "allowed, node port kind, opened to the receiver", pkt: onPath(tcpPkt(1, mPeer, 61000, mB, 8080, "S"), PathPeerHost), want: passT,
					check: wantOwner(pk, in)},
				{name: "not the tenant's own kind", check: wantNone(fk(1, mPeer, 61000, mB, 8080, 6))},
				{name: "the reply goes back", pkt: onPath(withSeq(tcpPkt(1, mB, 8080, mPeer, 61000, "SA"), 9000, 1), PathToOutside), want: passT,
					check: peerState(pk, CTEstablished)},
				{name: "a blind RST moves nothing", pkt: onPath(withSeq(tcpPkt(1, mPeer, 61000, mB, 8080, "R"), 1+TCPRSTWindow, 0), PathPeerHost), want: passT,
					check: peerState(pk, CTEstablished)},
				{name: "a RST inside closes", pkt: onPath(withSeq(tcpPkt(1, mPeer, 61000, mB, 8080, "R"), 1, 0), PathPeerHost), want: passT,
					check: peerState(pk, CTClosing)},
				{name: "no peer flow: no way out", pkt: onPath(tcpPkt(1, mB, 8080, mPeer, 61001, "SA"), PathToOutside), want: ModelResult{Reason: DropToGateway}},
				{name: "no ports", pkt: onPath(icmpPkt(1, mPeer, mB, 8, 1), PathPeerHost), want: ModelResult{Reason: DropOverlaySpoof}},
				{name: "no local endpoint", pkt: onPath(tcpPkt(1, mPeer, 61000, mC, 8080, "S"), PathPeerHost), want: ModelResult{Reason: DropUnknownDst}},
				{name: "NetworkPolicy", do: func(m *Model) {
					m.SetPodPolicy(1, dataplane.PodPolicy{IP: mB, IngressIsolated: true})
				}, pkt: onPath(tcpPkt(1, mPeer, 61002, mB, 8080, "S"), PathPeerHost), want: ModelResult{Reason: DropNetpol, Tracked: true}},
			},
		},
		{
			name:  "node port client",
			setup: npSetup,
			steps: []mstep{
				{name: "a tenant address from the wire", pkt: onPath(tcpPkt(0, mC, 5555, mHost, 30080, "S"), PathNodePort), want: ModelResult{Reason: DropNodePortInternalSrc},
					check: wantEntries(0)},
				{name: "balanced", pkt: onPath(withSeq(tcpPkt(0, mClient, 5555, mHost, 30080, "S"), 1000, 0), PathNodePort),
					want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mB, 8080)}, check: wantOwner(npKind(fk(1, mClient, 5555, mB, 8080, 6)), in)},
				{name: "the backend's reply leaves from the node port", pkt: onPath(withSeq(tcpPkt(1, mB, 8080, mClient, 5555, "SA"), 9000, 1001), PathToOutside),
					want: ModelResult{Pass: true, Tracked: true, SNAT: ap(mHost, 30080)}},
				{name: "a blind RST is dropped", pkt: onPath(withSeq(tcpPkt(0, mClient, 5555, mHost, 30080, "R"), 1001+TCPRSTWindow, 0), PathNodePort),
					want: ModelResult{Reason: DropNodePortBlind}, check: wantState(npKind(fk(1, mClient, 5555, mB, 8080, 6)), CTEstablished)},
				{name: "one inside closes", pkt: onPath(withSeq(tcpPkt(0, mClient, 5555, mHost, 30080, "R"), 1001, 0), PathNodePort),
					want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mB, 8080)}, check: wantState(npKind(fk(1, mClient, 5555, mB, 8080, 6)), CTClosing)},
				{name: "NetworkPolicy of the backend", do: func(m *Model) {
					m.SetPodPolicy(1, dataplane.PodPolicy{IP: mB, IngressIsolated: true})
				}, pkt: onPath(tcpPkt(0, mClient, 5556, mHost, 30080, "S"), PathNodePort), want: ModelResult{Reason: DropNetpol, Tracked: true}},
				{name: "another port is the host's", pkt: onPath(tcpPkt(0, mClient, 5556, mHost, 30081, "S"), PathNodePort), want: ModelResult{Host: true}},
			},
		},
	})
}
