package master

import (
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// newScopeEnv is a netmaster with tenants t1 and t2 and network app of t2.
func newScopeEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, "bridge")
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", model.Tenant{TenantName: tn}, nil)
	}
	e.net("t2", "app", "vxlan", "10.31.0.0/24", "10.31.0.1", 0)
	return e
}

// TestHostScopeConfinesUpdateEndpoint (review): once an admin's scope leaves a tenant out,
// the host's bound agent cannot make its leftover endpoint of that tenant a provider of
// the tenant's services, nor rename it (updateEndpoint "start": 403 naming the field,
// nothing written); it may still take it out of them ("die"). Before, the scope confined
// creates only, and a drained host's agent could relabel its endpoint into any service.
func TestHostScopeConfinesUpdateEndpoint(t *testing.T) {
	e := newScopeEnv(t)
	e.ok("POST", "/api/v1/serviceLBs/t2:web/", `{"networkName":"app","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"web","tenantName":"t2"}`, nil)
	agent := e.as(auth.Identity{Name: auth.HostPrefix + "host1", Role: auth.RoleAgent})
	var r model.CreateEndpointResponse
	agent.ok("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "t2", NetworkName: "app", EndpointID: "c1",
		ConfigEP: model.ConfigEP{Container: "c1", Host: "host1"}}, &r)
	e.ok("PUT", "/api/v1/hostScopes/host1/", model.HostScope{Tenants: []string{"t1"}}, nil)

	before := e.rawGet(model.SvcLBStateKey("web:t2"))
	for _, req := range []model.UpdateEndpointRequest{
		{IPAddress: r.EndpointConfig.IPAddress, Tenant: "t2", Network: "app", Event: "start", Labels: map[string]string{"app": "web"}},
		{IPAddress: r.EndpointConfig.IPAddress, Tenant: "t2", Network: "app", Event: "start", EndpointID: "c1", EPCommonName: "db"},
	} {
		st, body := agent.do("POST", "/plugin/updateEndpoint", req)
		if st != http.StatusForbidden || !strings.Contains(body, "Tenant: host") {
			t.Errorf("updateEndpoint %+v outside the host's scope: %d %s, want 403 naming Tenant", req, st, body)
		}
	}
	if got := e.rawGet(model.SvcLBStateKey("web:t2")); got != before {
		t.Errorf("service web:t2 changed: %s, was %s", got, before)
	}
	if got := e.rawGet(model.EpStateKey("app.t2-c1")); strings.Contains(got, `"db"`) {
		t.Errorf("endpoint renamed db: %s", got)
	}
	agent.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: r.EndpointConfig.IPAddress, Tenant: "t2",
		Network: "app", Event: "die"}, nil)
}

// TestHostScopeHostCase (review): a host's scope holds whatever case the admin spelled the
// host in (host names are case-insensitive): a scope set for "HOST1" confines the agent
// bound to "host1". Before, it was another record and the agent served every tenant.
func TestHostScopeHostCase(t *testing.T) {
	e := newScopeEnv(t)
	e.ok("PUT", "/api/v1/hostScopes/HOST1/", model.HostScope{Host: "Host1", Tenants: []string{"t1"}}, nil)
	agent := e.as(auth.Identity{Name: auth.HostPrefix + "host1", Role: auth.RoleAgent})
	st, body := agent.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "t2", NetworkName: "app",
		EndpointID: "c1", ConfigEP: model.ConfigEP{Container: "c1", Host: "host1"}})
	if st != http.StatusForbidden || !strings.Contains(body, "TenantName: host") {
		t.Errorf("an endpoint outside the scope set as HOST1: %d %s, want 403", st, body)
	}
	var s model.HostScope
	e.ok("GET", "/api/v1/hostScopes/host1/", nil, &s)
	if s.Host != "host1" {
		t.Errorf("scope read as host1: host %q", s.Host)
	}
	e.ok("DELETE", "/api/v1/hostScopes/Host1/", nil, nil)
}

// TestHostScopeAnyHostName (review): every host name an agent can be bound to and create
// endpoints on can be given a scope: a scope for "node_1" (underscores are common in
// hosts' names, though not DNS's) confines the agent bound to it. Before, it was refused
// 400 and that host's agent could not be confined at all.
func TestHostScopeAnyHostName(t *testing.T) {
	e := newScopeEnv(t)
	e.ok("PUT", "/api/v1/hostScopes/node_1/", model.HostScope{Tenants: []string{"t1"}}, nil)
	agent := e.as(auth.Identity{Name: auth.HostPrefix + "node_1", Role: auth.RoleAgent})
	st, body := agent.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "t2", NetworkName: "app",
		EndpointID: "c1", ConfigEP: model.ConfigEP{Container: "c1", Host: "node_1"}})
	if st != http.StatusForbidden {
		t.Errorf("an endpoint outside node_1's scope: %d %s, want 403", st, body)
	}
	for _, bad := range []string{"a..b", "h%5Cx"} {
		if st, body := e.do("PUT", "/api/v1/hostScopes/"+bad+"/", model.HostScope{}); st != http.StatusBadRequest {
			t.Errorf("a scope for host %q: %d %s, want 400", bad, st, body)
		}
	}
}
