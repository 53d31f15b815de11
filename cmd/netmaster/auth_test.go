package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// TestAPIAuth runs two netmasters with HTTPS, tokens and client certificates on one etcd
// and checks every role against representative routes, through the leader and through the
// follower (which forwards the caller's identity): no credentials → 401, wrong role →
// 403, both with a message, and a refused request never changes etcd.
func TestAPIAuth(t *testing.T) {
	const tT1 = "t1-admin-token-0123456789"
	sec := newSecureEnv(t, fmt.Sprintf("# test tokens\n%s admin alice\n%s read-only ro\n%s agent host1\n%s tenant-admin:t1 bob\n%s netmaster peers\n",
		tAdmin, tRO, tAgent, tT1, tPeer))
	ca, caPath, tokens := sec.ca, sec.caPath, sec.tokens
	other, _ := pki.NewCA("other-ca")
	issue := sec.issue

	etcdURL := statetest.Etcd(t)
	ps := sec.start(t, etcdURL, "nm-a", "nm-b")
	admin := sec.client(t, tAdmin)
	leader, follower := secureLeader(t, admin, ps)
	admin.must(t, "POST", leader.url+"/api/v1/globals/global/", `{"name":"global","networkInfraType":"default","vlans":"1-4094","vxlans":"1-10000","fwdMode":"routing","arpMode":"proxy","pvtSubnet":"172.19.0.0/16"}`, 200)
	for _, tn := range []string{"t1", "t2"} {
		admin.must(t, "POST", leader.url+"/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, 200)
	}
	netBody := func(tn, n, sub string) string {
		return `{"tenantName":"` + tn + `","networkName":"` + n + `","encap":"vxlan","subnet":"` + sub + `"}`
	}
	admin.must(t, "POST", leader.url+"/api/v1/networks/t2:n2/", netBody("t2", "n2", "10.9.2.0/24"), 200)

	rev := etcdRevision(t, etcdURL)

	type caller struct {
		name string
		c    *apiClient
	}
	callers := []caller{
		{"none", sec.client(t, "")},
		{"bad-token", sec.client(t, "not-a-real-token-at-all")},
		{"admin-token", admin},
		{"read-only-token", sec.client(t, tRO)},
		{"agent-token", sec.client(t, tAgent)},
		{"t1-token", sec.client(t, tT1)},
		{"admin-cert", client(t, issue("carol", "admin", ca, 0), "")},
		{"t1-cert", client(t, issue("dave", "tenant-admin:t1", ca, 0), "")},
	}
	type route struct {
		name, method, path, body string
	}
	routes := []route{
		{"list networks", "GET", "/api/v1/networks/", ""},
		{"get t2 network", "GET", "/api/v1/networks/t2:n2/", ""},
		{"create t1 network", "POST", "/api/v1/networks/t1:n%d/", "t1"},
		{"create t2 network", "POST", "/api/v1/networks/t2:x%d/", "t2"},
		{"delete t2 network", "DELETE", "/api/v1/networks/t2:nosuch/", ""},
		{"create tenant", "POST", "/api/v1/tenants/t%d/", "tenant"},
		{"set global", "POST", "/api/v1/globals/global/", "global"},
		{"plugin alloc", "POST", "/plugin/allocAddress", `{"NetworkID":"n2.t2"}`},
		{"version", "GET", "/version", ""},
	}
	// want: status per caller for each route (2xx collapsed to 200; 404/409/500 from the
	// API itself mean "allowed").
	want := map[string][]int{
		//                  none bad  admin ro   agent t1tok admcrt t1crt
		"list networks":     {401, 401, 200, 200, 200, 200, 200, 200},
		"get t2 network":    {401, 401, 200, 200, 200, 403, 200, 403},
		"create t1 network": {401, 401, 200, 403, 200, 200, 200, 200},
		"create t2 network": {401, 401, 200, 403, 200, 403, 200, 403},
		"delete t2 network": {401, 401, 404, 403, 404, 403, 404, 403},
		"create tenant":     {401, 401, 200, 403, 403, 403, 200, 403},
		"set global":        {401, 401, 200, 403, 403, 403, 200, 403},
		"plugin alloc":      {401, 401, 200, 403, 200, 403, 200, 403},
		"version":           {401, 401, 200, 200, 200, 200, 200, 200},
	}
	n := 0
	for _, via := range []*proc{leader, follower} {
		for _, r := range routes {
			for i, c := range callers {
				n++
				body := r.body
				path := r.path
				if strings.Contains(path, "%d") {
					path = fmt.Sprintf(path, n)
				}
				switch r.body {
				case "t1":
					body = netBody("t1", fmt.Sprintf("n%d", n), fmt.Sprintf("10.%d.%d.0/24", 100+n/250, n%250))
				case "t2":
					body = netBody("t2", fmt.Sprintf("x%d", n), fmt.Sprintf("10.%d.%d.0/24", 150+n/250, n%250))
				case "tenant":
					body = fmt.Sprintf(`{"tenantName":"t%d"}`, n)
				case "global":
					body = `{"name":"global","networkInfraType":"default","vlans":"1-4094","vxlans":"1-10000","fwdMode":"routing","arpMode":"proxy","pvtSubnet":"172.19.0.0/16"}`
				}
				before := rev()
				st, out := c.c.call(t, r.method, via.url+path, body)
				if st == 409 && r.name == "set global" {
					st = 200 // allowed; the global object is already set
				}
				if w := want[r.name][i]; st != w {
					t.Errorf("%s via %s as %s: %d %q, want %d", r.name, via.name, c.name, st, out, w)
				}
				if (st == 401 || st == 403) && (!strings.Contains(out, "unauthorized") && !strings.Contains(out, "forbidden")) {
					t.Errorf("%s as %s: refusal without a message: %q", r.name, c.name, out)
				}
				if (st == 401 || st == 403) && rev() != before {
					t.Errorf("%s as %s: refused but etcd changed", r.name, c.name)
				}
			}
		}
	}

	// Certificates that must not get in at all: an expired one fails the handshake; an
	// untrusted one is either refused in the handshake or (Go's client offers only
	// certificates of the CAs the server names) not sent at all, which is a 401.
	for name, f := range map[string]tlsconf.Files{
		"untrusted": issue("mallory", "admin", other, 0),
		"expired":   issue("old", "admin", ca, -time.Hour),
	} {
		if st, out := client(t, f, "").call(t, "GET", leader.url+"/api/v1/tenants/", ""); st != -1 && st != 401 {
			t.Errorf("%s certificate: %d %q, want a TLS failure or 401", name, st, out)
		}
	}
	// A client may not claim an identity itself: only a peer netmaster's token may.
	forged := sec.client(t, tRO)
	forged.header = map[string]string{"X-Contivbpf-Identity": `{"name":"x","role":"admin","via":"token"}`}
	if st, _ := forged.call(t, "POST", leader.url+"/api/v1/tenants/forged/", `{"tenantName":"forged"}`); st != 401 {
		t.Errorf("forged identity header: %d, want 401", st)
	}
	// Plain HTTP to the TLS listener is refused.
	resp, err := http.Get("http://" + leader.addr + "/api/v1/tenants/")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("plain HTTP to TLS: %d %s", resp.StatusCode, b)
		}
	}
	// Tenant-admins see only their tenant in lists.
	_, out := sec.client(t, tT1).call(t, "GET", leader.url+"/api/v1/networks/", "")
	if strings.Contains(out, `"t2"`) || !strings.Contains(out, `"t1"`) {
		t.Errorf("tenant-admin list shows other tenants or not its own: %s", out)
	}
	// A body is read only once its caller is known (control plane issue, memory before
	// authentication): without credentials a request announcing a megabyte and sending a
	// hundred bytes is answered 401 at once, and nothing of it is held.
	tc, err := tlsconf.Client(tlsconf.Files{CA: caPath}, "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proc{leader, follower} {
		c, err := tls.Dial("tcp", p.addr, tc)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /api/v1/tenants/x/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n%s", strings.Repeat("{", 100))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if !strings.Contains(line, " 401 ") {
			t.Errorf("%s: unauthenticated request with a pending megabyte answered %q, want 401 at once", p.addr, line)
		}
	}
	if _, m := admin.call(t, "GET", leader.url+"/metrics", ""); !strings.Contains(m, "contiv_netmaster_api_body_bytes_held") ||
		!strings.Contains(m, "contiv_netmaster_api_body_refused_total") {
		t.Errorf("/metrics does not report the body budgets")
	}
	// A token removed from the file stops working without a restart (control plane issue,
	// item 7): both netmasters notice the changed file.
	ro := sec.client(t, tRO)
	ro.must(t, "GET", leader.url+"/api/v1/networks/", "", 200)
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("%s admin alice\n%s agent host1\n%s tenant-admin:t1 bob\n%s netmaster peers\n",
		tAdmin, tAgent, tT1, tPeer)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		eventually(t, 15*time.Second, "the revoked token refused by "+p.addr, func() error {
			if st, _ := ro.call(t, "GET", p.url+"/api/v1/networks/", ""); st != 401 {
				return fmt.Errorf("status %d", st)
			}
			return nil
		})
	}
	admin.must(t, "GET", follower.url+"/api/v1/networks/", "", 200) // (forwarded with the peer token as now read)
}

