package refmodel

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Addresses and groups of the model scenarios.
var (
	mA    = netip.MustParseAddr("10.0.0.1") // group 1 (client)
	mB    = netip.MustParseAddr("10.0.0.2") // group 2 (server)
	mC    = netip.MustParseAddr("10.0.0.3")
	mDNS  = netip.MustParseAddr("10.0.0.53")
	mVIP  = netip.MustParseAddr("10.96.0.10")
	mBE1  = netip.MustParseAddr("10.0.1.1")
	mBE2  = netip.MustParseAddr("10.0.1.2")
	mVIP2 = netip.MustParseAddr("10.96.0.20")
)

// mstep is one step of a scenario: an optional state change, an optional packet with its
// expected result, and optional checks of the table afterwards.
type mstep struct {
	name  string
	do    func(m *Model)
	pkt   *ModelPacket
	want  ModelResult
	check func(t *testing.T, m *Model)
}

type mscenario struct {
	name     string
	capacity int // 0: 1000
	setup    func(m *Model)
	steps    []mstep
}

func tcpPkt(zone uint32, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags string) *ModelPacket {
	p := &ModelPacket{Zone: zone, Src: src, Dst: dst, Proto: 6, Sport: sport, Dport: dport}
	for _, f := range flags {
		switch f {
		case 'S':
			p.SYN = true
		case 'A':
			p.ACK = true
		case 'F':
			p.FIN = true
		case 'R':
			p.RST = true
		}
	}
	return p
}

func udpPkt(zone uint32, src netip.Addr, sport uint16, dst netip.Addr, dport uint16) *ModelPacket {
	return &ModelPacket{Zone: zone, Src: src, Dst: dst, Proto: 17, Sport: sport, Dport: dport}
}

func icmpPkt(zone uint32, src, dst netip.Addr, typ uint8, id uint16) *ModelPacket {
	p := &ModelPacket{Zone: zone, Src: src, Dst: dst, Proto: 1, ICMPType: typ}
	if typ == 0 || typ == 8 {
		p.Sport, p.Dport = id, id
	}
	return p
}

func local(p *ModelPacket) *ModelPacket { p.FromLocal = true; return p }

func frag(p *ModelPacket, k FragKind, id uint16) *ModelPacket {
	p.Frag, p.IPID = k, id
	if k == FragLater {
		p.Sport, p.Dport = 0, 0
	}
	return p
}

func fk(zone uint32, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, proto uint8) FlowKey {
	return FlowKey{Zone: zone, Src: src, Dst: dst, Sport: sport, Dport: dport, Proto: proto}
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

var (
	passT   = ModelResult{Pass: true, Tracked: true}
	passU   = ModelResult{Pass: true}
	dropPol = ModelResult{Reason: DropPolicy, Tracked: true}
	dropFul = ModelResult{Reason: DropCTFull, Tracked: true}
)

func wantState(k FlowKey, state uint8) func(*testing.T, *Model) {
	return func(t *testing.T, m *Model) {
		t.Helper()
		e, ok := m.Lookup(k)
		if !ok {
			t.Fatalf("no entry at %+v", k)
		}
		if e.State != state || !e.Allowed || e.SVC {
			t.Fatalf("entry at %+v = %+v, want state %d allowed", k, e, state)
		}
	}
}

func wantNone(k FlowKey) func(*testing.T, *Model) {
	return func(t *testing.T, m *Model) {
		t.Helper()
		if e, ok := m.Lookup(k); ok {
			t.Fatalf("entry at %+v = %+v, want none", k, e)
		}
	}
}

func wantEntries(n int) func(*testing.T, *Model) {
	return func(t *testing.T, m *Model) {
		t.Helper()
		if got := m.Entries(); got != n {
			t.Fatalf("Entries() = %d, want %d (keys %+v)", got, n, m.Keys())
		}
	}
}

func wantEntry(k FlowKey, want ModelEntry) func(*testing.T, *Model) {
	return func(t *testing.T, m *Model) {
		t.Helper()
		e, ok := m.Lookup(k)
		if !ok || e != want {
			t.Fatalf("entry at %+v = %+v (%v), want %+v", k, e, ok, want)
		}
	}
}

func all(fs ...func(*testing.T, *Model)) func(*testing.T, *Model) {
	return func(t *testing.T, m *Model) {
		t.Helper()
		for _, f := range fs {
			f(t, m)
		}
	}
}

// contivWeb is Contiv's pattern on group 2: deny TCP connection setup, allow port 80 from
// group 1.
func contivWeb() dataplane.PolicySet {
	return dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-80", Priority: 10, Ingress: true, RemoteEPG: 1, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
	}}
}

