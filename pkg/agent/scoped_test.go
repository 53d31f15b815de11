package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// nopDriver accepts every call (the planner's bookkeeping is what is under test).
type nopDriver struct{ calls int }

func (d *nopDriver) UpsertNetwork(context.Context, dataplane.Network) error { d.calls++; return nil }
func (d *nopDriver) DeleteNetwork(context.Context, string) error            { d.calls++; return nil }
func (d *nopDriver) UpsertEndpoint(context.Context, dataplane.Endpoint) error {
	d.calls++
	return nil
}
func (d *nopDriver) DeleteEndpoint(context.Context, string) error { d.calls++; return nil }
func (d *nopDriver) UpsertRemoteEndpoint(context.Context, dataplane.RemoteEndpoint) error {
	d.calls++
	return nil
}
func (d *nopDriver) DeleteRemoteEndpoint(context.Context, string) error      { d.calls++; return nil }
func (d *nopDriver) UpsertPeer(context.Context, dataplane.Peer) error        { d.calls++; return nil }
func (d *nopDriver) DeletePeer(context.Context, string) error                { d.calls++; return nil }
func (d *nopDriver) UpsertPolicy(context.Context, dataplane.PolicySet) error { d.calls++; return nil }
func (d *nopDriver) DeletePolicy(context.Context, uint16) error              { d.calls++; return nil }
func (d *nopDriver) UpsertService(context.Context, dataplane.Service) error {
	d.calls++
	return nil
}
func (d *nopDriver) DeleteService(context.Context, string) error { d.calls++; return nil }
func (d *nopDriver) UpsertPodPolicy(context.Context, dataplane.PodPolicy) error {
	d.calls++
	return nil
}
func (d *nopDriver) DeletePodPolicy(context.Context, string) error { d.calls++; return nil }

// pass runs one reconcile pass on records r against applied ap the way the agent does
// (the scope the records collected; full when asked), returning the pass's error map.
func pass(h hostView, r *records, ap *dataplane.Index, bad map[string]error, d dplan, full bool) {
	sc := r.dirty
	r.dirty = scope{}
	var want *dataplane.Index
	var b map[string]error
	if full || sc.all {
		sc = scope{all: true}
		s, fb := compute(h, r)
		want, b = dataplane.IndexOf(s), fb
		clear(bad)
	} else {
		want, b = computeScoped(h, r, sc)
		dropScoped(bad, sc)
	}
	maps.Copy(bad, b)
	for _, o := range plan(d, ap, want, sc) {
		if err := o.do(context.Background()); err != nil {
			panic(err)
		}
		o.ok()
	}
}

