// Command bench is `make bench`: it measures contivbpf on the simulator (tools/sim) against
// kernel baselines built in the same run (internal/testkit/netbench), and prints human tables plus one
// machine-readable line per figure, `BENCH <name> <value> <unit>` (names in docs/bench.md).
//
// Stages: eBPF program paths (Program.Benchmark), same-host and cross-host TCP
// throughput/connection rate/latency per dataplane (also with policy on both endpoint
// groups), a netplugin SIGKILL restart under load, CNI ADD latency, and the control
// plane (REST, allocations, failover) through internal/testkit/cpbench. Every stage is independent:
// a failure prints `BENCH_ERROR <name> <reason>` and the next stage runs; the exit status
// is non-zero only if no figure was measured.
// Everything started is removed at the end, also on Ctrl-C.
//
// Build it with -tags cbbench (`make bench` does: `go run -tags cbbench ./tools/bench`):
// the prog stage's fixtures (pkg/dataplane/ebpf/bench_export.go) exist only with that
// tag, and without it that stage fails with BENCH_ERROR while the others run.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// config holds the flags.
type config struct {
	dataplanes  []string
	bin         string
	prefix      string
	stages      map[string]bool
	verbose     bool
	tputRounds  int
	tputSeconds int
	crrRounds   int
	crrTime     time.Duration
	rrRounds    int
	rrPerRound  int
	pods        int
	dockerRuns  int
	cpCreates   int
	cpAllocs    int
	downTime    time.Duration
	svcSteps    []int // services installed at each svcscale step, ascending
	scaleSteps  []int // endpoints in the cluster at each scale step, ascending
	scaleSvcs   []int // services in the scale cluster at each step, ascending
	scaleHosts  int
	scaleProf   string // file for a CPU profile of host 1's agent during the last scale step
	scaleOVS    int    // services on the OVS host of the scale stage (0: skip that part)
	scaleEtcd   int    // external etcd members of the scale cluster (0: netmaster's embedded etcd)
	scaleMax    int    // a last scale step with this many endpoints and services (0: none)
}

func (c config) want(stage string) bool { return len(c.stages) == 0 || c.stages[stage] }

var allStages = []string{"prog", "xdp", "samehost", "samehost_policy", "samehost_monitor", "crosshost", "crosshost_policy", "crosshost_wg", "restart", "cni", "operate", "egress", "bgp", "k8s", "svcscale", "scale", "docker", "netprofile", "cp"}

