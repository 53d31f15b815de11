package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// daemon is a process this stage started (etcd, a netmaster), inside the stage's namespace.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startDaemon(ns, name, logPath string, argv ...string) (*daemon, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + sim.NetNSPath(ns), "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); lf.Close(); close(d.done) }()
	return d, nil
}

// stop ends the daemon: SIGTERM, then SIGKILL after 5 s.
func (d *daemon) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

func (d *daemon) tail() string {
	b, _ := os.ReadFile(d.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// cpStage runs an external etcd (Debian etcd-server) and two netmasters on it inside a
// namespace of its own, measures REST create/list and allocAddress throughput through one
// and through both netmasters (internal/testkit/cpbench; the follower proxies to the leader), then
// SIGKILLs the leader and times until a write through the survivor succeeds.
func cpStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	ns := cfg.prefix + "m"
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", ns, err, out)
	}
	defer func() { _ = exec.Command("ip", "netns", "del", ns).Run() }()
	if _, err := sim.Exec(ctx, ns, "ip", "link", "set", "lo", "up"); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", ns+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var daemons []*daemon
	defer func() {
		for i := len(daemons) - 1; i >= 0; i-- {
			daemons[i].stop()
		}
	}()
	etcd, err := startDaemon(ns, "etcd", filepath.Join(dir, "etcd.log"), "etcd", "--name", "cbk",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "cbk=http://127.0.0.1:2380")
	if err != nil {
		return err
	}
	daemons = append(daemons, etcd)
	urls := []string{"http://127.0.0.1:9991", "http://127.0.0.1:9992"}
	var masters []*daemon
	for i, u := range urls {
		addr := strings.TrimPrefix(u, "http://")
		m, err := startDaemon(ns, fmt.Sprintf("netmaster%d", i+1), filepath.Join(dir, fmt.Sprintf("netmaster%d.log", i+1)),
			filepath.Join(cfg.bin, "netmaster"), "--etcd-endpoints", "http://127.0.0.1:2379",
			"--listen-url", addr, "--control-url", addr, "--rpc-port", "0", "--mode", "kubernetes", "--log-level", "warn", "--insecure")
		if err != nil {
			return err
		}
		daemons = append(daemons, m)
		masters = append(masters, m)
		// The first one wins the election, so "1 netmaster" is the leader; the second follows.
		want := "leader"
		if i > 0 {
			want = "follower"
		}
		if err := waitState(ctx, nsHTTPClient(ns), u, want, 20*time.Second); err != nil {
			return fmt.Errorf("%w (netmaster%d: %s; etcd: %s)", err, i+1, m.tail(), etcd.tail())
		}
	}
	client := nsHTTPClient(ns)
	// Both must answer before measuring (the follower proxies once it knows the leader).
	if _, err := cpbench.Run(ctx, cpbench.Options{NetmasterURLs: urls, Creates: 2, Lists: 2, Allocs: 2, Client: client}); err != nil {
		return fmt.Errorf("warm-up through both netmasters: %w (netmaster2: %s)", err, masters[1].tail())
	}
	var rows [][]string
	for _, n := range []int{1, 2} {
		res, err := cpbench.Run(ctx, cpbench.Options{NetmasterURLs: urls[:n], Creates: cfg.cpCreates, Lists: cfg.cpCreates, Allocs: cfg.cpAllocs, Client: client})
		if err != nil {
			r.fail(fmt.Sprintf("cp.%dnm", n), err)
			continue
		}
		for _, x := range []struct {
			op   string
			what string
			o    cpbench.Op
		}{{"create", "POST network", res.Create}, {"list", "GET networks", res.List}, {"alloc", "allocAddress", res.Alloc}} {
			rows = append(rows, []string{fmt.Sprint(n), x.what, fmt.Sprintf("%d/%d", x.o.Count, x.o.Errors), fmt.Sprintf("%.0f", x.o.PerSecond),
				fmt.Sprintf("%.1f", float64(x.o.P50.Microseconds())/1000), fmt.Sprintf("%.1f", float64(x.o.P99.Microseconds())/1000)})
			r.add(fmt.Sprintf("cp.%dnm.%s_per_s", n, x.op), float64(int64(x.o.PerSecond+0.5)), "ops/s")
			if x.o.Errors > 0 {
				r.add(fmt.Sprintf("cp.%dnm.%s_errors", n, x.op), float64(x.o.Errors), "count")
			}
		}
		r.add(fmt.Sprintf("cp.%dnm.alloc_duplicates", n), float64(res.Duplicates), "count")
	}
	table(w, "control plane: external etcd 3.4 + netmasters (round-robin over the listed netmasters; the follower proxies)",
		[]string{"netmasters", "request", "ok/errors", "per s", "p50 ms", "p99 ms"}, rows)

	// Failover: SIGKILL the leader, time until a write through the survivor succeeds.
	t0 := time.Now()
	masters[0].kill()
	deadline := t0.Add(30 * time.Second)
	for i := 0; ; i++ {
		body, _ := json.Marshal(map[string]any{"tenantName": "default", "networkName": fmt.Sprintf("fo%d", i), "encap": "vxlan",
			"subnet": fmt.Sprintf("10.250.%d.0/24", i%250)})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[1]+fmt.Sprintf("/api/v1/networks/default:fo%d/", i), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no write succeeded through netmaster2 within 30 s after killing the leader (%s)", masters[1].tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	fo := time.Since(t0).Seconds()
	table(w, "control plane failover", []string{"event", "seconds"}, [][]string{{"SIGKILL leader -> first successful create through the other netmaster (--leader-ttl 4s)", fmt.Sprintf("%.2f", fo)}})
	r.add("cp.failover_s", round2(fo), "s")
	if err := cpTLSStage(ctx, cfg, ns, dir, w, r); err != nil {
		r.fail("cp.tls", err)
	}
	if err := cpSlowConnsStage(ctx, cfg, ns, dir, w, r); err != nil {
		r.fail("cp.slow20k", err)
	}
	if err := cpAllocBytesStage(ctx, cfg, w, r); err != nil {
		r.fail("cp.alloc_bytes", err)
	}
	if err := cpTenantFillStage(ctx, cfg, w, r); err != nil {
		r.fail("cp.tenant_fill", err)
	}
	// (The survivor of the failover leads now.)
	if err := cpNetworksStage(ctx, client, urls[1], w, r); err != nil {
		r.fail("cp.create_10k_networks", err)
	}
	return nil
}

func nsHTTPClient(ns string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return sim.DialContext(ctx, ns, network, addr)
		},
	}}
}

// waitState polls GET /info until the netmaster at url reports state want.
func waitState(ctx context.Context, c *http.Client, url, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/info", nil)
		resp, err := c.Do(req)
		if err == nil {
			var info struct {
				State string `json:"current-state"`
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if json.Unmarshal(b, &info) == nil && info.State == want {
				return nil
			}
			last = string(b)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("netmaster %s not %s after %s: %s", url, want, timeout, last)
}
