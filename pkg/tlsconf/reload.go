package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/pkg/filewatch"
)

// ServerTLS is a server config whose client CA bundle and revocation list are read again
// by Reload (and by Follow, on change and SIGHUP) without a restart and without dropping
// connections. A reload that fails keeps the last good CA and CRL in force (a revocation is
// never forgotten because a file broke) and Warning says so until a reload succeeds.
type ServerTLS struct {
	// Config is the config to serve with. Its fields may be changed before serving
	// (ClientAuth, NextProtos): every handshake starts from a copy of it.
	Config *tls.Config
	trustState
}

// trustState is what a follower of a client CA bundle and its revocation lists holds: the
// last good reading and why the last reload failed.
type trustState struct {
	files Files
	what  string
	// kept says what stays in force after a failed reload (in Warning).
	kept string

	mu       sync.RWMutex
	trust    *clientTrust // last good reading of files.CA and files.CRL (nil: no client CA)
	failed   error        // why the last reload failed (nil: it did not)
	failedAt time.Time
}

// clientTrust is one reading of the client CA bundle and its revocation lists.
type clientTrust struct {
	pool    *x509.CertPool
	cas     []*x509.Certificate // the certificates of pool
	crls    []*x509.RevocationList
	revoked map[string]bool // revokedKey of each listed certificate
	read    time.Time
	// verified holds the chains pool verified (a reading of another bundle starts afresh).
	verified *verifiedCache
}

// verifiedCacheMax bounds verifiedCache: past it the cache starts again empty (a client CA
// issues far fewer live certificates than that to one netmaster's callers).
const verifiedCacheMax = 4096

// verifiedCache maps a chain a client presented (its certificates' DER, concatenated: DER
// is self-delimiting) to the chains x509.Verify built from it against one client CA pool.
// Verification costs about 100 us, a look-up well under one: CheckChain runs on every
// request, and only the revocation check and the validity dates depend on the moment.
type verifiedCache struct {
	mu     sync.Mutex
	chains map[string][][]*x509.Certificate
}

func newVerifiedCache() *verifiedCache {
	return &verifiedCache{chains: map[string][][]*x509.Certificate{}}
}

// chainKey names a presented chain in verifiedCache.
func chainKey(chain []*x509.Certificate) string {
	if len(chain) == 1 {
		return string(chain[0].Raw)
	}
	n := 0
	for _, c := range chain {
		n += len(c.Raw)
	}
	b := make([]byte, 0, n)
	for _, c := range chain {
		b = append(b, c.Raw...)
	}
	return string(b)
}

func (v *verifiedCache) get(key string) [][]*x509.Certificate {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.chains[key]
}

func (v *verifiedCache) put(key string, chains [][]*x509.Certificate) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.chains) >= verifiedCacheMax {
		clear(v.chains)
	}
	v.chains[key] = chains
}

// revokedKey names a certificate by issuer and serial (serials are unique per issuer).
func revokedKey(rawIssuer []byte, serial *big.Int) string {
	return string(rawIssuer) + "\x00" + string(serial.Bytes())
}

// NewServer reads f as Server does and returns a config that Reload can refresh. what names
// the flags in errors.
func NewServer(f Files, what string) (*ServerTLS, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, fmt.Errorf("%s: a certificate and a key are both required", what)
	}
	if f.CRL != "" && f.CA == "" {
		return nil, fmt.Errorf("%s: a revocation list needs the client CA that signed it", what)
	}
	s := &ServerTLS{Config: &tls.Config{MinVersion: tls.VersionTLS12},
		trustState: trustState{files: f, what: what, kept: "the revocation list and the client CAs (less any removed since)"}}
	if err := loadPair(f, s.Config, what); err != nil {
		return nil, err
	}
	if f.CA == "" {
		return s, nil
	}
	t, err := readTrust(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s.trust = t
	s.Config.ClientCAs = t.pool
	s.Config.ClientAuth = tls.RequireAndVerifyClientCert
	s.Config.VerifyConnection = s.verifyConnection
	s.Config.GetConfigForClient = s.configForClient
	return s, nil
}

// readTrust reads the client CA bundle and the CRL file of f. Every CRL in the file must be
// signed by a CA of the bundle.
func readTrust(f Files) (*clientTrust, error) {
	pool, cas, err := loadCAs(f.CA)
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	return withCRLs(pool, cas, f.CRL)
}

