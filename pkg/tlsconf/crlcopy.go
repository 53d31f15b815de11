package tlsconf

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/contivbpf/contivbpf/pkg/atomicfile"
)

// CRLCopy feeds a server that reads one DER revocation list from a file by itself, at
// every new connection and without checking it (the embedded etcd: a PEM list, a list
// half written or one of another CA would refuse every connection or un-revoke), from the
// list file an operator writes (PEM or DER, signed by a CA of the bundle). The copy holds
// the last list taken as ServerTLS takes one: it parsed whole, is signed by a CA of the
// bundle, and neither goes back nor drops a CA's list; a list refused leaves the copy as
// it was and Warning says so.
type CRLCopy struct {
	trustState
	dst string
}

// NewCRLCopy checks the list crlFile against the CA bundle caFile and writes it to dst, in
// DER. what names the flag in errors. The server reads the bundle only at start, so the
// file may hold one list only (of the CA that issued the clients' certificates). A copy
// already at dst (written before a restart) is the list in force: crlFile must take over
// from it as on a reload (not older, not of another CA while its CA stays trusted).
func NewCRLCopy(caFile, crlFile, dst, what string) (*CRLCopy, error) {
	if caFile == "" {
		return nil, fmt.Errorf("%s: a revocation list needs the client CA that signed it", what)
	}
	c := &CRLCopy{trustState: trustState{files: Files{CA: caFile, CRL: crlFile}, what: what, kept: "the revocation list"}, dst: dst}
	t, err := readTrust(c.files)
	if err == nil {
		if prev := c.previous(t.cas); prev != nil {
			if err = takesOver(prev, t, crlFile); err != nil {
				err = fmt.Errorf("%w (against %s, the copy the server read before this start)", err, dst)
			}
		}
	}
	if err == nil {
		err = c.write(t)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	c.trust = t
	return c, nil
}

// previous is the copy a run before this one left (nil: none, or one that does not parse
// or that no CA of cas signed: nothing to compare with).
func (c *CRLCopy) previous(cas []*x509.Certificate) *clientTrust {
	der, err := os.ReadFile(c.dst)
	if err != nil {
		return nil
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil || signedByOneOf(crl, cas) != nil {
		return nil
	}
	return &clientTrust{crls: []*x509.RevocationList{crl}}
}

// Path is the file the copy is written to (the server's list).
func (c *CRLCopy) Path() string { return c.dst }

// write replaces the copy with t's list (atomicfile: the server never reads half of it).
func (c *CRLCopy) write(t *clientTrust) error {
	if len(t.crls) != 1 {
		return fmt.Errorf("revocation list %s: holds %d lists; the embedded etcd reads one (of --etcd-client-ca's CA)", c.files.CRL, len(t.crls))
	}
	if err := atomicfile.Write(c.dst, t.crls[0].Raw, 0o644); err != nil {
		return fmt.Errorf("revocation list: the server's copy: %w", err)
	}
	return nil
}

// Reload reads the list again and, when it can be taken, replaces the copy with it. The
// list is checked against the CA bundle as NewCRLCopy read it, which the server goes on
// trusting: a list of a CA added to the file since (a bundle rotated before the restart)
// would stand in for the list of a CA the server still trusts and un-revoke its
// certificates (etcd matches serials alone).
func (c *CRLCopy) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, err := withCRLs(c.trust.pool, c.trust.cas, c.files.CRL)
	if err == nil {
		err = takesOver(c.trust, t, c.files.CRL)
	}
	if err == nil {
		err = c.write(t)
	}
	if err != nil {
		c.failed, c.failedAt = err, time.Now()
		return err
	}
	c.trust, c.failed = t, nil
	return nil
}

// Follow reloads the list when it changes and on SIGHUP until ctx ends (not the bundle:
// the server reads it only at start).
func (c *CRLCopy) Follow(ctx context.Context, log *slog.Logger) {
	c.follow(ctx, log, " revocation list", []string{c.files.CRL}, c.Reload)
}
