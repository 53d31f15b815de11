package dockertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDaemonBusybox starts a private dockerd in a fresh network namespace, imports busybox,
// runs a container without networking and checks the per-daemon plugin directory view.
func TestDaemonBusybox(t *testing.T) {
	RequireDocker(t)
	ns := "cbr-dt-" + RandHex(3)
	NetNS(t, ns)
	dir := ShortDir(t, "cbr")
	d := New(t, filepath.Join(dir, "h1"), ns)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if err := d.ImportBusybox(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := d.Docker(ctx, "run", "--rm", "--net", "none", BusyboxImage, "sh", "-c", "echo hello-$((1+1))")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "hello-2") {
		t.Fatalf("container output %q, want hello-2", out)
	}
	if _, err := d.Docker(ctx, "run", "-d", "--net", "none", BusyboxImage, "sleep", "300"); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveContainers(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := d.Docker(ctx, "ps", "-aq"); err != nil || strings.TrimSpace(left) != "" {
		t.Fatalf("containers after RemoveContainers: %q, %v", left, err)
	}

	// A file in the daemon's plugin dir shows up at /run/docker/plugins in its mount namespace
	// and not in ours.
	if err := os.WriteFile(filepath.Join(d.PluginDir, "marker"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(PluginsDir, "marker")); err == nil {
		t.Fatalf("marker visible in the host mount namespace")
	}
	args := append(d.NsenterArgs(), "ls", PluginsDir)
	lsOut, err := runOut(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lsOut, "marker") {
		t.Fatalf("plugin dir view in daemon namespace: %q", lsOut)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Fatalf("daemon dir left behind: %v", err)
	}
}
