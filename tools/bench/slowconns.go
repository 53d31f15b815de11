package main

import (
	"bufio"
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/tools/sim"
)

// slowConns is how many stalled connections cpSlowConnsStage holds open, spread over
// slowDialerProcs child processes (each within an open-file limit of 20,000).
const (
	slowConns       = 20000
	slowDialerProcs = 4
)

// slowDialerArg is argv[1] of a child that holds stalled connections (see slowDialer).
const slowDialerArg = "__slow-dialer"

// cpSlowConnsStage measures netmaster's create latency while slowConns connections from
// child processes stall it (a third send nothing, a third stop inside a request header,
// a third inside a request body), beside the same latency without them. netmaster runs on its embedded etcd in netns
// ns with this machine's open-file limit, so past its connection cap (limit - 1,024) it
// sheds the oldest stalled connections. Goal: every create answered within 1 s.
func cpSlowConnsStage(ctx context.Context, cfg config, ns, dir string, w io.Writer, r *report) error {
	const addr = "127.0.0.1:9997"
	d, err := startDaemon(ns, "netmaster-slow", filepath.Join(dir, "netmaster-slow.log"),
		filepath.Join(cfg.bin, "netmaster"),
		"--etcd-data-dir", filepath.Join(dir, "etcd-slow"),
		"--etcd-listen-client-url", "http://127.0.0.1:2397", "--etcd-listen-peer-url", "http://127.0.0.1:2398",
		"--listen-url", addr, "--control-url", addr, "--rpc-port", "0", "--mode", "kubernetes", "--log-level", "warn", "--insecure")
	if err != nil {
		return err
	}
	defer d.stop()
	client := nsHTTPClient(ns)
	url := "http://" + addr
	if err := waitState(ctx, client, url, "leader", 30*time.Second); err != nil {
		return fmt.Errorf("%w (%s)", err, d.tail())
	}
	seq := 0
	creates := func(n int) ([]time.Duration, error) {
		var lat []time.Duration
		for i := 0; i < n; i++ {
			seq++
			name := fmt.Sprintf("slow%d", seq)
			body, _ := json.Marshal(map[string]any{"tenantName": "default", "networkName": name, "encap": "vxlan",
				"subnet": fmt.Sprintf("10.%d.%d.0/24", 200+seq/256, seq%256)})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/v1/networks/default:"+name+"/", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				return lat, fmt.Errorf("create %s: %w", name, err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return lat, fmt.Errorf("create %s: %d %s", name, resp.StatusCode, out)
			}
			lat = append(lat, time.Since(t0))
		}
		return lat, nil
	}
	base, err := creates(20)
	if err != nil {
		return err
	}
	// Open the stalled connections from child processes.
	t0 := time.Now()
	var kids []*slowKid
	defer func() {
		for _, k := range kids {
			k.stop()
		}
	}()
	for i := 0; i < slowDialerProcs; i++ {
		k, err := startSlowKid(ctx, ns, addr, slowConns/slowDialerProcs)
		if err != nil {
			return err
		}
		kids = append(kids, k)
	}
	opened, failed, msg := 0, 0, ""
	for _, k := range kids {
		var o, f int
		line, err := k.line("opened")
		if err != nil {
			return err
		}
		var first string
		fmt.Sscanf(line, "opened %d %d %q", &o, &f, &first)
		opened, failed = opened+o, failed+f
		if first != "" && msg == "" {
			msg = first
		}
	}
	openTime := time.Since(t0)
	under, err := creates(20)
	if err != nil {
		return fmt.Errorf("with %d stalled connections open: %w (%s)", opened, err, d.tail())
	}
	// How many stalled connections netmaster still held when the creates were done.
	held := 0
	for _, k := range kids {
		if _, err := io.WriteString(k.in, "check\n"); err != nil {
			return err
		}
		line, err := k.line("held")
		if err != nil {
			return err
		}
		var h int
		fmt.Sscanf(line, "held %d", &h)
		held += h
	}
	q := func(l []time.Duration, p float64) float64 {
		s := slices.Clone(l)
		slices.Sort(s)
		return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
	}
	r.add("cp.slow20k.create_p50_ms", round2(q(under, 0.5)), "ms")
	r.add("cp.slow20k.create_max_ms", round2(q(under, 1)), "ms")
	r.add("cp.slow20k.create_p50_vs_idle_ratio", round2(q(under, 0.5)/q(base, 0.5)), "ratio")
	r.add("cp.slow20k.held", float64(held), "count")
	if failed > 0 {
		msg = fmt.Sprintf(" (%d dials failed, first: %s)", failed, msg)
	}
	table(w, fmt.Sprintf("control plane: POST network with %d stalled connections (opened in %.1fs, %d still held by netmaster after the creates)%s; goal: max < 1000 ms",
		opened, openTime.Seconds(), held, msg),
		[]string{"", "creates", "p50 ms", "max ms"},
		[][]string{
			{"idle", fmt.Sprint(len(base)), fmt.Sprintf("%.1f", q(base, 0.5)), fmt.Sprintf("%.1f", q(base, 1))},
			{fmt.Sprintf("%d stalled", opened), fmt.Sprint(len(under)), fmt.Sprintf("%.1f", q(under, 0.5)), fmt.Sprintf("%.1f", q(under, 1))},
		})
	return nil
}

