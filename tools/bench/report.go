package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
)

// figure is one measured number.
type figure struct {
	Name  string
	Value float64
	Unit  string
}

// report collects figures and errors and prints them as they arrive: a `BENCH name value
// unit` line per figure, `BENCH_ERROR name reason` per failed stage or figure.
type report struct {
	mu      sync.Mutex
	w       io.Writer
	figures []figure
	errors  map[string]string
}

func newReport(w io.Writer) *report { return &report{w: w, errors: map[string]string{}} }

func (r *report) add(name string, value float64, unit string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.figures = append(r.figures, figure{name, value, unit})
	fmt.Fprintf(r.w, "BENCH %s %s %s\n", name, formatValue(value), unit)
}

func (r *report) fail(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reason := strings.Join(strings.Fields(err.Error()), " ")
	if len(reason) > 300 {
		reason = reason[:300] + "..."
	}
	r.errors[name] = reason
	fmt.Fprintf(r.w, "BENCH_ERROR %s %s\n", name, reason)
}
func (r *report) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.figures)
}

func formatValue(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// table prints rows under a title with aligned columns.
func table(w io.Writer, title string, header []string, rows [][]string) {
	fmt.Fprintf(w, "\n== %s\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// goal says what a figure should reach; figures without a goal are reported only.
type goal struct {
	text string
	ok   func(v float64) bool
}

func atLeast(x float64) goal {
	return goal{fmt.Sprintf(">= %s", formatValue(x)), func(v float64) bool { return v >= x }}
}

func atMost(x float64) goal {
	return goal{fmt.Sprintf("<= %s", formatValue(x)), func(v float64) bool { return v <= x }}
}

func within(lo, hi float64) goal {
	return goal{fmt.Sprintf("%s-%s", formatValue(lo), formatValue(hi)), func(v float64) bool { return v >= lo && v <= hi }}
}

// goals by figure name without the dataplane prefix ("samehost.tput_ratio").
var goals = map[string]goal{
	"samehost.tput_ratio":  atLeast(0.98),
	"samehost.crr_ratio":   atLeast(0.95),
	"crosshost.tput_ratio": atLeast(1.05),
	// datapath-trust: with policy on both groups, no lower than the ratios without it
	// had when the issue was written.
	"samehost_policy.tput_ratio":  atLeast(0.95),
	"samehost_monitor.tput_ratio": atLeast(0.97),
	"operate.trace_p50_ms":        atMost(100),
	"crosshost_policy.tput_ratio": atLeast(1.02),
	// Issue 38: encrypted cross host against bare WireGuard, same run. Throughput:
	// higher is better; RR latency (Contiv / bare, p50): lower is better.
	"crosshost_wg.tput_ratio": atLeast(0.9),
	"crosshost_wg.rr_ratio":   atMost(1.11),
	// The per-packet goals, as ratios to the reference forwarder timed around
	// each path (nanoseconds differ 2x between machines of this kind).
	"prog.local_ratio":          atMost(1.3),
	"xdp.drop_ratio":            atLeast(3),
	"prog.ct_established_ratio": atMost(2.0),
	"prog.service_ratio":        atMost(2.5),
	// Datapath v3 (issue 33): policy's cost does not grow with the rules, and another
	// tenant's policy change costs a flow nothing.
	"prog.policy_deny_1024_vs_1":               atMost(1.5),
	"prog.netpol_deny_1024_vs_1":               atMost(1.5),
	"prog.rejudge_other_tenant":                atMost(1.05),
	"restart.rr_failed":                        atMost(0),
	"restart.resets":                           atMost(0),
	"restart.ping_lost":                        atMost(0),
	"cni.add_p50":                              atMost(30),
	"cni.add_p99":                              atMost(100),
	"cni.attach_100":                           atMost(5),
	"cp.failover_s":                            atMost(5),
	"cp.1nm.alloc_duplicates":                  atMost(0),
	"cp.2nm.alloc_duplicates":                  atMost(0),
	"cp.tls_vs_plain_create_ratio":             atLeast(0.8),
	"cp.tls_vs_plain_list_ratio":               atLeast(0.8),
	"cp.tls_vs_plain_alloc_ratio":              atLeast(0.8),
	"cp.slow20k.create_max_ms":                 atMost(1000),
	"cp.alloc_bytes_10_vs_24_ratio":            atMost(1),
	"egress.tput_ratio":                        atLeast(1.0),
	"egress.crr_ratio":                         atLeast(0.95),
	"dns.p99_us":                               atMost(1000),
	"bgp.converge_max_ms":                      atMost(1000),
	"nodeport.crr_ratio":                       atLeast(1.0),
	"k8s.cni_add_api_extra_p50_ms":             atMost(1),
	"k8s.endpointslice_p99_ms":                 atMost(100),
	"k8s.netpol_p99_ms":                        atMost(200),
	"svcscale.crr_10k_vs_1":                    atLeast(0.95),
	"scale.10k.agent_cpu_net_ms_per_1k_events": atMost(300), // without the bench's own polling
	"scale.10k.agent_rss_kib_per_1k_remote":    atMost(10240),
	"svcscale.crr_10k_vs_iptables":             atLeast(2),
	"scale.ovs_service_create_ms_1k":           atMost(2),
	"scale.ovs_backend_add_ms_1k":              atMost(2),
	"netprofile.accuracy_10m":                  within(0.9, 1.05),
	"netprofile.accuracy_1g":                   within(0.9, 1.05),
	"netprofile.accuracy_in_10m":               within(0.9, 1.05), // what the limited endpoint receives
	"netprofile.accuracy_in_1g":                within(0.9, 1.05),
	"netprofile.unlimited_tput_ratio":          atLeast(0.98),
}

// prefixGoals hold for every figure whose name starts with the key: one per program.
// Datapath v3 (issue 33): each program at most a quarter of the verifier's instruction
// limit and 448 bytes of stack (TestVerifierBudget holds the same in make test).
var prefixGoals = map[string]goal{
	"prog.verified_insns.": atMost(250_000),
	"prog.stack_bytes.":    atMost(448),
}

// goalOf is figure k's goal (by name without the dataplane prefix); ok is nil for none.
func goalOf(k string) goal {
	if g, ok := goals[k]; ok {
		return g
	}
	for p, g := range prefixGoals {
		if strings.HasPrefix(k, p) {
			return g
		}
	}
	return goal{}
}

// summary prints every figure once, the dataplane-specific ones side by side, with goals.
func (r *report) summary(w io.Writer, dataplanes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	type row struct {
		unit string
		vals map[string]float64
	}
	rows := map[string]*row{}
	var order []string
	isDP := func(name string) (string, string, bool) {
		for _, dp := range dataplanes {
			if rest, ok := strings.CutPrefix(name, dp+"."); ok {
				return dp, rest, true
			}
		}
		return "", name, false
	}
	for _, f := range r.figures {
		dp, key, ok := isDP(f.Name)
		if !ok {
			dp = "-"
		}
		x, seen := rows[key]
		if !seen {
			x = &row{unit: f.Unit, vals: map[string]float64{}}
			rows[key] = x
			order = append(order, key)
		}
		x.vals[dp] = f.Value
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i] < order[j] })
	header := []string{"figure"}
	for _, dp := range dataplanes {
		header = append(header, dp)
	}
	header = append(header, "unit", "goal", "met")
	var out [][]string
	for _, k := range order {
		x := rows[k]
		line := []string{k}
		for i, dp := range dataplanes {
			v, ok := x.vals[dp]
			if !ok && i == 0 {
				v, ok = x.vals["-"] // figures that do not depend on the dataplane
			}
			if ok {
				line = append(line, formatValue(v))
			} else {
				line = append(line, "")
			}
		}
		g := goalOf(k)
		met := ""
		if g.ok != nil {
			var res []string
			for i, dp := range dataplanes {
				v, ok := x.vals[dp]
				if !ok && i == 0 {
					v, ok = x.vals["-"]
				}
				if !ok {
					continue
				}
				if g.ok(v) {
					res = append(res, "yes")
				} else {
					res = append(res, "NO")
				}
			}
			met = strings.Join(res, "/")
		}
		out = append(out, append(line, x.unit, g.text, met))
	}
	table(w, "summary (figure names in BENCH lines carry the dataplane prefix, e.g. ebpf.samehost.tput_ratio)", header, out)
	if len(r.errors) > 0 {
		var names []string
		for n := range r.errors {
			names = append(names, n)
		}
		sort.Strings(names)
		var erows [][]string
		for _, n := range names {
			erows = append(erows, []string{n, r.errors[n]})
		}
		table(w, "stages that failed", []string{"name", "reason"}, erows)
	}
}
