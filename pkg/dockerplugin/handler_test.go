package dockerplugin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestHandlerRefusals drives the plugin's HTTP routes with requests Docker could send for
// things that do not exist; each gets a clear error and nothing reaches netmaster or the
// agent. The store is a real etcd holding one network.
func TestHandlerRefusals(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	ns := model.CfgNetworkState{ID: "net1.default", Tenant: "default", NetworkName: "net1", SubnetIP: "10.5.0.0", SubnetLen: 24, Gateway: "10.5.0.1", PktTagType: "vxlan"}
	if err := store.Put(ctx, model.NetStateKey(ns.ID), ns); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Store: store, Master: masterclient.New(store), Endpoints: AgentEndpoints{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()

	call := func(path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode, m
	}
	code, m := call("/Plugin.Activate", "")
	impl, _ := m["Implements"].([]any)
	if code != 200 || len(impl) != 2 {
		t.Fatalf("activate: %d %v", code, m)
	}
	code, m = call("/NetworkDriver.GetCapabilities", "{}")
	if code != 200 || m["Scope"] != "local" || m["ConnectivityScope"] != "global" {
		t.Fatalf("capabilities: %d %v", code, m)
	}
	// Gateway answered locally from the network state.
	code, m = call("/IpamDriver.RequestPool", `{"Pool":"10.5.0.0/24","Options":{"tenant":"default","network":"net1"}}`)
	if code != 200 || m["PoolID"] != "net1.default|10.5.0.0/24" {
		t.Fatalf("request pool: %d %v", code, m)
	}
	code, m = call("/IpamDriver.RequestAddress", `{"PoolID":"net1.default|10.5.0.0/24","Options":{"RequestAddressType":"com.docker.network.gateway"}}`)
	if code != 200 || m["Address"] != "10.5.0.1/24" {
		t.Fatalf("gateway: %d %v", code, m)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/IpamDriver.RequestPool", `{"Pool":"10.6.0.0/24","Options":{"network":"nope"}}`, `contiv network "nope" of tenant "default" not found`},
		{"/IpamDriver.RequestPool", `{"Pool":"10.9.0.0/24","Options":{"network":"net1"}}`, "differs from contiv network"},
		{"/IpamDriver.RequestPool", `{}`, "needs a subnet"},
		{"/IpamDriver.RequestPool", `{"Pool":"fd00::/64","V6":true}`, "IPv6"},
		{"/IpamDriver.RequestAddress", `{"PoolID":"garbage"}`, `pool id "garbage"`},
		{"/IpamDriver.RequestAddress", `{"PoolID":"10.7.0.0/24"}`, "no contiv network has subnet 10.7.0.0/24"},
		{"/IpamDriver.RequestAddress", `{"PoolID":"net1.default|10.5.0.0/24","Address":"10.8.0.5"}`, "not in pool"},
		{"/NetworkDriver.CreateNetwork", `{"NetworkID":"abc"}`, "no IPv4 pool"},
		{"/NetworkDriver.CreateNetwork", `{"NetworkID":"abc","IPv4Data":[{"Pool":"10.6.0.0/24"}],"Options":{"com.docker.network.generic":{"network":"nope"}}}`, "not found"},
		{"/NetworkDriver.CreateEndpoint", `{"NetworkID":"unknown","EndpointID":"e1","Interface":{"Address":"10.5.0.2/24"}}`, "unknown docker network unknown"},
		{"/NetworkDriver.Join", `{"NetworkID":"n","EndpointID":"e1"}`, "unknown endpoint"},
		{"/NetworkDriver.AllocateNetwork", `{}`, "swarm"},
	} {
		code, m := call(c.path, c.body)
		if code != 500 || !strings.Contains(m["Err"].(string), c.want) {
			t.Errorf("%s %s: %d %v; want 500 mentioning %q", c.path, c.body, code, m, c.want)
		}
	}
	if code, _ := call("/NetworkDriver.CreateNetwork", `{"NetworkID":`); code != 400 {
		t.Errorf("malformed body: %d, want 400", code)
	}
	if code, _ := call("/NetworkDriver.Nope", `{}`); code != 404 {
		t.Errorf("unknown route: %d, want 404", code)
	}
}
