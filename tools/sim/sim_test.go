package sim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/agent"
	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestMain builds the binaries under test once per package run into a temp dir
// (CONTIVBPF_BIN_DIR, if set, names prebuilt ones instead).
func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

// testBins is set by TestMain: the directory holding netmaster, netplugin and netctl, or
// the error building them.
var testBins struct {
	dir string
	err error
}

func runTests(m *testing.M) int {
	flag.Parse()
	if d := os.Getenv("CONTIVBPF_BIN_DIR"); d != "" || !testroot.Have() || testing.Short() {
		testBins.dir = d
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "cbs-bin-")
	if err != nil {
		testBins.err = err
		return m.Run()
	}
	defer os.RemoveAll(dir)
	testBins.dir = dir
	if root, err := RepoRoot(); err != nil {
		testBins.err = err
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		testBins.err = Build(ctx, root, dir)
		cancel()
	}
	return m.Run()
}

// startCluster starts a cluster for the test (root needed, binaries built by TestMain),
// dumping its logs if the test failed and removing it at the end.
func startCluster(t *testing.T, ctx context.Context, cfg Config) *Cluster {
	t.Helper()
	testroot.Need(t)
	cfg.BinDir = buildBins(t)
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		c.Close()
	})
	return c
}

// buildBins returns the directory of the binaries TestMain built.
func buildBins(t *testing.T) string {
	t.Helper()
	if testBins.err != nil {
		t.Fatalf("build binaries: %v", testBins.err)
	}
	if testBins.dir == "" {
		t.Fatal("binaries were not built (TestMain skipped the build)")
	}
	return testBins.dir
}

type endpoints struct {
	Local  []struct{ ID, HostIfName string }
	Remote []struct{ ID, VTEP string }
}

