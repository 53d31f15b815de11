package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// crossHostWGStage measures encryption's cost to Contiv (issue 38): container a (host 1)
// → c (host 2) of a two-host eBPF cluster whose netplugins run with `--encryption
// wireguard` (overlay steered into each host's WireGuard device, clear overlay packets
// refused), against two namespaces joined by a veth wire and the same WireGuard devices
// (netbench.WireGuardPair) with nothing else in the path. Throughput and RR alternate
// as in crosshost. The stage fails unless host 1's WireGuard device sent at least the
// bytes iperf3 carried: a measurement in clear would not be one of encryption.
func crossHostWGStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	fmt.Fprintf(w, "\n#### crosshost_wg (ebpf): two simulated hosts with netplugin --encryption wireguard\n")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.verbose {
		quiet = slog.Default()
	}
	prefix := cfg.prefix + "w"
	// Device names are unique per machine and at most 15 bytes: the prefix and the host's
	// digit (hosts are <prefix>-h1, -h2).
	dev := func(h *sim.Host) string { return prefix + h.Name[len(h.Name)-1:] }
	c, err := sim.Start(ctx, sim.Config{Prefix: prefix, Hosts: 2, BinDir: cfg.bin, Dataplane: "ebpf", Logger: quiet,
		PluginArgs: func(c *sim.Cluster, h *sim.Host) []string {
			return []string{"--encryption", "wireguard", "--wireguard-dir", filepath.Join(c.WorkDir, h.Name, "wireguard"),
				"--wireguard-device", dev(h)}
		}})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the crosshost_wg cluster: %v\n", err)
		}
	}()
	d := &dpRun{dp: "ebpf", cfg: cfg, w: w, r: r, c: c, ratios: map[string]float64{}}
	// setup pings a -> c until it answers: both hosts' keys are published and steered.
	if err := d.setup(ctx); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	wg, err := netbench.WireGuardPair(ctx, prefix+"b", self)
	if err != nil {
		return err
	}
	defer wg.Close()
	base := &path{label: "wireguard", clientNS: wg.Namespaces[0], serverNS: wg.Namespaces[1], serverIP: netbench.WGTunnel2}
	test := &path{label: "ebpf crosshost_wg", clientNS: d.a.Name, serverNS: d.x.Name, serverIP: d.x.IP.Addr().String()}
	// The first packet waits for the baseline's handshake.
	if _, err := netbench.Run(base.clientNS, "ping", "-c", "1", "-W", "5", base.serverIP); err != nil {
		return fmt.Errorf("wireguard baseline not connected: %w", err)
	}
	h1 := c.Hosts[0]
	before, err := netbench.TxBytes(h1.Name, dev(h1))
	if err != nil {
		return err
	}
	if err := d.compare(ctx, base, test, false); err != nil {
		return err
	}
	after, err := netbench.TxBytes(h1.Name, dev(h1))
	if err != nil {
		return err
	}
	carried := iperfBytes(test.tput, cfg.tputSeconds)
	// The device counts whole inner packets (VXLAN, IP and TCP headers: about 8 % over
	// iperf3's payload); 0.9 leaves room for iperf3's own timing.
	if float64(after-before) < 0.9*carried {
		return fmt.Errorf("%s's WireGuard device %s sent %d bytes while iperf3 carried %.0f: the traffic did not go through WireGuard",
			h1.Name, dev(h1), after-before, carried)
	}
	mtu, err := ipMTU(ctx, d.a.Name)
	if err != nil {
		return fmt.Errorf("read container mtu: %w", err)
	}
	d.reportPair("crosshost_wg", "wg", "bare wireguard", fmt.Sprintf(
		"ebpf cross host encrypted: container a -> c (MTU %d) vs two namespaces joined by %s WireGuard devices (MTU %d), %d/%d alternating rounds",
		mtu, wg.Kind, 1500-80, cfg.tputRounds, cfg.rrRounds), base, test, func(float64, float64) [][]string {
		return [][]string{{"host 1 WireGuard device tx / iperf3 payload", "", fmt.Sprintf("%.3f", float64(after-before)/carried), "", "the measured traffic went through WireGuard"}}
	})
	// The latency figure: Contiv encrypted / bare WireGuard, p50 (lower is better).
	r.add("ebpf.crosshost_wg.rr_ratio", ratio(us(netbench.Percentile(test.rr, 50)), us(netbench.Percentile(base.rr, 50))), "ratio")
	return nil
}

// iperfBytes is the payload iperf3 carried in rounds of seconds each at the given Gbit/s.
func iperfBytes(gbits []float64, seconds int) float64 {
	var sum float64
	for _, g := range gbits {
		sum += g
	}
	return sum * float64(seconds) * 1e9 / 8
}
