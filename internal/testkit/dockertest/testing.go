package dockertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// RequireDocker skips the test when not running as root (dockerd, namespaces and mounts
// need it) and fails it when dockerd, the docker CLI or busybox is missing.
func RequireDocker(t testing.TB) {
	t.Helper()
	testroot.Need(t)
	for _, b := range []string{DockerdBin, DockerCLI, BusyboxBin} {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s missing (install docker.io and busybox-static): %v", b, err)
		}
	}
}

// ShortDir returns a fresh short directory /tmp/<prefix>-<random> removed at test end.
func ShortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), prefix+"-"+RandHex(4))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("mkdir %s: %v", dir, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// RandHex returns n random bytes in hex.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NetNS creates the network namespace /run/netns/name (loopback up) and deletes it at test end.
func NetNS(t testing.TB, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
}

// New starts a daemon in the existing network namespace netns with its files under dir,
// stopped at test end.
func New(t testing.TB, dir, netns string) *Daemon {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d, err := Start(ctx, Options{Dir: dir, NetNS: netns})
	if err != nil {
		t.Fatalf("start dockerd: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stop dockerd: %v", err)
		}
	})
	return d
}
