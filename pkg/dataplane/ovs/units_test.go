package ovs

import (
	"fmt"
	"maps"
	"math/rand"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestScopedCompileMatchesFull changes the desired state at random, one driver-sized
// change at a time, and recompiles only the units each change touches (with the scopes
// the driver's Upsert/Delete methods use). After every change the installed flows must
// equal a full compile of the same state (with the same service ids), and a change the
// full compile refuses must be refused; a change taken back (undo: the switch refused
// the bundle) must restore the flows before it.
func TestScopedCompileMatchesFull(t *testing.T) {
	pl := testPipeline(t)
	for seed := int64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			host := dataplane.HostConfig{FwdMode: dataplane.FwdBridge}
			if seed%3 == 0 {
				host.FwdMode = dataplane.FwdRouting
			}
			g := newScopeGen(rng)
			st := dataplane.NewIndex()
			p := ports{endpoints: map[string]uint32{}, tunnel: 1, uplink: 2}
			ids := newIDs()
			c, err := pl.compile(st, host, p, ids)
			if err != nil {
				t.Fatal(err)
			}
			for step := 0; step < 200; step++ {
				next := st.Clone()
				name, scope := g.change(next)
				for id := range next.Endpoints {
					if p.endpoints[id] == 0 {
						p.endpoints[id] = uint32(100 + len(p.endpoints))
					}
				}
				dirty := scope(st, next)
				fullIDs := idTables{svc: maps.Clone(ids.svc), vrf: maps.Clone(ids.vrf)}
				want, wantErr := pl.compile(next, host, p, fullIDs)
				if dirty == nil {
					// Networks and peers: the driver compiles everything.
					if wantErr != nil {
						continue
					}
					c, ids, st = want, fullIDs, next
					continue
				}
				before := flowTexts(c)
				changes, undo, err := pl.recompile(c, next, host, p, ids.svc, dirty)
				svcs := []string{}
				for _, u := range dirty {
					if k, id := splitUnit(u); k == "svc" {
						svcs = append(svcs, id)
					}
				}
				if err != nil {
					releaseServiceIDs(ids.svc, c, svcs, st, st)
					if wantErr == nil {
						t.Fatalf("step %d %s: scoped compile refused what a full compile takes: %v", step, name, err)
					}
					if got := flowTexts(c); got != before {
						t.Fatalf("step %d %s: a refused change altered the flows", step, name)
					}
					continue
				}
				if wantErr != nil {
					t.Fatalf("step %d %s: full compile refuses (%v), scoped compile took it", step, name, wantErr)
				}
				applied := map[string]string{}
				for k, f := range mapFlows(before) {
					applied[k] = f
				}
				for _, ch := range changes {
					if ch.new == nil {
						delete(applied, ch.old.key())
					} else {
						applied[ch.new.key()] = ch.new.actionsText()
					}
				}
				if rng.Intn(8) == 0 {
					undo()
					releaseServiceIDs(ids.svc, c, svcs, st, next)
					if got := flowTexts(c); got != before {
						t.Fatalf("step %d %s: undo left\n%s\nwant\n%s", step, name, got, before)
					}
					continue
				}
				releaseServiceIDs(ids.svc, c, svcs, st, next)
				st = next
				if got, exp := flowTexts(c), flowTexts(want); got != exp {
					t.Fatalf("step %d %s (units %v): scoped compile differs from full:\n%s", step, name, dirty, lineDiff(got, exp))
				}
				if got := joinFlows(applied); got != flowTexts(want) {
					t.Fatalf("step %d %s: the reported changes do not lead to the full compile:\n%s", step, name, lineDiff(got, flowTexts(want)))
				}
			}
		})
	}
}

func flowTexts(c *compiled) string {
	var out []string
	for _, f := range c.list() {
		out = append(out, f.key()+" actions="+f.actionsText())
	}
	return strings.Join(out, "\n")
}

func mapFlows(text string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if k, a, ok := strings.Cut(l, " actions="); ok {
			m[k] = a
		}
	}
	return m
}

func joinFlows(m map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+" actions="+m[k])
	}
	return strings.Join(out, "\n")
}