func eventually(t *testing.T, what string, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTwoHosts runs one two-host cluster through the scenarios: cross-host and same-host
// traffic, agent crash and restart with traffic kept and state restored, endpoint delete.
func TestTwoHosts(t *testing.T) {
	testroot.Need(t)
	bin := buildBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{Hosts: 2, BinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		if !closed {
			c.Close()
		}
	})
	h1, h2 := c.Hosts[0], c.Hosts[1]
	if err := c.CreateNetwork(ctx, "default", "test-net", "vxlan", "10.103.1.0/24", "10.103.1.1"); err != nil {
		t.Fatal(err)
	}
	a, err := c.AddContainer(ctx, h1, "a", "default", "test-net")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AddContainer(ctx, h2, "b", "default", "test-net")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.AddContainer(ctx, h1, "a2", "default", "test-net")
	if err != nil {
		t.Fatal(err)
	}
	if a.IP.String() != "10.103.1.2/24" || a.MAC != "02:02:0a:67:01:02" {
		t.Errorf("first container got %v %s, want 10.103.1.2/24 02:02:0a:67:01:02 (Contiv IPAM/MAC)", a.IP, a.MAC)
	}
	if out, err := a.Exec(ctx, "ip", "-o", "link", "show", "eth0"); err != nil || !strings.Contains(out, "mtu 1450") {
		t.Errorf("container eth0 should have MTU 1450 on vxlan: %s %v", out, err)
	}

	pingOK := func(from *Container, to *Container) {
		t.Helper()
		out, err := from.Ping(ctx, to.IP.Addr(), 3)
		if err != nil || !strings.Contains(out, " 0% packet loss") {
			t.Fatalf("ping %s -> %s: %v\n%s", from.Name, to.IP.Addr(), err, out)
		}
	}
	// Cross-host (VXLAN) and same-host.
	eventually(t, "cross-host ping", 10*time.Second, func() error {
		out, err := a.Ping(ctx, b.IP.Addr(), 1)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	pingOK(a, b)
	pingOK(b, a)
	if err := a.TCPCheck(ctx, b, 5001); err != nil {
		t.Fatal(err)
	}
	pingOK(a, a2)
	if err := a2.TCPCheck(ctx, a, 5002); err != nil {
		t.Fatal(err)
	}
	var eps endpoints
	if err := h1.InspectGet(ctx, "/inspect/endpoints", &eps); err != nil {
		t.Fatal(err)
	}
	if len(eps.Local) != 2 || len(eps.Remote) != 1 || eps.Remote[0].VTEP != h2.IP.String() {
		t.Fatalf("h1 endpoints = %+v", eps)
	}
	// The operator's view of the same tables: netctl bpf through h1's netplugin.
	netctl := filepath.Join(bin, "netctl")
	out, err := Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "bpf", "endpoints", "--agent", "http://"+h1.Inspect)
	if err != nil {
		t.Fatalf("netctl bpf endpoints: %v\n%s", err, out)
	}
	for _, want := range []string{"NETWORK", "test-net.default", b.IP.Addr().String(), "vtep " + h2.IP.String() + " (" + h2.Name + ")", "local "} {
		if !strings.Contains(out, want) {
			t.Errorf("netctl bpf endpoints lacks %q:\n%s", want, out)
		}
	}
	if out, err := Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "bpf", "counters", "-j", "--agent", "http://"+h1.Inspect); err != nil || !strings.Contains(out, `"fwd_tunnel"`) {
		t.Errorf("netctl bpf counters -j: %v\n%s", err, out)
	}
	if out, err := Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "bpf", "peers", "--agent", "http://127.0.0.1:1"); err == nil || !strings.Contains(out, "cannot reach netplugin") {
		t.Errorf("netctl bpf against no agent: %v\n%s", err, out)
	}
	// The real netplugin's inspect API (--inspect-token-file): nothing without the token.
	if out, err := Exec(ctx, h1.Name, netctl, "bpf", "endpoints", "--agent", "http://"+h1.Inspect); err == nil || !strings.Contains(out, "401") {
		t.Errorf("netctl bpf endpoints without --agent-token: %v\n%s", err, out)
	}
	if out, err := Exec(ctx, h1.Name, netctl, "--agent-token", "not-the-token-0123456789", "bpf", "endpoints", "--agent", "http://"+h1.Inspect); err == nil || !strings.Contains(out, "unknown token") {
		t.Errorf("netctl bpf endpoints with a wrong token: %v\n%s", err, out)
	}
	monitorDeniedFlow(ctx, t, c, netctl, a, b)
	verifyDrift(ctx, t, c, netctl, h1, h2)

	// Crash h1's agent: traffic keeps flowing without it; a restarted agent restores.
	c.KillPlugin(h1)
	pingOK(a, b)
	if err := c.StartPlugin(ctx, h1); err != nil {
		t.Fatal(err)
	}
	if err := h1.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	eps = endpoints{}
	if err := h1.InspectGet(ctx, "/inspect/endpoints", &eps); err != nil {
		t.Fatal(err)
	}
	if len(eps.Local) != 2 || len(eps.Remote) != 1 {
		t.Fatalf("h1 endpoints after restart = %+v", eps)
	}
	pingOK(a, b)
	pingOK(b, a2)
	if err := b.TCPCheck(ctx, a, 5003); err != nil {
		t.Fatal(err)
	}
	// A graceful stop/start as well.
	if err := c.StopPlugin(h2); err != nil {
		t.Fatal(err)
	}
	pingOK(b, a)
	if err := c.StartPlugin(ctx, h2); err != nil {
		t.Fatal(err)
	}
	if err := h2.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	pingOK(b, a)

	// Delete: the veth, the oper record and the remote copy on h2 go away.
	hostIf := agent.HostIfName(a2.EndpointID)
	if out, err := Exec(ctx, h1.Name, "ip", "link", "show", hostIf); err != nil {
		t.Fatalf("host veth %s missing before delete: %v %s", hostIf, err, out)
	}
	if err := c.RemoveContainer(ctx, a2); err != nil {
		t.Fatal(err)
	}
	if _, err := Exec(ctx, h1.Name, "ip", "link", "show", hostIf); err == nil {
		t.Errorf("host veth %s still there after delete", hostIf)
	}
	eventually(t, "h2 forgets the deleted endpoint", 10*time.Second, func() error {
		var e endpoints
		if err := h2.InspectGet(ctx, "/inspect/endpoints", &e); err != nil {
			return err
		}
		if len(e.Remote) != 1 {
			return fmt.Errorf("h2 remote endpoints = %+v", e.Remote)
		}
		return nil
	})
	// Detach is idempotent.
	if _, err := cniapi.NewClient(h1.CNISocket).DelPod(ctx, cniapi.PodRequest{InfraContainerID: a2.ID, Tenant: "default", Network: "test-net"}); err != nil {
		t.Errorf("second DelPod: %v", err)
	}
	pingOK(a, b)

	// Close removes everything.
	closed = true
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	out, _ = run(ctx, "ip", "netns", "list")
	if strings.Contains(out, c.Prefix) {
		t.Errorf("namespaces left after Close: %s", out)
	}
	if _, err := os.Stat(c.PinRoot); !os.IsNotExist(err) {
		t.Errorf("pins left after Close: %v", err)
	}
}