// withCRLs reads the CRL file crlFile ("": none) for the client CAs cas (the certificates
// of pool). Every CRL in the file must be signed by one of them.
func withCRLs(pool *x509.CertPool, cas []*x509.Certificate, crlFile string) (*clientTrust, error) {
	t := &clientTrust{pool: pool, cas: cas, revoked: map[string]bool{}, read: time.Now(), verified: newVerifiedCache()}
	if crlFile == "" {
		return t, nil
	}
	var err error
	if t.crls, err = readCRLs(crlFile); err != nil {
		return nil, err
	}
	for _, crl := range t.crls {
		if err := signedByOneOf(crl, cas); err != nil {
			return nil, fmt.Errorf("revocation list %s: %w", crlFile, err)
		}
		for _, e := range crl.RevokedCertificateEntries {
			t.revoked[revokedKey(crl.RawIssuer, e.SerialNumber)] = true
		}
	}
	return t, nil
}

// readCRLs parses the CRLs of a PEM file ("X509 CRL" blocks) or one DER CRL. A file that
// ends inside a PEM block, or holds one that does not decode, is refused: it is being
// written in place (or was cut), and taking the blocks that do decode would forget the
// lists of the others.
func readCRLs(path string) ([]*x509.RevocationList, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("revocation list: read %w", err)
	}
	var ders [][]byte
	blocks := 0
	for blk, rest := pem.Decode(b); blk != nil; blk, rest = pem.Decode(rest) {
		blocks++
		if blk.Type == "X509 CRL" {
			ders = append(ders, blk.Bytes)
		}
	}
	if begins := pemBegins(b); begins != blocks {
		return nil, fmt.Errorf("revocation list %s: %d of its %d PEM blocks do not decode (the file ends inside a block: written in place and read half-written?)", path, begins-blocks, begins)
	}
	if len(ders) == 0 {
		ders = [][]byte{b} // (DER)
	}
	out := make([]*x509.RevocationList, 0, len(ders))
	for _, der := range ders {
		crl, err := x509.ParseRevocationList(der)
		if err != nil {
			return nil, fmt.Errorf("revocation list %s: not a PEM or DER X.509 CRL: %w", path, err)
		}
		if err := handledCritical(crl); err != nil {
			return nil, fmt.Errorf("revocation list %s of %q: %w", path, crl.Issuer.String(), err)
		}
		out = append(out, crl)
	}
	return out, nil
}

// pemBegins counts the lines of b that open a PEM block, as pem.Decode finds them.
func pemBegins(b []byte) int {
	n := 0
	for line := range bytes.Lines(b) {
		if bytes.HasPrefix(line, []byte("-----BEGIN ")) {
			n++
		}
	}
	return n
}

// handledCritical refuses a list with a critical extension this package does not act on
// (RFC 5280 §5.2: such a list must not be used): a delta CRL (2.5.29.27) holds only the
// revocations since its base, an issuing distribution point (2.5.29.28) may cover only
// some certificates or reasons, an entry's certificate issuer (2.5.29.29) names another
// issuer than the list's. Taken as a complete list, any of them would forget revocations.
func handledCritical(crl *x509.RevocationList) error {
	handled := func(id asn1.ObjectIdentifier) bool {
		return id.Equal(asn1.ObjectIdentifier{2, 5, 29, 20}) || id.Equal(asn1.ObjectIdentifier{2, 5, 29, 35}) // CRL number, authority key id
	}
	for _, e := range crl.Extensions {
		if e.Critical && !handled(e.Id) {
			return fmt.Errorf("critical extension %s is not supported (a delta or partial list cannot stand for the whole list)", e.Id)
		}
	}
	for _, rc := range crl.RevokedCertificateEntries {
		for _, e := range rc.Extensions {
			if e.Critical {
				return fmt.Errorf("entry %x: critical extension %s is not supported", rc.SerialNumber, e.Id)
			}
		}
	}
	return nil
}

// signedByOneOf checks crl's signature against the CA of cas that issued it.
func signedByOneOf(crl *x509.RevocationList, cas []*x509.Certificate) error {
	var errs []error
	for _, ca := range cas {
		if !bytes.Equal(ca.RawSubject, crl.RawIssuer) {
			continue
		}
		err := crl.CheckSignatureFrom(ca)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return fmt.Errorf("issued by %q, which is not a CA of the client CA bundle", crl.Issuer.String())
	}
	return fmt.Errorf("signature does not verify against the client CA %q: %w", crl.Issuer.String(), errors.Join(errs...))
}

