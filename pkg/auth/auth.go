// Package auth owns who may call netmaster's API: identities from bearer tokens (a token
// file) or verified client certificates, and the role rules that decide each request.
//
// Roles:
//
//	admin                  everything
//	read-only              GET/HEAD only
//	tenant-admin:<tenant>  reads and writes of that tenant's objects only (lists are
//	                       filtered by netmaster); global objects are read-only
//	agent                  what a netplugin needs: /plugin/*, reads, and the docker
//	                       driver's network create/delete
//	netmaster              a peer netmaster forwarding a caller it authenticated
//
// A token file has one "<token> <role> [<name>]" per line; '#' starts a comment. It must
// not be readable by group or others. A client certificate's identity is its subject CN
// and its role the first subject Organization (O=admin, O=agent, O=tenant-admin:t1, ...).
package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/pkg/filewatch"
)

// Role names.
const (
	RoleAdmin       = "admin"
	RoleReadOnly    = "read-only"
	RoleAgent       = "agent"
	RoleNetmaster   = "netmaster"
	roleTenantAdmin = "tenant-admin:"
)

// Identity is an authenticated caller.
type Identity struct {
	Name string `json:"name"`
	Role string `json:"role"`
	// Via is how it was authenticated: "token", "certificate", "peer:<name>", "insecure".
	Via string `json:"via"`
}

// Tenant returns the tenant a tenant-admin is confined to.
func (id Identity) Tenant() (string, bool) {
	t, ok := strings.CutPrefix(id.Role, roleTenantAdmin)
	return t, ok
}

// HostPrefix names an agent identity bound to one host: a token line "<token> agent
// host:<host>", or a client certificate with O=agent and CN=host:<host>. Such an agent may
// create, change and delete only endpoints of that host (netmaster's /plugin routes); an
// agent identity named otherwise (one token shared by every host) is not confined.
const HostPrefix = "host:"

// checkBinding refuses an agent name that looks like a host binding but is not one
// ("Host:h1", "HOST:h1", "host:"): it would silently leave the agent unconfined.
func checkBinding(id Identity) error {
	if id.Role != RoleAgent || !strings.HasPrefix(strings.ToLower(id.Name), HostPrefix) {
		return nil
	}
	if _, ok := id.BoundHost(); !ok {
		return fmt.Errorf("agent name %q: a host binding is written %s<host>", id.Name, HostPrefix)
	}
	return nil
}

// BoundHost returns the host an agent identity is bound to (HostPrefix).
func (id Identity) BoundHost() (string, bool) {
	if id.Role != RoleAgent {
		return "", false
	}
	h, ok := strings.CutPrefix(id.Name, HostPrefix)
	if !ok || h == "" {
		return "", false
	}
	return h, true
}

// ValidRole reports whether r is a known role.
func ValidRole(r string) bool {
	switch r {
	case RoleAdmin, RoleReadOnly, RoleAgent, RoleNetmaster:
		return true
	}
	t, ok := strings.CutPrefix(r, roleTenantAdmin)
	return ok && t != "" && !strings.ContainsAny(t, " :/")
}

// Tokens maps token digests to identities: the token file as last read. Reload reads it
// again (a revoked token stops working without a restart). A file that cannot be taken
// (missing, unreadable, readable by others, a bad line, no token) leaves no token working
// until it is fixed: deleting or emptying the file revokes, it never keeps the old set.
type Tokens struct {
	path string
	// every is how far apart two readings must be to confirm that a host left the file
	// (FollowEvery, one poll).
	every time.Duration

	reloading sync.Mutex // held across a reading and its taking: readings are taken in order
	held      heldLine   // (under reloading)
	mu        sync.RWMutex
	set       tokenSet
	bound     boundHosts
}

// heldLine is a reading of the token file whose last line had no newline: that line counts
// only once the file reads the same at least one poll later. A file read while it is
// written in place can end inside a line that still parses as another identity:
// "tenant-admin:t10 bob" cut to "tenant-admin:t1" (another tenant), "agent host:node10" to
// "agent host:node1" (another host) or "agent" (an agent bound to no host).
type heldLine struct {
	body []byte    // the whole file as read
	at   time.Time // when it was first read so
}

