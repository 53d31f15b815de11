// Package etcdrbac confines agents' etcd credentials with etcd's own users and roles.
// With client-certificate authentication etcd takes a client's user name from its
// certificate's common name; netmaster (user root, and its own certificate's CN, both of
// role root) enables auth on its embedded etcd and gives each host's agent a user and a
// role named "host:<host>" (the identity its netmaster credential is bound to): read on
// /contiv.io/, and read-write only on that host's own keys, its VTEP record, its BGP
// session record and the exact service registration keys it enrolled. Everything else an
// agent changes goes through netmaster's /plugin routes.
package etcdrbac

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// RootUser is the user etcd requires before auth can be enabled.
const RootUser = "root"

// ReadPrefix is what every agent reads (networks, endpoints, policies of all hosts).
const ReadPrefix = "/contiv.io/"

// agentService: the registrations an agent may enroll are netplugin's own, its VTEP's and
// its inspect API's.
func agentService(name string) bool {
	return name == "netplugin" || name == vxlan.VTEPService || name == cluster.ServiceInspect
}

// ErrClaimed is returned when a registration key is already granted to another host.
var ErrClaimed = errors.New("registration key granted to another host")

// ErrBadRegistration is returned for a registration an agent may not enroll.
var ErrBadRegistration = errors.New("invalid registration")

// ErrNotManaged is returned by a joined Manager (Join) while etcd's auth is off: it
// manages no users then.
var ErrNotManaged = errors.New("etcd's auth is off: netmaster manages no etcd users")

// ErrRevoked is returned for a host whose token left the token file (Follow deleted its
// user): an enrollment still under way must not make the user again.
var ErrRevoked = errors.New("host's token was removed: its etcd user is revoked")

// Records netmaster keeps of the users it manages (etcd's root writes them, agents read
// them like all of /contiv.io/):
//
//	ClaimsPrefix<registration key without /contiv.io/>  the host whose role holds it
//	TokenHostsPrefix<host>                              a user made for a token's host ("")
//	                                                    or one whose token went (tokenRemoved)
//
// A claim is taken in a transaction, so two netmasters enrolling at once never grant one
// key to two hosts, and an enrollment reads only its own keys' claims, never every host's
// role.
const (
	ClaimsPrefix     = "/contiv.io/state/etcdrbac/claims/"
	TokenHostsPrefix = "/contiv.io/state/etcdrbac/tokenhosts/"
)

func claimKey(regKey string) string { return ClaimsPrefix + strings.TrimPrefix(regKey, ReadPrefix) }

// tokenRemoved marks a token host record whose token left the file: its user is deleted
// and Enroll refuses the host (ErrRevoked) until its token is back.
const tokenRemoved = "removed"

// TokenRemoved reports whether v, the value of a host's TokenHostsPrefix record, says its
// token left the token file (netmaster refuses that host's late writes with it).
func TokenRemoved(v []byte) bool { return string(v) == tokenRemoved }

// Manager creates and updates the agents' etcd users and roles. Its client must be
// etcd's root (netmaster's).
type Manager struct {
	cli  *clientv3.Client
	auth clientv3.Auth // (cli's: a test counts its calls)
	log  *slog.Logger
	mu   sync.Mutex // one enrollment at a time in this process (claims order them across)
	// ensured are the hosts whose user and base role exist (Follow's cache).
	ensured map[string]bool
	// migrated: the claims of roles granted before claims were recorded are recorded.
	migrated bool
	// joinRoot is the root user of a joined Manager (Join; "" otherwise), joinOn whether
	// it found auth on and joinRoot root (it manages users from then on).
	joinRoot string
	joinOn   bool
	// oldEtcdLogged: the warning that etcd cannot report its auth status was logged.
	oldEtcdLogged bool
	// removed are the token hosts whose user this Manager deleted (Follow's cache: a
	// record marked tokenRemoved by a run that failed halfway is tried again).
	removed map[string]bool
}

