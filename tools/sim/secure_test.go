package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecureCluster: netmaster with HTTPS and tokens, its embedded etcd with TLS and
// client certificates; the netplugin (agent token, etcd client certificate) attaches
// containers through it, netctl works with --cacert/--token and is refused without a
// token, the agent's token cannot create a tenant, and etcd refuses a client without a
// certificate.
func TestSecureCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 1, Secure: true})
	bin := c.cfg.BinDir
	h := c.Hosts[0]
	if err := c.CreateNetwork(ctx, "default", "secnet", "vxlan", "10.104.1.0/24", "10.104.1.1"); err != nil {
		t.Fatal(err)
	}
	a, err := c.AddContainer(ctx, h, "a", "default", "secnet")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AddContainer(ctx, h, "b", "default", "secnet")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := a.Ping(ctx, b.IP.Addr(), 2); err != nil {
		t.Fatalf("ping through a secured control plane: %v\n%s", err, out)
	}
	if out, err := c.Netctl(ctx, "net", "ls"); err != nil || !strings.Contains(out, "secnet") {
		t.Fatalf("netctl with --cacert/--token: %v\n%s", err, out)
	}
	netctl := filepath.Join(bin, "netctl")
	out, err := Exec(ctx, h.Name, netctl, "--netmaster", c.MasterURL(), "--cacert", c.CACert, "net", "ls")
	if err == nil || !strings.Contains(out, "unauthorized") {
		t.Fatalf("netctl without a token: %v\n%s", err, out)
	}
	out, err = Exec(ctx, h.Name, "etcdctl", "--endpoints", c.EtcdURL(), "--cacert", c.CACert, "--dial-timeout", "3s",
		"--command-timeout", "5s", "get", "--prefix", "--keys-only", "/contiv.io/")
	if err == nil {
		t.Fatalf("etcd answered a client without a certificate:\n%s", out)
	}
	out, err = Exec(ctx, h.Name, "etcdctl", "--endpoints", c.EtcdURL(), "--cacert", c.CACert, "--cert", c.etcdAgent[0],
		"--key", c.etcdAgent[1], "get", "--prefix", "--keys-only", "/contiv.io/state/nets/")
	if err != nil || !strings.Contains(out, "secnet.default") {
		t.Fatalf("etcd with the agent's certificate: %v\n%s", err, out)
	}
	tb, err := os.ReadFile(h.agentTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	agentTok := strings.TrimSpace(string(tb))
	out, err = Exec(ctx, h.Name, netctl, "--netmaster", c.MasterURL(), "--cacert", c.CACert, "--token", agentTok, "tenant", "create", "evil")
	if err == nil || !strings.Contains(out, "forbidden") {
		t.Fatalf("agent token creating a tenant: %v\n%s", err, out)
	}
}
