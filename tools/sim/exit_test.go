package sim

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestNetpluginExitStatus: a netplugin whose --fwdmode differs from netmaster's exits
// non-zero with the reason in its log (it used to exit 0: the error was checked after the
// signal context was cancelled), and a netplugin that cannot reach etcd honours SIGTERM
// during start-up.
func TestNetpluginExitStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var extra atomic.Value
	extra.Store([]string(nil))
	c := startCluster(t, ctx, Config{Hosts: 1, PluginArgs: func(*Cluster, *Host) []string { return extra.Load().([]string) }})
	h := c.Hosts[0]
	if err := c.StopPlugin(h); err != nil {
		t.Fatal(err)
	}

	// netmaster runs --fwdmode routing; this netplugin says bridge.
	extra.Store([]string{"--fwdmode", "bridge"})
	if err := c.StartPlugin(ctx, h); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		done, perr := h.Plugin.Exited()
		if done {
			if perr == nil {
				t.Fatalf("netplugin with a mismatched --fwdmode exited with status 0\n%s", h.Plugin.LogTail(10))
			}
			if !strings.Contains(h.Plugin.LogTail(20), "fwd-mode mismatch") {
				t.Errorf("exit %v without the reason in its log:\n%s", perr, h.Plugin.LogTail(20))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("netplugin with a mismatched --fwdmode still running after 60s\n%s", h.Plugin.LogTail(10))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// etcd unreachable (nothing listens on port 1): SIGTERM still ends it promptly.
	extra.Store([]string{"--etcd-endpoints", "http://127.0.0.1:1"})
	if err := c.StartPlugin(ctx, h); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if done, perr := h.Plugin.Exited(); done {
		t.Fatalf("netplugin without etcd exited by itself (%v) before the signal\n%s", perr, h.Plugin.LogTail(10))
	}
	if err := h.Plugin.Stop(15 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, h.Plugin.LogTail(10))
	}
}