// New returns a Manager acting through cli.
func New(cli *clientv3.Client, log *slog.Logger) *Manager {
	return &Manager{cli: cli, auth: cli.Auth, log: log, ensured: map[string]bool{}, removed: map[string]bool{}}
}

// UserOf is the etcd user (and role) name of host's agent: its etcd certificate's CN.
func UserOf(host string) string { return auth.HostPrefix + host }

// Enable makes RootUser and rootUser (netmaster's certificate CN) users of role root and
// turns etcd's auth on; with auth already on it only checks that rootUser is still root.
func (m *Manager) Enable(ctx context.Context, rootUser string) error {
	if err := notAgentUser(rootUser); err != nil {
		return err
	}
	st, err := m.cli.AuthStatus(ctx)
	if err != nil {
		return fmt.Errorf("etcd auth status: %w", err)
	}
	if st.Enabled {
		// Restarted on an etcd whose auth is on: this certificate must still be root, or
		// every agent's user would fail later, one by one.
		return m.checkRoot(ctx, rootUser)
	}
	for _, u := range uniq(RootUser, rootUser) {
		if err := m.addUser(ctx, u); err != nil {
			return err
		}
		if _, err := m.cli.UserGrantRole(ctx, u, "root"); err != nil {
			return fmt.Errorf("etcd: grant role root to %q: %w", u, err)
		}
	}
	if _, err := m.cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcd: enable auth: %w", err)
	}
	m.log.Info("etcd RBAC on: agents get users host:<host> confined to their own host's keys", "root", rootUser)
	return nil
}

// notAgentUser refuses netmaster's certificate CN rootUser when it names an agent's user.
func notAgentUser(rootUser string) error {
	if strings.HasPrefix(rootUser, auth.HostPrefix) {
		// The agent of that host would be etcd's root: its user has that name.
		return fmt.Errorf("netmaster's etcd certificate CN %q: %s<host> names an agent's etcd user, not root", rootUser, auth.HostPrefix)
	}
	return nil
}

// checkRoot checks that rootUser is a user of etcd's role root.
func (m *Manager) checkRoot(ctx context.Context, rootUser string) error {
	u, err := m.cli.UserGet(ctx, rootUser)
	if err != nil {
		return fmt.Errorf("etcd auth is on and certificate CN %q is not etcd's root user: %w", rootUser, err)
	}
	if !slices.Contains(u.Roles, "root") {
		return fmt.Errorf("etcd auth is on and certificate CN %q has not etcd's root role (roles %v)", rootUser, u.Roles)
	}
	return nil
}

// Join makes m the Manager of a netmaster that does not run the etcd (--etcd-endpoints):
// it manages the agents' users only while etcd's auth is on and rootUser (its
// certificate's CN) is etcd's root, as the netmaster that turned auth on is. It never
// turns auth on (an etcd netmaster does not run is its operators' to secure): while auth
// is off Enroll answers ErrNotManaged and Follow makes no user, and auth coming on later
// is seen by the next call (before: a netmaster that joined while auth was off managed
// nothing until restarted). Join reports whether auth is on now; auth on with rootUser not
// root is an error naming it (then, and at each later call).
func (m *Manager) Join(ctx context.Context, rootUser string) (bool, error) {
	if err := notAgentUser(rootUser); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.joinRoot = rootUser
	switch err := m.managing(ctx); {
	case errors.Is(err, ErrNotManaged):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// Managing is nil when m manages users now: always unless it joined (Join); a joined one
// once etcd's auth is on and its root checked (ErrNotManaged while auth is off).
func (m *Manager) Managing(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.managing(ctx)
}

// managing is nil when m manages users now: always unless it joined (Join); a joined one
// once etcd's auth is on and its root checked (ErrNotManaged while auth is off). It holds
// m.mu.
func (m *Manager) managing(ctx context.Context) error {
	if m.joinRoot == "" || m.joinOn {
		return nil
	}
	st, err := m.cli.AuthStatus(ctx)
	if status.Code(err) == codes.Unimplemented {
		// etcd before 3.5 (Debian 12's 3.4) cannot say whether its auth is on: a joined
		// netmaster leaves users to the one that enabled auth, as before it could join.
		if !m.oldEtcdLogged {
			m.oldEtcdLogged = true
			m.log.Warn("etcd too old to report its auth status (needs 3.5): agents' etcd users are not managed by this netmaster")
		}
		return ErrNotManaged
	}
	if err != nil {
		return fmt.Errorf("etcd auth status: %w", err)
	}
	if !st.Enabled {
		return ErrNotManaged
	}
	if err := m.checkRoot(ctx, m.joinRoot); err != nil {
		return err
	}
	m.joinOn = true
	return nil
}

func uniq(a, b string) []string {
	if a == b || b == "" {
		return []string{a}
	}
	return []string{a, b}
}

func (m *Manager) addUser(ctx context.Context, name string) error {
	_, err := m.auth.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true})
	if err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return fmt.Errorf("etcd: add user %q: %w", name, err)
	}
	return nil
}

