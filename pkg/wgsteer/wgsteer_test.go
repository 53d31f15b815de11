package wgsteer

import (
	"context"
	"encoding/binary"
	"errors"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/dockertest"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
	"github.com/contivbpf/contivbpf/pkg/wgtunnel"
)

// directory is an in-memory Directory; hidden hosts' records are withheld. Its watchers
// hear of every change.
type directory struct {
	mu       sync.Mutex
	recs     map[string]model.WireGuardHost
	hidden   map[string]bool
	watchers []chan struct{}
}

func (d *directory) PublishWireGuard(_ context.Context, rec model.WireGuardHost) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var prev *model.WireGuardHost
	if r, ok := d.recs[rec.Host]; ok {
		prev = &r
	}
	d.recs[rec.Host] = rec.Republished(prev) // (as netmaster)
	d.changed()
	return nil
}

// set replaces host's record as written around the agent (netmaster on an admin's
// request, a replayed or older record) and tells the watchers.
func (d *directory) set(rec model.WireGuardHost) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recs[rec.Host] = rec
	d.changed()
}

// record is host's record now.
func (d *directory) record(host string) model.WireGuardHost {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.recs[host]
}

// forget deletes host's record.
func (d *directory) forget(host string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.recs, host)
	d.changed()
}

// changed tells every watcher (d.mu held).
func (d *directory) changed() {
	for _, ch := range d.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (d *directory) WatchWireGuardHosts(ctx context.Context, fn func([]model.WireGuardHost, int), health func(error)) error {
	health(nil)
	ch := make(chan struct{}, 1)
	d.mu.Lock()
	d.watchers = append(d.watchers, ch)
	d.mu.Unlock()
	for {
		hosts, skipped, _ := d.WireGuardHosts(ctx)
		fn(hosts, skipped)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

func (d *directory) WireGuardHosts(context.Context) ([]model.WireGuardHost, int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []model.WireGuardHost
	for h, r := range d.recs {
		if !d.hidden[h] {
			out = append(out, r)
		}
	}
	return out, 0, nil
}

func (d *directory) hide(host string, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hidden[host] = on
	d.changed()
}

// udpPorts counts the IPv4 UDP frames of frames by destination port.
func udpPorts(frames [][]byte) map[uint16]int {
	out := map[uint16]int{}
	for _, f := range frames {
		if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 || f[14+9] != 17 {
			continue
		}
		ihl := int(f[14]&0xf) * 4
		if len(f) < 14+ihl+4 {
			continue
		}
		out[binary.BigEndian.Uint16(f[14+ihl+2:])]++
	}
	return out
}

// TestSteerFailsClosed: two hosts joined by a veth underlay, each with a WireGuard device
// and its steering. While B's key is withheld, A's packets to B's VTEP on the VXLAN port
// go nowhere (the steering table's blackhole): the underlay capture sees none of them in
// clear, though a packet to another port does cross in clear (the capture works), and A
// reports B waiting. Once B's key is published, the same packets reach B's socket from
// A's VTEP and the underlay holds only WireGuard's UDP port, no VXLAN port. Withheld
// again, B's route goes and nothing crosses in clear.
// twoHosts is two network namespaces joined by a veth underlay, 192.168.77.1 (A) and .2
// (B), strict reverse-path filtering in both (decrypted packets must pass it).
type twoHosts struct {
	id, nsA, nsB, pa, pb, va, vb string
	vtepA, vtepB                 netip.Addr
}

func newTwoHosts(t *testing.T, prefix string) twoHosts {
	t.Helper()
	testroot.Need(t)
	id := dockertest.RandHex(3)
	h := twoHosts{id: id, nsA: prefix + "-" + id + "a", nsB: prefix + "-" + id + "b", va: prefix + "a" + id, vb: prefix + "b" + id,
		vtepA: netip.MustParseAddr("192.168.77.1"), vtepB: netip.MustParseAddr("192.168.77.2")}
	dockertest.NetNS(t, h.nsA)
	dockertest.NetNS(t, h.nsB)
	h.pa, h.pb = "/run/netns/"+h.nsA, "/run/netns/"+h.nsB
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("link", "add", h.va, "netns", h.nsA, "type", "veth", "peer", "name", h.vb, "netns", h.nsB)
	run("-n", h.nsA, "addr", "add", "192.168.77.1/24", "dev", h.va)
	run("-n", h.nsB, "addr", "add", "192.168.77.2/24", "dev", h.vb)
	run("-n", h.nsA, "link", "set", h.va, "up")
	run("-n", h.nsB, "link", "set", h.vb, "up")
	for _, ns := range []string{h.nsA, h.nsB} {
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1").CombinedOutput(); err != nil {
			t.Fatalf("rp_filter in %s: %v: %s", ns, err, out)
		}
	}
	return h
}

// openSteer opens a WireGuard device named name in namespace ns and installs host's
// steering towards peer through it, its record published in dir.
func openSteer(t *testing.T, ctx context.Context, dir Directory, ns, name, host string, vtep netip.Addr, peer dataplane.Peer) *Steer {
	t.Helper()
	tun, err := wgtunnel.Open(ctx, wgtunnel.Config{NetNS: ns, Name: name, StateDir: t.TempDir(), ListenPort: 51820, FirewallMark: DefaultMark,
		Address: netip.MustParsePrefix(DeviceAddress)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tun.Close() })
	s, err := Install(Config{NetNS: ns, Device: tun, Directory: dir, Host: host, VTEP: vtep,
		Routing: Routing{VXLANPort: 4789}, Peers: func() []dataplane.Peer { return []dataplane.Peer{peer} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.publish(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSteerFailsClosed(t *testing.T) {
	ctx := context.Background()
	h := newTwoHosts(t, "cbst")
	id, pa, pb, vb := h.id, h.pa, h.pb, h.vb
	vtepA, vtepB := h.vtepA, h.vtepB

	dir := &directory{recs: map[string]model.WireGuardHost{}, hidden: map[string]bool{"b": true}}
	open := func(ns, name string, host string, vtep netip.Addr, peer dataplane.Peer) *Steer {
		t.Helper()
		return openSteer(t, ctx, dir, ns, name, host, vtep, peer)
	}
	sa := open(pa, "cbstw"+id+"a", "a", vtepA, dataplane.Peer{Host: "b", VTEP: vtepB})
	sb := open(pb, "cbstw"+id+"b", "b", vtepB, dataplane.Peer{Host: "a", VTEP: vtepA})
	syncBoth := func() {
		t.Helper()
		for _, s := range []*Steer{sa, sb} {
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	syncBoth()
	if st := sa.Status(); !slices.Equal(st.Waiting, []string{"b"}) || len(st.Keyed) != 0 || !strings.Contains(sa.Degraded(), "1 peer host(s) without a published key (b)") {
		t.Fatalf("a with b's key withheld: %+v, %q; want b waiting", st, sa.Degraded())
	}

	// B listens on the VXLAN port and on a port that is not steered.
	var rx4789, rx5000 *net.UDPConn
	err := nsexec.Run(pb, func() error {
		var err error
		if rx4789, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 4789}); err != nil {
			return err
		}
		rx5000, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 5000})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rx4789.Close()
	defer rx5000.Close()
	recv := func(c *net.UDPConn, wait time.Duration) (netip.Addr, bool) {
		buf := make([]byte, 2048)
		_ = c.SetReadDeadline(time.Now().Add(wait))
		_, from, err := c.ReadFromUDPAddrPort(buf)
		return from.Addr(), err == nil
	}
	send := func(port int) {
		t.Helper()
		err := nsexec.Run(pa, func() error {
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer c.Close()
			// (a blackholed send fails: that is the point)
			_, _ = c.WriteToUDPAddrPort([]byte("tenant payload"), netip.AddrPortFrom(vtepB, uint16(port)))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	capture := func(fn func()) map[uint16]int {
		t.Helper()
		c, err := conformance.StartCapture(pb, vb)
		if err != nil {
			t.Fatal(err)
		}
		fn()
		time.Sleep(100 * time.Millisecond)
		return udpPorts(c.Frames())
	}

	ports := capture(func() {
		for range 3 {
			send(4789)
			send(5000)
		}
		if _, ok := recv(rx5000, time.Second); !ok {
			t.Error("the unsteered port 5000 did not cross in clear: the capture proves nothing")
		}
		if from, ok := recv(rx4789, 300*time.Millisecond); ok {
			t.Errorf("b received a VXLAN-port packet from %s while its key was withheld", from)
		}
	})
	if ports[4789] != 0 || ports[5000] == 0 {
		t.Fatalf("underlay with b's key withheld: UDP ports %v; want 5000 (clear control) and no 4789", ports)
	}

	dir.hide("b", false)
	syncBoth()
	if st := sa.Status(); !slices.Equal(st.Keyed, []string{"b"}) || len(st.Waiting) != 0 || sa.Degraded() != "" {
		t.Fatalf("a with b keyed: %+v, %q", st, sa.Degraded())
	}
	ports = capture(func() {
		var from netip.Addr
		ok := false
		for deadline := time.Now().Add(5 * time.Second); !ok && time.Now().Before(deadline); {
			send(4789)
			from, ok = recv(rx4789, 200*time.Millisecond)
		}
		if !ok || from != vtepA {
			t.Fatalf("b on the VXLAN port through WireGuard: received %v from %s; want from %s", ok, from, vtepA)
		}
	})
	if ports[4789] != 0 || ports[51820] == 0 {
		t.Fatalf("underlay with b keyed: UDP ports %v; want WireGuard's 51820 only, no 4789", ports)
	}

	dir.hide("b", true)
	syncBoth()
	ports = capture(func() {
		for range 3 {
			send(4789)
		}
		if from, ok := recv(rx4789, 300*time.Millisecond); ok {
			t.Errorf("b received a VXLAN-port packet from %s after its key was withdrawn", from)
		}
	})
	if ports[4789] != 0 {
		t.Fatalf("underlay after b's key was withdrawn: UDP ports %v; want no 4789", ports)
	}
	if st := sa.Status(); !slices.Equal(st.Waiting, []string{"b"}) {
		t.Fatalf("a after b's key was withdrawn: %+v", st)
	}
}

// oneHost is a network namespace named prefix-<random> whose veth (both ends inside,
// up) holds addr, and a WireGuard device in it listening on 51820; both go at test end.
// It returns the namespace's path and the device.
func oneHost(t *testing.T, ctx context.Context, prefix, addr string) (string, *wgtunnel.Tunnel) {
	t.Helper()
	id := dockertest.RandHex(3)
	ns := prefix + "-" + id
	dockertest.NetNS(t, ns)
	if out, err := exec.Command("ip", "-n", ns, "link", "add", prefix+"d"+id, "type", "veth", "peer", "name", prefix+"e"+id).CombinedOutput(); err != nil {
		t.Fatalf("veth: %v: %s", err, out)
	}
	for _, args := range [][]string{{"addr", "add", addr, "dev", prefix + "d" + id}, {"link", "set", prefix + "d" + id, "up"}, {"link", "set", prefix + "e" + id, "up"}} {
		if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	tun, err := wgtunnel.Open(ctx, wgtunnel.Config{NetNS: "/run/netns/" + ns, Name: prefix + "w" + id, StateDir: t.TempDir(), ListenPort: 51820,
		FirewallMark: DefaultMark, Address: netip.MustParsePrefix(DeviceAddress)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tun.Close() })
	return "/run/netns/" + ns, tun
}

// runSteer installs cfg's steering and runs it until the test ends.
func runSteer(t *testing.T, cfg Config) *Steer {
	t.Helper()
	s, _ := startSteer(t, cfg)
	return s
}

// startSteer installs cfg's steering and runs it until stop (an agent ending) or the
// test's end.
func startSteer(t *testing.T, cfg Config) (s *Steer, stop func()) {
	t.Helper()
	s, err := Install(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done; s.Close() }) }
	t.Cleanup(stop)
	return s, stop
}

// waitStatus waits until ok holds for s's status, at most limit.
func waitStatus(t *testing.T, s *Steer, what string, limit time.Duration, ok func(Status) bool) {
	t.Helper()
	for start := time.Now(); !ok(s.Status()); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %s: status %+v, healthz %q", what, limit, s.Status(), s.Degraded())
		}
	}
}

// refusingDirectory is a directory whose netmaster is unreachable while down is set,
// and does not answer (a publication waits until its context ends) while hang is set.
type refusingDirectory struct {
	*directory
	mu   sync.Mutex
	down bool
	hang bool
}

func (d *refusingDirectory) PublishWireGuard(ctx context.Context, rec model.WireGuardHost) error {
	d.mu.Lock()
	down, hang := d.down, d.hang
	d.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if down {
		return errors.New("netmaster unreachable")
	}
	return d.directory.PublishWireGuard(ctx, rec)
}

// TestPublicationDoesNotHoldPeers: this host's record is missing (deleted by an admin,
// or a rotated key not published yet) while netmaster accepts connections but does not
// answer; a peer host's record is then deleted (a departed host): its WireGuard peer and
// route go at once. Before, each pass published first and synced peers after, so the
// pass waited on netmaster (up to the client's 30 s timeout, again on every pass) and the
// departed host stayed keyed meanwhile.
func TestPublicationDoesNotHoldPeers(t *testing.T) {
	testroot.Need(t)
	ns, tun := oneHost(t, t.Context(), "cbsh", "192.168.82.1/24")
	kb, _ := wgtypes.GeneratePrivateKey()
	kc, _ := wgtypes.GeneratePrivateKey()
	dir := &refusingDirectory{directory: &directory{recs: map[string]model.WireGuardHost{
		"a": {Host: "a", PublicKey: tun.PublicKey().String(), Endpoint: "192.168.82.1:51820"},
		"b": {Host: "b", PublicKey: kb.PublicKey().String(), Endpoint: "192.168.82.2:51820"},
		"c": {Host: "c", PublicKey: kc.PublicKey().String(), Endpoint: "192.168.82.3:51820"},
	}, hidden: map[string]bool{}}}
	s := runSteer(t, Config{NetNS: ns, Device: tun, Directory: dir, Host: "a", VTEP: netip.MustParseAddr("192.168.82.1"), Every: 20 * time.Millisecond,
		Routing: Routing{VXLANPort: 4789}, Peers: func() []dataplane.Peer {
			return []dataplane.Peer{{Host: "b", VTEP: netip.MustParseAddr("192.168.82.2")}, {Host: "c", VTEP: netip.MustParseAddr("192.168.82.3")}}
		}})
	waitStatus(t, s, "b and c keyed", 3*time.Second, func(st Status) bool { return st.Published && slices.Equal(st.Keyed, []string{"b", "c"}) })
	dir.mu.Lock()
	dir.hang = true
	dir.mu.Unlock()
	dir.forget("a")
	waitStatus(t, s, "own record gone", time.Second, func(st Status) bool { return !st.Published })
	dir.forget("b")
	waitStatus(t, s, "b's record deleted while the publication hangs", time.Second, func(st Status) bool { return slices.Equal(st.Keyed, []string{"c"}) })
	ps, err := tun.Peers(t.Context())
	if err != nil || len(ps) != 1 || ps[0].PublicKey != kc.PublicKey() {
		t.Fatalf("device peers after b left: %+v, %v; want c's only", ps, err)
	}
	if d := s.Degraded(); !strings.Contains(d, "not published") {
		t.Errorf("healthz with the own record gone: %q", d)
	}
}

// TestOwnRecordFollowsTheDirectory: this host's record is checked in what every peer reads
// on each pass, not remembered. A netplugin restarted while netmaster is unreachable,
// whose record from its previous run (same key) is still there, syncs its peers at once;
// a record an admin deleted is published again (before: published once per process, so
// peers blackholed this host for good while its /healthz said ok, and an unreachable
// netmaster at start kept every peer from syncing).
func TestOwnRecordFollowsTheDirectory(t *testing.T) {
	testroot.Need(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns, tun := oneHost(t, ctx, "cbsp", "192.168.78.1/24")
	peerKey, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	vtep := netip.MustParseAddr("192.168.78.1")
	own := model.WireGuardHost{Host: "a", PublicKey: tun.PublicKey().String(), Endpoint: "192.168.78.1:51820"}
	dir := &refusingDirectory{directory: &directory{recs: map[string]model.WireGuardHost{
		"a": own, // published by the previous run
		"b": {Host: "b", PublicKey: peerKey.PublicKey().String(), Endpoint: "192.168.78.2:51820"},
	}, hidden: map[string]bool{}}, down: true}
	s := runSteer(t, Config{NetNS: ns, Device: tun, Directory: dir, Host: "a", VTEP: vtep, Every: 20 * time.Millisecond,
		Routing: Routing{VXLANPort: 4789}, Peers: func() []dataplane.Peer {
			return []dataplane.Peer{{Host: "b", VTEP: netip.MustParseAddr("192.168.78.2")}}
		}})
	waitFor := func(what string, ok func(Status) bool) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if ok(s.Status()) {
				return
			}
		}
		t.Fatalf("%s: status %+v, healthz %q", what, s.Status(), s.Degraded())
	}
	waitFor("restart with netmaster down, own record in place", func(st Status) bool {
		return st.Published && slices.Equal(st.Keyed, []string{"b"})
	})
	if d := s.Degraded(); d != "" {
		t.Errorf("healthz with every peer keyed and the own record in place: %q", d)
	}

	// An admin deletes this host's record while netmaster is still down: /healthz says so.
	dir.forget("a")
	waitFor("own record deleted, netmaster down", func(st Status) bool { return !st.Published })
	if d := s.Degraded(); !strings.Contains(d, "not published") {
		t.Errorf("healthz with the own record gone: %q", d)
	}
	// netmaster back: the record is published again.
	dir.mu.Lock()
	dir.down = false
	dir.mu.Unlock()
	waitFor("own record republished", func(st Status) bool { return st.Published })
	dir.directory.mu.Lock()
	got := dir.directory.recs["a"]
	dir.directory.mu.Unlock()
	if got != own {
		t.Fatalf("republished record %+v; want %+v", got, own)
	}
}

// TestUninstallLeavesNothing: netplugin started without --encryption after a run with it
// removes the steering rules and table, also when --vxlan-port changed between the two
// runs (else the old rule kept blackholing UDP to the old port).
func TestUninstallLeavesNothing(t *testing.T) {
	testroot.Need(t)
	ctx := context.Background()
	id := dockertest.RandHex(3)
	ns := "cbsu-" + id
	dockertest.NetNS(t, ns)
	path := "/run/netns/" + ns
	tun, err := wgtunnel.Open(ctx, wgtunnel.Config{NetNS: path, Name: "cbsuw" + id, StateDir: t.TempDir(), ListenPort: 51820,
		FirewallMark: DefaultMark, Address: netip.MustParsePrefix(DeviceAddress)})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	ours := func() (rules []string, routes int) {
		t.Helper()
		err := nsexec.Run(path, func() error {
			rs, err := netlink.RuleList(unix.AF_INET)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Table == DefaultTable || r.Priority == DefaultPriority || r.Priority == DefaultPriority+1 {
					rules = append(rules, r.String())
				}
			}
			rts, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: DefaultTable}, netlink.RT_FILTER_TABLE)
			routes = len(rts)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return rules, routes
	}
	for _, tc := range []struct{ before, after int }{{4789, 4789}, {4789, 8472}} {
		s, err := Install(Config{NetNS: path, Device: tun, Directory: &directory{recs: map[string]model.WireGuardHost{}}, Host: "a",
			VTEP: netip.MustParseAddr("192.168.79.1"), Routing: Routing{VXLANPort: tc.before}, Peers: func() []dataplane.Peer { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if rules, routes := ours(); len(rules) != 2 || routes != 1 {
			t.Fatalf("installed (port %d): rules %v, %d routes in the table; want 2 rules and the blackhole", tc.before, rules, routes)
		}
		if err := Uninstall(path, Routing{VXLANPort: tc.after}); err != nil {
			t.Fatalf("uninstall (port %d, installed with %d): %v", tc.after, tc.before, err)
		}
		if rules, routes := ours(); len(rules) != 0 || routes != 0 {
			t.Errorf("after uninstall (port %d, installed with %d): rules %v, %d routes left", tc.after, tc.before, rules, routes)
		}
		_ = Uninstall(path, Routing{VXLANPort: tc.before}) // the next case starts clean
	}
}

// TestRotationOnRequest (issue 38, rotation on request): a rotation an admin requested in
// this host's record makes the device a new key through the key file, as an operator's
// removal does, and the new key is published, which answers it (Rotated). Exactly once:
// the record delivered again, or an older record still pending replayed, rotates nothing;
// an agent restarted after its rotation does not rotate again, nor one restarted after
// rotating but before publishing (the record's key is not the device's: it publishes);
// a request made while no agent ran is carried out at start.
func TestRotationOnRequest(t *testing.T) {
	testroot.Need(t)
	ns, tun := oneHost(t, t.Context(), "cbsq", "192.168.82.1/24")
	dir := &directory{recs: map[string]model.WireGuardHost{}, hidden: map[string]bool{}}
	cfg := Config{NetNS: ns, Device: tun, Key: tun, KeyEvery: time.Hour, Host: "a", VTEP: netip.MustParseAddr("192.168.82.1"),
		Directory: dir, Every: time.Hour, Routing: Routing{VXLANPort: 4789}, Peers: func() []dataplane.Peer { return nil }}
	s, stop := startSteer(t, cfg)
	published := func(s *Steer, what string, rotated uint64) model.WireGuardHost {
		t.Helper()
		waitStatus(t, s, what, 3*time.Second, func(st Status) bool {
			r := dir.record("a")
			return st.Published && r.PublicKey == tun.PublicKey().String() && r.Rotated == rotated
		})
		return dir.record("a")
	}
	// quiet: after a change delivered, the key stays (passes run at once on delivery).
	quiet := func(what string, key wgtypes.Key) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		if tun.PublicKey() != key {
			t.Fatalf("%s: the key was rotated", what)
		}
	}
	k0 := tun.PublicKey()
	rec := published(s, "first publication", 0)

	rec.Rotate = 1 // (netmaster, POST /wireguard/hosts/a/rotate)
	dir.set(rec)
	rec = published(s, "rotation 1 answered", 1)
	k1 := tun.PublicKey()
	if k1 == k0 || rec.Rotate != 1 {
		t.Fatalf("after rotation 1: key changed %v, record %+v", k1 != k0, rec)
	}
	// The key file holds the new key: a restart keeps it.
	if k, err := wgtunnel.LoadOrCreateKey(filepath.Dir(tun.KeyFile())); err != nil || k.PublicKey() != k1 {
		t.Fatalf("key file after rotation 1: %v", err)
	}
	dir.set(rec)
	quiet("the answered record delivered again", k1)
	dir.set(model.WireGuardHost{Host: "a", PublicKey: k0.String(), Endpoint: rec.Endpoint, Rotate: 1}) // (the request replayed)
	quiet("the request of generation 1 delivered again", k1)
	dir.set(rec)

	stop()
	s, stop = startSteer(t, cfg)
	published(s, "restart after rotation 1", 1)
	quiet("restart after rotation 1", k1)

	// Rotation 2 made the key, then the agent ended before publishing it.
	stop()
	dir.set(model.WireGuardHost{Host: "a", PublicKey: k1.String(), Endpoint: rec.Endpoint, Rotate: 2, Rotated: 1})
	if err := os.Remove(tun.KeyFile()); err != nil {
		t.Fatal(err)
	}
	if _, err := tun.ReloadKey(); err != nil {
		t.Fatal(err)
	}
	k2 := tun.PublicKey()
	s, stop = startSteer(t, cfg)
	published(s, "restart between rotation 2 and its publication", 2)
	quiet("restart between rotation 2 and its publication", k2)

	// Requested while no agent ran.
	stop()
	rec = dir.record("a")
	rec.Rotate = 3
	dir.set(rec)
	s, _ = startSteer(t, cfg)
	published(s, "rotation 3 requested while down", 3)
	if tun.PublicKey() == k2 {
		t.Fatal("rotation 3 requested while down: the key stayed")
	}
}

// TestRotationAfterRecordRecreated (issue 38 review): a host's record deleted (DELETE
// /wireguard/hosts/<host>, its token removed and given back) and published again by the
// running agent starts without a rotation generation, so netmaster's next request is
// generation 1 again: the agent, which answered a generation 1 before, must rotate for
// it, not take it for one already done (it stayed pending until the agent restarted).
func TestRotationAfterRecordRecreated(t *testing.T) {
	testroot.Need(t)
	ns, tun := oneHost(t, t.Context(), "cbsr", "192.168.83.1/24")
	dir := &directory{recs: map[string]model.WireGuardHost{}, hidden: map[string]bool{}}
	cfg := Config{NetNS: ns, Device: tun, Key: tun, KeyEvery: time.Hour, Host: "a", VTEP: netip.MustParseAddr("192.168.83.1"),
		Directory: dir, Every: 50 * time.Millisecond, Routing: Routing{VXLANPort: 4789}, Peers: func() []dataplane.Peer { return nil }}
	s, _ := startSteer(t, cfg)
	published := func(what string, rotate, rotated uint64) model.WireGuardHost {
		t.Helper()
		waitStatus(t, s, what, 3*time.Second, func(st Status) bool {
			r := dir.record("a")
			return st.Published && r.PublicKey == tun.PublicKey().String() && r.Rotate == rotate && r.Rotated == rotated
		})
		return dir.record("a")
	}
	rec := published("first publication", 0, 0)
	rec.Rotate = 1
	dir.set(rec)
	published("rotation 1 answered", 1, 1)
	k1 := tun.PublicKey()

	dir.forget("a") // (the record deleted: the agent publishes it again)
	rec = published("published again after the delete", 0, 0)
	if tun.PublicKey() != k1 {
		t.Fatal("the delete rotated the key")
	}
	rec.Rotate = 1 // (netmaster's next request: max(0, 0) + 1)
	dir.set(rec)
	published("rotation 1 of the new record answered", 1, 1)
	if tun.PublicKey() == k1 {
		t.Fatal("the new record's rotation 1 did not rotate the key")
	}
}

// TestBlockDropsOverlay: Block (a host running without encryption while the cluster's
// setting says wireguard: pkg/clusterenc) drops every locally sent UDP packet to the
// VXLAN port, no device needed, while other ports pass; Uninstall lets them go again.
func TestBlockDropsOverlay(t *testing.T) {
	testroot.Need(t)
	ns, _ := oneHost(t, t.Context(), "cbsb", "192.168.84.1/24")
	r := Routing{VXLANPort: 4789}
	send := func(port uint16) error {
		return nsexec.Run(ns, func() error {
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(netip.MustParseAddr("192.168.84.2"), port))
			return err
		})
	}
	if err := send(4789); err != nil {
		t.Fatalf("before Block: %v", err)
	}
	if err := Block(ns, r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Uninstall(ns, r) })
	if err := send(4789); err == nil {
		t.Fatal("blocked: a packet to the VXLAN port was sent")
	}
	if err := send(4790); err != nil {
		t.Fatalf("blocked: another port: %v", err)
	}
	if err := Block(ns, r); err != nil { // (again: idempotent)
		t.Fatal(err)
	}
	if err := Uninstall(ns, r); err != nil {
		t.Fatal(err)
	}
	if err := send(4789); err != nil {
		t.Fatalf("after Uninstall: %v", err)
	}
}