// hold returns the part of body that counts now (body without a last line that has no
// newline, until the file reads the same one poll later) and, when a line is held back,
// why (wrapping filewatch.ErrAgain: read it again).
func (t *Tokens) hold(body []byte, now time.Time) ([]byte, error) {
	if len(body) == 0 || body[len(body)-1] == '\n' {
		t.held = heldLine{}
		return body, nil
	}
	if !bytes.Equal(t.held.body, body) {
		t.held = heldLine{body: body, at: now}
	} else if now.Sub(t.held.at) >= t.every {
		return body, nil
	}
	return body[:bytes.LastIndexByte(body, '\n')+1], fmt.Errorf("token file %s: its last line has no newline (cut while written?): it counts once the file reads the same %s later: %w",
		t.path, t.every, filewatch.ErrAgain)
}

// boundHosts follows the hosts the readings of the token file bind (BoundHosts). A file
// rewritten in place is read cut at a line boundary now and then, and a host gone from one
// reading loses its etcd user, role and WireGuard record: a host leaves only when a second
// reading, at least one poll after the first that lacked it, lacks it too. A host added
// counts at once.
type boundHosts struct {
	hosts   map[string]bool      // the hosts of the last reading taken
	first   time.Time            // when the first reading was taken
	settled bool                 // a reading one poll after the first was taken
	lacking map[string]time.Time // a host the reading before bound: when the first reading lacked it
}

// take records a reading taken at now binding hosts.
func (b *boundHosts) take(hosts map[string]bool, now time.Time, every time.Duration) {
	if b.first.IsZero() {
		b.first = now
	} else if now.Sub(b.first) >= every {
		b.settled = true
	}
	if b.lacking == nil {
		b.lacking = map[string]time.Time{}
	}
	for h, since := range b.lacking {
		if hosts[h] || now.Sub(since) >= every {
			delete(b.lacking, h) // (back, or gone in two readings a poll apart)
		}
	}
	for h := range b.hosts {
		if !hosts[h] {
			b.lacking[h] = now
		}
	}
	b.hosts = hosts
}

// due says whether a reading at now would confirm something (a host's removal, or the
// first reading).
func (b *boundHosts) due(now time.Time, every time.Duration) bool {
	if !b.settled && !b.first.IsZero() && now.Sub(b.first) >= every {
		return true
	}
	for _, since := range b.lacking {
		if now.Sub(since) >= every {
			return true
		}
	}
	return false
}

// tokenSet is one reading of the token file.
type tokenSet struct {
	byDigest map[[32]byte]Identity
	peer     string // a token of role netmaster, used to forward callers to the leader
}

// LoadTokens reads a token file.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path, every: FollowEvery}
	if err := t.Reload(); err != nil && !errors.Is(err, filewatch.ErrAgain) {
		return nil, err
	}
	return t, nil
}

// Reload reads the token file again and takes it: tokens no longer in it stop working at
// once. On error no token works (the error says why) until a reload takes a valid file. A
// last line without its newline is held back until the file reads the same one poll
// later (heldLine): the rest is taken and the error wraps filewatch.ErrAgain.
func (t *Tokens) Reload() error {
	t.reloading.Lock()
	defer t.reloading.Unlock()
	now := time.Now()
	body, err := readTokenFile(t.path)
	var held error
	if err == nil {
		body, held = t.hold(body, now)
	}
	var set tokenSet
	if err == nil {
		set, err = parseTokens(t.path, body, held != nil)
	}
	if err != nil {
		set = tokenSet{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.set = set
	if err != nil {
		return err
	}
	t.bound.take(set.hosts(), now, t.every)
	return held
}

// reloader reloads the token file through pkg/filewatch.
func (t *Tokens) reloader(log *slog.Logger) filewatch.Reloader {
	return filewatch.Reloader{What: "token file", Paths: []string{t.path}, Reload: t.Reload,
		Failed: "no token works until it is fixed", Log: log}
}

// Watch reloads the tokens whenever the file changes (checked every `every`) until ctx
// ends, logging each reload and each file it refuses.
func (t *Tokens) Watch(ctx context.Context, every time.Duration, log *slog.Logger) {
	t.reloader(log).Poll(ctx, every)
}

// FollowEvery is how often Follow looks at the token file for changes.
const FollowEvery = 2 * time.Second

// Follow reloads the tokens when the file changes (looked at every FollowEvery) and on
// SIGHUP, until ctx ends: a revoked token stops working without a restart.
func (t *Tokens) Follow(ctx context.Context, log *slog.Logger) {
	t.reloader(log).Follow(ctx, FollowEvery)
}

// readTokenFile reads the token file at path, refused when others may read or rewrite it
// (CheckSecretFile).
func readTokenFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if err := CheckSecretFile("token file "+path, st); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return b, nil
}

// CheckSecretFile refuses a file of secrets (named what, with status st) that another user
// owns (its owner can read it and rewrite it: only this process's user or root may own it)
// or that group or others may read or write.
func CheckSecretFile(what string, st os.FileInfo) error {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s: owned by uid %d, who can read and rewrite it; chown it to uid %d or root", what, sys.Uid, os.Geteuid())
	}
	if st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s: mode %o lets group or others read it; chmod 600 it", what, st.Mode().Perm())
	}
	return nil
}

