package main

import (
	"log/slog"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/contivbpf/contivbpf/pkg/clusterenc"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestOverlayBlockOnOVS (issue 38 review): the ovs dataplane's VXLAN is sent by OVS's
// userspace datapath by its own route table, which wgsteer's policy rules never see. A
// netplugin on ovs that follows the cluster's setting, runs none, and sees the setting
// turn to wireguard cannot block its overlay traffic: it must not say it did (/healthz
// "dropped (fail closed)", contiv_encryption_overlay_blocked 1) while the traffic goes
// in clear. The block is refused, /healthz says the traffic goes in clear, the metric
// stays 0. (The namespace is where a block that wrongly went ahead would land.)
func TestOverlayBlockOnOVS(t *testing.T) {
	testroot.Need(t)
	const ns = "cbh-ovsblock"
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	cfg, err := parse(t, "--host-label", "h1", "--vtep-ip", "192.168.1.1", "--dataplane", "ovs")
	if err != nil {
		t.Fatal(err)
	}
	block, unblock := overlayBlock(cfg, "/var/run/netns/"+ns)
	f := clusterenc.New(clusterenc.Config{Running: model.EncryptionNone, Follows: true, Block: block, Unblock: unblock, Log: slog.New(slog.DiscardHandler)})
	f.Apply(model.GlobConfig{Encryption: model.EncryptionWireGuard})
	if d := f.Degraded(); !strings.Contains(d, "in clear") || strings.Contains(d, "dropped") {
		t.Errorf("/healthz on ovs with the setting wireguard: %q, want it to say the traffic goes in clear", d)
	}
	const notBlocked = `# HELP contiv_encryption_overlay_blocked 1 while this host drops its overlay traffic to other hosts because the cluster's setting says wireguard and it runs without encryption (fail closed until restarted).
# TYPE contiv_encryption_overlay_blocked gauge
contiv_encryption_overlay_blocked 0
`
	if err := testutil.CollectAndCompare(f.Collector(), strings.NewReader(notBlocked), "contiv_encryption_overlay_blocked"); err != nil {
		t.Errorf("on ovs nothing is blocked: %v", err)
	}
	f.Apply(model.GlobConfig{Encryption: model.EncryptionNone})
	if d := f.Degraded(); d != "" {
		t.Errorf("/healthz after the setting turned back: %q", d)
	}
}
