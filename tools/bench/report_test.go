package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestReportLinesAndSummary(t *testing.T) {
	var buf bytes.Buffer
	r := newReport(&buf)
	r.add("ebpf.samehost.tput_ratio", 1.02, "ratio")
	r.add("ovs.samehost.tput_ratio", 0.03, "ratio")
	r.add("prog.local_ratio", 1.52, "ratio")
	r.fail("ovs.restart", errors.New("netplugin\nnot ready"))
	for _, want := range []string{
		"BENCH ebpf.samehost.tput_ratio 1.02 ratio\n",
		"BENCH prog.local_ratio 1.52 ratio\n",
		"BENCH_ERROR ovs.restart netplugin not ready\n",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	r.summary(&buf, []string{"ebpf", "ovs"})
	out := buf.String()
	var tputLine, progLine string
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "samehost.tput_ratio "):
			tputLine = l
		case strings.HasPrefix(l, "prog.local_ratio "):
			progLine = l
		}
	}
	if f := strings.Fields(tputLine); len(f) != 7 || f[1] != "1.02" || f[2] != "0.03" || f[6] != "yes/NO" {
		t.Errorf("tput row %q", tputLine)
	}
	if f := strings.Fields(progLine); len(f) != 6 || f[1] != "1.52" || f[5] != "NO" {
		t.Errorf("prog row %q", progLine)
	}
	if !strings.Contains(out, "stages that failed") {
		t.Errorf("summary lacks the failed stages:\n%s", out)
	}
}

func TestPairedRatio(t *testing.T) {
	// One noisy pair must not move the median.
	if got := pairedRatio([]float64{10, 20, 10}, []float64{10, 20, 1}); got != 1 {
		t.Errorf("pairedRatio = %v, want 1", got)
	}
	if got := pairedRatio(nil, nil); got != 0 {
		t.Errorf("empty pairedRatio = %v", got)
	}
}

// TestIssueGoalsJudged: the Datapath v3 issue's figures carry their goals in the summary
// (before, prog.policy_deny_1024_vs_1, prog.rejudge_other_tenant and the per-program
// verifier figures were printed with no goal, so a regression read as met), and so do
// the netprofile's ingress accuracy figures (issue 39).
func TestIssueGoalsJudged(t *testing.T) {
	var buf bytes.Buffer
	r := newReport(&buf)
	for _, f := range []struct {
		name  string
		value float64
	}{
		{"prog.policy_deny_1024_vs_1", 1.6}, {"prog.netpol_deny_1024_vs_1", 1.4},
		{"prog.rejudge_other_tenant", 1.03},
		{"prog.verified_insns.cb_stage_ipv4", 250_001}, {"prog.verified_insns.cb_from_wire", 17_150},
		{"prog.stack_bytes.cb_stage_outside", 464}, {"prog.stack_bytes.cb_from_wire", 448},
		{"ebpf.netprofile.accuracy_in_10m", 0.98}, {"ebpf.netprofile.accuracy_in_1g", 0.85},
	} {
		r.add(f.name, f.value, "x")
	}
	buf.Reset()
	r.summary(&buf, []string{"ebpf"})
	want := map[string]string{
		"prog.policy_deny_1024_vs_1": "NO", "prog.netpol_deny_1024_vs_1": "yes", "prog.rejudge_other_tenant": "yes",
		"prog.verified_insns.cb_stage_ipv4": "NO", "prog.verified_insns.cb_from_wire": "yes",
		"prog.stack_bytes.cb_stage_outside": "NO", "prog.stack_bytes.cb_from_wire": "yes",
		"netprofile.accuracy_in_10m": "yes", "netprofile.accuracy_in_1g": "NO",
	}
	for _, l := range strings.Split(buf.String(), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if w, ok := want[f[0]]; ok {
			if f[len(f)-1] != w {
				t.Errorf("%s: met %q, want %q (row %q)", f[0], f[len(f)-1], w, l)
			}
			delete(want, f[0])
		}
	}
	for k := range want {
		t.Errorf("summary lacks %s:\n%s", k, buf.String())
	}
}
