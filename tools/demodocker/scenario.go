package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/dockertest"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// Options of one walkthrough run.
type Options struct {
	BinDir    string // netmaster, netplugin, netctl
	Dataplane string // ebpf (default) or ovs
	Out       io.Writer
	// Extra runs the checks beyond the seed walkthrough (docker-created network adoption,
	// address release and reuse, network removal).
	Extra bool
	// Bench, when > 0, times that many `docker run -d --net test-net` on host 1 (endpoint
	// create through the plugin, plus container start) and prints p50/p99.
	Bench int
	// WorkDir keeps the simulator's logs (netmaster, netplugins) there ("" = temporary).
	WorkDir string
}

// Walkthrough is the seed scenario with Docker on two simulated hosts: netctl creates
// test-net, every host's `docker network ls` shows it with driver netplugin, one busybox
// container per host, ping across hosts. Every resource is removed before it returns.
func Walkthrough(ctx context.Context, o Options) (err error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	say := func(format string, a ...any) { fmt.Fprintf(o.Out, format+"\n", a...) }
	prefix := "cbr" + dockertest.RandHex(2)
	base := filepath.Join(os.TempDir(), prefix)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(base)
	dockerDir := func(h *sim.Host) string { return filepath.Join(base, h.Name) }

	say("== starting netmaster + 2 netplugins (--mode docker, --dataplane %s) on simulated hosts", orDefault(o.Dataplane, "ebpf"))
	c, err := sim.Start(ctx, sim.Config{
		Prefix: prefix, Hosts: 2, BinDir: o.BinDir, Dataplane: o.Dataplane, WorkDir: o.WorkDir,
		PluginArgs: func(_ *sim.Cluster, h *sim.Host) []string {
			d := dockerDir(h)
			return []string{"--mode", "docker", "--docker-plugin-dir", filepath.Join(d, "plugins"), "--docker-host", "unix://" + filepath.Join(d, "docker.sock")}
		},
		ReadySocket: func(h *sim.Host) string { return filepath.Join(dockerDir(h), "plugins", "netplugin.sock") },
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	var daemons []*dockertest.Daemon
	defer func() {
		for _, d := range daemons {
			if serr := d.Stop(); serr != nil && err == nil {
				err = serr
			}
		}
	}()
	for _, h := range c.Hosts {
		// Containers' resolvers forward what Docker does not know to test-net's gateway:
		// the host's DNS responder (docs/host-routing.md), which knows every host's containers.
		d, err := dockertest.Start(ctx, dockertest.Options{Dir: dockerDir(h), NetNS: h.Name, LiveRestore: true, DNS: dnsServers(o.Dataplane)})
		if err != nil {
			return err
		}
		daemons = append(daemons, d)
		if err := d.ImportBusybox(ctx); err != nil {
			return err
		}
		say("   dockerd on %s: %s", h.Name, d.Host())
	}

	// The seed's command as written: no gateway. Docker's gateway request reserves .1 as
	// the network's gateway (netmaster), so the containers get .2, .3, ...
	say("== netctl network create --subnet 10.103.1.0/24 test-net")
	if out, err := c.Netctl(ctx, "network", "create", "--subnet", "10.103.1.0/24", "test-net"); err != nil {
		return fmt.Errorf("netctl net create: %w\n%s", err, out)
	}
	for i, d := range daemons {
		if err := waitNetwork(ctx, d, "test-net", true); err != nil {
			return fmt.Errorf("host %s: %w", c.Hosts[i].Name, err)
		}
		out, err := d.Docker(ctx, "network", "ls")
		if err != nil {
			return err
		}
		say("== docker network ls on %s\n%s", c.Hosts[i].Name, strings.TrimRight(out, "\n"))
		if err := checkDriver(ctx, d, "test-net"); err != nil {
			return fmt.Errorf("host %s: %w", c.Hosts[i].Name, err)
		}
	}

	say("== docker run --net test-net on both hosts")
	var ips []string
	for i, d := range daemons {
		name := fmt.Sprintf("c%d", i+1)
		if _, err := d.Docker(ctx, "run", "-d", "--name", name, "--net", "test-net", dockertest.BusyboxImage, "sleep", "3600"); err != nil {
			return err
		}
		ip, mac, err := containerAddr(ctx, d, name, "test-net")
		if err != nil {
			return err
		}
		link, err := d.Docker(ctx, "exec", name, "ip", "-o", "link", "show", "eth0")
		if err != nil {
			return err
		}
		say("   %s on %s: ip %s mac %s", name, c.Hosts[i].Name, ip, mac)
		if want := macOf(ip); mac != want {
			return fmt.Errorf("%s: MAC %s, want %s", name, mac, want)
		}
		if !strings.Contains(link, "mtu 1450") {
			return fmt.Errorf("%s: eth0 is not MTU 1450: %s", name, link)
		}
		if out, _ := d.Docker(ctx, "network", "ls"); strings.Contains(out, "docker_gwbridge") {
			return fmt.Errorf("docker added docker_gwbridge on %s (the driver disables the gateway service)", c.Hosts[i].Name)
		}
		ips = append(ips, ip)
	}
	if ips[0] != "10.103.1.2" || ips[1] != "10.103.1.3" {
		return fmt.Errorf("containers got %v, want 10.103.1.2 and .3 (the gateway .1 reserved)", ips)
	}
	say("== docker exec c1 ifconfig")
	ifc, err := daemons[0].Docker(ctx, "exec", "c1", "ifconfig", "eth0")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimRight(ifc, "\n"), "\n") {
		say("   %s", l)
	}

	// The first packet may be lost while a datapath (OVS) sets up; wait until reachable.
	if err := waitFor(ctx, 15*time.Second, func() error {
		_, err := daemons[0].Docker(ctx, "exec", "c1", "ping", "-c", "1", "-W", "1", ips[1])
		return err
	}); err != nil {
		return fmt.Errorf("c1 cannot reach c2 (%s): %w", ips[1], err)
	}
	say("== docker exec c1 ping -c 3 %s (c2 on the other host)", ips[1])
	out, err := daemons[0].Docker(ctx, "exec", "c1", "ping", "-c", "3", "-W", "2", ips[1])
	if err != nil {
		return err
	}
	summary := regexp.MustCompile(`\d+ packets transmitted, \d+ packets received.*`).FindString(out)
	say("   %s", summary)
	if !strings.Contains(out, "3 packets received") {
		return fmt.Errorf("ping across hosts lost packets:\n%s", out)
	}

	if o.Dataplane != "ovs" {
		// By name, across hosts: Docker's embedded DNS does not know c2 (another daemon's)
		// and asks the gateway, where the DNS responder answers from netmaster's state.
		say("== docker exec c1 ping -c 3 c2 (by name)")
		var out string
		if err := waitFor(ctx, 20*time.Second, func() error {
			var err error
			out, err = daemons[0].Docker(ctx, "exec", "c1", "ping", "-c", "3", "-W", "2", "c2")
			return err
		}); err != nil {
			return fmt.Errorf("ping c2 by name: %w\n%s", err, out)
		}
		say("   %s", strings.SplitN(out, "\n", 2)[0])
		say("   %s", regexp.MustCompile(`\d+ packets transmitted, \d+ packets received.*`).FindString(out))
		if !strings.Contains(out, "("+ips[1]+")") {
			return fmt.Errorf("c2 resolved to another address than %s:\n%s", ips[1], out)
		}
	}

	if o.Extra {
		if err := extraChecks(ctx, c, daemons, say); err != nil {
			return err
		}
	}
	if o.Bench > 0 {
		if err := benchRuns(ctx, daemons[0], o.Bench, say); err != nil {
			return err
		}
	}

	say("== clean-up: containers, test-net")
	for _, d := range daemons {
		if err := d.RemoveContainers(ctx); err != nil {
			return err
		}
	}
	if out, err := c.Netctl(ctx, "net", "rm", "test-net"); err != nil {
		return fmt.Errorf("netctl net rm: %w\n%s", err, out)
	}
	for i, d := range daemons {
		if err := waitNetwork(ctx, d, "test-net", false); err != nil {
			return fmt.Errorf("host %s: %w", c.Hosts[i].Name, err)
		}
	}
	say("== ok")
	return nil
}

// extraChecks: address release on container removal, and a network made with
// `docker network create` showing up in netmaster and on the other host.
func extraChecks(ctx context.Context, c *sim.Cluster, daemons []*dockertest.Daemon, say func(string, ...any)) error {
	before, err := netOper(ctx, c, "test-net")
	if err != nil {
		return err
	}
	if before.NumEndpoints != 2 {
		return fmt.Errorf("netmaster shows %d endpoints on test-net, want 2", before.NumEndpoints)
	}
	if _, err := daemons[0].Docker(ctx, "rm", "-f", "c1"); err != nil {
		return err
	}
	after, err := netOper(ctx, c, "test-net")
	if err != nil {
		return err
	}
	if after.NumEndpoints != 1 || after.AllocatedAddressesCount >= before.AllocatedAddressesCount {
		return fmt.Errorf("after docker rm: endpoints %d (want 1), allocated %d (was %d)", after.NumEndpoints, after.AllocatedAddressesCount, before.AllocatedAddressesCount)
	}
	if _, err := daemons[0].Docker(ctx, "run", "-d", "--name", "c3", "--net", "test-net", dockertest.BusyboxImage, "sleep", "3600"); err != nil {
		return err
	}
	ip, _, err := containerAddr(ctx, daemons[0], "c3", "test-net")
	if err != nil {
		return err
	}
	if ip != "10.103.1.2" {
		return fmt.Errorf("c3 got %s; the released 10.103.1.2 was not reused", ip)
	}
	say("   docker rm c1 released its endpoint and address; c3 reuses %s", ip)

	// A restarted netplugin rebuilds its Docker driver state (Docker replays nothing).
	h1 := c.Hosts[0]
	if err := c.StopPlugin(h1); err != nil {
		return err
	}
	if err := c.StartPlugin(ctx, h1); err != nil {
		return err
	}
	if err := h1.WaitReady(ctx, 60*time.Second); err != nil {
		return err
	}
	c2ip, _, err := containerAddr(ctx, daemons[1], "c2", "test-net")
	if err != nil {
		return err
	}
	if out, err := daemons[0].Docker(ctx, "exec", "c3", "ping", "-c", "2", "-W", "2", c2ip); err != nil || !strings.Contains(out, "2 packets received") {
		return fmt.Errorf("c3 -> c2 after netplugin restart: %v\n%s", err, out)
	}
	if _, err := daemons[0].Docker(ctx, "rm", "-f", "c3"); err != nil {
		return fmt.Errorf("remove c3 after netplugin restart: %w", err)
	}
	if _, err := daemons[0].Docker(ctx, "run", "-d", "--name", "c4", "--net", "test-net", dockertest.BusyboxImage, "sleep", "3600"); err != nil {
		return fmt.Errorf("run c4 after netplugin restart: %w", err)
	}
	if out, err := daemons[0].Docker(ctx, "exec", "c4", "ping", "-c", "2", "-W", "2", c2ip); err != nil || !strings.Contains(out, "2 packets received") {
		return fmt.Errorf("c4 -> c2 after netplugin restart: %v\n%s", err, out)
	}
	// A restarted dockerd (live-restore) keeps its containers connected.
	if err := daemons[1].Restart(ctx); err != nil {
		return err
	}
	if out, err := daemons[0].Docker(ctx, "exec", "c4", "ping", "-c", "2", "-W", "2", c2ip); err != nil || !strings.Contains(out, "2 packets received") {
		return fmt.Errorf("c4 -> c2 after dockerd restart on %s: %v\n%s", c.Hosts[1].Name, err, out)
	}
	if out, err := daemons[1].Docker(ctx, "exec", "c2", "ping", "-c", "1", "-W", "2", "10.103.1.1"); err == nil && !strings.Contains(out, "packets transmitted") {
		return fmt.Errorf("c2 exec after dockerd restart: %s", out)
	}
	say("   dockerd restart on %s (live-restore): c2 still reachable", c.Hosts[1].Name)
	if _, err := daemons[0].Docker(ctx, "rm", "-f", "c4"); err != nil {
		return err
	}
	if o, err := netOper(ctx, c, "test-net"); err != nil || o.NumEndpoints != 1 {
		return fmt.Errorf("after removing c3/c4 across a netplugin restart: endpoints %d (want 1), err %v", o.NumEndpoints, err)
	}
	say("   netplugin restart on %s: c3 kept pinging, was removed cleanly, c4 attached", h1.Name)

	// An endpoint group becomes a Docker network named after it on every host.
	if out, err := c.Netctl(ctx, "group", "create", "test-net", "web"); err != nil {
		return fmt.Errorf("netctl group create: %w\n%s", err, out)
	}
	for _, d := range daemons {
		if err := waitNetwork(ctx, d, "web", true); err != nil {
			return err
		}
	}
	if _, err := daemons[0].Docker(ctx, "run", "-d", "--name", "w1", "--net", "web", dockertest.BusyboxImage, "sleep", "3600"); err != nil {
		return err
	}
	wip, _, err := containerAddr(ctx, daemons[0], "w1", "web")
	if err != nil {
		return err
	}
	if out, err := daemons[0].Docker(ctx, "exec", "w1", "ping", "-c", "2", "-W", "2", c2ip); err != nil || !strings.Contains(out, "2 packets received") {
		return fmt.Errorf("w1 (group web) -> c2: %v\n%s", err, out)
	}
	if _, err := daemons[0].Docker(ctx, "rm", "-f", "w1"); err != nil {
		return err
	}
	if out, err := c.Netctl(ctx, "group", "rm", "web"); err != nil {
		return fmt.Errorf("netctl group rm: %w\n%s", err, out)
	}
	for _, d := range daemons {
		if err := waitNetwork(ctx, d, "web", false); err != nil {
			return err
		}
	}
	say("   group web: docker network web on both hosts, w1 got %s and reached c2; removed with the group", wip)

	say("== docker network create -d netplugin --ipam-driver netplugin --subnet 10.2.2.0/24 dnet (host 1)")
	if _, err := daemons[0].Docker(ctx, "network", "create", "-d", "netplugin", "--ipam-driver", "netplugin", "--subnet", "10.2.2.0/24", "--gateway", "10.2.2.1", "dnet"); err != nil {
		return err
	}
	if err := waitFor(ctx, 20*time.Second, func() error {
		_, err := netOper(ctx, c, "dnet")
		return err
	}); err != nil {
		return fmt.Errorf("dnet not created in netmaster: %w", err)
	}
	if err := waitNetwork(ctx, daemons[1], "dnet", true); err != nil {
		return fmt.Errorf("dnet on host 2: %w", err)
	}
	if _, err := daemons[1].Docker(ctx, "run", "-d", "--name", "d2", "--net", "dnet", dockertest.BusyboxImage, "sleep", "3600"); err != nil {
		return err
	}
	ip, _, err = containerAddr(ctx, daemons[1], "d2", "dnet")
	if err != nil {
		return err
	}
	if ip != "10.2.2.2" {
		return fmt.Errorf("d2 on dnet got %s, want 10.2.2.2", ip)
	}
	say("   dnet is in netmaster and on host 2; d2 there got %s", ip)
	if _, err := daemons[1].Docker(ctx, "rm", "-f", "d2"); err != nil {
		return err
	}
	if _, err := daemons[0].Docker(ctx, "network", "rm", "dnet"); err != nil {
		return err
	}
	if err := waitFor(ctx, 30*time.Second, func() error {
		if _, err := netOper(ctx, c, "dnet"); err == nil {
			return errors.New("dnet still in netmaster")
		}
		return nil
	}); err != nil {
		return err
	}
	if err := waitNetwork(ctx, daemons[1], "dnet", false); err != nil {
		return fmt.Errorf("dnet on host 2 after removal: %w", err)
	}
	say("   docker network rm dnet removed it from netmaster and host 2")
	return nil
}

func netOper(ctx context.Context, c *sim.Cluster, name string) (model.NetworkOper, error) {
	var insp struct {
		Oper model.NetworkOper `json:"Oper"`
	}
	err := c.MasterDo(ctx, http.MethodGet, "/api/v1/inspect/networks/default:"+name+"/", nil, &insp)
	return insp.Oper, err
}

func waitFor(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitNetwork waits until the daemon has (or no longer has) the named network.
func waitNetwork(ctx context.Context, d *dockertest.Daemon, name string, present bool) error {
	return waitFor(ctx, 30*time.Second, func() error {
		out, err := d.Docker(ctx, "network", "ls", "--format", "{{.Name}}")
		if err != nil {
			return err
		}
		has := false
		for _, n := range strings.Fields(out) {
			if n == name {
				has = true
			}
		}
		if has != present {
			return fmt.Errorf("docker network %s present=%v, want %v", name, has, present)
		}
		return nil
	})
}

func checkDriver(ctx context.Context, d *dockertest.Daemon, name string) error {
	out, err := d.Docker(ctx, "network", "inspect", "-f", "{{.Driver}} {{.IPAM.Driver}}", name)
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "netplugin netplugin" {
		return fmt.Errorf("network %s has driver/IPAM %q, want netplugin netplugin", name, strings.TrimSpace(out))
	}
	return nil
}

func containerAddr(ctx context.Context, d *dockertest.Daemon, name, network string) (ip, mac string, err error) {
	out, err := d.Docker(ctx, "inspect", "-f", "{{json .NetworkSettings.Networks}}", name)
	if err != nil {
		return "", "", err
	}
	var nets map[string]struct {
		IPAddress  string
		MacAddress string
	}
	if err := json.Unmarshal([]byte(out), &nets); err != nil {
		return "", "", fmt.Errorf("inspect %s: %w", name, err)
	}
	n, ok := nets[network]
	if !ok || n.IPAddress == "" {
		return "", "", fmt.Errorf("container %s has no address on %s: %s", name, network, out)
	}
	return n.IPAddress, n.MacAddress, nil
}

func macOf(ip string) string {
	m, _ := model.MACFromIPv4(ip)
	return m
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// benchRuns times n `docker run -d` on test-net and, as a baseline, n with --net none
// (container start without any network driver); the difference is what the plugin adds.
func benchRuns(ctx context.Context, d *dockertest.Daemon, n int, say func(string, ...any)) error {
	pct := func(l []time.Duration, p int) time.Duration {
		s := append([]time.Duration(nil), l...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[(len(s)*p+99)/100-1]
	}
	measure := func(netw string) (run, rm []time.Duration, err error) {
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if _, err := d.Docker(ctx, "run", "-d", "--name", fmt.Sprintf("b%d", i), "--net", netw, dockertest.BusyboxImage, "sleep", "3600"); err != nil {
				return nil, nil, err
			}
			run = append(run, time.Since(t0))
		}
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if _, err := d.Docker(ctx, "rm", "-f", fmt.Sprintf("b%d", i)); err != nil {
				return nil, nil, err
			}
			rm = append(rm, time.Since(t0))
		}
		return run, rm, nil
	}
	for _, netw := range []string{"none", "test-net"} {
		run, rm, err := measure(netw)
		if err != nil {
			return err
		}
		say("== docker run -d --net %s x%d: p50 %v p99 %v; docker rm -f: p50 %v p99 %v", netw, n,
			pct(run, 50).Round(time.Millisecond), pct(run, 99).Round(time.Millisecond),
			pct(rm, 50).Round(time.Millisecond), pct(rm, 99).Round(time.Millisecond))
	}
	return nil
}

// dnsServers is what the daemons' containers forward unknown names to: test-net's gateway
// (reserved as .1 by Docker's gateway request),
// where the eBPF datapath's DNS responder answers (none on OVS).
func dnsServers(dataplane string) []string {
	if dataplane == "ovs" {
		return nil
	}
	return []string{"10.103.1.1"}
}
