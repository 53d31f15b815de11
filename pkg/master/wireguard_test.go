package master

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/clusterenc"
	"github.com/contivbpf/contivbpf/pkg/etcdrbac"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// wgKey is a well-formed public key (any 32 bytes but zero are one to netmaster).
func wgKey(b byte) string {
	k := make([]byte, 32)
	k[0] = b
	return base64.StdEncoding.EncodeToString(k)
}

// TestPublishWireGuardOwnHostOnly (issue 38): an agent bound to host1 publishes host1's
// WireGuard key and endpoint (one record, whatever case it spells the host in); publishing
// host2's is 403 naming the field, as is taking a key host2 already published (409), and
// a malformed record is 400 naming its field: each refusal leaves etcd as it was.
func TestPublishWireGuardOwnHostOnly(t *testing.T) {
	e := newEnv(t, "bridge")
	h1 := e.as(auth.Identity{Name: auth.HostPrefix + "host1", Role: auth.RoleAgent})
	h2 := e.as(auth.Identity{Name: auth.HostPrefix + "host2", Role: auth.RoleAgent})
	h2.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host2", PublicKey: wgKey(2), Endpoint: "192.0.2.2:51820"}, nil)
	h1.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host1", PublicKey: wgKey(1), Endpoint: "192.0.2.1:51820"}, nil)
	h1.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "HOST1", PublicKey: wgKey(3), Endpoint: "192.0.2.1:51821"}, nil)
	if got := e.rawGet(model.WireGuardKey("host1")); !strings.Contains(got, wgKey(3)) || !strings.Contains(got, `"host":"host1"`) {
		t.Fatalf("host1's record: %s", got)
	}

	cases := []struct {
		name string
		as   *env
		rec  string
		code int
		msg  string
	}{
		{"another host's key", h1, `{"host":"host2","publicKey":"` + wgKey(9) + `","endpoint":"192.0.2.1:51820"}`, 403, "host"},
		{"another host's key, other case", h1, `{"host":"Host2","publicKey":"` + wgKey(9) + `","endpoint":"192.0.2.1:51820"}`, 403, "host"},
		{"a key host2 holds", h1, `{"host":"host1","publicKey":"` + wgKey(2) + `","endpoint":"192.0.2.1:51820"}`, 409, "publicKey"},
		// The same 32 bytes spelled otherwise (base64 decoding ignores the last character's
		// two spare bits and line breaks) would pass a comparison of strings.
		{"a key host2 holds, spare bits set", h1, `{"host":"host1","publicKey":"` + strings.TrimSuffix(wgKey(2), "A=") + `B=","endpoint":"192.0.2.1:51820"}`, 400, "publicKey"},
		{"a key host2 holds, with a line break", h1, `{"host":"host1","publicKey":"` + wgKey(2)[:8] + `\n` + wgKey(2)[8:] + `","endpoint":"192.0.2.1:51820"}`, 400, "publicKey"},
		{"no host", h1, `{"publicKey":"` + wgKey(1) + `","endpoint":"192.0.2.1:51820"}`, 400, "host"},
		{"host with a slash", e, `{"host":"a/b","publicKey":"` + wgKey(1) + `","endpoint":"192.0.2.1:51820"}`, 400, "host"},
		{"short key", h1, `{"host":"host1","publicKey":"AAAA","endpoint":"192.0.2.1:51820"}`, 400, "publicKey"},
		{"zero key", h1, `{"host":"host1","publicKey":"` + base64.StdEncoding.EncodeToString(make([]byte, 32)) + `","endpoint":"192.0.2.1:51820"}`, 400, "publicKey"},
		{"no port", h1, `{"host":"host1","publicKey":"` + wgKey(1) + `","endpoint":"192.0.2.1"}`, 400, "endpoint"},
		{"port 0", h1, `{"host":"host1","publicKey":"` + wgKey(1) + `","endpoint":"192.0.2.1:0"}`, 400, "endpoint"},
		{"multicast", h1, `{"host":"host1","publicKey":"` + wgKey(1) + `","endpoint":"224.0.0.1:51820"}`, 400, "endpoint"},
		{"unknown field", h1, `{"host":"host1","publicKey":"` + wgKey(1) + `","endpoint":"192.0.2.1:51820","privateKey":"x"}`, 400, "privateKey"},
		// The rotation state is netmaster's: an agent marking its rotation done without a new key.
		{"rotated", h1, `{"host":"host1","publicKey":"` + wgKey(3) + `","endpoint":"192.0.2.1:51821","rotated":7}`, 400, "rotated"},
		{"rotate", h1, `{"host":"host1","publicKey":"` + wgKey(3) + `","endpoint":"192.0.2.1:51821","rotate":7}`, 400, "rotate"},
	}
	for _, c := range cases {
		before, rev := e.snapshot()
		code, out := c.as.do("POST", "/plugin/publishWireGuard", c.rec)
		if code != c.code || !strings.Contains(out, c.msg) {
			t.Errorf("%s: %d %q, want %d naming %q", c.name, code, out, c.code, c.msg)
		}
		if after, rev2 := e.snapshot(); after != before || rev2 != rev {
			t.Errorf("%s: etcd changed (revision %d → %d)", c.name, rev, rev2)
		}
	}
	// An admin (no host binding) may publish for any host.
	e.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host3", PublicKey: wgKey(4), Endpoint: "192.0.2.3:51820"}, nil)
	if code, _ := h1.do("POST", "/plugin/publishWireGuard", `{"host":"host3","publicKey":"`+wgKey(5)+`","endpoint":"192.0.2.3:1"}`); code != http.StatusForbidden {
		t.Fatalf("host1 replacing host3's record: %d, want 403", code)
	}
}

