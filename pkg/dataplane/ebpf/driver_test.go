package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

type oneHost struct {
	prefix string
	cfg    config
	net    dataplane.Network
	d      *Driver
}

func newOneHost(t *testing.T) *oneHost {
	t.Helper()
	testroot.Need(t)
	p := conformance.Prefix()
	ns := conformance.NewNetNS(t, p+"-h")
	pinBase := filepath.Join("/sys/fs/bpf", p)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	h := &oneHost{prefix: p,
		cfg: config{HostConfig: dataplane.HostConfig{Host: "h", NetNS: ns, VTEP: netip.MustParseAddr("10.254.0.1")},
			Options: Options{PinRoot: filepath.Join(pinBase, "h"), VXLANIf: "cbevx0", MapEntries: 1024}},
		net: dataplane.Network{ID: "red.t", Encap: dataplane.EncapVXLAN, Tag: 77,
			Subnet: netip.MustParsePrefix("10.50.0.0/24"), Gateway: netip.MustParseAddr("10.50.0.1")},
	}
	h.d = h.start(t)
	t.Cleanup(func() {
		if h.d != nil && !h.d.closed {
			_ = h.d.Teardown(context.Background())
		}
	})
	return h
}

func (h *oneHost) start(t *testing.T) *Driver {
	t.Helper()
	d, err := New(context.Background(), h.cfg.HostConfig, h.cfg.Options)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (h *oneHost) endpoint(t *testing.T, name, ip string, withNS bool) dataplane.Endpoint {
	a := netip.MustParseAddr(ip)
	ep := dataplane.Endpoint{ID: "red.t-" + name, NetworkID: h.net.ID, IP: a, MAC: dataplane.ContivMAC(a),
		HostIfName: h.prefix + name, IfName: "eth0"}
	if withNS {
		ep.NetNS = conformance.NewNetNS(t, h.prefix+"-"+name)
	} else {
		ep.IfName = h.prefix + name + "c"
	}
	return ep
}

// netlinkIn returns a netlink handle in the network namespace at path; the caller closes
// it.
func netlinkIn(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	return nl
}

func mapID(t *testing.T, d *Driver) uint32 {
	info, err := d.objs.CbEndpoints.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return uint32(id)
}

func TestDriverMapsAndLifecycle(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	remote := dataplane.RemoteEndpoint{ID: "red.t-r", NetworkID: h.net.ID, IP: netip.MustParseAddr("10.50.0.9"),
		MAC: dataplane.ContivMAC(netip.MustParseAddr("10.50.0.9")), VTEP: netip.MustParseAddr("10.254.0.2"), Host: "h2"}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote}, Peers: []dataplane.Peer{{Host: "h2", VTEP: remote.VTEP}}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}

	tabs, err := h.d.DumpTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(tabs.Endpoints) != 3 || len(tabs.Ifaces) != 2 || len(tabs.Networks) != 1 || len(tabs.Peers) != 1 {
		t.Fatalf("tables after sync: %+v", tabs)
	}
	if n := tabs.Networks[0]; n.Subnet != "10.50.0.0/24" || n.Gateway != "10.50.0.1" || n.MTU != 1450 || n.Tag != 77 {
		t.Errorf("network entry %+v", n)
	}
	gen1 := h.d.gen
	for _, e := range tabs.Endpoints {
		if e.Generation != gen1 {
			t.Errorf("endpoint %s generation %d, want %d", e.IP, e.Generation, gen1)
		}
	}

	// Traffic moves the counters.
	conformance.PingOK(t, a.NetNS, "10.50.0.3", 3)
	ca, err := h.d.EndpointCounters(a.ID)
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := h.d.EndpointCounters(b.ID)
	if ca.TxPackets == 0 || ca.RxPackets == 0 || cb.RxPackets == 0 || cb.TxPackets == 0 {
		t.Errorf("endpoint counters a %+v b %+v", ca, cb)
	}
	rc, err := h.d.ReasonCounters()
	if err != nil {
		t.Fatal(err)
	}
	if rc[FwdLocal].Packets < 2 || rc[ARPReply].Packets < 1 {
		t.Errorf("reason counters %v", rc)
	}

	// Status reports the driver's own tcx attachments.
	st, err := h.d.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, at := range st.Attachments {
		got[at.Interface] = at.Program
		wantHook := "tcx-ingress"
		if at.Interface == sockLBLink {
			wantHook = "cgroup-connect4"
		}
		if at.ID == 0 || at.Hook != wantHook {
			t.Errorf("attachment %+v", at)
		}
	}
	if got["cbevx0"] != "cb_from_overlay" || got[a.HostIfName] != "cb_from_container" || got[b.HostIfName] != "cb_from_container" ||
		got[sockLBLink] != "cb_sock_connect4" {
		t.Errorf("attachments %v", got)
	}

	// bpftool shows BTF field names of the pinned maps.
	out, err := exec.Command("bpftool", "map", "dump", "pinned", filepath.Join(h.cfg.PinRoot, "cb_endpoints")).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool: %v: %s", err, out)
	}
	for _, f := range []string{`"ifindex"`, `"vtep"`, `"generation"`, `"net"`} {
		if !strings.Contains(string(out), f) {
			t.Errorf("bpftool dump lacks %s:\n%s", f, out)
		}
	}

	// Restart: same maps, same links, new programs.
	oldMap := mapID(t, h.d)
	oldLink := h.d.links[a.HostIfName]
	oldInfo, _ := oldLink.link.Info()
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	conformance.PingOK(t, a.NetNS, "10.50.0.3", 2)
	h.d = h.start(t)
	if id := mapID(t, h.d); id != oldMap {
		t.Errorf("map id %d after restart, want reused %d", id, oldMap)
	}
	newInfo, err := h.d.links[a.HostIfName].link.Info()
	if err != nil {
		t.Fatal(err)
	}
	if newInfo.ID != oldInfo.ID || newInfo.Program == oldInfo.Program {
		t.Errorf("link %d prog %d → link %d prog %d; want same link, new program", oldInfo.ID, oldInfo.Program, newInfo.ID, newInfo.Program)
	}
	if _, err := h.d.EndpointCounters(a.ID); err != nil {
		t.Errorf("adopted endpoint: %v", err)
	}

	// Resync without the remote endpoint and peer: swept by generation, rest untouched.
	state.RemoteEndpoints, state.Peers = nil, nil
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	tabs, _ = h.d.DumpTables()
	if len(tabs.Endpoints) != 2 || len(tabs.Peers) != 0 {
		t.Errorf("after sweep: %+v", tabs)
	}
	for _, e := range tabs.Endpoints {
		if e.Generation != h.d.gen || h.d.gen <= gen1 {
			t.Errorf("generation %d (driver %d, before %d)", e.Generation, h.d.gen, gen1)
		}
	}
	conformance.PingOK(t, a.NetNS, "10.50.0.3", 3)

	// Delete removes every map entry, the pinned link and the veth.
	bIfindex := h.d.eps.endpoints[b.ID].ifindex
	bSlot := h.d.eps.endpoints[b.ID].slot
	if bSlot == 0 {
		t.Error("local endpoint b has no counter slot")
	}
	if err := h.d.DeleteEndpoint(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	tabs, _ = h.d.DumpTables()
	for _, e := range tabs.Endpoints {
		if e.IP == "10.50.0.3" {
			t.Errorf("endpoint entry left: %+v", e)
		}
	}
	for _, i := range tabs.Ifaces {
		if i.Ifindex == uint32(bIfindex) {
			t.Errorf("iface entry left: %+v", i)
		}
	}
	if owner, ok := h.d.eps.slots[bSlot]; ok {
		t.Errorf("counter slot %d of the deleted endpoint still allocated (to %s)", bSlot, owner)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.PinRoot, linksDir, b.HostIfName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pinned link left: %v", err)
	}
	if _, err := h.d.nl.LinkByName(b.HostIfName); err == nil {
		t.Error("veth left")
	}

	// Network in use cannot be deleted.
	if err := h.d.DeleteNetwork(ctx, h.net.ID); err == nil {
		t.Error("deleted a network that still has endpoints")
	}

	// MapEntries changes and layout upgrades: upgrade_test.go.

	// Teardown removes pins, links, devices.
	if err := h.d.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.cfg.PinRoot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin root left: %v", err)
	}
	err = nsexec.Run(h.cfg.NetNS, func() error {
		for _, n := range []string{"cbevx0", a.HostIfName} {
			if _, err := net.InterfaceByName(n); err == nil {
				t.Errorf("%s left after teardown", n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDockerModeEndpoint: without NetNS the container end stays in the host namespace
// for the runtime, with MAC and MTU set and no address.
func TestDockerModeEndpoint(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	ep := h.endpoint(t, "d", "10.50.0.7", false)
	if err := h.d.UpsertEndpoint(ctx, ep); err != nil {
		t.Fatal(err)
	}
	err := nsexec.Run(h.cfg.NetNS, func() error {
		ifi, err := net.InterfaceByName(ep.IfName)
		if err != nil {
			return err
		}
		if ifi.MTU != 1450 || ifi.HardwareAddr.String() != ep.MAC.String() {
			t.Errorf("container end mtu %d mac %v", ifi.MTU, ifi.HardwareAddr)
		}
		if addrs, _ := ifi.Addrs(); len(addrs) != 0 {
			t.Errorf("container end has addresses %v", addrs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A foreign interface with the endpoint's host name is never adopted.
	other := h.endpoint(t, "d", "10.50.0.8", false)
	other.ID = "red.t-other"
	if err := h.d.UpsertEndpoint(ctx, other); err == nil {
		t.Error("adopted another endpoint's veth")
	}
	// Same IP twice in one network is refused.
	dup := h.endpoint(t, "e", "10.50.0.7", false)
	if err := h.d.UpsertEndpoint(ctx, dup); err == nil {
		t.Error("duplicate IP accepted")
	}
	if _, err := h.d.nl.LinkByName(dup.HostIfName); err == nil {
		t.Error("refused endpoint left its veth")
	}
}

func countEntries(t *testing.T, m interface {
	Iterate() *ebpf.MapIterator
}) int {
	t.Helper()
	n := 0
	it := m.Iterate()
	var k, v []byte
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func (h *oneHost) features(t *testing.T) uint32 {
	t.Helper()
	var c contivbpfCbConfig
	if err := h.d.objs.CbCfg.Lookup(uint32(0), &c); err != nil {
		t.Fatal(err)
	}
	return c.Features
}

// TestDriverPolicyAndService: validation, map contents, enforcement that survives a restart
// before the first Sync, and sweeping.
func TestDriverPolicyAndService(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 1, 2
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if h.features(t) != 0 {
		t.Fatalf("features %d without policies/services", h.features(t))
	}

	// Bad input changes nothing.
	bad := []dataplane.PolicySet{
		{EPGID: 0},
		{EPGID: 2, Rules: []dataplane.PolicyRule{{ID: "p0", Priority: 0, Action: dataplane.ActionDeny}}},
		{EPGID: 2, Rules: []dataplane.PolicyRule{{ID: "x", Priority: 1, Action: "drop"}}},
		{EPGID: 2, Rules: []dataplane.PolicyRule{{ID: "v6", Priority: 1, Remote: netip.MustParsePrefix("fd00::/64"), Action: dataplane.ActionDeny}}},
	}
	many := dataplane.PolicySet{EPGID: 2}
	for i := 0; i < MaxRules+1; i++ {
		many.Rules = append(many.Rules, dataplane.PolicyRule{ID: fmt.Sprint(i), Priority: 1, Ingress: true, Port: uint16(i + 1), Proto: 6, Action: dataplane.ActionDeny})
	}
	bad = append(bad, many)
	for _, p := range bad {
		if err := h.d.UpsertPolicy(ctx, p); err == nil {
			t.Errorf("accepted bad policy %+v", p.Rules)
		}
	}
	if n := countEntries(t, h.d.objs.CbPolicies); n != 0 {
		t.Errorf("%d policy entries after rejected input", n)
	}
	unknown := dataplane.Service{ID: "s:t", VIP: netip.MustParseAddr("10.50.0.100"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{netip.MustParseAddr("10.50.0.77")}}
	if err := h.d.UpsertService(ctx, unknown); err == nil || !strings.Contains(err.Error(), "10.50.0.77") {
		t.Errorf("service with unknown backend: %v", err)
	}
	if n := countEntries(t, h.d.objs.CbServices) + countEntries(t, h.d.objs.CbBackends) + countEntries(t, h.d.objs.CbVips); n != 0 {
		t.Errorf("%d service entries after rejected input", n)
	}

	pol := dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
	}}
	svc := unknown
	svc.Backends = []netip.Addr{b.IP}
	svc.VIP = netip.MustParseAddr("10.50.0.100")
	if err := h.d.UpsertPolicy(ctx, pol); err != nil {
		t.Fatal(err)
	}
	if err := h.d.UpsertService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if f := h.features(t); f != 3 {
		t.Errorf("features %d, want policy|lb", f)
	}
	if countEntries(t, h.d.objs.CbPolicies) != 1 || countEntries(t, h.d.objs.CbServices) != 1 ||
		countEntries(t, h.d.objs.CbBackends) != 1 || countEntries(t, h.d.objs.CbVips) != 1 {
		t.Error("unexpected policy/service map contents")
	}
	for _, port := range []int{8080, 8081} {
		srv, err := conformance.StartTCPEchoPort(b.NetNS, b.IP.String(), port)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
	}
	check := func(when string) {
		t.Helper()
		if c, err := conformance.DialTCP(a.NetNS, "10.50.0.100:80"); err != nil {
			t.Errorf("%s: VIP: %v", when, err)
		} else {
			if err := conformance.EchoRoundTrip(c, 4096); err != nil {
				t.Errorf("%s: VIP: %v", when, err)
			}
			c.Close()
		}
		if c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.3:8081", 500*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("%s: denied port reachable", when)
		}
	}
	check("before restart")

	// Restart: enforcement and balancing continue before the first Sync.
	var sk contivbpfCbSvcKey
	var sv contivbpfCbSvc
	it := h.d.objs.CbServices.Iterate()
	it.Next(&sk, &sv)
	slot := sv.Id
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = h.start(t)
	if f := h.features(t); f != 3 {
		t.Errorf("features %d after restart, want carried policy|lb", f)
	}
	check("after restart, before sync")
	state.Policies, state.Services = []dataplane.PolicySet{pol}, []dataplane.Service{svc}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if r := h.d.svc.services[svc.ID]; r.id != slot {
		t.Errorf("service slot %d after resync, want reused %d", r.id, slot)
	}
	check("after sync")

	// Sync without them sweeps everything and turns the stages off.
	state.Policies, state.Services = nil, nil
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, h.d.objs.CbPolicies) + countEntries(t, h.d.objs.CbServices) + countEntries(t, h.d.objs.CbBackends) + countEntries(t, h.d.objs.CbVips); n != 0 {
		t.Errorf("%d policy/service entries left after sync", n)
	}
	if f := h.features(t); f != 0 {
		t.Errorf("features %d after sweeping", f)
	}
	if c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.3:8081", 3*time.Second); err != nil {
		t.Errorf("port reachable after policy removal: %v", err)
	} else {
		c.Close()
	}
}

func pingOnce(ns, ip string) error {
	return conformance.Ping(ns, ip, time.Second)
}

// TestPolicyFailClosed: a rule set that cannot be installed denies all traffic of its group
// (never "nothing installed = allow all"), says so in the error and the metric, survives a
// Sync that reports it, and a valid set (1,024 rules) lifts it.
func TestPolicyFailClosed(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 1, 2
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if err := pingOnce(a.NetNS, b.IP.String()); err != nil {
		t.Fatalf("before: %v", err)
	}
	tooMany := dataplane.PolicySet{EPGID: 2}
	for i := 0; i < MaxRules+1; i++ {
		tooMany.Rules = append(tooMany.Rules, dataplane.PolicyRule{ID: fmt.Sprint(i), Priority: 1, Ingress: true, Proto: 6, Port: uint16(i + 1), Action: dataplane.ActionDeny})
	}
	err := h.d.UpsertPolicy(ctx, tooMany)
	var perr *PolicyError
	if !errors.As(err, &perr) || perr.EPGID != 2 || !strings.Contains(err.Error(), "failed closed") {
		t.Fatalf("over-capacity policy: %v, want a PolicyError for group 2", err)
	}
	var st contivbpfCbEpgState
	if err := h.d.objs.CbEpgs.Lookup(uint32(2), &st); err != nil || st.Flags != uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL) {
		t.Fatalf("group 2 state %+v (%v), want deny-all", st, err)
	}
	if got := h.d.FailedPolicies(); len(got) != 1 || got[2] == "" {
		t.Errorf("FailedPolicies %v", got)
	}
	if err := promtest.CollectAndCompare(h.d.Collector(), strings.NewReader(`
# HELP contiv_datapath_policy_failed_closed 1 for an endpoint group whose rule set could not be installed and that denies all traffic.
# TYPE contiv_datapath_policy_failed_closed gauge
contiv_datapath_policy_failed_closed{epg="2"} 1
`), "contiv_datapath_policy_failed_closed"); err != nil {
		t.Error(err)
	}
	if err := pingOnce(a.NetNS, b.IP.String()); err == nil {
		t.Error("a failed-closed group still answers")
	}
	// Sync reports it and still applies (and sweeps) the rest.
	invalid := dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{{ID: "bad", Priority: 0, Action: dataplane.ActionAllow}}}
	state.Policies = []dataplane.PolicySet{invalid}
	if err := h.d.Sync(ctx, state); err == nil || !strings.Contains(err.Error(), "priority 0") {
		t.Errorf("sync with an invalid rule: %v", err)
	}
	if err := pingOnce(a.NetNS, b.IP.String()); err == nil {
		t.Error("an invalid rule set widened access")
	}
	// Again (a retry, a new generation): the sweep must not reopen the group.
	if err := h.d.Sync(ctx, state); err == nil {
		t.Error("second sync with an invalid rule: no error")
	}
	if err := h.d.objs.CbEpgs.Lookup(uint32(2), &st); err != nil || st.Flags != uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL) {
		t.Fatalf("group 2 state %+v (%v) after a second sync, want deny-all", st, err)
	}
	if err := pingOnce(a.NetNS, b.IP.String()); err == nil {
		t.Error("a second sync of an invalid rule set widened access")
	}
	// 1,024 rules per direction fit; the group is open again for what they allow.
	full := dataplane.PolicySet{EPGID: 2}
	for i := 0; i < MaxRules; i++ {
		full.Rules = append(full.Rules, dataplane.PolicyRule{ID: fmt.Sprintf("r%04d", i), Priority: 1, Ingress: true, Proto: 6, Port: uint16(i + 1), Action: dataplane.ActionDeny})
	}
	state.Policies = []dataplane.PolicySet{full}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if got := h.d.FailedPolicies(); len(got) != 0 {
		t.Errorf("FailedPolicies %v after a valid set", got)
	}
	if err := pingOnce(a.NetNS, b.IP.String()); err != nil {
		t.Errorf("ICMP (not denied by the 1,024 TCP rules): %v", err)
	}
	if c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.3:1024", 500*time.Millisecond); err == nil {
		c.Close()
		t.Error("port 1024 (the last rule) reachable")
	}
}

// TestHairpinTraffic: a container that is its service's only backend reaches itself
// through the VIP (TCP and UDP), with real sockets in a namespace.
func TestHairpinTraffic(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	a.EPGID = 1
	vip := netip.MustParseAddr("10.50.0.100")
	svc := dataplane.Service{ID: "self:t", VIP: vip, Backends: []netip.Addr{a.IP},
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}, {Proto: 17, Port: 53, TargetPort: 5353}}}
	// Policy on the group: hairpin traffic is not judged, but every packet is tracked.
	pol := dataplane.PolicySet{EPGID: 1, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny}}}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a},
		Policies: []dataplane.PolicySet{pol}, Services: []dataplane.Service{svc}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	srv, err := conformance.StartTCPEchoPort(a.NetNS, a.IP.String(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for i := 0; i < 3; i++ {
		c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.100:80", 3*time.Second)
		if err != nil {
			t.Fatalf("connection %d to its own service: %v", i, err)
		}
		if err := conformance.EchoRoundTrip(c, 64<<10); err != nil {
			t.Errorf("connection %d: %v", i, err)
		}
		if got := c.RemoteAddr().String(); got != "10.50.0.100:80" {
			t.Errorf("client sees peer %s, want the VIP", got)
		}
		c.Close()
	}
	usrv, err := conformance.StartUDPEcho(a.NetNS, a.IP.String(), 5353)
	if err != nil {
		t.Fatal(err)
	}
	defer usrv.Close()
	from, err := conformance.UDPExchange(a.NetNS, "10.50.0.100:53", []byte("hello"), 2*time.Second)
	if err != nil {
		t.Fatalf("UDP to its own service: %v", err)
	}
	if from != "10.50.0.100:53" {
		t.Errorf("UDP reply from %s, want the VIP", from)
	}
}

// TestServiceUDPThroughVIP: with real sockets, a 4,000-byte datagram to a VIP (fragmented
// by the sender at MTU 1450) comes back whole from the VIP, and a datagram to a backend
// port nobody listens on comes back as ECONNREFUSED (the backend's port unreachable,
// related to the flow and un-NATed so the client's connected socket matches it).
func TestServiceUDPThroughVIP(t *testing.T) {
	h := newOneHost(t)
	a, b, _ := h.serviceBetween(t, dataplane.ServicePort{Proto: 17, Port: 53, TargetPort: 5353}, dataplane.ServicePort{Proto: 17, Port: 54, TargetPort: 5454})
	srv, err := conformance.StartUDPEcho(b.NetNS, b.IP.String(), 5353)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	big := make([]byte, 4000)
	for i := range big {
		big[i] = byte(i)
	}
	from, err := conformance.UDPExchange(a.NetNS, "10.50.0.100:53", big, 2*time.Second)
	if err != nil {
		t.Fatalf("4,000-byte datagram through the VIP: %v", err)
	}
	if from != "10.50.0.100:53" {
		t.Errorf("large reply from %s, want the VIP", from)
	}

	// Nobody listens on 5454 behind VIP:54.
	if err := conformance.RefusedUDP(a.NetNS, "10.50.0.100:54"); err != nil {
		t.Error(err)
	}
}

// serviceBetween syncs two endpoints in namespaces, a (10.50.0.2, group 1) and b
// (10.50.0.3, group 2), each group with a rule that never matches their traffic (so every
// packet between them is tracked and an established one takes the fast path), and a
// service at vip 10.50.0.100 with ports, balanced to b.
func (h *oneHost) serviceBetween(t *testing.T, ports ...dataplane.ServicePort) (a, b dataplane.Endpoint, vip netip.Addr) {
	t.Helper()
	a = h.endpoint(t, "a", "10.50.0.2", true)
	b = h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 1, 2
	vip = netip.MustParseAddr("10.50.0.100")
	svc := dataplane.Service{ID: "svc:t", VIP: vip, Backends: []netip.Addr{b.IP}, Ports: ports}
	var pols []dataplane.PolicySet
	for _, g := range []uint16{1, 2} {
		pols = append(pols, dataplane.PolicySet{EPGID: g, Rules: []dataplane.PolicyRule{
			{ID: "no-udp-9", Priority: 1, Ingress: true, Proto: 17, Port: 9, Action: dataplane.ActionDeny}}})
	}
	if err := h.d.Sync(context.Background(), dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		Policies: pols, Services: []dataplane.Service{svc}}); err != nil {
		t.Fatal(err)
	}
	return a, b, vip
}

