//go:build cbbench

package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	cbebpf "github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
)

// progStage times every eBPF program path with Program.Benchmark (BPF_PROG_TEST_RUN) on
// crafted packets: the committed objects, private maps, nothing attached anywhere. The
// fixtures it uses (pkg/dataplane/ebpf/bench_export.go) build only with -tags cbbench;
// prog_untagged.go stands in without it.
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
	// Every path is also reported as a ratio of the reference forwarder (package reffwd:
	// lookup + MAC rewrite + redirect_peer, timed on the local path's packet right after
	// it): prog.<path>_ratio, machine-independent where the ns figures are not.
	refNs := byName["ref-forward"].NsPerPk
	var rows [][]string
	var ratios []figure
	names := map[string]string{
		"noop": "prog.noop", "local": "prog.local", "ref-forward": "prog.ref_forward", "arp-reply": "prog.arp_reply", "tunnel-encap": "prog.tunnel_encap",
		"tunnel-decap": "prog.tunnel_decap", "drop-unknown-dst": "prog.drop_unknown_dst", "vlan-push": "prog.vlan_push",
		"vlan-pop": "prog.vlan_pop", "stage-unknown-iface": "prog.stage_unknown_iface", "stage-not-ipv4": "prog.stage_not_ipv4",
		"ct-established": "prog.ct_established", "service": "prog.service", "policy-1024-rules": "prog.policy_1024_rules",
		"policy-2-rules": "prog.policy_2_rules",
	}
	for _, c := range costs {
		name, ok := names[c.Name]
		if !ok {
			rows = append(rows, []string{c.Name, c.Program, fmt.Sprintf("%.1f", c.NsPerPk), "", "", "harness reference"})
			continue
		}
		v := c.NsPerPk
		note := "repeated runs"
		if c.Single {
			v = c.NsPerPk - c.SingleRef + local
			note = fmt.Sprintf("single runs: %.1f - local %.1f + local repeated %.1f", c.NsPerPk, c.SingleRef, local)
		}
		x := ""
		if refNs > 0 {
			x = fmt.Sprintf("%.2f", v/refNs)
			if c.Name != "ref-forward" {
				ratios = append(ratios, figure{Name: name + "_ratio", Value: round2(v / refNs), Unit: "ratio"})
			}
		}
		rows = append(rows, []string{c.Name, c.Program, fmt.Sprintf("%.1f", v), x, reasonOf(c), note})
		r.add(name, round1(v), "ns")
	}
	for _, f := range ratios {
		r.add(f.Name, f.Value, f.Unit)
	}
	table(w, "eBPF program paths (Program.Benchmark, ns per packet; x ref = ns / ref_forward ns)", []string{"path", "program", "ns/pkt", "x ref", "verdict", "how"}, rows)
	if refNs <= 0 {
		return fmt.Errorf("reference forwarder not measured: no prog.*_ratio figures")
	}
	// The conntrack collector: one pass over a table of 200,000 entries, half expired.
	const ctN = 200000
	d, deleted, err := cbebpf.MeasureCTGC(ctN)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "conntrack GC: one pass over %d entries (%d expired, deleted) took %.1f ms\n", ctN, deleted, float64(d.Microseconds())/1000)
	r.add("prog.ct_gc_200k_ms", round1(float64(d.Microseconds())/1000), "ms")
	return nil
}

func reasonOf(c cbebpf.PathCost) string {
	if c.Name == "noop" || strings.HasPrefix(c.Name, "noop") {
		return ""
	}
	if c.Name == "ref-forward" {
		return "TC_ACT_REDIRECT (reference)"
	}
	return c.Reason.String()
}
