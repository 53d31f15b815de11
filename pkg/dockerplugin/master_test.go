package dockerplugin

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// TestMasterREST: network create/delete go through masterclient to the registered
// netmaster; deleting a missing network succeeds, other refusals are errors.
func TestMasterREST(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	var posted model.Network
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/networks/t1:n1/":
			if err := json.NewDecoder(r.Body).Decode(&posted); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_ = json.NewEncoder(w).Encode(posted)
		case r.Method == http.MethodDelete && r.URL.Path == "/api/v1/networks/t1:gone/":
			http.Error(w, "network t1:gone not found", http.StatusNotFound)
		default:
			http.Error(w, "in use", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	p, _ := strconv.Atoi(port)
	if err := store.Put(ctx, state.ServicePrefix+"netmaster/"+host+":"+port, map[string]any{
		"ServiceName": "netmaster", "HostAddr": host, "Port": p, "TTL": 10}); err != nil {
		t.Fatal(err)
	}
	m := MasterREST{Master: masterclient.New(store)}
	n := model.Network{Key: "t1:n1", TenantName: "t1", NetworkName: "n1", Subnet: "10.1.0.0/24"}
	if err := m.CreateNetwork(ctx, n); err != nil {
		t.Fatal(err)
	}
	if posted.NetworkName != "n1" || posted.Subnet != "10.1.0.0/24" {
		t.Fatalf("netmaster received %+v", posted)
	}
	if err := m.DeleteNetwork(ctx, "t1", "gone"); err != nil {
		t.Fatalf("delete of a missing network: %v", err)
	}
	if err := m.DeleteNetwork(ctx, "t1", "busy"); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("delete refused by netmaster: err = %v", err)
	}
}
