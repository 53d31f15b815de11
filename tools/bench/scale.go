package main

import (
	"context"
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
	fmt.Fprintf(w, "\n#### scale (ebpf): %d hosts, endpoints %v\n", nh, cfg.scaleSteps)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t0 := time.Now()
	sc := sim.Config{Prefix: cfg.prefix + "s", Hosts: nh, BinDir: cfg.bin, Dataplane: "ebpf", Logger: quiet}
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
		err := scaleEndpoints(ctx, c, cfg, w, r, have, n, netOf, rss0)
		if stopProf != nil {
			stopProf()
		}
		if err != nil {
			r.fail(fmt.Sprintf("scale.%s", stepLabel(n)), err)
			return nil // later steps build on this one
		}
		have = n
	}
	if err := scalePolicy(ctx, c, w, r); err != nil {
		r.fail("scale.policy", err)
	}
	return nil
}

// scaleEndpoints creates endpoints have..n-1 and measures their propagation.
func scaleEndpoints(ctx context.Context, c *sim.Cluster, cfg config, w io.Writer, r *report, have, n int,
	netOf func(int) (string, string), rss0 []int64) error {
	nh := len(c.Hosts)
	label := stepLabel(n)
	// What each host should end up with: every endpoint not homed on it.
	want := make([]int, nh)
	for i := 0; i < n; i++ {
		for h := range want {
			if i%nh != h {
				want[h]++
			}
		}
	}
	cpu0 := make([]time.Duration, nh)
	for i, h := range c.Hosts {
		var err error
		if cpu0[i], err = processCPU(h.Plugin.PID()); err != nil {
			return err
		}
	}
	// Watchers: each host's remote count over time.
	type sample struct {
		at    time.Time
		count int
	}
	samples := make([][]sample, nh)
	done := make([]time.Time, nh)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var wg sync.WaitGroup
	for i, h := range c.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				if v := metricValue(wctx, h, remoteGauge); v >= 0 {
					now := time.Now()
					samples[i] = append(samples[i], sample{now, int(v)})
					if int(v) >= want[i] {
						done[i] = now
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
	// The creates: 16 concurrent callers, each create's return time kept.
	returned := make([]time.Time, n-have)
	lat := make([]time.Duration, n-have)
	start := time.Now()
	err := createConcurrently(ctx, have, n, 16, func(ctx context.Context, i int) error {
		tenant, net := netOf(i)
		host := c.Hosts[i%nh].Name
		t := time.Now()
		err := c.MasterDo(ctx, "POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: tenant, NetworkName: net,
			EndpointID: fmt.Sprintf("sc%d", i), ConfigEP: model.ConfigEP{Container: fmt.Sprintf("sc%d", i), Host: host}}, nil)
		lat[i-have] = time.Since(t)
		returned[i-have] = time.Now()
		return err
	})
	if err != nil {
		return err
	}
	created := time.Since(start)
	lastCall := time.Now()
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Minute):
		stopWatch()
		<-waitDone
	case <-ctx.Done():
		return ctx.Err()
	}
	for i, d := range done {
		if d.IsZero() {
			last := -1
			if len(samples[i]) > 0 {
				last = samples[i][len(samples[i])-1].count
			}
			return fmt.Errorf("%s has %d of %d remote endpoints after 5 minutes", c.Hosts[i].Name, last, want[i])
		}
	}
	var converge time.Duration
	for _, d := range done {
		converge = max(converge, d.Sub(lastCall))
	}
	// The k-th endpoint (in return order) counts as applied on a host when the host's
	// count passed its k-th new endpoint: lag = that time - the create's return.
	slices.SortFunc(returned, func(a, b time.Time) int { return a.Compare(b) })
	var lags []time.Duration
	for h := 0; h < nh; h++ {
		base := 0
		if len(samples[h]) > 0 {
			// the count before this step: the host's target for `have` endpoints
			for i := 0; i < have; i++ {
				if i%nh != h {
					base++
				}
			}
		}
		j := 0
		for k := range returned {
			// the k-th endpoint of the step that is remote for this host
			if (have+k)%nh == h {
				continue
			}
			j++
			for _, s := range samples[h] {
				if s.count >= base+j {
					lags = append(lags, max(0, s.at.Sub(returned[k])))
					break
				}
			}
		}
	}
	var cpuMs, rssPer []float64
	events := 0
	for i, h := range c.Hosts {
		cpu1, err := processCPU(h.Plugin.PID())
		if err != nil {
			return err
		}
		rss1, err := processRSS(h.Plugin.PID())
		if err != nil {
			return err
		}
		ev := want[i]
		for k := 0; k < have; k++ {
			if k%nh != i {
				ev--
			}
		}
		events += ev
		cpuMs = append(cpuMs, float64((cpu1-cpu0[i]).Microseconds())/1000/float64(ev)*1000)
		rssPer = append(rssPer, float64(rss1-rss0[i])/1024/float64(want[i])*1000)
	}
	mrss, err := processRSS(c.Master.PID())
	if err != nil {
		return err
	}
	dbBytes, dbErr := etcdDBSize(ctx, c)
	ms := func(d time.Duration) float64 { return round1(float64(d.Microseconds()) / 1000) }
	durs := func(v []time.Duration, p float64) time.Duration {
		s := slices.Clone(v)
		slices.Sort(s)
		if len(s) == 0 {
			return 0
		}
		return s[min(len(s)-1, int(math.Ceil(p/100*float64(len(s))))-1)]
	}
	p := "scale." + label + "."
	r.add(p+"create_per_s", round1(float64(n-have)/created.Seconds()), "ops/s")
	r.add(p+"create_p50_ms", ms(durs(lat, 50)), "ms")
	r.add(p+"create_p99_ms", ms(durs(lat, 99)), "ms")
	r.add(p+"converge_s", round2(converge.Seconds()), "s")
	r.add(p+"lag_p50_ms", ms(durs(lags, 50)), "ms")
	r.add(p+"lag_p99_ms", ms(durs(lags, 99)), "ms")
	r.add(p+"lag_max_ms", ms(durs(lags, 100)), "ms")
	r.add(p+"agent_cpu_ms_per_1k_events", round1(median(cpuMs)), "ms")
	r.add(p+"agent_rss_kib_per_1k_remote", round1(median(rssPer)), "KiB")
	r.add(p+"netmaster_rss_mb", round1(float64(mrss)/1e6), "MB")
	if dbErr == nil {
		r.add(p+"etcd_db_mb", round1(float64(dbBytes)/1e6), "MB")
	}
	table(w, fmt.Sprintf("scale: %d endpoints (%d created through /plugin/createEndpoint in %.1fs), %d hosts, %d remote-endpoint events applied in all",
		n, n-have, created.Seconds(), nh, events),
		[]string{"figure", "value"},
		[][]string{
			{"creates/s", fmt.Sprintf("%.0f", float64(n-have)/created.Seconds())},
			{"create p50 / p99", fmt.Sprintf("%.1f / %.1f ms", ms(durs(lat, 50)), ms(durs(lat, 99)))},
			{"last create → every host has all", fmt.Sprintf("%.2f s", converge.Seconds())},
			{"lag create → host applied p50 / p99 / max", fmt.Sprintf("%.0f / %.0f / %.0f ms", ms(durs(lags, 50)), ms(durs(lags, 99)), ms(durs(lags, 100)))},
			{"agent CPU per 1k events (median of hosts)", fmt.Sprintf("%.1f ms", median(cpuMs))},
			{"agent RSS per 1k remote endpoints (median)", fmt.Sprintf("%.1f KiB", median(rssPer))},
			{"netmaster RSS", fmt.Sprintf("%.1f MB", float64(mrss)/1e6)},
			{"etcd db", fmt.Sprintf("%.1f MB (%v)", float64(dbBytes)/1e6, dbErr)},
		})
	return nil
}

