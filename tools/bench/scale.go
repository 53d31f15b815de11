package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// scaleStage grows a cluster of cfg.scaleHosts simulated hosts (one real netplugin each,
// netmaster with embedded etcd) to cfg.scaleSteps endpoints spread over 100 networks of 5
// tenants, homed round-robin on the hosts: each endpoint is created the way a netplugin
// creates it (netmaster's /plugin/createEndpoint, 16 concurrent callers) and becomes a
// remote endpoint on the 9 other hosts. Per step: the create rate and latency, how long
// until every host has applied every endpoint (each host's contiv_netplugin_endpoints
// {kind="remote"}, polled every 100 ms: a count, not a dump), the lag of the k-th
// endpoint (the time a host's count reached k minus the time the k-th create returned, over
// all hosts), agent CPU per 1,000 endpoint events and RSS per 1,000 remote endpoints,
// netmaster's RSS and etcd's database size. Then policy: 10 groups with 10 rules each; 20
// rule additions, each timed until every host's datapath holds it (/inspect/bpf/policy).
// Last, on an OVS host, what one service change costs at cfg.scaleOVS services
// (scaleOVSServices).
func scaleStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	err := scaleEBPF(ctx, cfg, w, r)
	if cfg.scaleOVS > 0 && ctx.Err() == nil {
		if err := scaleOVSServices(ctx, cfg, w, r, cfg.scaleOVS); err != nil {
			r.fail("scale.ovs", err)
		}
	}
	return err
}

// scaleEBPF is the scale stage's eBPF cluster (see scaleStage).
func scaleEBPF(ctx context.Context, cfg config, w io.Writer, r *report) error {
	nh := cfg.scaleHosts
	etcd := "netmaster's embedded etcd"
	if cfg.scaleEtcd > 0 {
		etcd = fmt.Sprintf("an external etcd cluster of %d members", cfg.scaleEtcd)
	}
	fmt.Fprintf(w, "\n#### scale (ebpf): %d hosts, endpoints %v, services %v, %s\n", nh, cfg.scaleSteps, cfg.scaleSvcs, etcd)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Now()
	sc := sim.Config{Prefix: cfg.prefix + "s", Hosts: nh, BinDir: cfg.bin, Dataplane: "ebpf", Logger: quiet, EtcdMembers: cfg.scaleEtcd,
		NetmasterArgs: noQuotas} // (5,500 rules in one tenant)
	if cfg.scaleProf != "" {
		sc.PluginArgs = func(*sim.Cluster, *sim.Host) []string { return []string{"--pprof"} }
	}
	c, err := sim.Start(ctx, sc)
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the scale cluster: %v\n", err)
		}
	}()
	fmt.Fprintf(w, "cluster of %d hosts up in %.1fs\n", nh, time.Since(t0).Seconds())
	const nets, tenants = 100, 5
	netOf := func(i int) (tenant, name string) {
		k := i % nets
		return fmt.Sprintf("sct%d", k%tenants), fmt.Sprintf("scn%d", k)
	}
	for k := 0; k < tenants; k++ {
		name := fmt.Sprintf("sct%d", k)
		if err := c.MasterDo(ctx, "POST", "/api/v1/tenants/"+name+"/", map[string]any{"tenantName": name}, nil); err != nil {
			return err
		}
	}
	for k := 0; k < nets; k++ {
		tenant, name := netOf(k)
		// A /18 each: 16,000 endpoints per network fit (--scale-steps up to 1.6M in total).
		if err := c.CreateNetwork(ctx, tenant, name, "vxlan", fmt.Sprintf("10.%d.%d.0/18", 64+k/4, (k%4)*64), fmt.Sprintf("10.%d.%d.1", 64+k/4, (k%4)*64)); err != nil {
			return err
		}
	}
	rss0 := make([]int64, nh)
	for i, h := range c.Hosts {
		if rss0[i], err = processRSS(h.Plugin.PID()); err != nil {
			return err
		}
	}
	have := 0
	for i, n := range cfg.scaleSteps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var stopProf func()
		if cfg.scaleProf != "" && i == len(cfg.scaleSteps)-1 {
			stopProf = profileAgent(ctx, c.Hosts[0], cfg.scaleProf, w)
		}
		err := scaleEndpoints(ctx, c, w, r, have, n, netOf, rss0)
		if stopProf != nil {
			stopProf()
		}
		if err != nil {
			r.fail(fmt.Sprintf("scale.%s", stepLabel(n)), err)
			return nil // later steps build on this one
		}
		have = n
	}
	// Services, after the endpoints: the agents' RSS grows from here on by services only.
	for h, host := range c.Hosts {
		if rss0[h], err = processRSS(host.Plugin.PID()); err != nil {
			return err
		}
	}
	fills := &svcFills{c: c, port: "80:8080:TCP"}
	have = 0
	for _, n := range cfg.scaleSvcs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var stopProf func()
		if cfg.scaleProf != "" && n == cfg.scaleSvcs[len(cfg.scaleSvcs)-1] {
			stopProf = profileAgent(ctx, c.Hosts[0], cfg.scaleProf+".services", w)
		}
		err := scaleServices(ctx, c, w, r, fills, have, n, rss0)
		if stopProf != nil {
			stopProf()
		}
		if err != nil {
			r.fail("scale.svc_"+stepLabel(n), err)
			break // later steps build on this one
		}
		have = n
	}
	if err := scalePolicy(ctx, c, w, r); err != nil {
		r.fail("scale.policy", err)
	}
	return nil
}

