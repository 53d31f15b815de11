package tlsconf_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// TestCRLCopy: the copy a server reads (the embedded etcd: one DER list, unchecked) is the
// operator's PEM list in DER; a rewritten list replaces it, a list that is broken, half
// written, foreign, older or holds two lists leaves it as it was and Warning says so.
func TestCRLCopy(t *testing.T) {
	s := newCRLSetup(t)
	dst := filepath.Join(s.dir, "copy.der")
	s.writeCRL(t, s.crl(t, 1, time.Now().Add(time.Hour)))
	c, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, dst, "--etcd-client-crl")
	if err != nil {
		t.Fatal(err)
	}
	revokes := func(p pki.Pair) bool {
		t.Helper()
		der, err := os.ReadFile(c.Path())
		if err != nil {
			t.Fatal(err)
		}
		crl, err := x509.ParseRevocationList(der) // (what etcd does with it)
		if err != nil {
			t.Fatalf("the copy is not one DER list: %v", err)
		}
		serial, _ := p.Serial()
		for _, e := range crl.RevokedCertificateEntries {
			if e.SerialNumber.Cmp(serial) == 0 {
				return true
			}
		}
		return false
	}
	if revokes(s.bob) {
		t.Fatal("setup: bob revoked by an empty list")
	}
	s.writeCRL(t, s.crl(t, 2, time.Now().Add(time.Hour), s.bob))
	if err := c.Reload(); err != nil || !revokes(s.bob) || c.Warning() != "" {
		t.Fatalf("a list revoking bob: %v, in the copy %v, warning %q", err, revokes(s.bob), c.Warning())
	}
	good := s.crl(t, 3, time.Now().Add(time.Hour), s.bob)
	other, _ := pki.NewCA("other-ca")
	foreign, _ := other.CRL(4, time.Now().Add(time.Hour))
	blk, _ := pem.Decode(good)
	for name, body := range map[string][]byte{"garbage": []byte("junk\n"), "half written": good[:len(good)/2],
		"DER half written": blk.Bytes[:len(blk.Bytes)/2], "foreign": foreign, "older": s.crl(t, 1, time.Now().Add(time.Hour)),
		"two lists": append(append([]byte{}, good...), good...)} {
		s.writeCRL(t, body)
		if err := c.Reload(); err == nil {
			t.Errorf("%s list taken", name)
		}
		if !revokes(s.bob) {
			t.Errorf("%s list: bob's revocation left the copy", name)
		}
		if w := c.Warning(); !strings.Contains(w, "stay in force") {
			t.Errorf("%s list: warning %q", name, w)
		}
	}
	s.writeCRL(t, good)
	if err := c.Reload(); err != nil || c.Warning() != "" {
		t.Errorf("a good list again: %v, warning %q", err, c.Warning())
	}
	if b, _ := os.ReadFile(c.Path()); !bytes.Equal(b, blk.Bytes) {
		t.Error("the copy is not the list's DER")
	}

	s.writeCRL(t, append(append([]byte{}, good...), good...))
	if _, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, dst, "--etcd-client-crl"); err == nil || !strings.Contains(err.Error(), "--etcd-client-crl") {
		t.Errorf("two lists at start: %v; want a refusal naming the flag", err)
	}
}

// TestCRLCopyBundleReadOnce: the server reads the client CA bundle only at start, so the
// copy is checked against the bundle as it was then. A bundle rewritten to another CA
// (rotated, the restart still to come) with that CA's list beside it must not replace the
// copy: the server still trusts the first CA, and a list of another CA (etcd matches serials
// alone) would un-revoke that CA's certificates.
func TestCRLCopyBundleReadOnce(t *testing.T) {
	s := newCRLSetup(t)
	s.writeCRL(t, s.crl(t, 1, time.Now().Add(time.Hour), s.bob))
	c, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, filepath.Join(s.dir, "copy.der"), "--etcd-client-crl")
	if err != nil {
		t.Fatal(err)
	}
	next, err := pki.NewCA("next-ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.caPath, next.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	crl, err := next.CRL(1, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	s.writeCRL(t, crl)
	if err := c.Reload(); err == nil {
		t.Error("the list of a CA the server does not trust replaced the copy")
	}
	der, err := os.ReadFile(c.Path())
	if err != nil {
		t.Fatal(err)
	}
	list, err := x509.ParseRevocationList(der)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(list.RawIssuer, s.ca.Cert.RawSubject) || len(list.RevokedCertificateEntries) != 1 {
		t.Errorf("the copy is the list of %q revoking %d certificates; want the first CA's, revoking bob", list.Issuer, len(list.RevokedCertificateEntries))
	}
	if w := c.Warning(); !strings.Contains(w, "stay in force") {
		t.Errorf("warning %q", w)
	}
}

// TestCRLCopyNoRollbackAtRestart: the copy outlives netmaster (in etcd's data directory), so
// a restart compares the list with it as a reload does: an older list put back while
// netmaster was down (a restored backup) is refused at start, naming the flag, and the
// copy keeps its revocations.
func TestCRLCopyNoRollbackAtRestart(t *testing.T) {
	s := newCRLSetup(t)
	dst := filepath.Join(s.dir, "copy.der")
	s.writeCRL(t, s.crl(t, 2, time.Now().Add(time.Hour), s.bob))
	if _, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, dst, "--etcd-client-crl"); err != nil {
		t.Fatal(err)
	}
	kept, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	s.writeCRL(t, s.crl(t, 1, time.Now().Add(time.Hour)))
	if _, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, dst, "--etcd-client-crl"); err == nil || !strings.Contains(err.Error(), "--etcd-client-crl") {
		t.Errorf("an older list at restart: %v; want a refusal naming the flag", err)
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, kept) {
		t.Error("an older list at restart replaced the copy")
	}
	s.writeCRL(t, s.crl(t, 3, time.Now().Add(time.Hour)))
	if _, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, dst, "--etcd-client-crl"); err != nil {
		t.Errorf("a newer list at restart: %v", err)
	}
}

// TestCRLCopyTempNotFollowed: the copy is written beside its final name and renamed over;
// a link planted under the name it would be written to first (by whoever can write to the
// directory) must not make netmaster write through it to another file.
func TestCRLCopyTempNotFollowed(t *testing.T) {
	s := newCRLSetup(t)
	s.writeCRL(t, s.crl(t, 1, time.Now().Add(time.Hour)))
	victim := filepath.Join(s.dir, "victim")
	if err := os.WriteFile(victim, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(s.dir, "copy.der")
	for _, name := range []string{dst + ".new", dst + ".tmp"} {
		if err := os.Symlink(victim, name); err != nil {
			t.Fatal(err)
		}
	}
	c, err := tlsconf.NewCRLCopy(s.caPath, s.crlPath, dst, "--etcd-client-crl")
	if err != nil {
		t.Fatal(err)
	}
	s.writeCRL(t, s.crl(t, 2, time.Now().Add(time.Hour), s.bob))
	if err := c.Reload(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep me\n" {
		t.Errorf("the copy was written through a planted link: the victim holds %d bytes", len(b))
	}
	if st, err := os.Lstat(dst); err != nil || !st.Mode().IsRegular() {
		t.Errorf("the copy: %v, %v; want a regular file", st, err)
	}
}