// scalePolicy: 10 groups of one network, each with a policy of 10 rules; then 20 times a
// rule added to one policy, timed until every host's datapath holds it.
func scalePolicy(ctx context.Context, c *sim.Cluster, w io.Writer, r *report) error {
	const groups, rules, changes = 10, 10, 20
	for g := 0; g < groups; g++ {
		pol := fmt.Sprintf("scp%d", g)
		if err := c.CreatePolicy(ctx, "sct0", pol); err != nil {
			return err
		}
		for k := 0; k < rules; k++ {
			if err := c.AddRule(ctx, model.Rule{TenantName: "sct0", PolicyName: pol, RuleID: fmt.Sprint(k + 1), Priority: k + 1,
				Direction: "in", Protocol: "tcp", Port: 1000 + k, Action: "deny"}); err != nil {
				return err
			}
		}
		if err := c.CreateEndpointGroup(ctx, "sct0", "scn0", fmt.Sprintf("scg%d", g), pol); err != nil {
			return err
		}
	}
	var lat, rest []time.Duration
	for i := 0; i < changes; i++ {
		port := 20000 + i
		t := time.Now()
		if err := c.AddRule(ctx, model.Rule{TenantName: "sct0", PolicyName: fmt.Sprintf("scp%d", i%groups), RuleID: fmt.Sprintf("x%d", i), Priority: 50,
			Direction: "in", Protocol: "tcp", Port: port, Action: "allow"}); err != nil {
			return err
		}
		rest = append(rest, time.Since(t))
		var wg sync.WaitGroup
		errs := make([]error, len(c.Hosts))
		for hi, h := range c.Hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				deadline := time.Now().Add(30 * time.Second)
				for {
					var l dataplane.Listing
					if err := h.InspectGet(ctx, "/inspect/bpf/policy", &l); err == nil && policyHasPort(l, port) {
						return
					}
					if time.Now().After(deadline) || ctx.Err() != nil {
						errs[hi] = fmt.Errorf("%s: rule for port %d not in the datapath after 30s", h.Name, port)
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	slices.Sort(rest)
	p50, p99 := lat[len(lat)/2], lat[len(lat)-1]
	ms := func(d time.Duration) float64 { return round1(float64(d.Microseconds()) / 1000) }
	r.add("scale.policy_p50_ms", ms(p50), "ms")
	r.add("scale.policy_p99_ms", ms(p99), "ms")
	r.add("scale.policy_rest_p50_ms", ms(rest[len(rest)/2]), "ms")
	fmt.Fprintf(w, "policy: %d groups × %d rules; %d rule additions → in every host's datapath: p50 %.1f ms, p99 (max of %d) %.1f ms (the REST call alone: p50 %.1f ms)\n",
		groups, rules, changes, ms(p50), changes, ms(p99), ms(rest[len(rest)/2]))
	return nil
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
