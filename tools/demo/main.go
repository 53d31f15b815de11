// Command demo is the `make demo` walkthrough: two simulated hosts, netmaster with its
// embedded etcd, a network created with netctl, one container per host, a cross-host
// ping over VXLAN, (eBPF) a ping to the simulated outside through egress NAT, a peer's name
// resolved through the DNS responder at the gateway and the NAT table, and the first host's pinned endpoint map dumped with bpftool. Every
// step prints what it does; any failure exits non-zero after cleaning up.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/tools/sim"
)

func main() {
	dp := flag.String("dataplane", "ebpf", "ebpf | ovs")
	docker := flag.Bool("docker", false, "Docker walkthrough (reserved: run `make demo-docker`)")
	bin := flag.String("bin", "", "directory with netmaster, netplugin, netctl (default <repo>/bin)")
	flag.Parse()
	if *docker {
		fmt.Fprintln(os.Stderr, "demo: --docker is not available in this walkthrough; run `make demo-docker`")
		os.Exit(2)
	}
	// A closed stdout (e.g. `make demo | head`) must not kill the demo before it cleans up:
	// with SIGPIPE ignored, writes fail instead and the deferred clean-up still runs.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	start := time.Now()
	if err := run(ctx, *dp, *bin); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("\ndemo OK (%.1fs)\n", time.Since(start).Seconds())
}

// progress numbers the walkthrough's steps as it prints them.
type progress struct{ n int }

func (p *progress) step(format string, a ...any) {
	p.n++
	fmt.Printf("\n==> [%d] %s\n", p.n, fmt.Sprintf(format, a...))
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}

var summary = regexp.MustCompile(`(?m)^\d+ packets transmitted, \d+ (packets )?received.*$`)

