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