// parseTokens parses body, the token file at path (with partial, a part of it: it may
// hold no token yet).
func parseTokens(path string, body []byte, partial bool) (tokenSet, error) {
	t := tokenSet{byDigest: map[[32]byte]Identity{}}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) < 2 || len(fields) > 3 {
			return tokenSet{}, fmt.Errorf("token file %s line %d: want \"<token> <role> [<name>]\"", path, n)
		}
		if len(fields[0]) < 16 {
			return tokenSet{}, fmt.Errorf("token file %s line %d: token shorter than 16 characters", path, n)
		}
		if !ValidRole(fields[1]) {
			return tokenSet{}, fmt.Errorf("token file %s line %d: unknown role %q (admin, read-only, agent, netmaster, tenant-admin:<tenant>)", path, n, fields[1])
		}
		id := Identity{Role: fields[1], Name: fields[1], Via: "token"}
		if len(fields) == 3 {
			id.Name = fields[2]
		}
		if err := checkBinding(id); err != nil {
			return tokenSet{}, fmt.Errorf("token file %s line %d: %w", path, n, err)
		}
		d := sha256.Sum256([]byte(fields[0]))
		if _, dup := t.byDigest[d]; dup {
			return tokenSet{}, fmt.Errorf("token file %s line %d: token repeated", path, n)
		}
		t.byDigest[d] = id
		if id.Role == RoleNetmaster && t.peer == "" {
			t.peer = fields[0]
		}
	}
	if err := sc.Err(); err != nil {
		return tokenSet{}, fmt.Errorf("token file %s: %w", path, err)
	}
	if len(t.byDigest) == 0 && !partial {
		return tokenSet{}, fmt.Errorf("token file %s: no tokens", path)
	}
	return t, nil
}

