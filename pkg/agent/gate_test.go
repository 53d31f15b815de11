package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/httpserve"
)

// gateTokens writes a token file with one token per role and returns its authenticator.
func gateTokens(t *testing.T) auth.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	lines := "admin-token-0123456789 admin ops\n" +
		"reader-token-0123456789 read-only dash\n" +
		"tenant-token-0123456789 tenant-admin:t1 alice\n" +
		"agent-token-0123456789 agent h2\n" +
		"peer-token-0123456789 netmaster nm1\n"
	if err := os.WriteFile(p, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	toks, err := auth.LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	return auth.Config{Tokens: toks}
}

// gatedRoutes lists every route the inspect API serves (method, path with variables filled
// in), read from the router so that a route added later is covered too.
func gatedRoutes(t *testing.T, a *Agent) [][2]string {
	t.Helper()
	r := mux.NewRouter()
	a.routes(r, prometheus.NewRegistry())
	var out [][2]string
	err := r.Walk(func(rt *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := rt.GetPathTemplate()
		if err != nil {
			return nil // a prefix without a template
		}
		path := strings.NewReplacer("{kind}", "ct", "{id}", "x").Replace(tpl)
		methods, err := rt.GetMethods()
		if err != nil {
			methods = []string{http.MethodGet}
		}
		for _, m := range methods {
			out = append(out, [2]string{m, path})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 15 {
		t.Fatalf("walked %d routes: %v", len(out), out)
	}
	return out
}

// TestInspectGate: every route of the inspect API but /healthz, /metrics and the debug
// route (its own token) answers 401 without credentials, also without a token file (the
// default), 403 to tenant-admins and agents, reads to read-only callers and everything to
// admins; --inspect-insecure serves all. Other spellings of the open paths are gated.
func TestInspectGate(t *testing.T) {
	newAgent := func(c Config) *Agent {
		d := &extDriver{}
		c.Driver, c.Host, c.Pprof = d, "h", true
		return &Agent{cfg: c, driver: d, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(), rec: newRecords(),
			errs: map[string]error{}, applied: dataplane.NewIndex(), bad: map[string]error{}}
	}
	toks := gateTokens(t)
	closed := newAgent(Config{})
	gated := newAgent(Config{InspectAuth: toks})
	open := newAgent(Config{InspectOpen: true})
	send := func(_ *Agent, h http.Handler, method, path, token string) int {
		req := httptest.NewRequest(method, path, strings.NewReader("{}"))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	// The gate in front of a stand-in for the routes: what passes it answers 200.
	served := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	hc, hg, ho := closed.gate(served), gated.gate(served), open.gate(served)
	if code := send(closed, closed.Handler(prometheus.NewRegistry(), nil), http.MethodGet, "/inspect/agent", ""); code != http.StatusUnauthorized {
		t.Errorf("Handler: GET /inspect/agent without credentials: %d, want 401 (the gate in front)", code)
	}
	for _, rt := range gatedRoutes(t, gated) {
		method, path := rt[0], rt[1]
		if path == "/healthz" || path == "/livez" || path == "/metrics" {
			for _, h := range []http.Handler{hc, hg} {
				if code := send(gated, h, method, path, ""); code != http.StatusOK {
					t.Errorf("%s %s without credentials: %d, want it served", method, path, code)
				}
			}
			continue
		}
		if strings.HasPrefix(path, "/debug/reclaimEndpoint/") {
			// Checks its own token (TestDebugRoutesNeedToken).
			if code := send(gated, hc, method, path, ""); code != http.StatusOK {
				t.Errorf("%s %s: %d, want it passed to the route", method, path, code)
			}
			continue
		}
		read := method == http.MethodGet && !strings.HasPrefix(path, "/debug/")
		for _, c := range []struct {
			h     http.Handler
			token string
			ok    bool
			code  int
		}{
			{hc, "", false, http.StatusUnauthorized},
			{hc, "admin-token-0123456789", false, http.StatusUnauthorized},
			{hg, "", false, http.StatusUnauthorized},
			{hg, "wrong-token-0123456789", false, http.StatusUnauthorized},
			{hg, "tenant-token-0123456789", false, http.StatusForbidden},
			{hg, "agent-token-0123456789", false, http.StatusForbidden},
			{hg, "peer-token-0123456789", false, http.StatusForbidden},
			{hg, "reader-token-0123456789", read, http.StatusForbidden},
			{hg, "admin-token-0123456789", true, 0},
			{ho, "", true, 0},
		} {
			code := send(gated, c.h, method, path, c.token)
			if c.ok && code != http.StatusOK {
				t.Errorf("%s %s token %q: %d, want it served", method, path, c.token, code)
			}
			if !c.ok && code != c.code {
				t.Errorf("%s %s token %q: %d, want %d", method, path, c.token, code, c.code)
			}
		}
	}
	for _, p := range []string{"/healthz/", "//metrics", "/healthz/../inspect/agent", "/metrics/../inspect/endpoints",
		"/debug/reclaimEndpoint/../../inspect/agent", "/inspect/agent?x=/healthz", "/debug/pprof/goroutine"} {
		if code := send(gated, hg, http.MethodGet, p, ""); code != http.StatusUnauthorized {
			t.Errorf("GET %s without credentials: %d, want 401", p, code)
		}
	}
}

// TestInspectGateRefusesForwarded (found by review): a netmaster token with a forwarded
// identity header is not an admin of the inspect API (netmaster forwards to netmasters).
func TestInspectGateRefusesForwarded(t *testing.T) {
	a := &Agent{cfg: Config{InspectAuth: gateTokens(t)}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := a.gate(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	req := httptest.NewRequest(http.MethodGet, "/inspect/agent", nil)
	req.Header.Set("Authorization", "Bearer peer-token-0123456789")
	req.Header.Set(auth.ForwardedIdentityHeader, `{"name":"x","role":"admin","via":"token"}`)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden {
		t.Errorf("forwarded admin through a netmaster token: %d %s, want 403", rec.Code, rec.Body)
	}
}

// TestInspectBodyAfterGate (found by review): no request body is read before the gate:
// a caller without credentials announcing a large body and trickling it is answered 401
// at once, and many such callers do not take the body budget an admin's trace needs.
func TestInspectBodyAfterGate(t *testing.T) {
	d := &extDriver{}
	a := &Agent{cfg: Config{Driver: d, Host: "h", InspectAuth: gateTokens(t)}, driver: d, metrics: newMetrics(), rec: newRecords(),
		errs: map[string]error{}, applied: dataplane.NewIndex(), bad: map[string]error{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	srv := httpserve.New(httpserve.Limits{MaxConns: 64, CallerOf: auth.CallerOf, Logger: a.log},
		func(bodyFirst func(http.Handler) http.Handler) http.Handler {
			return a.Handler(prometheus.NewRegistry(), bodyFirst)
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.HTTP.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 12; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST /inspect/trace HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", 1<<20, strings.Repeat(" ", 4096))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		status, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(status, " 401 ") {
			t.Fatalf("stalled body without credentials %d: %q, %v; want 401 before the body", i, status, err)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/inspect/trace", strings.NewReader(`{"from":"x","to":"10.0.0.1"}`))
	req.Header.Set("Authorization", "Bearer admin-token-0123456789")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusUnauthorized {
		t.Errorf("admin trace while unauthenticated callers stall bodies: %s", resp.Status)
	}
}

// TestHealthzNamesOnlyToCallers (found by review): an unhealthy agent's /healthz names the
// failing objects (tenants, networks, addresses) only to a caller the gate accepts;
// anyone else gets their count by kind.
func TestHealthzNamesOnlyToCallers(t *testing.T) {
	d := &extDriver{}
	a := &Agent{cfg: Config{Driver: d, Host: "h", InspectAuth: gateTokens(t)}, driver: d, metrics: newMetrics(), rec: newRecords(),
		errs:    map[string]error{"network/prod-db.acme-bank": errors.New("vlan network (tag 42) needs a VLAN uplink")},
		applied: dataplane.NewIndex(), bad: map[string]error{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := a.Handler(prometheus.NewRegistry(), nil)
	get := func(token string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, tok := range []string{"", "wrong-token-0123456789", "tenant-token-0123456789"} {
		if code, body := get(tok); code != http.StatusServiceUnavailable || strings.Contains(body, "acme") || !strings.Contains(body, `"network": 1`) {
			t.Errorf("/healthz with token %q: %d %s; want 503 with counts only", tok, code, body)
		}
	}
	if code, body := get("reader-token-0123456789"); code != http.StatusServiceUnavailable || !strings.Contains(body, "prod-db.acme-bank") {
		t.Errorf("/healthz for a reader: %d %s; want the failing objects", code, body)
	}
}

// degradedEncryption is an EncryptionHealth reporting msg.
type degradedEncryption string

func (d degradedEncryption) Degraded() string { return string(d) }

// TestHealthzEncryptionDegraded: a peer host waiting for its WireGuard key (its overlay
// traffic dropped, fail closed) is said in /healthz; with none waiting it reads "ok".
func TestHealthzEncryptionDegraded(t *testing.T) {
	d := &extDriver{}
	a := &Agent{cfg: Config{Driver: d, Host: "h"}, driver: d, metrics: newMetrics(), rec: newRecords(), synced: true,
		errs: map[string]error{}, applied: dataplane.NewIndex(), bad: map[string]error{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		a.Handler(prometheus.NewRegistry(), nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	a.cfg.Encryption = degradedEncryption("wireguard: 1 peer host(s) without a published key")
	if code, body := get(); code != http.StatusOK || !strings.HasPrefix(body, "degraded: wireguard: 1 peer host") {
		t.Errorf("/healthz with a peer waiting for its key: %d %q", code, body)
	}
	a.cfg.Encryption = degradedEncryption("")
	if code, body := get(); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz with every peer keyed: %d %q", code, body)
	}
}

// TestLivezIgnoresFailingObjects: /livez (netplugin's liveness probe) answers 200 to
// anyone while objects fail, /healthz still 503. Before, the probe was /healthz: a pod
// owner setting kubernetes.io/egress-bandwidth to "lots" on their own pod failed its
// endpoint, the kubelet restarted netplugin after three probes, and the restarted agent
// read the same annotation again: the node's agent in a restart loop, no pod attached
// meanwhile. A restart fixes none of the objects /healthz reports.
func TestLivezIgnoresFailingObjects(t *testing.T) {
	d := &extDriver{}
	a := &Agent{cfg: Config{Driver: d, Host: "h", InspectAuth: gateTokens(t)}, driver: d, metrics: newMetrics(), rec: newRecords(), synced: true,
		errs:    map[string]error{"endpoint/n.t-web": errors.New(`pod prod/web: annotation kubernetes.io/egress-bandwidth: "lots" is not a quantity`)},
		applied: dataplane.NewIndex(), bad: map[string]error{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := a.Handler(prometheus.NewRegistry(), nil)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz with a failing endpoint: %d %s; want 503", code, body)
	}
	if code, body := get("/livez"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/livez with a failing endpoint: %d %q; want 200 ok (no token needed)", code, body)
	}
}
