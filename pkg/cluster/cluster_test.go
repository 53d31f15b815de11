package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", d, what)
}

// startElection runs a candidate; the returned stop cancels it and waits for Run to return.
func startElection(t *testing.T, s *state.Store, id string, ttl time.Duration) (*Election, func()) {
	t.Helper()
	e, err := NewElection(s, ElectionConfig{ID: id, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return e, stop
}

func TestElectionOneLeaderAndResignFailover(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	// A 10 s TTL: a takeover within 5 s can only come from a's resignation.
	a, stopA := startElection(t, s, "10.0.0.1:9999", 10*time.Second)
	waitFor(t, 5*time.Second, "a leads", a.IsLeader)
	b, _ := startElection(t, s, "10.0.0.2:9999", 10*time.Second)
	changes := b.Changes()
	waitFor(t, 5*time.Second, "b sees a as leader", func() bool { return b.CurrentLeader() == "10.0.0.1:9999" })
	if b.IsLeader() {
		t.Fatal("two leaders")
	}
	got, err := LeaderAddr(ctx, s)
	if err != nil || got != "10.0.0.1:9999" {
		t.Fatalf("LeaderAddr = %q, %v; want 10.0.0.1:9999", got, err)
	}
	// The lock is on a lease: check TTL.
	resp, err := s.Client().Get(ctx, state.LeaderLockKey)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("lock key not on a lease: %+v %v", resp, err)
	}

	// Graceful stop of a resigns at once: b must lead well before a's TTL.
	start := time.Now()
	stopA()
	select {
	case v := <-changes:
		if !v {
			t.Fatalf("first transition of b = %v, want true", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b did not become leader after a resigned")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("failover after resign took %s; resign should not wait for the TTL", el)
	}
	if got, _ := b.Leader(ctx); got != "10.0.0.2:9999" {
		t.Fatalf("lock value %q after failover, want 10.0.0.2:9999", got)
	}
}

func TestElectionLeaseExpiryFailover(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	// A candidate whose lease is not kept alive: emulate a SIGKILLed leader by writing
	// the lock on a lease that nobody renews.
	lg, err := s.Client().Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Put(ctx, state.LeaderLockKey, "10.9.9.9:9999", clientv3.WithLease(lg.ID)); err != nil {
		t.Fatal(err)
	}
	b, _ := startElection(t, s, "10.0.0.2:9999", 2*time.Second)
	waitFor(t, 2*time.Second, "b sees the dead leader", func() bool { return b.CurrentLeader() == "10.9.9.9:9999" })
	start := time.Now()
	waitFor(t, 6*time.Second, "b takes over after lease expiry", b.IsLeader)
	t.Logf("takeover after dead leader's lease expiry: %s (TTL 2s)", time.Since(start).Round(time.Millisecond))
}

func TestElectionStepsDownOnLeaseLoss(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	a, _ := startElection(t, s, "10.0.0.1:9999", 2*time.Second)
	waitFor(t, 5*time.Second, "a leads", a.IsLeader)
	ch := a.Changes()
	// Revoke a's lease behind its back (what an expired lease looks like).
	resp, err := s.Client().Get(ctx, state.LeaderLockKey)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(err)
	}
	if _, err := s.Client().Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-ch:
		if v {
			t.Fatal("got leader=true, want step down first")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a did not step down after losing its lease")
	}
	// Nobody else is running: a campaigns again and wins with a new lease.
	waitFor(t, 5*time.Second, "a leads again", a.IsLeader)
}

func TestElectionConfigErrors(t *testing.T) {
	s, _ := statetest.Store(t)
	if _, err := NewElection(s, ElectionConfig{}); err == nil || !strings.Contains(err.Error(), "ID") {
		t.Fatalf("empty ID: err = %v", err)
	}
	if _, err := NewElection(s, ElectionConfig{ID: "a:1", TTL: time.Second}); err == nil || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("short TTL: err = %v", err)
	}
	if _, err := Register(context.Background(), s, ServiceInfo{ServiceName: "x", HostAddr: "1.2.3.4"}, 0); err == nil || !strings.Contains(err.Error(), "Port") {
		t.Fatalf("bad port: err = %v", err)
	}
}

type recorder struct {
	mu  sync.Mutex
	evs []ServiceEvent
}

func (r *recorder) add(ev ServiceEvent) { r.mu.Lock(); r.evs = append(r.evs, ev); r.mu.Unlock() }
func (r *recorder) get() []ServiceEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ServiceEvent(nil), r.evs...)
}