// HostKeys are the keys host's agent writes besides its registrations.
func HostKeys(host string) []string {
	return []string{vxlan.HostVTEPKey(host), model.BgpOperKey(host)}
}

// checkHost refuses a host name no etcd user is made for.
func checkHost(host string) error {
	if host == "" || strings.ContainsAny(host, "/") {
		return fmt.Errorf("etcd user of host %q: invalid host name", host)
	}
	return nil
}

// EnsureHost creates host's user and role (read on ReadPrefix, read-write on HostKeys);
// it is idempotent.
func (m *Manager) EnsureHost(ctx context.Context, host string) error {
	if err := checkHost(host); err != nil {
		return err
	}
	name := UserOf(host)
	if err := m.addUser(ctx, name); err != nil {
		return err
	}
	if _, err := m.auth.RoleAdd(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("etcd: add role %q: %w", name, err)
	}
	if _, err := m.auth.RoleGrantPermission(ctx, name, ReadPrefix, clientv3.GetPrefixRangeEnd(ReadPrefix), clientv3.PermissionType(clientv3.PermRead)); err != nil {
		return fmt.Errorf("etcd: grant role %q read on %s: %w", name, ReadPrefix, err)
	}
	for _, k := range HostKeys(host) {
		if _, err := m.auth.RoleGrantPermission(ctx, name, k, "", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			return fmt.Errorf("etcd: grant role %q write on %s: %w", name, k, err)
		}
	}
	if _, err := m.auth.UserGrantRole(ctx, name, name); err != nil {
		return fmt.Errorf("etcd: grant role %q to its user: %w", name, err)
	}
	return nil
}

