package wgtunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/internal/testkit/dockertest"
	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// xhost is one simulated host of TestCrossHostThroughPublishedKeys.
type xhost struct {
	name, ns, nsName string
	underlay         netip.Addr // its address on the wire to host2
	inner            netip.Prefix
	tun              *Tunnel
	mc               *masterclient.Client
}

// ipIn runs `ip -n ns args...`.
func ipIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %v: %v: %s", ns, args, err, out)
	}
}

// ping reports whether from gets an echo reply from to within count tries.
func ping(from *xhost, to netip.Addr, count int) bool {
	return exec.Command("nsenter", "--net="+from.ns, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "1", to.String()).Run() == nil
}

// pingUntil waits (up to 5 s: the first packet waits for the handshake) for a reply.
func pingUntil(t *testing.T, from *xhost, to netip.Addr) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if ping(from, to, 1) {
			return
		}
	}
	t.Fatalf("%s → %s over WireGuard: no reply", from.name, to)
}

// rxPackets is the received packet count of link in ns.
func rxPackets(t *testing.T, ns, link string) uint64 {
	t.Helper()
	var n uint64
	err := nsexec.Run(ns, func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		n = l.Attrs().Statistics.RxPackets
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCrossHostThroughPublishedKeys (issue 38): host1 and host2, each a namespace with a
// WireGuard device of this package, joined by a veth underlay, publish their keys through
// netmaster with their own agent tokens and take each other as peers from what is
// published: ping across the WireGuard addresses works. host3 (its own namespace, wire
// and key) cannot publish its key as host2's (403); host2 does not list it, so its
// handshakes reach host2 (counted on the wire) and get no answer, until host2 takes it
// as a peer (the control: then it is answered). Removing host1 from host2's peers stops
// host1's traffic to host2, though host1 still holds a session.
func TestCrossHostThroughPublishedKeys(t *testing.T) {
	testroot.Need(t)
	ctx := context.Background()
	store, _ := statetest.Store(t)
	m, err := master.New(ctx, master.Config{Store: store, FwdMode: "bridge", ClusterMode: "docker"})
	if err != nil {
		t.Fatal(err)
	}
	// Real agent tokens, each bound to its host.
	id := dockertest.RandHex(3)
	tokens := map[string]string{}
	var lines []string
	for _, h := range []string{"host1", "host2", "host3"} {
		tokens[h] = h + "-token-" + dockertest.RandHex(8)
		lines = append(lines, tokens[h]+" agent host:"+h)
	}
	tokFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	toks, err := auth.LoadTokens(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(auth.Middleware(auth.Config{Tokens: toks}, slog.New(slog.DiscardHandler), m.Handler()))
	defer srv.Close()
	if _, err := store.Client().Put(ctx, state.LeaderLockKey, strings.TrimPrefix(srv.URL, "http://")); err != nil {
		t.Fatal(err)
	}

	// host1 -- host2 -- host3: two veth wires, each host's end named "u".
	hosts := map[string]*xhost{}
	for i, h := range []string{"host1", "host2", "host3"} {
		nsName := fmt.Sprintf("cbwgx%d-%s", i+1, id)
		hosts[h] = &xhost{name: h, nsName: nsName, ns: testNS(t, nsName),
			inner: netip.MustParsePrefix(fmt.Sprintf("10.210.0.%d/24", i+1)),
			mc:    masterclient.New(store, masterclient.WithToken(tokens[h]))}
	}
	h1, h2, h3 := hosts["host1"], hosts["host2"], hosts["host3"]
	wire := func(a *xhost, aAddr string, b *xhost, bAddr, bLink string) {
		la, lb := "cbwgv"+id+"a", "cbwgv"+id+"b"
		if out, err := exec.Command("ip", "link", "add", la, "netns", a.nsName, "type", "veth", "peer", "name", lb, "netns", b.nsName).CombinedOutput(); err != nil {
			t.Fatalf("veth: %v: %s", err, out)
		}
		ipIn(t, a.nsName, "link", "set", la, "name", "u")
		ipIn(t, b.nsName, "link", "set", lb, "name", bLink)
		ipIn(t, a.nsName, "addr", "add", aAddr, "dev", "u")
		ipIn(t, b.nsName, "addr", "add", bAddr, "dev", bLink)
		ipIn(t, a.nsName, "link", "set", "u", "up")
		ipIn(t, b.nsName, "link", "set", bLink, "up")
		a.underlay = netip.MustParsePrefix(aAddr).Addr()
	}
	wire(h1, "10.201.0.1/24", h2, "10.201.0.2/24", "u")
	wire(h3, "10.202.0.3/24", h2, "10.202.0.2/24", "u3")
	h2.underlay = netip.MustParseAddr("10.201.0.2")

	for i, h := range []*xhost{h1, h2, h3} {
		h.tun, err = Open(ctx, Config{NetNS: h.ns, Name: fmt.Sprintf("cbwg%s%d", id, i+1), StateDir: t.TempDir(), Address: h.inner})
		if err != nil {
			t.Fatal(err)
		}
		defer h.tun.Close()
	}
	publish := func(h *xhost, as string, ep netip.Addr) error {
		return h.mc.PublishWireGuard(ctx, model.WireGuardHost{Host: as, PublicKey: h.tun.PublicKey().String(),
			Endpoint: netip.AddrPortFrom(ep, uint16(h.tun.ListenPort())).String()})
	}
	for _, h := range []*xhost{h1, h2} {
		if err := publish(h, h.name, h.underlay); err != nil {
			t.Fatalf("%s publishes its key: %v", h.name, err)
		}
	}
	var he *masterclient.HTTPError
	if err := publish(h3, "host2", netip.MustParseAddr("10.202.0.3")); !errors.As(err, &he) || he.Status != http.StatusForbidden {
		t.Fatalf("host3 publishes its key as host2's: %v, want 403", err)
	}

	// Each host's peers: every other published host, allowed its WireGuard address.
	sync := func(h *xhost, extra ...Peer) {
		t.Helper()
		recs, skipped, err := h.mc.WireGuardHosts(ctx)
		if err != nil || skipped != 0 || len(recs) != 2 {
			t.Fatalf("%s reads the published keys: %+v (%d skipped) %v", h.name, recs, skipped, err)
		}
		var peers []Peer
		for _, r := range recs {
			if r.Host == h.name {
				continue
			}
			p, err := PeerOf(r, []netip.Prefix{netip.PrefixFrom(hosts[r.Host].inner.Addr(), 32)})
			if err != nil {
				t.Fatal(err)
			}
			peers = append(peers, p)
		}
		if _, err := h.tun.SyncPeers(ctx, append(peers, extra...)); err != nil {
			t.Fatalf("%s syncs its peers: %v", h.name, err)
		}
	}
	sync(h1)
	sync(h2)
	pingUntil(t, h1, h2.inner.Addr())
	pingUntil(t, h2, h1.inner.Addr())

	// host3 takes host2 as its peer (its key and endpoint are public); host2 does not.
	h3peer := Peer{PublicKey: h3.tun.PublicKey(), Endpoint: netip.MustParseAddrPort(fmt.Sprintf("10.202.0.3:%d", h3.tun.ListenPort())),
		AllowedIPs: []netip.Prefix{netip.PrefixFrom(h3.inner.Addr(), 32)}}
	p2, err := PeerOf(model.WireGuardHost{Host: "host2", PublicKey: h2.tun.PublicKey().String(),
		Endpoint: fmt.Sprintf("10.202.0.2:%d", h2.tun.ListenPort())}, []netip.Prefix{netip.PrefixFrom(h2.inner.Addr(), 32)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h3.tun.SyncPeers(ctx, []Peer{p2}); err != nil {
		t.Fatal(err)
	}
	rx := rxPackets(t, h2.ns, "u3")
	if ping(h3, h2.inner.Addr(), 3) {
		t.Fatal("host3, not a peer of host2, got an answer")
	}
	if got := rxPackets(t, h2.ns, "u3"); got == rx {
		t.Fatal("host3's packets never reached host2: the refusal proves nothing")
	}
	if peers, _ := h2.tun.Peers(ctx); len(peers) != 1 {
		t.Fatalf("host2's peers: %+v, want host1 only", peers)
	}
	// Control: once host2 lists it, host3 is answered; then it is taken out again.
	sync(h2, h3peer)
	pingUntil(t, h3, h2.inner.Addr())
	sync(h2)
	if ping(h3, h2.inner.Addr(), 3) {
		t.Fatal("host3, removed from host2's peers, still answered")
	}

	// Removing host1 from host2's peers stops host1's traffic, though host1 still has host2
	// and a live session.
	pingUntil(t, h1, h2.inner.Addr())
	if _, err := h2.tun.SyncPeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if ping(h1, h2.inner.Addr(), 3) {
		t.Fatal("host1, removed from host2's peers, still answered")
	}
	// Taken back, host2 knows none of host1's sessions: host1's old one is dropped until
	// host1 handshakes again (WireGuard's own retry comes after 15 s without an answer;
	// re-adding host2 on host1 starts one now).
	sync(h2)
	if _, err := h1.tun.SyncPeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	sync(h1)
	pingUntil(t, h1, h2.inner.Addr())
}
