package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/cniplugin"
	"github.com/contivbpf/contivbpf/tools/sim"
)

const (
	benchNet    = "bench-net"
	benchSubnet = "10.120.0.0/24"
	benchGW     = "10.120.0.1"
	echoPort    = 7070
	iperfPort   = 5201
)

// dpRun is one dataplane's simulated cluster with three containers: a and b on host 1,
// c on host 2, all on one VXLAN network. The policy stages add pa (host 1) in a client
// group and pb (host 1), pc (host 2) in a server group, both groups with policies
// (policy.go).
type dpRun struct {
	dp         string
	cfg        config
	w          io.Writer
	r          *report
	c          *sim.Cluster
	a, b, x    *sim.Container
	pa, pb, pc *sim.Container
	policyErr  error              // policy setup failed (not retried)
	ratios     map[string]float64 // "<stage>.<figure>" of this run, for the policy stages' comparison rows
}

// runDataplane starts the cluster for dp and runs every dataplane stage on it; each stage
// reports its own errors and the next one still runs.
func runDataplane(ctx context.Context, cfg config, dp string, w io.Writer, r *report) {
	fmt.Fprintf(w, "\n#### dataplane %s: starting 2 simulated hosts (netmaster, netplugin --dataplane=%s)\n", dp, dp)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.verbose {
		quiet = slog.Default()
	}
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + dp[:1], Hosts: 2, BinDir: cfg.bin, Dataplane: dp, Logger: quiet})
	if err != nil {
		r.fail(dp+".cluster", err)
		return
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the %s cluster: %v\n", dp, err)
		}
	}()
	d := &dpRun{dp: dp, cfg: cfg, w: w, r: r, c: c, ratios: map[string]float64{}}
	if err := d.setup(ctx); err != nil {
		r.fail(dp+".setup", err)
		return
	}
	stages := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"samehost", d.sameHost},
		{"samehost_policy", d.sameHostPolicy},
		{"samehost_monitor", d.sameHostMonitor},
		{"crosshost", d.crossHost},
		{"crosshost_policy", d.crossHostPolicy},
		{"restart", d.restart},
		{"cni", d.cni},
		{"operate", d.operate},
	}
	for _, s := range stages {
		if !cfg.want(s.name) {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err := s.fn(sctx)
		cancel()
		if err != nil {
			r.fail(dp+"."+s.name, err)
		}
		fmt.Fprintf(w, "(%s.%s took %.1fs)\n", dp, s.name, time.Since(start).Seconds())
	}
}

func (d *dpRun) setup(ctx context.Context) error {
	if err := d.c.CreateNetwork(ctx, "default", benchNet, "vxlan", benchSubnet, benchGW); err != nil {
		return err
	}
	var err error
	h1, h2 := d.c.Hosts[0], d.c.Hosts[1]
	if d.a, err = d.c.AddContainer(ctx, h1, "a", "default", benchNet); err != nil {
		return err
	}
	if d.b, err = d.c.AddContainer(ctx, h1, "b", "default", benchNet); err != nil {
		return err
	}
	if d.x, err = d.c.AddContainer(ctx, h2, "c", "default", benchNet); err != nil {
		return err
	}
	// Wait until both paths carry traffic (remote endpoints reach host 1 through etcd).
	for _, dst := range []*sim.Container{d.b, d.x} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			out, err := d.a.Exec(ctx, "ping", "-c", "1", "-W", "1", dst.IP.Addr().String())
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s cannot reach %s: %v: %s", d.a.Name, dst.Name, err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// ipMTU reads eth0's MTU inside a namespace.
func ipMTU(ctx context.Context, ns string) (int, error) {
	out, err := sim.Exec(ctx, ns, "ip", "-o", "link", "show", "eth0")
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`mtu (\d+)`).FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no mtu in %q", out)
	}
	return strconv.Atoi(m[1])
}

// path is one side of an A/B comparison: a client namespace and a server address.
type path struct {
	label    string
	clientNS string
	serverNS string
	serverIP string
	srv      *netbench.Server
	conn     net.Conn
	tput     []float64
	crr      []float64
	rr       []time.Duration
}

