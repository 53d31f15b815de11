package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/contivbpf/contivbpf/pkg/netbench"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// egressStage compares a container reaching the outside through the eBPF egress NAT
// (docs/host-routing.md) with the kernel's MASQUERADE on a router of the same shape
// (netbench.Masquerade): throughput, new connections/s, request/response latency. It runs
// its own one-host cluster with the simulation's external namespace.
func egressStage(ctx context.Context, cfg config, dp string, w io.Writer, r *report) error {
	if dp != "ebpf" {
		fmt.Fprintf(w, "\n(egress: the %s dataplane has no egress NAT yet; skipped)\n", dp)
		return nil
	}
	fmt.Fprintf(w, "\n#### egress (%s): one simulated host with the external namespace\n", dp)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + "e", Hosts: 1, BinDir: cfg.bin, Dataplane: dp, Logger: quiet, External: true})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the egress cluster: %v\n", err)
		}
	}()
	if err := c.CreateNetwork(ctx, "default", benchNet, "vxlan", benchSubnet, benchGW); err != nil {
		return err
	}
	a, err := c.AddContainer(ctx, c.Hosts[0], "a", "default", benchNet)
	if err != nil {
		return err
	}
	world := c.External.World.String()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := a.Exec(ctx, "ping", "-c", "1", "-W", "1", world)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s cannot reach the outside %s: %v: %s", a.Name, world, err, out)
		}
	}
	mtu, err := ipMTU(ctx, a.Name)
	if err != nil {
		return err
	}
	topo, err := netbench.Masquerade(c.Prefix+"m", mtu)
	if err != nil {
		return err
	}
	defer topo.Close()
	base := &path{label: "kernel MASQUERADE", clientNS: topo.Namespaces[0], serverNS: topo.Namespaces[3], serverIP: netbench.MasqServerIP}
	test := &path{label: dp + " egress", clientNS: a.Name, serverNS: c.External.NS, serverIP: world}
	if _, err := netbench.Run(base.clientNS, "ping", "-c", "1", "-W", "2", base.serverIP); err != nil {
		return fmt.Errorf("masquerade baseline not connected: %w", err)
	}
	d := &dpRun{dp: dp, cfg: cfg, w: w, r: r, c: c, ratios: map[string]float64{}}
	if err := d.compare(ctx, base, test, true); err != nil {
		return err
	}
	d.reportPair("egress", "masq", "kernel MASQUERADE", fmt.Sprintf("%s egress: container -> outside through eBPF source NAT vs a kernel MASQUERADE router of the same shape (MTU %d), %d/%d/%d alternating rounds",
		dp, mtu, cfg.tputRounds, cfg.crrRounds, cfg.rrRounds), base, test, nil)
	return nil
}