// Tokens of the tests' token files (secureEnv), by role.
const (
	tAdmin = "admin-token-0123456789"
	tRO    = "readonly-token-0123456789"
	tAgent = "agent-token-0123456789"
	tPeer  = "peer-token-0123456789abc"
)

// secureEnv runs netmasters with HTTPS, client certificates and bearer tokens (or, made
// by newPlainEnv, with tokens over plain HTTP).
type secureEnv struct {
	t      *testing.T
	dir    string
	ca     *pki.CA
	caPath string
	tokens string   // the token file
	flags  []string // netmaster's flags for all of it
	plain  bool     // --insecure --auth-tokens: plain HTTP, roles kept
}

// newPlainEnv is newSecureEnv's token file served over plain HTTP: netmaster runs with
// --insecure --auth-tokens, which keeps every role and check but TLS.
func newPlainEnv(t *testing.T, tokenLines string) *secureEnv {
	t.Helper()
	s := newSecureEnv(t, tokenLines)
	s.flags, s.plain = []string{"--auth-tokens", s.tokens}, true
	return s
}

// envModes are the ways a test runs its netmasters with tokens: HTTPS and plain HTTP.
var envModes = []struct {
	name string
	new  func(t *testing.T, tokenLines string) *secureEnv
}{{"tls", newSecureEnv}, {"insecure", newPlainEnv}}

