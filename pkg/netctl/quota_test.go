package netctl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestTenantQuota (issue 34, items 2 and 4): `netctl tenant quota` shows a tenant's usage
// and limits (golden table, -j), sets limits (numbers with unit suffixes, "default") and
// tag ranges (--vlans, --vxlans, "none"), resets them, refuses bad values before asking
// netmaster, and a create past the limit fails with netmaster's message naming the tenant,
// the kind and the limit.
func TestTenantQuota(t *testing.T) {
	url := startMaster(t, func(c *master.Config) {
		c.Quota = map[string]int64{model.QuotaNetworks: 5, model.QuotaBytes: 1 << 20}
	})
	run := func(args ...string) result {
		t.Helper()
		return runNetctl(t, url, args...)
	}
	r := run("tenant", "quota", "default", "--networks", "1", "--bytes", "2Mi", "--rules", "7", "--endpoint-group-ids", "9", "--node-ports", "4", "--vlans", "100-199")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("set: %+v", r)
	}
	checkGolden(t, "tenant_quota", r.stdout, false)
	if r := run("net", "create", "-s", "10.90.1.0/24", "n1"); r.code != 0 {
		t.Fatalf("first network: %+v", r)
	}
	r = run("net", "create", "-s", "10.90.2.0/24", "n2")
	if r.code != ExitAPI || !strings.Contains(r.stderr, `tenant "default": networks quota exceeded: limit 1`) {
		t.Fatalf("network past the limit: %+v", r)
	}
	r = run("tenant", "quota", "default", "--networks", "default", "-j")
	var q model.TenantQuota
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &q) != nil || q.Limits[model.QuotaNetworks] != 5 ||
		q.Overrides[model.QuotaBytes] != 2<<20 || q.Usage[model.QuotaNetworks] != 1 {
		t.Fatalf("back to the default: %+v %+v", r, q)
	}
	r = run("tenant", "quota", "default", "--vxlans", "6000-6099", "--vlans", "none", "-j")
	q = model.TenantQuota{}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &q) != nil || q.VLANs != "" || q.VXLANs != "6000-6099" {
		t.Fatalf("tag ranges: %+v %+v", r, q)
	}
	if r := run("tenant", "quota", "default", "--vxlans", "6099-6000"); r.code != ExitAPI || !strings.Contains(r.stderr, "has its start after its end") {
		t.Errorf("reversed range: %+v", r)
	}
	if r := run("tenant", "quota", "default", "--reset"); r.code != 0 || !strings.Contains(r.stdout, "bytes           ") || strings.Contains(r.stdout, "tenant\n") {
		t.Fatalf("reset: %+v", r)
	}
	for _, bad := range []string{"x", "-1", "5Q"} {
		if r := run("tenant", "quota", "default", "--networks", bad); r.code != ExitUsage {
			t.Errorf("--networks %s: %+v, want a usage error", bad, r)
		}
	}
	for _, bad := range []string{"1-2-3", "-5", "default", "100"} {
		if r := run("tenant", "quota", "default", "--vlans", bad); r.code != ExitUsage {
			t.Errorf("--vlans %s: %+v, want a usage error", bad, r)
		}
	}
	if r := run("tenant", "quota", "nosuch"); r.code != ExitAPI || !strings.Contains(r.stderr, "not found") {
		t.Errorf("missing tenant: %+v", r)
	}
}

func TestParseLimit(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "12": 12, "64Mi": 64 << 20, "1G": 1e9, "3Ki": 3072, "2K": 2000} {
		if got, err := parseLimit(in); err != nil || got != want {
			t.Errorf("parseLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-3", "1.5M", "Mi", "99999999999Gi"} {
		if _, err := parseLimit(in); err == nil {
			t.Errorf("parseLimit(%q): no error", in)
		}
	}
}