func run(ctx context.Context, dp, bin string) (err error) {
	p := &progress{}
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, bpffs)")
	}
	if bin == "" {
		root, err := sim.RepoRoot()
		if err != nil {
			return err
		}
		bin = filepath.Join(root, "bin")
	}
	p.step("starting 2 simulated hosts (network namespaces on a veth underlay), netmaster (HTTPS, bearer tokens) with embedded etcd (TLS, client certificates), netplugin --dataplane=%s on each (agent token, etcd certificate)", dp)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := sim.Start(ctx, sim.Config{Hosts: 2, BinDir: bin, Dataplane: dp, Logger: quiet, Secure: true, External: dp == "ebpf",
		BGPRouter: dp == "ebpf" && sim.FRRInstalled(),
		// (Each host's WireGuard key under the demo's own directory, not /var/lib.)
		PluginArgs: func(c *sim.Cluster, h *sim.Host) []string {
			return []string{"--wireguard-dir", filepath.Join(c.WorkDir, h.Name, "wireguard")}
		}})
	if err != nil {
		return err
	}
	defer func() {
		p.step("cleaning up (processes, namespaces, pins, temp dir)")
		if cerr := c.Close(); cerr != nil {
			fmt.Print(indent(cerr.Error()))
			if err == nil {
				err = cerr
			}
		} else {
			fmt.Println("    done")
		}
	}()
	h1, h2 := c.Hosts[0], c.Hosts[1]
	fmt.Printf("    netmaster %s on %s; hosts %s (%s) and %s (%s)\n", c.MasterURL(), h1.Name, h1.Name, h1.IP, h2.Name, h2.IP)
	fmt.Printf("    netctl runs as: netctl --netmaster %s --cacert %s --token <admin token> ...\n", c.MasterURL(), c.CACert)

	p.step("netctl network create --subnet 10.103.1.0/24 -g 10.103.1.1 test-net")
	out, err := c.Netctl(ctx, "network", "create", "--subnet", "10.103.1.0/24", "-g", "10.103.1.1", "test-net")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	p.step("netctl network ls")
	out, err = c.Netctl(ctx, "network", "ls")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}

	p.step("one container per host, attached through each host's CNI socket (ContivCNI.AddPod)")
	c1, err := c.AddContainer(ctx, h1, "c1", "default", "test-net")
	if err != nil {
		return err
	}
	c2, err := c.AddContainer(ctx, h2, "c2", "default", "test-net")
	if err != nil {
		return err
	}
	for _, ct := range []*sim.Container{c1, c2} {
		fmt.Printf("    %s on %s: %s mac %s endpoint %s\n", ct.Name, ct.Host.Name, ct.IP, ct.MAC, ct.EndpointID)
	}

	p.step("ping %s -> %s across hosts (VXLAN)", c1.Name, c2.IP.Addr())
	var pingOut string
	deadline := time.Now().Add(15 * time.Second)
	for {
		pingOut, err = c1.Ping(ctx, c2.IP.Addr(), 5)
		if err == nil && strings.Contains(pingOut, " 0% packet loss") {
			break
		}
		if time.Now().After(deadline) {
			fmt.Print(indent(pingOut))
			return fmt.Errorf("cross-host ping failed: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Print(indent(summary.FindString(pingOut)))

	if dp == "ebpf" {
		world := c.External.World
		p.step("ping %s -> %s, outside every network (the simulation's external namespace): source-NATed to %s's address", c1.Name, world, h1.Name)
		out, err := c1.Ping(ctx, world, 3)
		if err != nil || !strings.Contains(out, " 0% packet loss") {
			fmt.Print(indent(out))
			return fmt.Errorf("ping to the outside failed: %v", err)
		}
		fmt.Print(indent(summary.FindString(out)))
		p.step("busybox nslookup c2 10.103.1.1 in %s: the peer's name, answered by %s's DNS responder at the gateway", c1.Name, h1.Name)
		out, err = c1.Exec(ctx, "busybox", "nslookup", "-type=a", "c2", "10.103.1.1")
		fmt.Print(indent(out))
		if err != nil || !strings.Contains(out, c2.IP.Addr().String()) {
			return fmt.Errorf("resolving c2 by name: %v", err)
		}
		p.step("netctl bpf nat (on %s): the egress flow in the NAT table", h1.Name)
		out, err = c.Netctl(ctx, "bpf", "nat", "--agent", "http://"+h1.Inspect)
		fmt.Print(indent(out))
		if err != nil {
			return err
		}

		if c.Router != nil {
			if err := demoBGP(ctx, p, c); err != nil {
				return err
			}
		}

		if err := demoEncryption(ctx, p, c, c1, c2); err != nil {
			return err
		}

		pin := filepath.Join(c.PinRoot, h1.Name, "cb_endpoints")
		p.step("bpftool map dump pinned %s", pin)
		b, err := exec.CommandContext(ctx, "bpftool", "map", "dump", "pinned", pin).CombinedOutput()
		fmt.Print(indent(string(b)))
		if err != nil {
			return fmt.Errorf("bpftool: %w", err)
		}
	}
	p.step("netplugin inspect on %s: /inspect/peers", h1.Name)
	var peers any
	if err := h1.InspectGet(ctx, "/inspect/peers", &peers); err != nil {
		return err
	}
	pj, err := json.MarshalIndent(peers, "", "  ")
	if err != nil {
		return err
	}
	fmt.Print(indent(string(pj) + "\n"))
	return nil
}

// demoBGP shows route distribution (docs/bgp.md): FRR as the hosts' top-of-rack router, a
// VLAN network routed natively between the hosts by the routes their speakers exchange.
func demoBGP(ctx context.Context, p *progress, c *sim.Cluster) error {
	h1, h2 := c.Hosts[0], c.Hosts[1]
	p.step("FRR (Debian's zebra + bgpd) as the top-of-rack router in %s, one link per host (\"bgp\", the hosts' --vlan-if)", c.Router.NS)
	if err := c.StartFRR(ctx, 9*time.Second); err != nil {
		return err
	}
	p.step("netctl network create --encap vlan --pkt-tag 200 --subnet 10.66.1.0/24 -g 10.66.1.1 bgp-net")
	out, err := c.Netctl(ctx, "network", "create", "--encap", "vlan", "--pkt-tag", "200", "--subnet", "10.66.1.0/24", "-g", "10.66.1.1", "bgp-net")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	for _, h := range c.Hosts {
		l := c.Router.Links[h.Name]
		args := []string{"bgp", "create", h.Name, "--router-ip", l.RouterIP.String(), "--as", fmt.Sprint(l.HostAS),
			"--neighbor-as", fmt.Sprint(sim.RouterASN), "--neighbor", l.Neighbor.String()}
		p.step("netctl %s", strings.Join(args, " "))
		out, err := c.Netctl(ctx, args...)
		fmt.Print(indent(out))
		if err != nil {
			return err
		}
	}
	c3, err := c.AddContainer(ctx, h1, "c3", "default", "bgp-net")
	if err != nil {
		return err
	}
	c4, err := c.AddContainer(ctx, h2, "c4", "default", "bgp-net")
	if err != nil {
		return err
	}
	p.step("ping %s (%s on %s) -> %s (%s on %s): routed natively through FRR, no tunnel, no tag", c3.Name, c3.IP.Addr(), h1.Name, c4.Name, c4.IP.Addr(), h2.Name)
	var pingOut string
	deadline := time.Now().Add(30 * time.Second)
	for {
		pingOut, err = c3.Ping(ctx, c4.IP.Addr(), 3)
		if err == nil && strings.Contains(pingOut, " 0% packet loss") {
			break
		}
		if time.Now().After(deadline) {
			fmt.Print(indent(pingOut))
			return fmt.Errorf("ping over BGP routes failed: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Print(indent(summary.FindString(pingOut)))
	p.step("vtysh -c 'show ip bgp' on the router")
	out, err = c.Router.VTY(ctx, "show ip bgp")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	p.step("netctl bgp inspect %s", h1.Name)
	out, err = c.Netctl(ctx, "bgp", "inspect", h1.Name)
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	p.step("netctl bpf routes (on %s): what its datapath routes by", h1.Name)
	out, err = c.Netctl(ctx, "bpf", "routes", "--agent", "http://"+h1.Inspect)
	fmt.Print(indent(out))
	return err
}

// demoEncryption turns on encryption between the hosts (docs/encryption.md) the way an
// operator does: the cluster's setting, then a restart of each netplugin started without
// --encryption; then a key rotation on request.
func demoEncryption(ctx context.Context, p *progress, c *sim.Cluster, c1, c2 *sim.Container) error {
	h1, h2 := c.Hosts[0], c.Hosts[1]
	p.step("netctl global set --encryption wireguard: the cluster's setting; netplugins started without --encryption follow it at their next start")
	out, err := c.Netctl(ctx, "global", "set", "--encryption", "wireguard")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	p.step("restart netplugin on %s and %s: each opens a WireGuard device and publishes its public key through netmaster (the datapath keeps its state meanwhile)", h1.Name, h2.Name)
	for _, h := range []*sim.Host{h1, h2} {
		if err := c.StopPlugin(h); err != nil {
			return err
		}
		if err := c.StartPlugin(ctx, h); err != nil {
			return err
		}
	}
	for _, h := range []*sim.Host{h1, h2} {
		if err := h.WaitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	p.step("netctl wireguard ls")
	out, err = c.Netctl(ctx, "wireguard", "ls")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	ping := func(what string) error {
		p.step("ping %s -> %s across hosts, %s", c1.Name, c2.IP.Addr(), what)
		var pingOut string
		deadline := time.Now().Add(20 * time.Second)
		for {
			pingOut, err = c1.Ping(ctx, c2.IP.Addr(), 3)
			if err == nil && strings.Contains(pingOut, " 0% packet loss") {
				break
			}
			if time.Now().After(deadline) {
				fmt.Print(indent(pingOut))
				return fmt.Errorf("cross-host ping %s failed: %v", what, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		fmt.Print(indent(summary.FindString(pingOut)))
		return nil
	}
	if err := ping("VXLAN inside WireGuard"); err != nil {
		return err
	}
	p.step("netctl wireguard rotate %s: its agent makes a new key and publishes it; the peers take it", h2.Name)
	out, err = c.Netctl(ctx, "wireguard", "rotate", h2.Name)
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err = c.Netctl(ctx, "wireguard", "ls")
		if err == nil && strings.Contains(out, "done 1") {
			break
		}
		if time.Now().After(deadline) {
			fmt.Print(indent(out))
			return fmt.Errorf("rotation of %s not done: %v", h2.Name, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Print(indent(out))
	return ping("after the rotation")
}
