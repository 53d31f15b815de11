package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPrometheusScrape: a real Prometheus 2.42 (Debian) scrapes a simulated cluster's
// netmaster and netplugin, loads the shipped alert rules without errors, and every query
// of the shipped Grafana dashboard runs against the scraped data.
func TestPrometheusScrape(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: make test installs the Debian prometheus package (scripts/deps.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 1})
	h := c.Hosts[0]
	if err := c.CreateNetwork(ctx, "default", "prom-net", "vxlan", "10.104.1.0/24", "10.104.1.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddContainer(ctx, h, "p", "default", "prom-net"); err != nil {
		t.Fatal(err)
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	master := strings.TrimPrefix(c.MasterURL(), "http://")
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: netplugin
    static_configs:
      - targets: ['%s']
        labels: {instance: '%s'}
  - job_name: netmaster
    static_configs:
      - targets: ['%s']
`, filepath.Join(root, "deploy/prometheus/rules.yml"), h.Inspect, h.Name, master)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	const listen = "127.0.0.1:19090"
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", "--net="+NetNSPath(h.Name), "--", prom,
		"--config.file", filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", listen)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	}()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialContext(ctx, h.Name, network, addr)
		}}}
	api := func(path string, out any) error {
		resp, err := client.Get("http://" + listen + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
		return json.Unmarshal(b, out)
	}
	type vector struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  []any             `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	query := func(q string) (vector, error) {
		var v vector
		err := api("/api/v1/query?query="+url.QueryEscape(q), &v)
		if err == nil && v.Status != "success" {
			err = fmt.Errorf("%s: %s", v.Status, v.Error)
		}
		return v, err
	}
	eventually(t, "both targets up with contiv metrics", 60*time.Second, func() error {
		for _, q := range []string{`up{job="netplugin"} == 1`, `up{job="netmaster"} == 1`, `contiv_netplugin_synced == 1`,
			`contiv_netmaster_leader == 1`, `contiv_datapath_packets_total`, `contiv_netmaster_ipam_addresses{network="prom-net.default"}`} {
			v, err := query(q)
			if err != nil {
				return err
			}
			if len(v.Data.Result) == 0 {
				return fmt.Errorf("%s: no result yet", q)
			}
		}
		return nil
	})
	// The rules are loaded and evaluate without errors; nothing fires on a healthy cluster.
	var rules struct {
		Data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					State     string `json:"state"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	eventually(t, "rules evaluated", 30*time.Second, func() error {
		rules.Data.Groups = nil
		if err := api("/api/v1/rules", &rules); err != nil {
			return err
		}
		n := 0
		for _, g := range rules.Data.Groups {
			for _, r := range g.Rules {
				if r.Health != "ok" {
					return fmt.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
				}
				n++
			}
		}
		if n < 10 {
			return fmt.Errorf("%d rules loaded", n)
		}
		return nil
	})
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			if r.State == "firing" {
				t.Errorf("alert %s fires on a healthy cluster", r.Name)
			}
		}
	}
	// Every dashboard query runs (template variables as Grafana would fill them).
	b, err := os.ReadFile(filepath.Join(root, "deploy/grafana/contivbpf.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("$host", ".*", "$__rate_interval", "1m")
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if _, err := query(fill.Replace(tg.Expr)); err != nil {
				t.Errorf("dashboard panel %q: %v", p.Title, err)
			}
		}
	}
}
