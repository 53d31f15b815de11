package ebpf

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// TestPolicyCompiledAtUpgrade: an agent starting where an earlier build left only
// cb_policies (the build that scanned it: no compiled maps pinned) compiles every rule
// list before its programs take the links, so the rules hold without a gap: a stream
// the rules allow loses nothing and datagrams they deny never arrive, before and after
// the new agent's first Sync.
func TestPolicyCompiledAtUpgrade(t *testing.T) {
	h := newOneHost(t)
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 11, 12
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		Policies: []dataplane.PolicySet{{EPGID: 12, Rules: []dataplane.PolicyRule{
			{ID: "deny-9997", Priority: 5, Ingress: true, Proto: 17, Port: 9997, Action: dataplane.ActionDeny},
			{ID: "deny-a-tcp", Priority: 3, Ingress: true, Remote: netip.PrefixFrom(a.IP, 32), Proto: 6, Action: dataplane.ActionDeny}}}}}
	compiledAtUpgrade(t, h, a, b, state, []string{contivbpfMapCbPolHeads, contivbpfMapCbPolRules, contivbpfMapCbPolCidrs},
		func(d *Driver) *ebpf.Map { return d.objs.CbPolHeads }, 1) // group 12 ingress
	if failed := h.d.FailedPolicies(); len(failed) != 0 {
		t.Errorf("failed closed: %v", failed)
	}
}

// TestNetpolCompiledAtUpgrade: likewise for NetworkPolicy rule sets, whose earlier build
// scanned cb_ksets: compiled at start (compilePinnedKSets) before the links move, so the
// pod's allow-list holds across the start.
func TestNetpolCompiledAtUpgrade(t *testing.T) {
	h := newOneHost(t)
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		PodPolicies: []dataplane.PodPolicy{{ID: b.ID, NetworkID: b.NetworkID, IP: b.IP, IngressIsolated: true,
			Ingress: []dataplane.PodRule{{Remote: netip.PrefixFrom(a.IP, 32), Proto: 17, PortMin: 9998, PortMax: 9998},
				{Remote: netip.MustParsePrefix("10.9.0.0/16")}}}}}
	compiledAtUpgrade(t, h, a, b, state, []string{contivbpfMapCbKsetHeads, contivbpfMapCbKcidrs},
		func(d *Driver) *ebpf.Map { return d.objs.CbKsetHeads }, 1) // b's ingress set
}

// compiledAtUpgrade syncs state (a → b: UDP 9998 allowed, 9997 denied), streams 9998 and
// probes 9997 while the agent restarts on a layout without the pinned maps pins (an
// earlier build's), and checks that nothing allowed is lost, nothing denied arrives, and
// heads(d) holds wantHeads entries before and after the new agent's first Sync.
func compiledAtUpgrade(t *testing.T, h *oneHost, a, b dataplane.Endpoint, state dataplane.State, pins []string,
	heads func(*Driver) *ebpf.Map, wantHeads int) {
	t.Helper()
	ctx := context.Background()
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	// Datagrams to the denied port, counted where they would arrive.
	var denied atomic.Int64
	var rx *net.UDPConn
	if err := nsexec.Run(b.NetNS, func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: b.IP.AsSlice(), Port: 9997})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := rx.Read(buf); err != nil {
				return
			}
			denied.Add(1)
		}
	}()
	probe := func(n int) {
		t.Helper()
		if err := nsexec.Run(a.NetNS, func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: b.IP.AsSlice(), Port: 9997})
			if err != nil {
				return err
			}
			defer c.Close()
			for i := 0; i < n; i++ {
				_, _ = c.Write([]byte("denied"))
				time.Sleep(200 * time.Microsecond)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	stop := udpStream(t, a, b, 9998)
	probe(50)
	// The earlier build had no compiled maps: their pins go (the running programs keep
	// theirs), and the agent stops without touching the datapath.
	for _, m := range pins {
		if err := os.Remove(filepath.Join(h.cfg.PinRoot, m)); err != nil {
			stop()
			t.Fatal(err)
		}
	}
	oldHeads := mapIDOf(t, heads(h.d))
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); probe(200) }()
	d, err := New(ctx, h.cfg.HostConfig, h.cfg.Options)
	if err != nil {
		stop()
		t.Fatalf("start on the earlier layout: %v", err)
	}
	h.d = d
	<-done
	if mapIDOf(t, heads(d)) == oldHeads {
		t.Error("the new agent uses the old compiled maps")
	}
	if n := countEntries(t, heads(d)); n != wantHeads {
		t.Errorf("compiled heads before Sync: %d, want %d", n, wantHeads)
	}
	probe(50)
	if err := d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	probe(50)
	time.Sleep(100 * time.Millisecond)
	sent, lost := stop()
	t.Logf("upgrade: %d allowed datagrams sent, %d lost; %d denied datagrams arrived", sent, lost, denied.Load())
	if lost != 0 {
		t.Errorf("%d of %d allowed datagrams lost across the start", lost, sent)
	}
	if n := denied.Load(); n != 0 {
		t.Errorf("%d denied datagrams arrived", n)
	}
	if n := countEntries(t, heads(d)); n != wantHeads {
		t.Errorf("compiled heads after Sync: %d, want %d", n, wantHeads)
	}
}

