package master

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

const prefilters = "/api/v1/" + model.CollPrefilters + "/"

// TestPrefilterRoles (issue 36): only an admin (or a caller of an --insecure netmaster,
// without an identity) sets or drops a deny list entry; an agent, an operator, a peer and
// a tenant-admin are refused 403 and nothing changes. Agents, operators and peers read the
// list and each entry; a tenant-admin lists none and reads none.
func TestPrefilterRoles(t *testing.T) {
	e := newEnv(t, "bridge")
	e.ok("PUT", prefilters+"p1/", model.Prefilter{CIDR: "198.51.100.0/24", Host: "h1"}, nil)
	admin := e.as(auth.Identity{Name: "alice", Role: auth.RoleAdmin, Via: "token"})
	admin.ok("POST", prefilters+"p2/", model.Prefilter{Name: "p2", CIDR: "203.0.113.0/24"}, nil)

	readers := map[string]*env{
		"admin":     admin,
		"agent":     e.as(auth.Identity{Name: auth.HostPrefix + "h1", Role: auth.RoleAgent, Via: "token"}),
		"read-only": e.as(auth.Identity{Name: "scraper", Role: auth.RoleReadOnly, Via: "token"}),
		"netmaster": e.as(auth.Identity{Name: "peers", Role: auth.RoleNetmaster, Via: "token"}),
	}
	for role, c := range readers {
		var l []model.Prefilter
		c.ok("GET", prefilters, nil, &l)
		if len(l) != 2 || l[0] != (model.Prefilter{Name: "p1", CIDR: "198.51.100.0/24", Host: "h1"}) || l[1].Name != "p2" {
			t.Errorf("%s lists %+v, want p1 and p2", role, l)
		}
		var p model.Prefilter
		c.ok("GET", prefilters+"p2/", nil, &p)
		if p != (model.Prefilter{Name: "p2", CIDR: "203.0.113.0/24"}) {
			t.Errorf("%s reads p2 as %+v", role, p)
		}
	}

	tenant := e.as(auth.Identity{Name: "bob", Role: "tenant-admin:t1", Via: "token"})
	snap, _ := e.snapshot()
	for role, c := range map[string]*env{"agent": readers["agent"], "read-only": readers["read-only"],
		"netmaster": readers["netmaster"], "tenant-admin": tenant} {
		for _, rq := range []struct{ method, path string }{
			{"PUT", prefilters + "p1/"}, {"POST", prefilters + "p3/"}, {"DELETE", prefilters + "p2/"},
		} {
			if st, body := c.do(rq.method, rq.path, model.Prefilter{CIDR: "192.0.2.0/24"}); st != http.StatusForbidden || !strings.Contains(body, "admins") {
				t.Errorf("%s %s %s: %d %s, want 403", role, rq.method, rq.path, st, body)
			}
		}
	}
	if got, _ := e.snapshot(); got != snap {
		t.Errorf("refused writes changed the store:\n%s\nwas\n%s", got, snap)
	}
	if st, body := tenant.do("GET", prefilters, nil); st != http.StatusOK || strings.TrimSpace(body) != "[]" {
		t.Errorf("tenant-admin's list: %d %s, want []", st, body)
	}
	if st, body := tenant.do("GET", prefilters+"p1/", nil); st != http.StatusForbidden || strings.Contains(body, "198.51") {
		t.Errorf("tenant-admin reads p1: %d %s, want 403", st, body)
	}
	admin.ok("DELETE", prefilters+"p1/", nil, nil)
	e.ok("DELETE", prefilters+"p2/", nil, nil)
}

