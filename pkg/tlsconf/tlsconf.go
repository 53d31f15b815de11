// Package tlsconf owns turning certificate file flags into *tls.Config: one client side
// (CA to trust, optional client certificate) and one server side (certificate, optional
// client CA that makes client certificates mandatory). Every binary that speaks TLS
// (netmaster, netplugin, netctl, the etcd client) builds its config here.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// Files names PEM files; empty fields are unused.
type Files struct {
	// CA is the bundle of CAs to trust: the server's issuer on a client, the client
	// certificates' issuer on a server.
	CA string
	// Cert and Key are this side's own certificate and key (both or neither).
	Cert, Key string
	// CRL (server side only) is a certificate revocation list, PEM or DER, signed by a
	// CA of the client CA bundle: client certificates it lists are refused.
	CRL string
}

// Empty reports whether no file is set.
func (f Files) Empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" && f.CRL == "" }

// Client returns a client config: RootCAs from f.CA (system roots when empty), and the
// client certificate when f.Cert/f.Key are set. what names the flags in errors
// ("--etcd-cacert", ...).
func Client(f Files, what string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pool, err := loadPool(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%s CA: %w", what, err)
		}
		tc.RootCAs = pool
	}
	if err := loadPair(f, tc, what); err != nil {
		return nil, err
	}
	return tc, nil
}

// Server returns a server config with f.Cert/f.Key (required). When f.CA is set, clients
// must present a certificate signed by it and not revoked by f.CRL. The client CA and the
// CRL stay as read at start; NewServer's Reload reads them again.
func Server(f Files, what string) (*tls.Config, error) {
	s, err := NewServer(f, what)
	if err != nil {
		return nil, err
	}
	return s.Config, nil
}

func loadPair(f Files, tc *tls.Config, what string) error {
	if (f.Cert == "") != (f.Key == "") {
		return fmt.Errorf("%s: certificate and key must be given together", what)
	}
	if f.Cert == "" {
		return nil
	}
	kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return fmt.Errorf("%s: load certificate %s / key %s: %w", what, f.Cert, f.Key, err)
	}
	tc.Certificates = []tls.Certificate{kp}
	return nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pool, _, err := loadCAs(path)
	return pool, err
}

// loadCAs reads a PEM bundle of CA certificates: as a pool, and parsed (to check the
// signature of a revocation list).
func loadCAs(path string) (*x509.CertPool, []*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read %w", err)
	}
	pool := x509.NewCertPool()
	var certs []*x509.Certificate
	for blk, rest := pem.Decode(b); blk != nil; blk, rest = pem.Decode(rest) {
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		pool.AddCert(c)
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, nil, errors.New(path + ": no PEM certificate in it")
	}
	return pool, certs, nil
}

// CommonName is the subject CN of the first certificate in the PEM file certFile (etcd
// takes a client's user name from it).
func CommonName(certFile string) (string, error) {
	b, err := os.ReadFile(certFile)
	if err != nil {
		return "", fmt.Errorf("read certificate: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return "", fmt.Errorf("%s: no PEM certificate", certFile)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", certFile, err)
	}
	if c.Subject.CommonName == "" {
		return "", fmt.Errorf("%s: the certificate has no common name", certFile)
	}
	return c.Subject.CommonName, nil
}