// lineDiff lists lines only in got (+) or only in want (-).
func lineDiff(got, want string) string {
	g, w := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	var out []string
	for l := range g {
		if !w[l] {
			out = append(out, "+ "+l)
		}
	}
	for l := range w {
		if !g[l] {
			out = append(out, "- "+l)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// scopeGen makes random changes from small pools of ids and addresses, so objects
// collide: a local and a remote endpoint with one address, two services on one VIP,
// services whose backends are local endpoints (hairpin), invalid objects.
type scopeGen struct {
	rng *rand.Rand
}

func newScopeGen(rng *rand.Rand) *scopeGen { return &scopeGen{rng: rng} }

var genNets = []dataplane.Network{
	{ID: "a.t1", Encap: dataplane.EncapVXLAN, Tag: 100, Subnet: netip.MustParsePrefix("10.1.0.0/24"), Gateway: netip.MustParseAddr("10.1.0.254")},
	{ID: "b.t1", Encap: dataplane.EncapVLAN, Tag: 20, Subnet: netip.MustParsePrefix("10.2.0.0/24"), Gateway: netip.MustParseAddr("10.2.0.254")},
	{ID: "a.t2", Encap: dataplane.EncapVXLAN, Tag: 200, Subnet: netip.MustParsePrefix("10.1.0.0/24")},
}

func (g *scopeGen) addr(n dataplane.Network) netip.Addr {
	b := n.Subnet.Addr().As4()
	b[3] = byte(1 + g.rng.Intn(6))
	return netip.AddrFrom4(b)
}

func (g *scopeGen) net() dataplane.Network { return genNets[g.rng.Intn(len(genNets))] }

// change applies one random change to st and returns its name and the driver's scope
// for it.
func (g *scopeGen) change(st *dataplane.Index) (string, func(old, st *dataplane.Index) []string) {
	r := g.rng
	switch k := r.Intn(20); {
	case k == 0:
		n := g.net()
		if r.Intn(3) == 0 {
			delete(st.Networks, n.ID)
			return "delete network " + n.ID, everything
		}
		st.Networks[n.ID] = n
		return "network " + n.ID, everything
	case k == 1:
		h := fmt.Sprintf("h%d", r.Intn(3))
		if r.Intn(3) == 0 {
			delete(st.Peers, h)
			return "delete peer " + h, everything
		}
		st.Peers[h] = dataplane.Peer{Host: h, VTEP: netip.AddrFrom4([4]byte{192, 168, 1, byte(2 + r.Intn(3))})}
		return "peer " + h, everything
	case k <= 5:
		id := fmt.Sprintf("e%d", r.Intn(5))
		if r.Intn(4) == 0 {
			delete(st.Endpoints, id)
			return "delete endpoint " + id, endpointUnits(id)
		}
		n := g.net()
		ip := g.addr(n)
		st.Endpoints[id] = dataplane.Endpoint{ID: id, NetworkID: n.ID, IP: ip, MAC: dataplane.ContivMAC(ip),
			EPGID: uint16(r.Intn(3)), HostIfName: "v" + id, IfName: "eth0"}
		return "endpoint " + id, endpointUnits(id)
	case k <= 9:
		id := fmt.Sprintf("r%d", r.Intn(6))
		if r.Intn(4) == 0 {
			delete(st.RemoteEndpoints, id)
			return "delete remote " + id, units(unitRem(id))
		}
		n := g.net()
		ip := g.addr(n)
		h := r.Intn(3)
		mac := dataplane.ContivMAC(ip)
		if r.Intn(2) == 0 { // not the MAC a local endpoint with this address has
			mac = append(net.HardwareAddr{0x02, 0x03}, mac[2:]...)
		}
		rem := dataplane.RemoteEndpoint{ID: id, NetworkID: n.ID, IP: ip, MAC: mac, EPGID: uint16(r.Intn(3)),
			Host: fmt.Sprintf("h%d", h), VTEP: netip.AddrFrom4([4]byte{192, 168, 1, byte(2 + h)})}
		if r.Intn(10) == 0 {
			rem.VTEP = netip.Addr{} // invalid on VXLAN
		}
		st.RemoteEndpoints[id] = rem
		return "remote " + id, units(unitRem(id))
	case k <= 11:
		epg := uint16(1 + r.Intn(2))
		if r.Intn(4) == 0 {
			delete(st.Policies, epg)
			return fmt.Sprint("delete policy ", epg), units(unitPol(epg))
		}
		ps := dataplane.PolicySet{EPGID: epg}
		for i := 0; i < r.Intn(4); i++ {
			act := dataplane.ActionAllow
			if r.Intn(2) == 0 {
				act = dataplane.ActionDeny
			}
			if r.Intn(20) == 0 {
				act = "bogus"
			}
			ps.Rules = append(ps.Rules, dataplane.PolicyRule{ID: fmt.Sprint(i), Priority: r.Intn(5), Proto: 6, Port: uint16(80 + r.Intn(2)),
				RemoteEPG: uint16(r.Intn(3)), Ingress: r.Intn(2) == 0, Action: act})
		}
		st.Policies[epg] = ps
		return fmt.Sprint("policy ", epg), units(unitPol(epg))
	case k == 12:
		id := fmt.Sprintf("e%d", r.Intn(5))
		if r.Intn(3) == 0 {
			delete(st.PodPolicies, id)
			return "delete pod policy " + id, units(unitNetpol)
		}
		n := g.net()
		st.PodPolicies[id] = dataplane.PodPolicy{ID: id, NetworkID: n.ID, IP: g.addr(n), IngressIsolated: r.Intn(2) == 0, EgressIsolated: true,
			Egress: []dataplane.PodRule{{Remote: netip.MustParsePrefix("10.0.0.0/8"), Proto: 17, PortMin: 53, PortMax: 53}}}
		return "pod policy " + id, units(unitNetpol)
	default:
		id := fmt.Sprintf("s%d:t%d", r.Intn(5), 1+r.Intn(2))
		if r.Intn(4) == 0 {
			delete(st.Services, id)
			return "delete service " + id, serviceUnits(id)
		}
		tenant := id[strings.IndexByte(id, ':')+1:]
		n := genNets[0]
		if tenant == "t2" {
			n = genNets[2]
		}
		s := dataplane.Service{ID: id, VIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(1 + r.Intn(3))}),
			AffinityClientIP: r.Intn(3) == 0}
		for i := 0; i <= r.Intn(2); i++ {
			proto := uint8(6)
			if r.Intn(2) == 0 {
				proto = 17
			}
			if r.Intn(25) == 0 {
				proto = 1 // refused
			}
			s.Ports = append(s.Ports, dataplane.ServicePort{Proto: proto, Port: uint16(80 + r.Intn(2)), TargetPort: uint16(8080 + r.Intn(2))})
		}
		for i := 0; i < r.Intn(4); i++ {
			if b := g.addr(n); !slices.Contains(s.Backends, b) {
				s.Backends = append(s.Backends, b)
			}
		}
		if len(s.Backends) > 1 && r.Intn(3) == 0 {
			s.Draining = s.Backends[:1]
			s.Backends = s.Backends[1:]
		}
		st.Services[id] = s
		return "service " + id, serviceUnits(id)
	}
}

// everything is the scope of network and peer changes: the driver compiles it all.
func everything(*dataplane.Index, *dataplane.Index) []string { return nil }

// TestAllocID: a new key gets the smallest free id, a known key keeps its own, and the
// range is refused when full.
func TestAllocID(t *testing.T) {
	ids := map[string]uint32{"a": 1, "b": 2, "c": 4, "x": 70}
	if id, ok := allocID(ids, "b", 100); !ok || id != 2 {
		t.Errorf("known key: %d %v", id, ok)
	}
	for _, want := range []uint32{3, 5, 6} {
		if id, ok := allocID(ids, fmt.Sprint("n", want), 100); !ok || id != want {
			t.Errorf("new key: %d %v, want %d", id, ok, want)
		}
	}
	full := map[string]uint32{}
	for i := uint32(1); i <= 64; i++ {
		full[fmt.Sprint(i)] = i
	}
	if id, ok := allocID(full, "one more", 64); ok {
		t.Errorf("full range handed out %d", id)
	}
	if id, ok := allocID(full, "one more", 65); !ok || id != 65 {
		t.Errorf("last id: %d %v", id, ok)
	}
}

// TestMirroredRulesShareOneFlow: an ingress rule of group 1 (deny from 2) and an egress
// rule of group 2 (deny to 1) are one flow on the switch; removing one rule set must not
// delete the flow the other still needs.
func TestMirroredRulesShareOneFlow(t *testing.T) {
	pl := testPipeline(t)
	st := dataplane.NewIndex()
	st.Networks[vxNet.ID] = vxNet
	st.Policies[1] = dataplane.PolicySet{EPGID: 1, Rules: []dataplane.PolicyRule{{ID: "in", Priority: 5, Ingress: true, RemoteEPG: 2, Proto: 6, Port: 80, Action: dataplane.ActionDeny}}}
	st.Policies[2] = dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{{ID: "out", Priority: 5, RemoteEPG: 1, Proto: 6, Port: 80, Action: dataplane.ActionDeny}}}
	ids := newIDs()
	c, err := pl.compile(st, dataplane.HostConfig{}, testPorts, ids)
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := c.units[unitPol(1)][0].key(), c.units[unitPol(2)][0].key()
	if k1 != k2 || len(c.owners[k1]) != 2 {
		t.Fatalf("mirrored rules: keys %q / %q, owners %v", k1, k2, c.owners[k1])
	}
	next := st.Clone()
	delete(next.Policies, 1)
	changes, _, err := pl.recompile(c, next, dataplane.HostConfig{}, testPorts, ids.svc, []string{unitPol(1)})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range changes {
		if ch.new == nil {
			t.Errorf("deleting group 1's rules deletes %s, which group 2 still needs", ch.old)
		}
	}
	if c.flows[k2] == nil {
		t.Error("the shared flow left the compiled pipeline")
	}
}

