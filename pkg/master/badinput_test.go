package master

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestBadInputLeavesEtcdUntouched: every refused request answers the right 4xx naming the
// problem, and etcd (every key, value and the revision) is exactly as before.
func TestBadInputLeavesEtcdUntouched(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "n1", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.createEP("default", "n1", "", "ep1", "")
	e.ok("POST", "/api/v1/policys/default:p/", `{"policyName":"p","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","policies":["p"],"tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:r1/", `{"action":"allow","direction":"in","policyName":"p","ruleId":"r1","tenantName":"default"}`, nil)
	// Names that spell the same state ids in two tenants: network a1 of tenant b1.c1 owns
	// state/nets/a1.b1.c1; endpoint "c-d" of network x in tenant y owns eps/x.y-c-d.
	for _, tn := range []string{"b1.c1", "c1", "y", "y-c"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	e.net("b1.c1", "a1", "vxlan", "10.3.3.0/24", "", 0)
	e.net("y", "x", "vxlan", "10.4.4.0/24", "", 0)
	e.net("y-c", "x", "vxlan", "10.4.4.0/24", "", 0)
	e.createEP("y", "x", "", "c-d", "")
	e.ok("POST", "/api/v1/serviceLBs/default:vip/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["a=b"],"serviceName":"vip","tenantName":"default","ipAddress":"10.1.1.200"}`, nil)

	net := func(extra string) string {
		return `{"tenantName":"default","networkName":"n2","encap":"vxlan","subnet":"10.2.2.0/24"` + extra + `}`
	}
	cases := []struct {
		name, method, path, body string
		code                     int
		msg                      string
	}{
		{"malformed json", "POST", "/api/v1/tenants/t1/", `{"tenantName":`, 400, "malformed JSON"},
		{"empty body", "POST", "/api/v1/tenants/t1/", ``, 400, "empty request body"},
		{"trailing data", "POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"} {}`, 400, "trailing"},
		{"unknown field", "POST", "/api/v1/networks/default:n2/", net(`,"colour":"red"`), 400, `unknown field "colour"`},
		{"mistyped field", "POST", "/api/v1/networks/default:n2/", net(`,"pktTag":"ten"`), 400, `"pktTag"`},
		{"array instead of object", "POST", "/api/v1/networks/default:n2/", `[1,2]`, 400, "malformed JSON"},
		{"key mismatch", "POST", "/api/v1/networks/default:other/", net(``), 400, "Invalid Key"},
		{"missing subnet", "POST", "/api/v1/networks/default:n2/", `{"tenantName":"default","networkName":"n2","encap":"vxlan"}`, 400, "subnet"},
		{"bad subnet", "POST", "/api/v1/networks/default:n2/", `{"tenantName":"default","networkName":"n2","encap":"vxlan","subnet":"10.2.2.0/33"}`, 400, "subnet"},
		{"huge subnet", "POST", "/api/v1/networks/default:n2/", `{"tenantName":"default","networkName":"n2","encap":"vxlan","subnet":"10.0.0.0/8"}`, 400, "subnet"},
		{"gateway outside", "POST", "/api/v1/networks/default:n2/", net(`,"gateway":"10.9.9.1"`), 400, "gateway"},
		{"bad encap", "POST", "/api/v1/networks/default:n2/", `{"tenantName":"default","networkName":"n2","encap":"gre","subnet":"10.2.2.0/24"}`, 400, "encap"},
		{"bad name", "POST", "/api/v1/networks/default:n_2/", `{"tenantName":"default","networkName":"n_2","encap":"vxlan","subnet":"10.2.2.0/24"}`, 400, "networkName"},
		{"pktTag too big", "POST", "/api/v1/networks/default:n2/", net(`,"pktTag":16777217`), 400, "pktTag"},
		{"bad ipv6 subnet", "POST", "/api/v1/networks/default:n2/", net(`,"ipv6Subnet":"zz::/64"`), 400, "ipv6Subnet"},
		{"missing tenant", "POST", "/api/v1/networks/nope:n2/", `{"tenantName":"nope","networkName":"n2","encap":"vxlan","subnet":"10.2.2.0/24"}`, 422, "tenant"},
		{"overlapping subnet", "POST", "/api/v1/networks/default:n2/", `{"tenantName":"default","networkName":"n2","encap":"vxlan","subnet":"10.1.0.0/16"}`, 409, "overlaps"},
		{"network update", "POST", "/api/v1/networks/default:n1/", `{"tenantName":"default","networkName":"n1","encap":"vxlan","subnet":"10.1.1.0/24","gateway":"10.1.1.1"}`, 409, "can't change"},
		{"network name clashes with epg", "POST", "/api/v1/networks/default:web/", `{"tenantName":"default","networkName":"web","encap":"vxlan","subnet":"10.7.1.0/24"}`, 409, "endpoint group"},
		{"tenant update", "POST", "/api/v1/tenants/default/", `{"tenantName":"default"}`, 409, "can't be updated"},
		{"delete network with epg", "DELETE", "/api/v1/networks/default:n1/", ``, 409, "endpoint group"},
		{"delete tenant with objects", "DELETE", "/api/v1/tenants/default/", ``, 409, "still has"},
		{"delete missing", "DELETE", "/api/v1/networks/default:zzz/", ``, 404, "not found"},
		{"get missing", "GET", "/api/v1/networks/default:zzz/", ``, 404, "not found"},
		{"inspect missing", "GET", "/api/v1/inspect/networks/default:zzz/", ``, 404, "not found"},
		{"epg missing network", "POST", "/api/v1/endpointGroups/default:g2/", `{"groupName":"g2","networkName":"nonet","tenantName":"default"}`, 422, "networkName"},
		{"epg missing policy", "POST", "/api/v1/endpointGroups/default:g2/", `{"groupName":"g2","networkName":"n1","policies":["nop"],"tenantName":"default"}`, 422, "policies"},
		{"epg pool outside", "POST", "/api/v1/endpointGroups/default:g2/", `{"groupName":"g2","networkName":"n1","ipPool":"10.5.5.1-10.5.5.9","tenantName":"default"}`, 422, "ipPool"},
		{"epg pool allocated", "POST", "/api/v1/endpointGroups/default:g2/", `{"groupName":"g2","networkName":"n1","ipPool":"10.1.1.1-10.1.1.9","tenantName":"default"}`, 409, "already allocated"},
		{"epg bad pool", "POST", "/api/v1/endpointGroups/default:g2/", `{"groupName":"g2","networkName":"n1","ipPool":"10.1.1.x","tenantName":"default"}`, 400, "ipPool"},
		{"epg network change", "POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n9","tenantName":"default"}`, 409, "networkName"},
		{"epg name clashes with network", "POST", "/api/v1/endpointGroups/default:n1/", `{"groupName":"n1","networkName":"n1","tenantName":"default"}`, 409, "clashes"},
		{"rule in with to-group", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","direction":"in","toEndpointGroup":"web","policyName":"p","ruleId":"r2","tenantName":"default"}`, 400, "toEndpointGroup"},
		{"rule out with from-network", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","direction":"out","fromNetwork":"n1","policyName":"p","ruleId":"r2","tenantName":"default"}`, 400, "fromNetwork"},
		{"rule from-network and from-ip", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","direction":"in","fromNetwork":"n1","fromIpAddress":"1.2.3.4","policyName":"p","ruleId":"r2","tenantName":"default"}`, 400, "fromNetwork"},
		{"rule priority", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","direction":"in","priority":101,"policyName":"p","ruleId":"r2","tenantName":"default"}`, 400, "priority"},
		{"rule protocol", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","direction":"in","protocol":"999","policyName":"p","ruleId":"r2","tenantName":"default"}`, 400, "protocol"},
		{"rule no direction", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","policyName":"p","ruleId":"r2","tenantName":"default"}`, 400, "direction"},
		{"rule missing policy", "POST", "/api/v1/rules/default:q:r2/", `{"action":"allow","direction":"in","policyName":"q","ruleId":"r2","tenantName":"default"}`, 422, "policyName"},
		{"rule missing group", "POST", "/api/v1/rules/default:p:r2/", `{"action":"allow","direction":"in","fromEndpointGroup":"ghost","policyName":"p","ruleId":"r2","tenantName":"default"}`, 422, "fromEndpointGroup"},
		{"rule update", "POST", "/api/v1/rules/default:p:r1/", `{"action":"deny","direction":"in","policyName":"p","ruleId":"r1","tenantName":"default"}`, 409, "can't be updated"},
		{"delete attached policy", "DELETE", "/api/v1/policys/default:p/", ``, 409, "attached"},
		{"service no selector", "POST", "/api/v1/serviceLBs/default:s/", `{"networkName":"n1","ports":["80:8080:TCP"],"serviceName":"s","tenantName":"default"}`, 400, "selectors"},
		{"service bad selector", "POST", "/api/v1/serviceLBs/default:s/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["a=b=c"],"serviceName":"s","tenantName":"default"}`, 400, "selectors"},
		{"service bad port", "POST", "/api/v1/serviceLBs/default:s/", `{"networkName":"n1","ports":["80:99999:TCP"],"selectors":["a=b"],"serviceName":"s","tenantName":"default"}`, 400, "ports"},
		{"service missing network", "POST", "/api/v1/serviceLBs/default:s/", `{"networkName":"zz","ports":["80:80:TCP"],"selectors":["a=b"],"serviceName":"s","tenantName":"default"}`, 422, "networkName"},
		{"netprofile dscp", "POST", "/api/v1/netprofiles/default:np/", `{"DSCP":64,"profileName":"np","tenantName":"default"}`, 400, "DSCP"},
		{"netprofile burst 1", "POST", "/api/v1/netprofiles/default:np/", `{"burst":1,"profileName":"np","tenantName":"default"}`, 400, "burst"},
		{"netprofile bandwidth", "POST", "/api/v1/netprofiles/default:np/", `{"bandwidth":"fast","profileName":"np","tenantName":"default"}`, 400, "bandwidth"},
		{"netprofile bandwidth overflow", "POST", "/api/v1/netprofiles/default:np/", `{"bandwidth":"99999999999999999999g","profileName":"np","tenantName":"default"}`, 400, "bandwidth"},
		{"netprofile bandwidth too high", "POST", "/api/v1/netprofiles/default:np/", `{"bandwidth":"1001g","profileName":"np","tenantName":"default"}`, 400, "bandwidth"},
		{"netprofile bandwidth no unit", "POST", "/api/v1/netprofiles/default:np/", `{"bandwidth":"100","profileName":"np","tenantName":"default"}`, 400, "bandwidth"},
		{"netprofile dscp negative", "POST", "/api/v1/netprofiles/default:np/", `{"DSCP":-1,"profileName":"np","tenantName":"default"}`, 400, "DSCP"},
		{"netprofile burst too big", "POST", "/api/v1/netprofiles/default:np/", `{"bandwidth":"10mbps","burst":10487,"profileName":"np","tenantName":"default"}`, 400, "burst"},
		{"global bad vlans", "POST", "/api/v1/globals/global/", `{"name":"global","vlans":"0-5000","vxlans":"1-10000","pvtSubnet":"172.19.0.0/16","fwdMode":"bridge"}`, 400, "vlans"},
		{"global bad pvt subnet", "POST", "/api/v1/globals/global/", `{"name":"global","vlans":"1-4094","vxlans":"1-10000","pvtSubnet":"172.19.0.0/24","fwdMode":"bridge"}`, 400, "pvtSubnet"},
		{"global bad encryption", "POST", "/api/v1/globals/global/", `{"name":"global","vlans":"1-4094","vxlans":"1-10000","pvtSubnet":"172.19.0.0/16","fwdMode":"bridge","encryption":"ipsec"}`, 400, "encryption"},
		{"global fwd change", "POST", "/api/v1/globals/global/", `{"name":"global","vlans":"1-4094","vxlans":"1-10000","pvtSubnet":"172.19.0.0/16","fwdMode":"routing"}`, 409, "fwdMode"},
		{"global wrong key", "POST", "/api/v1/globals/other/", `{"name":"other","vlans":"1-4094","vxlans":"1-10000","pvtSubnet":"172.19.0.0/16"}`, 400, "name"},
		{"global delete", "DELETE", "/api/v1/globals/global/", ``, 409, "global"},
		{"bgp bad router ip", "POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"1.2.3.4"}`, 400, "routerip"},
		{"bgp bad as", "POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"1.2.3.4/24","as":"65x","neighbor-as":"65000","neighbor":"1.2.3.1"}`, 400, "as:"},
		{"bgp as 0", "POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"1.2.3.4/24","as":"0","neighbor-as":"65000","neighbor":"1.2.3.1"}`, 400, "as:"},
		{"bgp as too big", "POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"1.2.3.4/24","as":"65001","neighbor-as":"4294967296","neighbor":"1.2.3.1"}`, 400, "neighbor-as"},
		{"bgp neighbor off-link", "POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"1.2.3.4/24","as":"65001","neighbor-as":"65000","neighbor":"9.9.9.9"}`, 400, "neighbor"},
		{"bgp neighbor itself", "POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"1.2.3.4/24","as":"65001","neighbor-as":"65000","neighbor":"1.2.3.4"}`, 400, "neighbor"},
		{"aciGw bad binding", "POST", "/api/v1/aciGws/aciGw/", `{"name":"aciGw","pathBindings":"bogus"}`, 400, "pathBindings"},
		{"extcontracts bad type", "POST", "/api/v1/extContractsGroups/default:x/", `{"contractsGroupName":"x","contractsType":"both","tenantName":"default"}`, 400, "contractsType"},
		{"extcontracts too many", "POST", "/api/v1/extContractsGroups/default:x/", `{"contractsGroupName":"x","contractsType":"provided","tenantName":"default","contracts":[` + strings.TrimSuffix(strings.Repeat(`"c",`, 257), ",") + `]}`, 400, "contracts: 257 contracts"},
		{"extcontracts long", "POST", "/api/v1/extContractsGroups/default:x/", `{"contractsGroupName":"x","contractsType":"provided","tenantName":"default","contracts":["` + strings.Repeat("a", 256) + `"]}`, 400, "contracts[0]"},
		{"extcontracts bad chars", "POST", "/api/v1/extContractsGroups/default:x/", `{"contractsGroupName":"x","contractsType":"provided","tenantName":"default","contracts":["uni/tn-a b"]}`, 400, "contracts[0]"},
		{"extcontracts repeated", "POST", "/api/v1/extContractsGroups/default:x/", `{"contractsGroupName":"x","contractsType":"provided","tenantName":"default","contracts":["uni/tn-common/brc-web","uni/tn-common/brc-web"]}`, 400, "listed twice"},
		{"container named like a host endpoint", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"x-native-intf","Host":"h"}}`, 400, "ConfigEP.Container"},
		{"alloc unknown network", "POST", "/plugin/allocAddress", `{"NetworkID":"zz.default"}`, 422, "NetworkID"},
		{"alloc unknown field", "POST", "/plugin/allocAddress", `{"NetworkID":"n1.default","Pool":"x"}`, 400, "unknown field"},
		{"alloc nothing", "POST", "/plugin/allocAddress", `{}`, 400, "NetworkID"},
		{"alloc preferred outside", "POST", "/plugin/allocAddress", `{"NetworkID":"n1.default","PreferredIPv4Address":"10.9.9.9"}`, 422, "not inside"},
		{"alloc unknown pool", "POST", "/plugin/allocAddress", `{"AddressPool":"10.99.0.0/24"}`, 422, "AddressPool"},
		{"create ep unknown network", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"zz","ConfigEP":{"Container":"c","Host":"h"}}`, 422, "NetworkName"},
		{"create ep unknown group", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ServiceName":"gg","ConfigEP":{"Container":"c","Host":"h"}}`, 422, "ServiceName"},
		{"create ep bad ip", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"c","Host":"h","IPAddress":"300.1.1.1"}}`, 400, "ConfigEP.IPAddress"},
		{"create ep bad k8s pod", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","K8sPod":"../x","ConfigEP":{"Container":"c","Host":"h"}}`, 400, "K8sPod"},
		{"colliding network state key", "POST", "/api/v1/networks/c1:a1.b1/", `{"tenantName":"c1","networkName":"a1.b1","encap":"vxlan","subnet":"10.5.5.0/24"}`, 409, "which another network holds"},
		{"colliding endpoint id", "POST", "/plugin/createEndpoint", `{"TenantName":"y-c","NetworkName":"x","ConfigEP":{"Container":"d","Host":"h"}}`, 409, "belongs to endpoint"},
		{"delete colliding endpoint id", "POST", "/plugin/deleteEndpoint", `{"TenantName":"y-c","NetworkName":"x","EndpointID":"d"}`, 404, "not found"},
		{"alloc preferred held by endpoint", "POST", "/plugin/allocAddress", `{"NetworkID":"n1.default","PreferredIPv4Address":"10.1.1.2"}`, 409, "endpoint"},
		{"alloc preferred gateway", "POST", "/plugin/allocAddress", `{"NetworkID":"n1.default","PreferredIPv4Address":"10.1.1.1"}`, 409, "gateway"},
		{"alloc preferred vip", "POST", "/plugin/allocAddress", `{"NetworkID":"n1.default","PreferredIPv4Address":"10.1.1.200"}`, 409, "VIP of service"},
		{"create ep with endpoint's ip", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"c9","Host":"h","IPAddress":"10.1.1.2"}}`, 409, "already used by endpoint"},
		{"create ep with gateway ip", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"c9","Host":"h","IPAddress":"10.1.1.1"}}`, 409, "gateway"},
		{"create ep with vip", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"c9","Host":"h","IPAddress":"10.1.1.200/24"}}`, 409, "VIP"},
		{"service with endpoint's ip", "POST", "/api/v1/serviceLBs/default:s2/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["a=b"],"serviceName":"s2","tenantName":"default","ipAddress":"10.1.1.2"}`, 409, "endpoint"},
		{"plugin field with ..", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"../victim","Host":"h"}}`, 400, "ConfigEP.Container"},
		{"plugin field with slash", "POST", "/plugin/deleteEndpoint", `{"TenantName":"default","NetworkName":"n1","EndpointID":"a/b"}`, 400, "EndpointID"},
		{"plugin field with NUL", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"c\u0000x","Host":"h"}}`, 400, "control character"},
		{"plugin field too long", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1","ConfigEP":{"Container":"` + strings.Repeat("c", 300) + `","Host":"h"}}`, 400, "at most 256"},
		{"update ep not an endpoint", "POST", "/plugin/updateEndpoint", `{"IPAddress":"10.1.1.77","Tenant":"default","Event":"start","Labels":{"a":"b"}}`, 422, "not an endpoint"},
		{"update ep garbage ip", "POST", "/plugin/updateEndpoint", `{"IPAddress":"not-an-ip","Tenant":"default","Event":"start"}`, 400, "IPAddress"},
		{"update ep endpoint of another tenant", "POST", "/plugin/updateEndpoint", `{"IPAddress":"10.4.4.1","Tenant":"default","Event":"start","Labels":{"a":"b"}}`, 422, "not an endpoint"},
		{"release vip", "POST", "/plugin/releaseAddress", `{"NetworkID":"n1.default","IPv4Address":"10.1.1.200"}`, 409, "VIP"},
		{"create ep no id", "POST", "/plugin/createEndpoint", `{"TenantName":"default","NetworkName":"n1"}`, 400, "ConfigEP"},
		{"delete ep missing", "POST", "/plugin/deleteEndpoint", `{"TenantName":"default","NetworkName":"n1","EndpointID":"nope"}`, 404, "not found"},
		{"update ep bad event", "POST", "/plugin/updateEndpoint", `{"IPAddress":"10.1.1.2","Event":"boom"}`, 400, "Event"},
		{"release in use", "POST", "/plugin/releaseAddress", `{"NetworkID":"n1.default","IPv4Address":"10.1.1.2"}`, 409, "still used"},
		{"record huge netNS", "POST", "/plugin/recordEndpoint", `{"id":"n1.default-ep1","homingHost":"host1","netNS":"/proc/` + strings.Repeat("n", 900000) + `"}`, 400, "netNS"},
		{"record long portName", "POST", "/plugin/recordEndpoint", `{"id":"n1.default-ep1","homingHost":"host1","portName":"` + strings.Repeat("p", 300) + `"}`, 400, "portName"},
		{"record control character", "POST", "/plugin/recordEndpoint", `{"id":"n1.default-ep1","homingHost":"host1","tenant":"de\u0000fault"}`, 400, "tenant"},
		{"record of another host", "POST", "/plugin/recordEndpoint", `{"id":"n1.default-ep1","homingHost":"host2"}`, 403, "host1"},
		{"inspect endpoint missing", "GET", "/api/v1/inspect/endpoints/nothing-like-this/", ``, 404, "not found"},
	}
	for _, c := range cases {
		before, rev := e.snapshot()
		var body any
		if c.body != "" || c.method == "POST" {
			body = c.body
		}
		code, out := e.do(c.method, c.path, body)
		if code != c.code || !strings.Contains(out, c.msg) {
			t.Errorf("%s: got %d %q, want %d containing %q", c.name, code, out, c.code, c.msg)
		}
		if after, rev2 := e.snapshot(); after != before || rev2 != rev {
			t.Errorf("%s: etcd changed (revision %d → %d)", c.name, rev, rev2)
		}
	}
	// Plugin routes need Content-Type: application/json.
	resp, err := http.Post(e.srv.URL+"/plugin/allocAddress", "text/plain", bytes.NewReader([]byte(`{"NetworkID":"n1.default"}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("plugin without JSON content type: %d", resp.StatusCode)
	}
	// Errors are text/plain.
	resp, err = http.Get(e.srv.URL + "/api/v1/networks/default:zzz/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("error content type %q", ct)
	}
}

// TestContivErrorCompat: a client that does not ask for problem+json (Contiv's netctl and
// contivmodel client) gets Contiv's 500 with the message as text, the only status whose
// body those clients show; ours gets the real status as RFC 7807. Unknown paths stay 404
// and plugin routes keep their real status.
func TestContivErrorCompat(t *testing.T) {
	e := newEnv(t, "bridge")
	get := func(method, path, accept string, body string) (*http.Response, string) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, e.srv.URL+path, rd)
		req.Header.Set("Content-Type", "application/json")
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for _, c := range []struct {
		name, method, path, body string
		real                     int
		msg                      string
	}{
		{"delete missing", "DELETE", "/api/v1/networks/default:zzz/", "", 404, `network "default:zzz" not found`},
		{"get missing", "GET", "/api/v1/tenants/nope/", "", 404, "not found"},
		{"bad input", "POST", "/api/v1/tenants/t1/", `{"tenantName":`, 400, "malformed JSON"},
		{"conflict", "POST", "/api/v1/tenants/default/", `{"tenantName":"default"}`, 409, "can't be updated"},
	} {
		resp, body := get(c.method, c.path, "", c.body)
		if resp.StatusCode != 500 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !strings.Contains(body, c.msg) {
			t.Errorf("%s as Contiv's client: %d %s %q", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		resp, body = get(c.method, c.path, "application/json, "+ProblemJSON, c.body)
		var p Problem
		if err := json.Unmarshal([]byte(body), &p); err != nil || resp.StatusCode != c.real || p.Status != c.real ||
			resp.Header.Get("Content-Type") != ProblemJSON || !strings.Contains(p.Detail, c.msg) {
			t.Errorf("%s as our client: %d %q (%v)", c.name, resp.StatusCode, body, err)
		}
	}
	if resp, _ := get("GET", "/api/v1/nosuchcollection/", "", ""); resp.StatusCode != 404 {
		t.Errorf("unknown path: %d", resp.StatusCode)
	}
	if resp, _ := get("POST", "/plugin/deleteEndpoint", "", `{"TenantName":"default","NetworkName":"n","EndpointID":"x"}`); resp.StatusCode != 404 {
		t.Errorf("plugin route error: %d, want its real status", resp.StatusCode)
	}
}

// TestListFieldsBounded: every list an object stores whole is bounded (control plane
// issue, "every free-form field bounded"): before, 20,000 copies of a group name in an app
// profile, 20,000 external contracts groups on a group or 10,000 selectors on a service
// were accepted and stored, bounded only by the 1 MiB body. Past the bound a create is 400
// naming the field and writes nothing; at it, it is accepted.
func TestListFieldsBounded(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "n1", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.ok("POST", "/api/v1/policys/default:p/", `{"policyName":"p","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","policies":["p"],"tenantName":"default"}`, nil)
	list := func(n int, f func(i int) string) string {
		p := make([]string, n)
		for i := range p {
			p[i] = `"` + f(i) + `"`
		}
		return "[" + strings.Join(p, ",") + "]"
	}
	same := func(s string) func(int) string { return func(int) string { return s } }
	sel := func(i int) string { return fmt.Sprintf("k%d=v", i) }
	port := func(i int) string { return fmt.Sprintf("%d:80:TCP", 1+i) }
	cases := []struct{ name, path, body, field string }{
		{"group policies", "/api/v1/endpointGroups/default:g1/", `{"groupName":"g1","networkName":"n1","tenantName":"default","policies":` + list(maxListEntries+1, same("p")) + `}`, "policies"},
		{"group contracts groups", "/api/v1/endpointGroups/default:g1/", `{"groupName":"g1","networkName":"n1","tenantName":"default","extContractsGrps":` + list(maxListEntries+1, same("c")) + `}`, "extContractsGrps"},
		{"app profile groups", "/api/v1/appProfiles/default:a1/", `{"appProfileName":"a1","tenantName":"default","endpointGroups":` + list(maxListEntries+1, same("web")) + `}`, "endpointGroups"},
		{"service selectors", "/api/v1/serviceLBs/default:s1/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":` + list(maxLabels+1, sel) + `,"serviceName":"s1","tenantName":"default"}`, "selectors"},
		{"service selector key", "/api/v1/serviceLBs/default:s1/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["` + strings.Repeat("k", maxLabelKeyBytes+1) + `=v"],"serviceName":"s1","tenantName":"default"}`, "selectors"},
		{"service selector value", "/api/v1/serviceLBs/default:s1/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["k=` + strings.Repeat("v", maxLabelValBytes+1) + `"],"serviceName":"s1","tenantName":"default"}`, "selectors"},
		{"service ports", "/api/v1/serviceLBs/default:s1/", `{"networkName":"n1","ports":` + list(maxListEntries+1, port) + `,"selectors":["a=b"],"serviceName":"s1","tenantName":"default"}`, "ports"},
	}
	for _, c := range cases {
		before, rev := e.snapshot()
		code, out := e.do("POST", c.path, c.body)
		if code != 400 || !strings.Contains(out, c.field) {
			t.Errorf("%s: %d %.200s, want 400 naming %s", c.name, code, out, c.field)
		}
		if after, rev2 := e.snapshot(); after != before || rev2 != rev {
			t.Errorf("%s: etcd changed", c.name)
		}
	}
	e.ok("POST", "/api/v1/appProfiles/default:a1/", `{"appProfileName":"a1","tenantName":"default","endpointGroups":`+list(maxListEntries, same("web"))+`}`, nil)
	e.ok("POST", "/api/v1/serviceLBs/default:s1/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":`+list(maxLabels, sel)+`,"serviceName":"s1","tenantName":"default"}`, nil)
}
