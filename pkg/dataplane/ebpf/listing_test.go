package ebpf

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestListings: after real traffic through a service VIP and a denied connection, every
// decoded table names what an operator knows (endpoint ids, interfaces, rule ids, service
// names, protocols and ports in host order) instead of raw map bytes.
func TestListings(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 1, 2
	remote := dataplane.RemoteEndpoint{ID: "red.t-far", NetworkID: h.net.ID, IP: netip.MustParseAddr("10.50.0.9"),
		MAC: dataplane.ContivMAC(netip.MustParseAddr("10.50.0.9")), EPGID: 1, VTEP: netip.MustParseAddr("10.254.0.2"), Host: "h2"}
	pol := dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "t:p:deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "t:p:allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
		{ID: "t:p:from-far", Priority: 3, Ingress: true, Remote: netip.MustParsePrefix("10.50.0.8/30"), Action: dataplane.ActionAllow},
	}}
	svc := dataplane.Service{ID: "web:t", VIP: netip.MustParseAddr("10.50.0.100"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{b.IP}}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote}, Peers: []dataplane.Peer{{Host: "h2", VTEP: remote.VTEP}},
		Policies: []dataplane.PolicySet{pol}, Services: []dataplane.Service{svc}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	srv, err := conformance.StartTCPEchoPort(b.NetNS, b.IP.String(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := conformance.DialTCP(a.NetNS, "10.50.0.100:80")
	if err != nil {
		t.Fatal(err)
	}
	if err := conformance.EchoRoundTrip(c, 512); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.3:8081", 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("denied port reachable")
	}

	list := func(kind string) dataplane.Listing {
		t.Helper()
		l, err := h.d.Listing(kind, 0)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		return l
	}
	// has finds a row containing every cell of want (in order of columns named).
	has := func(l dataplane.Listing, want map[string]string) {
		t.Helper()
		col := map[string]int{}
		for i, c := range l.Columns {
			col[c] = i
		}
		for _, r := range l.Rows {
			ok := len(r) == len(l.Columns)
			for c, v := range want {
				i, known := col[c]
				if !known {
					t.Fatalf("%s: no column %q in %v", l.Kind, c, l.Columns)
				}
				ok = ok && strings.Contains(r[i], v)
			}
			if ok {
				return
			}
		}
		t.Errorf("%s: no row with %v in\n%v", l.Kind, want, l.Rows)
	}
	eps := list("endpoints")
	has(eps, map[string]string{"NETWORK": "red.t", "IP": "10.50.0.2", "MAC": "02:02:0a:32:00:02", "EPG": "1", "WHERE": "local " + a.HostIfName, "ENDPOINT": "red.t-a"})
	has(eps, map[string]string{"IP": "10.50.0.9", "WHERE": "vtep 10.254.0.2 (h2)", "ENDPOINT": "red.t-far"})
	has(list("networks"), map[string]string{"NETWORK": "red.t", "ZONE": "(t)", "ENCAP": "vxlan", "TAG": "77", "SUBNET": "10.50.0.0/24", "GATEWAY": "10.50.0.1"})
	has(list("peers"), map[string]string{"VTEP": "10.254.0.2", "HOST": "h2"})
	pl := list("policy")
	has(pl, map[string]string{"EPG": "2", "DIRECTION": "ingress", "#": "1", "RULE": "t:p:allow-8080", "ACTION": "allow", "PROTO": "tcp", "PORT": "8080"})
	has(pl, map[string]string{"RULE": "t:p:from-far", "PROTO": "any", "REMOTE": "10.50.0.8/30"})
	has(pl, map[string]string{"RULE": "t:p:deny-tcp", "ACTION": "deny", "FLAGS": "syn-only"})
	has(list("services"), map[string]string{"SERVICE": "web:t", "FRONTEND": "10.50.0.100:80/tcp", "TARGET PORT": "8080", "BACKENDS": "10.50.0.3"})
	ct := list("ct")
	// The service entry (VIP → chosen backend) and the policy entry of the translated flow.
	has(ct, map[string]string{"PROTO": "tcp", "SOURCE": "10.50.0.2:", "DESTINATION": "10.50.0.100:80", "FLAGS": "service",
		"NAT": "10.50.0.3:8080 on red.t", "SERVICE": "web:t"})
	has(ct, map[string]string{"PROTO": "tcp", "SOURCE": "10.50.0.2:", "DESTINATION": "10.50.0.3:8080", "STATE": "established",
		"FLAGS": "allowed,dnat", "NAT": "10.50.0.100:80", "EXPIRES": "h"})
	for _, r := range ct.Rows {
		if strings.Contains(r[3], ":8081") {
			t.Errorf("the denied SYN left a conntrack entry: %v", r)
		}
	}
	has(list("counters"), map[string]string{"COUNTER": "drop_policy", "KIND": "drop"})
	if l, err := h.d.Listing("ct", 1); err != nil || len(l.Rows) != 1 || l.Truncated == 0 {
		t.Errorf("ct with limit 1: %d rows, %d truncated, %v", len(l.Rows), l.Truncated, err)
	}
	if _, err := h.d.Listing("bogus", 0); err == nil || !strings.Contains(err.Error(), "unknown table") {
		t.Errorf("unknown table: %v", err)
	}
	// A rule written behind the agent's back is shown, but not under a rule id.
	var k contivbpfCbPolKey
	var v contivbpfCbPolicy
	k.Epg, k.Dir = 2, uint8(contivbpfCbPolDirCB_DIR_INGRESS)
	if err := h.d.objs.CbPolicies.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	v.Rules[0].Port = nport(9999)
	if err := h.d.objs.CbPolicies.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	has(list("policy"), map[string]string{"#": "1", "RULE": "(not in the agent's state)", "PORT": "9999"})
}

