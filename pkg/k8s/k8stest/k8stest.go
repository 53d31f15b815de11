// Package k8stest serves the Kubernetes pod read API over mutual TLS for tests (there is no
// kube-apiserver on the build machines).
package k8stest

import (
	"github.com/contivbpf/contivbpf/pkg/k8s"

	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// APIServer is an HTTPS server speaking the pod read API
// (GET /api/v1/namespaces/<ns>/pods/<name>) for tests of code that reads pod labels; there
// is no kube-apiserver on the build machines. It requires a client certificate signed by
// its CA and, if Token is set, that bearer token, as a kube-apiserver would.
type APIServer struct {
	*httptest.Server
	// Config points at the CA, client certificate and key it wrote into a temp dir.
	Config k8s.Config
	// ConfigPath is a contiv.json holding Config.
	ConfigPath string
}

// NewAPIServer starts the server; pods maps "ns/name" to labels. It is closed when
// the test ends.
func NewAPIServer(t testing.TB, token string, pods map[string]map[string]string) *APIServer {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert, caDER := newCert(t, nil, nil, "test-ca", true)
	srvKey, srvCert, _ := newCert(t, caCert, caKey, "127.0.0.1", false)
	cliKey, _, cliDER := newCert(t, caCert, caKey, "netplugin", false)
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER)
	writePEM(t, filepath.Join(dir, "client.crt"), "CERTIFICATE", cliDER)
	kb, err := x509.MarshalECPrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "client.key"), "EC PRIVATE KEY", kb)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)

	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "status": "Failure", "message": "Unauthorized", "code": 401})
			return
		}
		f := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if r.Method != http.MethodGet || len(f) != 6 || f[0] != "api" || f[1] != "v1" || f[2] != "namespaces" || f[4] != "pods" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "status": "Failure", "message": "the server could not find the requested resource", "code": 404})
			return
		}
		labels, ok := pods[f[3]+"/"+f[5]]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "status": "Failure", "reason": "NotFound",
				"message": `pods "` + f[5] + `" not found`, "code": 404})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Pod", "apiVersion": "v1",
			"metadata": map[string]any{"name": f[5], "namespace": f[3], "labels": labels}, "spec": map[string]any{}})
	}))
	ts.TLS = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvCert.Raw}, PrivateKey: srvKey}},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: pool,
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	s := &APIServer{Server: ts, Config: k8s.Config{APIServer: ts.URL, CA: filepath.Join(dir, "ca.crt"),
		Cert: filepath.Join(dir, "client.crt"), Key: filepath.Join(dir, "client.key"), Token: token}}
	s.ConfigPath = filepath.Join(dir, "contiv.json")
	b, _ := json.Marshal(s.Config)
	if err := os.WriteFile(s.ConfigPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string, ca bool) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        ca, BasicConstraintsValid: true,
	}
	if ip := net.ParseIP(cn); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