// TestDeleteWireGuardAdminOnly (issue 38): an admin deletes a departed host's WireGuard
// record (DELETE /wireguard/hosts/<host>, any case of the name; before, only a write
// around netmaster into etcd could) and asks for a host's key rotation (POST
// /wireguard/hosts/<host>/rotate); an agent, also the host's own, and a read-only caller
// get 403 naming who sets them, a host without a record 404 naming the field, a bad name
// 400 naming it, and a refusal leaves etcd as it was. Another host's record stays.
func TestDeleteWireGuardAdminOnly(t *testing.T) {
	e := newEnv(t, "bridge")
	h1 := e.as(auth.Identity{Name: auth.HostPrefix + "host1", Role: auth.RoleAgent})
	h2 := e.as(auth.Identity{Name: auth.HostPrefix + "host2", Role: auth.RoleAgent})
	ro := e.as(auth.Identity{Name: "viewer", Role: auth.RoleReadOnly})
	admin := e.as(auth.Identity{Name: "root", Role: auth.RoleAdmin})
	h1.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host1", PublicKey: wgKey(1), Endpoint: "192.0.2.1:51820"}, nil)
	h2.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host2", PublicKey: wgKey(2), Endpoint: "192.0.2.2:51820"}, nil)

	for _, route := range []struct{ method, suffix, what string }{
		{"DELETE", "", "WireGuard records are set by admins"},
		{"POST", "/rotate", "WireGuard key rotations are set by admins"},
	} {
		for _, c := range []struct {
			name string
			as   *env
			host string
			code int
			msg  string
		}{
			{"another host's agent", h1, "host2", 403, route.what},
			{"the host's own agent", h2, "host2", 403, route.what},
			{"read-only", ro, "host2", 403, route.what},
			{"no record", admin, "host9", 404, "host"},
			{"bad name", admin, strings.Repeat("x", 300), 400, "host"},
		} {
			before, rev := e.snapshot()
			code, out := c.as.do(route.method, "/wireguard/hosts/"+c.host+route.suffix, nil)
			if code != c.code || !strings.Contains(out, c.msg) {
				t.Errorf("%s %s: %d %q, want %d naming %q", route.method, c.name, code, out, c.code, c.msg)
			}
			if after, rev2 := e.snapshot(); after != before || rev2 != rev {
				t.Errorf("%s %s: etcd changed (revision %d → %d)", route.method, c.name, rev, rev2)
			}
		}
	}
	if code, out := admin.do("DELETE", "/wireguard/hosts/HOST2", nil); code != http.StatusOK {
		t.Fatalf("admin deletes host2's record: %d %q", code, out)
	}
	if got := e.rawGet(model.WireGuardKey("host2")); got != "" {
		t.Errorf("host2's record after its deletion: %q", got)
	}
	if got := e.rawGet(model.WireGuardKey("host1")); !strings.Contains(got, wgKey(1)) {
		t.Errorf("host1's record after host2's deletion: %q", got)
	}
}

