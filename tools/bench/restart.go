package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// loadStats is what the traffic generators saw during the restarts.
type loadStats struct {
	rrOK, rrFailed atomic.Int64
	resets         atomic.Int64 // ECONNRESET/EPIPE on either connection
	streamBytes    atomic.Int64
	streamErrs     atomic.Int64
	maxRR          atomic.Int64 // ns
	firstErrMu     sync.Mutex
	firstErr       error
}

func (s *loadStats) noteErr(err error) {
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		s.resets.Add(1)
	}
	s.firstErrMu.Lock()
	if s.firstErr == nil {
		s.firstErr = err
	}
	s.firstErrMu.Unlock()
}

// tcpCounters reads the Tcp: line of /proc/net/snmp inside a namespace.
func tcpCounters(ctx context.Context, ns string) (map[string]int64, error) {
	out, err := sim.Exec(ctx, ns, "cat", "/proc/net/snmp")
	if err != nil {
		return nil, err
	}
	var hdr []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if hdr == nil {
			hdr = f
			continue
		}
		m := map[string]int64{}
		for i := 1; i < len(f) && i < len(hdr); i++ {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			m[hdr[i]] = v
		}
		return m, nil
	}
	return nil, fmt.Errorf("no Tcp: counters in /proc/net/snmp of %s", ns)
}

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (?:packets )?received`)

// loadResult is what one load phase saw.
type loadResult struct {
	rrOK, rrFailed, resets, streamErrs int64
	streamMB                           float64
	maxRR                              time.Duration
	retrans                            int64
	pingSent, pingLost                 int
	firstErr                           error
	seconds                            float64
}

// underLoad runs TCP request/response, a paced TCP stream (~130 Mbit/s) and a 10 ms ping
// from container a (host 1) to c (host 2) around action, and returns what they noticed.
func (d *dpRun) underLoad(ctx context.Context, port int, action func() error) (loadResult, error) {
	var res loadResult
	rrAddr := fmt.Sprintf("%s:%d", d.x.IP.Addr(), port)
	srv, err := netbench.StartServer(netbench.NSPath(d.x.Name), rrAddr)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	sinkAddr := fmt.Sprintf("%s:%d", d.x.IP.Addr(), port+1)
	sink, err := sim.Listen(d.x.Name, "tcp", sinkAddr)
	if err != nil {
		return res, err
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	before := map[string]map[string]int64{}
	for _, ns := range []string{d.a.Name, d.x.Name} {
		if before[ns], err = tcpCounters(ctx, ns); err != nil {
			return res, err
		}
	}
	rrConn, err := sim.DialContext(ctx, d.a.Name, "tcp", rrAddr)
	if err != nil {
		return res, err
	}
	defer func() { rrConn.Close() }()
	stConn, err := sim.DialContext(ctx, d.a.Name, "tcp", sinkAddr)
	if err != nil {
		return res, err
	}
	defer stConn.Close()

	var st loadStats
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // request/response, 2 s deadline per round trip
		defer wg.Done()
		for lctx.Err() == nil {
			_ = rrConn.SetDeadline(time.Now().Add(2 * time.Second))
			t0 := time.Now()
			if _, err := netbench.RR(rrConn, 1, 64); err != nil {
				if lctx.Err() != nil {
					return
				}
				st.rrFailed.Add(1)
				st.noteErr(err)
				// The stream is out of step after a failure: start a new connection.
				rrConn.Close()
				c, derr := sim.DialContext(lctx, d.a.Name, "tcp", rrAddr)
				if derr != nil {
					st.noteErr(derr)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				rrConn = c
				continue
			}
			st.rrOK.Add(1)
			if el := time.Since(t0).Nanoseconds(); el > st.maxRR.Load() {
				st.maxRR.Store(el)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go func() { // bulk stream, 16 KiB per millisecond
		defer wg.Done()
		buf := make([]byte, 16*1024)
		for lctx.Err() == nil {
			_ = stConn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			n, err := stConn.Write(buf)
			st.streamBytes.Add(int64(n))
			if err != nil {
				if lctx.Err() != nil {
					return
				}
				st.streamErrs.Add(1)
				st.noteErr(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	ping := exec.Command("nsenter", "--net="+sim.NetNSPath(d.a.Name), "--", "ping", "-i", "0.01", "-W", "1", d.x.IP.Addr().String())
	var pingOut strings.Builder
	ping.Stdout, ping.Stderr = &pingOut, &pingOut
	if err := ping.Start(); err != nil {
		return res, fmt.Errorf("start ping: %w", err)
	}
	pingDone := false
	defer func() {
		if !pingDone {
			_ = ping.Process.Kill()
			_ = ping.Wait()
		}
	}()
	t0 := time.Now()
	aerr := sleepCtx(ctx, time.Second)
	if aerr == nil {
		aerr = action()
	}
	if aerr == nil {
		aerr = sleepCtx(ctx, time.Second)
	}
	stopLoad()
	_ = rrConn.SetDeadline(time.Now())
	_ = stConn.SetDeadline(time.Now())
	wg.Wait()
	res.seconds = time.Since(t0).Seconds()
	_ = ping.Process.Signal(os.Interrupt)
	_ = ping.Wait()
	pingDone = true
	if aerr != nil {
		return res, aerr
	}
	m := pingSummary.FindStringSubmatch(pingOut.String())
	if m == nil {
		return res, fmt.Errorf("no ping summary in %q", pingOut.String())
	}
	sent, _ := strconv.Atoi(m[1])
	recv, _ := strconv.Atoi(m[2])
	res.pingSent, res.pingLost = sent, sent-recv
	if res.pingLost == 1 { // the last probe may still be in flight when ping is interrupted
		res.pingLost = 0
	}
	var estabResets int64
	for _, ns := range []string{d.a.Name, d.x.Name} {
		after, err := tcpCounters(ctx, ns)
		if err != nil {
			return res, err
		}
		res.retrans += after["RetransSegs"] - before[ns]["RetransSegs"]
		estabResets += after["EstabResets"] - before[ns]["EstabResets"]
	}
	res.rrOK, res.rrFailed = st.rrOK.Load(), st.rrFailed.Load()
	res.resets = st.resets.Load() + estabResets
	res.streamErrs = st.streamErrs.Load()
	res.streamMB = float64(st.streamBytes.Load()) / 1e6
	res.maxRR = time.Duration(st.maxRR.Load())
	res.firstErr = st.firstErr
	return res, nil
}

func sleepCtx(ctx context.Context, t time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(t):
		return nil
	}
}

// restart measures the load once undisturbed (control) and once while each host's
// netplugin in turn is SIGKILLed, kept down, and started again; the goal is that the
// restart phase loses and resets nothing more than the control phase (ideally nothing).
func (d *dpRun) restart(ctx context.Context) error {
	var timeline [][]string
	ctl, err := d.underLoad(ctx, echoPort+10, func() error { return sleepCtx(ctx, 3*time.Second) })
	if err != nil {
		return fmt.Errorf("control phase: %w", err)
	}
	rst, err := d.underLoad(ctx, echoPort+20, func() error {
		for _, h := range d.c.Hosts {
			t0 := time.Now()
			pid := h.Plugin.PID()
			d.c.KillPlugin(h)
			if err := sleepCtx(ctx, d.cfg.downTime); err != nil {
				return err
			}
			if err := d.c.StartPlugin(ctx, h); err != nil {
				return err
			}
			if err := h.WaitReady(ctx, 60*time.Second); err != nil {
				return err
			}
			timeline = append(timeline, []string{h.Name, strconv.Itoa(pid), d.cfg.downTime.String(), fmt.Sprintf("%.2f", time.Since(t0).Seconds())})
			if err := sleepCtx(ctx, time.Second); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("restart phase: %w", err)
	}
	table(d.w, fmt.Sprintf("%s netplugin SIGKILL + restart under load (container a on host 1 -> c on host 2)", d.dp),
		[]string{"host", "killed pid", "down for", "killed->ready s"}, timeline)
	row := func(name string, f func(r loadResult) string) []string { return []string{name, f(ctl), f(rst)} }
	rows := [][]string{
		row("phase length s", func(r loadResult) string { return fmt.Sprintf("%.1f", r.seconds) }),
		row("TCP RR ok / failed", func(r loadResult) string { return fmt.Sprintf("%d / %d", r.rrOK, r.rrFailed) }),
		row("max RR latency ms", func(r loadResult) string { return fmt.Sprintf("%.1f", float64(r.maxRR)/1e6) }),
		row("TCP stream MB sent / errors", func(r loadResult) string { return fmt.Sprintf("%.1f / %d", r.streamMB, r.streamErrs) }),
		row("connection resets (app errors + kernel EstabResets)", func(r loadResult) string { return strconv.FormatInt(r.resets, 10) }),
		row("TCP retransmitted segments (both ends)", func(r loadResult) string { return strconv.FormatInt(r.retrans, 10) }),
		row("ping every 10 ms: sent / lost", func(r loadResult) string { return fmt.Sprintf("%d / %d", r.pingSent, r.pingLost) }),
	}
	for _, x := range []struct {
		n string
		r loadResult
	}{{"control", ctl}, {"restart", rst}} {
		if x.r.firstErr != nil {
			rows = append(rows, []string{"first error (" + x.n + ")", x.r.firstErr.Error(), ""})
		}
	}
	table(d.w, d.dp+" traffic: control phase (no restart) vs restart phase", []string{"figure", "control", "restarts"}, rows)
	p := d.dp + ".restart."
	d.r.add(p+"rr_ok", float64(rst.rrOK), "count")
	d.r.add(p+"rr_failed", float64(rst.rrFailed), "count")
	d.r.add(p+"resets", float64(rst.resets), "count")
	d.r.add(p+"ping_sent", float64(rst.pingSent), "count")
	d.r.add(p+"ping_lost", float64(rst.pingLost), "count")
	d.r.add(p+"tcp_retrans", float64(rst.retrans), "count")
	d.r.add(p+"max_rr_ms", round1(float64(rst.maxRR)/1e6), "ms")
	d.r.add(p+"control_ping_lost", float64(ctl.pingLost), "count")
	d.r.add(p+"control_tcp_retrans", float64(ctl.retrans), "count")
	d.r.add(p+"control_max_rr_ms", round1(float64(ctl.maxRR)/1e6), "ms")
	return nil
}
