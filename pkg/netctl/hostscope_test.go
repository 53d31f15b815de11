package netctl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestHostScope: `netctl host scope` sets a host's scope (tenants and networks), shows it
// (text and -j), `netctl host ls` lists it, --reset drops it (the host serves every tenant:
// showing it is netmaster's 404), and conflicting flags are a usage error before any call.
func TestHostScope(t *testing.T) {
	url := startMaster(t)
	run := func(args ...string) result {
		t.Helper()
		return runNetctl(t, url, args...)
	}
	r := run("host", "scope", "h1", "--tenant", "t2", "-t", "t1", "--network", "t3:n1")
	if r.code != 0 || r.stdout != "Host: h1\nTenants: t1, t2\nNetworks: t3:n1\n" {
		t.Fatalf("set: %+v", r)
	}
	var s model.HostScope
	if r := run("host", "scope", "h1", "-j"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil || len(s.Tenants) != 2 || s.Networks[0] != "t3:n1" {
		t.Fatalf("show: %+v %+v", r, s)
	}
	if r := run("host", "ls"); r.code != 0 || !strings.Contains(r.stdout, "h1    t1,t2    t3:n1") {
		t.Fatalf("ls: %+v", r)
	}
	if r := run("host", "scope", "h1", "--none"); r.code != 0 || !strings.Contains(r.stdout, "Tenants: (none)") {
		t.Fatalf("none: %+v", r)
	}
	if r := run("host", "scope", "h1", "--network", "n1"); r.code != ExitAPI || !strings.Contains(r.stderr, "networks:") {
		t.Errorf("a network without its tenant: %+v", r)
	}
	if r := run("host", "scope", "h1", "--reset", "-t", "t1"); r.code != ExitUsage {
		t.Errorf("--reset with --tenant: %+v, want a usage error", r)
	}
	if r := run("host", "scope", "h1", "--reset"); r.code != 0 || !strings.Contains(r.stdout, "serves every tenant") {
		t.Fatalf("reset: %+v", r)
	}
	if r := run("host", "scope", "h1"); r.code != ExitAPI || !strings.Contains(r.stderr, "serves every tenant") {
		t.Errorf("after reset: %+v", r)
	}
}