func TestRegistryRegisterWatchExpire(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pre, err := Register(ctx, s, ServiceInfo{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002, Hostname: "h1"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Another service with a name sharing the prefix must not show up.
	if _, err := Register(ctx, s, ServiceInfo{ServiceName: "netplugin.vtep", HostAddr: "10.0.0.1", Port: 4789}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	var rec recorder
	go WatchServices(ctx, s, "netplugin", rec.add) //nolint:errcheck // ends with ctx
	waitFor(t, 3*time.Second, "snapshot add", func() bool { return len(rec.get()) == 1 })
	if ev := rec.get()[0]; ev.Type != ServiceAdded || ev.Info.HostAddr != "10.0.0.1" || ev.Info.TTL != 2 {
		t.Fatalf("first event %+v", ev)
	}
	// The stored JSON uses Contiv's Go field names.
	var raw map[string]any
	if err := s.Get(ctx, "/contiv.io/service/netplugin/10.0.0.1:9002", &raw); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ServiceName", "Role", "Version", "TTL", "HostAddr", "Port", "Hostname"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("stored registration lacks %s: %v", f, raw)
		}
	}
	// Survives several TTLs (keepalive) without spurious events.
	time.Sleep(3 * time.Second)
	if n := len(rec.get()); n != 1 {
		t.Fatalf("keepalive produced events: %+v", rec.get())
	}
	// A second registration appears.
	r2, err := Register(ctx, s, ServiceInfo{ServiceName: "netplugin", HostAddr: "10.0.0.2", Port: 9002}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "second add", func() bool { return len(rec.get()) == 2 })
	list, err := ListServices(ctx, s, "netplugin")
	if err != nil || len(list) != 2 {
		t.Fatalf("ListServices = %+v, %v", list, err)
	}
	// Close removes it at once.
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "remove on close", func() bool { return len(rec.get()) == 3 })
	if ev := rec.get()[2]; ev.Type != ServiceRemoved || ev.Info.HostAddr != "10.0.0.2" {
		t.Fatalf("remove event %+v", ev)
	}
	// Losing the lease (revoked behind its back) is repaired by re-registering.
	resp, err := s.Client().Get(ctx, pre.Info().Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(err)
	}
	if _, err := s.Client().Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "re-registration after lease loss", func() bool {
		evs := rec.get()
		return len(evs) >= 5 && evs[3].Type == ServiceRemoved && evs[4].Type == ServiceAdded
	})
	// Role change is an upsert event.
	if err := pre.SetRole(ctx, "leader"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "role update", func() bool {
		evs := rec.get()
		return len(evs) == 6 && evs[5].Info.Role == "leader"
	})
}

type fakeView struct {
	leader bool
	holder string
	id     string
}

func (f fakeView) IsLeader() bool        { return f.leader }
func (f fakeView) CurrentLeader() string { return f.holder }
func (f fakeView) ID() string            { return f.id }

