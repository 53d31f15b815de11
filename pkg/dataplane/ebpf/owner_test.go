package ebpf

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

func TestSplitAlias(t *testing.T) {
	for _, c := range []struct{ alias, tag, ik string }{
		{"contivbpf:red.t-a", "", "red.t-a"},
		{"contivbpf:0123abcd:red.t-a", "0123abcd", "red.t-a"},
		{"contivbpf:sha256:00ff", "", "sha256:00ff"},
		{"contivbpf:0123ABCD:x", "", "0123ABCD:x"},
		{"contivbpf:0123abcd:", "", "0123abcd:"},
	} {
		tag, ik, ok := splitAlias(c.alias)
		if !ok || tag != c.tag || ik != c.ik {
			t.Errorf("splitAlias(%q) = %q, %q, %v; want %q, %q", c.alias, tag, ik, ok, c.tag, c.ik)
		}
	}
	for _, a := range []string{"", "contivbpf:", "other:x"} {
		if _, _, ok := splitAlias(a); ok {
			t.Errorf("splitAlias(%q) ok", a)
		}
	}
}

// Two agents in one network namespace with different pin roots: neither adopts, sweeps
// nor tears down the other's endpoint veths.
func TestTwoAgentsOneNetNS(t *testing.T) {
	a := newOneHost(t)
	ctx := context.Background()
	cfgB := a.cfg
	cfgB.Host, cfgB.PinRoot, cfgB.VXLANIf, cfgB.VXLANPort = "h2", filepath.Join(filepath.Dir(a.cfg.PinRoot), "h2"), "cbevx1", 4790
	b, err := New(ctx, cfgB.HostConfig, cfgB.Options)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !b.closed {
			_ = b.Teardown(context.Background())
		}
	})
	if pinTag(a.cfg.PinRoot) == pinTag(cfgB.PinRoot) {
		t.Fatal("pin tags collide")
	}
	epA := a.endpoint(t, "a", "10.50.0.2", false)
	if err := a.d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{a.net}, Endpoints: []dataplane.Endpoint{epA}}); err != nil {
		t.Fatal(err)
	}

	nl := netlinkIn(t, a.cfg.NetNS)
	defer nl.Close()
	exists := func(name string) bool {
		_, err := nl.LinkByName(name)
		return err == nil
	}
	// Scoped aliases (the format endpointAlias builds): one of a third agent, one of b.
	veth := func(name, alias string) {
		t.Helper()
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
		if err := nl.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetAlias(v, alias); err != nil {
			t.Fatal(err)
		}
	}
	// a's veth with a legacy alias (an older build's): b, asked for the same endpoint
	// (same id, same host name), refuses it and leaves it alone (up, its program alone).
	if hl, err := nl.LinkByName(epA.HostIfName); err != nil {
		t.Fatal(err)
	} else if err := nl.LinkSetAlias(hl, aliasPrefix+indexKey(epA.ID)); err != nil {
		t.Fatal(err)
	}
	if err := b.UpsertNetwork(ctx, a.net); err != nil {
		t.Fatal(err)
	}
	if err := b.UpsertEndpoint(ctx, epA); err == nil {
		t.Error("b took a's legacy-alias veth for its own endpoint")
	}
	if hl, err := nl.LinkByName(epA.HostIfName); err != nil || hl.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("b's refused apply left a's veth gone or down (%v)", err)
	}
	if _, ok := b.links[epA.HostIfName]; ok {
		t.Error("b attached its program to a's veth")
	}
	// A legacy-alias veth no program judges (its agent's pins lost) is an orphan: b,
	// asked for that endpoint, takes it and attaches its program.
	epZ := a.endpoint(t, "z", "10.50.0.9", false)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: epZ.HostIfName, Flags: net.FlagUp}, PeerName: epZ.IfName}); err != nil {
		t.Fatal(err)
	}
	if hl, err := nl.LinkByName(epZ.HostIfName); err != nil {
		t.Fatal(err)
	} else if err := nl.LinkSetAlias(hl, aliasPrefix+indexKey(epZ.ID)); err != nil {
		t.Fatal(err)
	}
	if err := b.UpsertEndpoint(ctx, epZ); err != nil {
		t.Errorf("b refused an orphan legacy-alias veth: %v", err)
	} else if _, ok := b.links[epZ.HostIfName]; !ok {
		t.Error("b took the orphan without attaching its program")
	}

	other := pinTag("/sys/fs/bpf/" + a.prefix + "/elsewhere")
	veth(a.prefix+"o", aliasPrefix+other+":red.t-o")
	veth(a.prefix+"s", b.endpointAlias("red.t-s"))

	// b restarts: it adopts nothing of a's.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err = New(ctx, cfgB.HostConfig, cfgB.Options); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.eps.endpoints[indexKey(epA.ID)]; ok {
		t.Errorf("b adopted a's endpoint veth")
	}
	if err := b.Sync(ctx, dataplane.State{}); err != nil {
		t.Fatal(err)
	}
	if !exists(epA.HostIfName) {
		t.Errorf("b's empty Sync removed a's endpoint veth %s", epA.HostIfName)
	}
	if !exists(a.prefix + "o") {
		t.Errorf("b's empty Sync removed a third agent's veth")
	}
	if exists(a.prefix + "s") {
		t.Errorf("b's empty Sync kept its own (scoped alias) stale veth")
	}
	if err := b.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(epA.HostIfName) || !exists(a.prefix+"o") {
		t.Errorf("b's Teardown removed a veth it does not own")
	}

	// a (legacy alias, endpoint in its pinned maps) still adopts its veth after a restart.
	if err := a.d.Close(); err != nil {
		t.Fatal(err)
	}
	a.d = a.start(t)
	if r, ok := a.d.eps.endpoints[indexKey(epA.ID)]; !ok || r.hostIf != epA.HostIfName {
		t.Fatalf("a did not adopt its endpoint after restart: %+v", a.d.eps.endpoints)
	}
	if err := a.d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{a.net}}); err != nil {
		t.Fatal(err)
	}
	if exists(epA.HostIfName) {
		t.Errorf("a's Sync without the endpoint kept its veth")
	}
	if !exists(a.prefix + "o") {
		t.Errorf("a's Sync removed a third agent's veth")
	}
}
