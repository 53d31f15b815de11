package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/dockertest"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// dockerStage measures Docker endpoint creation on one simulated host: netplugin in
// --mode docker beside a private dockerd; `docker run -d --net bench-net` (sandbox +
// CreateEndpoint + Join through the remote driver) alternated with `docker run -d --net
// none` (the same without an endpoint). The endpoint's cost is the difference of medians.
func dockerStage(ctx context.Context, cfg config, dp string, w io.Writer, r *report) (err error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	prefix := cfg.prefix + "d"
	base := filepath.Join(os.TempDir(), prefix)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(base)
	dockerDir := func(h *sim.Host) string { return filepath.Join(base, h.Name) }
	c, err := sim.Start(ctx, sim.Config{
		Prefix: prefix, Hosts: 1, BinDir: cfg.bin, Dataplane: dp, Logger: quiet,
		PluginArgs: func(_ *sim.Cluster, h *sim.Host) []string {
			d := dockerDir(h)
			return []string{"--mode", "docker", "--docker-plugin-dir", filepath.Join(d, "plugins"), "--docker-host", "unix://" + filepath.Join(d, "docker.sock")}
		},
		ReadySocket: func(h *sim.Host) string { return filepath.Join(dockerDir(h), "plugins", "netplugin.sock") },
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil {
			fmt.Fprintf(w, "cleanup of the docker cluster: %v\n", cerr)
		}
	}()
	h := c.Hosts[0]
	d, err := dockertest.Start(ctx, dockertest.Options{Dir: dockerDir(h), NetNS: h.Name})
	if err != nil {
		return err
	}
	var names []string
	defer func() {
		if len(names) > 0 {
			_, _ = d.Docker(context.WithoutCancel(ctx), append([]string{"rm", "-f"}, names...)...)
		}
		if serr := d.Stop(); serr != nil {
			fmt.Fprintf(w, "stop dockerd: %v\n", serr)
		}
	}()
	if err := d.ImportBusybox(ctx); err != nil {
		return err
	}
	if err := c.CreateNetwork(ctx, "default", benchNet, "vxlan", benchSubnet, benchGW); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := d.Docker(ctx, "network", "ls", "--format", "{{.Name}} {{.Driver}}")
		if err == nil && strings.Contains(out, benchNet+" netplugin") {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("network %s never appeared in docker network ls: %v\n%s", benchNet, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var withNet, none []float64
	for i := 0; i < cfg.dockerRuns; i++ {
		for _, net := range []string{benchNet, "none"} {
			name := fmt.Sprintf("b%d-%s", i, strings.ReplaceAll(net, "-", ""))
			t0 := time.Now()
			if out, err := d.Docker(ctx, "run", "-d", "--name", name, "--net", net, dockertest.BusyboxImage, "sleep", "3600"); err != nil {
				return fmt.Errorf("docker run --net %s: %w: %s", net, err, out)
			}
			ms := float64(time.Since(t0).Microseconds()) / 1000
			names = append(names, name)
			if net == "none" {
				none = append(none, ms)
			} else {
				withNet = append(withNet, ms)
			}
		}
	}
	sort.Float64s(withNet)
	sort.Float64s(none)
	p := func(v []float64, q float64) float64 { return v[int(float64(len(v)-1)*q)] }
	ep := p(withNet, 0.5) - p(none, 0.5)
	table(w, fmt.Sprintf("%s Docker: docker run -d, %d runs each, alternating", dp, cfg.dockerRuns),
		[]string{"figure", "--net " + benchNet, "--net none", "endpoint (difference)"},
		[][]string{
			{"p50 ms", fmt.Sprintf("%.1f", p(withNet, 0.5)), fmt.Sprintf("%.1f", p(none, 0.5)), fmt.Sprintf("%.1f", ep)},
			{"max ms", fmt.Sprintf("%.1f", p(withNet, 1)), fmt.Sprintf("%.1f", p(none, 1)), ""},
		})
	pre := dp + ".docker."
	r.add(pre+"run_p50", round1(p(withNet, 0.5)), "ms")
	r.add(pre+"run_none_p50", round1(p(none, 0.5)), "ms")
	r.add(pre+"endpoint_create_p50", round1(ep), "ms")
	return nil
}