// TestRotateWireGuard (issue 38, rotation on request): an admin's request raises the
// host's rotation generation in its record (any case of the name), pending while the host
// publishes the key it had (a restart), done once it publishes another; a second request
// counts on. A read-only caller lists the records with their state; an agent's own
// publication never clears a request. A record of the former shape (no rotation fields)
// is read as never rotated.
func TestRotateWireGuard(t *testing.T) {
	e := newEnv(t, "bridge")
	h1 := e.as(auth.Identity{Name: auth.HostPrefix + "host1", Role: auth.RoleAgent})
	ro := e.as(auth.Identity{Name: "viewer", Role: auth.RoleReadOnly})
	admin := e.as(auth.Identity{Name: "root", Role: auth.RoleAdmin})
	pub := func(key byte) {
		t.Helper()
		h1.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host1", PublicKey: wgKey(key), Endpoint: "192.0.2.1:51820"}, nil)
	}
	state := func() string {
		t.Helper()
		var l []model.WireGuardHost
		ro.ok("GET", "/wireguard/hosts", nil, &l)
		var out []string
		for _, h := range l {
			out = append(out, h.Host+" "+h.PublicKey[:2]+" "+h.RotationState())
		}
		return strings.Join(out, "; ")
	}
	pub(1)
	// host2's record as a build before rotations wrote it.
	if _, err := e.raw.Put(context.Background(), model.WireGuardKey("host2"), `{"host":"host2","publicKey":"`+wgKey(2)+`","endpoint":"192.0.2.2:51820"}`); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "host1 AQ -; host2 Ag -" {
		t.Fatalf("before any request: %q", got)
	}
	var rec model.WireGuardHost
	admin.ok("POST", "/wireguard/hosts/HOST1/rotate", nil, &rec)
	if rec.Host != "host1" || rec.Rotate != 1 || rec.Rotated != 0 || rec.PublicKey != wgKey(1) {
		t.Fatalf("the request's answer: %+v", rec)
	}
	pub(1) // (the agent restarted with its key: the request stands)
	if got := state(); got != "host1 AQ pending 1; host2 Ag -" {
		t.Fatalf("requested, the old key published again: %q", got)
	}
	pub(3)
	if got := state(); got != "host1 Aw done 1; host2 Ag -" {
		t.Fatalf("a new key published: %q", got)
	}
	admin.ok("POST", "/wireguard/hosts/host1/rotate", nil, &rec)
	admin.ok("POST", "/wireguard/hosts/host2/rotate", nil, &rec)
	if got := state(); got != "host1 Aw pending 2; host2 Ag pending 1" {
		t.Fatalf("requested again: %q", got)
	}
}