// flowLeft runs collector passes until the flow's entry is gone, at most a few, and says
// whether it is left: a flush kicks the driver's own collector too, whose pass may take it
// while ours finds none.
func (h *oneHost) flowLeft(t *testing.T, flow contivbpfCbCtKey) bool {
	t.Helper()
	for i := 0; i < 20; i++ {
		if _, err := h.d.CTGC(context.Background()); err != nil {
			t.Fatal(err)
		}
		var e contivbpfCbCtEntry
		if h.d.objs.CbCt.Lookup(&flow, &e) != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// putFlow writes an established, allowed conntrack entry for flow, live for an hour.
func (h *oneHost) putFlow(t *testing.T, flow contivbpfCbCtKey) {
	t.Helper()
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	v := contivbpfCbCtEntry{Flags: uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), State: uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED), Expires: now + uint64(time.Hour)}
	if err := h.d.objs.CbCt.Put(&flow, &v); err != nil {
		t.Fatal(err)
	}
}

// A local address never changes hands while its record lives: a container dies (its veth
// goes with its namespace), and one started again with its address is refused until the
// old record is deleted, which removes the address's endpoint entry and flushes its
// conntrack entries (so the new container starts with no flow of the old one's).
func TestLocalAddressInUse(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{h.net}}); err != nil {
		t.Fatal(err)
	}
	old, repl := h.endpoint(t, "old", "10.50.0.9", true), h.endpoint(t, "new", "10.50.0.9", true)
	if err := h.d.UpsertEndpoint(ctx, old); err != nil {
		t.Fatal(err)
	}
	key := h.d.eps.endpoints[indexKey(old.ID)].key
	nr, ok := h.d.networkByKey(key.Net)
	if !ok {
		t.Fatal("no network record for the endpoint's key")
	}
	flow := contivbpfCbCtKey{Zone: nr.vrf, Saddr: ip4(netip.MustParseAddr("10.50.0.2")), Daddr: key.Ip, Sport: nport(40000), Dport: nport(80), Proto: 6}
	h.putFlow(t, flow)
	nl := netlinkIn(t, h.cfg.NetNS)
	defer nl.Close()
	l, err := nl.LinkByName(old.HostIfName)
	if err == nil {
		err = nl.LinkDel(l)
	}
	if err != nil {
		t.Fatalf("the old container's veth: %v", err)
	}
	if err := h.d.UpsertEndpoint(ctx, repl); err == nil || !strings.Contains(err.Error(), "already used by local endpoint "+old.ID) {
		t.Fatalf("the new container with the dead one's address: %v, want refused (in use by %s)", err, old.ID)
	}
	if h.d.objs.CbEndpoints.Lookup(&key, new(contivbpfCbEndpoint)) != nil {
		t.Fatal("the refused upsert removed the old record's endpoint entry")
	}
	if err := h.d.DeleteEndpoint(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if h.flowLeft(t, flow) {
		t.Fatal("the address's conntrack entries outlived its record")
	}
	if err := h.d.UpsertEndpoint(ctx, repl); err != nil {
		t.Fatalf("the new container once the old record is gone: %v", err)
	}
	var e contivbpfCbEndpoint
	if err := h.d.objs.CbEndpoints.Lookup(&key, &e); err != nil || int(e.Ifindex) != h.d.eps.endpoints[indexKey(repl.ID)].ifindex {
		t.Fatalf("the address's entry %+v (%v), want the new container's veth", e, err)
	}
}