// Reload reads the client CA bundle and the CRL again and takes them for every later
// handshake. On error the last good revocations stay in force and Warning reports the
// error; a CA taken out of a bundle that still reads is distrusted at once all the same
// (a bundle rotated before its CRL must not keep the old CA trusted), while a CA added
// waits for a reload that succeeds (its list was not read).
func (s *ServerTLS) Reload() error {
	if s.files.CA == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := readNext(s.trust, s.files)
	if err != nil {
		s.failed, s.failedAt = err, time.Now()
		if _, cas, cerr := loadCAs(s.files.CA); cerr == nil && s.trust != nil {
			s.trust = s.trust.keepOnly(cas)
		}
		return err
	}
	s.trust, s.failed = t, nil
	return nil
}

// readNext reads f again while cur is in force: the new reading, or why it cannot be
// taken (a broken file, or lists that would un-revoke).
func readNext(cur *clientTrust, f Files) (*clientTrust, error) {
	t, err := readTrust(f)
	if err != nil || cur == nil {
		return t, err
	}
	if err := takesOver(cur, t, f.CRL); err != nil {
		return nil, err
	}
	return t, nil
}

// takesOver refuses next, a reading of the list file crlFile, in place of cur when it
// would un-revoke: a list that goes back or a CA's list that is gone.
func takesOver(cur, next *clientTrust, crlFile string) error {
	if err := noRollback(cur.crls, next.crls, crlFile); err != nil {
		return err
	}
	return noListDropped(cur.crls, next, crlFile)
}

// noRollback refuses lists that go back: a list whose CRL number is below the number of
// the list in force from the same issuer. Restoring an older list (a backup, a stale
// copy) would otherwise un-revoke every certificate revoked since.
func noRollback(cur, next []*x509.RevocationList, path string) error {
	for _, n := range next {
		for _, c := range cur {
			if !bytes.Equal(c.RawIssuer, n.RawIssuer) || c.Number == nil || n.Number == nil {
				continue
			}
			if n.Number.Cmp(c.Number) < 0 {
				return fmt.Errorf("revocation list %s: number %v of %q is below %v, the list in force (an older list would un-revoke)", path, n.Number, n.Issuer.String(), c.Number)
			}
		}
	}
	return nil
}

// noListDropped refuses a reading that lost the list of a CA it still trusts: a file cut
// (or half written) at a block boundary parses, but taking it would un-revoke every
// certificate of that CA. A CA's list goes with the CA (out of the bundle) or with a
// restart without --tls-crl.
func noListDropped(cur []*x509.RevocationList, next *clientTrust, path string) error {
	for _, c := range cur {
		trusted := slices.ContainsFunc(next.cas, func(ca *x509.Certificate) bool { return bytes.Equal(ca.RawSubject, c.RawIssuer) })
		kept := slices.ContainsFunc(next.crls, func(n *x509.RevocationList) bool { return bytes.Equal(n.RawIssuer, c.RawIssuer) })
		if trusted && !kept {
			return fmt.Errorf("revocation list %s: the list of %q is gone while its CA stays in the client CA bundle (a file cut or half written? forgetting it would un-revoke)", path, c.Issuer.String())
		}
	}
	return nil
}

// keepOnly is t without the CAs that are not in cas (same revocations and lists).
func (t *clientTrust) keepOnly(cas []*x509.Certificate) *clientTrust {
	k := *t
	k.pool, k.cas, k.verified = x509.NewCertPool(), nil, newVerifiedCache()
	for _, c := range t.cas {
		if slices.ContainsFunc(cas, c.Equal) {
			k.pool.AddCert(c)
			k.cas = append(k.cas, c)
		}
	}
	return &k
}

// FollowEvery is how often Follow looks at the client CA and CRL files.
const FollowEvery = 2 * time.Second

// Follow reloads the client CA and CRL when a file changes and on SIGHUP until ctx ends.
func (s *ServerTLS) Follow(ctx context.Context, log *slog.Logger) {
	if s.files.CA == "" {
		return
	}
	paths := []string{s.files.CA}
	if s.files.CRL != "" {
		paths = append(paths, s.files.CRL)
	}
	s.follow(ctx, log, " client CA and revocation list", paths, s.Reload)
}

