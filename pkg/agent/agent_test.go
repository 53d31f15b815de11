package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/testroot"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func netnsAdd(t *testing.T, name string) string {
	t.Helper()
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	sh(t, "ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
	return "/run/netns/" + name
}

type testHost struct {
	name  string
	ip    netip.Addr
	agent *Agent
	drv   *ebpf.Driver
	stop  func() // stops agent.Run
}

// TestAgentsEndToEnd runs two agents with real eBPF drivers in two host namespaces joined
// by a veth wire, against netmaster's real API and a private etcd: attach, cross-host
// ping, failed attach rolled back, detach.
func TestAgentsEndToEnd(t *testing.T) {
	testroot.Need(t)
	store, _ := statetest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := master.New(ctx, master.Config{Store: store, FwdMode: "bridge"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: m.Handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	if _, err := store.Client().Put(ctx, state.LeaderLockKey, ln.Addr().String()); err != nil {
		t.Fatal(err)
	}

	prefix := testPrefix()
	pinBase := "/sys/fs/bpf/" + prefix
	mountBPFFS(t)
	if err := os.MkdirAll(pinBase, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pinBase) })
	// The network exists before the agents start, and so does a remote endpoint record
	// the driver would refuse (an IPv6 VTEP): the first Sync must not fail because of it.
	body := `{"tenantName":"default","networkName":"net1","encap":"vxlan","subnet":"10.77.1.0/24","gateway":"10.77.1.1"}`
	resp, err := http.Post("http://"+ln.Addr().String()+"/api/v1/networks/default:net1/", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("create network: %v %v", err, resp)
	}
	resp.Body.Close()
	const badRemote = "net1.default-badvtep"
	if err := store.Put(ctx, model.EpStateKey(badRemote), model.CfgEndpointState{ID: badRemote, NetID: "net1.default",
		IPAddress: "10.77.1.200", HomingHost: "elsewhere", VtepIP: "fd00::1"}); err != nil {
		t.Fatal(err)
	}
	hosts := []*testHost{{name: prefix + "-h1", ip: netip.MustParseAddr("192.168.77.1")}, {name: prefix + "-h2", ip: netip.MustParseAddr("192.168.77.2")}}
	for _, h := range hosts {
		netnsAdd(t, h.name)
	}
	sh(t, "ip", "link", "add", "uplink", "netns", hosts[0].name, "type", "veth", "peer", "name", "uplink", "netns", hosts[1].name)
	for _, h := range hosts {
		sh(t, "ip", "netns", "exec", h.name, "ip", "addr", "add", h.ip.String()+"/24", "dev", "uplink")
		sh(t, "ip", "netns", "exec", h.name, "ip", "link", "set", "uplink", "up")
		drv, err := ebpf.New(ctx, dataplane.HostConfig{Host: h.name, NetNS: "/run/netns/" + h.name, VTEP: h.ip, FwdMode: dataplane.FwdBridge}, ebpf.Options{PinRoot: filepath.Join(pinBase, h.name)})
		if err != nil {
			t.Fatal(err)
		}
		h.drv = drv
		t.Cleanup(func() { drv.Teardown(context.Background()); drv.Close() })
		a, err := New(Config{Store: store, Master: masterclient.New(store), Driver: drv, Host: h.name, VTEP: h.ip, FwdMode: dataplane.FwdBridge})
		if err != nil {
			t.Fatal(err)
		}
		h.agent = a
		actx, acancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- a.Run(actx) }()
		var once sync.Once
		h.stop = func() { once.Do(func() { acancel(); <-done }) }
		t.Cleanup(h.stop)
		if err := store.Put(ctx, state.ServicePrefix+vxlan.VTEPService+"/"+h.ip.String()+":4789",
			vxlan.Registration{ServiceName: vxlan.VTEPService, HostAddr: h.ip.String(), Port: 4789, Hostname: h.name}); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range hosts {
		select {
		case <-h.agent.Ready():
		case <-ctx.Done():
			t.Fatal("agent not ready")
		}
	}

	for _, h := range hosts {
		if e := h.agent.Errors()["remote-endpoint/"+badRemote]; !strings.Contains(e, "vtep") || !h.agent.Inspect().Synced {
			t.Fatalf("%s: bad remote not reported on its own (synced=%v): %v", h.name, h.agent.Inspect().Synced, h.agent.Errors())
		}
	}
	var cts []string
	var ips []netip.Prefix
	for i, h := range hosts {
		ns := fmt.Sprintf("%s-c%d", prefix, i+1)
		netnsAdd(t, ns)
		res, err := h.agent.AttachEndpoint(ctx, AttachRequest{Tenant: "default", Network: "net1", EndpointID: ns, Name: ns, NetNS: "/run/netns/" + ns})
		if err != nil {
			t.Fatalf("attach on %s: %v", h.name, err)
		}
		if res.MTU != 1450 || res.Gateway.String() != "10.77.1.1" || len(res.HostIfName) > 15 {
			t.Errorf("attach result = %+v", res)
		}
		var oper LocalEndpoint
		if err := store.Get(ctx, model.EpOperKey(res.ID), &oper); err != nil || oper.NetNS != "/run/netns/"+ns || oper.PortName != res.HostIfName {
			t.Errorf("oper record of %s = %+v, %v", res.ID, oper, err)
		}
		cts = append(cts, ns)
		ips = append(ips, res.IP)
	}
	// Remote endpoints arrive through the watch.
	deadline := time.Now().Add(10 * time.Second)
	for len(hosts[0].agent.Inspect().RemoteEndpoints) != 1 || len(hosts[1].agent.Inspect().RemoteEndpoints) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("remote endpoints not programmed: %+v / %+v", hosts[0].agent.Inspect(), hosts[1].agent.Inspect())
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, err := exec.Command("ip", "netns", "exec", cts[0], "ping", "-c", "2", "-i", "0.2", "-W", "2", ips[1].Addr().String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " 0% packet loss") {
		t.Fatalf("cross-host ping: %v\n%s", err, out)
	}

	// Attaching a live endpoint again (netmaster's createEndpoint is idempotent) in a way
	// that fails must not tear the live endpoint down.
	if _, err := hosts[0].agent.AttachEndpoint(ctx, AttachRequest{Tenant: "default", Network: "net1", EndpointID: cts[0], NetNS: "/run/netns/" + prefix + "-nope"}); err == nil {
		t.Fatal("re-attach into a missing namespace succeeded")
	}
	var still model.CfgEndpointState
	if err := store.Get(ctx, model.EpStateKey("net1.default-"+cts[0]), &still); err != nil {
		t.Fatalf("failed re-attach deleted the live endpoint on netmaster: %v", err)
	}
	var oper0 LocalEndpoint
	if err := store.Get(ctx, model.EpOperKey("net1.default-"+cts[0]), &oper0); err != nil || oper0.NetNS != "/run/netns/"+cts[0] {
		t.Fatalf("failed re-attach lost the live oper record: %+v %v", oper0, err)
	}
	out, err = exec.Command("ip", "netns", "exec", cts[0], "ping", "-c", "2", "-i", "0.2", "-W", "2", ips[1].Addr().String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " 0% packet loss") {
		t.Fatalf("cross-host ping after a failed re-attach: %v\n%s", err, out)
	}

	// h1's agent restarts while the store holds a record its driver refuses although it
	// validates: a remote endpoint (on h2) claiming the address of h1's local endpoint.
	// The first Sync fails; the agent must still sync the rest, report that object alone
	// and keep serving attaches.
	const dup = "net1.default-dup"
	if err := store.Put(ctx, model.EpStateKey(dup), model.CfgEndpointState{ID: dup, NetID: "net1.default",
		IPAddress: ips[0].Addr().String(), HomingHost: hosts[1].name}); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "running agent reports the conflicting remote", func() bool {
		return hosts[0].agent.Errors()["remote-endpoint/"+dup] != ""
	})
	hosts[0].stop()
	a2, err := New(Config{Store: store, Master: masterclient.New(store), Driver: hosts[0].drv, Host: hosts[0].name, VTEP: hosts[0].ip, FwdMode: dataplane.FwdBridge})
	if err != nil {
		t.Fatal(err)
	}
	a2ctx, a2cancel := context.WithCancel(ctx)
	a2done := make(chan error, 1)
	go func() { a2done <- a2.Run(a2ctx) }()
	var once2 sync.Once
	hosts[0].agent, hosts[0].stop = a2, func() { once2.Do(func() { a2cancel(); <-a2done }) }
	t.Cleanup(hosts[0].stop)
	select {
	case <-a2.Ready():
	case <-ctx.Done():
		t.Fatal("restarted agent not ready")
	}
	if snap := a2.Inspect(); !snap.Synced || len(snap.Endpoints) != 1 || len(snap.RemoteEndpoints) != 1 ||
		!strings.Contains(snap.Errors["remote-endpoint/"+dup], "local endpoint") {
		t.Fatalf("restarted agent with a refused remote: synced=%v endpoints=%d remotes=%d errors=%v",
			snap.Synced, len(snap.Endpoints), len(snap.RemoteEndpoints), snap.Errors)
	}
	out, err = exec.Command("ip", "netns", "exec", cts[0], "ping", "-c", "2", "-i", "0.2", "-W", "2", ips[1].Addr().String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " 0% packet loss") {
		t.Fatalf("cross-host ping after the restart with a refused remote: %v\n%s", err, out)
	}
	extra := prefix + "-c3"
	netnsAdd(t, extra)
	if _, err := a2.AttachEndpoint(ctx, AttachRequest{Tenant: "default", Network: "net1", EndpointID: extra, NetNS: "/run/netns/" + extra}); err != nil {
		t.Fatalf("attach while one remote is refused: %v", err)
	}
	if err := a2.DetachEndpoint(ctx, DetachRequest{Tenant: "default", Network: "net1", EndpointID: extra}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Delete(ctx, model.EpStateKey(dup)); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "refused remote no longer reported once deleted", func() bool {
		_, ok := a2.Errors()["remote-endpoint/"+dup]
		return !ok
	})

	// An endpoint-group record that does not decode is dropped and reported, like the
	// other prefixes.
	if _, err := store.Client().Put(ctx, model.EPGStatePrefix+"broken", "{not json"); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "undecodable endpoint group reported", func() bool {
		return strings.Contains(hosts[0].agent.Errors()["endpoint-group/broken"], "decode")
	})
	if _, err := store.Delete(ctx, model.EPGStatePrefix+"broken"); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "deleted endpoint group no longer reported", func() bool {
		_, ok := hosts[0].agent.Errors()["endpoint-group/broken"]
		return !ok
	})

	// A failed attach (namespace does not exist) leaves nothing behind.
	before := epCount(t, store)
	_, err = hosts[0].agent.AttachEndpoint(ctx, AttachRequest{Tenant: "default", Network: "net1", EndpointID: "ghost", NetNS: "/run/netns/" + prefix + "-nope"})
	if err == nil {
		t.Fatal("attach into a missing namespace succeeded")
	}
	if n := epCount(t, store); n != before {
		t.Errorf("failed attach leaked a netmaster endpoint: %d -> %d", before, n)
	}
	if kvs, _, _ := store.List(ctx, model.EpOperKey("net1.default-ghost")); len(kvs) != 0 {
		t.Errorf("failed attach leaked its oper record")
	}
	if err := exec.Command("ip", "netns", "exec", hosts[0].name, "ip", "link", "show", HostIfName("net1.default-ghost")).Run(); err == nil {
		t.Errorf("failed attach leaked its veth")
	}
	if _, ok := hosts[0].agent.Errors()["endpoint/net1.default-ghost"]; ok {
		t.Errorf("rolled-back endpoint still reported as failing")
	}
	// A rollback whose clean-up fails logs it and says so in the error: an agent whose
	// driver dies right after netmaster created the endpoint.
	h3 := prefix + "-h3"
	netnsAdd(t, h3)
	drv3, err := ebpf.New(ctx, dataplane.HostConfig{Host: h3, NetNS: "/run/netns/" + h3, VTEP: netip.MustParseAddr("192.168.77.3"), FwdMode: dataplane.FwdBridge}, ebpf.Options{PinRoot: filepath.Join(pinBase, h3)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv3.Close() })
	var logBuf lockedBuffer
	a3, err := New(Config{Store: store, Master: afterCreate{MasterClient: masterclient.New(store), then: func() { drv3.Close() }},
		Driver: drv3, Host: h3, VTEP: netip.MustParseAddr("192.168.77.3"), FwdMode: dataplane.FwdBridge,
		Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	close(a3.ready) // it never runs: only its attach path is exercised
	_, err = a3.AttachEndpoint(ctx, AttachRequest{Tenant: "default", Network: "net1", EndpointID: "rb"})
	if err == nil || !strings.Contains(err.Error(), "rollback") || !strings.Contains(err.Error(), "delete endpoint from driver") {
		t.Errorf("attach with a dead driver: err = %v, want the failed rollback step", err)
	}
	if !strings.Contains(logBuf.String(), "rollback: forget local endpoint") {
		t.Errorf("failed forget not logged:\n%s", logBuf.String())
	}
	if n := epCount(t, store); n != before {
		t.Errorf("rolled-back attach left its netmaster endpoint: %d -> %d", before, n)
	}

	// Attach to a network that does not exist: netmaster refuses, nothing created.
	if _, err := hosts[0].agent.AttachEndpoint(ctx, AttachRequest{Tenant: "default", Network: "nonet", EndpointID: "x"}); err == nil {
		t.Fatal("attach to a missing network succeeded")
	}

	// A policy rule pkg/policy refuses is visible in Errors, /healthz and the metrics, and
	// goes away with the record.
	badRule := "default:g:default:p:default:p:r1:inRx"
	if err := store.Put(ctx, model.RuleStatePrefix+badRule, model.CfgPolicyRule{ID: badRule, OfnetPolicyRule: model.OfnetPolicyRule{
		RuleId: badRule, Priority: 0, DstEndpointGroup: 4, Action: "deny"}}); err != nil {
		t.Fatal(err)
	}
	hosts[0].agent.cfg.InspectOpen = true
	hsrv := httptest.NewServer(hosts[0].agent.Handler(prometheus.NewRegistry(), nil))
	defer hsrv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(hsrv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline = time.Now().Add(10 * time.Second)
	for hosts[0].agent.Errors()["policy-rule/"+badRule] == "" {
		if time.Now().After(deadline) {
			t.Fatalf("bad policy rule not reported: %v", hosts[0].agent.Errors())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "policy-rule/"+badRule) || !strings.Contains(body, "Priority") ||
		!strings.Contains(body, "remote-endpoint/"+badRemote) {
		t.Errorf("/healthz with a bad rule and a bad remote = %d %s", code, body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, "contiv_netplugin_policy_rule_errors 1") ||
		!strings.Contains(body, `contiv_netplugin_object_errors{kind="remote-endpoint"} 1`) {
		t.Errorf("metrics lack contiv_netplugin_policy_rule_errors 1 or object_errors{kind=remote-endpoint} 1")
	}
	if _, err := store.Delete(ctx, model.RuleStatePrefix+badRule); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Delete(ctx, model.EpStateKey(badRemote)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		code, body := get("/healthz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz after the bad rule was deleted = %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Detach (twice: idempotent).
	for i := 0; i < 2; i++ {
		if err := hosts[0].agent.DetachEndpoint(ctx, DetachRequest{EndpointID: cts[0]}); err != nil {
			t.Fatalf("detach #%d: %v", i+1, err)
		}
	}
	if len(hosts[0].agent.Inspect().Endpoints) != 0 {
		t.Errorf("endpoint still programmed after detach")
	}
	deadline = time.Now().Add(10 * time.Second)
	for len(hosts[1].agent.Inspect().RemoteEndpoints) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("h2 kept the remote endpoint: %+v", hosts[1].agent.Inspect().RemoteEndpoints)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// afterCreate is the real netmaster client with a hook after CreateEndpoint.
type afterCreate struct {
	MasterClient
	then func()
}

func (m afterCreate) CreateEndpoint(ctx context.Context, req model.CreateEndpointRequest) (model.CfgEndpointState, error) {
	res, err := m.MasterClient.CreateEndpoint(ctx, req)
	m.then()
	return res, err
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitCond(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testPrefix names this run's namespaces and pins: "cby" + 4 random hex digits.
func testPrefix() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return "cby" + hex.EncodeToString(b)
}

// mountBPFFS mounts bpffs at /sys/fs/bpf when nothing is mounted there (what netplugin
// does at start) and unmounts it at the end only if this test mounted it.
func mountBPFFS(t *testing.T) {
	t.Helper()
	if out, _ := exec.Command("stat", "-f", "-c", "%T", "/sys/fs/bpf").Output(); strings.TrimSpace(string(out)) == "bpf_fs" {
		return
	}
	sh(t, "mount", "-t", "bpf", "bpf", "/sys/fs/bpf")
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "/sys/fs/bpf").CombinedOutput(); err != nil {
			t.Logf("umount /sys/fs/bpf: %v %s", err, out)
		}
	})
}

func epCount(t *testing.T, store *state.Store) int {
	kvs, _, err := store.List(context.Background(), model.EpStatePrefix)
	if err != nil {
		t.Fatal(err)
	}
	return len(kvs)
}
