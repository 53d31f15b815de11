package tlsconf_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("other-ca")
	if err != nil {
		t.Fatal(err)
	}
	caPath, _ := ca.WriteCA(dir, "ca.crt")
	srv, _ := ca.Issue(pki.Options{CommonName: "server", Hosts: []string{"127.0.0.1"}, Server: true})
	cli, _ := ca.Issue(pki.Options{CommonName: "alice", Client: true})
	bad, _ := other.Issue(pki.Options{CommonName: "mallory", Client: true})
	expired, _ := ca.Issue(pki.Options{CommonName: "old", Client: true, Validity: -time.Hour})
	sc, sk, _ := srv.Write(dir, "server")
	cc, ck, _ := cli.Write(dir, "client")
	bc, bk, _ := bad.Write(dir, "bad")
	ec, ek, _ := expired.Write(dir, "expired")

	stc, err := tlsconf.Server(tlsconf.Files{CA: caPath, Cert: sc, Key: sk}, "--tls")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	ts.TLS = stc
	ts.StartTLS()
	defer ts.Close()

	get := func(f tlsconf.Files) (string, error) {
		ctc, err := tlsconf.Client(f, "--cacert")
		if err != nil {
			return "", err
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ctc}}
		resp, err := hc.Get(ts.URL)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), nil
	}
	if got, err := get(tlsconf.Files{CA: caPath, Cert: cc, Key: ck}); err != nil || got != "alice" {
		t.Fatalf("trusted client: %q %v", got, err)
	}
	for name, f := range map[string]tlsconf.Files{
		"no client cert":     {CA: caPath},
		"untrusted issuer":   {CA: caPath, Cert: bc, Key: bk},
		"expired":            {CA: caPath, Cert: ec, Key: ek},
		"server not trusted": {Cert: cc, Key: ck},
	} {
		if got, err := get(f); err == nil {
			t.Errorf("%s: request succeeded (%q)", name, got)
		}
	}
	if _, err := tlsconf.Client(tlsconf.Files{Cert: cc}, "--cert"); err == nil || !strings.Contains(err.Error(), "together") {
		t.Errorf("cert without key: %v", err)
	}
	if _, err := tlsconf.Server(tlsconf.Files{}, "--tls-cert"); err == nil {
		t.Error("server without certificate accepted")
	}
	if _, err := tlsconf.Client(tlsconf.Files{CA: sk}, "--cacert"); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("key file as CA: %v", err)
	}
}