// spread is how a batch of objects reaches the hosts of the scale cluster: what each
// host's agent reports applying (a gauge of its /metrics: a count, not a dump), which
// objects it counts, and how one is created.
type spread struct {
	gauge   *regexp.Regexp
	counted func(i, h int) bool // object i is in host h's count
	create  func(ctx context.Context, i int) error
	workers int
}

// count is how many of objects 0..n-1 host h counts.
func (sp spread) count(n, h int) int {
	k := 0
	for i := 0; i < n; i++ {
		if sp.counted(i, h) {
			k++
		}
	}
	return k
}

// propagation is what one step of a spread measured.
type propagation struct {
	created  time.Duration   // all creates
	lat      []time.Duration // each create call
	converge time.Duration   // last create returned → every host counts all
	lags     []time.Duration // create returned → a host counts it, over hosts
	cpuMs    []float64       // per host: agent CPU ms per 1,000 of its new objects
	// cpuNetMs is cpuMs without what the agent spends while nothing changes but the
	// bench polls its /metrics (measured for 3 s before the creates, same polling).
	cpuNetMs []float64
	rss      []int64 // per host: agent RSS after the step
	events   int     // new objects counted over all hosts
}

// propagate creates objects have..n-1 of sp and measures until every host counts its
// share: each host's gauge polled every 100 ms, the lag of the k-th object (in return
// order) on a host being the time its count passed the k-th new object it counts minus
// that create's return.
func propagate(ctx context.Context, c *sim.Cluster, sp spread, have, n int) (propagation, error) {
	nh := len(c.Hosts)
	var out propagation
	want := make([]int, nh)
	cpu0 := make([]time.Duration, nh)
	for h, host := range c.Hosts {
		want[h] = sp.count(n, h)
		var err error
		if cpu0[h], err = cpbench.ProcessCPU(host.Plugin.PID()); err != nil {
			return out, err
		}
	}
	type sample struct {
		at    time.Time
		count int
	}
	samples := make([][]sample, nh)
	done := make([]time.Time, nh)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var wg sync.WaitGroup
	for h, host := range c.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				if v := metricValue(wctx, host, sp.gauge); v >= 0 {
					now := time.Now()
					samples[h] = append(samples[h], sample{now, int(v)})
					if int(v) >= want[h] {
						done[h] = now
						return
					}
				}
				select {
				case <-wctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	// The agents' CPU while only the watchers poll: subtracted for cpuNetMs.
	idle := make([]time.Duration, nh)
	time.Sleep(3 * time.Second)
	for h, host := range c.Hosts {
		cpu, err := cpbench.ProcessCPU(host.Plugin.PID())
		if err != nil {
			return out, err
		}
		idle[h], cpu0[h] = cpu-cpu0[h], cpu
	}
	returned := make([]time.Time, n-have)
	out.lat = make([]time.Duration, n-have)
	start := time.Now()
	err := createConcurrently(ctx, have, n, sp.workers, func(ctx context.Context, i int) error {
		t := time.Now()
		err := sp.create(ctx, i)
		out.lat[i-have] = time.Since(t)
		returned[i-have] = time.Now()
		return err
	})
	if err != nil {
		return out, err
	}
	out.created = time.Since(start)
	lastCall := time.Now()
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Minute):
		stopWatch()
		<-waitDone
	case <-ctx.Done():
		return out, ctx.Err()
	}
	for h, d := range done {
		if d.IsZero() {
			last := -1
			if len(samples[h]) > 0 {
				last = samples[h][len(samples[h])-1].count
			}
			return out, fmt.Errorf("%s counts %d of %d after 5 minutes", c.Hosts[h].Name, last, want[h])
		}
		out.converge = max(out.converge, d.Sub(lastCall))
	}
	slices.SortFunc(returned, func(a, b time.Time) int { return a.Compare(b) })
	for h := 0; h < nh; h++ {
		base, j := sp.count(have, h), 0
		for k := range returned {
			if !sp.counted(have+k, h) {
				continue
			}
			j++
			for _, s := range samples[h] {
				if s.count >= base+j {
					out.lags = append(out.lags, max(0, s.at.Sub(returned[k])))
					break
				}
			}
		}
	}
	for h, host := range c.Hosts {
		cpu1, err := cpbench.ProcessCPU(host.Plugin.PID())
		if err != nil {
			return out, err
		}
		rss, err := processRSS(host.Plugin.PID())
		if err != nil {
			return out, err
		}
		ev := want[h] - sp.count(have, h)
		out.events += ev
		out.cpuMs = append(out.cpuMs, float64((cpu1-cpu0[h]).Microseconds())/1000/float64(max(ev, 1))*1000)
		polled := float64(idle[h]) / 3 * done[h].Sub(start).Seconds() // polling stops at done
		out.cpuNetMs = append(out.cpuNetMs, max(0, float64(cpu1-cpu0[h])-polled)/1e6/float64(max(ev, 1))*1000)
		out.rss = append(out.rss, rss)
	}
	return out, nil
}

