package auth

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestLoadTokens: the token file's format, roles and permissions are checked with errors
// that name the line; tokens authenticate via Authorization and X-Auth-Token.
func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(body string, mode os.FileMode) string {
		p := filepath.Join(dir, "tokens")
		os.Remove(p)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for body, want := range map[string]string{
		"short admin\n":                                    "shorter than 16",
		"0123456789abcdef root\n":                          "unknown role",
		"0123456789abcdef tenant-admin:\n":                 "unknown role",
		"0123456789abcdef admin a b\n":                     "line 1",
		"# only a comment\n":                               "no tokens",
		"0123456789abcdef admin\n0123456789abcdef agent\n": "repeated",
	} {
		if _, err := LoadTokens(write(body, 0o600)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	if _, err := LoadTokens(write("0123456789abcdef admin\n", 0o644)); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable file: %v", err)
	}
	tk, err := LoadTokens(write("0123456789abcdef admin alice # ops\nfedcba9876543210 tenant-admin:t1 bob\n", 0o600))
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Tokens: tk}
	r := httptest.NewRequest("GET", "/api/v1/networks/", nil)
	r.Header.Set("X-Auth-Token", "fedcba9876543210")
	if id, err := c.Authenticate(r); err != nil || id.Name != "bob" || id.Role != "tenant-admin:t1" {
		t.Errorf("X-Auth-Token: %+v %v", id, err)
	}
	r.Header.Set("Authorization", "Basic YTpi")
	if _, err := c.Authenticate(r); err == nil {
		t.Error("Basic auth accepted")
	}
	r = httptest.NewRequest("GET", "/", nil)
	if _, err := c.Authenticate(r); err == nil {
		t.Error("no credentials accepted")
	}
	// The scheme is case-insensitive (RFC 9110); an empty token is no credential.
	for h, ok := range map[string]bool{"Bearer 0123456789abcdef": true, "bearer 0123456789abcdef": true,
		"BEARER  0123456789abcdef ": true, "Bearer ": false, "Bearer": false, "Bearerx 0123456789abcdef": false} {
		r.Header.Set("Authorization", h)
		if id, err := (Config{Tokens: tk, Open: true}).Authenticate(r); (err == nil && id.Name == "alice") != ok {
			t.Errorf("Authorization %q: %+v %v, want accepted %v", h, id, err, ok)
		}
	}
}

// authCase is one Authorize decision: ok when id may send method to path.
type authCase struct {
	id           Identity
	method, path string
	ok           bool
}

func checkAuthorize(t *testing.T, cases []authCase) {
	t.Helper()
	for _, c := range cases {
		if err := Authorize(c.id, c.method, c.path); (err == nil) != c.ok {
			t.Errorf("%s %s %s: %v, want ok=%v", c.id.Role, c.method, c.path, err, c.ok)
		}
	}
}

func TestAuthorize(t *testing.T) {
	t1 := Identity{Name: "bob", Role: "tenant-admin:t1"}
	checkAuthorize(t, []authCase{
		{t1, "POST", "/api/v1/networks/t1:n/", true},
		{t1, "POST", "/api/v1/networks/t10:n/", false},
		{t1, "POST", "/api/v1/rules/t1:p:r1/", true},
		{t1, "GET", "/api/v1/inspect/networks/t2:n/", false},
		{t1, "GET", "/api/v1/tenants/t1/", true},
		{t1, "DELETE", "/api/v1/tenants/t1/", false},
		{t1, "GET", "/api/v1/globals/global/", true},
		{t1, "POST", "/api/v1/globals/global/", false},
		{t1, "GET", "/api/v1/inspect/endpoints/abc/", false},
		{t1, "POST", "/plugin/createEndpoint", false},
		{Identity{Role: RoleAgent}, "POST", "/plugin/createEndpoint", true},
		{Identity{Role: RoleAgent}, "POST", "/api/v1/policys/t1:p/", false},
		{Identity{Role: RoleReadOnly}, "DELETE", "/api/v1/networks/t1:n/", false},
		{Identity{Role: RoleNetmaster}, "POST", "/api/v1/networks/t1:n/", false},
	})
}