func main() {
	if len(os.Args) > 1 && os.Args[1] == slowDialerArg {
		os.Exit(slowDialer(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == netbench.WireGuardChildArg {
		os.Exit(netbench.WireGuardChild(os.Args[2:]))
	}
	var cfg config
	dp := flag.String("dataplane", "ebpf", "ebpf | ovs | all (ebpf and ovs side by side)")
	stages := flag.String("stages", "", "comma-separated subset of "+strings.Join(allStages, ","))
	flag.StringVar(&cfg.bin, "bin", "", "directory with netmaster, netplugin, netctl, contivk8s (default <repo>/bin)")
	flag.BoolVar(&cfg.verbose, "v", false, "log the simulator's progress")
	flag.IntVar(&cfg.tputRounds, "tput-rounds", 8, "alternating iperf3 rounds per path")
	flag.IntVar(&cfg.tputSeconds, "tput-seconds", 1, "seconds per iperf3 run")
	flag.IntVar(&cfg.crrRounds, "crr-rounds", 8, "alternating connection-rate rounds per path")
	flag.DurationVar(&cfg.crrTime, "crr-time", 500*time.Millisecond, "duration of one connection-rate round")
	flag.IntVar(&cfg.rrRounds, "rr-rounds", 12, "alternating request/response rounds per path")
	flag.IntVar(&cfg.rrPerRound, "rr-per-round", 1000, "round trips per request/response round")
	flag.IntVar(&cfg.pods, "pods", 100, "pods attached by the CNI stage")
	flag.IntVar(&cfg.dockerRuns, "docker-runs", 8, "docker run pairs (with and without network) in the docker stage")
	flag.IntVar(&cfg.cpCreates, "cp-creates", 200, "networks created (and lists done) per control-plane run")
	flag.IntVar(&cfg.cpAllocs, "cp-allocs", 1000, "allocAddress calls per control-plane run")
	flag.DurationVar(&cfg.downTime, "down", time.Second, "how long netplugin stays dead in the restart stage")
	svcSteps := flag.String("svcscale-steps", "1,1000,10000", "services installed at each svcscale step (ascending; the first is the reference)")
	scaleSteps := flag.String("scale-steps", "1000,10000", "endpoints in the cluster at each scale step (ascending)")
	scaleSvcs := flag.String("scale-services", "1000,10000", "services in the scale cluster at each step (ascending; installed on every host)")
	flag.IntVar(&cfg.scaleHosts, "scale-hosts", 10, "simulated hosts in the scale stage")
	flag.IntVar(&cfg.scaleMax, "scale-max", 0, "add a last scale step with this many endpoints and services (beyond the --scale-steps and --scale-services lists)")
	flag.IntVar(&cfg.scaleEtcd, "scale-etcd-members", 0, "run the scale cluster on an external etcd cluster of this many members (0: netmaster's embedded etcd)")
	flag.IntVar(&cfg.scaleOVS, "scale-ovs-services", 1000, "services installed on the OVS host of the scale stage (0 skips it)")
	flag.StringVar(&cfg.scaleProf, "scale-cpuprofile", "", "write a CPU profile of host 1's agent over the last endpoint step's creates to this file, and over the last service step's to FILE.services (go tool pprof)")
	flag.Parse()
	var err error
	if cfg.svcSteps, err = ascending(*svcSteps, 60000); err != nil {
		fmt.Fprintf(os.Stderr, "bench: --svcscale-steps: %v\n", err)
		os.Exit(2)
	}
	if cfg.scaleSteps, err = ascending(*scaleSteps, 1600000); err != nil {
		fmt.Fprintf(os.Stderr, "bench: --scale-steps: %v\n", err)
		os.Exit(2)
	}
	if cfg.scaleSvcs, err = ascending(*scaleSvcs, 60000); err != nil {
		fmt.Fprintf(os.Stderr, "bench: --scale-services: %v\n", err)
		os.Exit(2)
	}
	if cfg.scaleMax > 0 {
		if cfg.scaleMax <= cfg.scaleSteps[len(cfg.scaleSteps)-1] || cfg.scaleMax <= cfg.scaleSvcs[len(cfg.scaleSvcs)-1] || cfg.scaleMax > 60000 {
			fmt.Fprintf(os.Stderr, "bench: --scale-max %d: want more than the last step of --scale-steps and --scale-services, at most 60000\n", cfg.scaleMax)
			os.Exit(2)
		}
		cfg.scaleSteps = append(cfg.scaleSteps, cfg.scaleMax)
		cfg.scaleSvcs = append(cfg.scaleSvcs, cfg.scaleMax)
	}
	if cfg.scaleHosts < 2 || cfg.scaleHosts > 50 {
		fmt.Fprintf(os.Stderr, "bench: --scale-hosts %d: want 2 to 50\n", cfg.scaleHosts)
		os.Exit(2)
	}
	switch *dp {
	case "ebpf", "ovs":
		cfg.dataplanes = []string{*dp}
	case "all":
		cfg.dataplanes = []string{"ebpf", "ovs"}
	default:
		fmt.Fprintf(os.Stderr, "bench: --dataplane %q: want ebpf, ovs or all\n", *dp)
		os.Exit(2)
	}
	if *stages != "" {
		cfg.stages = map[string]bool{}
		for _, s := range strings.Split(*stages, ",") {
			s = strings.TrimSpace(s)
			ok := false
			for _, a := range allStages {
				ok = ok || a == s
			}
			if !ok {
				fmt.Fprintf(os.Stderr, "bench: --stages: unknown stage %q (have %s)\n", s, strings.Join(allStages, ","))
				os.Exit(2)
			}
			cfg.stages[s] = true
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// ascending parses a comma list of counts, each larger than the one before, 1..limit.
func ascending(list string, limit int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > limit || (len(out) > 0 && n <= out[len(out)-1]) {
			return nil, fmt.Errorf("%q: want ascending counts from 1 to %d", list, limit)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, cfg config, w io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, bpffs, BPF_PROG_TEST_RUN)")
	}
	if cfg.bin == "" {
		root, err := sim.RepoRoot()
		if err != nil {
			return err
		}
		cfg.bin = filepath.Join(root, "bin")
	}
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	cfg.prefix = "cbk" + hex.EncodeToString(b) // + one letter per dataplane: 8 bytes at most
	start := time.Now()
	r := newReport(w)
	fmt.Fprintf(w, "contivbpf bench: dataplane(s) %s, %s\n", strings.Join(cfg.dataplanes, "+"), time.Now().UTC().Format(time.RFC3339))

	if cfg.want("prog") {
		if err := progStage(ctx, w, r); err != nil {
			r.fail("prog", err)
		}
	}
	if cfg.want("xdp") {
		if err := xdpStage(ctx, w, r, cfg.prefix+"x"); err != nil {
			r.fail("xdp", err)
		}
	}
	wantCluster := false
	for _, s := range []string{"samehost", "samehost_policy", "samehost_monitor", "crosshost", "crosshost_policy", "restart", "cni", "operate"} {
		wantCluster = wantCluster || cfg.want(s)
	}
	for _, dp := range cfg.dataplanes {
		if !wantCluster || ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		runDataplane(ctx, cfg, dp, w, r)
		fmt.Fprintf(w, "(dataplane %s: %.1fs)\n", dp, time.Since(t0).Seconds())
	}
	for _, dp := range cfg.dataplanes {
		if !cfg.want("egress") || ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		if err := egressStage(sctx, cfg, dp, w, r); err != nil {
			r.fail(dp+".egress", err)
		}
		cancel()
		fmt.Fprintf(w, "(egress on %s: %.1fs)\n", dp, time.Since(t0).Seconds())
	}
	if cfg.want("crosshost_wg") && ctx.Err() == nil && slices.Contains(cfg.dataplanes, "ebpf") {
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		if err := crossHostWGStage(sctx, cfg, w, r); err != nil {
			r.fail("ebpf.crosshost_wg", err)
		}
		cancel()
		fmt.Fprintf(w, "(crosshost_wg: %.1fs)\n", time.Since(t0).Seconds())
	}
	if cfg.want("bgp") && ctx.Err() == nil {
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		if err := bgpStage(sctx, cfg, w, r); err != nil {
			r.fail("ebpf.bgp", err)
		}
		cancel()
		fmt.Fprintf(w, "(bgp: %.1fs)\n", time.Since(t0).Seconds())
	}
	if cfg.want("k8s") && ctx.Err() == nil {
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
		if err := k8sStage(sctx, cfg, w, r); err != nil {
			r.fail("ebpf.k8s", err)
		}
		cancel()
		fmt.Fprintf(w, "(k8s: %.1fs)\n", time.Since(t0).Seconds())
	}
	if cfg.want("scale") && ctx.Err() == nil {
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		if err := scaleStage(sctx, cfg, w, r); err != nil {
			r.fail("scale", err)
		}
		cancel()
		fmt.Fprintf(w, "(scale: %.1fs)\n", time.Since(t0).Seconds())
	}
	if cfg.want("svcscale") && ctx.Err() == nil {
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		if err := svcscaleStage(sctx, cfg, w, r); err != nil {
			r.fail("svcscale", err)
		}
		cancel()
		fmt.Fprintf(w, "(svcscale: %.1fs)\n", time.Since(t0).Seconds())
	}
	for _, dp := range cfg.dataplanes {
		if !cfg.want("docker") || ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		if err := dockerStage(sctx, cfg, dp, w, r); err != nil {
			r.fail(dp+".docker", err)
		}
		cancel()
		fmt.Fprintf(w, "(docker on %s: %.1fs)\n", dp, time.Since(t0).Seconds())
	}
	for _, dp := range cfg.dataplanes {
		if !cfg.want("netprofile") || ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		if err := netprofileStage(sctx, cfg, dp, w, r); err != nil {
			r.fail(dp+".netprofile", err)
		}
		cancel()
		fmt.Fprintf(w, "(netprofile on %s: %.1fs)\n", dp, time.Since(t0).Seconds())
	}
	if cfg.want("cp") && ctx.Err() == nil {
		t0 := time.Now()
		if err := cpStage(ctx, cfg, w, r); err != nil {
			r.fail("cp", err)
		}
		fmt.Fprintf(w, "(control plane: %.1fs)\n", time.Since(t0).Seconds())
	}
	r.summary(w, cfg.dataplanes)
	fmt.Fprintf(w, "\nbench finished in %.1fs with %d figures\n", time.Since(start).Seconds(), r.count())
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if r.count() == 0 {
		return errors.New("no figure was measured")
	}
	return nil
}