func (p *path) addr() string { return fmt.Sprintf("%s:%d", p.serverIP, echoPort) }

func (p *path) start() error {
	srv, err := netbench.StartServer(netbench.NSPath(p.serverNS), p.addr())
	if err != nil {
		return err
	}
	p.srv = srv
	c, err := netbench.NewDialer(netbench.NSPath(p.clientNS)).Dial(p.addr())
	if err != nil {
		return fmt.Errorf("%s: dial %s: %w", p.label, p.addr(), err)
	}
	p.conn = c
	return nil
}

func (p *path) close() {
	if p.conn != nil {
		p.conn.Close()
	}
	if p.srv != nil {
		p.srv.Close()
	}
}

// compare alternates base and test: rounds of throughput (iperf3), new-connection rate
// and request/response latency, so that the machine's noise hits both alike.
func (d *dpRun) compare(ctx context.Context, base, test *path, doCRR bool) error {
	for _, p := range []*path{base, test} {
		if err := p.start(); err != nil {
			return err
		}
		defer p.close()
	}
	both := []*path{base, test}
	for i := 0; i < d.cfg.tputRounds; i++ {
		for _, p := range both {
			g, err := netbench.Iperf3(ctx, p.serverNS, p.clientNS, p.serverIP, iperfPort, d.cfg.tputSeconds)
			if err != nil {
				return fmt.Errorf("%s iperf3: %w", p.label, err)
			}
			p.tput = append(p.tput, g)
		}
		// Alternate which path goes first, so neither always runs on a warm/cold machine.
		both[0], both[1] = both[1], both[0]
	}
	if doCRR {
		for i := 0; i < d.cfg.crrRounds; i++ {
			for _, p := range both {
				rate, err := netbench.CRR(ctx, netbench.NewDialer(netbench.NSPath(p.clientNS)), p.addr(), d.cfg.crrTime)
				if err != nil {
					return fmt.Errorf("%s crr: %w", p.label, err)
				}
				p.crr = append(p.crr, rate)
			}
			both[0], both[1] = both[1], both[0]
		}
	}
	for i := 0; i < d.cfg.rrRounds; i++ {
		for _, p := range both {
			s, err := netbench.RR(p.conn, d.cfg.rrPerRound, 64)
			if err != nil {
				return fmt.Errorf("%s rr: %w", p.label, err)
			}
			p.rr = append(p.rr, s...)
		}
		both[0], both[1] = both[1], both[0]
	}
	return nil
}

// pairedRatio is the median over rounds of test/base, each pair measured back to back, so
// that a slow moment of the machine affects both sides of one pair.
func pairedRatio(base, test []float64) float64 {
	var r []float64
	for i := range base {
		if i < len(test) && base[i] > 0 {
			r = append(r, test[i]/base[i])
		}
	}
	return float64(int64(median(r)*1000+0.5)) / 1000
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func us(d time.Duration) float64 { return round1(float64(d.Nanoseconds()) / 1000) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return float64(int64(a/b*1000+0.5)) / 1000
}

func fmtList(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, " ")
}

// sameHost compares container a -> b on host 1 with a direct veth pair at the same MTU.
func (d *dpRun) sameHost(ctx context.Context) error {
	return d.sameHostOf(ctx, "samehost", d.a, d.b, "", nil)
}