// TestPublishWireGuardAfterTokenRemoved (issue 38): a host whose token was removed (its
// etcdrbac token-host record marked removed, its WireGuard record deleted) cannot write
// its record back with a publication authenticated before (403 naming host, nothing
// written); a host whose token stands publishes.
func TestPublishWireGuardAfterTokenRemoved(t *testing.T) {
	e := newEnv(t, "bridge")
	ctx := context.Background()
	for h, v := range map[string]string{"host1": "removed", "host2": ""} {
		if _, err := e.raw.Put(ctx, etcdrbac.TokenHostsPrefix+h, v); err != nil {
			t.Fatal(err)
		}
	}
	h1 := e.as(auth.Identity{Name: auth.HostPrefix + "host1", Role: auth.RoleAgent})
	h2 := e.as(auth.Identity{Name: auth.HostPrefix + "host2", Role: auth.RoleAgent})
	before, rev := e.snapshot()
	code, out := h1.do("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host1", PublicKey: wgKey(1), Endpoint: "192.0.2.1:51820"})
	if code != http.StatusForbidden || !strings.Contains(out, "host") {
		t.Errorf("the removed host publishes: %d %q, want 403 naming host", code, out)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Errorf("the removed host's publication changed etcd (revision %d → %d)", rev, rev2)
	}
	h2.ok("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "host2", PublicKey: wgKey(2), Endpoint: "192.0.2.2:51820"}, nil)
	// Another spelling of the removed host (a certificate of "HOST1"): its record would
	// be host1's, and is refused alike.
	h1c := e.as(auth.Identity{Name: auth.HostPrefix + "HOST1", Role: auth.RoleAgent})
	before, rev = e.snapshot()
	code, out = h1c.do("POST", "/plugin/publishWireGuard", model.WireGuardHost{Host: "HOST1", PublicKey: wgKey(3), Endpoint: "192.0.2.3:51820"})
	if code != http.StatusForbidden || !strings.Contains(out, "host") {
		t.Errorf("the removed host publishes under another spelling: %d %q, want 403 naming host", code, out)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Errorf("the other spelling's publication changed etcd (revision %d → %d)", rev, rev2)
	}
}

// TestGlobalEncryption (issue 38, the cluster-wide setting): the global object takes
// "encryption" (none by default, wireguard) and passes it to the global config netplugins
// read; another value is 400 naming the field; an update without the field (what Contiv's
// netctl posts: its struct has none) keeps it, as does a netmaster restart.
func TestGlobalEncryption(t *testing.T) {
	e := newEnv(t, "bridge")
	const body = `{"name":"global","vlans":"1-4094","vxlans":"1-10000","pvtSubnet":"172.19.0.0/16","fwdMode":"bridge"`
	config := func() string {
		t.Helper()
		var gc model.GlobConfig
		if err := e.m.store.Get(context.Background(), model.GlobConfigKey, &gc); err != nil {
			t.Fatal(err)
		}
		var g model.Global
		e.ok("GET", "/api/v1/globals/global/", nil, &g)
		return g.Encryption + " " + clusterenc.Of(gc)
	}
	// The agents' record keeps Contiv's bytes while encryption is off (TestBootstrapState).
	if got := config(); got != "none none" {
		t.Fatalf("at start: %q", got)
	}
	e.ok("POST", "/api/v1/globals/global/", body+`,"encryption":"wireguard"}`, nil)
	if got := config(); got != "wireguard wireguard" {
		t.Fatalf("set to wireguard: %q", got)
	}
	e.ok("POST", "/api/v1/globals/global/", strings.Replace(body, "1-4094", "1-3000", 1)+"}", nil) // (Contiv's netctl global set -v)
	if got := config(); got != "wireguard wireguard" {
		t.Fatalf("an update without the field: %q", got)
	}
	if code, out := e.do("POST", "/api/v1/globals/global/", body+`,"encryption":"WireGuard"}`); code == http.StatusOK || !strings.Contains(out, "encryption") {
		t.Errorf("encryption WireGuard: %d %q, want refused naming encryption", code, out)
	}
	e.ok("POST", "/api/v1/globals/global/", body+`,"encryption":"none"}`, nil)
	if got := config(); got != "none none" {
		t.Fatalf("set to none: %q", got)
	}
	if raw := e.rawGet(model.GlobConfigKey); strings.Contains(raw, "encryption") {
		t.Errorf("set to none: the agents' record %s names encryption (Contiv's bytes while off)", raw)
	}
}
