package etcdrbac

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// tlsEtcd starts an embedded etcd with client-certificate auth and returns a function
// that opens a store with a certificate of common name cn.
func tlsEtcd(t *testing.T) func(cn string) *state.Store {
	dir := t.TempDir()
	ca, err := pki.NewCA("cbrbac-ca")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(pki.Options{CommonName: "etcd", Hosts: []string{"127.0.0.1"}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := srv.Write(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := fmt.Sprintf("https://127.0.0.1:%d", statetest.FreePort(t))
	e, err := etcdembed.Start(ctx, etcdembed.Config{DataDir: t.TempDir(), ClientURL: url,
		PeerURL: fmt.Sprintf("https://127.0.0.1:%d", statetest.FreePort(t)), CertFile: cert, KeyFile: key, ClientCAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return func(cn string) *state.Store {
		p, err := ca.Issue(pki.Options{CommonName: cn, Client: true})
		if err != nil {
			t.Fatal(err)
		}
		c, k, err := p.Write(dir, strings.ReplaceAll(cn, ":", "_"))
		if err != nil {
			t.Fatal(err)
		}
		opts, err := state.TLSOptions(tlsconf.Files{CA: caFile, Cert: c, Key: k})
		if err != nil {
			t.Fatal(err)
		}
		s, err := state.Open(context.Background(), []string{url}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

// TestAgentUsersConfined: with auth on, a host's etcd user reads /contiv.io/ and writes its
// VTEP and BGP records and the registrations it enrolled, nothing of another host and no
// other key; a registration key another host holds is refused (nothing changes), one no
// longer asked for is revoked, a service an agent does not register is refused; a
// certificate without a user is refused everything.
func TestAgentUsersConfined(t *testing.T) {
	open := tlsEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := open("netmaster")
	m := New(root.Client(), slog.Default())
	for range 2 { // idempotent: the second start finds auth on
		if err := m.Enable(ctx, "netmaster"); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []string{"h1", "h2"} {
		if err := m.EnsureHost(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := root.Put(ctx, "/contiv.io/state/nets/n1.t1", map[string]string{"id": "n1.t1"}); err != nil {
		t.Fatalf("root writes: %v", err)
	}
	reg := func(addr string) model.EtcdRegistration {
		return model.EtcdRegistration{ServiceName: "netplugin", HostAddr: addr, Port: 9002}
	}
	if err := m.Enroll(ctx, "h1", []model.EtcdRegistration{reg("10.0.0.1")}); err != nil {
		t.Fatal(err)
	}
	h1, stranger := open(UserOf("h1")), open("netplugin")
	var v map[string]string
	if err := h1.Get(ctx, "/contiv.io/state/nets/n1.t1", &v); err != nil {
		t.Fatalf("h1 reads: %v", err)
	}
	if err := stranger.Get(ctx, "/contiv.io/state/nets/n1.t1", &v); err == nil {
		t.Error("a certificate without a user reads")
	}
	own := []string{vxlan.HostVTEPKey("h1"), model.BgpOperKey("h1"), cluster.ServiceKey("netplugin", "10.0.0.1", 9002)}
	for _, k := range own {
		if err := h1.Put(ctx, k, map[string]string{"host": "h1"}); err != nil {
			t.Errorf("h1 writes its own %s: %v", k, err)
		}
	}
	denied := func(who string, s *state.Store, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if err := s.Put(ctx, k, map[string]string{"evil": "1"}); err == nil {
				t.Errorf("%s writes %s", who, k)
			}
		}
	}
	denied("h1", h1, "/contiv.io/obj/modeldb/tenant/evil", vxlan.HostVTEPKey("h2"), model.BgpOperKey("h2"),
		vxlan.HostVTEPKey("h10"), model.EpOperKey("n1.t1-c1"), cluster.ServiceKey("netplugin", "10.0.0.2", 9002),
		"/contiv.io/state/nets/n1.t1",
		// WireGuard keys go through netmaster (POST /plugin/publishWireGuard), its own too.
		model.WireGuardKey("h1"), model.WireGuardKey("h2"))
	if err := m.Enroll(ctx, "h2", []model.EtcdRegistration{reg("10.0.0.1")}); !errors.Is(err, ErrClaimed) {
		t.Errorf("h2 enrolls h1's registration: %v, want ErrClaimed", err)
	}
	denied("h2", open(UserOf("h2")), cluster.ServiceKey("netplugin", "10.0.0.1", 9002))
	for _, bad := range []model.EtcdRegistration{
		{ServiceName: "netmaster", HostAddr: "10.0.0.9", Port: 9999},
		{ServiceName: "netplugin", HostAddr: "10.0.0.9/../x", Port: 9002},
		{ServiceName: "netplugin", HostAddr: "10.0.0.9", Port: 0},
	} {
		if err := m.Enroll(ctx, "h2", []model.EtcdRegistration{bad}); !errors.Is(err, ErrBadRegistration) {
			t.Errorf("h2 enrolls %+v: %v, want ErrBadRegistration", bad, err)
		}
	}
	// h1 moves to another address: the old registration key is no longer its.
	if err := m.Enroll(ctx, "h1", []model.EtcdRegistration{reg("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	denied("h1", h1, cluster.ServiceKey("netplugin", "10.0.0.1", 9002))
	if err := h1.Put(ctx, cluster.ServiceKey("netplugin", "10.0.0.2", 9002), map[string]string{"host": "h1"}); err != nil {
		t.Errorf("h1 writes its new registration: %v", err)
	}
	if err := m.Enroll(ctx, "h2", []model.EtcdRegistration{reg("10.0.0.1")}); err != nil {
		t.Errorf("h2 enrolls the address h1 gave up: %v", err)
	}
}

// TestFollowRemovesAndRecreatesHost: a host whose token leaves the token file loses its
// etcd user, role and registration claims within Follow's period (before, the user stayed
// until an operator deleted it by hand), also when the token went while no netmaster ran;
// a refused token file (no token works, but it names no removal) deletes nothing; a host
// enrolled without a token (an agent identified by certificate) is left alone; a token
// that comes back makes the user again without a restart. The removed host's published
// WireGuard record goes with its user.
func TestFollowRemovesAndRecreatesHost(t *testing.T) {
	ctx, _, root, m := rbacOn(t)
	var mu sync.Mutex
	hosts, taken := []string{"h1"}, true
	set := func(ok bool, h ...string) { mu.Lock(); hosts, taken = h, ok; mu.Unlock() }
	follow := func(m *Manager) func() {
		fctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			m.Follow(fctx, 20*time.Millisecond, func() ([]string, bool) { mu.Lock(); defer mu.Unlock(); return hosts, taken })
		}()
		return func() { stop(); <-done }
	}
	stop := follow(m)
	defer func() { stop() }()
	// userIs waits until host's user (and, when want is false, its role: deleted after
	// the user) exists as want says.
	userIs := func(host string, want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := root.Client().UserGet(ctx, UserOf(host))
			_, rerr := root.Client().RoleGet(ctx, UserOf(host))
			if (err == nil) == want && (want || rerr != nil) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("user %s exists: %v, role: %v, want %v", UserOf(host), err == nil, rerr == nil, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	reg := []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}}
	userIs("h1", true)
	if err := m.Enroll(ctx, "h1", reg); err != nil {
		t.Fatal(err)
	}
	if err := m.Enroll(ctx, "hc", []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.3", Port: 9002}}); err != nil {
		t.Fatal(err) // (a certificate's host: no token)
	}
	// Both hosts published WireGuard keys (issue 38).
	for _, h := range []string{"h1", "hc"} {
		if err := root.Put(ctx, model.WireGuardKey(h), model.WireGuardHost{Host: h}); err != nil {
			t.Fatal(err)
		}
	}
	wgRecord := func(host string) bool {
		t.Helper()
		err := root.Get(ctx, model.WireGuardKey(host), &model.WireGuardHost{})
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	set(false) // a refused file: no token works, nothing is revoked in etcd
	time.Sleep(200 * time.Millisecond)
	userIs("h1", true)
	if !wgRecord("h1") {
		t.Error("a refused token file deleted h1's WireGuard record")
	}
	set(true) // the token is removed
	userIs("h1", false)
	// Its WireGuard record went with it (before: kept for good, so its peers kept it
	// keyed); the certificate host's stays.
	if wgRecord("h1") || !wgRecord("hc") {
		t.Errorf("after h1's token went: WireGuard record of h1 %v (want gone), of hc %v (want kept)", wgRecord("h1"), wgRecord("hc"))
	}
	// An enrollment of h1 still under way (authenticated before its token went, or
	// forwarded by a netmaster that has not reloaded its file yet) makes no user again.
	if err := m.Enroll(ctx, "h1", []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.4", Port: 9002}}); !errors.Is(err, ErrRevoked) {
		t.Errorf("the removed host enrolls: %v, want ErrRevoked", err)
	}
	time.Sleep(100 * time.Millisecond)
	userIs("h1", false)
	if err := m.Enroll(ctx, "h2", reg); err != nil {
		t.Errorf("another host enrolls the removed host's registration: %v", err)
	}
	userIs("hc", true)
	set(true, "h1") // the host's token is back
	userIs("h1", true)
	if err := m.Enroll(ctx, "h1", []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.4", Port: 9002}}); err != nil {
		t.Errorf("the host whose token is back enrolls: %v", err)
	}

	// Removed while no netmaster ran: the next one's Follow deletes the user.
	stop()
	set(true)
	stop = follow(New(root.Client(), slog.Default()))
	userIs("h1", false)
	userIs("hc", true)
}

// countingAuth counts the role reads an enrollment makes.
type countingAuth struct {
	clientv3.Auth
	mu    sync.Mutex
	reads int
}

func (c *countingAuth) RoleGet(ctx context.Context, role string) (*clientv3.AuthRoleGetResponse, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Auth.RoleGet(ctx, role)
}

func (c *countingAuth) RoleList(ctx context.Context) (*clientv3.AuthRoleListResponse, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Auth.RoleList(ctx)
}

// TestEnrollReadsOwnRoleOnly: an enrollment reads its own host's role and its keys'
// claims, not every host's role (before: one role read per host, ~1 ms each, every
// call); registrations an earlier build granted (no claims recorded) are still refused
// to another host, after one read of every role per Manager.
func TestEnrollReadsOwnRoleOnly(t *testing.T) {
	ctx, _, root, old := rbacOn(t)
	reg := func(i int) []model.EtcdRegistration {
		return []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: fmt.Sprintf("10.0.1.%d", i), Port: 9002}}
	}
	for i := range 20 {
		if err := old.Enroll(ctx, fmt.Sprintf("h%d", i), reg(i)); err != nil {
			t.Fatal(err)
		}
	}
	// An earlier build recorded no claims: h0's key is known from its role alone.
	if _, err := root.Client().Delete(ctx, ClaimsPrefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	m := New(root.Client(), slog.Default())
	ca := &countingAuth{Auth: m.auth}
	m.auth = ca
	if err := m.Enroll(ctx, "hx", reg(0)); !errors.Is(err, ErrClaimed) {
		t.Fatalf("hx enrolls h0's registration granted before claims: %v, want ErrClaimed", err)
	}
	for i := range 3 {
		ca.mu.Lock()
		ca.reads = 0
		ca.mu.Unlock()
		if err := m.Enroll(ctx, fmt.Sprintf("h%d", i), reg(i)); err != nil {
			t.Fatal(err)
		}
		if ca.reads != 1 {
			t.Errorf("enrollment %d read %d roles among 21 hosts, want its own alone", i, ca.reads)
		}
	}
	if err := m.Enroll(ctx, "hx", reg(5)); !errors.Is(err, ErrClaimed) {
		t.Errorf("hx enrolls h5's registration: %v, want ErrClaimed", err)
	}
}

// TestEnableWithAuthOnNeedsRoot: a certificate whose CN names an agent's user is never made
// root; a netmaster restarted on an etcd whose auth is already on starts only if its
// certificate is still etcd's root (a certificate with another CN fails
// at start, naming the reason, instead of every agent's user failing later).
func TestEnableWithAuthOnNeedsRoot(t *testing.T) {
	open := tlsEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A root CN that names an agent's user (host:<host>) would make that agent root.
	if err := New(open(UserOf("h9")).Client(), slog.Default()).Enable(ctx, UserOf("h9")); err == nil {
		t.Fatal("auth turned on with root CN host:h9")
	}
	if err := New(open("netmaster").Client(), slog.Default()).Enable(ctx, "netmaster"); err != nil {
		t.Fatal(err)
	}
	root := New(open("netmaster").Client(), slog.Default())
	if err := root.EnsureHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if err := root.Enable(ctx, "netmaster"); err != nil {
		t.Fatalf("restart with the same certificate: %v", err)
	}
	for _, cn := range []string{"netmaster2", UserOf("h1")} {
		if err := New(open(cn).Client(), slog.Default()).Enable(ctx, cn); err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("restart with certificate CN %q: %v, want an error naming root", cn, err)
		}
	}
}

// rbacOn is a TLS etcd (tlsEtcd) whose auth a Manager of root certificate CN "netmaster"
// turned on; the context ends with the test.
func rbacOn(t *testing.T) (context.Context, func(cn string) *state.Store, *state.Store, *Manager) {
	open := tlsEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	root := open("netmaster")
	m := New(root.Client(), slog.Default())
	if err := m.Enable(ctx, "netmaster"); err != nil {
		t.Fatal(err)
	}
	return ctx, open, root, m
}

// TestRegistrationAfterAuthOn: a registration made while etcd's auth was off lapses once
// auth is on (its keepalive and re-registration are refused) until its key is enrolled,
// and comes back by itself after the enrollment: why netplugin enrolls when auth comes on
// (enrollWhenAuthOn).
func TestRegistrationAfterAuthOn(t *testing.T) {
	open := tlsEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h1 := open(UserOf("h1"))
	si := cluster.ServiceInfo{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002, Hostname: "h1"}
	reg, err := cluster.Register(ctx, h1, si, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	root := open("netmaster")
	m := New(root.Client(), slog.Default())
	if err := m.Enable(ctx, "netmaster"); err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	registered := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			regs, err := cluster.ListServices(ctx, root, "netplugin")
			if err == nil && (len(regs) == 1) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("registered: %v (%v), want %v", regs, err, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	registered(false)
	if err := m.Enroll(ctx, "h1", []model.EtcdRegistration{{ServiceName: si.ServiceName, HostAddr: si.HostAddr, Port: si.Port}}); err != nil {
		t.Fatal(err)
	}
	registered(true)
}

// TestJoinManagesWhenAuthOn: a netmaster joining an etcd it does not run (--etcd-endpoints)
// never turns auth on (off: it manages nothing); once the netmaster running the etcd turned
// it on, the joining one (certificate CN root too) manages users as well (before: it
// answered Managed false when it led, and agents' registration writes were refused); a
// joining certificate that is not root is an error naming root.
func TestJoinManagesWhenAuthOn(t *testing.T) {
	open := tlsEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	joiner := New(open("netmaster").Client(), slog.Default())
	if on, err := joiner.Join(ctx, "netmaster"); err != nil || on {
		t.Fatalf("join with auth off: %v %v, want false", on, err)
	}
	if st, err := open("netmaster").Client().AuthStatus(ctx); err != nil || st.Enabled {
		t.Fatalf("join turned auth on: %+v %v", st, err)
	}
	reg := []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}}
	if err := joiner.Enroll(ctx, "h1", reg); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("the joined netmaster enrolls with auth off: %v, want ErrNotManaged", err)
	}
	if _, err := open("netmaster").Client().UserGet(ctx, UserOf("h1")); err == nil {
		t.Fatal("the joined netmaster made a user with auth off")
	}
	// Auth comes on after the joined netmaster started (its etcd's netmaster started with
	// --etcd-rbac=false first, as docs/security.md's upgrade says, or later than it): the
	// joined one manages users from then on, without a restart.
	if err := New(open("netmaster").Client(), slog.Default()).Enable(ctx, "netmaster"); err != nil {
		t.Fatal(err)
	}
	if err := joiner.Enroll(ctx, "h1", reg); err != nil {
		t.Fatalf("the joined netmaster enrolls once auth is on: %v", err)
	}
	if on, err := New(open("netmaster").Client(), slog.Default()).Join(ctx, "netmaster"); err != nil || !on {
		t.Fatalf("join with auth on: %v %v, want true", on, err)
	}
	if err := open(UserOf("h1")).Put(ctx, cluster.ServiceKey("netplugin", "10.0.0.1", 9002), map[string]string{"host": "h1"}); err != nil {
		t.Errorf("h1 writes the registration the joined netmaster enrolled: %v", err)
	}
	if _, err := New(open("netmaster2").Client(), slog.Default()).Join(ctx, "netmaster2"); err == nil || !strings.Contains(err.Error(), "root") {
		t.Errorf("join with a certificate that is not root: %v", err)
	}
}

// hookAuth runs hook once, at the first user an enrollment adds.
type hookAuth struct {
	clientv3.Auth
	once sync.Once
	hook func()
}

func (h *hookAuth) UserAddWithOptions(ctx context.Context, name, password string, opt *clientv3.UserAddOptions) (*clientv3.AuthUserAddResponse, error) {
	h.once.Do(h.hook)
	return h.Auth.UserAddWithOptions(ctx, name, password, opt)
}

// TestEnrollRacingRemoval: netmaster B enrolls h1 (its token file still has h1's token)
// while netmaster A removes h1 (its file lost it) between B's check of the mark and B's
// grants: B's enrollment must not leave the revoked host a user (before: it made the user
// again after A deleted it, and nothing deleted it afterwards).
func TestEnrollRacingRemoval(t *testing.T) {
	ctx, _, root, a := rbacOn(t)
	if err := a.ensureTokenHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	b := New(root.Client(), slog.Default())
	b.auth = &hookAuth{Auth: b.auth, hook: func() {
		if err := a.removeGone(ctx, map[string]bool{}); err != nil {
			t.Error(err)
		}
	}}
	err := b.Enroll(ctx, "h1", []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}})
	if !errors.Is(err, ErrRevoked) {
		t.Errorf("enrollment racing the removal: %v, want ErrRevoked", err)
	}
	if _, err := root.Client().UserGet(ctx, UserOf("h1")); err == nil {
		t.Error("the removed host has a user")
	}
}

// TestFollowSkipsBadHostName: a token bound to a host name no etcd user can have ("/")
// is refused before anything is written (before: its token host record was written again
// at every look, 2 s, and the user refused each time).
func TestFollowSkipsBadHostName(t *testing.T) {
	ctx, _, root, m := rbacOn(t)
	m.followOnce(ctx, func() ([]string, bool) { return []string{"a/b"}, true })
	r, err := root.Client().Get(ctx, TokenHostsPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 0 {
		t.Errorf("%d token host records for a bad host name, want none", r.Count)
	}
}

// TestStaleClaimTaken: a claim whose host has no role any more (deleted by hand, or a
// removal that stopped after deleting the role and before releasing its claims, which a
// retry cannot find again) does not keep the key from another host for ever (before:
// 409, and that host's netplugin stopped).
func TestStaleClaimTaken(t *testing.T) {
	ctx, open, root, m := rbacOn(t)
	reg := []model.EtcdRegistration{{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}}
	if err := m.Enroll(ctx, "h1", reg); err != nil {
		t.Fatal(err)
	}
	if err := m.Enroll(ctx, "h2", reg); !errors.Is(err, ErrClaimed) {
		t.Fatalf("h2 enrolls h1's key: %v, want ErrClaimed", err)
	}
	if _, err := root.Client().RoleDelete(ctx, UserOf("h1")); err != nil {
		t.Fatal(err)
	}
	if err := m.Enroll(ctx, "h2", reg); err != nil {
		t.Fatalf("h2 enrolls the key of h1, whose role is gone: %v", err)
	}
	if err := open(UserOf("h2")).Put(ctx, cluster.ServiceKey("netplugin", "10.0.0.1", 9002), map[string]string{"host": "h2"}); err != nil {
		t.Errorf("h2 writes the key it took: %v", err)
	}
}