func TestFrontServesOrProxies(t *testing.T) {
	leaderAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/missing" {
			http.Error(w, "no such thing", http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "body": string(b), "proxied-by": r.Header.Get(ProxiedHeader), "ctype": r.Header.Get("Content-Type")})
	}))
	defer leaderAPI.Close()
	leaderAddr := strings.TrimPrefix(leaderAPI.URL, "http://")
	local := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "local") })

	// Follower: proxied, body and headers carried, status preserved.
	f := httptest.NewServer(NewFront(fakeView{holder: leaderAddr, id: "127.0.0.1:1"}, local, nil))
	defer f.Close()
	resp, err := http.Post(f.URL+"/plugin/allocAddress", "application/json", strings.NewReader(`{"NetworkID":"n.t"}`))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || got["path"] != "/plugin/allocAddress" || got["body"] != `{"NetworkID":"n.t"}` || got["proxied-by"] != "127.0.0.1:1" || got["ctype"] != "application/json" {
		t.Fatalf("proxied response %d %v", resp.StatusCode, got)
	}
	resp, err = http.Get(f.URL + "/missing")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status via proxy %d, want 404", resp.StatusCode)
	}
	// A request that was already proxied is not bounced again.
	req, _ := http.NewRequest("GET", f.URL+"/x", nil)
	req.Header.Set(ProxiedHeader, "other")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("double proxy status %d, want 503", resp.StatusCode)
	}

	// Leader: served locally.
	l := httptest.NewServer(NewFront(fakeView{leader: true, holder: "me:1", id: "me:1"}, local, nil))
	defer l.Close()
	resp, err = http.Get(l.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "local" {
		t.Fatalf("leader served %q", b)
	}

	// No leader / dead leader: 503 with Retry-After.
	for _, holder := range []string{"", "127.0.0.1:1"} {
		n := httptest.NewServer(NewFront(fakeView{holder: holder, id: "me:2"}, local, nil))
		resp, err = http.Get(n.URL + "/x")
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// (Found by review: the answer named the leader's address to every caller, a
		// tenant-admin too, whom /info refuses host addresses.)
		if holder != "" && strings.Contains(string(body), holder) {
			t.Errorf("holder %q: the 503 names the leader's address: %s", holder, body)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("holder %q: status %d, want 503 with Retry-After", holder, resp.StatusCode)
		}
		// Nothing was done (no leader; a leader that refused the connection): the client
		// may send it again.
		if resp.Header.Get(UnprocessedHeader) == "" {
			t.Errorf("holder %q: 503 without %s", holder, UnprocessedHeader)
		}
	}
	// A leader that took the connection and dropped it may have done the request: no
	// such mark.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 1024)
			_, _ = c.Read(buf)
			c.Close()
		}
	}()
	n := httptest.NewServer(NewFront(fakeView{holder: ln.Addr().String(), id: "me:2"}, local, nil))
	defer n.Close()
	resp, err = http.Post(n.URL+"/x", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(UnprocessedHeader) != "" {
		t.Errorf("a leader that dropped the request: status %d, %s %q", resp.StatusCode, UnprocessedHeader, resp.Header.Get(UnprocessedHeader))
	}
}

// TestAgentsListsOnlyAddresses: GET /agents turns netplugin.inspect registrations into
// URLs; one whose address is not an IP (any netplugin can write the registry) is left
// out, so netctl --all is never sent to a name or path someone chose.
func TestAgentsListsOnlyAddresses(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	for _, si := range []ServiceInfo{
		{ServiceName: ServiceInspect, HostAddr: "10.0.0.2", Port: 9090, Hostname: "h2"},
		{ServiceName: ServiceInspect, HostAddr: "10.0.0.1", Port: 9090, Hostname: "h1"},
		{ServiceName: ServiceInspect, HostAddr: "evil.example/steal?x=", Port: 80, Hostname: "h1"},
		{ServiceName: ServiceInspect, HostAddr: "10.0.0.3", Port: 0, Hostname: "h3"},
	} {
		if err := s.Put(ctx, servicePrefix(ServiceInspect)+si.HostAddr+":"+fmt.Sprint(si.Port), si); err != nil {
			t.Fatal(err)
		}
	}
	// A host's own registration key (the address it enrolled) with another address in it.
	if err := s.Put(ctx, ServiceKey(ServiceInspect, "10.0.0.4", 9090), ServiceInfo{ServiceName: ServiceInspect,
		HostAddr: "192.0.2.66", Port: 9090, Hostname: "h2"}); err != nil {
		t.Fatal(err)
	}
	agents, err := Agents(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	want := []model.AgentInfo{{Host: "h1", URL: "http://10.0.0.1:9090"}, {Host: "h2", URL: "http://10.0.0.2:9090"}}
	if fmt.Sprint(agents) != fmt.Sprint(want) {
		t.Errorf("agents %v, want %v", agents, want)
	}
}