// TestPolicyResizeKeepsOldProgramsDenying (found by review): a start with another
// MapEntries migrates cb_pol_rules and cb_pol_cidrs (their size follows MapEntries). When
// cb_pol_heads stayed shared, compilePinnedPolicies wrote the new versions' keys into the
// new, not yet pinned maps and their heads into the shared heads, long before the links
// moved to this build's programs: the running programs read heads whose versions their
// rules map never had, every lookup missed, and every group failed open (conntrack kept
// what passed). The three migrate together now (migrationGroups). The old program is kept
// here (cloned before the restart) and run after the start: what it does is what every
// endpoint's link does during the window.
func TestPolicyResizeKeepsOldProgramsDenying(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", false)
	b := h.endpoint(t, "b", "10.50.0.3", false)
	a.EPGID, b.EPGID = 11, 12
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		Policies: []dataplane.PolicySet{{EPGID: 12, Rules: []dataplane.PolicyRule{
			{ID: "deny-9997", Priority: 5, Ingress: true, Proto: 17, Port: 9997, Action: dataplane.ActionDeny}}}}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	// The running build's program and the maps it keeps across the restart.
	old := &contivbpfObjects{}
	var err error
	if old.CbFromContainer, err = h.d.objs.CbFromContainer.Clone(); err != nil {
		t.Fatal(err)
	}
	if old.CbReasons, err = h.d.objs.CbReasons.Clone(); err != nil {
		t.Fatal(err)
	}
	if old.CbIfaces, err = h.d.objs.CbIfaces.Clone(); err != nil {
		t.Fatal(err)
	}
	if old.CbIfaceDirect, err = h.d.objs.CbIfaceDirect.Clone(); err != nil {
		t.Fatal(err)
	}
	// Its stages: the links run them until they take the new programs (the pin that keeps
	// them goes after that; this handle keeps them for the test's run).
	if old.CbCalls, err = h.d.objs.CbCalls.Clone(); err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	// BPF_PROG_TEST_RUN runs on lo: give lo a's interface entry (in the old maps only).
	aIf, err := old.ifaceTable().lookup(uint32(h.d.eps.endpoints[indexKey(a.ID)].ifindex))
	if err != nil {
		t.Fatal(err)
	}
	asA := func() {
		if err := old.ifaceTable().put(uint32(loIfindex), &aIf, nil); err != nil {
			t.Fatal(err)
		}
	}
	denied := l4Frame(17, a.IP, b.IP, 40000, 9997, 0, 0)
	asA()
	run(t, old, old.CbFromContainer, denied, nil).expect(t, tcActShot, DropPolicy)
	if err := old.ifaceTable().del(uint32(loIfindex)); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	big := h.cfg
	big.MapEntries = 2048
	d, err := New(ctx, big.HostConfig, big.Options)
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	asA()
	defer func() { _ = old.ifaceTable().del(uint32(loIfindex)) }()
	r := run(t, old, old.CbFromContainer, l4Frame(17, a.IP, b.IP, 40001, 9997, 0, 0), nil)
	if r.ret != tcActShot || r.diff[DropPolicy] != 1 {
		t.Errorf("a datagram the rules deny, through the program still on the links while the new agent starts with another MapEntries: verdict %d, reasons %v (want dropped by policy): every group fails open until the links move", r.ret, r.diff)
	}
}
