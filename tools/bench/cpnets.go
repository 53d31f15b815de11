package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// cpNetworksStage measures cp.create_10k_networks_s: 100 tenants of 100 VXLAN networks
// each created through netmaster at url (8 clients at once, tenants interleaved), and
// cp.create_10k_networks_end_vs_start, the rate of the last 1,000 creates against the
// first 1,000's (goal: completes, >= 0.5). Before the subnet index every create listed
// every network of the cluster, and before local VLANs could run out the 4,095th VXLAN
// network was refused. The global VXLAN range is widened to 1-16000 (its largest width)
// first.
func cpNetworksStage(ctx context.Context, client *http.Client, url string, w io.Writer, r *report) error {
	const tenants, perTenant, workers, window = 100, 100, 8, 1000
	post := func(path string, body any) error {
		b, _ := json.Marshal(body)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("POST %s: %w", path, err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, out)
		}
		return nil
	}
	// The default VXLAN range (1-10000) leaves no room beside the other stages' networks.
	var g map[string]any
	resp, err := client.Get(url + "/api/v1/globals/global/")
	if err != nil {
		return fmt.Errorf("GET global: %w", err)
	}
	err = json.NewDecoder(resp.Body).Decode(&g)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("GET global: %w", err)
	}
	g["vxlans"] = "1-16000"
	if err := post("/api/v1/globals/global/", g); err != nil {
		return err
	}
	for t := range tenants {
		if err := post(fmt.Sprintf("/api/v1/tenants/bn%d/", t), map[string]any{"tenantName": fmt.Sprintf("bn%d", t)}); err != nil {
			return err
		}
	}
	total := tenants * perTenant
	done := make([]time.Time, total)
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				t, n := i%tenants, i/tenants
				name := fmt.Sprintf("n%d", n)
				err := post(fmt.Sprintf("/api/v1/networks/bn%d:%s/", t, name), map[string]any{"tenantName": fmt.Sprintf("bn%d", t),
					"networkName": name, "encap": "vxlan", "subnet": fmt.Sprintf("10.%d.%d.0/24", 100+n, t)})
				if err != nil {
					errc <- fmt.Errorf("network %d of %d: %w", i+1, total, err)
					next.Store(int64(total))
					return
				}
				done[i] = time.Now()
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	all := time.Since(start).Seconds()
	// The rate of a window of creates: by index (creates finish nearly in order).
	rate := func(from, to int) float64 {
		var first, last time.Time
		for _, d := range done[from:to] {
			if first.IsZero() || d.Before(first) {
				first = d
			}
			if d.After(last) {
				last = d
			}
		}
		return float64(to-from) / max(last.Sub(first).Seconds(), 1e-3)
	}
	startRate, endRate := rate(0, window), rate(total-window, total)
	table(w, "control plane: 100 tenants x 100 VXLAN networks (8 clients)", []string{"what", "value"}, [][]string{
		{"total seconds", fmt.Sprintf("%.1f", all)},
		{"creates/s, first 1,000", fmt.Sprintf("%.0f", startRate)},
		{"creates/s, last 1,000", fmt.Sprintf("%.0f", endRate)}})
	r.add("cp.create_10k_networks_s", round1(all), "s")
	r.add("cp.create_10k_networks_end_vs_start", round2(endRate/startRate), "ratio")
	return nil
}