// newSecureEnv issues a CA and netmaster's server certificate (for 127.0.0.1) and writes
// the token file (lines "<token> <role> [<name>]").
func newSecureEnv(t *testing.T, tokenLines string) *secureEnv {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	caPath, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	srvPair, err := ca.Issue(pki.Options{CommonName: "netmaster", Hosts: []string{"127.0.0.1"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	sc, sk, err := srvPair.Write(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(tokenLines), 0o600); err != nil {
		t.Fatal(err)
	}
	return &secureEnv{t: t, dir: dir, ca: ca, caPath: caPath, tokens: tokens,
		flags: []string{"--tls-cert", sc, "--tls-key", sk, "--tls-client-ca", caPath, "--tls-peer-ca", caPath, "--auth-tokens", tokens}}
}

// issue writes a client certificate of from (role in its Organization) and returns the
// files a client presents it with.
func (s *secureEnv) issue(name, role string, from *pki.CA, validity time.Duration) tlsconf.Files {
	s.t.Helper()
	_, f := s.issuePair(from, pki.Options{CommonName: name, Organization: []string{role}, Client: true, Validity: validity})
	return f
}

// issuePair writes a certificate of from as o says (file names from its CN) and returns it
// with the files a client presents it with.
func (s *secureEnv) issuePair(from *pki.CA, o pki.Options) (pki.Pair, tlsconf.Files) {
	s.t.Helper()
	p, err := from.Issue(o)
	if err != nil {
		s.t.Fatal(err)
	}
	c, k, err := p.Write(s.dir, strings.ReplaceAll(o.CommonName, ":", "_"))
	if err != nil {
		s.t.Fatal(err)
	}
	return p, tlsconf.Files{CA: s.caPath, Cert: c, Key: k}
}

// writeCRL replaces the list at path (written beside it and renamed over) with the CA's
// list number n revoking revoked.
func (s *secureEnv) writeCRL(path string, n int64, revoked ...pki.Pair) {
	s.t.Helper()
	b, err := s.ca.CRL(n, time.Now().Add(time.Hour), revoked...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.replace(path, b)
}

// replace writes body beside path and renames it over.
func (s *secureEnv) replace(path string, body []byte) {
	s.t.Helper()
	if err := os.WriteFile(path+".new", body, 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		s.t.Fatal(err)
	}
}

// start runs one netmaster per name on etcdURL, serving HTTPS (plain: HTTP).
func (s *secureEnv) start(t *testing.T, etcdURL string, names ...string) []*proc {
	t.Helper()
	ps := make([]*proc, 0, len(names))
	for _, n := range names {
		p := startNetmaster(t, n, etcdURL, s.flags...)
		if !s.plain {
			p.url = "https://" + p.addr
		}
		ps = append(ps, p)
	}
	return ps
}

// client returns an API client that trusts the CA and sends token (none if ""); it
// speaks plain HTTP to an http:// URL.
func (s *secureEnv) client(t *testing.T, token string) *apiClient {
	return client(t, tlsconf.Files{CA: s.caPath}, token)
}

// secureLeader waits for one of two netmasters to lead (asking as admin) and returns it
// and the other.
func secureLeader(t *testing.T, admin *apiClient, ps []*proc) (leader, follower *proc) {
	t.Helper()
	eventually(t, 30*time.Second, "a leader", func() error {
		for i, p := range ps {
			st, body := admin.call(t, "GET", p.url+"/info", "")
			if st == 200 && strings.Contains(body, `"current-state":"leader"`) {
				leader, follower = p, ps[1-i]
				return nil
			}
		}
		return fmt.Errorf("no leader yet")
	})
	return leader, follower
}

// waitLeader waits until p, alone on its etcd, says it leads (asking as admin).
func waitLeader(t *testing.T, admin *apiClient, p *proc) {
	t.Helper()
	eventually(t, 30*time.Second, p.name+" leads", func() error {
		if st, out := admin.call(t, "GET", p.url+"/info", ""); st != 200 || !strings.Contains(out, `"current-state":"leader"`) {
			return fmt.Errorf("%d %s", st, out)
		}
		return nil
	})
}

// rawEtcd is a client of etcdURL, closed when the test ends.
func rawEtcd(t *testing.T, etcdURL string) *clientv3.Client {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// revision is etcd's store revision: it moves with every write.
func revision(t *testing.T, raw *clientv3.Client) int64 {
	t.Helper()
	r, err := raw.Get(context.Background(), "/contiv.io/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

type apiClient struct {
	hc     *http.Client
	token  string
	header map[string]string
}

func client(t *testing.T, f tlsconf.Files, token string) *apiClient {
	tc, err := tlsconf.Client(f, "test")
	if err != nil {
		t.Fatal(err)
	}
	return &apiClient{hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}, token: token}
}

// call returns the status (-1 when the connection or TLS handshake failed) and body.
func (c *apiClient) call(t *testing.T, method, url, body string) (int, string) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/problem+json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c *apiClient) must(t *testing.T, method, url, body string, want int) {
	t.Helper()
	if st, out := c.call(t, method, url, body); st != want {
		t.Fatalf("%s %s: %d %s", method, url, st, out)
	}
}

// etcdRevision returns a function reading the current revision of the etcd at url: a
// refused request must leave it where it was.
func etcdRevision(t *testing.T, url string) func() int64 {
	t.Helper()
	raw := rawEtcd(t, url)
	return func() int64 { return revision(t, raw) }
}