// TestPurgeDecisions: which changes empty the datapath flow cache (a cached decision
// would otherwise outlive a change that narrows access or moves a flow).
func TestPurgeDecisions(t *testing.T) {
	pl := testPipeline(t)
	host := dataplane.HostConfig{FwdMode: dataplane.FwdBridge}
	b0, b1, b2 := netip.MustParseAddr("10.1.0.20"), netip.MustParseAddr("10.1.0.21"), netip.MustParseAddr("10.1.0.22")
	svc := func(id string, backends ...netip.Addr) dataplane.Service {
		return dataplane.Service{ID: id, VIP: netip.MustParseAddr("10.96.0.1"), Ports: []dataplane.ServicePort{{Proto: 17, Port: 53}}, Backends: backends}
	}
	base := func() *dataplane.Index {
		st := testState()
		st.Services = map[string]dataplane.Service{"a:default": svc("a:default", b0)}
		other := svc("o:default", b0)
		other.VIP = netip.MustParseAddr("10.96.0.2")
		st.Services[other.ID] = other
		return st
	}
	vlanNet := dataplane.Network{ID: "v.default", Encap: dataplane.EncapVLAN, Tag: 30, Subnet: netip.MustParsePrefix("10.3.0.0/24")}
	noGroup := func(st *dataplane.Index) {
		r := st.RemoteEndpoints["r1"]
		r.EPGID = 0
		st.RemoteEndpoints["r1"] = r
	}
	withVLAN := func(st *dataplane.Index) { st.Networks[vlanNet.ID] = vlanNet }
	for _, tc := range []struct {
		name   string
		setup  func(st *dataplane.Index) // the state before, beyond base
		change func(st *dataplane.Index) func(old, st *dataplane.Index) []string
		purge  bool
	}{
		{"new service", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			s := svc("n:default", b1)
			s.VIP = netip.MustParseAddr("10.96.0.3")
			st.Services[s.ID] = s
			return units(unitSvc(s.ID))
		}, false},
		{"backend added", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			st.Services["a:default"] = svc("a:default", b0, b1)
			return units(unitSvc("a:default"))
		}, false},
		{"backend replaced (the old one still serves another service)", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			st.Services["a:default"] = svc("a:default", b2)
			return units(unitSvc("a:default"))
		}, true},
		{"backend removed", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			st.Services["a:default"] = svc("a:default")
			return units(unitSvc("a:default"))
		}, true},
		{"remote endpoint gets a group", noGroup, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			r := st.RemoteEndpoints["r1"]
			r.EPGID = 8
			st.RemoteEndpoints["r1"] = r
			return units(unitRem("r1"))
		}, true},
		{"new VLAN remote endpoint with a group", withVLAN, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			ip := netip.MustParseAddr("10.3.0.5")
			st.RemoteEndpoints["v1"] = dataplane.RemoteEndpoint{ID: "v1", NetworkID: vlanNet.ID, IP: ip, MAC: dataplane.ContivMAC(ip), EPGID: 7, Host: "h2"}
			return units(unitRem("v1"))
		}, true},
		{"new local endpoint without a group", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			ip := netip.MustParseAddr("10.1.0.30")
			st.Endpoints["e9"] = dataplane.Endpoint{ID: "e9", NetworkID: vxNet.ID, IP: ip, MAC: dataplane.ContivMAC(ip), HostIfName: "v9", IfName: "eth0"}
			return endpointUnits("e9")
		}, false},
		{"rule added", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			ps := st.Policies[7]
			ps.Rules = append(slices.Clone(ps.Rules), dataplane.PolicyRule{ID: "x", Priority: 2, Proto: 17, Action: dataplane.ActionDeny})
			st.Policies[7] = ps
			return units(unitPol(7))
		}, true},
		{"same service again", nil, func(st *dataplane.Index) func(old, st *dataplane.Index) []string {
			return units(unitSvc("a:default"))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := base()
			p := ports{endpoints: map[string]uint32{"e1": 100, "e9": 109}, tunnel: 1, uplink: 2}
			if tc.setup != nil {
				tc.setup(st)
			}
			ids := newIDs()
			c, err := pl.compile(st, host, p, ids)
			if err != nil {
				t.Fatal(err)
			}
			next := st.Clone()
			scope := tc.change(next)
			dirty := scope(st, next)
			changes, _, err := pl.recompile(c, next, host, p, ids.svc, dirty)
			if err != nil {
				t.Fatal(err)
			}
			narrowing := rejudgeNeeded(st, next, c.vrf, c.vrf, dirty)
			if got := purgeNeeded(changes, narrowing); got != tc.purge {
				t.Errorf("purge = %v, want %v (narrowing %v, %d flow changes)", got, tc.purge, narrowing, len(changes))
			}
		})
	}
}