// percentile is the p-th percentile (nearest rank) of v.
func percentile(v []time.Duration, p float64) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[max(0, min(len(s)-1, int(math.Ceil(p/100*float64(len(s))))-1))]
}

func msOf(d time.Duration) float64 { return round1(float64(d.Microseconds()) / 1000) }

// report adds the figures every spread step has under prefix p ("scale.10k.") and
// returns them as table rows.
func (pr propagation) report(r *report, p string, n, have int) [][]string {
	r.add(p+"create_per_s", round1(float64(n-have)/pr.created.Seconds()), "ops/s")
	r.add(p+"create_p50_ms", msOf(percentile(pr.lat, 50)), "ms")
	r.add(p+"create_p99_ms", msOf(percentile(pr.lat, 99)), "ms")
	r.add(p+"converge_s", round2(pr.converge.Seconds()), "s")
	r.add(p+"lag_p50_ms", msOf(percentile(pr.lags, 50)), "ms")
	r.add(p+"lag_p99_ms", msOf(percentile(pr.lags, 99)), "ms")
	r.add(p+"lag_max_ms", msOf(percentile(pr.lags, 100)), "ms")
	r.add(p+"agent_cpu_ms_per_1k_events", round1(median(pr.cpuMs)), "ms")
	r.add(p+"agent_cpu_net_ms_per_1k_events", round1(median(pr.cpuNetMs)), "ms")
	return [][]string{
		{"creates/s", fmt.Sprintf("%.0f", float64(n-have)/pr.created.Seconds())},
		{"create p50 / p99", fmt.Sprintf("%.1f / %.1f ms", msOf(percentile(pr.lat, 50)), msOf(percentile(pr.lat, 99)))},
		{"last create → every host has all", fmt.Sprintf("%.2f s", pr.converge.Seconds())},
		{"lag create → host applied p50 / p99 / max", fmt.Sprintf("%.0f / %.0f / %.0f ms", msOf(percentile(pr.lags, 50)), msOf(percentile(pr.lags, 99)), msOf(percentile(pr.lags, 100)))},
		{"agent CPU per 1k events (median of hosts)", fmt.Sprintf("%.1f ms", median(pr.cpuMs))},
		{"… without the CPU of the bench's own polling", fmt.Sprintf("%.1f ms", median(pr.cpuNetMs))},
	}
}

