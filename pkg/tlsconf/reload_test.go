package tlsconf_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// crlSetup is a CA, a server and two clients (alice, bob) of it, written under dir.
type crlSetup struct {
	dir, caPath, crlPath string
	ca                   *pki.CA
	alice, bob           pki.Pair
	server               tlsconf.Files
	clients              map[string]tlsconf.Files
}

func newCRLSetup(t testing.TB) *crlSetup {
	t.Helper()
	s := &crlSetup{dir: t.TempDir(), clients: map[string]tlsconf.Files{}}
	var err error
	if s.ca, err = pki.NewCA("crl-test-ca"); err != nil {
		t.Fatal(err)
	}
	s.caPath, _ = s.ca.WriteCA(s.dir, "ca.crt")
	trust, _ := s.ca.WriteCA(s.dir, "trust.crt") // (the clients' own copy: TestClientCAReload rewrites ca.crt)
	s.crlPath = filepath.Join(s.dir, "ca.crl")
	srv, _ := s.ca.Issue(pki.Options{CommonName: "server", Hosts: []string{"127.0.0.1"}, Server: true})
	sc, sk, _ := srv.Write(s.dir, "server")
	s.server = tlsconf.Files{CA: s.caPath, Cert: sc, Key: sk, CRL: s.crlPath}
	s.alice, _ = s.ca.Issue(pki.Options{CommonName: "alice", Client: true})
	s.bob, _ = s.ca.Issue(pki.Options{CommonName: "bob", Client: true})
	for name, p := range map[string]pki.Pair{"alice": s.alice, "bob": s.bob} {
		c, k, err := p.Write(s.dir, name)
		if err != nil {
			t.Fatal(err)
		}
		s.clients[name] = tlsconf.Files{CA: trust, Cert: c, Key: k}
	}
	return s
}

// writeCRL replaces the CRL file atomically with body.
func (s *crlSetup) writeCRL(t testing.TB, body []byte) {
	t.Helper()
	tmp := s.crlPath + ".new"
	if err := os.WriteFile(tmp, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.crlPath); err != nil {
		t.Fatal(err)
	}
}