// slowKid is a child process holding stalled connections.
type slowKid struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startSlowKid(ctx context.Context, ns, addr string, n int) (*slowKid, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, slowDialerArg, ns, addr, fmt.Sprint(n))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start slow dialer: %w", err)
	}
	return &slowKid{cmd: cmd, in: in, out: bufio.NewReader(out)}, nil
}

// line reads the child's next line, which must start with want.
func (k *slowKid) line(want string) (string, error) {
	l, err := k.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(l, want) {
		return "", fmt.Errorf("slow dialer: want %q, got %q (%v)", want, l, err)
	}
	return strings.TrimSpace(l), nil
}

// stop closes the child's stdin (it closes its connections and exits) and waits.
func (k *slowKid) stop() {
	k.in.Close()
	done := make(chan struct{})
	go func() { _ = k.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = k.cmd.Process.Kill()
		<-done
	}
}

// slowDialer is the child's main: args are netns, address and count. It opens count
// connections inside netns (a third send part of a request header, a third headers and
// part of a body), prints
// "opened <ok> <failed> <first error>", answers each "check" line on stdin with
// "held <n>" (connections the server has not closed), and exits when stdin closes.
func slowDialer(args []string) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "slow dialer: want netns, address, count")
		return 2
	}
	ns, addr := args[0], args[1]
	n, err := strconv.Atoi(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "slow dialer: count:", err)
		return 2
	}
	ctx := context.Background()
	conns := make([]net.Conn, n)
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	const dialers = 32
	for g := 0; g < dialers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += dialers {
				c, err := sim.DialContext(ctx, ns, "tcp", addr)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				switch i % 3 {
				case 1: // stops inside the headers
					_, _ = c.Write([]byte("POST /api/v1/networks/default:x/ HTTP/1.1\r\nHost: netmaster\r\nContent-Type: appl"))
				case 2: // stops inside the body
					_, _ = c.Write([]byte("POST /api/v1/networks/default:x/ HTTP/1.1\r\nHost: netmaster\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"tenantName\":"))
				}
				conns[i] = c
			}
		}(g)
	}
	wg.Wait()
	first, _ := firstErr.Load().(string)
	fmt.Printf("opened %d %d %q\n", n-int(failed.Load()), failed.Load(), first)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var held atomic.Int64
		for g := 0; g < dialers; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := g; i < n; i += dialers {
					c := conns[i]
					if c == nil {
						continue
					}
					// A connection netmaster closed reads EOF at once; a held one times out.
					_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
					if _, err := c.Read(make([]byte, 1)); err != nil {
						if ne, ok := err.(net.Error); ok && ne.Timeout() {
							held.Add(1)
						}
					}
				}
			}(g)
		}
		wg.Wait()
		fmt.Printf("held %d\n", held.Load())
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	return 0
}