// sameHostOf runs the same-host comparison for cli -> srv and reports it as stage; what
// is appended to the table title, extra rows are appended to the table.
func (d *dpRun) sameHostOf(ctx context.Context, stage string, cli, srv *sim.Container, what string, extra func(tput, crr float64) [][]string) error {
	mtu, err := ipMTU(ctx, cli.Name)
	if err != nil {
		return fmt.Errorf("read container mtu: %w", err)
	}
	topo, err := netbench.VethPair(d.c.Prefix+"v", mtu)
	if err != nil {
		return err
	}
	defer topo.Close()
	base := &path{label: "veth pair", clientNS: topo.Namespaces[0], serverNS: topo.Namespaces[1], serverIP: "10.199.0.2"}
	test := &path{label: d.dp + " " + stage, clientNS: cli.Name, serverNS: srv.Name, serverIP: srv.IP.Addr().String()}
	if err := d.compare(ctx, base, test, true); err != nil {
		return err
	}
	d.reportPair(stage, "veth", "veth pair", fmt.Sprintf("%s same host%s: container %s -> %s vs a direct veth pair (MTU %d), %d/%d/%d alternating rounds",
		d.dp, what, shortName(cli), shortName(srv), mtu, d.cfg.tputRounds, d.cfg.crrRounds, d.cfg.rrRounds), base, test, extra)
	return nil
}

// reportPair reports a compare() of base against test as stage: a table titled title
// (base's column baseCol) and the figures <dp>.<stage>.{tput,crr,rr_*} with the
// baseline's as <baseName>_*, and the paired ratios. The connection-rate row and figures
// are left out when compare ran without CRR.
func (d *dpRun) reportPair(stage, baseName, baseCol, title string, base, test *path, extra func(tput, crr float64) [][]string) {
	p := d.dp + "." + stage + "."
	withCRR := len(base.crr) > 0
	bt, tt := median(base.tput), median(test.tput)
	bc, tc := median(base.crr), median(test.crr)
	tr, cr := pairedRatio(base.tput, test.tput), pairedRatio(base.crr, test.crr)
	b50, t50 := netbench.Percentile(base.rr, 50), netbench.Percentile(test.rr, 50)
	b99, t99 := netbench.Percentile(base.rr, 99), netbench.Percentile(test.rr, 99)
	rows := [][]string{
		{"TCP throughput Gbit/s (iperf3, median)", fmt.Sprintf("%.2f", bt), fmt.Sprintf("%.2f", tt), fmt.Sprintf("%.3f", tr), baseName + " " + fmtList(base.tput) + " | " + d.dp + " " + fmtList(test.tput)},
	}
	if withCRR {
		rows = append(rows, []string{"new connections/s (CRR, median)", fmt.Sprintf("%.0f", bc), fmt.Sprintf("%.0f", tc), fmt.Sprintf("%.3f", cr), baseName + " " + fmtList(base.crr) + " | " + d.dp + " " + fmtList(test.crr)})
	}
	rows = append(rows,
		[]string{"RR latency p50 us", fmt.Sprintf("%.1f", us(b50)), fmt.Sprintf("%.1f", us(t50)), fmt.Sprintf("%.3f", ratio(us(t50), us(b50))), fmt.Sprintf("%d samples each", len(test.rr))},
		[]string{"RR latency p99 us", fmt.Sprintf("%.1f", us(b99)), fmt.Sprintf("%.1f", us(t99)), fmt.Sprintf("%.3f", ratio(us(t99), us(b99))), ""},
	)
	d.ratios[stage+".tput_ratio"] = tr
	if withCRR {
		d.ratios[stage+".crr_ratio"] = cr
	}
	if extra != nil {
		rows = append(rows, extra(tr, cr)...)
	}
	table(d.w, title, []string{"figure", baseCol, d.dp, "ratio", "rounds"}, rows)
	d.r.add(p+baseName+"_tput", round2(bt), "Gbit/s")
	d.r.add(p+"tput", round2(tt), "Gbit/s")
	d.r.add(p+"tput_ratio", tr, "ratio")
	if withCRR {
		d.r.add(p+baseName+"_crr", float64(int64(bc)), "conn/s")
		d.r.add(p+"crr", float64(int64(tc)), "conn/s")
		d.r.add(p+"crr_ratio", cr, "ratio")
	}
	d.r.add(p+baseName+"_rr_p50", us(b50), "us")
	d.r.add(p+"rr_p50", us(t50), "us")
	d.r.add(p+"rr_p50_ratio", ratio(us(t50), us(b50)), "ratio")
	d.r.add(p+baseName+"_rr_p99", us(b99), "us")
	d.r.add(p+"rr_p99", us(t99), "us")
	d.r.add(p+"rr_p99_ratio", ratio(us(t99), us(b99)), "ratio")
}

