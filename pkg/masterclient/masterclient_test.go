package masterclient

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// TestLeaderThenFallback: the leader lock points at a closed port, so the client must fall
// back to the registered netmaster; the server checks what Contiv's router requires.
func TestLeaderThenFallback(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	var got model.CreateEndpointRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") != "application/json" || r.URL.Path != "/plugin/createEndpoint" {
			http.Error(w, "no route", http.StatusNotFound)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if got.NetworkName == "missing" {
			http.Error(w, "network missing not found", 500)
			return
		}
		_ = json.NewEncoder(w).Encode(model.CreateEndpointResponse{EndpointConfig: model.CfgEndpointState{
			ID: got.NetworkName + "." + got.TenantName + "-" + got.ConfigEP.Container, IPAddress: "10.1.1.2"}})
	}))
	defer srv.Close()

	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	if _, err := store.Client().Put(ctx, state.LeaderLockKey, deadAddr); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	var p int
	fmt.Sscanf(port, "%d", &p)
	if err := store.Put(ctx, state.ServicePrefix+"netmaster/"+host+":"+port, map[string]any{
		"ServiceName": "netmaster", "HostAddr": host, "Port": p, "TTL": 10}); err != nil {
		t.Fatal(err)
	}
	c := New(store)
	addrs, err := c.Addresses(ctx)
	if err != nil || len(addrs) != 2 || addrs[0] != deadAddr {
		t.Fatalf("Addresses = %v, %v", addrs, err)
	}
	ep, err := c.CreateEndpoint(ctx, model.CreateEndpointRequest{TenantName: "default", NetworkName: "n1",
		EndpointID: "c1", ConfigEP: model.ConfigEP{Container: "c1", Host: "h1"}})
	if err != nil {
		t.Fatalf("CreateEndpoint: %v", err)
	}
	if ep.ID != "n1.default-c1" || got.ConfigEP.Host != "h1" {
		t.Fatalf("endpoint = %+v, server saw %+v", ep, got)
	}
	_, err = c.CreateEndpoint(ctx, model.CreateEndpointRequest{TenantName: "default", NetworkName: "missing"})
	var he *HTTPError
	if err == nil || !strings.Contains(err.Error(), "network missing not found") || !asHTTP(err, &he) || he.Status != 500 {
		t.Fatalf("error reply = %v", err)
	}
}

func TestNoMaster(t *testing.T) {
	store, _ := statetest.Store(t)
	if _, err := New(store).Addresses(context.Background()); err == nil || !strings.Contains(err.Error(), "no netmaster") {
		t.Fatalf("Addresses with empty store: %v", err)
	}
}

func asHTTP(err error, he **HTTPError) bool {
	e, ok := err.(*HTTPError)
	if ok {
		*he = e
	}
	return ok
}

