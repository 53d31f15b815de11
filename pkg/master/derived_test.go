package master

import (
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestContivDerivedFields: what Contiv's netmaster fills in, a Contiv client reads back:
// a rule naming a network carries its subnet; a group named by rules lists them in
// link-sets.MatchRules (and forgets them with the rule); an allocated VIP shows only in
// Oper.serviceVip; a service never selects another tenant's endpoints, even when the
// tenants' names end alike.
func TestContivDerivedFields(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "n1", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.net("default", "n2", "vxlan", "10.1.2.0/24", "10.1.2.1", 0)
	e.ok("POST", "/api/v1/policys/default:p/", `{"policyName":"p","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","policies":["p"],"tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:db/", `{"groupName":"db","networkName":"n1","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:1/", `{"action":"allow","direction":"in","fromNetwork":"n2","policyName":"p","ruleId":"1","tenantName":"default","protocol":"tcp","port":80}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:2/", `{"action":"allow","direction":"in","fromEndpointGroup":"db","policyName":"p","ruleId":"2","tenantName":"default"}`, nil)

	var r model.Rule
	e.ok("GET", "/api/v1/rules/default:p:1/", nil, &r)
	if r.FromIpAddress != "10.1.2.0/24" || r.FromNetwork != "n2" {
		t.Errorf("rule with fromNetwork: fromIpAddress %q", r.FromIpAddress)
	}
	var g model.EndpointGroup
	e.ok("GET", "/api/v1/endpointGroups/default:db/", nil, &g)
	if l, ok := g.LinkSets.MatchRules["default:p:2"]; !ok || l.ObjType != model.TypeRule {
		t.Errorf("group db named by rule 2: MatchRules %v", g.LinkSets.MatchRules)
	}
	e.ok("DELETE", "/api/v1/rules/default:p:2/", nil, nil)
	g = model.EndpointGroup{}
	e.ok("GET", "/api/v1/endpointGroups/default:db/", nil, &g)
	if len(g.LinkSets.MatchRules) != 0 {
		t.Errorf("rule deleted, MatchRules still %v", g.LinkSets.MatchRules)
	}

	e.ok("POST", "/api/v1/serviceLBs/default:s/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"s","tenantName":"default"}`, nil)
	var s model.ServiceLB
	e.ok("GET", "/api/v1/serviceLBs/default:s/", nil, &s)
	var si model.ServiceLBInspect
	e.ok("GET", "/api/v1/inspect/serviceLBs/default:s/", nil, &si)
	if s.IpAddress != "" || si.Oper.ServiceVip == "" {
		t.Errorf("auto VIP: config ipAddress %q, oper serviceVip %q", s.IpAddress, si.Oper.ServiceVip)
	}

	// Tenants "b" and "a.b": network n of "a.b" has id n.a.b, ending in ".b".
	for _, tn := range []string{"b", "a.b"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
		e.net(tn, "n", "vxlan", "10.9.9.0/24", "", 0)
	}
	other := e.createEP("a.b", "n", "", "c1", "")
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: other.IPAddress, Tenant: "a.b", Network: "n",
		Event: "start", Labels: map[string]string{"app": "x"}}, nil)
	e.ok("POST", "/api/v1/serviceLBs/b:sx/", `{"networkName":"n","ports":["80:80:TCP"],"selectors":["app=x"],"serviceName":"sx","tenantName":"b"}`, nil)
	if got := e.rawGet("/contiv.io/state/serviceLB/sx:b"); strings.Contains(got, other.IPAddress+":") {
		t.Errorf("tenant b's service took tenant a.b's endpoint: %s", got)
	}

	// An endpoint created without a container ("<host>-native-intf", outside its network's
	// key range) is found by its tenant: labelled, a backend by address and by selector.
	var nr model.CreateEndpointResponse
	e.ok("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "b", NetworkName: "n",
		ConfigEP: model.ConfigEP{Host: "host7"}}, &nr)
	native := nr.EndpointConfig
	if native.ID != "host7-native-intf" {
		t.Fatalf("native endpoint id %q", native.ID)
	}
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: native.IPAddress, Tenant: "b", Network: "n",
		Event: "start", Labels: map[string]string{"app": "y"}}, nil)
	e.ok("POST", "/api/v1/serviceLBs/b:sy/", `{"networkName":"n","ports":["80:80:TCP"],"selectors":["app=y"],"serviceName":"sy","tenantName":"b"}`, nil)
	if got := e.rawGet("/contiv.io/state/serviceLB/sy:b"); !strings.Contains(got, native.IPAddress+":b") {
		t.Errorf("tenant b's service did not take its native endpoint %s: %s", native.IPAddress, got)
	}
}