// denyTCPIn is group 1 refusing every incoming TCP connection.
func denyTCPIn() dataplane.PolicySet {
	return dataplane.PolicySet{EPGID: 1, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp-in", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
	}}
}

func webSetup(m *Model) {
	m.SetEndpoint(1, mA, 1)
	m.SetEndpoint(1, mB, 2)
	m.SetPolicy([]dataplane.PolicySet{contivWeb(), denyTCPIn()})
}

func svcSetup(backends ...netip.Addr) func(m *Model) {
	return func(m *Model) {
		m.SetService(ModelService{ID: 7, Zone: 1, VIP: mVIP, Port: 80, Proto: 6, TargetPort: 8080, Backends: backends})
	}
}

func TestModelScenarios(t *testing.T) {
	k80 := fk(1, mA, 1000, mB, 80, 6)
	k81 := fk(1, mA, 1001, mB, 81, 6)
	dnsK := fk(1, mC, 40000, mDNS, 53, 17)
	svcK := fk(1, mC, 5000, mVIP, 80, 6)
	be1K := fk(1, mC, 5000, mBE1, 8080, 6)
	be2K := fk(1, mC, 5000, mBE2, 8080, 6)

	scenarios := []mscenario{
		{
			name:  "bare ACK judged as SYN",
			setup: webSetup,
			steps: []mstep{
				{name: "ACK to 22", pkt: tcpPkt(1, mA, 1000, mB, 22, "A"), want: dropPol, check: wantEntries(0)},
				{name: "SYN to 22", pkt: tcpPkt(1, mA, 1000, mB, 22, "S"), want: dropPol, check: wantEntries(0)},
				{name: "SYN to 80", pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT, check: wantState(k80, CTNew)},
				{name: "SYN retransmit", pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT, check: wantState(k80, CTNew)},
				{name: "SYN-ACK reply", pkt: tcpPkt(1, mB, 80, mA, 1000, "SA"), want: passT, check: all(wantState(k80, CTEstablished), wantEntries(1))},
				{name: "ACK", pkt: tcpPkt(1, mA, 1000, mB, 80, "A"), want: passT, check: wantState(k80, CTEstablished)},
				{name: "mid-stream ACK to 80 opens NEW", pkt: tcpPkt(1, mA, 2000, mB, 80, "A"), want: passT, check: wantState(fk(1, mA, 2000, mB, 80, 6), CTNew)},
				{name: "forward ACK does not establish", pkt: tcpPkt(1, mA, 2000, mB, 80, "A"), want: passT, check: wantState(fk(1, mA, 2000, mB, 80, 6), CTNew)},
				{name: "FIN without entry judged, no entry", pkt: tcpPkt(1, mA, 3000, mB, 22, "FA"), want: dropPol, check: wantEntries(2)},
				{name: "FIN without entry allowed, no entry", pkt: tcpPkt(1, mA, 3000, mB, 80, "FA"), want: passT, check: wantEntries(2)},
				{name: "untracked pair", pkt: tcpPkt(1, mC, 1, mDNS, 2, "S"), want: passU, check: wantEntries(2)},
			},
		},
		{
			name: "overlapping zones share nothing",
			setup: func(m *Model) {
				for _, z := range []uint32{1, 2} {
					m.SetEndpoint(z, mA, 1)
					m.SetEndpoint(z, mB, 3)
				}
				m.SetPolicy([]dataplane.PolicySet{denyTCPIn()})
			},
			steps: []mstep{
				{name: "zone 1 SYN", pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT, check: wantState(k80, CTNew)},
				{name: "zone 2 reply is an opening", pkt: tcpPkt(2, mB, 80, mA, 1000, "SA"), want: dropPol, check: all(wantState(k80, CTNew), wantNone(fk(2, mA, 1000, mB, 80, 6)), wantEntries(1))},
				{name: "zone 1 reply", pkt: tcpPkt(1, mB, 80, mA, 1000, "SA"), want: passT, check: wantState(k80, CTEstablished)},
				{name: "zone 2 SYN own entry", pkt: tcpPkt(2, mA, 1000, mB, 80, "S"), want: passT, check: all(wantState(fk(2, mA, 1000, mB, 80, 6), CTNew), wantState(k80, CTEstablished))},
			},
		},
		{
			name: "reply allowed when only the replying side has rules",
			setup: func(m *Model) {
				m.SetEndpoint(1, mC, 5)
				m.SetPolicy([]dataplane.PolicySet{{EPGID: 5, Rules: []dataplane.PolicyRule{
					{ID: "deny-udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionDeny},
				}}})
			},
			steps: []mstep{
				{name: "query", pkt: udpPkt(1, mC, 40000, mDNS, 53), want: passT, check: wantState(dnsK, CTNew)},
				{name: "answer", pkt: udpPkt(1, mDNS, 53, mC, 40000), want: passT, check: wantState(dnsK, CTEstablished)},
				{name: "unsolicited", pkt: udpPkt(1, mDNS, 53, mC, 40001), want: dropPol, check: wantEntries(1)},
				{name: "expired answer", do: func(m *Model) { m.Advance(61 * time.Second) }, pkt: udpPkt(1, mDNS, 53, mC, 40000), want: dropPol},
			},
		},
		{
			name:  "FIN closing expiry then re-judged",
			setup: webSetup,
			steps: []mstep{
				{pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT},
				{pkt: tcpPkt(1, mB, 80, mA, 1000, "SA"), want: passT},
				{name: "FIN", pkt: tcpPkt(1, mB, 80, mA, 1000, "FA"), want: passT, check: wantState(k80, CTClosing)},
				{name: "ACK at 10 s still live", do: func(m *Model) { m.Advance(10 * time.Second) }, pkt: tcpPkt(1, mB, 80, mA, 1000, "A"), want: passT, check: wantState(k80, CTClosing)},
				{name: "just expired: server ACK is an opening to group 1", do: func(m *Model) { m.Advance(10*time.Second + 1) }, pkt: tcpPkt(1, mB, 80, mA, 1000, "A"), want: dropPol, check: wantEntries(1)},
				{name: "client ACK re-opens NEW", pkt: tcpPkt(1, mA, 1000, mB, 80, "A"), want: passT, check: all(wantState(k80, CTNew), wantEntries(1))},
			},
		},
		{
			name:  "RST then policy change then SYN re-judged",
			setup: webSetup,
			steps: []mstep{
				{pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT},
				{pkt: tcpPkt(1, mB, 80, mA, 1000, "SA"), want: passT},
				{name: "RST", pkt: tcpPkt(1, mA, 1000, mB, 80, "R"), want: passT, check: wantState(k80, CTClosing)},
				{name: "SYN reopens", pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT, check: wantState(k80, CTNew)},
				{pkt: tcpPkt(1, mA, 1000, mB, 80, "R"), want: passT, check: wantState(k80, CTClosing)},
				{
					name: "SYN after deny 80",
					do: func(m *Model) {
						web := contivWeb()
						web.Rules = append(web.Rules, dataplane.PolicyRule{ID: "deny-80", Priority: 20, Ingress: true, Proto: 6, Port: 80, Action: dataplane.ActionDeny})
						m.SetPolicy([]dataplane.PolicySet{web, denyTCPIn()})
					},
					pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: dropPol, check: all(wantNone(k80), wantEntries(0)),
				},
			},
		},
		{
			name:  "epoch bump cuts denied flows, keeps allowed",
			setup: webSetup,
			steps: []mstep{
				{do: func(m *Model) {
					web := contivWeb()
					web.Rules = append(web.Rules, dataplane.PolicyRule{ID: "allow-81", Priority: 10, Ingress: true, RemoteEPG: 1, Proto: 6, Port: 81, Action: dataplane.ActionAllow})
					m.SetPolicy([]dataplane.PolicySet{web, denyTCPIn()})
				}, pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT},
				{pkt: tcpPkt(1, mB, 80, mA, 1000, "SA"), want: passT},
				{pkt: tcpPkt(1, mA, 1001, mB, 81, "S"), want: passT},
				{pkt: tcpPkt(1, mB, 81, mA, 1001, "SA"), want: passT, check: all(wantState(k80, CTEstablished), wantState(k81, CTEstablished))},
				{
					name: "80 still allowed",
					do:   func(m *Model) { m.SetPolicy([]dataplane.PolicySet{contivWeb(), denyTCPIn()}) },
					pkt:  tcpPkt(1, mB, 80, mA, 1000, "A"), want: passT,
					check: func(t *testing.T, m *Model) {
						if e, _ := m.Lookup(k80); e.Epoch != m.Epoch() || e.State != CTEstablished {
							t.Fatalf("entry %+v, epoch %d", e, m.Epoch())
						}
					},
				},
				{name: "81 cut (reply direction, judged in original orientation)", pkt: tcpPkt(1, mB, 81, mA, 1001, "A"), want: dropPol, check: all(wantNone(k81), wantEntries(1))},
				{name: "81 stays cut", pkt: tcpPkt(1, mA, 1001, mB, 81, "A"), want: dropPol},
				{name: "deny-all on group 2", do: func(m *Model) { m.SetDenyAll(2, true) }, pkt: tcpPkt(1, mA, 1000, mB, 80, "A"), want: dropPol, check: wantEntries(0)},
				{name: "deny-all off", do: func(m *Model) { m.SetDenyAll(2, false) }, pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT},
			},
		},
		{
			name:     "capacity",
			capacity: 2,
			setup: func(m *Model) {
				m.SetEndpoint(1, mC, 5)
				m.SetPolicy([]dataplane.PolicySet{{EPGID: 5, Rules: []dataplane.PolicyRule{
					{ID: "deny-udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionDeny},
				}}})
			},
			steps: []mstep{
				{pkt: udpPkt(1, mC, 40000, mDNS, 53), want: passT},
				{pkt: udpPkt(1, mC, 40001, mDNS, 53), want: passT, check: wantEntries(2)},
				{name: "third flow", pkt: udpPkt(1, mC, 40002, mDNS, 53), want: dropFul, check: wantEntries(2)},
				{name: "TCP SYN", pkt: tcpPkt(1, mC, 40002, mDNS, 53, "S"), want: dropFul, check: wantEntries(2)},
				{name: "established keeps passing", pkt: udpPkt(1, mDNS, 53, mC, 40000), want: passT, check: wantState(dnsK, CTEstablished)},
				{pkt: udpPkt(1, mC, 40000, mDNS, 53), want: passT},
				{name: "expired entry still counts", do: func(m *Model) { m.Advance(61 * time.Second) }, pkt: udpPkt(1, mC, 40002, mDNS, 53), want: dropFul},
				{name: "overwriting an expired key works", pkt: udpPkt(1, mC, 40001, mDNS, 53), want: passT, check: wantState(fk(1, mC, 40001, mDNS, 53, 17), CTNew)},
				{name: "after GC", do: func(m *Model) {
					if n := m.GC(); n != 1 {
						panic("GC")
					}
				}, pkt: udpPkt(1, mC, 40002, mDNS, 53), want: passT, check: wantEntries(2)},
			},
		},
		{
			name:  "GC",
			setup: webSetup,
			steps: []mstep{
				{pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT},
				{pkt: tcpPkt(1, mB, 80, mA, 1000, "SA"), want: passT},
				{pkt: tcpPkt(1, mA, 2000, mB, 80, "S"), want: passT},
				{pkt: &ModelPacket{Zone: 1, Src: mA, Dst: mB, Proto: 47}, want: passT},
				{pkt: icmpPkt(1, mA, mB, 8, 9), want: passT, check: wantEntries(4)},
				{name: "echo reply", pkt: icmpPkt(1, mB, mA, 0, 9), want: passT, check: wantState(fk(1, mA, 9, mB, 9, 1), CTEstablished)},
				{name: "unsolicited ICMP judged, no entry", pkt: icmpPkt(1, mB, mA, 3, 0), want: passT, check: wantEntries(4)},
				{
					name: "at 60 s nothing expired",
					do:   func(m *Model) { m.Advance(60 * time.Second) },
					check: func(t *testing.T, m *Model) {
						if n := m.GC(); n != 0 {
							t.Fatalf("GC = %d", n)
						}
					},
				},
				{
					name: "after 60 s only the established TCP flow stays",
					do:   func(m *Model) { m.Advance(1) },
					check: func(t *testing.T, m *Model) {
						if n := m.GC(); n != 3 {
							t.Fatalf("GC = %d, want 3", n)
						}
						wantEntries(1)(t, m)
						wantState(k80, CTEstablished)(t, m)
					},
				},
				{
					name: "after 6 h it goes too",
					do:   func(m *Model) { m.Advance(6*time.Hour + time.Second) },
					check: func(t *testing.T, m *Model) {
						if n := m.GC(); n != 1 || m.Entries() != 0 {
							t.Fatalf("GC = %d, entries %d", n, m.Entries())
						}
					},
				},
			},
		},
		{
			name: "DeleteEndpoint flush",
			setup: func(m *Model) {
				webSetup(m)
				m.SetEndpoint(2, mA, 1)
				m.SetEndpoint(1, mC, 1)
			},
			steps: []mstep{
				{pkt: tcpPkt(1, mA, 1000, mB, 80, "S"), want: passT},
				{pkt: udpPkt(1, mB, 1, mA, 2), want: passT},
				{pkt: udpPkt(1, mC, 1, mB, 2), want: passT},
				{pkt: udpPkt(2, mA, 1, mB, 2), want: passT, check: wantEntries(4)},
				{
					name: "flush A in zone 1",
					do:   func(m *Model) { m.DeleteEndpoint(1, mA) },
					check: all(wantEntries(2), wantNone(k80), wantNone(fk(1, mB, 1, mA, 2, 17)),
						wantState(fk(1, mC, 1, mB, 2, 17), CTNew), wantState(fk(2, mA, 1, mB, 2, 17), CTNew)),
				},
			},
		},
		{
			// The client's kernel sees VIP:80 and backend:8080 as different peers: a direct
			// connection may reuse a just-closed service flow's backend-side tuple.
			name:  "direct connection reusing a closed service flow's tuple",
			setup: svcSetup(mBE1),
			steps: []mstep{
				{pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")), want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)}},
				{pkt: tcpPkt(1, mBE1, 8080, mC, 5000, "SA"), want: ModelResult{Pass: true, Tracked: true, SNAT: ap(mVIP, 80)}},
				{pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "R")), want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)}, check: wantState(be1K, CTClosing)},
				{name: "direct SYN drops the closed entry", pkt: local(tcpPkt(1, mC, 5000, mBE1, 8080, "S")), want: passU, check: wantEntries(1)},
				{name: "its reply keeps the backend's address", pkt: tcpPkt(1, mBE1, 8080, mC, 5000, "SA"), want: passU},
			},
		},
		{
			name:  "service DNAT, reply SNAT, re-balance, deletion",
			setup: svcSetup(mBE1, mBE2),
			steps: []mstep{
				{
					name: "SYN to VIP", pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")),
					want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)},
					check: all(wantEntries(2),
						wantEntry(svcK, ModelEntry{SVC: true, NAT: ap(mBE1, 8080), Expires: 60 * time.Second, SvcID: 7}),
						wantEntry(be1K, ModelEntry{State: CTNew, Allowed: true, DNAT: true, NAT: ap(mVIP, 80), Expires: 60 * time.Second})),
				},
				{
					name: "reply SNAT", pkt: tcpPkt(1, mBE1, 8080, mC, 5000, "SA"),
					want:  ModelResult{Pass: true, Tracked: true, SNAT: ap(mVIP, 80)},
					check: wantEntry(be1K, ModelEntry{State: CTEstablished, Allowed: true, DNAT: true, NAT: ap(mVIP, 80), Expires: 6 * time.Hour}),
				},
				{
					name: "ACK refreshes SVC entry", do: func(m *Model) { m.Advance(time.Minute) }, pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "A")),
					want:  ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)},
					check: wantEntry(svcK, ModelEntry{SVC: true, NAT: ap(mBE1, 8080), Expires: time.Minute + 6*time.Hour, SvcID: 7}),
				},
				{name: "not from local: no LB (a VIP is no endpoint)", pkt: tcpPkt(1, mC, 5000, mVIP, 80, "A"), want: ModelResult{Reason: DropUnknownDst}},
				{
					name: "backend removed: re-balance",
					do: func(m *Model) {
						svcSetup(mBE2)(m)
						m.Choose = func(c []netip.Addr) netip.Addr {
							if len(c) != 1 || c[0] != mBE2 {
								panic("cands")
							}
							return c[0]
						}
					},
					pkt:   local(tcpPkt(1, mC, 5000, mVIP, 80, "A")),
					want:  ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE2, 8080)},
					check: all(wantState(be2K, CTNew), wantEntry(svcK, ModelEntry{SVC: true, NAT: ap(mBE2, 8080), Expires: 2 * time.Minute, SvcID: 7})),
				},
				{
					name: "valid backend: Choose not called",
					do:   func(m *Model) { m.Choose = func([]netip.Addr) netip.Addr { panic("Choose") } },
					pkt:  local(tcpPkt(1, mC, 5000, mVIP, 80, "A")), want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE2, 8080)},
				},
				{
					name: "old backend's late reply still SNATed", pkt: tcpPkt(1, mBE1, 8080, mC, 5000, "A"),
					want: ModelResult{Pass: true, Tracked: true, SNAT: ap(mVIP, 80)},
				},
				{
					name: "service deleted: plain packet, SVC entry gone",
					do:   func(m *Model) { m.DeleteService(7) },
					pkt:  local(tcpPkt(1, mC, 5000, mVIP, 80, "A")), want: passU,
					check: all(wantNone(svcK), wantEntries(2)),
				},
			},
		},
		{
			name:  "service without backends",
			setup: svcSetup(),
			steps: []mstep{
				{pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")), want: ModelResult{Reason: RejectNoBackend}, check: wantEntries(0)},
				{name: "a segment that opens nothing is dropped", pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "SA")), want: ModelResult{Reason: DropNoBackend}, check: wantEntries(0)},
				{name: "other port is no service (a VIP is no endpoint)", pkt: local(tcpPkt(1, mC, 5000, mVIP, 81, "S")), want: ModelResult{Reason: DropUnknownDst}},
				{name: "live SVC entry, backends emptied", do: svcSetup(mBE1), pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")), want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)}},
				{do: svcSetup(), pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "A")), want: ModelResult{Reason: DropNoBackend}, check: wantEntries(2)},
			},
		},
		{
			name: "service flow denied by the backend's policy writes no SVC entry",
			setup: func(m *Model) {
				svcSetup(mBE1)(m)
				m.SetEndpoint(1, mBE1, 2)
				m.SetPolicy([]dataplane.PolicySet{contivWeb()})
			},
			steps: []mstep{
				{pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")), want: dropPol, check: wantEntries(0)},
			},
		},
		{
			name:     "service SVC insert into a full table",
			capacity: 1,
			setup:    svcSetup(mBE1),
			steps: []mstep{
				{pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")), want: dropFul, check: all(wantEntries(1), wantState(be1K, CTNew))},
			},
		},
		{
			name: "SVC entries are invisible to conntrack",
			setup: func(m *Model) {
				svcSetup(mBE1)(m)
				m.SetEndpoint(1, mC, 5)
				m.SetPolicy([]dataplane.PolicySet{{EPGID: 5, Rules: []dataplane.PolicyRule{
					{ID: "deny-vip-80", Priority: 1, Remote: netip.MustParsePrefix("10.96.0.0/16"), Proto: 6, Port: 80, Action: dataplane.ActionDeny},
				}}})
			},
			steps: []mstep{
				{name: "DNATed flow allowed", pkt: local(tcpPkt(1, mC, 5000, mVIP, 80, "S")), want: ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)}},
				{
					name: "non-local ACK to VIP: no endpoint, SVC entry untouched", pkt: tcpPkt(1, mC, 5000, mVIP, 80, "A"), want: ModelResult{Reason: DropUnknownDst},
					check: all(wantEntries(2), wantEntry(svcK, ModelEntry{SVC: true, NAT: ap(mBE1, 8080), Expires: time.Minute, SvcID: 7})),
				},
				{name: "non-local SYN to VIP: no endpoint, SVC entry untouched", pkt: tcpPkt(1, mC, 5000, mVIP, 80, "S"), want: ModelResult{Reason: DropUnknownDst}, check: wantEntries(2)},
			},
		},
		{
			name: "fragments",
			setup: func(m *Model) {
				webSetup(m)
				svcSetup(mBE1)(m)
			},
			steps: []mstep{
				{name: "first allowed", pkt: frag(udpPkt(1, mA, 1, mB, 53), FragFirst, 100), want: passT},
				{name: "later passes", pkt: frag(udpPkt(1, mA, 1, mB, 53), FragLater, 100), want: passT},
				{name: "later without first", pkt: frag(udpPkt(1, mA, 1, mB, 53), FragLater, 101), want: ModelResult{Reason: DropFragNoFirst, Tracked: true}},
				{name: "first denied", pkt: frag(tcpPkt(1, mA, 1, mB, 22, "S"), FragFirst, 102), want: dropPol},
				{name: "later of denied", pkt: frag(tcpPkt(1, mA, 1, mB, 22, ""), FragLater, 102), want: dropPol},
				{name: "later to VIP", pkt: local(frag(udpPkt(1, mC, 1, mVIP, 53), FragLater, 103)), want: ModelResult{Reason: DropFragToService}},
				{name: "later to VIP of other zone is fine", pkt: local(frag(udpPkt(2, mC, 1, mVIP, 53), FragLater, 103)), want: passU},
				{name: "untracked later passes", pkt: frag(udpPkt(1, mC, 1, mDNS, 53), FragLater, 104), want: passU},
				{name: "record expires after 30 s", do: func(m *Model) { m.Advance(30*time.Second + 1) }, pkt: frag(udpPkt(1, mA, 1, mB, 53), FragLater, 100), want: ModelResult{Reason: DropFragNoFirst, Tracked: true}},
			},
		},
	}
	runScenarios(t, scenarios)
}