// Enroll makes regs host's registration keys: its role may write exactly those under
// /contiv.io/service/ (earlier ones no longer asked for are revoked). A key granted to
// another host's role is refused (ErrClaimed), as is a service an agent does not register
// or an address that is not one (ErrBadRegistration); on refusal nothing changes.
func (m *Manager) Enroll(ctx context.Context, host string, regs []model.EtcdRegistration) error {
	want := map[string]bool{}
	for _, r := range regs {
		a, err := netip.ParseAddr(r.HostAddr)
		switch {
		case !agentService(r.ServiceName):
			return fmt.Errorf("%w: ServiceName %q is not an agent's", ErrBadRegistration, r.ServiceName)
		case err != nil || a.Zone() != "":
			return fmt.Errorf("%w: HostAddr %q is not an IP address", ErrBadRegistration, r.HostAddr)
		case r.Port <= 0 || r.Port > 65535:
			return fmt.Errorf("%w: Port %d out of range 1-65535", ErrBadRegistration, r.Port)
		}
		want[cluster.ServiceKey(r.ServiceName, a.String(), r.Port)] = true
	}
	if len(want) > 16 {
		return fmt.Errorf("%w: %d registrations, at most 16", ErrBadRegistration, len(want))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.managing(ctx); err != nil {
		return err
	}
	if err := m.checkRevoked(ctx, host); err != nil {
		return err
	}
	if err := m.EnsureHost(ctx, host); err != nil {
		return err
	}
	if err := m.migrate(ctx); err != nil {
		return err
	}
	name := UserOf(host)
	have, err := m.serviceKeys(ctx, name)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if err := m.claim(ctx, host, keys); err != nil {
		return err
	}
	for _, k := range have {
		if want[k] {
			continue
		}
		if _, err := m.auth.RoleRevokePermission(ctx, name, k, ""); err != nil {
			return fmt.Errorf("etcd: revoke %s from role %q: %w", k, name, err)
		}
		if err := m.release(ctx, host, k); err != nil {
			return err
		}
	}
	for _, k := range keys {
		if _, err := m.auth.RoleGrantPermission(ctx, name, k, "", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			return fmt.Errorf("etcd: grant role %q write on %s: %w", name, k, err)
		}
	}
	// Another netmaster may have removed the host meanwhile (its token file lost the
	// token): marked after the first check, it deleted the user before this one made it
	// again, so this enrollment undoes itself. (Marked after this check, its removal
	// comes after these writes and deletes them.)
	if err := m.checkRevoked(ctx, host); err != nil {
		if errors.Is(err, ErrRevoked) {
			if rerr := m.RemoveHost(ctx, host); rerr != nil {
				return fmt.Errorf("%w (and undoing this enrollment: %w)", err, rerr)
			}
		}
		return err
	}
	m.log.Info("etcd registrations enrolled", "user", name, "keys", keys)
	return nil
}

// checkRevoked refuses (ErrRevoked) a host whose token left the token file: a call
// authenticated before, or forwarded by a netmaster that has not reloaded its file yet,
// would make its user again, and no token removal would delete it any more.
func (m *Manager) checkRevoked(ctx context.Context, host string) error {
	r, err := m.cli.Get(ctx, TokenHostsPrefix+host)
	if err != nil {
		return fmt.Errorf("etcd: read token host %s: %w", host, err)
	}
	if len(r.Kvs) > 0 && string(r.Kvs[0].Value) == tokenRemoved {
		return fmt.Errorf("%w: %s", ErrRevoked, UserOf(host))
	}
	return nil
}

// claim records keys as host's in one transaction, which fails (ErrClaimed, nothing
// written) when another host holds one, and runs again when a claim changed meanwhile.
func (m *Manager) claim(ctx context.Context, host string, keys []string) error {
	for {
		var cmps []clientv3.Cmp
		var puts []clientv3.Op
		for _, k := range keys {
			ck := claimKey(k)
			r, err := m.cli.Get(ctx, ck)
			if err != nil {
				return fmt.Errorf("etcd: read claim %s: %w", ck, err)
			}
			if len(r.Kvs) > 0 && string(r.Kvs[0].Value) != host {
				if err := m.heldBy(ctx, string(r.Kvs[0].Value), k); err != nil {
					return err
				}
			}
			var rev int64
			if len(r.Kvs) > 0 {
				rev = r.Kvs[0].ModRevision
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(ck), "=", rev))
			puts = append(puts, clientv3.OpPut(ck, host))
		}
		if len(puts) == 0 {
			return nil
		}
		r, err := m.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return fmt.Errorf("etcd: claim registrations of %s: %w", host, err)
		}
		if r.Succeeded {
			return nil
		}
	}
}