// TestThreeHostsBridgeUnderlay checks the switch-style underlay (a bridge in its own
// namespace) and that every agent exports its state as metrics.
func TestThreeHostsBridgeUnderlay(t *testing.T) {
	testroot.Need(t)
	bin := buildBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{Hosts: 3, BinDir: bin, External: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		c.Close()
	})
	if err := c.CreateNetwork(ctx, "default", "n3", "vxlan", "10.104.0.0/24", "10.104.0.1"); err != nil {
		t.Fatal(err)
	}
	var cts []*Container
	for _, h := range c.Hosts {
		ct, err := c.AddContainer(ctx, h, "c", "default", "n3")
		if err != nil {
			t.Fatal(err)
		}
		cts = append(cts, ct)
	}
	for i, from := range cts {
		to := cts[(i+1)%len(cts)]
		eventually(t, fmt.Sprintf("ping %s -> %s", from.Name, to.IP.Addr()), 10*time.Second, func() error {
			out, err := from.Ping(ctx, to.IP.Addr(), 2)
			if err != nil || !strings.Contains(out, " 0% packet loss") {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
	}
	t.Run("beyond-the-subnet", func(t *testing.T) { beyondSubnet(ctx, t, c, cts) })
	t.Run("nodeport", func(t *testing.T) { nodePortService(ctx, t, c, cts) })
	resp, err := c.httpClient(c.Hosts[0].Name).Get("http://" + c.Hosts[0].Inspect + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := new(strings.Builder)
	if _, err := io.Copy(b, resp.Body); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`contiv_netplugin_endpoints{kind="local"} 1`, `contiv_netplugin_endpoints{kind="remote"} 2`, "contiv_netplugin_peers 2", "contiv_netplugin_synced 1",
		"contiv_datapath_scrape_errors 0", `contiv_datapath_packets_total{drop="true",reason="drop_policy"}`,
		`contiv_datapath_endpoint_step_seconds_count{step="tcx"} 1`, "contiv_netplugin_services ",
		`contiv_netplugin_driver_call_seconds_count{object="remote-endpoint",verb="upsert"}`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The pings above went through the datapath: its own counters must show them.
	for _, reason := range []string{"fwd_tunnel", "fwd_local", "arp_reply", "fwd_egress", "fwd_egress_reply", "fwd_host", "icmp_gw_reply"} {
		m := regexp.MustCompile(`contiv_datapath_packets_total\{drop="false",reason="` + reason + `"\} ([0-9.e+]+)`).FindStringSubmatch(b.String())
		if m == nil || m[1] == "0" {
			t.Errorf("datapath counter %s = %v, want > 0", reason, m)
		}
	}
}

// monitorDeniedFlow: a group whose policy denies TCP 5999 in; `netctl monitor --policy` on
// the destination's host names the rule (as netmaster names it) and both endpoints for a
// connection attempt from container from (same network, no group), while an unreachable
// second agent is reported and does not stop the stream.
func monitorDeniedFlow(ctx context.Context, t *testing.T, c *Cluster, netctl string, from, far *Container) {
	t.Helper()
	h := from.Host
	if err := c.CreatePolicy(ctx, "default", "mon"); err != nil {
		t.Fatal(err)
	}
	if err := c.AddRule(ctx, model.Rule{TenantName: "default", PolicyName: "mon", RuleID: "1", Direction: "in", Action: "deny", Protocol: "tcp", Port: 5999, Priority: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.AddRule(ctx, model.Rule{TenantName: "default", PolicyName: "mon", RuleID: "2", Direction: "in", Action: "allow", Protocol: "tcp", Port: 6000, Priority: 2}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateEndpointGroup(ctx, "default", from.Network, "mon-web", "mon"); err != nil {
		t.Fatal(err)
	}
	w, err := c.AddContainerInGroup(ctx, h, "w", "default", from.Network, "mon-web")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.RemoveContainer(ctx, w); err != nil {
			t.Error(err)
		}
	}()
	// One group's rules, as the operator asks for them (the agent reads that group alone).
	eventually(t, "netctl bpf policy --group mon-web", 30*time.Second, func() error {
		out, err := Exec(ctx, h.Name, netctl, "--agent-token", c.InspectToken, "bpf", "policy", "--group", "mon-web", "--agent", "http://"+h.Inspect)
		if err != nil || !strings.Contains(out, "5999") || !strings.Contains(out, ":mon:2:inRx") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if out, err := Exec(ctx, h.Name, netctl, "--agent-token", c.InspectToken, "bpf", "policy", "--group", "nosuch", "--agent", "http://"+h.Inspect); err == nil ||
		!strings.Contains(out, `no endpoint group "nosuch:default"`) {
		t.Errorf("netctl bpf policy of an unknown group: %v\n%s", err, out)
	}
	// Monitors closed and reopened back to back: each reconnect finds the datapath's (single)
	// event stream free again.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return DialContext(ctx, h.Name, network, addr)
	}}}
	for i := 0; i < 20; i++ {
		rctx, rcancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+h.Inspect+"/monitor", nil)
		req.Header.Set("Authorization", "Bearer "+c.InspectToken)
		resp, err := hc.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			rcancel()
			t.Fatalf("monitor reconnect %d: %v %v", i, err, resp)
		}
		resp.Body.Close()
		rcancel()
	}
	mctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := Exec(mctx, h.Name, netctl, "--agent-token", c.InspectToken, "monitor", "--policy", "--count", "1",
			"--agent", "http://"+h.Inspect, "--agent", "http://127.0.0.1:1")
		done <- result{out, err}
	}()
	// Keep trying until the monitor has seen one (the stream may open after the first SYN).
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		conn, err := DialContext(dctx, from.Name, "tcp", fmt.Sprintf("%s:5999", w.IP.Addr()))
		dcancel()
		if err == nil {
			conn.Close()
			t.Fatal("TCP 5999 into the group is not denied")
		}
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("netctl monitor: %v\n%s", r.err, r.out)
			}
			rule := "default:mon-web:default:mon:default:mon:1:inRx"
			for _, want := range []string{"drop_policy", from.IP.Addr().String(), w.IP.Addr().String() + ":5999",
				"(" + from.EndpointID + ")", "(" + w.EndpointID + ")", "tcp", "rule " + rule, "127.0.0.1:1: down"} {
				if !strings.Contains(r.out, want) {
					t.Errorf("netctl monitor output lacks %q:\n%s", want, r.out)
				}
			}
			t.Logf("netctl monitor: %s", strings.TrimSpace(r.out))
			monitorAllowed(ctx, t, netctl, from, w)
			traceFlows(ctx, t, netctl, from, w, far)
			return
		case <-tick.C:
		case <-mctx.Done():
			t.Fatal("netctl monitor saw no policy drop within 60 s")
		}
	}
}

