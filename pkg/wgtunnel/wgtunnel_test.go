package wgtunnel

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/contivbpf/contivbpf/internal/testkit/dockertest"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestKeyFile: the key is generated once into a 0600 file in a 0700 directory and read
// back unchanged; a file others may read, or that is not a key, is refused.
func TestKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	k1, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v (%v), want %#o", p, fi.Mode().Perm(), err, want)
		}
	}
	k2, err := LoadOrCreateKey(dir)
	if err != nil || k2 != k1 {
		t.Fatalf("second load: %v %v, want the first key", k2.PublicKey(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("state dir holds %d entries, want only the key", len(ents))
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable key file: %v, want refused", err)
	}
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil {
		t.Fatal("a file that is no key: accepted")
	}
}

// TestKeyFileNotOurs: a key someone else could have written or can swap is refused rather
// than used (that someone would know the host's private key): a key file owned by another
// user, a symbolic link in its place, a state directory others may write to.
func TestKeyFileNotOurs(t *testing.T) {
	testroot.Need(t)
	mine := filepath.Join(t.TempDir(), "state")
	if _, err := LoadOrCreateKey(mine); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(mine, KeyFile)

	dir := filepath.Join(t.TempDir(), "other")
	if _, err := LoadOrCreateKey(dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil || !strings.Contains(err.Error(), "owned by") {
		t.Errorf("key file of uid 65534: %v, want refused", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(own, path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil {
		t.Error("key file that is a symbolic link: accepted")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("state directory others may write to: %v, want refused", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a key was written into the refused directory (%v)", err)
	}
}

// TestKeyDirRequired: a state directory that is not given or is relative is refused
// (naming it), not taken in the working directory, which nobody chose to hold the key.
func TestKeyDirRequired(t *testing.T) {
	cwd := t.TempDir()
	t.Chdir(cwd)
	for _, dir := range []string{"", "state"} {
		if _, err := LoadOrCreateKey(dir); err == nil || !strings.Contains(err.Error(), "absolute") {
			t.Errorf("state directory %q: %v, want refused", dir, err)
		}
	}
	if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
		t.Errorf("working directory holds %d entries (%s...), want none", len(ents), ents[0].Name())
	}
}

// testNS makes a namespace with a unique prefix, removed at test end; it returns its path.
func testNS(t *testing.T, name string) string {
	t.Helper()
	dockertest.NetNS(t, name)
	return "/run/netns/" + name
}

func key(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

// TestDeviceInNamespace: without the kernel module the device is wireguard-go's, its link
// and its UDP socket are inside the namespace (none in the caller's), the key is the
// state directory's, peers are added, updated and removed to match a desired list, a bad
// list changes nothing, and Close removes the link and the control socket.
func TestDeviceInNamespace(t *testing.T) {
	testroot.Need(t)
	ctx := context.Background()
	id := dockertest.RandHex(3)
	ns := testNS(t, "cbwg1-"+id)
	dir := t.TempDir()
	name := "cbwg1" + id
	tun, err := Open(ctx, Config{NetNS: ns, Name: name, StateDir: dir, Address: netip.MustParsePrefix("10.99.0.1/24"), FirewallMark: 0xc0b1})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	if tun.Kind() != Userspace {
		if _, err := os.Stat("/sys/module/wireguard"); err != nil {
			t.Fatalf("kind %s without a kernel module", tun.Kind())
		}
	}
	k, err := LoadOrCreateKey(dir)
	if err != nil || k.PublicKey() != tun.PublicKey() {
		t.Fatalf("device key %s is not the state directory's (%v)", tun.PublicKey(), err)
	}
	if _, err := netlink.LinkByName(name); err == nil {
		t.Fatalf("link %s in the caller's namespace", name)
	}
	port := tun.ListenPort()
	if port == 0 {
		t.Fatal("no listen port")
	}
	if d, err := tun.wg.Device(name); err != nil || d.FirewallMark != 0xc0b1 {
		t.Fatalf("device's firewall mark: %+v, %v; want 0xc0b1 (its own packets skip the steering table)", d, err)
	}
	// The UDP port is taken inside the namespace and free outside it.
	err = nsexec.Run(ns, func() error {
		if _, err := netlink.LinkByName(name); err != nil {
			return err
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		if err == nil {
			c.Close()
			return errors.New("the listen port is free inside the namespace")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port}); err != nil {
		t.Logf("port %d busy in the caller's namespace too (%v): cannot tell", port, err)
	} else {
		c.Close()
	}

	a, b, c := key(t), key(t), key(t)
	ep := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	steps := []struct {
		peers []Peer
		want  Changes
	}{
		{[]Peer{{a, ep("192.0.2.1:51820"), pfx("10.99.0.2/32"), 0}, {b, ep("192.0.2.2:51820"), pfx("10.99.0.3/32", "10.50.0.0/24"), 0}}, Changes{Added: 2}},
		{[]Peer{{b, ep("192.0.2.2:51820"), pfx("10.50.0.0/24", "10.99.0.3/32"), 0}, {a, ep("192.0.2.1:51820"), pfx("10.99.0.2/32"), 0}}, Changes{}},
		{[]Peer{{a, ep("192.0.2.9:51821"), pfx("10.99.0.2/32"), 25 * time.Second}, {c, ep("192.0.2.3:51820"), pfx("10.99.0.4/32"), 0}}, Changes{Added: 1, Updated: 1, Removed: 1}},
		// The keepalive alone changes: updated in place.
		{[]Peer{{a, ep("192.0.2.9:51821"), pfx("10.99.0.2/32"), 0}, {c, ep("192.0.2.3:51820"), pfx("10.99.0.4/32"), 0}}, Changes{Updated: 1}},
	}
	for i, s := range steps {
		got, err := tun.SyncPeers(ctx, s.peers)
		if err != nil || got != s.want {
			t.Fatalf("step %d: %+v %v, want %+v", i, got, err, s.want)
		}
		have, err := tun.Peers(ctx)
		if err != nil || len(have) != len(s.peers) {
			t.Fatalf("step %d: device peers %+v %v", i, have, err)
		}
		for _, p := range s.peers {
			var found bool
			for _, h := range have {
				found = found || h.PublicKey == p.PublicKey && samePeer(h, p)
			}
			if !found {
				t.Fatalf("step %d: peer %s %v %v not on the device: %+v", i, p.PublicKey, p.Endpoint, p.AllowedIPs, have)
			}
		}
	}
	before, _ := tun.Peers(ctx)
	for name, bad := range map[string][]Peer{
		"own key":       {{tun.PublicKey(), ep("192.0.2.1:1"), nil, 0}},
		"repeated key":  {{a, ep("192.0.2.1:1"), nil, 0}, {a, ep("192.0.2.2:1"), nil, 0}},
		"shared prefix": {{a, ep("192.0.2.1:1"), pfx("10.7.0.0/16"), 0}, {b, ep("192.0.2.2:1"), pfx("10.7.1.0/24"), 0}},
		"no port":       {{a, ep("192.0.2.1:0"), nil, 0}},
		"keepalive":     {{a, ep("192.0.2.1:1"), nil, 1500 * time.Millisecond}},
		"host bits":     {{a, ep("192.0.2.1:1"), []netip.Prefix{netip.MustParsePrefix("10.7.0.1/16")}, 0}},
		// The device keeps it once: the list would never match it, and every sync would
		// rewrite the peer's allowed IPs (dropping its traffic while it does).
		"repeated prefix": {{a, ep("192.0.2.1:1"), pfx("10.7.0.0/16", "10.7.0.0/16"), 0}},
	} {
		if _, err := tun.SyncPeers(ctx, bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if after, _ := tun.Peers(ctx); !reflect.DeepEqual(after, before) {
		t.Fatalf("a refused list changed the peers: %+v, was %+v", after, before)
	}

	if _, err := Open(ctx, Config{NetNS: ns, Name: name, StateDir: t.TempDir()}); err == nil {
		t.Fatal("a second device of the same name: opened")
	}
	if err := tun.Close(); err != nil {
		t.Fatal(err)
	}
	err = nsexec.Run(ns, func() error {
		if _, err := netlink.LinkByName(name); err == nil {
			return errors.New("link still there after Close")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/var/run/wireguard/" + name + ".sock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("control socket after Close: %v", err)
	}
}

// TestReloadWireGuardKey (issue 38, key rotation): ReloadKey with the file unchanged changes
// nothing; a key file others may read is refused and the device keeps its key; the same
// file made 0600 is taken: the device (read back through wgctrl) holds the new key,
// PublicKey reports it, and its peers stay configured. A removed file means a new key.
func TestReloadWireGuardKey(t *testing.T) {
	testroot.Need(t)
	ctx := context.Background()
	id := dockertest.RandHex(3)
	dir := t.TempDir()
	tun, err := Open(ctx, Config{NetNS: testNS(t, "cbwgr-"+id), Name: "cbwgr" + id, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	peer := Peer{PublicKey: key(t), Endpoint: netip.MustParseAddrPort("192.0.2.9:51820"), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.9/32")}}
	if _, err := tun.SyncPeers(ctx, []Peer{peer}); err != nil {
		t.Fatal(err)
	}
	// onDevice is the public key the device holds.
	onDevice := func() wgtypes.Key {
		t.Helper()
		d, err := tun.wg.Device(tun.Name())
		if err != nil {
			t.Fatal(err)
		}
		return d.PublicKey
	}
	first := tun.PublicKey()
	if changed, err := tun.ReloadKey(); changed || err != nil {
		t.Fatalf("reload of the unchanged file: changed %v, %v", changed, err)
	}
	next, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tun.KeyFile(), []byte(next.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tun.KeyFile(), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := tun.ReloadKey(); changed || err == nil || tun.PublicKey() != first || onDevice() != first {
		t.Fatalf("reload of a key file others may read: changed %v, %v; key %s on the device %s, want %s kept", changed, err, tun.PublicKey(), onDevice(), first)
	}
	if err := os.Chmod(tun.KeyFile(), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := tun.ReloadKey(); !changed || err != nil || tun.PublicKey() != next.PublicKey() || onDevice() != next.PublicKey() {
		t.Fatalf("reload of a new key: changed %v, %v; key %s on the device %s, want %s", changed, err, tun.PublicKey(), onDevice(), next.PublicKey())
	}
	if ps, err := tun.Peers(ctx); err != nil || len(ps) != 1 || ps[0].PublicKey != peer.PublicKey {
		t.Fatalf("peers after the new key: %+v, %v", ps, err)
	}
	if err := os.Remove(tun.KeyFile()); err != nil {
		t.Fatal(err)
	}
	if changed, err := tun.ReloadKey(); !changed || err != nil || tun.PublicKey() == next.PublicKey() || onDevice() != tun.PublicKey() {
		t.Fatalf("reload after the file was removed: changed %v, %v; key %s on the device %s", changed, err, tun.PublicKey(), onDevice())
	}
}

// TestReloadKeyRacing (issue 38, key rotation): netplugin reloads the key from two
// goroutines (the file's 2 s look and SIGHUP). Racing after the file was removed, both
// made a key and wrote it, and the device could end with one while the file held the
// other: a rotation nobody asked for at the next look or restart. After any number of
// racing reloads the file, the device and PublicKey hold one key.
func TestReloadKeyRacing(t *testing.T) {
	testroot.Need(t)
	ctx := context.Background()
	id := dockertest.RandHex(3)
	tun, err := Open(ctx, Config{NetNS: testNS(t, "cbwgq-"+id), Name: "cbwgq" + id, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	for round := range 100 {
		if err := os.Remove(tun.KeyFile()); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				if _, err := tun.ReloadKey(); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		file, err := LoadOrCreateKey(filepath.Dir(tun.KeyFile()))
		if err != nil {
			t.Fatal(err)
		}
		d, err := tun.wg.Device(tun.Name())
		if err != nil {
			t.Fatal(err)
		}
		if file.PublicKey() != tun.PublicKey() || d.PublicKey != tun.PublicKey() {
			t.Fatalf("round %d: key file %s, device %s, PublicKey %s: want one key", round, file.PublicKey(), d.PublicKey, tun.PublicKey())
		}
	}
}
