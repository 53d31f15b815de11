package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/agent"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// bgpStage measures route distribution (docs/bgp.md) against a real router: two simulated
// hosts with FRR as their top-of-rack router. For each new endpoint on host 2: the time
// from the CNI ADD returning until FRR's kernel holds its /32 (advertised by host 2's
// speaker, installed by zebra) and until host 1's datapath routes it; then the same for
// the withdrawal when the endpoint is deleted.
func bgpStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	if !sim.FRRInstalled() {
		return fmt.Errorf("%s/bgpd missing (apt-get install frr)", sim.FRRDir)
	}
	fmt.Fprintf(w, "\n#### bgp (ebpf): two simulated hosts, FRR as their top-of-rack router\n")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + "b", Hosts: 2, BinDir: cfg.bin, Dataplane: "ebpf", Logger: quiet, BGPRouter: true})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the bgp cluster: %v\n", err)
		}
	}()
	if err := c.StartFRR(ctx, 9*time.Second); err != nil {
		return err
	}
	if err := c.CreateTaggedNetwork(ctx, "default", "bgp-net", "vlan", 200, "10.66.0.0/16", "10.66.0.1"); err != nil {
		return err
	}
	for _, h := range c.Hosts {
		l := c.Router.Links[h.Name]
		if out, err := c.Netctl(ctx, "bgp", "create", h.Name, "--router-ip", l.RouterIP.String(), "--as", fmt.Sprint(l.HostAS),
			"--neighbor-as", fmt.Sprint(sim.RouterASN), "--neighbor", l.Neighbor.String()); err != nil {
			return fmt.Errorf("bgp create %s: %v: %s", h.Name, err, out)
		}
	}
	h1, h2 := c.Hosts[0], c.Hosts[1]
	for _, h := range c.Hosts {
		if err := waitBGP(ctx, h, func(s agent.BGPStatus) bool { return s.NeighborStatus == "established" }); err != nil {
			return fmt.Errorf("%s: session: %w", h.Name, err)
		}
	}
	atFRR := func(ip netip.Addr, present bool) error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, err := sim.Exec(ctx, c.Router.NS, "ip", "-4", "route", "show", ip.String()+"/32", "proto", "bgp")
			if err == nil && (strings.TrimSpace(out) != "") == present {
				return nil
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("route %v at FRR present=%v not within 30s", ip, present)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	atHost1 := func(ip netip.Addr, present bool) error {
		return waitBGP(ctx, h1, func(s agent.BGPStatus) bool {
			for _, rt := range s.Routes {
				if strings.HasPrefix(rt, ip.String()+"/32 ") {
					return present
				}
			}
			return !present
		})
	}
	const n = 20
	var frrAdd, h1Add, frrDel, h1Del []time.Duration
	for i := 0; i < n && ctx.Err() == nil; i++ {
		ct, err := c.AddContainer(ctx, h2, fmt.Sprintf("e%d", i), "default", "bgp-net")
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := atFRR(ct.IP.Addr(), true); err != nil {
			return err
		}
		frrAdd = append(frrAdd, time.Since(t0))
		if err := atHost1(ct.IP.Addr(), true); err != nil {
			return err
		}
		h1Add = append(h1Add, time.Since(t0))
		if err := c.RemoveContainer(ctx, ct); err != nil {
			return err
		}
		t0 = time.Now()
		if err := atFRR(ct.IP.Addr(), false); err != nil {
			return err
		}
		frrDel = append(frrDel, time.Since(t0))
		if err := atHost1(ct.IP.Addr(), false); err != nil {
			return err
		}
		h1Del = append(h1Del, time.Since(t0))
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var rows [][]string
	for _, f := range []struct {
		name, label string
		s           []time.Duration
	}{
		{"converge", "new endpoint's /32 in FRR's kernel", frrAdd},
		{"converge_peer", "... and in the other host's datapath", h1Add},
		{"withdraw", "deleted endpoint's /32 gone from FRR's kernel", frrDel},
		{"withdraw_peer", "... and from the other host's datapath", h1Del},
	} {
		p50, p99 := netbench.Percentile(f.s, 50), netbench.Percentile(f.s, 99)
		r.add("bgp."+f.name+"_p50_ms", ms(p50), "ms")
		r.add("bgp."+f.name+"_max_ms", ms(p99), "ms")
		rows = append(rows, []string{f.label, fmt.Sprintf("%.1f", ms(p50)), fmt.Sprintf("%.1f", ms(p99))})
	}
	table(w, fmt.Sprintf("bgp: %d endpoints added and deleted on host 2, times from the CNI call's return", n), []string{"what", "p50 ms", "max ms"}, rows)
	return nil
}

// waitBGP polls h's /inspect/bgp until ok holds (30 s).
func waitBGP(ctx context.Context, h *sim.Host, ok func(agent.BGPStatus) bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var s agent.BGPStatus
		err := h.InspectGet(ctx, "/inspect/bgp", &s)
		if err == nil && ok(s) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not within 30s: %+v %v", s, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
