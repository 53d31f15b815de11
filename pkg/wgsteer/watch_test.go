package wgsteer

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestPeersFollowTheWatch (issue 38): with the directory a masterclient on a private etcd
// and polling off (Every one hour), a peer host's record written to etcd is applied to
// the device and the steering table within a fraction of a second (before: read every
// second by polling, so this waited for the next poll), and its deletion (a departed
// host) removes its WireGuard peer and its route at once: its VTEP falls to the
// blackhole. A watch broken while records change and the history is compacted (etcd cut
// off through a proxy, records written and compacted, etcd back) lists again and applies
// what changed.
func TestPeersFollowTheWatch(t *testing.T) {
	testroot.Need(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, url := statetest.Store(t)
	proxy := statetest.NewProxy(t, url)
	viaProxy, err := state.Open(ctx, []string{proxy.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })

	ns, tun := oneHost(t, ctx, "cbsw", "192.168.80.1/24")
	vtep := netip.MustParseAddr("192.168.80.1")
	put := func(host string, key wgtypes.Key, endpoint string) {
		t.Helper()
		if err := direct.Put(ctx, model.WireGuardKey(host), model.WireGuardHost{Host: host, PublicKey: key.String(), Endpoint: endpoint}); err != nil {
			t.Fatal(err)
		}
	}
	put("a", tun.PublicKey(), "192.168.80.1:51820") // (published: no netmaster needed)
	s := runSteer(t, Config{NetNS: ns, Device: tun, Directory: masterclient.New(viaProxy), Host: "a", VTEP: vtep, Every: time.Hour,
		Routing: Routing{VXLANPort: 4789}, Peers: func() []dataplane.Peer {
			return []dataplane.Peer{{Host: "b", VTEP: netip.MustParseAddr("192.168.80.2")}, {Host: "c", VTEP: netip.MustParseAddr("192.168.80.3")}}
		}})

	// within waits until ok holds and returns how long that took.
	within := func(what string, limit time.Duration, ok func(Status) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < limit {
			if ok(s.Status()) {
				return time.Since(start)
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("%s: not within %s: status %+v", what, limit, s.Status())
		return 0
	}
	keyed := func(hosts ...string) func(Status) bool {
		return func(st Status) bool { return st.Published && slices.Equal(st.Keyed, hosts) }
	}
	within("first snapshot", 5*time.Second, keyed())
	// device is the device's peer keys and the steering table's routes into it.
	device := func() (keys []wgtypes.Key, routes []netip.Addr) {
		t.Helper()
		ps, err := tun.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			keys = append(keys, p.PublicKey)
		}
		rs, err := s.routes()
		if err != nil {
			t.Fatal(err)
		}
		for a := range rs {
			routes = append(routes, a)
		}
		slices.SortFunc(routes, func(x, y netip.Addr) int { return x.Compare(y) })
		return keys, routes
	}

	kb, _ := wgtypes.GeneratePrivateKey()
	start := time.Now()
	put("b", kb.PublicKey(), "192.168.80.2:51820")
	within("b's record applied (polling off)", 400*time.Millisecond, keyed("b"))
	t.Logf("a record written to etcd was applied in %s", time.Since(start))
	if keys, routes := device(); !slices.Equal(keys, []wgtypes.Key{kb.PublicKey()}) || !slices.Equal(routes, []netip.Addr{netip.MustParseAddr("192.168.80.2")}) {
		t.Fatalf("b keyed: device peers %v, routes %v", keys, routes)
	}

	start = time.Now()
	if _, err := direct.Delete(ctx, model.WireGuardKey("b")); err != nil {
		t.Fatal(err)
	}
	within("b's record deleted", 400*time.Millisecond, func(st Status) bool { return len(st.Keyed) == 0 && slices.Contains(st.Waiting, "b") })
	t.Logf("a record deleted from etcd was applied in %s", time.Since(start))
	if keys, routes := device(); len(keys) != 0 || len(routes) != 0 {
		t.Fatalf("b's record deleted: device peers %v, routes %v; want none (its VTEP to the blackhole)", keys, routes)
	}

	// The watch breaks; meanwhile c publishes and the history is compacted past the
	// watch's revision: the resumed watch is refused (compacted) and lists again.
	proxy.Cut()
	time.Sleep(100 * time.Millisecond)
	kc, _ := wgtypes.GeneratePrivateKey()
	put("c", kc.PublicKey(), "192.168.80.3:51820")
	put("b", kb.PublicKey(), "192.168.80.2:51820")
	if _, err := direct.Delete(ctx, model.WireGuardKey("b")); err != nil {
		t.Fatal(err)
	}
	r, err := direct.Client().Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Client().Compact(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	proxy.Mend()
	within("c's record after the compacted watch", 15*time.Second, keyed("c"))
	t.Logf("after etcd came back, the compacted watch recovered in %s", time.Since(start))
	if keys, routes := device(); !slices.Equal(keys, []wgtypes.Key{kc.PublicKey()}) || !slices.Equal(routes, []netip.Addr{netip.MustParseAddr("192.168.80.3")}) {
		t.Fatalf("c keyed: device peers %v, routes %v", keys, routes)
	}
}
