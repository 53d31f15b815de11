// Command demodocker runs the seed walkthrough with Docker on two simulated hosts
// (`make demo-docker`): netctl creates test-net, both hosts' `docker network ls` show it
// with driver netplugin, busybox containers on both hosts ping each other. It cleans up
// everything and exits non-zero on any failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/tools/sim"
)

func main() {
	bin := flag.String("bin", "", "directory with netmaster, netplugin and netctl (default: <repo>/bin)")
	dp := flag.String("dataplane", "ebpf", "netplugin dataplane: ebpf | ovs")
	extra := flag.Bool("extra", false, "also check address release, restarts, docker-created networks and removal")
	workdir := flag.String("workdir", "", "keep netmaster/netplugin logs in this directory")
	bench := flag.Int("bench", 0, "time this many docker run/rm on test-net (0 = off)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demodocker: needs root (network namespaces, dockerd)")
		os.Exit(1)
	}
	if *bin == "" {
		root, err := sim.RepoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "demodocker:", err)
			os.Exit(1)
		}
		*bin = filepath.Join(root, "bin")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := Walkthrough(ctx, Options{BinDir: *bin, Dataplane: *dp, Out: os.Stdout, Extra: *extra, Bench: *bench, WorkDir: *workdir}); err != nil {
		fmt.Fprintln(os.Stderr, "demodocker: FAILED:", err)
		os.Exit(1)
	}
}