// hostsInSync: netctl verify finds every host's datapath (eBPF maps, OVS flows) in step
// with what its agent applied.
func hostsInSync(ctx context.Context, t *testing.T, c *Cluster, bin string) {
	t.Helper()
	for _, h := range c.Hosts {
		out, err := Exec(ctx, h.Name, filepath.Join(bin, "netctl"), "--agent-token", c.InspectToken, "verify", "--agent", "http://"+h.Inspect)
		if err != nil || !strings.Contains(out, "in sync") {
			t.Errorf("netctl verify on %s (%s): %v\n%s", h.Name, c.cfg.Dataplane, err, out)
		}
	}
}

// monitorSees: netctl monitor --all (every host netmaster lists) reports an event whose
// line contains want while poke makes traffic.
func monitorSees(ctx context.Context, t *testing.T, c *Cluster, bin, reason, want string, poke func()) {
	t.Helper()
	out := monitorWhile(ctx, t, c.Hosts[0].Name, filepath.Join(bin, "netctl"),
		[]string{"--netmaster", c.MasterURL(), "--agent-token", c.InspectToken, "monitor", "--all", "--reason", reason, "--count", "1"}, poke)
	if !strings.Contains(out, want) {
		t.Errorf("netctl monitor --all --reason %s (%s): no %q in\n%s", reason, c.cfg.Dataplane, want, out)
	}
}