func round1(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// crossHost compares container a (host 1) -> c (host 2) with a Linux bridge + kernel
// VXLAN path between two simulated hosts of the same kind (netbench.BridgeVXLAN).
func (d *dpRun) crossHost(ctx context.Context) error {
	return d.crossHostOf(ctx, "crosshost", d.a, d.x, "", nil)
}

// crossHostOf runs the cross-host comparison for cli -> srv and reports it as stage.
func (d *dpRun) crossHostOf(ctx context.Context, stage string, cli, srv *sim.Container, what string, extra func(tput float64) [][]string) error {
	topo, err := netbench.BridgeVXLAN(d.c.Prefix + "x")
	if err != nil {
		return err
	}
	defer topo.Close()
	// Namespaces: h1, h2, c1, c2; c2 is 10.197.0.2.
	base := &path{label: "bridge+vxlan", clientNS: topo.Namespaces[2], serverNS: topo.Namespaces[3], serverIP: "10.197.0.2"}
	test := &path{label: d.dp + " " + stage, clientNS: cli.Name, serverNS: srv.Name, serverIP: srv.IP.Addr().String()}
	// Warm the baseline's ARP/FDB so the first round does not pay for learning.
	if _, err := netbench.Run(base.clientNS, "ping", "-c", "1", "-W", "2", base.serverIP); err != nil {
		return fmt.Errorf("bridge+vxlan baseline not connected: %w", err)
	}
	if err := d.compare(ctx, base, test, false); err != nil {
		return err
	}
	var extra2 func(tput, crr float64) [][]string
	if extra != nil {
		extra2 = func(tput, _ float64) [][]string { return extra(tput) }
	}
	d.reportPair(stage, "bridge", "bridge+vxlan", fmt.Sprintf("%s cross host (VXLAN)%s: container %s -> %s vs Linux bridge + kernel vxlan, %d/%d alternating rounds",
		d.dp, what, shortName(cli), shortName(srv), d.cfg.tputRounds, d.cfg.rrRounds), base, test, extra2)
	return nil
}

// cni measures CNI ADD latency through libcni and the contivk8s binary on host 1.
func (d *dpRun) cni(ctx context.Context) error {
	res, err := cniplugin.BenchAdd(ctx, cniplugin.BenchConfig{
		BinDir: d.cfg.bin, Socket: d.c.Hosts[0].CNISocket, Network: benchNet, Pods: d.cfg.pods,
		NSPrefix: d.c.Prefix + "p",
	})
	if err != nil {
		return err
	}
	ms := func(t time.Duration) float64 { return round1(float64(t.Microseconds()) / 1000) }
	table(d.w, fmt.Sprintf("%s CNI ADD via libcni + contivk8s, %d pods on one host", d.dp, res.Pods),
		[]string{"p50 ms", "p99 ms", "max ms", "all attached s", "all deleted s"},
		[][]string{{fmt.Sprintf("%.1f", ms(res.P50)), fmt.Sprintf("%.1f", ms(res.P99)), fmt.Sprintf("%.1f", ms(res.Max)),
			fmt.Sprintf("%.2f", res.Total.Seconds()), fmt.Sprintf("%.2f", res.DelTotal.Seconds())}})
	p := d.dp + ".cni."
	d.r.add(p+"add_p50", ms(res.P50), "ms")
	d.r.add(p+"add_p99", ms(res.P99), "ms")
	d.r.add(p+"attach_"+strconv.Itoa(res.Pods), round2(res.Total.Seconds()), "s")
	d.r.add(p+"delete_"+strconv.Itoa(res.Pods), round2(res.DelTotal.Seconds()), "s")
	return nil
}

// shortName is the container's name without its host prefix ("a", "pb").
func shortName(ct *sim.Container) string { return strings.TrimPrefix(ct.Name, ct.Host.Name+"-") }
