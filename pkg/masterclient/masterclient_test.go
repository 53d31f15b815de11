package masterclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/state/statetest"
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