// TestScopedPassesMatchFull: after any sequence of record changes, applying only what
// changed (the agent's scoped passes) leaves the same objects applied and the same
// errors reported as recomputing everything would.
func TestScopedPassesMatchFull(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		r := newRecords()
		h := hostView{host: "h0", vtep: netip.MustParseAddr("192.168.1.1"), uplinkMTU: 1500}
		for n := 0; n < 3; n++ {
			id := fmt.Sprintf("n%d.t", n)
			r.nets[id] = model.CfgNetworkState{ID: id, PktTagType: "vxlan", ExtPktTag: n + 1, SubnetIP: fmt.Sprintf("10.%d.0.0", n), SubnetLen: 16}
		}
		r.vteps["k1"] = vxlan.Registration{HostAddr: "192.168.1.2", Hostname: "h1"}
		r.hostVTEPs["h2"] = netip.MustParseAddr("192.168.1.3")
		ap := dataplane.NewIndex()
		bad := map[string]error{}
		d := &nopDriver{}
		pass(h, r, ap, bad, d, true)
		for step := 0; step < 300; step++ {
			id := fmt.Sprintf("n%d.t-%d", rng.IntN(3), rng.IntN(12))
			switch k := rng.IntN(20); {
			case k < 8: // an endpoint record written (sometimes unusable, sometimes moved)
				e := model.CfgEndpointState{ID: id, NetID: id[:4], IPAddress: fmt.Sprintf("10.%c.0.%d", id[1], rng.IntN(200)+2),
					HomingHost: fmt.Sprintf("h%d", rng.IntN(4)), EndpointGroupID: rng.IntN(3)}
				switch rng.IntN(10) {
				case 0:
					e.IPAddress = "not-an-ip"
				case 1:
					e.NetID = "n9.t" // network not known
				case 2:
					e.VtepIP = "bad"
				}
				r.setEp(id, &e)
			case k < 11:
				r.setEp(id, nil)
				if rng.IntN(2) == 0 {
					r.undecodable["endpoint/"+id] = fmt.Errorf("does not decode")
				} else {
					delete(r.undecodable, "endpoint/"+id)
				}
			case k < 13: // attached here, or detached
				if rng.IntN(2) == 0 {
					r.setLocal(id, &LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: id, IntfName: "eth0", PortName: HostIfName(id)}, NetNS: "/run/netns/x"})
				} else {
					r.setLocal(id, nil)
				}
			case k < 15: // a NetworkPolicy layer
				if rng.IntN(3) == 0 {
					delete(r.podPols, id)
				} else {
					rule := model.K8sPodRule{Remote: "10.0.0.0/8", Proto: 6, PortMin: 80, PortMax: 80}
					if rng.IntN(4) == 0 {
						rule.Remote = "bad"
					}
					r.podPols[id] = model.K8sPodPolicy{ID: id, IngressIsolated: true, Ingress: []model.K8sPodRule{rule}}
				}
				r.dirty.touchEp(id)
			case k < 18: // a service
				sid := fmt.Sprintf("s%d:t", rng.IntN(5))
				if rng.IntN(3) == 0 {
					r.setSvc(sid, nil)
				} else {
					s := model.CfgServiceLBState{ID: sid, IPAddress: fmt.Sprintf("10.200.0.%d", rng.IntN(5)), Ports: []string{"80:8080:TCP"},
						Providers: map[string]*model.Provider{"a": {IPAddress: fmt.Sprintf("10.0.0.%d", rng.IntN(9)+2)}}}
					if rng.IntN(5) == 0 {
						s.Ports = []string{"80:8080:SCTP"}
					}
					r.setSvc(sid, &s)
				}
			case k < 19 && rng.IntN(2) == 0: // a rule record (its groups' sets compiled again)
				rid := fmt.Sprintf("t:g:t:p:t:p:%d:inRx", rng.IntN(6))
				switch rng.IntN(8) {
				case 0:
					r.setRule(rid, nil)
				case 1: // refused by the compiler, in a known group
					r.setRule(rid, &model.CfgPolicyRule{ID: rid, OfnetPolicyRule: model.OfnetPolicyRule{RuleId: rid, Priority: 1, DstEndpointGroup: 1, IpProtocol: 6, Action: "bogus"}})
				case 2: // no group to be found: every set compiled again
					bad := fmt.Sprintf("t:g:t:p:t:p:%d:sideways", rng.IntN(2))
					if rng.IntN(2) == 0 {
						r.setRule(bad, nil)
					} else {
						r.setRule(bad, &model.CfgPolicyRule{ID: bad, OfnetPolicyRule: model.OfnetPolicyRule{RuleId: bad, Priority: 1, DstEndpointGroup: 1, Action: "deny"}})
					}
				case 3: // a body naming another rule than its key, often one a record of another key is
					name := []string{"other:inRx", fmt.Sprintf("t:g:t:p:t:p:%d:inRx", rng.IntN(6))}[rng.IntN(2)]
					key := []string{"odd" + rid, ""}[rng.IntN(2)] // "": the prefix's own key
					body := model.CfgPolicyRule{ID: name, OfnetPolicyRule: model.OfnetPolicyRule{Priority: 1 + rng.IntN(2), DstEndpointGroup: 2 + rng.IntN(2), IpProtocol: 17, Action: "allow"}}
					switch rng.IntN(3) {
					case 0:
						r.setRule(key, nil)
					case 1: // named by its RuleId only
						body.ID, body.RuleId = "", name
						r.setRule(key, &body)
					default:
						r.setRule(key, &body)
					}
				case 4: // an outgoing rule: the source is its group
					out := strings.TrimSuffix(rid, "inRx") + "outTx"
					r.setRule(out, &model.CfgPolicyRule{ID: out, OfnetPolicyRule: model.OfnetPolicyRule{RuleId: out, Priority: 3, SrcEndpointGroup: 1 + rng.IntN(3), IpProtocol: 6, Action: "allow"}})
				default: // a rule written into one of three groups (moving between them)
					r.setRule(rid, &model.CfgPolicyRule{ID: rid, OfnetPolicyRule: model.OfnetPolicyRule{RuleId: rid, Priority: 1 + rng.IntN(9), DstEndpointGroup: 1 + rng.IntN(3), IpProtocol: 6, DstPort: uint16(rng.IntN(3)), Action: "deny"}})
				}
			case k < 19: // a VTEP registers or goes (everything recomputed)
				if _, ok := r.vteps["k3"]; ok {
					delete(r.vteps, "k3")
				} else {
					r.vteps["k3"] = vxlan.Registration{HostAddr: "192.168.1.4", Hostname: "h3"}
				}
				r.touchAll()
			default: // a network changes
				n := r.nets["n1.t"]
				n.ExtPktTag = rng.IntN(4) + 1
				r.nets["n1.t"] = n
				r.touchAll()
			}
			if rng.IntN(3) == 0 {
				continue // let changes pile up into one pass, as bursts do
			}
			pass(h, r, ap, bad, d, false)
			s, fbad := compute(h, r)
			if got := ap.State(); !reflect.DeepEqual(normal(got), normal(s)) {
				t.Fatalf("seed %d step %d: scoped passes applied\n%+v\nfull computation wants\n%+v", seed, step, got, s)
			}
			if !reflect.DeepEqual(errKeys(bad), errKeys(fbad)) {
				t.Fatalf("seed %d step %d: scoped errors %v, full %v", seed, step, errKeys(bad), errKeys(fbad))
			}
		}
	}
}

