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
	// Rounds: every path and the reference forwarder are timed in each (a fresh load of the
	// programs), and the figures are the medians over the rounds of each round's value and
	// ratio, so one noisy moment moves no figure (a single round's ratios spread ±20 %).
	const rounds = 5
	type perPath struct {
		c         cbebpf.PathCost
		ns, ratio []float64
		single    []string
	}
	paths := map[string]*perPath{}
	var order []string
	// prog.policy_deny_1024_vs_1: a denied SYN against 1,024 rules / against 1, per round;
	// prog.netpol_deny_1024_vs_1 likewise against a pod's NetworkPolicy set.
	var denyRatio, netpolRatio []float64
	// prog.rejudge_other_tenant: an established flow's packet right after another
	// tenant's policy change / without one, per round.
	var rejudge, rejudgeAfter, rejudgeBefore []float64
	for range rounds {
		if err := ctx.Err(); err != nil {
			return err
		}
		costs, err := cbebpf.MeasurePaths(200000)
		if err != nil {
			return err
		}
		byName := map[string]cbebpf.PathCost{}
		for _, c := range costs {
			byName[c.Name] = c
		}
		// Paths that rewrite their packet are timed as single runs interleaved with single
		// runs of the local path; their figure is (path − local, both single, medians) +
		// local (repeated), which removes the harness' per-run cost.
		local := byName["local"].NsPerPk
		// The reference forwarder (package reffwd: lookup + MAC rewrite + redirect_peer,
		// timed on the local path's packet right before and after each path, and after the
		// local path): prog.<path>_ratio, machine-independent where the ns figures are not.
		refNs := byName["ref-forward"].NsPerPk
		if refNs <= 0 {
			return fmt.Errorf("reference forwarder not measured: no prog.*_ratio figures")
		}
		if many, one := byName["policy-deny-1024"].NsPerPk, byName["policy-deny-1"].NsPerPk; many > 0 && one > 0 {
			denyRatio = append(denyRatio, many/one)
		}
		if many, one := byName["netpol-deny-1024"].NsPerPk, byName["netpol-deny-1"].NsPerPk; many > 0 && one > 0 {
			netpolRatio = append(netpolRatio, many/one)
		}
		if c := byName["rejudge-other-tenant"]; c.Before > 0 {
			rejudge = append(rejudge, c.NsPerPk/c.Before)
			rejudgeAfter, rejudgeBefore = append(rejudgeAfter, c.NsPerPk), append(rejudgeBefore, c.Before)
		}
		for _, c := range costs {
			if c.Before > 0 {
				continue // a paired figure, above
			}
			pp := paths[c.Name]
			if pp == nil {
				pp = &perPath{c: c}
				paths[c.Name] = pp
				order = append(order, c.Name)
			}
			v := c.NsPerPk
			if c.BaseNs > 0 {
				pp.single = append(pp.single, fmt.Sprintf("%.0f+%.0f", c.RestoredDiff, c.BaseNs))
			}
			if c.Single {
				base := local
				v = c.NsPerPk - c.SingleRef + base
				pp.single = append(pp.single, fmt.Sprintf("%.0f-%.0f+%.0f", c.NsPerPk, c.SingleRef, base))
			}
			pp.ns = append(pp.ns, v)
			// The reference timed around this path (same moment), else the round's.
			ref := refNs
			if c.RefNs > 0 {
				ref = c.RefNs
			}
			pp.ratio = append(pp.ratio, v/ref)
		}
	}
	var rows [][]string
	var ratios []figure
	names := map[string]string{
		"noop": "prog.noop", "local": "prog.local", "ref-forward": "prog.ref_forward", "arp-reply": "prog.arp_reply", "tunnel-encap": "prog.tunnel_encap",
		"tunnel-decap": "prog.tunnel_decap", "uplink-overlay": "prog.uplink_overlay", "uplink-host": "prog.uplink_host", "drop-unknown-dst": "prog.drop_unknown_dst", "vlan-push": "prog.vlan_push",
		"vlan-pop": "prog.vlan_pop", "stage-unknown-iface": "prog.stage_unknown_iface", "stage-not-ipv4": "prog.stage_not_ipv4",
		"ct-established": "prog.ct_established", "service": "prog.service", "policy-1024-rules": "prog.policy_1024_rules",
		"policy-2-rules": "prog.policy_2_rules", "policy-deny-1024": "prog.policy_deny_1024", "policy-deny-1": "prog.policy_deny_1",
		"netpol-deny-1024": "prog.netpol_deny_1024", "netpol-deny-1": "prog.netpol_deny_1", "netpol-deny-ranges": "prog.netpol_deny_ranges",
	}
	for _, n := range order {
		pp := paths[n]
		v, x := median(pp.ns), median(pp.ratio)
		note := fmt.Sprintf("repeated runs, median of %d rounds", rounds)
		if pp.c.BaseNs > 0 {
			note = fmt.Sprintf("hot: restoring copy − established direct flow's copy + its repeated (same setup), median of %d rounds (%s)", rounds, strings.Join(pp.single, ", "))
		}
		if pp.c.Single {
			note = fmt.Sprintf("single runs − local single + local repeated, median of %d rounds (%s)", rounds, strings.Join(pp.single, ", "))
		}
		name, ok := names[n]
		if !ok {
			rows = append(rows, []string{n, pp.c.Program, fmt.Sprintf("%.1f", v), "", "", "harness reference"})
			continue
		}
		if n != "ref-forward" {
			ratios = append(ratios, figure{Name: name + "_ratio", Value: round2(x), Unit: "ratio"})
		}
		rows = append(rows, []string{n, pp.c.Program, fmt.Sprintf("%.1f", v), fmt.Sprintf("%.2f", x), reasonOf(pp.c), note})
		r.add(name, round1(v), "ns")
	}
	for _, f := range ratios {
		r.add(f.Name, f.Value, f.Unit)
	}
	if len(denyRatio) > 0 {
		r.add("prog.policy_deny_1024_vs_1", round2(median(denyRatio)), "ratio")
		fmt.Fprintf(w, "policy: a denied SYN against 1,024 rules / against 1 rule: %.2f (median of %d rounds; goal <= 1.5)\n", median(denyRatio), len(denyRatio))
	}
	if len(netpolRatio) > 0 {
		r.add("prog.netpol_deny_1024_vs_1", round2(median(netpolRatio)), "ratio")
		fmt.Fprintf(w, "NetworkPolicy: a denied SYN against a 1,024-rule set / against 1 rule: %.2f (median of %d rounds; goal <= 1.5)\n", median(netpolRatio), len(netpolRatio))
	}
	if len(rejudge) > 0 {
		r.add("prog.rejudge_other_tenant", round2(median(rejudge)), "ratio")
		fmt.Fprintf(w, "policy: an established flow's packet right after another tenant's policy change / without one: %.2f (%.0f / %.0f ns single runs, median of %d rounds; goal <= 1.05)\n",
			median(rejudge), median(rejudgeAfter), median(rejudgeBefore), len(rejudge))
	}
	table(w, "eBPF program paths (Program.Benchmark, ns per packet; x ref = ns / ref_forward ns of the same round)", []string{"path", "program", "ns/pkt", "x ref", "verdict", "how"}, rows)
	// The conntrack collector: one pass over a table of 200,000 entries, half expired.
	const ctN = 200000
	d, deleted, err := cbebpf.MeasureCTGC(ctN)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "conntrack GC: one pass over %d entries (%d expired, deleted) took %.1f ms\n", ctN, deleted, float64(d.Microseconds())/1000)
	r.add("prog.ct_gc_200k_ms", round1(float64(d.Microseconds())/1000), "ms")
	return verifierFigures(w, r)
}