// heldBy is ErrClaimed when holder, whose claim of key another host asks for, still has
// its role; nil when the role is gone (deleted by hand, or a removal stopped between
// deleting it and releasing its claims): the claim is stale and may be taken. A holder
// enrolling has its role before it claims (EnsureHost), and the claim is taken in a
// transaction on the claim's revision, so a holder claiming meanwhile wins or loses whole.
func (m *Manager) heldBy(ctx context.Context, holder, key string) error {
	_, err := m.auth.RoleGet(ctx, UserOf(holder))
	switch {
	case errors.Is(err, rpctypes.ErrRoleNotFound):
		m.log.Warn("etcd RBAC: stale registration claim taken over: its host has no role", "key", key, "holder", UserOf(holder))
		return nil
	case err != nil:
		return fmt.Errorf("etcd: get role %q holding %s: %w", UserOf(holder), key, err)
	}
	return fmt.Errorf("%w: %s is %s's", ErrClaimed, key, holder)
}

// release drops host's claim of key (another host's is left alone).
func (m *Manager) release(ctx context.Context, host, key string) error {
	ck := claimKey(key)
	_, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(ck), "=", host)).Then(clientv3.OpDelete(ck)).Commit()
	if err != nil {
		return fmt.Errorf("etcd: release claim %s: %w", ck, err)
	}
	return nil
}

// migrate records the claims of registration keys granted before claims were recorded (a
// netmaster of an earlier build enrolled them): once per Manager, reading every host's
// role once, so a key granted then is still refused to another host.
func (m *Manager) migrate(ctx context.Context) error {
	if m.migrated {
		return nil
	}
	roles, err := m.auth.RoleList(ctx)
	if err != nil {
		return fmt.Errorf("etcd: list roles: %w", err)
	}
	for _, r := range roles.Roles {
		host, ok := strings.CutPrefix(r, auth.HostPrefix)
		if !ok {
			continue
		}
		keys, err := m.serviceKeys(ctx, r)
		if err != nil {
			return err
		}
		for _, k := range keys {
			ck := claimKey(k)
			if _, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(ck), "=", 0)).Then(clientv3.OpPut(ck, host)).Commit(); err != nil {
				return fmt.Errorf("etcd: record claim %s: %w", ck, err)
			}
		}
	}
	m.migrated = true
	return nil
}

// RemoveHost deletes host's etcd user and role and its claims: its agent's certificate
// reads and writes nothing any more, and its registration keys are free for other hosts.
// Its published WireGuard record goes too (model.WireGuardKey): every other host removes
// that peer and its route, and its VTEP falls to their blackhole (docs/encryption.md).
// A user, role or record already gone is no error.
func (m *Manager) RemoveHost(ctx context.Context, host string) error {
	// The record first: once the user is gone (what Follow's callers wait for), the
	// host is keyed nowhere.
	if _, err := m.cli.Delete(ctx, model.WireGuardKey(host)); err != nil {
		return fmt.Errorf("etcd: delete the wireguard record of host %s: %w", host, err)
	}
	name := UserOf(host)
	keys, err := m.serviceKeys(ctx, name)
	if err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return err
	}
	if _, err := m.auth.UserDelete(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return fmt.Errorf("etcd: delete user %q: %w", name, err)
	}
	if _, err := m.auth.RoleDelete(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return fmt.Errorf("etcd: delete role %q: %w", name, err)
	}
	for _, k := range keys {
		if err := m.release(ctx, host, k); err != nil {
			return err
		}
	}
	return nil
}

// serviceKeys are the registration keys role may write.
func (m *Manager) serviceKeys(ctx context.Context, role string) ([]string, error) {
	r, err := m.auth.RoleGet(ctx, role)
	if err != nil {
		return nil, fmt.Errorf("etcd: get role %q: %w", role, err)
	}
	var out []string
	for _, p := range r.Perm {
		if p.PermType != authpb.READ && strings.HasPrefix(string(p.Key), state.ServicePrefix) {
			out = append(out, string(p.Key))
		}
	}
	return out, nil
}