// follow calls reload when a file of paths (what names them after s.what) changes and on
// SIGHUP until ctx ends.
func (s *trustState) follow(ctx context.Context, log *slog.Logger, what string, paths []string, reload func() error) {
	filewatch.Reloader{What: s.what + what, Paths: paths, Reload: reload,
		Failed: "the last good ones stay in force", Log: log}.Follow(ctx, FollowEvery)
}

// Warning is "" while the CA and CRL in force are the files' current contents and no CRL
// is past its NextUpdate; otherwise what is wrong (for /healthz). An expired CRL stays in
// force: forgetting its revocations would be worse than enforcing a stale list.
func (s *trustState) Warning() string {
	s.mu.RLock()
	t, failed, at := s.trust, s.failed, s.failedAt
	s.mu.RUnlock()
	var w []string
	if failed != nil {
		w = append(w, fmt.Sprintf("%s: reload at %s failed, %s read at %s stay in force: %v",
			s.what, at.UTC().Format(time.RFC3339), s.kept, t.read.UTC().Format(time.RFC3339), failed))
	}
	if t != nil {
		now := time.Now()
		for _, crl := range t.crls {
			if !crl.NextUpdate.IsZero() && now.After(crl.NextUpdate) {
				w = append(w, fmt.Sprintf("%s: the revocation list of %q expired at %s (its next update is overdue; it stays in force)",
					s.what, crl.Issuer.String(), crl.NextUpdate.UTC().Format(time.RFC3339)))
			}
		}
	}
	return strings.Join(w, "; ")
}

// current is the trust in force.
func (s *trustState) current() *clientTrust {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.trust
}

// configForClient gives each handshake the client CA in force (tls.Config.GetConfigForClient).
func (s *ServerTLS) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	c := s.Config.Clone()
	c.GetConfigForClient = nil
	c.ClientCAs = s.current().pool
	return c, nil
}

// verifyConnection runs after the standard verification of every handshake, resumptions
// included: the chain must still verify against the client CA in force (a resumed session
// was verified against the CA of its first handshake) and no certificate of it be revoked.
func (s *ServerTLS) verifyConnection(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil // (ClientAuth decides whether that is allowed)
	}
	if len(cs.VerifiedChains) > 0 {
		// The chain the auth layer checks on every request: the verification this
		// handshake caches serves those requests too.
		return s.CheckChain(cs.VerifiedChains[0])
	}
	return s.CheckChain(cs.PeerCertificates)
}

// CheckChain checks a client's certificate chain (leaf first) against the client CA and
// CRL in force now: netmaster calls it on every request too, so that a certificate revoked
// after its connection was opened stops working on that connection as well. The chains
// verified against the CA bundle in force are kept (verifiedCache), so a request costs
// the revocation and validity-date checks, not another verification.
func (s *ServerTLS) CheckChain(chain []*x509.Certificate) error {
	t := s.current()
	if t == nil || len(chain) == 0 {
		return nil
	}
	key := chainKey(chain)
	chains := t.verified.get(key)
	if chains == nil {
		inter := x509.NewCertPool()
		for _, c := range chain[1:] {
			inter.AddCert(c)
		}
		var err error
		chains, err = chain[0].Verify(x509.VerifyOptions{Roots: t.pool, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if err != nil {
			return fmt.Errorf("client certificate %q: %w", chain[0].Subject.CommonName, err)
		}
		t.verified.put(key, chains)
	}
	// The verified chains, not the presented one: a client may leave out an intermediate
	// that the bundle holds (and a root's list may revoke it).
	now := time.Now()
	var refused error
	for _, vc := range chains {
		if refused = t.refusedIn(vc, now, s.files.CRL); refused == nil {
			return nil
		}
	}
	return refused
}

// refusedIn names the first certificate of a verified chain that a list of t revokes or
// that is not valid at now (nil: none; Verify checked the dates when the chain was cached).
func (t *clientTrust) refusedIn(chain []*x509.Certificate, now time.Time, crlFile string) error {
	for _, c := range chain {
		if t.revoked[revokedKey(c.RawIssuer, c.SerialNumber)] {
			return fmt.Errorf("client certificate %q (serial %x) is revoked by %s", c.Subject.CommonName, c.SerialNumber, crlFile)
		}
		if now.Before(c.NotBefore) || now.After(c.NotAfter) {
			return fmt.Errorf("client certificate %q: %q is not valid at %s (valid %s to %s)", chain[0].Subject.CommonName,
				c.Subject.CommonName, now.UTC().Format(time.RFC3339), c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return nil
}
