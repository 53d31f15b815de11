package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/pkg/cniplugin"
)

// operate measures the operator tools on host 1: a /metrics scrape, a trace through the
// live datapath (eBPF), and CNI attach latency while /metrics is scraped every 100 ms
// beside the same attaches without scraping (scrapes must not stall attaches).
func (d *dpRun) operate(ctx context.Context) error {
	h := d.c.Hosts[0]
	client := nsHTTPClient(h.Name)
	timed := func(n int, fn func() error) ([]time.Duration, error) {
		var out []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if err := fn(); err != nil {
				return out, err
			}
			out = append(out, time.Since(t0))
		}
		slices.Sort(out)
		return out, nil
	}
	get := func(path string) error {
		req, err := http.NewRequest(http.MethodGet, "http://"+h.Inspect+path, nil)
		if err != nil {
			return err
		}
		h.Authorize(req)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return nil
	}
	ms := func(v time.Duration) float64 { return round2(float64(v.Microseconds()) / 1000) }
	p := d.dp + ".operate."
	scrapes, err := timed(20, func() error { return get("/metrics") })
	if err != nil {
		return err
	}
	rows := [][]string{{"GET /metrics", fmt.Sprint(len(scrapes)), fmt.Sprintf("%.1f", ms(scrapes[len(scrapes)/2])), fmt.Sprintf("%.1f", ms(scrapes[len(scrapes)-1]))}}
	d.r.add(p+"scrape_p50_ms", ms(scrapes[len(scrapes)/2]), "ms")
	verifies, err := timed(5, func() error { return get("/inspect/verify") })
	if err != nil {
		return err
	}
	rows = append(rows, []string{"GET /inspect/verify (netctl verify)", fmt.Sprint(len(verifies)), fmt.Sprintf("%.1f", ms(verifies[len(verifies)/2])), fmt.Sprintf("%.1f", ms(verifies[len(verifies)-1]))})
	d.r.add(p+"verify_p50_ms", ms(verifies[len(verifies)/2]), "ms")
	{ // both dataplanes trace (eBPF: the programs run once; OVS: ofproto/trace)
		body, _ := json.Marshal(map[string]any{"from": d.a.EndpointID, "to": d.b.IP.Addr().String(), "proto": "tcp", "port": echoPort})
		traces, err := timed(20, func() error {
			req, err := http.NewRequest(http.MethodPost, "http://"+h.Inspect+"/inspect/trace", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			h.Authorize(req)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("trace: %s %s", resp.Status, b)
			}
			return nil
		})
		if err != nil {
			return err
		}
		rows = append(rows, []string{"POST /inspect/trace (netctl trace)", fmt.Sprint(len(traces)), fmt.Sprintf("%.1f", ms(traces[len(traces)/2])), fmt.Sprintf("%.1f", ms(traces[len(traces)-1]))})
		d.r.add(p+"trace_p50_ms", ms(traces[len(traces)/2]), "ms")
		d.r.add(p+"trace_max_ms", ms(traces[len(traces)-1]), "ms")
	}
	attach := func(prefix string, scrape bool) (cniplugin.BenchResult, int, error) {
		sctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		n := 0
		if scrape {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTicker(100 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-sctx.Done():
						return
					case <-t.C:
						if get("/metrics") == nil {
							n++
						}
					}
				}
			}()
		}
		res, err := cniplugin.BenchAdd(ctx, cniplugin.BenchConfig{BinDir: d.cfg.bin, Socket: h.CNISocket, Network: benchNet, Pods: 30, NSPrefix: d.c.Prefix + prefix})
		stop()
		wg.Wait()
		return res, n, err
	}
	quiet, _, err := attach("q", false)
	if err != nil {
		return err
	}
	busy, n, err := attach("s", true)
	if err != nil {
		return err
	}
	rows = append(rows,
		[]string{"CNI ADD, no scraping", fmt.Sprint(quiet.Pods), fmt.Sprintf("%.1f", ms(quiet.P50)), fmt.Sprintf("%.1f (p99 %.1f)", ms(quiet.Max), ms(quiet.P99))},
		[]string{fmt.Sprintf("CNI ADD, /metrics every 100 ms (%d scrapes)", n), fmt.Sprint(busy.Pods), fmt.Sprintf("%.1f", ms(busy.P50)), fmt.Sprintf("%.1f (p99 %.1f)", ms(busy.Max), ms(busy.P99))})
	d.r.add(p+"attach_p99_scraped_vs_quiet_ratio", ratio(ms(busy.P99), ms(quiet.P99)), "ratio")
	table(d.w, fmt.Sprintf("%s operator tools on one host", d.dp), []string{"request", "count", "p50 ms", "max ms"}, rows)
	return nil
}
