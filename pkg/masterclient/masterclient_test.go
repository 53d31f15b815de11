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