// scaleEndpoints creates endpoints have..n-1 (as a netplugin creates them, 16 concurrent
// callers, homed round-robin) and measures their propagation as remote endpoints.
func scaleEndpoints(ctx context.Context, c *sim.Cluster, w io.Writer, r *report, have, n int,
	netOf func(int) (string, string), rss0 []int64) error {
	nh := len(c.Hosts)
	sp := spread{gauge: remoteGauge, workers: 16,
		counted: func(i, h int) bool { return i%nh != h }, // every endpoint not homed on it
		create: func(ctx context.Context, i int) error {
			tenant, net := netOf(i)
			return c.MasterDo(ctx, "POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: tenant, NetworkName: net,
				EndpointID: fmt.Sprintf("sc%d", i), ConfigEP: model.ConfigEP{Container: fmt.Sprintf("sc%d", i), Host: c.Hosts[i%nh].Name}}, nil)
		}}
	pr, err := propagate(ctx, c, sp, have, n)
	if err != nil {
		return err
	}
	var rssPer []float64
	for h := range c.Hosts {
		rssPer = append(rssPer, float64(pr.rss[h]-rss0[h])/1024/float64(sp.count(n, h))*1000)
	}
	mrss, err := processRSS(c.Master.PID())
	if err != nil {
		return err
	}
	dbBytes, dbErr := etcdDBSize(ctx, c)
	p := "scale." + stepLabel(n) + "."
	rows := pr.report(r, p, n, have)
	r.add(p+"agent_rss_kib_per_1k_remote", round1(median(rssPer)), "KiB")
	r.add(p+"netmaster_rss_mb", round1(float64(mrss)/1e6), "MB")
	if dbErr == nil {
		r.add(p+"etcd_db_mb", round1(float64(dbBytes)/1e6), "MB")
	}
	table(w, fmt.Sprintf("scale: %d endpoints (%d created through /plugin/createEndpoint in %.1fs), %d hosts, %d remote-endpoint events applied in all",
		n, n-have, pr.created.Seconds(), nh, pr.events),
		[]string{"figure", "value"},
		append(rows, [][]string{
			{"agent RSS per 1k remote endpoints (median)", fmt.Sprintf("%.1f KiB", median(rssPer))},
			{"netmaster RSS", fmt.Sprintf("%.1f MB", float64(mrss)/1e6)},
			{"etcd db", fmt.Sprintf("%.1f MB (%v)", float64(dbBytes)/1e6, dbErr)},
		}...))
	return nil
}

// scaleServices creates services have..n-1 through netmaster's REST API (8 concurrent
// callers) in tenants of 100 (svcFills) and measures their propagation: every host
// installs every service (contiv_netplugin_services).
func scaleServices(ctx context.Context, c *sim.Cluster, w io.Writer, r *report, fills *svcFills, have, n int, rss0 []int64) error {
	nh := len(c.Hosts)
	if err := fills.ensureTenants(ctx, n); err != nil {
		return fmt.Errorf("%d services: tenants: %w", n, err)
	}
	sp := spread{gauge: servicesGauge, workers: 8, counted: func(int, int) bool { return true }, create: fills.create}
	pr, err := propagate(ctx, c, sp, have, n)
	if err != nil {
		return fmt.Errorf("%d services: %w", n, err)
	}
	var rssPer []float64
	for h := range c.Hosts {
		rssPer = append(rssPer, float64(pr.rss[h]-rss0[h])/1024/float64(n)*1000)
	}
	p := "scale.svc_" + stepLabel(n) + "."
	rows := pr.report(r, p, n, have)
	r.add(p+"agent_rss_kib_per_1k_services", round1(median(rssPer)), "KiB")
	table(w, fmt.Sprintf("scale: %d services (%d created through REST in %.1fs), %d hosts, %d service events applied in all",
		n, n-have, pr.created.Seconds(), nh, pr.events),
		[]string{"figure", "value"},
		append(rows, []string{"agent RSS per 1k services (median)", fmt.Sprintf("%.1f KiB", median(rssPer))}))
	return nil
}