// TestTokensReload (control plane issue, item 7): a token removed from the file stops
// working on Reload, and on Watch's next look at a changed file; a file that does not
// parse is refused and the tokens read before stay.
func TestTokensReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	write := func(body string) {
		t.Helper()
		tmp := p + ".new"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	}
	write("0123456789abcdef admin alice\nfedcba9876543210 read-only ro\n")
	tk, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	works := func(tok string) bool {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		_, err := Config{Tokens: tk}.Authenticate(r)
		return err == nil
	}
	if !works("fedcba9876543210") {
		t.Fatal("setup: read-only token refused")
	}
	write("0123456789abcdef admin alice\n")
	if err := tk.Reload(); err != nil {
		t.Fatal(err)
	}
	if works("fedcba9876543210") || !works("0123456789abcdef") {
		t.Error("after Reload: the revoked token works or the kept one does not")
	}
	// A file that cannot be taken revokes everything (found by review: deleting or
	// emptying the file to revoke a leaked token kept it working).
	write("garbage\n")
	if err := tk.Reload(); err == nil || works("0123456789abcdef") {
		t.Errorf("a broken file: %v; no token may work", err)
	}
	write("0123456789abcdef admin alice\n")
	if err := tk.Reload(); err != nil || !works("0123456789abcdef") {
		t.Fatalf("fixed file: %v", err)
	}
	for _, broken := range []func(){
		func() { write("") },
		func() { write("# nothing\n") },
		func() { write("short admin x\n0123456789abcdef admin alice\n") },
		func() {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		},
	} {
		broken()
		if err := tk.Reload(); err == nil || works("0123456789abcdef") {
			t.Errorf("file emptied, commented out, broken or deleted: %v; no token may work", err)
		}
		write("0123456789abcdef admin alice\n")
		if err := tk.Reload(); err != nil || !works("0123456789abcdef") {
			t.Fatalf("fixed file: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tk.Watch(ctx, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	write("aaaaaaaaaaaaaaaa admin carol\n")
	deadline := time.Now().Add(5 * time.Second)
	for works("0123456789abcdef") || !works("aaaaaaaaaaaaaaaa") {
		if time.Now().After(deadline) {
			t.Fatal("Watch did not take the changed file")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchTakesAChmodFix (found by review): a file refused for its mode (no token works
// meanwhile) and then fixed with chmod 600 (same contents, size and inode) is reloaded:
// the kept token works again, the revoked one does not.
func TestWatchTakesAChmodFix(t *testing.T) {
	tk, p := loadTokenFile(t, "0123456789abcdef admin alice\nleakedleakedleaked admin bob\n")
	works := func(tok string) bool {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		_, err := Config{Tokens: tk}.Authenticate(r)
		return err == nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tk.Watch(ctx, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	tmp := p + ".new"
	if err := os.WriteFile(tmp, []byte("0123456789abcdef admin alice\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o644)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if works("leakedleakedleaked") || works("0123456789abcdef") {
		t.Fatal("a 0644 file: a token works (a file that cannot be taken revokes every token)")
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for works("leakedleakedleaked") || !works("0123456789abcdef") {
		if time.Now().After(deadline) {
			t.Fatal("the file was fixed with chmod 600 but Watch never took it: the revoked token still works")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBoundHost: an agent identity named host:<host> is bound to that host; any other name,
// an empty host or another role is not.
func TestBoundHost(t *testing.T) {
	for _, c := range []struct {
		id   Identity
		host string
		ok   bool
	}{
		{Identity{Name: "host:h1", Role: RoleAgent}, "h1", true},
		{Identity{Name: "agents", Role: RoleAgent}, "", false},
		{Identity{Name: "host:", Role: RoleAgent}, "", false},
		{Identity{Name: "host:h1", Role: RoleAdmin}, "", false},
		{Identity{Name: "h1", Role: RoleAgent}, "", false},
	} {
		if h, ok := c.id.BoundHost(); h != c.host || ok != c.ok {
			t.Errorf("%+v: BoundHost() = %q, %v; want %q, %v", c.id, h, ok, c.host, c.ok)
		}
	}
	// A name that looks like a binding but is none is refused, not left unconfined
	// (found by review: "Host:h3" kept every right).
	for _, name := range []string{"Host:h3", "HOST:h3", "host:"} {
		p := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(p, []byte("agent-token-0123456789 agent "+name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTokens(p); err == nil || !strings.Contains(err.Error(), "host binding") {
			t.Errorf("agent named %q: %v, want refused", name, err)
		}
	}
}

// TestAuthorizeReadIsolation (issue 34, item 4): outside /api/v1 a tenant-admin reads
// /version, /services and its own /service/<name>:<tenant> only; /info and /agents (host
// addresses), /metrics (every tenant's networks), another tenant's service, a malformed
// service id and any other path are refused by the path alone (403 whether the object
// exists or not). The host collection (Bgps: router addresses, every tenant's routes) is
// neither readable nor listed for it. The other roles read all of it.
func TestAuthorizeReadIsolation(t *testing.T) {
	t1 := Identity{Name: "bob", Role: "tenant-admin:t1"}
	for _, c := range []struct {
		path string
		ok   bool
	}{
		{"/version", true},
		{"/services", true},
		{"/service/web:t1", true},
		{"/service/a:b:t1", true},
		{"/service/web:t2", false},
		{"/service/web:t10", false},
		{"/service/web", false},
		{"/service/", false},
		{"/services/", false},
		{"/info", false},
		{"/agents", false},
		{"/metrics", false},
		{"/debug/pprof/", false},
		{"/", false},
		{"/api/v1/Bgps/h1/", false},
		{"/api/v1/Bgps/t1:h1/", false},
		{"/api/v1/inspect/Bgps/h1/", false},
		{"/api/v1/Bgps/", true}, // (listed empty: Visible)
		{"/api/v1/aciGws/aciGw/", true},
		{"/api/v1/inspect/globals/global/", true},
		{"/api/v1/endpoints/", false},
	} {
		for _, method := range []string{"GET", "HEAD"} {
			if err := Authorize(t1, method, c.path); (err == nil) != c.ok {
				t.Errorf("tenant-admin %s %s: %v, want ok=%v", method, c.path, err, c.ok)
			} else if err != nil && !strings.Contains(err.Error(), c.path) {
				t.Errorf("tenant-admin %s %s: refusal without the path: %v", method, c.path, err)
			}
		}
	}
	for _, role := range []string{RoleAdmin, RoleReadOnly, RoleAgent, RoleNetmaster} {
		for _, path := range []string{"/info", "/agents", "/metrics", "/services", "/service/web:t2", "/api/v1/inspect/Bgps/h1/"} {
			if err := Authorize(Identity{Name: "x", Role: role}, "GET", path); err != nil {
				t.Errorf("%s GET %s: %v", role, path, err)
			}
		}
	}
	for _, c := range []struct {
		coll, key string
		ok        bool
	}{
		{"networks", "t1:n", true},
		{"networks", "t2:n", false},
		{"tenants", "t1", true},
		{"tenants", "t2", false},
		{"globals", "global", true},
		{"aciGws", "aciGw", true},
		{"Bgps", "h1", false},
		{"Bgps", "t1:h1", false},
	} {
		if got := Visible(c.coll, c.key, "t1"); got != c.ok {
			t.Errorf("Visible(%s, %s, t1) = %v, want %v", c.coll, c.key, got, c.ok)
		}
	}
}

// TestTenantScope: a request's scope comes from its identity; none means not scoped.
func TestTenantScope(t *testing.T) {
	ctx := context.Background()
	if tn, scoped := TenantScope(ctx); scoped || tn != "" {
		t.Errorf("no identity: %q %v", tn, scoped)
	}
	if _, scoped := TenantScope(WithIdentity(ctx, Identity{Role: RoleReadOnly})); scoped {
		t.Error("read-only is scoped")
	}
	if tn, scoped := TenantScope(WithIdentity(ctx, Identity{Role: "tenant-admin:t1"})); !scoped || tn != "t1" {
		t.Errorf("tenant-admin: %q %v", tn, scoped)
	}
}

// TestInsecureSeesEverything: an --insecure netmaster without tokens lets every caller in
// as admin, so every route stays readable as before read isolation (docs/security.md).
func TestInsecureSeesEverything(t *testing.T) {
	id, err := Config{Open: true}.Authenticate(httptest.NewRequest("GET", "/info", nil))
	if err != nil || id.Role != RoleAdmin {
		t.Fatalf("insecure caller: %+v %v", id, err)
	}
	for _, path := range []string{"/info", "/agents", "/metrics", "/services", "/service/web:t2", "/api/v1/inspect/Bgps/h1/", "/api/v1/networks/t2:n/"} {
		if err := Authorize(id, "GET", path); err != nil {
			t.Errorf("insecure GET %s: %v", path, err)
		}
	}
}

// TestAuthorizeQuotas (issue 34, item 2): only admins set a tenant's quota; a tenant-admin
// reads its own tenant's (and the list, which netmaster filters), never another's;
// read-only, agents and peers read; nobody else writes.
func TestAuthorizeQuotas(t *testing.T) {
	t1 := Identity{Name: "bob", Role: "tenant-admin:t1"}
	checkAuthorize(t, []authCase{
		{Identity{Role: RoleAdmin}, "PUT", "/api/v1/quotas/t1/", true},
		{Identity{Role: RoleAdmin}, "DELETE", "/api/v1/quotas/t1/", true},
		{t1, "GET", "/api/v1/quotas/t1/", true},
		{t1, "GET", "/api/v1/quotas/", true},
		{t1, "GET", "/api/v1/quotas/t2/", false},
		{t1, "GET", "/api/v1/quotas/t10/", false},
		{t1, "PUT", "/api/v1/quotas/t1/", false},
		{t1, "POST", "/api/v1/quotas/t1/", false},
		{t1, "DELETE", "/api/v1/quotas/t1/", false},
		{Identity{Role: RoleReadOnly}, "GET", "/api/v1/quotas/t2/", true},
		{Identity{Role: RoleReadOnly}, "PUT", "/api/v1/quotas/t2/", false},
		{Identity{Role: RoleAgent}, "GET", "/api/v1/quotas/t2/", true},
		{Identity{Role: RoleAgent}, "PUT", "/api/v1/quotas/t2/", false},
		{Identity{Role: RoleNetmaster}, "PUT", "/api/v1/quotas/t2/", false},
	})
}

// TestAuthorizeHostScopes: only admins set hosts' scopes; agents, operators and peers read
// them; a tenant-admin neither reads nor writes one (host names are not its), whatever the
// host is called.
func TestAuthorizeHostScopes(t *testing.T) {
	t1 := Identity{Name: "bob", Role: "tenant-admin:t1"}
	checkAuthorize(t, []authCase{
		{Identity{Role: RoleAdmin}, "PUT", "/api/v1/hostScopes/h1/", true},
		{Identity{Role: RoleAdmin}, "DELETE", "/api/v1/hostScopes/h1/", true},
		{Identity{Role: RoleAgent, Name: "host:h1"}, "GET", "/api/v1/hostScopes/h1/", true},
		{Identity{Role: RoleAgent, Name: "host:h1"}, "PUT", "/api/v1/hostScopes/h1/", false},
		{Identity{Role: RoleReadOnly}, "GET", "/api/v1/hostScopes/", true},
		{Identity{Role: RoleReadOnly}, "PUT", "/api/v1/hostScopes/h1/", false},
		{Identity{Role: RoleNetmaster}, "PUT", "/api/v1/hostScopes/h1/", false},
		{t1, "GET", "/api/v1/hostScopes/t1/", false},
		{t1, "GET", "/api/v1/hostScopes/t1:x/", false},
		{t1, "PUT", "/api/v1/hostScopes/t1:x/", false},
		{t1, "PUT", "/api/v1/hostScopes/t1/", false},
		{t1, "DELETE", "/api/v1/hostScopes/t1:h1/", false},
	})
}

// TestAuthorizePrefilters (issue 36): only admins set or drop deny list entries; agents
// (which apply them), operators and peers read them; a tenant-admin neither reads nor
// writes one (they name hosts and the prefixes an operator distrusts), whatever the entry
// is called. Its list of the collection is let through and answered empty by netmaster.
func TestAuthorizePrefilters(t *testing.T) {
	t1 := Identity{Name: "bob", Role: "tenant-admin:t1"}
	checkAuthorize(t, []authCase{
		{Identity{Role: RoleAdmin}, "PUT", "/api/v1/prefilters/p1/", true},
		{Identity{Role: RoleAdmin}, "POST", "/api/v1/prefilters/p1/", true},
		{Identity{Role: RoleAdmin}, "DELETE", "/api/v1/prefilters/p1/", true},
		{Identity{Role: RoleAgent, Name: "host:h1"}, "GET", "/api/v1/prefilters/", true},
		{Identity{Role: RoleAgent, Name: "host:h1"}, "GET", "/api/v1/prefilters/p1/", true},
		{Identity{Role: RoleAgent, Name: "host:h1"}, "PUT", "/api/v1/prefilters/p1/", false},
		{Identity{Role: RoleAgent, Name: "host:h1"}, "DELETE", "/api/v1/prefilters/p1/", false},
		{Identity{Role: RoleReadOnly}, "GET", "/api/v1/prefilters/p1/", true},
		{Identity{Role: RoleReadOnly}, "POST", "/api/v1/prefilters/p1/", false},
		{Identity{Role: RoleNetmaster}, "GET", "/api/v1/prefilters/", true},
		{Identity{Role: RoleNetmaster}, "PUT", "/api/v1/prefilters/p1/", false},
		{t1, "GET", "/api/v1/prefilters/p1/", false},
		{t1, "GET", "/api/v1/prefilters/t1/", false},
		{t1, "GET", "/api/v1/prefilters/t1:p1/", false},
		{t1, "PUT", "/api/v1/prefilters/t1/", false},
		{t1, "POST", "/api/v1/prefilters/t1:p1/", false},
		{t1, "DELETE", "/api/v1/prefilters/t1:p1/", false},
	})
	if Visible("prefilters", "t1:p1", "t1") || Visible("prefilters", "t1", "t1") {
		t.Error("a deny list entry is visible to a tenant-admin")
	}
}

// TestRefusalsLoggedWithinBudget: unauthenticated requests (reads too) are logged, at most
// ten lines a second; the next line let through says how many were not logged.
func TestRefusalsLoggedWithinBudget(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	h := Middleware(Config{}, log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 50 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/api/v1/networks/", nil))
	}
	if n := strings.Count(buf.String(), "status=401"); n != 10 {
		t.Fatalf("%d of 50 refusals logged in one burst, want 10:\n%s", n, buf.String())
	}
	b := &logBudget{every: time.Second, burst: 2}
	now := time.Now()
	for range 5 {
		b.take(now)
	}
	if ok, dropped := b.take(now.Add(time.Second)); !ok || dropped != 3 {
		t.Fatalf("next period: ok %v, %d unlogged reported, want true, 3", ok, dropped)
	}
}

// TestRefusalLogsBounded (review of d94841a): the budget counts lines, but a line carries
// the caller's path, up to the server's 64 KiB of headers: ten lines a second of 64 KiB
// paths were 640 KiB of log a second from anyone who can connect. And a 403 (any token
// holder: a tenant-admin reading another tenant) was a line per request, no budget at all.
func TestRefusalLogsBounded(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, nil))
	tk, _ := loadTokenFile(t, "0123456789abcdef tenant-admin:t1 bob\n")
	h := Middleware(Config{Tokens: tk}, log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	long := "/api/v1/networks/" + strings.Repeat("x", 60<<10) + "/"
	for range 50 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", long, nil))
	}
	if n := buf.Len(); n > 10*2048 {
		t.Errorf("50 refused requests with a 60 KiB path logged %d bytes, want at most 10 lines of 2 KiB", n)
	}
	buf.Reset()
	for range 50 {
		r := httptest.NewRequest("GET", "/api/v1/tenants/t2/", nil)
		r.Header.Set("Authorization", "Bearer 0123456789abcdef")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusForbidden {
			t.Fatalf("tenant-admin of t1 reading t2: %d, want 403", w.Code)
		}
	}
	if n := strings.Count(buf.String(), "status=403"); n > 10 {
		t.Errorf("%d of 50 forbidden requests in one burst logged, want at most 10", n)
	}
}

// loadTokenFile writes body to a token file (mode 0600) and loads it.
func loadTokenFile(t *testing.T, body string) (*Tokens, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	return tk, p
}

// TestBearerToken: the scheme in any case, spaces around, never an empty token or another
// scheme (netplugin's debug routes parse it the same way as netmaster).
func TestBearerToken(t *testing.T) {
	for h, want := range map[string]string{"Bearer abc": "abc", "bearer abc": "abc", " BEARER  abc ": "abc",
		"Bearer ": "", "Bearer": "", "Basic abc": "", "Bearerabc": ""} {
		if tok, ok := BearerToken(h); tok != want && ok || ok != (want != "") {
			t.Errorf("%q: %q %v, want %q", h, tok, ok, want)
		}
	}
}

// TestTokenFileOwner: a token file owned by another user (who could rewrite it into an
// admin token) is refused like a readable one.
func TestTokenFileOwner(t *testing.T) {
	testroot.Need(t)
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte("0123456789abcdef admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokens(p); err != nil {
		t.Fatalf("a root-owned token file: %v", err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokens(p); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("file owned by another user: %v", err)
	}
}

// TestBoundHostsRemovalConfirmed: etcd RBAC deletes the etcd user, role and WireGuard
// record of a host whose token leaves the file (BoundHosts). A file rewritten in place is
// read cut at a line boundary now and then: a host then missing must not count as removed
// until a reading at least one poll later still lacks it; a host added counts at once.
func TestBoundHostsRemovalConfirmed(t *testing.T) {
	const every = 150 * time.Millisecond
	p := filepath.Join(t.TempDir(), "tokens")
	lines := "0123456789abcdef admin alice\n1111111111111111 agent host:h1\n2222222222222222 agent host:h2\n"
	if err := os.WriteFile(p, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	tk.every = every
	bound := func(want string, wantTaken bool, what string) {
		t.Helper()
		hosts, taken := tk.BoundHosts()
		if got := strings.Join(hosts, ","); got != want || taken != wantTaken {
			t.Errorf("%s: BoundHosts %q, removals %v; want %q, %v", what, got, taken, want, wantTaken)
		}
	}
	bound("h1,h2", false, "first reading (a file cut while netmaster starts removes nothing)")
	time.Sleep(every)
	bound("h1,h2", true, "a reading one poll later agrees")

	// Rewritten in place in two steps: the first leaves it cut after h1's line.
	cut := strings.Index(lines, "2222")
	if err := os.WriteFile(p, []byte(lines[:cut]), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tk.Reload(); err != nil {
		t.Fatal(err)
	}
	bound("h1,h2", true, "file cut after h1's line")
	if err := os.WriteFile(p, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(every)
	bound("h1,h2", true, "file whole again one poll later")

	// A real removal (the file stays without h2) counts one poll later; an addition at once.
	if err := os.WriteFile(p, []byte(lines[:cut]+"3333333333333333 agent host:h3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tk.Reload(); err != nil {
		t.Fatal(err)
	}
	bound("h1,h2,h3", true, "h2 removed, h3 added")
	time.Sleep(every)
	bound("h1,h3", true, "h2 still gone one poll later")
	if _, ok := tk.lookup("2222222222222222"); ok {
		t.Error("h2's token works after it left the file")
	}
}

// TestTokenLineCutHeldBack: a token file read while it is written in place may end inside
// a line that still parses: "tenant-admin:t10 bob" cut to "tenant-admin:t1" (another
// tenant), "agent host:node10" to "agent host:node1" (another host) or to "agent" (an agent
// bound to no host). A last line without its newline counts only once a reading at least
// one poll later finds the file the same (a file written without a final newline then
// works), and Watch reads it again for that.
func TestTokenLineCutHeldBack(t *testing.T) {
	const every = 100 * time.Millisecond
	p := filepath.Join(t.TempDir(), "tokens")
	admin := "0123456789abcdef admin alice\n"
	for _, line := range []string{"1111111111111111 tenant-admin:t10 bob\n", "1111111111111111 agent host:node10\n"} {
		if err := os.WriteFile(p, []byte(admin+line), 0o600); err != nil {
			t.Fatal(err)
		}
		tk, err := LoadTokens(p)
		if err != nil {
			t.Fatal(err)
		}
		tk.every = every
		want, _ := tk.lookup("1111111111111111")
		for cut := len(line) - 1; cut > 17; cut-- {
			if err := os.WriteFile(p, []byte(admin+line[:cut]), 0o600); err != nil {
				t.Fatal(err)
			}
			_ = tk.Reload()
			if id, ok := tk.lookup("1111111111111111"); ok && id != want {
				t.Errorf("file cut to %q: the token is %+v (was %+v)", line[:cut], id, want)
			}
		}
	}

	// Written without a final newline on purpose: the last token works a poll later.
	if err := os.WriteFile(p, []byte(admin+"2222222222222222 read-only carol"), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	tk.every = every
	if _, ok := tk.lookup("0123456789abcdef"); !ok {
		t.Error("the lines before the unterminated one do not work")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tk.Watch(ctx, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if id, ok := tk.lookup("2222222222222222"); ok && id.Name == "carol" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a file without a final newline: its last token never works")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