// An address changes hands: a remote endpoint moves to another host and its new record
// (another id, the same address) arrives before the old one's deletion. Deleting the old
// record keeps the new one's endpoint entry and the address's conntrack entries (its
// flows now); deleting the last record of the address removes both.
func TestAddressHandover(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	x := netip.MustParseAddr("10.50.0.9")
	remote := func(id, vtep, host string) dataplane.RemoteEndpoint {
		return dataplane.RemoteEndpoint{ID: id, NetworkID: h.net.ID, IP: x, MAC: dataplane.ContivMAC(x),
			VTEP: netip.MustParseAddr(vtep), Host: host}
	}
	r1, r2 := remote("red.t-r1", "10.254.0.2", "h2"), remote("red.t-r2", "10.254.0.3", "h3")
	state := dataplane.State{Networks: []dataplane.Network{h.net}, RemoteEndpoints: []dataplane.RemoteEndpoint{r1},
		Peers: []dataplane.Peer{{Host: "h2", VTEP: r1.VTEP}, {Host: "h3", VTEP: r2.VTEP}}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	key := h.d.eps.remotes[r1.ID].key
	nr, ok := h.d.networkByKey(key.Net)
	if !ok {
		t.Fatal("no network record for the remote endpoint's key")
	}
	flow := contivbpfCbCtKey{Zone: nr.vrf, Saddr: ip4(netip.MustParseAddr("10.50.0.2")), Daddr: ip4(x), Sport: nport(40000), Dport: nport(80), Proto: 6}
	h.putFlow(t, flow)
	vtepOf := func() (netip.Addr, bool) {
		t.Helper()
		var e contivbpfCbEndpoint
		if err := h.d.objs.CbEndpoints.Lookup(&key, &e); err != nil {
			return netip.Addr{}, false
		}
		return addrFrom(e.Vtep), true
	}
	flowLeft := func() bool { return h.flowLeft(t, flow) }

	if err := h.d.UpsertRemoteEndpoint(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if err := h.d.DeleteRemoteEndpoint(ctx, r1.ID); err != nil {
		t.Fatal(err)
	}
	if vtep, ok := vtepOf(); !ok || vtep != r2.VTEP {
		t.Fatalf("after the old record's deletion the address's entry is at VTEP %v (present %v), want %v", vtep, ok, r2.VTEP)
	}
	if !flowLeft() {
		t.Fatal("the old record's deletion flushed the flows of the address's new holder")
	}

	if err := h.d.DeleteRemoteEndpoint(ctx, r2.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := vtepOf(); ok {
		t.Fatal("the address's entry outlived its last record")
	}
	if flowLeft() {
		t.Fatal("the address's conntrack entries outlived its last record")
	}
}
