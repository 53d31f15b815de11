package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	cbebpf "github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
)

// progStage times every eBPF program path with Program.Benchmark (BPF_PROG_TEST_RUN) on
// crafted packets: the committed objects, private maps, nothing attached anywhere.
func progStage(ctx context.Context, w io.Writer, r *report) error {
	costs, err := cbebpf.MeasurePaths(500000)
	if err != nil {
		return err
	}
	byName := map[string]cbebpf.PathCost{}
	for _, c := range costs {
		byName[c.Name] = c
	}
	// Paths that rewrite their packet are timed as single runs interleaved with single runs
	// of the local path; their figure is (path − local, both single, medians) + local
	// (repeated), which removes the harness' per-run cost.
	local := byName["local"].NsPerPk
	var rows [][]string
	names := map[string]string{
		"noop": "prog.noop", "local": "prog.local", "arp-reply": "prog.arp_reply", "tunnel-encap": "prog.tunnel_encap",
		"tunnel-decap": "prog.tunnel_decap", "drop-unknown-dst": "prog.drop_unknown_dst", "vlan-push": "prog.vlan_push",
		"vlan-pop": "prog.vlan_pop", "stage-unknown-iface": "prog.stage_unknown_iface", "stage-not-ipv4": "prog.stage_not_ipv4",
	}
	for _, c := range costs {
		name, ok := names[c.Name]
		if !ok {
			rows = append(rows, []string{c.Name, c.Program, fmt.Sprintf("%.1f", c.NsPerPk), "", "harness reference"})
			continue
		}
		v := c.NsPerPk
		note := "repeated runs"
		if c.Single {
			v = c.NsPerPk - c.SingleRef + local
			note = fmt.Sprintf("single runs: %.1f - local %.1f + local repeated %.1f", c.NsPerPk, c.SingleRef, local)
		}
		rows = append(rows, []string{c.Name, c.Program, fmt.Sprintf("%.1f", v), reasonOf(c), note})
		r.add(name, round1(v), "ns")
	}
	table(w, "eBPF program paths (Program.Benchmark, ns per packet)", []string{"path", "program", "ns/pkt", "verdict", "how"}, rows)
	return nil
}

func reasonOf(c cbebpf.PathCost) string {
	if c.Name == "noop" || strings.HasPrefix(c.Name, "noop") {
		return ""
	}
	return c.Reason.String()
}

func round1(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }
