package master

import (
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestDottedTenantsStayApart (found by review): network ids are "<net>.<tenant>" and
// names may hold dots, so network "x.net.x" of tenant "alpha" spells the id of network
// "x.net" of tenant "x.alpha". Nothing of tenant alpha may resolve to that network: not a
// service (its VIP came from the other tenant's pool), a group (it took the other
// network's tag), a rule or a plugin request; and refusals do not name the other tenant.
func TestDottedTenantsStayApart(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tn := range []string{"alpha", "x.alpha"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", model.Tenant{TenantName: tn}, nil)
	}
	e.ok("POST", "/api/v1/networks/x.alpha:x.net/", model.Network{TenantName: "x.alpha", NetworkName: "x.net", Encap: "vlan",
		PktTag: 55, Subnet: "10.88.5.0/24", Gateway: "10.88.5.1"}, nil)
	for _, c := range []struct {
		what, method, path string
		body               any
	}{
		{"network with the colliding id", "POST", "/api/v1/networks/alpha:x.net.x/", model.Network{TenantName: "alpha", NetworkName: "x.net.x",
			Encap: "vlan", PktTag: 56, Subnet: "10.88.6.0/24"}},
		{"service on it", "POST", "/api/v1/serviceLBs/alpha:spy/", model.ServiceLB{TenantName: "alpha", ServiceName: "spy",
			NetworkName: "x.net.x", Ports: []string{"80:8080:TCP"}, Selectors: []string{"a=b"}}},
		{"group on it", "POST", "/api/v1/endpointGroups/alpha:g/", model.EndpointGroup{TenantName: "alpha", GroupName: "g", NetworkName: "x.net.x"}},
		{"endpoint on it", "POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "alpha", NetworkName: "x.net.x",
			ConfigEP: model.ConfigEP{Container: "c1", Host: "h1"}}},
	} {
		code, out := e.do(c.method, c.path, c.body)
		if code == http.StatusOK || strings.Contains(out, `"x.alpha"`) || strings.Contains(out, `"x.net"`) || strings.Contains(out, "10.88.5") {
			t.Errorf("%s: %d %s; want a refusal that names nothing of tenant x.alpha", c.what, code, out)
		}
	}
}
