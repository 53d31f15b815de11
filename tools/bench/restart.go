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

	"github.com/contivbpf/contivbpf/pkg/netbench"
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

// restart runs TCP request/response, a TCP stream and a 10 ms ping from container a (host
// 1) to c (host 2), SIGKILLs host 1's netplugin, restarts it, then does the same on host 2,
// and counts what the traffic noticed.
func (d *dpRun) restart(ctx context.Context) error {
	rrAddr := fmt.Sprintf("%s:%d", d.x.IP.Addr(), echoPort+1)
	srv, err := netbench.StartServer(netbench.NSPath(d.x.Name), rrAddr)
	if err != nil {
		return err
	}
	defer srv.Close()
	sinkAddr := fmt.Sprintf("%s:%d", d.x.IP.Addr(), echoPort+2)
	sink, err := sim.Listen(d.x.Name, "tcp", sinkAddr)
	if err != nil {
		return err
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
			return err
		}
	}

	rrConn, err := sim.DialContext(ctx, d.a.Name, "tcp", rrAddr)
	if err != nil {
		return err
	}
	defer rrConn.Close()
	stConn, err := sim.DialContext(ctx, d.a.Name, "tcp", sinkAddr)
	if err != nil {
		return err
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
	go func() { // bulk stream, paced to leave CPU for the rest
		defer wg.Done()
		buf := make([]byte, 64*1024)
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
			time.Sleep(200 * time.Microsecond)
		}
	}()
	ping := exec.Command("nsenter", "--net="+sim.NetNSPath(d.a.Name), "--", "ping", "-i", "0.01", "-W", "1", d.x.IP.Addr().String())
	var pingOut strings.Builder
	ping.Stdout, ping.Stderr = &pingOut, &pingOut
	if err := ping.Start(); err != nil {
		return fmt.Errorf("start ping: %w", err)
	}
	pingDone := false
	defer func() {
		if !pingDone {
			_ = ping.Process.Kill()
			_ = ping.Wait()
		}
	}()

	sleep := func(t time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(t):
			return nil
		}
	}
	var timeline [][]string
	if err := sleep(time.Second); err != nil {
		return err
	}
	for _, h := range d.c.Hosts {
		t0 := time.Now()
		pid := h.Plugin.PID()
		d.c.KillPlugin(h)
		if err := sleep(d.cfg.downTime); err != nil {
			return err
		}
		if err := d.c.StartPlugin(ctx, h); err != nil {
			return err
		}
		if err := h.WaitReady(ctx, 60*time.Second); err != nil {
			return err
		}
		ready := time.Since(t0)
		timeline = append(timeline, []string{h.Name, strconv.Itoa(pid), d.cfg.downTime.String(), fmt.Sprintf("%.2f", ready.Seconds())})
		if err := sleep(1500 * time.Millisecond); err != nil {
			return err
		}
	}
	stopLoad()
	_ = rrConn.SetDeadline(time.Now())
	_ = stConn.SetDeadline(time.Now())
	wg.Wait()
	_ = ping.Process.Signal(os.Interrupt)
	_ = ping.Wait()
	pingDone = true
	m := pingSummary.FindStringSubmatch(pingOut.String())
	if m == nil {
		return fmt.Errorf("no ping summary in %q", pingOut.String())
	}
	sent, _ := strconv.Atoi(m[1])
	recv, _ := strconv.Atoi(m[2])
	// ping's last probe may still be in flight when it is interrupted.
	lost := sent - recv
	if lost == 1 {
		lost = 0
	}
	var retrans, estabResets int64
	for _, ns := range []string{d.a.Name, d.x.Name} {
		after, err := tcpCounters(ctx, ns)
		if err != nil {
			return err
		}
		retrans += after["RetransSegs"] - before[ns]["RetransSegs"]
		estabResets += after["EstabResets"] - before[ns]["EstabResets"]
	}
	table(d.w, fmt.Sprintf("%s netplugin SIGKILL + restart under load (container a on host 1 -> c on host 2)", d.dp),
		[]string{"host", "killed pid", "down for", "killed->ready s"}, timeline)
	resets := st.resets.Load() + estabResets
	rows := [][]string{
		{"TCP RR ok / failed", fmt.Sprintf("%d / %d", st.rrOK.Load(), st.rrFailed.Load())},
		{"max RR latency ms", fmt.Sprintf("%.1f", float64(st.maxRR.Load())/1e6)},
		{"TCP stream MB sent / errors", fmt.Sprintf("%.1f / %d", float64(st.streamBytes.Load())/1e6, st.streamErrs.Load())},
		{"connection resets (app errors + kernel EstabResets)", strconv.FormatInt(resets, 10)},
		{"TCP retransmitted segments (both ends)", strconv.FormatInt(retrans, 10)},
		{"ping 10 ms sent / lost", fmt.Sprintf("%d / %d", sent, lost)},
	}
	if st.firstErr != nil {
		rows = append(rows, []string{"first error", st.firstErr.Error()})
	}
	table(d.w, d.dp+" traffic during the restarts", []string{"figure", "value"}, rows)
	p := d.dp + ".restart."
	d.r.add(p+"rr_ok", float64(st.rrOK.Load()), "count")
	d.r.add(p+"rr_failed", float64(st.rrFailed.Load()), "count")
	d.r.add(p+"resets", float64(resets), "count")
	d.r.add(p+"ping_sent", float64(sent), "count")
	d.r.add(p+"ping_lost", float64(lost), "count")
	d.r.add(p+"tcp_retrans", float64(retrans), "count")
	d.r.add(p+"max_rr_ms", round1(float64(st.maxRR.Load())/1e6), "ms")
	return nil
}