// TestDoMethodsAndBrokenRegistration: Do sends any method (no body without a request),
// reports an error status as *HTTPError without trying other netmasters, and a
// registration that does not decode does not hide a good one.
func TestDoMethodsAndBrokenRegistration(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/networks/default:n1/":
			_ = json.NewEncoder(w).Encode(map[string]string{"networkName": "n1"})
		case r.Method == http.MethodDelete && r.ContentLength <= 0 && r.Header.Get("Content-Type") == "":
			http.Error(w, "network gone not found", http.StatusNotFound)
		default:
			http.Error(w, r.Method+" "+r.URL.Path+" unexpected", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	var p int
	fmt.Sscanf(port, "%d", &p)
	if err := store.Put(ctx, state.ServicePrefix+"netmaster/"+host+":"+port, map[string]any{
		"ServiceName": "netmaster", "HostAddr": host, "Port": p, "TTL": 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Client().Put(ctx, state.ServicePrefix+"netmaster.rpc/10.9.9.9:9001", "{not json"); err != nil {
		t.Fatal(err)
	}
	c := New(store)
	addrs, err := c.Addresses(ctx)
	if err != nil || len(addrs) != 1 || addrs[0] != net.JoinHostPort(host, port) {
		t.Fatalf("Addresses with one broken registration = %v, %v", addrs, err)
	}
	var got map[string]string
	if err := c.Do(ctx, http.MethodGet, "/api/v1/networks/default:n1/", nil, &got); err != nil || got["networkName"] != "n1" {
		t.Fatalf("GET = %v, %v", got, err)
	}
	err = c.Do(ctx, http.MethodDelete, "/api/v1/networks/default:gone/", nil, nil)
	var he *HTTPError
	if !asHTTP(err, &he) || he.Status != http.StatusNotFound || !strings.Contains(he.Message, "not found") {
		t.Fatalf("DELETE of a missing network = %v, want HTTPError 404", err)
	}
	if hits != 2 {
		t.Fatalf("server saw %d requests, want 2", hits)
	}
}

// TestUnprocessedSentAgain: a 503 netmaster marks unprocessed (no leader for the moment),
// or a 429 (its body budget spent), is sent again until it is answered; a plain 503 (the leader may have done it) is not;
// an election that outlasts the caller's context ends with the caller.
func TestUnprocessedSentAgain(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	var mu sync.Mutex
	hits, refusals, marked, busy := 0, 2, true, false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		hits++
		if refusals != 0 {
			refusals--
			w.Header().Set("Retry-After", "1")
			if busy {
				http.Error(w, "too many request bytes in flight; retry later", http.StatusTooManyRequests)
				return
			}
			if marked {
				w.Header().Set(cluster.UnprocessedHeader, "1")
			}
			http.Error(w, "netmaster leadership is changing", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(model.CreateEndpointResponse{EndpointConfig: model.CfgEndpointState{ID: "n1.default-c1"}})
	}))
	defer srv.Close()
	if _, err := store.Client().Put(ctx, state.LeaderLockKey, strings.TrimPrefix(srv.URL, "http://")); err != nil {
		t.Fatal(err)
	}
	c := New(store)
	req := model.CreateEndpointRequest{TenantName: "default", NetworkName: "n1", ConfigEP: model.ConfigEP{Container: "c1", Host: "h1"}}
	ep, err := c.CreateEndpoint(ctx, req)
	if err != nil || ep.ID != "n1.default-c1" || hits != 3 {
		t.Fatalf("after two unprocessed 503s: %+v, %v, %d requests (want 3)", ep, err, hits)
	}

	// A 429 (netmaster's budget of request bytes in memory spent: nothing read) is sent
	// again too (control plane issue, item 1).
	mu.Lock()
	hits, refusals, busy = 0, 2, true
	mu.Unlock()
	if ep, err := c.CreateEndpoint(ctx, req); err != nil || ep.ID != "n1.default-c1" || hits != 3 {
		t.Fatalf("after two 429s: %+v, %v, %d requests (want 3)", ep, err, hits)
	}
	mu.Lock()
	busy = false
	mu.Unlock()

	mu.Lock()
	hits, refusals, marked = 0, 1, false
	mu.Unlock()
	_, err = c.CreateEndpoint(ctx, req)
	var he *HTTPError
	if !asHTTP(err, &he) || he.Status != http.StatusServiceUnavailable || he.Unprocessed || hits != 1 {
		t.Fatalf("a plain 503: %v, %d requests (want the error after 1)", err, hits)
	}

	mu.Lock()
	hits, refusals, marked = 0, -1, true // refuses for ever
	mu.Unlock()
	short, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.CreateEndpoint(short, req)
	if !asHTTP(err, &he) || !he.Unprocessed || time.Since(start) > 2*time.Second || hits < 2 {
		t.Fatalf("an election outlasting the context: %v after %v, %d requests", err, time.Since(start), hits)
	}
}

// TestRecordWithoutRoute: a netmaster of a build before /plugin/recordEndpoint (404, a
// rolling upgrade whose netplugins go first) does not fail attaches: the record is written
// into etcd, and forgotten there, as that build's agents did. Other refusals stay errors.
func TestRecordWithoutRoute(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	var status atomic.Int32
	status.Store(http.StatusNotFound)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "refused", int(status.Load()))
	}))
	defer srv.Close()
	if _, err := store.Client().Put(ctx, state.LeaderLockKey, strings.TrimPrefix(srv.URL, "http://")); err != nil {
		t.Fatal(err)
	}
	c := New(store)
	rec := model.LocalEndpointRecord{OperEndpointState: model.OperEndpointState{ID: "n1.t1-c1", HomingHost: "h1"}, Tenant: "t1"}
	if err := c.RecordEndpoint(ctx, rec); err != nil {
		t.Fatalf("record with a netmaster without the route: %v", err)
	}
	var got model.LocalEndpointRecord
	if err := store.Get(ctx, model.EpOperKey(rec.ID), &got); err != nil || got != rec {
		t.Fatalf("record in etcd: %+v %v", got, err)
	}
	status.Store(http.StatusForbidden)
	if err := c.ForgetEndpoint(ctx, rec.ID); err == nil {
		t.Fatal("a 403 from netmaster: forgotten anyway")
	}
	status.Store(http.StatusNotFound)
	if err := c.ForgetEndpoint(ctx, rec.ID); err != nil {
		t.Fatalf("forget with a netmaster without the route: %v", err)
	}
	if err := store.Get(ctx, model.EpOperKey(rec.ID), &got); err == nil {
		t.Fatalf("record still in etcd: %+v", got)
	}
}