// TestPrefilterValidation (issue 36): a bad entry is refused 400 naming its field, with
// nothing written: a bad name, a body name other than the URL's, a missing or malformed
// cidr, an IPv6 one (said so), /0 (it would cut the hosts' control plane), a host name that
// could change a key, an unknown field. A good one is stored canonical: the prefix masked,
// the host lowercase, the name the URL's.
func TestPrefilterValidation(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tc := range []struct {
		name, body, want string
	}{
		{"bad_name", `{"cidr":"192.0.2.0/24"}`, "name:"},
		{"-x", `{"cidr":"192.0.2.0/24"}`, "name:"},
		{strings.Repeat("a", 65), `{"cidr":"192.0.2.0/24"}`, "name:"},
		{"p1", `{"name":"p2","cidr":"192.0.2.0/24"}`, `name: "p2" differs`},
		{"p1", `{}`, "cidr: required"},
		{"p1", `{"cidr":"192.0.2.1"}`, "cidr:"},
		{"p1", `{"cidr":"192.0.2.0/33"}`, "cidr:"},
		{"p1", `{"cidr":"192.0.2.0/24 "}`, "cidr:"},
		{"p1", `{"cidr":"010.0.0.0/8"}`, "cidr:"},
		{"p1", `{"cidr":"2001:db8::/32"}`, "IPv4 prefixes only"},
		{"p1", `{"cidr":"::ffff:192.0.2.0/120"}`, "IPv4 prefixes only"},
		{"p1", `{"cidr":"0.0.0.0/0"}`, "cidr:"},
		{"p1", `{"cidr":"10.0.0.0/0"}`, "control plane"},
		{"p1", `{"cidr":"192.0.2.0/24","host":"a/b"}`, "host:"},
		{"p1", `{"cidr":"192.0.2.0/24","host":"a..b"}`, "host:"},
		{"p1", `{"cidr":"192.0.2.0/24","host":" h1"}`, "host:"},
		{"p1", `{"cidr":"192.0.2.0/24","host":"h1 "}`, "host:"},
		{"p1", `{"cidr":"192.0.2.0/24","host":"a\u0000b"}`, "host:"},
		{"p1", `{"cidr":"192.0.2.0/24","host":"` + strings.Repeat("h", maxPluginField+1) + `"}`, "host:"},
		{"p1", `{"cidr":"192.0.2.0/24","port":80}`, "port"},
		{"p1", `{"cidr":192}`, "cidr"},
		{"p1", ``, "empty request body"},
	} {
		before, _ := e.snapshot()
		st, body := e.do("PUT", prefilters+tc.name+"/", tc.body)
		if st != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("PUT %s %s: %d %s, want 400 with %q", tc.name, tc.body, st, body, tc.want)
		}
		if after, _ := e.snapshot(); after != before {
			t.Errorf("PUT %s %s wrote to the store", tc.name, tc.body)
		}
	}

	var p model.Prefilter
	e.ok("PUT", prefilters+"edge/", `{"cidr":"192.0.2.77/25","host":"Node_1.Example"}`, &p)
	want := model.Prefilter{Name: "edge", CIDR: "192.0.2.0/25", Host: "node_1.example"}
	if p != want {
		t.Errorf("answered %+v, want %+v", p, want)
	}
	if got := e.rawGet(model.PrefilterKey("edge")); got != `{"name":"edge","cidr":"192.0.2.0/25","host":"node_1.example"}` {
		t.Errorf("stored %s", got)
	}
	e.ok("POST", prefilters+"edge/", `{"name":"edge","cidr":"192.0.2.1/32"}`, &p)
	if got := e.rawGet(model.PrefilterKey("edge")); got != `{"name":"edge","cidr":"192.0.2.1/32"}` {
		t.Errorf("replaced: stored %s, want every host's /32", got)
	}
}

