package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// TestSecureCluster: netmaster with HTTPS and tokens, its embedded etcd with TLS and
// client certificates; the netplugin (agent token, etcd client certificate) attaches
// containers through it, netctl works with --cacert/--token and is refused without a
// token, the agent's token cannot create a tenant, and etcd refuses a client without a
// certificate. With netmaster's etcd RBAC (on by default with a client CA) the agent's
// etcd certificate (CN host:<host>) writes its own VTEP record and nothing of another host,
// no model object, no endpoint record (those go through netmaster), no other registration.
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
	// The agent's etcd certificate (CN host:<host>, netmaster's etcd RBAC user of that host)
	// reads everything and writes only its host's own keys.
	etcdctl := func(args ...string) (string, error) {
		return Exec(ctx, h.Name, append([]string{"etcdctl", "--endpoints", c.EtcdURL(), "--cacert", c.CACert,
			"--cert", h.etcdCert[0], "--key", h.etcdCert[1], "--dial-timeout", "3s", "--command-timeout", "5s"}, args...)...)
	}
	out, err = etcdctl("get", "--prefix", "--keys-only", "/contiv.io/state/nets/")
	if err != nil || !strings.Contains(out, "secnet.default") {
		t.Fatalf("etcd with the agent's certificate: %v\n%s", err, out)
	}
	vtep, err := etcdctl("get", "--print-value-only", vxlan.HostVTEPKey(h.Name))
	if err != nil || strings.TrimSpace(vtep) == "" {
		t.Fatalf("the agent's own VTEP record: %v\n%s", err, vtep)
	}
	if out, err := etcdctl("put", vxlan.HostVTEPKey(h.Name), strings.TrimSpace(vtep)); err != nil {
		t.Fatalf("the agent writes its own VTEP record: %v\n%s", err, out)
	}
	const other = "cbs-other-host"
	for _, key := range []string{
		"/contiv.io/obj/modeldb/tenant/evil",
		vxlan.HostVTEPKey(other),
		model.BgpOperKey(other),
		model.EpOperKey(a.EndpointID), // its own endpoint's record: written through netmaster
		model.EpOperKey("secnet.default-" + other),
		"/contiv.io/service/netplugin/192.0.2.99:9002",
		"/contiv.io/lock/netmaster/leader",
	} {
		out, err := etcdctl("put", key, `{"tenantName":"evil","homingHost":"`+other+`"}`)
		if err == nil || !strings.Contains(out, "permission denied") {
			t.Errorf("the agent's etcd certificate writes %s: %v\n%s", key, err, out)
		}
	}
	if out, err := etcdctl("del", "--prefix", "/contiv.io/state/"); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("the agent's etcd certificate deletes state: %v\n%s", err, out)
	}
	if out, err := c.Netctl(ctx, "tenant", "ls"); err != nil || strings.Contains(out, "evil") {
		t.Errorf("tenants after the agent's attempts: %v\n%s", err, out)
	}
	tb, err := os.ReadFile(h.agentTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	agentTok := strings.TrimSpace(string(tb))
	// Endpoint records go through netmaster, which refuses another host's (403).
	plugin := func(path, body string) string {
		out, _ := Exec(ctx, h.Name, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", c.CACert,
			"-H", "Authorization: Bearer "+agentTok, "-H", "Content-Type: application/json", "-d", body, c.MasterURL()+path)
		return strings.TrimSpace(out)
	}
	if code := plugin("/plugin/recordEndpoint", `{"id":"`+a.EndpointID+`","homingHost":"`+other+`"}`); code != "403" {
		t.Errorf("the agent records its endpoint as another host's: HTTP %s, want 403", code)
	}
	// An identity not bound to a host (here the admin's) gets no etcd user.
	if err := c.MasterDo(ctx, "POST", "/plugin/etcdAccess", model.EtcdAccessRequest{}, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("an unbound identity asks for etcd access: %v, want 403", err)
	}
	out, err = Exec(ctx, h.Name, netctl, "--netmaster", c.MasterURL(), "--cacert", c.CACert, "--token", agentTok, "tenant", "create", "evil")
	if err == nil || !strings.Contains(out, "forbidden") {
		t.Fatalf("agent token creating a tenant: %v\n%s", err, out)
	}
}