func (t *Tokens) lookup(tok string) (Identity, bool) {
	if t == nil || tok == "" {
		return Identity{}, false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	id, ok := t.set.byDigest[sha256.Sum256([]byte(tok))]
	return id, ok
}

// hosts are the hosts the agent tokens of s are bound to (HostPrefix).
func (s tokenSet) hosts() map[string]bool {
	out := map[string]bool{}
	for _, id := range s.byDigest {
		if h, ok := id.BoundHost(); ok {
			out[h] = true
		}
	}
	return out
}

// BoundHosts are the hosts the file's agent tokens are bound to (HostPrefix), sorted, and
// whether a host missing from them was removed (what etcd RBAC deletes a host's user,
// role and WireGuard record on). A host is removed only when two readings at least one
// poll apart lack it (boundHosts: a file read while it is written in place may be cut at
// a line boundary), so it is listed until then, and no host is removed before a reading
// one poll after the first (netmaster may start while the file is written). BoundHosts
// reads the file again when that would confirm a removal. A refused file (no token
// works) says nothing of which hosts were removed either (a typo is not a revocation).
func (t *Tokens) BoundHosts() ([]string, bool) {
	t.mu.RLock()
	due := t.bound.due(time.Now(), t.every)
	t.mu.RUnlock()
	if due {
		_ = t.Reload() // (a refused file is reported by the reloader that follows it)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]string, 0, len(t.bound.hosts)+len(t.bound.lacking))
	for h := range t.bound.hosts {
		out = append(out, h)
	}
	for h := range t.bound.lacking {
		out = append(out, h)
	}
	sort.Strings(out)
	return out, t.set.byDigest != nil && t.bound.settled
}

// PeerToken is a token of role netmaster ("" if the file has none).
func (t *Tokens) PeerToken() string {
	if t == nil {
		return ""
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.set.peer
}

// Header names.
const (
	// ForwardedIdentityHeader carries the caller a follower authenticated; honoured only
	// on a request that itself authenticates as role netmaster.
	ForwardedIdentityHeader = "X-Contivbpf-Identity"
	// ContivTokenHeader is the header Contiv's netctl sends after `netctl login`.
	ContivTokenHeader = "X-Auth-Token"
)

type ctxKey struct{}

// FromContext returns the caller of a request that passed the middleware.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// TenantScope returns the tenant a request's caller is confined to (scoped true for a
// tenant-admin): what netmaster shows it is filtered to that tenant. A request without an
// identity (a handler called without the middleware) is not scoped.
func TenantScope(ctx context.Context) (tenant string, scoped bool) {
	id, ok := FromContext(ctx)
	if !ok {
		return "", false
	}
	return id.Tenant()
}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// Config says how requests are authenticated.
type Config struct {
	// Tokens, when set, accepts bearer tokens (Authorization: Bearer, or X-Auth-Token).
	Tokens *Tokens
	// Certificates accepts verified client certificates (the TLS server verifies them).
	Certificates bool
	// CheckCertificate, when set, checks a verified chain (leaf first) again on every
	// request: a certificate revoked after its connection was opened is refused.
	CheckCertificate func(chain []*x509.Certificate) error
	// Open lets every request in as admin ("insecure" mode without tokens).
	Open bool
}

// BearerToken is the token of an Authorization header value h with the Bearer scheme,
// matched without regard to case (RFC 9110 §11.1: "bearer" is Bearer); ok false for any
// other scheme or an empty token.
func BearerToken(h string) (string, bool) {
	scheme, v, ok := strings.Cut(strings.TrimSpace(h), " ")
	v = strings.TrimSpace(v)
	return v, ok && strings.EqualFold(scheme, "Bearer") && v != ""
}

// Authenticate returns the caller of r; ok false means no valid credential was given.
// A bad credential is an error (401), never a fallback to another method.
func (c Config) Authenticate(r *http.Request) (Identity, error) {
	var id Identity
	var found bool
	tok := ""
	if h := r.Header.Get("Authorization"); h != "" {
		var ok bool
		if tok, ok = BearerToken(h); !ok {
			return Identity{}, fmt.Errorf("authorization header: only Bearer tokens are accepted")
		}
	} else if h := r.Header.Get(ContivTokenHeader); h != "" {
		tok = strings.TrimSpace(h)
	}
	switch {
	case tok != "":
		if c.Tokens == nil {
			return Identity{}, fmt.Errorf("token given but this netmaster accepts no tokens")
		}
		if id, found = c.Tokens.lookup(tok); !found {
			return Identity{}, fmt.Errorf("unknown token")
		}
	case c.Certificates && r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
		cert := r.TLS.VerifiedChains[0][0]
		if c.CheckCertificate != nil {
			if err := c.CheckCertificate(r.TLS.VerifiedChains[0]); err != nil {
				return Identity{}, err
			}
		}
		role := ""
		if len(cert.Subject.Organization) > 0 {
			role = cert.Subject.Organization[0]
		}
		if !ValidRole(role) {
			return Identity{}, fmt.Errorf("client certificate %q: organization %q is not a role", cert.Subject.CommonName, role)
		}
		id, found = Identity{Name: cert.Subject.CommonName, Role: role, Via: "certificate"}, true
		if err := checkBinding(id); err != nil {
			return Identity{}, fmt.Errorf("client certificate: %w", err)
		}
	case c.Open:
		return Identity{Name: "anonymous", Role: RoleAdmin, Via: "insecure"}, nil
	}
	if !found {
		return Identity{}, errNoCredentials
	}
	if fwd := r.Header.Get(ForwardedIdentityHeader); fwd != "" {
		if id.Role != RoleNetmaster {
			return Identity{}, fmt.Errorf("%s is only accepted from a peer netmaster", ForwardedIdentityHeader)
		}
		var inner Identity
		if err := json.Unmarshal([]byte(fwd), &inner); err != nil || !ValidRole(inner.Role) || inner.Role == RoleNetmaster {
			return Identity{}, fmt.Errorf("%s: malformed", ForwardedIdentityHeader)
		}
		inner.Via = "peer:" + id.Name + "/" + inner.Via
		return inner, nil
	}
	return id, nil
}

var errNoCredentials = fmt.Errorf("authentication required: send \"Authorization: Bearer <token>\" or a client certificate")

// Bearer returns a RoundTripper that sends token as "Authorization: Bearer" with every
// request next carries (the client side of Config.Authenticate).
func Bearer(token string, next http.RoundTripper) http.RoundTripper {
	return bearer{token: token, next: next}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
