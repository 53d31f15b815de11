package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"
)

// TestPrometheusRules: the shipped alert rules load in Prometheus 2.42's promtool and pass
// their unit tests (deploy/prometheus/rules_test.yml: which series fire which alert, and
// that IPv6 "not handled" and policy drops do not).
func TestPrometheusRules(t *testing.T) {
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Fatal("promtool not found: make test installs the Debian prometheus package (scripts/deps.sh)")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		cmd := exec.Command("promtool", args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestGrafanaDashboard: the dashboard is valid JSON and every graph has a query (the
// queries themselves run against a real Prometheus scraping a simulated cluster in
// tools/sim TestPrometheusScrape).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/contivbpf.json")
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Expr == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			n++
		}
	}
	if n < 10 {
		t.Errorf("only %d queries", n)
	}
}