func normal(s dataplane.State) dataplane.State {
	s.Sort()
	if len(s.Peers) == 0 {
		s.Peers = nil
	}
	if len(s.Networks) == 0 {
		s.Networks = nil
	}
	if len(s.Endpoints) == 0 {
		s.Endpoints = nil
	}
	if len(s.RemoteEndpoints) == 0 {
		s.RemoteEndpoints = nil
	}
	if len(s.Policies) == 0 {
		s.Policies = nil
	}
	if len(s.Services) == 0 {
		s.Services = nil
	}
	if len(s.PodPolicies) == 0 {
		s.PodPolicies = nil
	}
	return s
}

func errKeys(m map[string]error) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v.Error()
	}
	return out
}

// TestNetworkBookkeepingStaysScoped: netmaster rewrites a network's record for every
// address it hands out; that alone must not make the next pass recompute everything,
// while a change the datapath reads (the VNI) must.
func TestNetworkBookkeepingStaysScoped(t *testing.T) {
	a := &Agent{rec: newRecords(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	n := model.CfgNetworkState{ID: "n.t", Tenant: "t", PktTagType: "vxlan", ExtPktTag: 5, SubnetIP: "10.5.0.0", SubnetLen: 16}
	put := func(n model.CfgNetworkState) {
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		a.put(model.NetStatePrefix, model.NetStateKey(n.ID), b)
	}
	put(n)
	a.rec.dirty = scope{}
	n.EpCount, n.IPAllocMap = 3, model.NewBitset(256)
	n.IPAllocMap.Set(7)
	put(n)
	if a.rec.dirty.all {
		t.Fatal("an allocation-only rewrite of the network made the pass full")
	}
	n.ExtPktTag = 6
	put(n)
	if !a.rec.dirty.all {
		t.Fatal("a VNI change did not make the pass full")
	}
	// Groups and BGP records feed nothing the pass computes; rules only the rule sets;
	// an undecodable group is reported by a full pass.
	a.rec.dirty = scope{}
	a.put(model.EPGStatePrefix, model.EPGStatePrefix+"g:t", []byte(`{"id":"g:t"}`))
	if !a.rec.dirty.empty() {
		t.Fatalf("a group record made the pass %+v", a.rec.dirty)
	}
	a.put(model.RuleStatePrefix, model.RuleStatePrefix+"r1", []byte(`{"id":"r1"}`))
	if a.rec.dirty.all || !a.rec.dirty.pols {
		t.Fatalf("a rule record without a group made the pass %+v, want every rule set", a.rec.dirty)
	}
	a.rec.dirty = scope{}
	a.put(model.RuleStatePrefix, model.RuleStatePrefix+"t:p:1:inRx", []byte(`{"id":"t:p:1:inRx","DstEndpointGroup":7,"Action":"allow"}`))
	if d := a.rec.dirty; d.all || d.pols || len(d.groups) != 1 || len(d.eps)+len(d.svcs) != 0 {
		t.Fatalf("a rule record of group 7 made the pass %+v, want group 7's rule set only", d)
	} else if _, ok := d.groups[7]; !ok {
		t.Fatalf("a rule record of group 7 made the pass %+v", d)
	}
	a.rec.dirty = scope{}
	a.put(model.EPGStatePrefix, model.EPGStatePrefix+"g:t", []byte(`{`))
	if !a.rec.dirty.all {
		t.Fatal("an undecodable group record did not make the pass full (its error would not be reported)")
	}
}

// failingDriver accepts everything except the services named in fail; it counts calls.
type failingDriver struct {
	nopDriver
	fail     map[string]bool
	svcCalls int
}

func (d *failingDriver) Name() string                                { return "fake" }
func (d *failingDriver) Sync(context.Context, dataplane.State) error { return nil }
func (d *failingDriver) Status(context.Context) (dataplane.Status, error) {
	return dataplane.Status{}, nil
}
func (d *failingDriver) Close() error                   { return nil }
func (d *failingDriver) Teardown(context.Context) error { return nil }
func (d *failingDriver) UpsertService(_ context.Context, s dataplane.Service) error {
	d.svcCalls++
	if d.fail[s.ID] {
		return fmt.Errorf("refused %s", s.ID)
	}
	return nil
}

// testAgent is an agent of host h0 on driver d with one network n.t (VXLAN 5,
// 10.5.0.0/16) recorded; its store and netmaster are never reached.
func testAgent(t *testing.T, d dataplane.Driver, mode dataplane.FwdMode) *Agent {
	t.Helper()
	a, err := New(Config{Store: &state.Store{}, Driver: d, Master: afterCreate{}, Host: "h0", FwdMode: mode,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a.rec.nets["n.t"] = model.CfgNetworkState{ID: "n.t", Tenant: "t", PktTagType: "vxlan", ExtPktTag: 5, SubnetIP: "10.5.0.0", SubnetLen: 16}
	return a
}

// TestReconcileRetriesOnlyWhatFailed: a service the driver keeps refusing is retried by
// its id alone, not by making every later pass recompute everything; a NetworkPolicy layer
// of an endpoint whose record body names another id is applied under the record key.
func TestReconcileRetriesOnlyWhatFailed(t *testing.T) {
	fd := &failingDriver{fail: map[string]bool{}}
	a := testAgent(t, fd, dataplane.FwdRouting)
	ctx := context.Background()
	r := a.rec
	r.hostVTEPs["h1"] = netip.MustParseAddr("192.168.1.2")
	r.setEp("n.t-a", &model.CfgEndpointState{ID: "n.t-a", NetID: "n.t", IPAddress: "10.5.0.2", HomingHost: "h1"})
	for _, id := range []string{"s1:t", "s2:t"} {
		r.setSvc(id, &model.CfgServiceLBState{ID: id, IPAddress: "10.5.1." + id[1:2], Ports: []string{"80:80:TCP"}})
	}
	if errs := a.reconcile(ctx); len(errs) != 0 || len(a.applied.Services) != 2 {
		t.Fatalf("first pass: errors %v, services %d", errs, len(a.applied.Services))
	}
	fd.fail["s1:t"] = true
	r.setSvc("s1:t", &model.CfgServiceLBState{ID: "s1:t", IPAddress: "10.5.1.1", Ports: []string{"81:81:TCP"}})
	if errs := a.reconcile(ctx); errs["service/s1:t"] == nil {
		t.Fatalf("refused service not reported: %v", errs)
	}
	if a.retry.all || len(a.retry.svcs) != 1 {
		t.Fatalf("retry scope %+v, want service s1:t only", a.retry)
	}
	fd.svcCalls = 0
	a.reconcile(ctx)
	if fd.svcCalls != 1 {
		t.Fatalf("retry pass made %d service calls, want 1 (s1:t)", fd.svcCalls)
	}
	fd.fail["s1:t"] = false
	if errs := a.reconcile(ctx); len(errs) != 0 || a.applied.Services["s1:t"].Ports[0].Port != 81 {
		t.Fatalf("after the driver accepted it: errors %v, applied %+v", errs, a.applied.Services["s1:t"])
	}

	// Record key n.t-b, body id "other": the pod's layer is keyed by n.t-b throughout.
	r.setEp("n.t-b", &model.CfgEndpointState{ID: "other", NetID: "n.t", IPAddress: "10.5.0.3", HomingHost: "h1"})
	a.reconcile(ctx)
	r.podPols["n.t-b"] = model.K8sPodPolicy{ID: "n.t-b", IngressIsolated: true}
	r.dirty.touchEp("n.t-b")
	a.reconcile(ctx)
	if _, ok := a.applied.PodPolicies["n.t-b"]; !ok {
		t.Fatalf("pod policy of n.t-b not applied under its key: %v", slices.Collect(maps.Keys(a.applied.PodPolicies)))
	}
	r.touchAll() // a full pass keys it the same way
	a.reconcile(ctx)
	if _, ok := a.applied.PodPolicies["n.t-b"]; !ok || len(a.applied.PodPolicies) != 1 {
		t.Fatalf("after a full pass the pod policies are %v, want n.t-b only", slices.Collect(maps.Keys(a.applied.PodPolicies)))
	}
	delete(r.podPols, "n.t-b")
	r.dirty.touchEp("n.t-b")
	a.reconcile(ctx)
	if len(a.applied.PodPolicies) != 0 {
		t.Fatalf("pod policy still applied after its record went: %v", a.applied.PodPolicies)
	}
}

// TestNetShapeCoversNetworkRecord: every field of a network record is either in netShape
// (a change to it makes the next pass full) or known address bookkeeping, so a field added
// later cannot change the datapath without a full pass.
func TestNetShapeCoversNetworkRecord(t *testing.T) {
	bookkeeping := map[string]bool{"EpAddrCount": true, "EpCount": true, "IPAllocMap": true, "IPv6AllocMap": true, "IPv6LastHost": true}
	shape := reflect.TypeOf(netShape{})
	rec := reflect.TypeOf(model.CfgNetworkState{})
	for i := 0; i < rec.NumField(); i++ {
		name := rec.Field(i).Name
		if _, ok := shape.FieldByName(name); !ok && !bookkeeping[name] {
			t.Errorf("CfgNetworkState.%s is neither in netShape nor address bookkeeping", name)
		}
	}
}
