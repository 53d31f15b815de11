// Package pki owns certificate material for tests and the demo: a throw-away CA that issues
// server and client certificates (ECDSA P-256, crypto/x509, nothing downloaded), written as
// PEM files. Production binaries never import it; they only load files (pkg/tlsconf).
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a self-signed certificate authority held in memory.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// Pair is an issued certificate and its key, PEM encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA valid for a day (name is its common name).
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Options says what an issued certificate is for.
type Options struct {
	// CommonName is the subject CN (a client identity: "admin", "agent:host1", ...).
	CommonName string
	// Organization is the subject O (used as a role by netmaster's certificate auth).
	Organization []string
	// Hosts are DNS names or IPs for a server certificate (SANs).
	Hosts []string
	// Server and Client select the extended key usages; both may be set (etcd peers).
	Server, Client bool
	// Validity defaults to 24h; NotBefore is one hour back. A negative value issues an
	// already-expired certificate (for tests).
	Validity time.Duration
}

// Issue signs a new key pair with the CA.
func (ca *CA) Issue(o Options) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generate key for %q: %w", o.CommonName, err)
	}
	validity := o.Validity
	if validity == 0 {
		validity = 24 * time.Hour
	}
	notBefore := time.Now().Add(-time.Hour)
	notAfter := time.Now().Add(validity)
	if validity < 0 {
		notBefore = time.Now().Add(2 * validity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: o.CommonName, Organization: o.Organization},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
	if o.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if o.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, fmt.Errorf("sign certificate for %q: %w", o.CommonName, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("marshal key for %q: %w", o.CommonName, err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
	}, nil
}

// WriteCA writes the CA certificate to dir/name and returns the path.
func (ca *CA) WriteCA(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, ca.CertPEM, 0o644); err != nil {
		return "", fmt.Errorf("write CA certificate: %w", err)
	}
	return p, nil
}

// Write writes dir/<base>.crt and dir/<base>.key (0600) and returns both paths.
func (p Pair) Write(dir, base string) (certPath, keyPath string, err error) {
	certPath = filepath.Join(dir, base+".crt")
	keyPath = filepath.Join(dir, base+".key")
	if err := os.WriteFile(certPath, p.CertPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("write %s: %w", certPath, err)
	}
	if err := os.WriteFile(keyPath, p.KeyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", keyPath, err)
	}
	return certPath, keyPath, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// Serial is the serial number of the issued certificate.
func (p Pair) Serial() (*big.Int, error) {
	blk, _ := pem.Decode(p.CertPEM)
	if blk == nil {
		return nil, fmt.Errorf("no PEM certificate in the pair")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return c.SerialNumber, nil
}

// CRL is a PEM certificate revocation list signed by the CA that revokes the certificates
// of revoked, valid until nextUpdate (in the past for an expired list). number is the CRL
// number (each new list of a CA takes a larger one).
func (ca *CA) CRL(number int64, nextUpdate time.Time, revoked ...Pair) ([]byte, error) {
	tmpl := &x509.RevocationList{Number: big.NewInt(number), ThisUpdate: time.Now().Add(-time.Hour), NextUpdate: nextUpdate}
	if !nextUpdate.After(tmpl.ThisUpdate) {
		tmpl.ThisUpdate = nextUpdate.Add(-time.Hour)
	}
	for _, p := range revoked {
		sn, err := p.Serial()
		if err != nil {
			return nil, err
		}
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
			x509.RevocationListEntry{SerialNumber: sn, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign revocation list: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), nil
}