// TestPrefilterVTEP (issue 36): a prefix holding a known host's VTEP (its durable record)
// is refused 400 naming cidr and the host, whichever host the entry is for, and replacing
// an entry with one leaves the old entry as it was: it would cut the overlay to that host.
// A neighbouring prefix is fine, and a VTEP record that does not decode names no VTEP.
func TestPrefilterVTEP(t *testing.T) {
	e := newEnv(t, "bridge")
	for k, v := range map[string]string{
		vxlan.HostVTEPKey("h2"):  `{"host":"h2","vtep":"192.168.50.7"}`,
		vxlan.HostVTEPKey("bad"): `{"host":"bad","vtep":"not an address"}`,
	} {
		if _, err := e.raw.Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	e.ok("PUT", prefilters+"p1/", model.Prefilter{CIDR: "192.168.51.0/24"}, nil)
	before, _ := e.snapshot()
	for _, p := range []model.Prefilter{
		{CIDR: "192.168.50.0/24"},
		{CIDR: "192.168.0.0/16", Host: "h1"},
		{CIDR: "192.168.50.7/32", Host: "h2"},
	} {
		for _, name := range []string{"p1", "p2"} {
			st, body := e.do("PUT", prefilters+name+"/", p)
			if st != http.StatusBadRequest || !strings.Contains(body, "cidr:") || !strings.Contains(body, `host "h2"`) {
				t.Errorf("PUT %s %+v: %d %s, want 400 naming cidr and h2", name, p, st, body)
			}
		}
	}
	if after, _ := e.snapshot(); after != before {
		t.Errorf("refused entries wrote to the store")
	}
}

// TestPrefilterLimit (issue 36): the deny list holds at most model.MaxPrefilters entries (as
// many as the datapath's map): one more is refused 409 saying so, nothing written; an
// existing entry may still be replaced, and once one is dropped a new one fits.
func TestPrefilterLimit(t *testing.T) {
	e := newEnv(t, "bridge")
	ctx := context.Background()
	for i := 0; i < model.MaxPrefilters; i += 128 {
		var ops []clientv3.Op
		for j := i; j < i+128 && j < model.MaxPrefilters; j++ {
			name := fmt.Sprintf("p%d", j)
			ops = append(ops, clientv3.OpPut(model.PrefilterKey(name),
				fmt.Sprintf(`{"name":%q,"cidr":"10.%d.%d.0/24"}`, name, j/256, j%256)))
		}
		if _, err := e.raw.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := e.snapshot()
	st, body := e.do("PUT", prefilters+"one-more/", model.Prefilter{CIDR: "192.0.2.0/24"})
	if st != http.StatusConflict || !strings.Contains(body, fmt.Sprintf("at most %d", model.MaxPrefilters)) {
		t.Errorf("entry %d: %d %s, want 409 naming the limit", model.MaxPrefilters+1, st, body)
	}
	if after, _ := e.snapshot(); after != before {
		t.Errorf("a refused entry wrote to the store")
	}
	e.ok("PUT", prefilters+"p7/", model.Prefilter{CIDR: "192.0.2.0/24"}, nil)
	e.ok("DELETE", prefilters+"p8/", nil, nil)
	e.ok("PUT", prefilters+"one-more/", model.Prefilter{CIDR: "192.0.2.0/24"}, nil)
}

// TestPrefilterDelete (issue 36): dropping an entry that does not exist is 404 naming it;
// one that does goes, and reading it then is 404 too.
func TestPrefilterDelete(t *testing.T) {
	e := newEnv(t, "bridge")
	if st, body := e.do("DELETE", prefilters+"ghost/", nil); st != http.StatusNotFound || !strings.Contains(body, `"ghost"`) {
		t.Errorf("DELETE ghost: %d %s, want 404 naming it", st, body)
	}
	e.ok("PUT", prefilters+"p1/", model.Prefilter{CIDR: "192.0.2.0/24"}, nil)
	e.ok("DELETE", prefilters+"p1/", nil, nil)
	if got := e.rawGet(model.PrefilterKey("p1")); got != "" {
		t.Errorf("p1 still stored: %s", got)
	}
	if st, body := e.do("GET", prefilters+"p1/", nil); st != http.StatusNotFound || !strings.Contains(body, `"p1"`) {
		t.Errorf("GET p1 after delete: %d %s, want 404", st, body)
	}
}