// runScenarios runs each scenario on a model of its own.
func runScenarios(t *testing.T, scenarios []mscenario) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			capacity := sc.capacity
			if capacity == 0 {
				capacity = 1000
			}
			m := NewModel(capacity)
			if sc.setup != nil {
				sc.setup(m)
			}
			for i, st := range sc.steps {
				if st.do != nil {
					st.do(m)
				}
				if st.pkt != nil {
					if got := m.Packet(*st.pkt); got != st.want {
						t.Fatalf("step %d %q: Packet(%+v) = %+v, want %+v", i, st.name, *st.pkt, got, st.want)
					}
				}
				if st.check != nil {
					if !t.Run(fmt.Sprintf("step %d %s", i, st.name), func(t *testing.T) { st.check(t, m) }) {
						t.FailNow()
					}
				}
			}
		})
	}
}

// TestModelQuota: the per-endpoint conntrack quota (docs/conntrack.md "Per-endpoint
// quota"): entries count against the local sender's slot, or the receiver's; a new key is
// refused at the quota (before the table's capacity), established flows and reopenings
// of an owner's own keys are not; counts only grow until GC recounts; a service flow
// counts twice; a slot past 32767 is not counted; flows opened to an endpoint count apart.
func TestModelQuota(t *testing.T) {
	dropQuota := ModelResult{Reason: DropCTQuota, Tracked: true}
	m := NewModel(6)
	m.SetEndpoint(1, mA, 1)
	m.SetEndpoint(1, mB, 1)
	m.SetPolicy([]dataplane.PolicySet{{EPGID: 1, Rules: []dataplane.PolicyRule{{ID: "any", Priority: 1, Action: dataplane.ActionAllow}}}})
	m.SetSlot(1, mA, 5)
	m.SetSlot(1, mB, 6)
	m.SetCTQuota(2)
	step := 0
	send := func(p *ModelPacket, want ModelResult) {
		t.Helper()
		step++
		if got := m.Packet(*p); got != want {
			t.Fatalf("step %d: Packet(%+v) = %+v, want %+v", step, *p, got, want)
		}
	}
	count := func(slot, want uint32) {
		t.Helper()
		if got := m.CTCount(slot); got != want {
			t.Fatalf("after step %d: slot %d counts %d, want %d", step, slot, got, want)
		}
	}
	countIn := func(slot, want uint32) {
		t.Helper()
		if got := m.CTCountIn(slot); got != want {
			t.Fatalf("after step %d: slot %d counts %d flows opened to it, want %d", step, slot, got, want)
		}
	}
	owner := func(k FlowKey, want uint16) {
		t.Helper()
		if e, ok := m.Lookup(k); !ok || e.Owner != want {
			t.Fatalf("after step %d: entry at %+v = %+v (%v), want owner %d", step, k, e, ok, want)
		}
	}

	// A (local, slot 5) opens two flows to C: both are A's.
	send(local(udpPkt(1, mA, 1, mC, 53)), passT)
	send(local(udpPkt(1, mA, 2, mC, 53)), passT)
	owner(fk(1, mA, 1, mC, 53, 17), 5)
	count(5, 2)
	// At the quota: new keys are refused (a bare ACK too), no entry written.
	send(local(udpPkt(1, mA, 3, mC, 53)), dropQuota)
	send(local(tcpPkt(1, mA, 4, mC, 80, "A")), dropQuota)
	wantNone(fk(1, mA, 3, mC, 53, 17))(t, m)
	count(5, 2)
	// Its flows keep working, in both directions and after a policy change.
	send(local(udpPkt(1, mA, 1, mC, 53)), passT)
	send(udpPkt(1, mC, 53, mA, 1), passT)
	m.BumpEpoch()
	send(local(udpPkt(1, mA, 2, mC, 53)), passT)
	count(5, 2)
	// From outside, the local receiver's slot counts, apart: the flows opened to B (slot 6)
	// have a quota of their own, and filling it leaves B's own flows alone.
	send(udpPkt(1, mC, 7, mB, 53), passT)
	owner(fk(1, mC, 7, mB, 53, 17), 6|ownerIn)
	countIn(6, 1)
	count(6, 0)
	send(udpPkt(1, mC, 8, mB, 53), passT)
	send(udpPkt(1, mC, 10, mB, 53), dropQuota)
	countIn(6, 2)
	send(local(udpPkt(1, mB, 11, mC, 53)), passT)
	count(6, 1)
	// Expired entries still count until GC; reopening one's own key neither checks nor
	// counts (also at the quota).
	m.Advance(61 * time.Second)
	send(local(udpPkt(1, mA, 1, mC, 53)), passT)
	send(local(udpPkt(1, mA, 9, mC, 53)), dropQuota)
	count(5, 2)
	if n := m.GC(); n != 4 {
		t.Fatalf("GC deleted %d, want 4 (A's flow 2, B's three)", n)
	}
	count(5, 1)
	count(6, 0)
	countIn(6, 0)
	send(local(udpPkt(1, mA, 9, mC, 53)), passT)
	count(5, 2)

	// A deleted entry (policy deny on re-judge) counts until GC too.
	m.SetDenyAll(1, true)
	send(local(udpPkt(1, mA, 9, mC, 53)), dropPol)
	wantNone(fk(1, mA, 9, mC, 53, 17))(t, m)
	count(5, 2)
	m.GC()
	count(5, 1)
	m.SetDenyAll(1, false)

	// The quota is checked before the capacity (6 entries: A's one and B's five).
	m.SetCTQuota(0) // no quota: counting goes on
	for p := uint16(20); p < 25; p++ {
		send(local(udpPkt(1, mB, p, mC, 53)), passT)
	}
	count(6, 5)
	count(5, 1)
	send(local(udpPkt(1, mA, 30, mC, 53)), dropFul)
	m.SetCTQuota(1)
	send(local(udpPkt(1, mA, 30, mC, 53)), dropQuota)
	m.SetCTQuota(2)
	send(local(udpPkt(1, mA, 30, mC, 53)), dropFul)

	// A service flow holds two entries of its client's (the client→VIP one is never
	// refused): at a quota of 3 the client ends one past it.
	m = NewModel(100)
	m.SetSlot(1, mA, 5)
	svcSetup(mBE1)(m)
	m.SetCTQuota(3)
	send(local(tcpPkt(1, mA, 1000, mVIP, 80, "S")), ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)})
	owner(fk(1, mA, 1000, mVIP, 80, 6), 5)
	count(5, 2)
	send(local(tcpPkt(1, mA, 1001, mVIP, 80, "S")), ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)})
	count(5, 4)
	send(local(tcpPkt(1, mA, 1002, mVIP, 80, "S")), dropQuota)
	wantNone(fk(1, mA, 1002, mVIP, 80, 6))(t, m)
	count(5, 4)

	// A slot past 32767 is not counted (owner 0: the top bit marks flows opened to an
	// endpoint): never refused. A slot handed out starts at 0.
	m.SetSlot(1, mA, 0x8005)
	send(local(tcpPkt(1, mA, 1003, mVIP, 80, "S")), ModelResult{Pass: true, Tracked: true, DNAT: ap(mBE1, 8080)})
	owner(fk(1, mA, 1003, mVIP, 80, 6), 0)
	count(0x8005, 0)
	m.SetSlot(1, mA, 5)
	count(5, 0)
}