// Follow gives every host that hosts() names a user and role (EnsureHost) now and every
// `every` until ctx ends: agents whose netmaster token is bound to their host (token name
// host:<host>) find their etcd user ready before their first read. Each such host is
// recorded (TokenHostsPrefix); a recorded host whose token went, also while no netmaster
// ran, loses its user, role and claims (RemoveHost), unless hosts() says removals are not
// to be trusted yet (a refused file: a typo revokes no etcd user; a removal not yet
// confirmed by a second reading, auth.Tokens.BoundHosts), and Enroll refuses it (ErrRevoked) until its
// token comes back, when it is made again. Hosts
// enrolled otherwise (an agent identified by certificate) are never recorded, so never
// removed here. Follow runs once per Manager.
func (m *Manager) Follow(ctx context.Context, every time.Duration, hosts func() ([]string, bool)) {
	for {
		m.followOnce(ctx, hosts)
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// followOnce is one look of Follow.
func (m *Manager) followOnce(ctx context.Context, hosts func() ([]string, bool)) {
	if err := m.Managing(ctx); err != nil {
		if !errors.Is(err, ErrNotManaged) && ctx.Err() == nil {
			m.log.Error("etcd RBAC: agents' users not managed", "err", err)
		}
		return
	}
	cur, taken := hosts()
	keep := make(map[string]bool, len(cur))
	for _, h := range cur {
		keep[h] = true
	}
	for h := range m.ensured {
		if !keep[h] {
			delete(m.ensured, h)
		}
	}
	for h := range keep {
		delete(m.removed, h) // (its token is back: ensureTokenHost clears the mark)
	}
	for _, h := range cur {
		if m.ensured[h] {
			continue
		}
		if err := m.ensureTokenHost(ctx, h); err != nil {
			if ctx.Err() == nil {
				m.log.Error("etcd RBAC: agent user not created", "host", h, "err", err)
			}
			continue
		}
		m.ensured[h] = true
		m.log.Info("etcd RBAC: agent user ready", "user", UserOf(h))
	}
	if taken {
		if err := m.removeGone(ctx, keep); err != nil && ctx.Err() == nil {
			m.log.Error("etcd RBAC: removed token's user not deleted", "err", err)
		}
	}
}

// ensureTokenHost records h as a token's host, then makes its user (EnsureHost).
func (m *Manager) ensureTokenHost(ctx context.Context, h string) error {
	if err := checkHost(h); err != nil {
		return err
	}
	if _, err := m.cli.Put(ctx, TokenHostsPrefix+h, ""); err != nil {
		return fmt.Errorf("etcd: record token host %s: %w", h, err)
	}
	return m.EnsureHost(ctx, h)
}

// removeGone removes every recorded token host that keep does not hold: it marks the
// record tokenRemoved first (an enrollment after it is refused), then deletes the host's
// user, role and claims (RemoveHost; tried again every period until it succeeds).
func (m *Manager) removeGone(ctx context.Context, keep map[string]bool) error {
	r, err := m.cli.Get(ctx, TokenHostsPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("etcd: list token hosts: %w", err)
	}
	for _, kv := range r.Kvs {
		h := strings.TrimPrefix(string(kv.Key), TokenHostsPrefix)
		if keep[h] || string(kv.Value) == tokenRemoved && m.removed[h] {
			continue
		}
		if err := m.removeTokenHost(ctx, h, string(kv.Key)); err != nil {
			return err
		}
		m.removed[h] = true
		m.log.Info("etcd RBAC: agent user deleted: its token left the token file", "user", UserOf(h))
	}
	return nil
}

// removeTokenHost marks h's record (key) tokenRemoved and deletes its user, role and
// claims, holding m.mu (not while the host enrolls).
func (m *Manager) removeTokenHost(ctx context.Context, h, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cli.Put(ctx, key, tokenRemoved); err != nil {
		return fmt.Errorf("etcd: mark token host %s removed: %w", h, err)
	}
	return m.RemoveHost(ctx, h)
}