func (s *crlSetup) crl(t testing.TB, number int64, next time.Time, revoked ...pki.Pair) []byte {
	t.Helper()
	b, err := s.ca.CRL(number, next, revoked...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve starts an HTTPS server with st answering the client's CN.
func serve(t testing.TB, st *tlsconf.ServerTLS) *httptest.Server {
	t.Helper()
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	ts.TLS = st.Config
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts
}

// serveEmptyCRL serves a new setup's server with a current list that revokes nothing.
func serveEmptyCRL(t testing.TB) (*crlSetup, *tlsconf.ServerTLS, *httptest.Server) {
	t.Helper()
	s := newCRLSetup(t)
	s.writeCRL(t, s.crl(t, 1, time.Now().Add(time.Hour)))
	st, err := tlsconf.NewServer(s.server, "--tls-crl")
	if err != nil {
		t.Fatal(err)
	}
	return s, st, serve(t, st)
}

// client is a keep-alive HTTPS client with the files of one client certificate.
func client(t *testing.T, f tlsconf.Files) *http.Client {
	t.Helper()
	tc, err := tlsconf.Client(f, "--cert")
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 5 * time.Second}
}

// fresh asks with a new connection (a new handshake) and reports whether it was served.
func fresh(t *testing.T, ts *httptest.Server, f tlsconf.Files) bool {
	t.Helper()
	hc := client(t, f)
	defer hc.CloseIdleConnections()
	return get(hc, ts.URL)
}

func get(hc *http.Client, url string) bool {
	resp, err := hc.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// TestCRLRefusesRevoked (issue 34, item 7): a client certificate listed in --tls-crl is
// refused in the handshake, another of the same CA is served; the list is taken in PEM and
// in DER.
func TestCRLRefusesRevoked(t *testing.T) {
	s := newCRLSetup(t)
	pemCRL := s.crl(t, 1, time.Now().Add(time.Hour), s.bob)
	for _, form := range []string{"PEM", "DER"} {
		body := pemCRL
		if form == "DER" {
			blk, _ := pem.Decode(pemCRL)
			body = blk.Bytes
		}
		s.writeCRL(t, body)
		st, err := tlsconf.NewServer(s.server, "--tls-crl")
		if err != nil {
			t.Fatalf("%s: %v", form, err)
		}
		ts := serve(t, st)
		if !fresh(t, ts, s.clients["alice"]) {
			t.Errorf("%s: alice (not revoked) refused", form)
		}
		if fresh(t, ts, s.clients["bob"]) {
			t.Errorf("%s: bob (revoked) served", form)
		}
		if w := st.Warning(); w != "" {
			t.Errorf("%s: warning %q with a good, current list", form, w)
		}
	}
}

// TestCRLRefusedAtStart: a list signed by another CA, a list naming this CA but not signed
// by its key, and a file that is no CRL stop the start with an error naming the flag.
func TestCRLRefusedAtStart(t *testing.T) {
	s := newCRLSetup(t)
	other, _ := pki.NewCA("other-ca")
	forged, _ := pki.NewCA("crl-test-ca") // same name, another key
	for name, body := range map[string]func() ([]byte, error){
		"foreign": func() ([]byte, error) { return other.CRL(1, time.Now().Add(time.Hour)) },
		"forged":  func() ([]byte, error) { return forged.CRL(1, time.Now().Add(time.Hour), s.bob) },
		"garbage": func() ([]byte, error) { return []byte("not a crl\n"), nil },
	} {
		b, err := body()
		if err != nil {
			t.Fatal(err)
		}
		s.writeCRL(t, b)
		if _, err := tlsconf.NewServer(s.server, "--tls-crl"); err == nil || !strings.Contains(err.Error(), "--tls-crl") {
			t.Errorf("%s list: %v; want a refusal naming --tls-crl", name, err)
		}
	}
	os.Remove(s.crlPath)
	if _, err := tlsconf.NewServer(s.server, "--tls-crl"); err == nil {
		t.Error("a missing list accepted")
	}
	f := s.server
	f.CA = ""
	if _, err := tlsconf.NewServer(f, "--tls-crl"); err == nil {
		t.Error("a list without a client CA accepted")
	}
}

// TestCRLReload: a certificate revoked in a rewritten list is refused on Follow's next look
// (and on Reload) without a restart, while a kept-alive connection of another client goes
// on; a list that turns invalid, foreign or missing keeps the last good one in force and
// Warning says so; an expired list is enforced with a warning.
func TestCRLReload(t *testing.T) {
	s, st, ts := serveEmptyCRL(t)
	alice := client(t, s.clients["alice"])
	defer alice.CloseIdleConnections()
	if !get(alice, ts.URL) || !fresh(t, ts, s.clients["bob"]) {
		t.Fatal("setup: a client refused with an empty list")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.Follow(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))

	s.writeCRL(t, s.crl(t, 2, time.Now().Add(time.Hour), s.bob))
	deadline := time.Now().Add(3 * tlsconf.FollowEvery)
	for fresh(t, ts, s.clients["bob"]) {
		if time.Now().After(deadline) {
			t.Fatal("bob revoked in the rewritten list but still served: the file change was not taken")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !get(alice, ts.URL) || !fresh(t, ts, s.clients["alice"]) {
		t.Error("alice refused after the reload")
	}

	other, _ := pki.NewCA("other-ca")
	foreign, _ := other.CRL(3, time.Now().Add(time.Hour))
	for name, body := range map[string][]byte{"garbage": []byte("junk\n"), "foreign": foreign, "missing": nil} {
		if body == nil {
			os.Remove(s.crlPath)
		} else {
			s.writeCRL(t, body)
		}
		if err := st.Reload(); err == nil {
			t.Errorf("%s list taken", name)
		}
		if fresh(t, ts, s.clients["bob"]) {
			t.Errorf("%s list: bob's revocation forgotten", name)
		}
		if !fresh(t, ts, s.clients["alice"]) {
			t.Errorf("%s list: alice refused", name)
		}
		if w := st.Warning(); !strings.Contains(w, "stay in force") {
			t.Errorf("%s list: warning %q", name, w)
		}
	}

	s.writeCRL(t, s.crl(t, 4, time.Now().Add(-time.Minute), s.bob))
	if err := st.Reload(); err != nil {
		t.Fatalf("an expired list: %v", err)
	}
	if w := st.Warning(); !strings.Contains(w, "expired") || strings.Contains(w, "reload at") {
		t.Errorf("expired list: warning %q", w)
	}
	if fresh(t, ts, s.clients["bob"]) || !fresh(t, ts, s.clients["alice"]) {
		t.Error("expired list: not enforced as it stands")
	}

	// An older list (a lower number: a backup restored) would un-revoke bob: refused,
	// the list in force kept.
	s.writeCRL(t, s.crl(t, 3, time.Now().Add(time.Hour)))
	if err := st.Reload(); err == nil || !strings.Contains(err.Error(), "below 4") {
		t.Errorf("a list numbered below the one in force: %v", err)
	}
	if fresh(t, ts, s.clients["bob"]) {
		t.Error("an older list un-revoked bob")
	}

	s.writeCRL(t, s.crl(t, 5, time.Now().Add(time.Hour)))
	if err := st.Reload(); err != nil || st.Warning() != "" {
		t.Fatalf("a good list again: %v, warning %q", err, st.Warning())
	}
	if !fresh(t, ts, s.clients["bob"]) {
		t.Error("bob unrevoked but refused")
	}
}

// replaceCA rewrites the client CA bundle with another CA (and its list) and reloads st:
// the clients of s.ca are no longer trusted.
func (s *crlSetup) replaceCA(t *testing.T, st *tlsconf.ServerTLS) {
	t.Helper()
	newCA, _ := pki.NewCA("next-ca")
	if err := os.WriteFile(s.caPath, newCA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	crl, _ := newCA.CRL(1, time.Now().Add(time.Hour))
	s.writeCRL(t, crl)
	if err := st.Reload(); err != nil {
		t.Fatal(err)
	}
}

// TestClientCAReload: a client CA bundle rewritten without a CA refuses that CA's clients
// on the next handshake, resumed sessions included (CheckChain in VerifyConnection).
func TestClientCAReload(t *testing.T) {
	s, st, ts := serveEmptyCRL(t)
	tc, _ := tlsconf.Client(s.clients["alice"], "--cert")
	tc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	if !get(hc, ts.URL) {
		t.Fatal("setup: alice refused")
	}
	s.replaceCA(t, st)
	if get(hc, ts.URL) {
		t.Error("alice's CA left the bundle but her resumed session was served")
	}
	if fresh(t, ts, s.clients["alice"]) {
		t.Error("alice's CA left the bundle but a new handshake was served")
	}
}

// TestCARemovedBeforeCRL: a CA taken out of the bundle stops being trusted even while the
// CRL file still holds that CA's list (the reload is refused for the list, not for the
// bundle); the old list's revocations stay in force and Warning names the failure.
func TestCARemovedBeforeCRL(t *testing.T) {
	s, st, ts := serveEmptyCRL(t)
	if !fresh(t, ts, s.clients["alice"]) {
		t.Fatal("setup: alice refused")
	}
	newCA, _ := pki.NewCA("next-ca")
	if err := os.WriteFile(s.caPath, newCA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := st.Reload(); err == nil {
		t.Fatal("reload took a CRL of a CA no longer in the bundle")
	}
	if st.Warning() == "" {
		t.Error("no warning after a failed reload")
	}
	if fresh(t, ts, s.clients["alice"]) {
		t.Error("alice's CA left the bundle but she was served (the old bundle stayed in force)")
	}
}

// TestCRLRevokedIntermediateInBundle: with a bundle holding a root and its intermediate, a
// root's CRL that revokes the intermediate refuses a leaf of it even when the client
// presents the leaf alone (the chain is completed from the bundle, not from the client).
func TestCRLRevokedIntermediateInBundle(t *testing.T) {
	dir := t.TempDir()
	root, _ := pki.NewCA("crl-test-root")
	ikey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	itmpl := &x509.Certificate{SerialNumber: big.NewInt(4242), Subject: pkix.Name{CommonName: "crl-test-inter"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	ider, err := x509.CreateCertificate(rand.Reader, itmpl, root.Cert, &ikey.PublicKey, root.Key)
	if err != nil {
		t.Fatal(err)
	}
	icert, _ := x509.ParseCertificate(ider)
	inter := &pki.CA{Cert: icert, Key: ikey, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ider})}
	leaf, _ := inter.Issue(pki.Options{CommonName: "carol", Client: true})
	srv, _ := root.Issue(pki.Options{CommonName: "server", Hosts: []string{"127.0.0.1"}, Server: true})
	sc, sk, _ := srv.Write(dir, "server")
	caPath := filepath.Join(dir, "bundle.crt")
	os.WriteFile(caPath, append(append([]byte{}, root.CertPEM...), inter.CertPEM...), 0o644)
	revokeInter, err := root.CRL(1, time.Now().Add(time.Hour), pki.Pair{CertPEM: inter.CertPEM})
	if err != nil {
		t.Fatal(err)
	}
	interCRL, _ := inter.CRL(1, time.Now().Add(time.Hour))
	crlPath := filepath.Join(dir, "bundle.crl")
	os.WriteFile(crlPath, append(revokeInter, interCRL...), 0o644)
	st, err := tlsconf.NewServer(tlsconf.Files{CA: caPath, Cert: sc, Key: sk, CRL: crlPath}, "--tls-crl")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(leaf.CertPEM)
	lc, _ := x509.ParseCertificate(blk.Bytes)
	if err := st.CheckChain([]*x509.Certificate{lc}); err == nil {
		t.Error("a leaf of a revoked intermediate (presented alone) passed CheckChain")
	}
	if err := st.CheckChain([]*x509.Certificate{lc, icert}); err == nil {
		t.Error("a leaf of a revoked intermediate (presented with it) passed CheckChain")
	}
}

// TestCRLRefusesCriticalExtension: a list with a critical extension netmaster does not
// handle (a delta CRL: only the revocations since its base) is refused, not taken as a
// complete list (RFC 5280 §5.2: such a list must not be used).
func TestCRLRefusesCriticalExtension(t *testing.T) {
	s := newCRLSetup(t)
	deltaIndicator := []int{2, 5, 29, 27}
	tmpl := &x509.RevocationList{Number: big.NewInt(2), ThisUpdate: time.Now().Add(-time.Hour), NextUpdate: time.Now().Add(time.Hour),
		ExtraExtensions: []pkix.Extension{{Id: deltaIndicator, Critical: true, Value: []byte{2, 1, 1}}}}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, s.ca.Cert, s.ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	s.writeCRL(t, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}))
	if _, err := tlsconf.NewServer(s.server, "--tls-crl"); err == nil || !strings.Contains(err.Error(), "2.5.29.27") {
		t.Errorf("a delta CRL was taken as a complete list: %v", err)
	}
}

// TestCRLHalfWritten: a CRL file holding two CAs' lists, rewritten in place in two steps,
// is never taken half written: cut inside the second list, inside the first, or exactly
// between them, the reload is refused and both CAs' revocations stay in force; the whole
// file is then taken.
func TestCRLHalfWritten(t *testing.T) {
	s := newCRLSetup(t)
	ca2, err := pki.NewCA("crl-test-ca-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.caPath, append(append([]byte{}, s.ca.CertPEM...), ca2.CertPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	dave, _ := ca2.Issue(pki.Options{CommonName: "dave", Client: true})
	erin, _ := ca2.Issue(pki.Options{CommonName: "erin", Client: true})
	chain2 := func(p pki.Pair) []*x509.Certificate {
		c := s.verifiedChain(t, p)
		c[1] = ca2.Cert
		return c
	}
	lists := func(n int64, revoked1, revoked2 pki.Pair) (first, second []byte) {
		first = s.crl(t, n, time.Now().Add(time.Hour), revoked1)
		second, err := ca2.CRL(n, time.Now().Add(time.Hour), revoked2)
		if err != nil {
			t.Fatal(err)
		}
		return first, second
	}
	a, b := lists(1, s.bob, dave)
	s.writeCRL(t, append(append([]byte{}, a...), b...))
	st, err := tlsconf.NewServer(s.server, "--tls-crl")
	if err != nil {
		t.Fatal(err)
	}
	inForce := func(what string) {
		t.Helper()
		for name, c := range map[string][]*x509.Certificate{"bob": s.verifiedChain(t, s.bob), "dave": chain2(dave)} {
			if st.CheckChain(c) == nil {
				t.Errorf("%s: %s's revocation forgotten", what, name)
			}
		}
		if err := st.CheckChain(s.verifiedChain(t, s.alice)); err != nil {
			t.Errorf("%s: alice refused: %v", what, err)
		}
	}
	inForce("setup")

	// The next file revokes erin too; written in place, step one leaves it cut.
	a, b = lists(2, s.bob, erin)
	whole := append(append([]byte{}, a...), b...)
	for name, cut := range map[string]int{"inside the second list": len(a) + len(b)/2, "inside the first list": len(a) / 2,
		"between the lists": len(a), "inside the second list's last line": len(whole) - 3} {
		if err := os.WriteFile(s.crlPath, whole[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		if err := st.Reload(); err == nil {
			t.Errorf("cut %s: the reload took it", name)
		}
		inForce("cut " + name)
		if w := st.Warning(); !strings.Contains(w, "stay in force") {
			t.Errorf("cut %s: warning %q", name, w)
		}
	}
	if err := os.WriteFile(s.crlPath, whole, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := st.Reload(); err != nil || st.Warning() != "" {
		t.Fatalf("the whole file: %v, warning %q", err, st.Warning())
	}
	if st.CheckChain(chain2(erin)) == nil || st.CheckChain(s.verifiedChain(t, s.bob)) == nil {
		t.Error("the whole file: erin or bob not revoked")
	}
	if err := st.CheckChain(chain2(dave)); err != nil {
		t.Errorf("the whole file: dave (no longer listed) refused: %v", err)
	}
}