// TestWireGuardHostsLeavesOutForgeries: WireGuardHosts returns every well-formed record
// under its own host's key, sorted, and leaves out (counting) one written under another
// host's key (an etcd writer without RBAC posing as host1), one that does not decode, one
// whose key is malformed, one that spells host2's key otherwise and two that share a key:
// none becomes a peer.
func TestWireGuardHostsLeavesOutForgeries(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	key := func(b byte) string {
		k := make([]byte, 32)
		k[0] = b
		return base64.StdEncoding.EncodeToString(k)
	}
	for k, v := range map[string]string{
		model.WireGuardKey("host2"): `{"host":"host2","publicKey":"` + key(2) + `","endpoint":"192.0.2.2:51820"}`,
		model.WireGuardKey("host1"): `{"host":"host1","publicKey":"` + key(1) + `","endpoint":"192.0.2.1:51820"}`,
		model.WireGuardKey("evil"):  `{"host":"host1","publicKey":"` + key(9) + `","endpoint":"192.0.2.9:51820"}`,
		model.WireGuardKey("junk"):  `{"host":`,
		model.WireGuardKey("short"): `{"host":"short","publicKey":"AAAA","endpoint":"192.0.2.3:51820"}`,
		// host2's key with the last character's spare bits set: the same 32 bytes.
		// One key under two hosts (netmaster refuses it: an etcd administrator's writes):
		// neither can be trusted to hold it, and a peer list with both is refused whole.
		model.WireGuardKey("dup1"): `{"host":"dup1","publicKey":"` + key(7) + `","endpoint":"192.0.2.7:51820"}`,
		model.WireGuardKey("dup2"): `{"host":"dup2","publicKey":"` + key(7) + `","endpoint":"192.0.2.8:51820"}`,
		model.WireGuardKey("twin"): `{"host":"twin","publicKey":"` + strings.TrimSuffix(key(2), "A=") + `B=","endpoint":"192.0.2.4:51820"}`,
	} {
		if _, err := store.Client().Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	hosts, skipped, err := New(store).WireGuardHosts(ctx)
	if err != nil || skipped != 6 || len(hosts) != 2 || hosts[0].Host != "host1" || hosts[0].PublicKey != key(1) || hosts[1].Host != "host2" {
		t.Fatalf("WireGuardHosts: %+v, %d skipped, %v; want host1 and host2 (own keys), 6 skipped", hosts, skipped, err)
	}
}
