package tlsconf_test

import (
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// verifiedChain is p's certificate and the CA's, as a TLS server hands them to a handler
// (tls.ConnectionState.VerifiedChains[0]).
func (s *crlSetup) verifiedChain(t testing.TB, p pki.Pair) []*x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(p.CertPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return []*x509.Certificate{leaf, s.ca.Cert}
}

// checkingServer serves 200 while st.CheckChain passes the request's verified chain and
// 401 after, as netmaster's auth layer does on every request.
func checkingServer(t *testing.T, st *tlsconf.ServerTLS) *httptest.Server {
	t.Helper()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := st.CheckChain(r.TLS.VerifiedChains[0]); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}
	}))
	ts.TLS = st.Config
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts
}

// getReused is get on hc, also reporting whether the request went on a connection opened
// before.
func getReused(t *testing.T, hc *http.Client, url string) (ok, reused bool) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	}))
	resp, err := hc.Do(req)
	if err != nil {
		return false, reused
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, reused
}

// TestRevocationCheckCached (issue 34, review of item 7): CheckChain runs on every request, so
// after the first call for a chain it does not verify it again (x509.Verify: ~100 us and
// hundreds of allocations); it costs a look-up and the revocation check.
func TestRevocationCheckCached(t *testing.T) {
	s, st, _ := serveEmptyCRL(t)
	chain := s.verifiedChain(t, s.alice)
	if err := st.CheckChain(chain); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := st.CheckChain(chain); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 10 {
		t.Errorf("CheckChain of a chain seen before: %.0f allocations per call, want <= 10 (verified again each time?)", allocs)
	}
}

// TestRevocationAfterCacheFilled: a certificate revoked after its chain was verified and
// cached is refused on the next request of its open connection, and a CA taken out of the
// bundle refuses its clients' cached chains too; another client's connection goes on.
func TestRevocationAfterCacheFilled(t *testing.T) {
	s, st, _ := serveEmptyCRL(t)
	ts := checkingServer(t, st)
	alice, bob := client(t, s.clients["alice"]), client(t, s.clients["bob"])
	defer alice.CloseIdleConnections()
	defer bob.CloseIdleConnections()
	for range 3 { // the first request fills the cache, the others are served from it
		if ok, _ := getReused(t, bob, ts.URL); !ok {
			t.Fatal("setup: bob refused with an empty list")
		}
		if ok, _ := getReused(t, alice, ts.URL); !ok {
			t.Fatal("setup: alice refused with an empty list")
		}
	}
	s.writeCRL(t, s.crl(t, 2, time.Now().Add(time.Hour), s.bob))
	if err := st.Reload(); err != nil {
		t.Fatal(err)
	}
	if ok, reused := getReused(t, bob, ts.URL); ok || !reused {
		t.Errorf("bob revoked: served %v on his open connection (reused %v), want 401 on it", ok, reused)
	}
	if ok, reused := getReused(t, alice, ts.URL); !ok || !reused {
		t.Errorf("alice (not revoked): served %v, reused %v", ok, reused)
	}
	if err := st.CheckChain(s.verifiedChain(t, s.bob)); err == nil {
		t.Error("CheckChain passed bob's revoked chain")
	}

	s.replaceCA(t, st)
	if ok, reused := getReused(t, alice, ts.URL); ok || !reused {
		t.Errorf("alice's CA left the bundle: served %v on her open connection (reused %v), want 401 on it", ok, reused)
	}
}

// TestRevocationCacheExpiry: a chain verified and cached while valid is refused once a
// certificate of it expires (Verify checked the dates only when it was cached).
func TestRevocationCacheExpiry(t *testing.T) {
	s, st, _ := serveEmptyCRL(t)
	short, err := s.ca.Issue(pki.Options{CommonName: "short", Client: true, Validity: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	chain := s.verifiedChain(t, short)
	if err := st.CheckChain(chain); err != nil {
		t.Fatalf("setup: a valid certificate refused: %v", err)
	}
	time.Sleep(time.Until(chain[0].NotAfter) + 10*time.Millisecond)
	if err := st.CheckChain(chain); err == nil {
		t.Errorf("a certificate that expired at %s passed CheckChain from the cache", chain[0].NotAfter)
	}
}

// BenchmarkCheckChain is the per-request cost of CheckChain for a client chain (leaf and
// CA) seen before.
func BenchmarkCheckChain(b *testing.B) {
	s, st, _ := serveEmptyCRL(b)
	chain := s.verifiedChain(b, s.alice)
	b.ReportAllocs()
	for b.Loop() {
		if err := st.CheckChain(chain); err != nil {
			b.Fatal(err)
		}
	}
}
