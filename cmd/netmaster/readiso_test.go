package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// Read isolation fixture: every name of tenant B starts with "bravo", its addresses with
// "10.77.", and the host the test registers is "hostsecret" at 127.0.0.77 with a bgp
// router address in 192.0.2.0/24 and a deny list entry of 198.51.100.0/24 for it. None of
// these may reach tenant A's tenant-admin.
var bravoSecrets = []string{"bravo", "10.77.", "hostsecret", "127.0.0.77", "192.0.2.", "198.51.100."}

// tenantObjects creates tenant p+"tenant" with a network, a service network, a netprofile,
// a policy and its rule, an external contracts group, a group, an app profile, a service
// and one endpoint (an agent's createEndpoint, then its labels) that backs the service. It
// returns the keys of its objects and its service and endpoint ids (path variables).
func tenantObjects(t *testing.T, admin, agent *apiClient, url, p, net string) []string {
	t.Helper()
	tn := p + "tenant"
	post := func(coll, name, body string) string {
		t.Helper()
		key := tn + ":" + name
		if coll == "tenants" {
			key = tn
		}
		admin.must(t, "POST", url+"/api/v1/"+coll+"/"+key+"/", body, 200)
		return key
	}
	keys := []string{
		post("tenants", "", `{"tenantName":"`+tn+`"}`),
		post("networks", p+"net", `{"tenantName":"`+tn+`","networkName":"`+p+`net","encap":"vxlan","subnet":"`+net+`.5.0/24","gateway":"`+net+`.5.1"}`),
		post("networks", p+"svcnet", `{"tenantName":"`+tn+`","networkName":"`+p+`svcnet","encap":"vxlan","subnet":"`+net+`.9.0/24"}`),
		post("netprofiles", p+"prof", `{"DSCP":10,"bandwidth":"10mbps","burst":100,"profileName":"`+p+`prof","tenantName":"`+tn+`"}`),
		post("policys", p+"pol", `{"policyName":"`+p+`pol","tenantName":"`+tn+`"}`),
		post("extContractsGroups", p+"ext", `{"contracts":["uni/tn-common/brc-`+p+`"],"contractsGroupName":"`+p+`ext","contractsType":"provided","tenantName":"`+tn+`"}`),
		post("endpointGroups", p+"grp", `{"groupName":"`+p+`grp","networkName":"`+p+`net","policies":["`+p+`pol"],"netProfile":"`+p+`prof","extContractsGrps":["`+p+`ext"],"tenantName":"`+tn+`"}`),
		post("rules", p+"pol:1", `{"action":"allow","direction":"in","fromEndpointGroup":"`+p+`grp","policyName":"`+p+`pol","port":80,"priority":1,"protocol":"tcp","ruleId":"1","tenantName":"`+tn+`"}`),
		post("appProfiles", p+"app", `{"appProfileName":"`+p+`app","endpointGroups":["`+p+`grp"],"tenantName":"`+tn+`"}`),
		post("serviceLBs", p+"svc", `{"networkName":"`+p+`svcnet","ipAddress":"`+net+`.9.100","ports":["80:8080:TCP"],"selectors":["`+p+`label=`+p+`value"],"serviceName":"`+p+`svc","tenantName":"`+tn+`"}`),
	}
	req, _ := json.Marshal(model.CreateEndpointRequest{TenantName: tn, NetworkName: p + "net", ServiceName: p + "grp",
		EndpointID: p + "ep1", EPCommonName: p + "name",
		ConfigEP: model.ConfigEP{Container: p + "ctr1", Host: p + "host", ServiceName: p + "grp"}})
	st, out := agent.call(t, "POST", url+"/plugin/createEndpoint", string(req))
	var ep model.CreateEndpointResponse
	if st != 200 || json.Unmarshal([]byte(out), &ep) != nil {
		t.Fatalf("createEndpoint %s: %d %s", p, st, out)
	}
	upd, _ := json.Marshal(model.UpdateEndpointRequest{IPAddress: ep.EndpointConfig.IPAddress, ContainerID: p + "ctr1",
		Tenant: tn, Network: p + "net", Event: "start", EndpointID: p + "ep1", EPCommonName: p + "name",
		Labels: map[string]string{p + "label": p + "value"}})
	agent.must(t, "POST", url+"/plugin/updateEndpoint", string(upd), 200)
	return append(keys, model.ServiceID(p+"svc", tn), p+"ep1", p+"ctr1", p+"name", ep.EndpointConfig.ID)
}