// scalePolicy: 100 groups of one network, group g with a policy of 10 + 90·g/99 rules
// (10 to 100, 5,500 in all); then 20 times a rule added to one policy, timed until every
// host's datapath holds it. The probe asks each host for the one group's rules
// (/inspect/bpf/policy?group=, decoded from the live maps) every 10 ms.
func scalePolicy(ctx context.Context, c *sim.Cluster, w io.Writer, r *report) error {
	const groups, changes = 100, 20
	rulesOf := func(g int) int { return 10 + 90*g/(groups-1) }
	total := 0
	for g := 0; g < groups; g++ {
		total += rulesOf(g)
	}
	t0 := time.Now()
	err := createConcurrently(ctx, 0, groups, 8, func(ctx context.Context, g int) error {
		pol := fmt.Sprintf("scp%d", g)
		if err := c.CreatePolicy(ctx, "sct0", pol); err != nil {
			return err
		}
		for k := 0; k < rulesOf(g); k++ {
			if err := c.AddRule(ctx, model.Rule{TenantName: "sct0", PolicyName: pol, RuleID: fmt.Sprint(k + 1), Priority: k%100 + 1,
				Direction: "in", Protocol: "tcp", Port: 1000 + k, Action: "deny"}); err != nil {
				return err
			}
		}
		return c.CreateEndpointGroup(ctx, "sct0", "scn0", fmt.Sprintf("scg%d", g), pol)
	})
	if err != nil {
		return err
	}
	setup := time.Since(t0)
	// Every host has every group's last rule before the timed changes start.
	for g := 0; g < groups; g++ {
		if err := policyEverywhere(ctx, c, fmt.Sprintf("scg%d:sct0", g), 1000+rulesOf(g)-1, 5*time.Minute); err != nil {
			return fmt.Errorf("setup of %d rules: %w", total, err)
		}
	}
	var lat, rest []time.Duration
	for i := 0; i < changes; i++ {
		port := 20000 + i
		g := i * (groups / changes)
		t := time.Now()
		if err := c.AddRule(ctx, model.Rule{TenantName: "sct0", PolicyName: fmt.Sprintf("scp%d", g), RuleID: fmt.Sprintf("x%d", i), Priority: 50,
			Direction: "in", Protocol: "tcp", Port: port, Action: "allow"}); err != nil {
			return err
		}
		rest = append(rest, time.Since(t))
		if err := policyEverywhere(ctx, c, fmt.Sprintf("scg%d:sct0", g), port, 30*time.Second); err != nil {
			return err
		}
		lat = append(lat, time.Since(t))
	}
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	r.add("scale.policy_rules", float64(total), "rules")
	r.add("scale.policy_p50_ms", msOf(p50), "ms")
	r.add("scale.policy_p99_ms", msOf(p99), "ms")
	r.add("scale.policy_rest_p50_ms", msOf(percentile(rest, 50)), "ms")
	fmt.Fprintf(w, "policy: %d groups × 10-100 rules (%d, set up through REST in %.1fs); %d rule additions → in every host's datapath: p50 %.1f ms, p99 (max of %d) %.1f ms (the REST call alone: p50 %.1f ms)\n",
		groups, total, setup.Seconds(), changes, msOf(p50), changes, msOf(p99), msOf(percentile(rest, 50)))
	return nil
}

// policyEverywhere waits until every host's datapath holds a rule on port for group
// (its key, "<group>:<tenant>").
func policyEverywhere(ctx context.Context, c *sim.Cluster, group string, port int, d time.Duration) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Hosts))
	for hi, h := range c.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(d)
			for {
				var l dataplane.Listing
				err := h.InspectGet(ctx, "/inspect/bpf/policy?group="+group, &l)
				if err == nil && policyHasPort(l, port) {
					return
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					errs[hi] = fmt.Errorf("%s: rule of %s for port %d not in the datapath after %v (last listing error: %v)", h.Name, group, port, d, err)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// policyHasPort says whether a decoded policy listing holds a rule on port.
func policyHasPort(l dataplane.Listing, port int) bool {
	col := slices.Index(l.Columns, "PORT")
	want := strconv.Itoa(port)
	for _, row := range l.Rows {
		if col >= 0 && col < len(row) && row[col] == want {
			return true
		}
	}
	return false
}

var remoteGauge = regexp.MustCompile(`(?m)^contiv_netplugin_endpoints\{kind="remote"\} (\S+)$`)

// profileAgent starts a 20 s CPU profile of h's agent (netplugin --pprof) and returns a
// function that waits for it and writes it to file.
func profileAgent(ctx context.Context, h *sim.Host, file string, w io.Writer) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		prof, err := h.InspectText(ctx, "/debug/pprof/profile?seconds=20")
		if err == nil {
			err = os.WriteFile(file, []byte(prof), 0o644)
		}
		if err != nil {
			fmt.Fprintf(w, "cpu profile of %s: %v\n", h.Name, err)
			return
		}
		fmt.Fprintf(w, "cpu profile of %s's agent (20 s of the last step) written to %s\n", h.Name, file)
	}()
	return func() { <-done }
}

// processRSS is the resident set of pid in bytes.
func processRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

var etcdDBGauge = regexp.MustCompile(`(?m)^etcd_mvcc_db_total_size_in_bytes (\S+)$`)

// etcdDBSize reads the embedded etcd's database size from its /metrics.
func etcdDBSize(ctx context.Context, c *sim.Cluster) (int64, error) {
	txt, err := c.EtcdMetrics(ctx)
	if err != nil {
		return 0, err
	}
	m := etcdDBGauge.FindStringSubmatch(txt)
	if m == nil {
		return 0, fmt.Errorf("etcd /metrics: no etcd_mvcc_db_total_size_in_bytes")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return int64(v), err
}
