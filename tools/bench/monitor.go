package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// sameHostMonitor measures what a connected monitor (netplugin's /monitor, which turns
// the datapath's drop events on) costs allowed traffic: container pa -> pb on host 1 with
// policy on both groups, throughput and new-connection rate, rounds alternating between
// no monitor and a monitor attached (on OVS: dropping flows then also send their packets
// to the agent; allowed traffic is untouched).
func (d *dpRun) sameHostMonitor(ctx context.Context) error {
	if err := d.policySetup(ctx); err != nil {
		return err
	}
	cli, srv := d.pa, d.pb
	addr := fmt.Sprintf("%s:%d", srv.IP.Addr(), echoPort)
	server, err := netbench.StartServer(netbench.NSPath(srv.Name), addr)
	if err != nil {
		return err
	}
	defer server.Close()
	var tput, crr [2][]float64 // [0] without, [1] with the monitor
	var events atomic.Int64
	for i := 0; i < d.cfg.tputRounds; i++ {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, on := range order {
			stop := func() {}
			if on == 1 {
				if stop, err = attachMonitor(ctx, cli.Host, &events); err != nil {
					return err
				}
			}
			g, err := netbench.Iperf3(ctx, srv.Name, cli.Name, srv.IP.Addr().String(), iperfPort, d.cfg.tputSeconds)
			if err == nil {
				var rate float64
				rate, err = netbench.CRR(ctx, netbench.NewDialer(netbench.NSPath(cli.Name)), addr, d.cfg.crrTime)
				crr[on] = append(crr[on], rate)
			}
			stop()
			if err != nil {
				return err
			}
			tput[on] = append(tput[on], g)
		}
	}
	tr, cr := pairedRatio(tput[0], tput[1]), pairedRatio(crr[0], crr[1])
	p := d.dp + ".samehost_monitor."
	d.r.add(p+"tput_ratio", tr, "ratio")
	d.r.add(p+"crr_ratio", cr, "ratio")
	table(d.w, fmt.Sprintf("%s same host with policy: a connected monitor (drop events on) vs none, %d alternating rounds; %d events seen (allowed traffic drops nothing)",
		d.dp, d.cfg.tputRounds, events.Load()),
		[]string{"figure", "no monitor", "monitor", "ratio"},
		[][]string{
			{"TCP throughput Gbit/s (median)", fmt.Sprintf("%.2f", median(tput[0])), fmt.Sprintf("%.2f", median(tput[1])), fmt.Sprintf("%.3f", tr)},
			{"new connections/s (median)", fmt.Sprintf("%.0f", median(crr[0])), fmt.Sprintf("%.0f", median(crr[1])), fmt.Sprintf("%.3f", cr)},
		})
	return nil
}

// attachMonitor opens h's /monitor stream (the agent turns drop events on once the
// response starts) and returns the function that closes it.
func attachMonitor(ctx context.Context, h *sim.Host, events *atomic.Int64) (func(), error) {
	mctx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(mctx, http.MethodGet, "http://"+h.Inspect+"/monitor", nil)
	h.Authorize(req)
	client := &http.Client{Transport: nsHTTPClient(h.Name).Transport} // no timeout: a stream
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("attach monitor on %s: %w", h.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("attach monitor on %s: %s", h.Name, resp.Status)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			events.Add(1)
		}
	}()
	return func() {
		cancel()
		resp.Body.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}, nil
}