// monitorWhile runs netctl with args (a monitor with --count) in host's namespace,
// calling poke every 300 ms until it exits (at most 30 s), and returns its output.
func monitorWhile(ctx context.Context, t *testing.T, host, netctl string, args []string, poke func()) string {
	t.Helper()
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan string, 1)
	go func() {
		out, err := Exec(mctx, host, append([]string{netctl}, args...)...)
		if err != nil {
			out += err.Error()
		}
		done <- out
	}()
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case out := <-done:
			return out
		case <-tick.C:
			poke()
		}
	}
}

// verifyDrift: netctl verify finds h1 in sync, then names the peer entry deleted behind
// the agent's back with bpftool (exit 5), reports an unreachable agent (exit 3), and the
// drift metric follows.
func verifyDrift(ctx context.Context, t *testing.T, c *Cluster, netctl string, h1, h2 *Host) {
	t.Helper()
	agent := "http://" + h1.Inspect
	if out, err := Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "verify", "--agent", agent); err != nil || !strings.Contains(out, "in sync") {
		t.Fatalf("netctl verify on a clean host: %v\n%s", err, out)
	}
	// --all: every host netmaster lists (their netplugins registered their inspect APIs).
	if out, err := Exec(ctx, h2.Name, netctl, "--agent-token", c.InspectToken, "--netmaster", c.MasterURL(), "verify", "--all"); err != nil ||
		strings.Count(out, "in sync") != len(c.Hosts) || !strings.Contains(out, h1.Name) || !strings.Contains(out, h2.Name) {
		t.Errorf("netctl verify --all: %v\n%s", err, out)
	}
	vtep := h2.IP.As4()
	pin := filepath.Join(c.PinRoot, h1.Name, "cb_peers")
	if out, err := run(ctx, "bpftool", "map", "delete", "pinned", pin, "key",
		fmt.Sprint(vtep[0]), fmt.Sprint(vtep[1]), fmt.Sprint(vtep[2]), fmt.Sprint(vtep[3])); err != nil {
		t.Fatalf("bpftool map delete: %v %s", err, out)
	}
	out, err := Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "verify", "--agent", agent)
	if code := exitCode(err); code != 5 || !strings.Contains(out, "cb_peers") || !strings.Contains(out, "missing") || !strings.Contains(out, h2.IP.String()) {
		t.Fatalf("netctl verify after deleting the peer entry: exit %d\n%s", code, out)
	}
	t.Logf("netctl verify: %s", strings.TrimSpace(out))
	if m, err := h1.Metrics(ctx); err != nil || !strings.Contains(m, "contiv_netplugin_datapath_drift 1") ||
		!strings.Contains(m, `contiv_netplugin_driver_counter{dataplane="ebpf",name="fwd_tunnel_packets"}`) {
		t.Errorf("drift and driver metrics after verify: %v\n%s", err, grepLines(m, "contiv_netplugin_d"))
	}
	out, err = Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "--timeout", "2s", "verify", "--agent", agent, "--agent", "http://127.0.0.1:1")
	if code := exitCode(err); code != 3 || !strings.Contains(out, "down") {
		t.Errorf("netctl verify with an unreachable agent: exit %d\n%s", code, out)
	}
	// Put the peer back the way the agent does: a restart's Sync rewrites everything.
	c.KillPlugin(h1)
	// While h1's agent is down (its registration not expired yet), --all reports it down
	// and still checks the others.
	out, err = Exec(ctx, h2.Name, netctl, "--agent-token", c.InspectToken, "--netmaster", c.MasterURL(), "--timeout", "2s", "verify", "--all")
	if code := exitCode(err); code != 3 || !strings.Contains(out, "down") || !strings.Contains(out, "in sync") {
		t.Errorf("netctl verify --all with h1's agent down: exit %d\n%s", code, out)
	}
	if err := c.StartPlugin(ctx, h1); err != nil {
		t.Fatal(err)
	}
	if err := h1.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := Exec(ctx, h1.Name, netctl, "--agent-token", c.InspectToken, "verify", "--agent", agent); err != nil {
		t.Errorf("netctl verify after the repairing restart: %v\n%s", err, out)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// traceFlows: netctl trace on from's host agrees with the real traffic of this test: the
// denied port is dropped by the rule netmaster named, a remote endpoint is tunneled to its
// host's VTEP; an unknown source is refused with a message.
func traceFlows(ctx context.Context, t *testing.T, netctl string, from, denied, far *Container) {
	t.Helper()
	h := from.Host
	agent := "http://" + h.Inspect
	out, err := Exec(ctx, h.Name, netctl, "--agent-token", h.c.InspectToken, "trace", "--agent", agent, "--from", from.EndpointID, "--to", denied.IP.Addr().String(), "--port", "5999")
	if err != nil || !strings.Contains(out, "verdict: dropped: drop_policy") ||
		!strings.Contains(out, "denied by rule default:mon-web:default:mon:default:mon:1:inRx") {
		t.Errorf("netctl trace of the denied flow: %v\n%s", err, out)
	}
	t.Logf("netctl trace: %s", strings.TrimSpace(out))
	out, err = Exec(ctx, h.Name, netctl, "--agent-token", h.c.InspectToken, "trace", "--agent", agent, "--from", from.EndpointID, "--to", far.EndpointID, "--port", "5001")
	if err != nil || !strings.Contains(out, "tunneled to VTEP "+far.Host.IP.String()+" ("+far.Host.Name+")") {
		t.Errorf("netctl trace to a remote endpoint: %v\n%s", err, out)
	}
	// The destination host's receive path, with the tunnel the source trace produced.
	out, err = Exec(ctx, h.Name, netctl, "--agent-token", h.c.InspectToken, "trace", "-j", "--agent", agent, "--from", from.EndpointID, "--to", far.EndpointID, "--port", "5001")
	var src struct {
		Tunnel json.RawMessage `json:"tunnel"`
	}
	if err != nil || json.Unmarshal([]byte(out), &src) != nil || len(src.Tunnel) == 0 {
		t.Fatalf("netctl trace -j to a remote endpoint: %v\n%s", err, out)
	}
	var rx struct {
		Host, Verdict, Reason string
	}
	if err := far.Host.c.do(ctx, far.Host.Name, http.MethodPost, "http://"+far.Host.Inspect+"/inspect/trace-receive", src.Tunnel, &rx); err != nil ||
		rx.Reason != "fwd_local" || !strings.Contains(rx.Verdict, far.EndpointID) {
		t.Errorf("trace-receive on %s: %v %+v", far.Host.Name, err, rx)
	}
	out, err = Exec(ctx, h.Name, netctl, "--agent-token", h.c.InspectToken, "trace", "--agent", agent, "--from", "no-such-endpoint", "--to", "10.1.2.3", "--port", "80")
	if code := exitCode(err); code != 3 || !strings.Contains(out, "no local endpoint") {
		t.Errorf("netctl trace from an unknown endpoint: exit %d\n%s", code, out)
	}
}

// monitorAllowed: with --allowed the monitor also reports a new flow a rule allowed, with
// that rule.
func monitorAllowed(ctx context.Context, t *testing.T, netctl string, from, to *Container) {
	t.Helper()
	h := from.Host
	out := monitorWhile(ctx, t, h.Name, netctl, []string{"--agent-token", h.c.InspectToken, "monitor", "--policy", "--allowed", "--count", "1", "--agent", "http://" + h.Inspect}, func() {
		dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer dcancel()
		if conn, err := DialContext(dctx, from.Name, "tcp", fmt.Sprintf("%s:6000", to.IP.Addr())); err == nil {
			conn.Close()
		}
	})
	if !strings.Contains(out, "policy_allow") || !strings.Contains(out, "rule default:mon-web:default:mon:default:mon:2:inRx") ||
		!strings.Contains(out, "new flow allowed") {
		t.Errorf("netctl monitor --allowed:\n%s", out)
	}
	t.Logf("netctl monitor --allowed: %s", strings.TrimSpace(out))
}

// beyondSubnet: with real netplugins, every container pings its gateway and the external
// namespace's "Internet" address and opens TCP to it (the outside sees the host's underlay
// address as the source); each host reaches its own container (ping and TCP, as a kubelet
// probe would) and the container reaches its host's underlay address.
func beyondSubnet(ctx context.Context, t *testing.T, c *Cluster, cts []*Container) {
	ext := c.External
	ln, err := Listen(ext.NS, "tcp4", net.JoinHostPort(ext.World.String(), "8443"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := make(chan string, len(cts))
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			peers <- conn.RemoteAddr().String()
			go func() { defer conn.Close(); _, _ = io.Copy(conn, conn) }()
		}
	}()
	for _, ct := range cts {
		for _, dst := range []string{"10.104.0.1", ext.World.String()} {
			eventually(t, fmt.Sprintf("ping %s -> %s", ct.Name, dst), 10*time.Second, func() error {
				out, err := ct.Exec(ctx, "busybox", "ping", "-c", "2", "-W", "1", dst)
				if err != nil || !strings.Contains(out, " 0% packet loss") {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			})
		}
		conn, err := DialContext(ctx, ct.Name, "tcp4", net.JoinHostPort(ext.World.String(), "8443"))
		if err != nil {
			t.Fatalf("%s to the outside: %v", ct.Name, err)
		}
		if _, err := conn.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Errorf("%s: echo from the outside: %v", ct.Name, err)
		}
		conn.Close()
		if p := <-peers; !strings.HasPrefix(p, ct.Host.IP.String()+":") {
			t.Errorf("the outside saw %s for %s, want its host %s", p, ct.Name, ct.Host.IP)
		}
		// Host → its container (kubelet probe) and container → its host.
		if out, err := Exec(ctx, ct.Host.Name, "busybox", "ping", "-c", "2", "-W", "1", ct.IP.Addr().String()); err != nil || !strings.Contains(out, " 0% packet loss") {
			t.Errorf("host %s ping %s: %v: %s", ct.Host.Name, ct.IP.Addr(), err, out)
		}
		hl, err := Listen(ct.Host.Name, "tcp4", net.JoinHostPort(ct.Host.IP.String(), "10250"))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			conn, err := hl.Accept()
			if err == nil {
				conn.Close()
			}
		}()
		conn, err = DialContext(ctx, ct.Name, "tcp4", net.JoinHostPort(ct.Host.IP.String(), "10250"))
		if err != nil {
			t.Errorf("%s to its host: %v", ct.Name, err)
		} else {
			conn.Close()
		}
		hl.Close()
		if err := ct.probeFromHost(ctx); err != nil {
			t.Error(err)
		}
	}
	// Names through the DNS responder at the gateway: another host's container by its
	// endpoint id, every container named "c", a name only the outside knows (forwarded),
	// and a name nobody has.
	for i, ct := range cts {
		peer := cts[(i+1)%len(cts)]
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return DialContext(ctx, ct.Name, "udp4", "10.104.0.1:53")
		}}
		lookup := func(name string) ([]string, error) {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			addrs, err := r.LookupHost(lctx, name)
			sort.Strings(addrs)
			return addrs, err
		}
		if got, err := lookup(peer.ID + "."); err != nil || strings.Join(got, ",") != peer.IP.Addr().String() {
			t.Errorf("%s resolves %s: %v %v, want %v", ct.Name, peer.ID, got, err, peer.IP.Addr())
		}
		if got, err := lookup("c."); err != nil || len(got) != len(cts) {
			t.Errorf("%s resolves c: %v %v, want all %d containers", ct.Name, got, err, len(cts))
		}
		if got, err := lookup(ExternalName); err != nil || strings.Join(got, ",") != ExternalWorld.String() {
			t.Errorf("%s resolves %s (forwarded): %v %v", ct.Name, ExternalName, got, err)
		}
		var dnsErr *net.DNSError
		if got, err := lookup("nosuch."); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("%s resolves nosuch: %v %v, want not found", ct.Name, got, err)
		}
	}
}