// hostObjects registers a netplugin (with an inspect API) of host "hostsecret", a bgp
// object for it whose session reports tenant B's endpoint route, as an agent would, and a
// deny list entry for it (also named "hostsecret": the walk's global names reach it).
func hostObjects(t *testing.T, admin *apiClient, url, etcdURL string) {
	t.Helper()
	admin.must(t, "POST", url+"/api/v1/Bgps/hostsecret/", `{"hostname":"hostsecret","routerip":"192.0.2.5/24","as":"65001","neighbor-as":"65000","neighbor":"192.0.2.1"}`, 200)
	admin.must(t, "PUT", url+"/api/v1/prefilters/hostsecret/", `{"cidr":"198.51.100.0/24","host":"hostsecret"}`, 200)
	raw := rawEtcd(t, etcdURL)
	put := func(key string, v any) {
		b, _ := json.Marshal(v)
		if _, err := raw.Put(context.Background(), key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	put(model.BgpOperKey("hostsecret"), model.BgpOper{NumRoutes: 1, Routes: []string{"10.77.5.2/32"}, AdvertisedRoutes: []string{"10.77.5.2/32"}})
	for name, port := range map[string]int{cluster.ServiceNetplugin: 9002, cluster.ServiceInspect: 9090} {
		si := cluster.ServiceInfo{ServiceName: name, Role: "", HostAddr: "127.0.0.77", Port: port, Hostname: "hostsecret"}
		put(si.Key(), si)
	}
}

// walkedRequest is one request of the walk: a route with its variables substituted.
type walkedRequest struct {
	method, path string
	value        string // what the path variables were replaced with ("" none)
}

var pathVar = regexp.MustCompile(`\{[^}]+\}`)

// everyRoute lists a request per route netmaster serves (master.Routes, read from the
// API's router, and cluster.NodeRoutes, the node's own) and method, the path variables
// replaced with each of values; reads is true for GET only, false for every method the
// route takes (a route of any method is sent GET, POST, PUT and DELETE).
func everyRoute(t *testing.T, values []string, reads bool) []walkedRequest {
	t.Helper()
	rts, err := master.Routes()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cluster.NodeRoutes() {
		method, path, _ := strings.Cut(p, " ")
		rts = append(rts, master.Route{Path: path, Methods: []string{method}})
	}
	var out []walkedRequest
	for _, rt := range rts {
		methods := rt.Methods
		if len(methods) == 0 {
			methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete}
		}
		subst := []string{""}
		if pathVar.MatchString(rt.Path) {
			subst = values
		}
		for _, m := range methods {
			if reads && m != http.MethodGet {
				continue
			}
			for _, v := range subst {
				out = append(out, walkedRequest{method: m, path: pathVar.ReplaceAllLiteralString(rt.Path, v), value: v})
			}
		}
	}
	return out
}

// leaked returns the first of secrets in an answer to rq, leaving out what the request
// itself said (its path and variable, which refusals and 404s quote back).
func leaked(rq walkedRequest, body string) string {
	body = strings.ReplaceAll(body, rq.path, "")
	if rq.value != "" {
		body = strings.ReplaceAll(body, rq.value, "")
	}
	for _, s := range bravoSecrets {
		if strings.Contains(body, s) {
			return s
		}
	}
	return ""
}

// TestReadIsolation (issue 34, item 4) runs two netmasters with tokens, over TLS and with
// --insecure (plain HTTP: the roles hold there too), creates two tenants with networks,
// groups, policies, rules, services, endpoints and the rest, a host with a bgp session and
// a deny list entry, and walks every route netmaster serves (from its routers, so a route
// added later is walked too) as tenant A's tenant-admin, through the leader and the
// follower, with the path variables set to each of tenant B's object names and ids, the
// global objects' and A's own (GET only). No answer may hold a name, address or id of tenant B or the host, none
// is a 5xx, and etcd does not change. An admin's walk of the same GETs must show every one
// of those secrets (so the check can see them), and A still reads its own service with its
// backend.
func TestReadIsolation(t *testing.T) {
	for _, mode := range envModes {
		t.Run(mode.name, func(t *testing.T) { readIsolation(t, mode.new) })
	}
}

func readIsolation(t *testing.T, newEnv func(*testing.T, string) *secureEnv) {
	const tA = "alpha-admin-token-0123456789"
	sec := newEnv(t, fmt.Sprintf("%s admin alice\n%s agent hostsecret\n%s read-only scraper\n%s tenant-admin:alphatenant alphaadmin\n%s netmaster peers\n",
		tAdmin, tAgent, tRO, tA, tPeer))
	etcdURL := statetest.Etcd(t)
	ps := sec.start(t, etcdURL, "nm-a", "nm-b")
	admin, agent, ro, alpha := sec.client(t, tAdmin), sec.client(t, tAgent), sec.client(t, tRO), sec.client(t, tA)
	leader, follower := secureLeader(t, admin, ps)

	own := tenantObjects(t, admin, agent, leader.url, "alpha", "10.66")
	bravo := tenantObjects(t, admin, agent, leader.url, "bravo", "10.77")
	hostObjects(t, admin, leader.url, etcdURL)
	globals := []string{"global", "aciGw", "hostsecret", "default"}

	// Tenant A: every method of every route with B's and the global names, GETs with its own.
	walk := everyRoute(t, append(bravo, globals...), false)
	walk = append(walk, everyRoute(t, own, true)...)
	raw := rawEtcd(t, etcdURL)
	before := revision(t, raw)
	for _, via := range []*proc{leader, follower} {
		for _, rq := range walk {
			body := ""
			if rq.method == http.MethodPost || rq.method == http.MethodPut {
				body = "{}"
			}
			st, out := alpha.call(t, rq.method, via.url+rq.path, body)
			if st >= 500 || st < 0 {
				t.Errorf("tenant A %s %s via %s: %d %q, want no 5xx", rq.method, rq.path, via.name, st, out)
			}
			if s := leaked(rq, out); s != "" {
				t.Errorf("tenant A %s %s via %s: %d, the answer holds %q: %s", rq.method, rq.path, via.name, st, s, out)
			}
		}
	}
	if after := revision(t, raw); after != before {
		t.Errorf("tenant A's walk changed etcd (revision %d → %d)", before, after)
	}
	t.Logf("walked %d requests as tenant A through each netmaster", len(walk))

	// The admin's walk sees every secret: the check above could have seen them.
	seen := map[string]bool{}
	for _, rq := range everyRoute(t, append(append(bravo, globals...), own...), true) {
		_, out := admin.call(t, rq.method, leader.url+rq.path, "")
		for _, s := range bravoSecrets {
			seen[s] = seen[s] || strings.Contains(out, s)
		}
	}
	for _, s := range bravoSecrets {
		if !seen[s] {
			t.Errorf("no answer to the admin holds %q: the walk cannot tell a leak of it", s)
		}
	}

	// Host and cluster routes: admins, operators and agents only; A reads its own service.
	for _, path := range []string{"/info", "/agents", "/metrics"} {
		for _, c := range []*apiClient{admin, agent, ro} {
			c.must(t, "GET", follower.url+path, "", 200)
		}
		alpha.must(t, "GET", follower.url+path, "", 403)
	}
	if _, out := ro.call(t, "GET", leader.url+"/metrics", ""); !strings.Contains(out, `network="bravonet.bravotenant"`) {
		t.Errorf("a read-only scraper's /metrics lacks the per-network series")
	}
	alpha.must(t, "GET", leader.url+"/service/"+model.ServiceID("bravosvc", "bravotenant"), "", 403)
	st, out := alpha.call(t, "GET", follower.url+"/service/"+model.ServiceID("alphasvc", "alphatenant"), "")
	if st != 200 || !strings.Contains(out, "alphalabel") || !strings.Contains(out, "10.66.9.100") {
		t.Errorf("tenant A's own service: %d %s, want its VIP and backend", st, out)
	}
	if _, out := alpha.call(t, "GET", leader.url+"/services", ""); !strings.Contains(out, "alphasvc") {
		t.Errorf("tenant A's /services lacks its own service: %s", out)
	}
}
