package netctl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestPrefilter (issue 36): against the real netmaster, `netctl prefilter create` prints the
// entry as stored (the prefix masked, the host lowercase), `ls` lists it (table and -j),
// netmaster's refusals (an IPv6 prefix, an absent entry's rm) are API errors with its
// message, a missing --cidr is a usage error before any call, and rm drops the entry.
func TestPrefilter(t *testing.T) {
	url := startMaster(t)
	run := func(args ...string) result {
		t.Helper()
		return runNetctl(t, url, args...)
	}
	if r := run("prefilter", "create", "edge", "--cidr", "192.0.2.77/25", "--host", "Node-1"); r.code != 0 ||
		r.stdout != "Creating prefilter edge: 192.0.2.0/25 dropped at host node-1\n" {
		t.Fatalf("create: %+v", r)
	}
	if r := run("prefilter", "create", "all", "-c", "198.18.0.0/15"); r.code != 0 || !strings.Contains(r.stdout, "at every host") {
		t.Fatalf("create for every host: %+v", r)
	}
	if r := run("prefilter", "ls"); r.code != 0 || !strings.Contains(r.stdout, "all   198.18.0.0/15  (all)\nedge  192.0.2.0/25   node-1\n") {
		t.Fatalf("ls: %+v", r)
	}
	var l []model.Prefilter
	if r := run("prefilter", "ls", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &l) != nil || len(l) != 2 || l[1].Host != "node-1" {
		t.Fatalf("ls --json: %+v", r)
	}
	if r := run("prefilter", "create", "v6", "--cidr", "2001:db8::/32"); r.code != ExitAPI || !strings.Contains(r.stderr, "IPv4 prefixes only") {
		t.Errorf("an IPv6 prefix: %+v, want netmaster's refusal", r)
	}
	if r := run("prefilter", "create", "nocidr"); r.code != ExitUsage || !strings.Contains(r.stderr, "--cidr") {
		t.Errorf("no --cidr: %+v, want a usage error", r)
	}
	if r := run("prefilter", "rm", "ghost"); r.code != ExitAPI || !strings.Contains(r.stderr, `prefilter "ghost" not found`) {
		t.Errorf("rm of an absent entry: %+v", r)
	}
	if r := run("prefilter", "rm", "edge"); r.code != 0 || r.stdout != "Deleting prefilter edge\n" {
		t.Fatalf("rm: %+v", r)
	}
	if r := run("prefilter", "ls", "-j"); r.code != 0 || strings.Contains(r.stdout, "edge") {
		t.Errorf("ls after rm: %+v", r)
	}
}