// TestVerify: right after Sync the maps hold exactly what the state implies; entries
// changed, deleted or added behind the driver's back are each named.
func TestVerify(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 1, 2
	remote := dataplane.RemoteEndpoint{ID: "red.t-far", NetworkID: h.net.ID, IP: netip.MustParseAddr("10.50.0.9"),
		MAC: dataplane.ContivMAC(netip.MustParseAddr("10.50.0.9")), EPGID: 1, VTEP: netip.MustParseAddr("10.254.0.2"), Host: "h2"}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote}, Peers: []dataplane.Peer{{Host: "h2", VTEP: remote.VTEP}},
		Policies: []dataplane.PolicySet{{EPGID: 2, Rules: []dataplane.PolicyRule{
			{ID: "t:p:allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
			{ID: "t:p:deny-22", Priority: 9, Ingress: true, Proto: 6, Port: 22, Action: dataplane.ActionDeny}}}},
		Services: []dataplane.Service{{ID: "web:t", VIP: netip.MustParseAddr("10.50.0.100"),
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{b.IP}}}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if drift, err := h.d.Verify(state); err != nil || len(drift) != 0 {
		t.Fatalf("drift right after Sync: %v %+v", err, drift)
	}
	objs := &h.d.objs
	// Endpoint a's group changed behind the agent's back.
	ak := contivbpfCbEpKey{Net: h.d.networks[h.net.ID].key, Ip: ip4(a.IP)}
	var av contivbpfCbEndpoint
	if err := objs.CbEndpoints.Lookup(&ak, &av); err != nil {
		t.Fatal(err)
	}
	av.Epg = 7
	if err := objs.CbEndpoints.Put(&ak, &av); err != nil {
		t.Fatal(err)
	}
	// The peer entry deleted, a stray network added, a policy rule's port rewritten.
	if err := objs.CbPeers.Delete(ip4(remote.VTEP)); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbNetworks.Put(uint32(4242), &contivbpfCbNetwork{Subnet: ip4(netip.MustParseAddr("10.99.0.0")), Tag: 4242}); err != nil {
		t.Fatal(err)
	}
	pk := contivbpfCbPolKey{Epg: 2, Dir: uint8(contivbpfCbPolDirCB_DIR_INGRESS)}
	var pv contivbpfCbPolicy
	if err := objs.CbPolicies.Lookup(&pk, &pv); err != nil {
		t.Fatal(err)
	}
	pv.Rules[0].Port = nport(2222)
	if err := objs.CbPolicies.Put(&pk, &pv); err != nil {
		t.Fatal(err)
	}
	drift, err := h.d.Verify(state)
	if err != nil {
		t.Fatal(err)
	}
	want := []dataplane.Drift{
		{Table: "cb_endpoints", Object: "red.t-a", Kind: "different"},
		{Table: "cb_networks", Object: "key 4242", Kind: "extra"},
		{Table: "cb_peers", Object: "h2 10.254.0.2", Kind: "missing"},
		{Table: "cb_policies", Object: "epg 2 ingress #1", Kind: "different"},
	}
	if len(drift) != len(want) {
		t.Fatalf("drift %+v, want %d entries", drift, len(want))
	}
	for i, w := range want {
		if g := drift[i]; g.Table != w.Table || g.Object != w.Object || g.Kind != w.Kind {
			t.Errorf("drift %d = %+v, want %+v", i, g, w)
		}
	}
	if !strings.Contains(drift[0].Detail, "epg 7") || !strings.Contains(drift[3].Detail, "t:p:deny-22") {
		t.Errorf("details do not say what differs: %+v", drift)
	}
	// A Sync repairs it all.
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if drift, err := h.d.Verify(state); err != nil || len(drift) != 0 {
		t.Fatalf("drift after the repairing Sync: %v %+v", err, drift)
	}
}
