package master

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestCRUDEveryObject drives every collection with the bodies Contiv's clients send: no
// key in the body, empty link-sets/links as the contivmodel client marshals them.
func TestCRUDEveryObject(t *testing.T) {
	e := newEnv(t, "bridge")
	type step struct {
		coll, key, body string
	}
	creates := []step{
		{"tenants", "blue", `{"tenantName":"blue","link-sets":{}}`},
		{"networks", "blue:net1", `{"encap":"vlan","networkName":"net1","nwType":"data","pktTag":100,"subnet":"20.1.1.0/24","gateway":"20.1.1.254","tenantName":"blue","natDisabled":true,"link-sets":{},"links":{"Tenant":{}}}`},
		{"netprofiles", "blue:gold", `{"DSCP":10,"bandwidth":"10mbps","burst":100,"profileName":"gold","tenantName":"blue","link-sets":{},"links":{"Tenant":{}}}`},
		{"policys", "blue:web-pol", `{"policyName":"web-pol","tenantName":"blue","link-sets":{},"links":{"Tenant":{}}}`},
		{"extContractsGroups", "blue:ext1", `{"contracts":["uni/tn-common/brc-default"],"contractsGroupName":"ext1","contractsType":"provided","tenantName":"blue","link-sets":{},"links":{"Tenant":{}}}`},
		{"endpointGroups", "blue:db", `{"groupName":"db","networkName":"net1","tenantName":"blue","link-sets":{},"links":{"AppProfile":{},"NetProfile":{},"Network":{},"Tenant":{}}}`},
		{"endpointGroups", "blue:web", `{"groupName":"web","networkName":"net1","policies":["web-pol"],"netProfile":"gold","extContractsGrps":["ext1"],"ipPool":"20.1.1.10-20.1.1.20","tenantName":"blue"}`},
		{"rules", "blue:web-pol:1", `{"action":"deny","direction":"in","policyName":"web-pol","priority":1,"protocol":"tcp","ruleId":"1","tenantName":"blue","link-sets":{},"links":{"MatchEndpointGroup":{}}}`},
		{"rules", "blue:web-pol:2", `{"action":"allow","direction":"in","fromEndpointGroup":"db","policyName":"web-pol","port":80,"priority":10,"protocol":"tcp","ruleId":"2","tenantName":"blue"}`},
		{"appProfiles", "blue:app1", `{"appProfileName":"app1","endpointGroups":["web","db"],"tenantName":"blue"}`},
		{"serviceLBs", "blue:svc1", `{"networkName":"net1","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"svc1","tenantName":"blue"}`},
		{"Bgps", "host1", `{"link-sets":{},"as":"65002","hostname":"host1","neighbor":"50.1.1.2","neighbor-as":"500","routerip":"50.1.1.1/24"}`},
		{"aciGws", "aciGw", `{"name":"aciGw","enforcePolicies":"yes","includeCommonTenant":"no","nodeBindings":"topology/pod-1/node-101","pathBindings":"topology/pod-1/paths-101/pathep-[eth1/14]","physicalDomain":"dom1"}`},
	}
	for _, s := range creates {
		code, out := e.do("POST", "/api/v1/"+s.coll+"/"+s.key+"/", s.body)
		if code != http.StatusOK {
			t.Fatalf("create %s %s: %d %s", s.coll, s.key, code, out)
		}
		var echo map[string]any
		if err := json.Unmarshal([]byte(out), &echo); err != nil || echo["key"] != s.key {
			t.Fatalf("create %s echo %s", s.coll, out)
		}
		var one map[string]any
		e.ok("GET", "/api/v1/"+s.coll+"/"+s.key+"/", nil, &one)
		if one["key"] != s.key {
			t.Fatalf("get %s: %v", s.key, one)
		}
		var list []map[string]any
		e.ok("GET", "/api/v1/"+s.coll+"/", nil, &list)
		found := false
		for _, o := range list {
			found = found || o["key"] == s.key
		}
		if !found {
			t.Fatalf("list %s lacks %s", s.coll, s.key)
		}
		var insp map[string]json.RawMessage
		e.ok("GET", "/api/v1/inspect/"+s.coll+"/"+s.key+"/", nil, &insp)
		if _, ok := insp["Config"]; !ok {
			t.Fatalf("inspect %s: %v", s.key, insp)
		}
	}
	// Link sets maintained by the server.
	var tn model.Tenant
	e.ok("GET", "/api/v1/tenants/blue/", nil, &tn)
	if len(tn.LinkSets.Networks) != 1 || len(tn.LinkSets.EndpointGroups) != 2 || len(tn.LinkSets.Policies) != 1 ||
		len(tn.LinkSets.AppProfiles) != 1 || len(tn.LinkSets.NetProfiles) != 1 || len(tn.LinkSets.Servicelbs) != 1 {
		t.Fatalf("tenant link sets %+v", tn.LinkSets)
	}
	var pol model.Policy
	e.ok("GET", "/api/v1/policys/blue:web-pol/", nil, &pol)
	if pol.LinkSets.EndpointGroups["blue:web"].ObjType != "endpointGroup" || len(pol.LinkSets.Rules) != 2 {
		t.Fatalf("policy link sets %+v", pol.LinkSets)
	}
	// Derived state.
	var netState model.CfgNetworkState
	if err := json.Unmarshal([]byte(e.rawGet("/contiv.io/state/nets/net1.blue")), &netState); err != nil {
		t.Fatal(err)
	}
	if !netState.NatDisabled {
		t.Errorf("network state lost natDisabled: %+v", netState)
	}
	var epgState model.EndpointGroupState
	if err := json.Unmarshal([]byte(e.rawGet("/contiv.io/state/endpointGroups/web:blue")), &epgState); err != nil {
		t.Fatal(err)
	}
	if epgState.EndpointGroupID != 2 || epgState.PktTag != 100 || epgState.PktTagType != "vlan" || epgState.DSCP != 10 ||
		epgState.Bandwidth != "10mbps" || epgState.Burst != 100 || epgState.IPPool != "20.1.1.10-20.1.1.20" || epgState.GroupTag != "web.blue" {
		t.Fatalf("epg state %+v", epgState)
	}
	if got := e.rawGet("/contiv.io/state/bgp/host1"); got != `{"id":"host1","hostname":"host1","router-ip":"50.1.1.1/24","as":"65002","neighbor-as":"500","neighbor":"50.1.1.2"}` {
		t.Fatalf("bgp state %s", got)
	}
	var svc model.CfgServiceLBState
	if err := json.Unmarshal([]byte(e.rawGet("/contiv.io/state/serviceLB/svc1:blue")), &svc); err != nil {
		t.Fatal(err)
	}
	if svc.IPAddress != "20.1.1.1" || svc.Network != "net1" || svc.Selectors["app"] != "web" {
		t.Fatalf("service state %+v", svc)
	}
	var svcs []model.CfgServiceLBState
	e.ok("GET", "/services", nil, &svcs)
	if len(svcs) != 1 || svcs[0].ID != "svc1:blue" {
		t.Fatalf("/services %+v", svcs)
	}
	// Netprofile update propagates to the EPG state.
	e.ok("POST", "/api/v1/netprofiles/blue:gold/", `{"DSCP":20,"bandwidth":"1g","profileName":"gold","tenantName":"blue"}`, nil)
	if err := json.Unmarshal([]byte(e.rawGet("/contiv.io/state/endpointGroups/web:blue")), &epgState); err != nil || epgState.DSCP != 20 || epgState.Bandwidth != "1g" {
		t.Fatalf("netprofile update not propagated: %+v", epgState)
	}
	// Global update through the netctl pattern (GET, overlay, POST).
	var g model.Global
	e.ok("GET", "/api/v1/globals/global/", nil, &g)
	g.ArpMode = "flood"
	e.ok("POST", "/api/v1/globals/global/", g, nil)
	if got := e.rawGet(model.GlobConfigKey); !strings.Contains(got, `"arp-mode":"flood"`) {
		t.Fatalf("glob config %s", got)
	}
	var gi model.GlobalInspect
	e.ok("GET", "/api/v1/inspect/globals/global/", nil, &gi)
	if gi.Oper.NumNetworks != 1 || gi.Oper.VlansInUse != "100" || gi.Oper.ClusterMode != "docker" {
		t.Fatalf("global oper %+v", gi.Oper)
	}
	// Refusals while in use.
	for _, c := range []struct{ path string }{
		{"/api/v1/tenants/blue/"}, {"/api/v1/networks/blue:net1/"}, {"/api/v1/policys/blue:web-pol/"},
		{"/api/v1/endpointGroups/blue:web/"}, {"/api/v1/netprofiles/blue:gold/"}, {"/api/v1/extContractsGroups/blue:ext1/"},
	} {
		if code, out := e.do("DELETE", c.path, nil); code != http.StatusConflict {
			t.Fatalf("DELETE %s while in use: %d %s", c.path, code, out)
		}
	}
	// Delete everything in dependency order; DELETE answers the key as a JSON string.
	deletes := []string{"serviceLBs/blue:svc1", "appProfiles/blue:app1", "rules/blue:web-pol:2", "endpointGroups/blue:web",
		"endpointGroups/blue:db", "rules/blue:web-pol:1", "policys/blue:web-pol", "netprofiles/blue:gold",
		"extContractsGroups/blue:ext1", "networks/blue:net1", "tenants/blue", "Bgps/host1", "aciGws/aciGw"}
	for _, d := range deletes {
		var k string
		e.ok("DELETE", "/api/v1/"+d+"/", nil, &k)
		if !strings.HasSuffix(d, "/"+k) {
			t.Fatalf("delete %s answered %q", d, k)
		}
		if code, _ := e.do("GET", "/api/v1/"+d+"/", nil); code != http.StatusNotFound {
			t.Fatalf("%s still there", d)
		}
	}
	// Everything derived is gone; tags and addresses are back.
	for _, p := range []string{model.NetStatePrefix, model.EPGStatePrefix, model.PolicyStatePrefix, model.RuleStatePrefix,
		model.SvcLBStatePrefix, model.ProviderPrefix, model.BgpStatePrefix, model.EpStatePrefix} {
		if kvs, _, _ := e.store.List(t.Context(), p); len(kvs) != 0 {
			t.Fatalf("%s left behind: %v", p, kvs[0].Key)
		}
	}
	var vo model.VlanResourceOper
	if err := json.Unmarshal([]byte(e.rawGet(model.VlanResOperKey)), &vo); err != nil || !vo.FreeVLANs.Test(100) || vo.FreeVLANs.Count() != 4094 {
		t.Fatalf("vlan 100 not released: %d free", vo.FreeVLANs.Count())
	}
}

func TestPolicyExpansion(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "n1", "vxlan", "10.1.0.0/16", "10.1.0.1", 0)
	e.ok("POST", "/api/v1/policys/default:p/", `{"policyName":"p","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:db/", `{"groupName":"db","networkName":"n1","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","policies":["p"],"tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:1/", `{"action":"deny","direction":"in","policyName":"p","priority":1,"protocol":"tcp","ruleId":"1","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:2/", `{"action":"allow","direction":"in","fromEndpointGroup":"db","policyName":"p","port":80,"priority":10,"protocol":"tcp","ruleId":"2","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:3/", `{"action":"allow","direction":"out","toIpAddress":"8.8.8.8/32","policyName":"p","port":53,"priority":5,"protocol":"udp","ruleId":"3","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:4/", `{"action":"deny","direction":"out","toNetwork":"n1","policyName":"p","protocol":"icmp","ruleId":"4","tenantName":"default"}`, nil)
	pfx := "default:web:default:p:default:p:"
	get := func(id string) model.CfgPolicyRule {
		t.Helper()
		raw := e.rawGet(model.RuleStateKey(id))
		if raw == "" {
			t.Fatalf("policyRule %s missing", id)
		}
		var r model.CfgPolicyRule
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := get(pfx + "1:inRx")
	if r.DstEndpointGroup != 2 || r.IpProtocol != 6 || r.TcpFlags != "syn,!ack" || r.Action != "deny" || r.Priority != 1 {
		t.Fatalf("rule 1 inRx %+v", r)
	}
	if e.rawGet(model.RuleStateKey(pfx+"1:inTx")) != "" {
		t.Fatal("rule 1 must not have inTx")
	}
	r = get(pfx + "2:inRx")
	if r.SrcEndpointGroup != 1 || r.DstEndpointGroup != 2 || r.DstPort != 80 || r.TcpFlags != "" {
		t.Fatalf("rule 2 inRx %+v", r)
	}
	r = get(pfx + "2:inTx")
	if r.SrcEndpointGroup != 2 || r.DstEndpointGroup != 1 || r.SrcPort != 80 {
		t.Fatalf("rule 2 inTx %+v", r)
	}
	r = get(pfx + "3:outTx")
	if r.SrcEndpointGroup != 2 || r.DstIpAddr != "8.8.8.8/32" || r.DstPort != 53 || r.IpProtocol != 17 {
		t.Fatalf("rule 3 outTx %+v", r)
	}
	r = get(pfx + "3:outRx")
	if r.DstEndpointGroup != 2 || r.SrcIpAddr != "8.8.8.8/32" || r.SrcPort != 53 {
		t.Fatalf("rule 3 outRx %+v", r)
	}
	r = get(pfx + "4:outTx")
	if r.DstIpAddr != "10.1.0.0/16" || r.IpProtocol != 1 {
		t.Fatalf("rule 4 outTx %+v", r)
	}
	// Raw JSON uses Go field names.
	if raw := e.rawGet(model.RuleStateKey(pfx + "2:inRx")); !strings.HasPrefix(raw, `{"id":"`+pfx+`2:inRx","RuleId":"`) {
		t.Fatalf("policyRule JSON %s", raw)
	}
	var ep model.EpgPolicy
	if err := json.Unmarshal([]byte(e.rawGet(model.PolicyStateKey("default:web:default:p"))), &ep); err != nil {
		t.Fatal(err)
	}
	// RuleMaps stay empty (the policyRule ids say which rule they expand; see addRuleToEpgPolicy).
	if ep.EndpointGroupID != 2 || len(ep.RuleMaps) != 0 {
		t.Fatalf("epg policy %+v", ep)
	}
	// Rule removal and detaching the policy remove the records.
	e.ok("DELETE", "/api/v1/rules/default:p:2/", nil, nil)
	if e.rawGet(model.RuleStateKey(pfx+"2:inRx")) != "" {
		t.Fatal("deleted rule still expanded")
	}
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","tenantName":"default"}`, nil)
	if kvs, _, _ := e.store.List(t.Context(), model.RuleStatePrefix); len(kvs) != 0 {
		t.Fatalf("detach left %d policyRule records", len(kvs))
	}
	if e.rawGet(model.PolicyStateKey("default:web:default:p")) != "" {
		t.Fatal("detach left the EpgPolicy record")
	}
}

// Node ports: validated, one service per node port across tenants (409), released on
// update and delete, mirrored into the service state.
func TestServiceNodePorts(t *testing.T) {
	e := newEnv(t, "routing")
	e.ok("POST", "/api/v1/tenants/blue/", map[string]any{"tenantName": "blue"}, nil)
	for _, n := range []struct{ tenant, net, subnet string }{{"default", "n1", "10.1.1.0/24"}, {"blue", "n2", "10.2.1.0/24"}} {
		e.ok("POST", "/api/v1/networks/"+n.tenant+":"+n.net+"/", map[string]any{"tenantName": n.tenant, "networkName": n.net, "encap": "vxlan", "subnet": n.subnet, "gateway": strings.TrimSuffix(n.subnet, "0/24") + "1"}, nil)
	}
	svc := func(tenant, net, name string, nodePorts ...string) map[string]any {
		return map[string]any{"tenantName": tenant, "networkName": net, "serviceName": name, "selectors": []string{"app=" + name},
			"ports": []string{"80:8080:TCP", "53:5353:UDP"}, "nodePorts": nodePorts}
	}
	e.ok("POST", "/api/v1/serviceLBs/default:web/", svc("default", "n1", "web", "30080:80:TCP", "30053:53:udp"), nil)
	var st model.CfgServiceLBState
	if err := json.Unmarshal([]byte(e.rawGet(model.SvcLBStateKey("web:default"))), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.NodePorts) != 2 {
		t.Fatalf("state node ports %v", st.NodePorts)
	}
	for _, tc := range []struct {
		body map[string]any
		code int
		msg  string
	}{
		{svc("blue", "n2", "api", "30080:80:TCP"), 409, "node port 30080/TCP is already used by a service of another tenant"},
		{svc("blue", "n2", "api", "29999:80:TCP"), 400, "outside 30000-32767"},
		{svc("blue", "n2", "api", "30081:81:TCP"), 400, "the service has no port 81/TCP"},
		{svc("blue", "n2", "api", "30081:80:SCTP"), 400, "protocol must be TCP or UDP"},
		{svc("blue", "n2", "api", "30081:80"), 400, "must be nodePort:svcPort:protocol"},
		{svc("blue", "n2", "api", "30081:80:TCP", "30081:80:tcp"), 400, "listed twice"},
		{svc("blue", "n2", "api", "30081:80:TCP", "30082:80:TCP"), 400, "service port 80/TCP already has a node port"},
	} {
		if code, out := e.do("POST", "/api/v1/serviceLBs/blue:api/", tc.body); code != tc.code || !strings.Contains(out, tc.msg) {
			t.Errorf("%v: %d %q, want %d %q", tc.body["nodePorts"], code, out, tc.code, tc.msg)
		}
	}
	// The same port number on the other protocol is another node port.
	e.ok("POST", "/api/v1/serviceLBs/blue:api/", svc("blue", "n2", "api", "30080:53:UDP"), nil)
	// An update that drops a node port releases it; a delete releases the rest.
	e.ok("POST", "/api/v1/serviceLBs/default:web/", svc("default", "n1", "web", "30053:53:udp"), nil)
	e.ok("POST", "/api/v1/serviceLBs/blue:api/", svc("blue", "n2", "api", "30080:53:UDP", "30080:80:TCP"), nil)
	e.ok("DELETE", "/api/v1/serviceLBs/default:web/", nil, nil)
	if v := e.rawGet(model.NodePortKey(30053, "udp")); v != "" {
		t.Errorf("node port of a deleted service still held: %s", v)
	}
	e.ok("POST", "/api/v1/serviceLBs/default:web/", svc("default", "n1", "web", "30053:53:UDP"), nil)
}

// Docker's gateway request for a network created without one reserves its first host
// address as the gateway (containers then start at .2); asked again, or for a network with
// a gateway, it only answers the gateway.
func TestAllocGateway(t *testing.T) {
	e := newEnv(t, "routing")
	e.net("default", "walk", "vxlan", "10.103.1.0/24", "", 0)
	var r model.AllocAddressResponse
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "walk.default", Gateway: true}, &r)
	if r.IPv4Address != "10.103.1.1/24" {
		t.Fatalf("gateway %q, want 10.103.1.1/24", r.IPv4Address)
	}
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "walk.default", Gateway: true}, &r)
	if r.IPv4Address != "10.103.1.1/24" {
		t.Fatalf("gateway asked again: %q", r.IPv4Address)
	}
	var ns model.CfgNetworkState
	if err := json.Unmarshal([]byte(e.rawGet(model.NetStateKey("walk.default"))), &ns); err != nil {
		t.Fatal(err)
	}
	if ns.Gateway != "10.103.1.1" {
		t.Errorf("network state gateway %q", ns.Gateway)
	}
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "walk.default"}, &r)
	if r.IPv4Address != "10.103.1.2/24" {
		t.Errorf("first container address %q, want .2", r.IPv4Address)
	}
	e.net("default", "gw", "vxlan", "10.104.1.0/24", "10.104.1.254", 0)
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "gw.default", Gateway: true}, &r)
	if r.IPv4Address != "10.104.1.254/24" {
		t.Errorf("network with a gateway: %q", r.IPv4Address)
	}
	// Contiv's own clients never send the field: their JSON is unchanged.
	if b, _ := json.Marshal(model.AllocAddressRequest{NetworkID: "x"}); strings.Contains(string(b), "Gateway") {
		t.Errorf("request JSON %s", b)
	}
}
