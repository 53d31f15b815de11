// Command sim starts a simulated cluster (hosts as network namespaces, netmaster, one
// netplugin per host), optionally creates a network and containers, prints how to reach
// everything, and tears it all down on SIGINT/SIGTERM.
//
//	go run ./tools/sim/cmd/sim --hosts 3 --network 10.1.1.0/24 --containers 2
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/contivbpf/contivbpf/tools/sim"
)

func main() {
	hosts := flag.Int("hosts", 2, "number of simulated hosts")
	bin := flag.String("bin", "bin", "directory with netmaster, netplugin, netctl")
	prefix := flag.String("prefix", "", "name prefix (default: random cbsXXXX)")
	dp := flag.String("dataplane", "ebpf", "ebpf | ovs")
	subnet := flag.String("network", "", "create network test-net with this subnet (gateway .1), e.g. 10.1.1.0/24")
	per := flag.Int("containers", 0, "containers per host on test-net (needs --network)")
	encap := flag.String("encap", "vxlan", "encap of test-net: vxlan | vlan (vlan needs --vlan-uplink)")
	tag := flag.Int("pkt-tag", 0, "packet tag of test-net (VLAN id or VNI; 0 = netmaster picks)")
	vlanUplink := flag.Bool("vlan-uplink", false, "run every netplugin with --vlan-if uplink (eBPF: the underlay wire carries VLAN networks)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := sim.Config{Hosts: *hosts, BinDir: *bin, Prefix: *prefix, Dataplane: *dp, VLANUplink: *vlanUplink, Logger: slog.Default()}
	if err := run(ctx, cfg, *subnet, *encap, *tag, *per); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg sim.Config, subnet, encap string, tag, per int) error {
	if encap != "vxlan" && encap != "vlan" {
		return fmt.Errorf("--encap %q must be vxlan or vlan", encap)
	}
	if encap == "vlan" && !cfg.VLANUplink {
		return fmt.Errorf("--encap vlan needs --vlan-uplink (netplugin refuses vlan networks without --vlan-if)")
	}
	c, err := sim.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			slog.Error("teardown", "err", err)
		}
	}()
	if subnet != "" {
		gw, err := sim.FirstHost(subnet)
		if err != nil {
			return err
		}
		if err := c.CreateTaggedNetwork(ctx, "default", "test-net", encap, tag, subnet, gw); err != nil {
			return err
		}
		for _, h := range c.Hosts {
			for i := 1; i <= per; i++ {
				ct, err := c.AddContainer(ctx, h, fmt.Sprintf("c%d", i), "default", "test-net")
				if err != nil {
					return err
				}
				fmt.Printf("container %s on %s: %s (nsenter --net=%s)\n", ct.Name, h.Name, ct.IP, sim.NetNSPath(ct.Name))
			}
		}
	}
	fmt.Printf("netmaster %s (etcd %s) inside %s\n", c.MasterURL(), c.EtcdURL(), c.Hosts[0].Name)
	for _, h := range c.Hosts {
		fmt.Printf("host %s: underlay %s, CNI socket %s, inspect http://%s (nsenter --net=%s), pins %s/%s\n",
			h.Name, h.IP, h.CNISocket, h.Inspect, sim.NetNSPath(h.Name), c.PinRoot, h.Name)
	}
	fmt.Println("logs in", c.WorkDir, "- press Ctrl-C to tear down")
	<-ctx.Done()
	return nil
}