// probeFromHost opens a TCP connection from the container's host to a listener in the
// container (what a kubelet's HTTP probe does).
func (ct *Container) probeFromHost(ctx context.Context) error {
	ln, err := Listen(ct.Name, "tcp4", net.JoinHostPort(ct.IP.Addr().String(), "8080"))
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			_, _ = conn.Write([]byte("ok"))
			conn.Close()
		}
	}()
	conn, err := DialContext(ctx, ct.Host.Name, "tcp4", net.JoinHostPort(ct.IP.Addr().String(), "8080"))
	if err != nil {
		return fmt.Errorf("probe %s from %s: %w", ct.Name, ct.Host.Name, err)
	}
	defer conn.Close()
	buf := make([]byte, 2)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil {
		return fmt.Errorf("probe %s from %s: %w", ct.Name, ct.Host.Name, err)
	}
	return nil
}

// nodePortService: a serviceLB with a node port (REST, this project's extension) whose one
// provider is the container on host 2 is reached from the outside at every host's address
// (hosts 1 and 3 through the overlay, host 2 locally); host 2's own processes reach it at
// the VIP, host 1's get EPERM (no local backend).
func nodePortService(ctx context.Context, t *testing.T, c *Cluster, cts []*Container) {
	be := cts[1]
	if err := c.MasterDo(ctx, "POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: be.IP.Addr().String(),
		ContainerID: be.ID, Tenant: "default", Network: "n3", Event: "start", Labels: map[string]string{"app": "np"}}, nil); err != nil {
		t.Fatal(err)
	}
	svc := map[string]any{"tenantName": "default", "networkName": "n3", "serviceName": "np", "ipAddress": "10.104.0.200",
		"selectors": []string{"app=np"}, "ports": []string{"80:8080:TCP"}, "nodePorts": []string{"30080:80:TCP"}}
	if err := c.MasterDo(ctx, "POST", "/api/v1/serviceLBs/default:np/", svc, nil); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(be.Name, "tcp4", net.JoinHostPort(be.IP.Addr().String(), "8080"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peers := make(chan string, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			peers <- conn.RemoteAddr().String()
			conn.Close()
		}
	}()
	dial := func(ns, addr string) error {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		conn, err := DialContext(dctx, ns, "tcp4", addr)
		if err == nil {
			conn.Close()
		}
		return err
	}
	for _, h := range c.Hosts {
		want := h.IP.String() // through the overlay the backend sees the host that balanced it
		if h == be.Host {
			want = c.External.IP.String() // locally it sees the client
		}
		eventually(t, "node port on "+h.Name, 10*time.Second, func() error {
			return dial(c.External.NS, net.JoinHostPort(h.IP.String(), "30080"))
		})
		if got := <-peers; !strings.HasPrefix(got, want+":") {
			t.Errorf("node port on %s: backend saw %s, want %s", h.Name, got, want)
		}
	}
	if err := dial(be.Host.Name, "10.104.0.200:80"); err != nil {
		t.Errorf("host %s to the VIP: %v", be.Host.Name, err)
	} else if got := <-peers; !strings.HasPrefix(got, be.Host.IP.String()+":") {
		t.Errorf("host %s to the VIP: backend saw %s", be.Host.Name, got)
	}
	if err := dial(cts[0].Host.Name, "10.104.0.200:80"); err == nil || !strings.Contains(err.Error(), "not permitted") {
		t.Errorf("host %s (no local backend) to the VIP: %v, want operation not permitted", cts[0].Host.Name, err)
	}
}