// verifierFigures reports every program's verifier budget (the load's statistics): the
// instructions it processed and its deepest call chain's stack, next to the limits.
func verifierFigures(w io.Writer, r *report) error {
	budgets, err := cbebpf.MeasureBudgets()
	if err != nil {
		return err
	}
	var rows [][]string
	for _, b := range budgets {
		rows = append(rows, []string{b.Program, fmt.Sprint(b.Insns), fmt.Sprintf("%.1f", 100*float64(b.Insns)/cbebpf.VerifierLimit),
			fmt.Sprint(b.States), fmt.Sprint(b.Stack), strings.Join(b.Chain, " → ")})
		r.add("prog.verified_insns."+b.Program, float64(b.Insns), "insns")
		r.add("prog.stack_bytes."+b.Program, float64(b.Stack), "bytes")
	}
	table(w, fmt.Sprintf("verifier budget (limits: %d instructions, %d bytes of stack per call chain)", cbebpf.VerifierLimit, cbebpf.StackLimit),
		[]string{"program", "insns", "% limit", "states", "stack", "deepest chain"}, rows)
	return nil
}

func reasonOf(c cbebpf.PathCost) string {
	if c.Name == "noop" || strings.HasPrefix(c.Name, "noop") {
		return ""
	}
	if c.Name == "ref-forward" {
		return "TC_ACT_REDIRECT (reference)"
	}
	if strings.HasPrefix(c.Name, "uplink-") {
		return "TCX_NEXT (checked, untouched)"
	}
	return c.Reason.String()
}
