package master

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// links builds a link-set as an earlier build stored it: objType links for keys (nil for
// none).
func links(objType string, keys ...string) map[string]model.Link {
	if len(keys) == 0 {
		return nil
	}
	out := map[string]model.Link{}
	for _, k := range keys {
		out[k] = model.Link{ObjType: objType, ObjKey: k}
	}
	return out
}

// sameJSON fails unless got and want marshal alike.
func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(g) != string(w) {
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// linkViews reads object key of coll as the single GET, the collection GET and inspect's
// Config show it, decoded as T each.
func linkViews[T any](e *env, coll, key string) map[string]*T {
	e.t.Helper()
	out := map[string]*T{}
	var one T
	e.ok("GET", "/api/v1/"+coll+"/"+key+"/", nil, &one)
	out["GET one"] = &one
	var list []json.RawMessage
	e.ok("GET", "/api/v1/"+coll+"/", nil, &list)
	for _, raw := range list {
		var k struct{ Key string }
		if json.Unmarshal(raw, &k) == nil && k.Key == key {
			var v T
			if err := json.Unmarshal(raw, &v); err != nil {
				e.t.Fatal(err)
			}
			out["GET list"] = &v
		}
	}
	if out["GET list"] == nil {
		e.t.Fatalf("%s: %s not in the list", coll, key)
	}
	var insp struct{ Config *T }
	e.ok("GET", "/api/v1/inspect/"+coll+"/"+key+"/", nil, &insp)
	out["inspect"] = insp.Config
	return out
}

// wantLinks is what an earlier build's records held, by object, for the derived link-sets.
type wantLinks struct {
	tenants  map[string]model.TenantLinkSets
	networks map[string]model.NetworkLinkSets
	groups   map[string]map[string]model.Link // MatchRules
	policies map[string]model.PolicyLinkSets
	profiles map[string]map[string]model.Link // netprofile EndpointGroups
}

// checkLinks compares every view of every object in w with it and, when stored, checks
// that the stored records hold none of the derived link-sets.
func (e *env) checkLinks(stage string, w wantLinks, stored bool) {
	e.t.Helper()
	checkViews(e, stage, model.CollTenants, model.TypeTenant, w.tenants, func(t *model.Tenant) any { return t.LinkSets }, stored)
	checkViews(e, stage, model.CollNetworks, model.TypeNetwork, w.networks, func(n *model.Network) any { return n.LinkSets }, stored)
	checkViews(e, stage, model.CollEndpointGroups, model.TypeEndpointGroup, w.groups,
		func(g *model.EndpointGroup) any { return g.LinkSets.MatchRules }, stored)
	checkViews(e, stage, model.CollPolicies, model.TypePolicy, w.policies, func(p *model.Policy) any { return p.LinkSets }, stored)
	checkViews(e, stage, model.CollNetprofiles, model.TypeNetprofile, w.profiles,
		func(p *model.Netprofile) any { return p.LinkSets.EndpointGroups }, stored)
}

// checkViews compares what pick takes of each object of want, in every view, with want's.
func checkViews[T, W any](e *env, stage, coll, objType string, want map[string]W, pick func(*T) any, stored bool) {
	e.t.Helper()
	for k, w := range want {
		for view, got := range linkViews[T](e, coll, k) {
			sameJSON(e.t, fmt.Sprintf("%s: %s %s link-sets, %s", stage, objType, k, view), pick(got), w)
		}
		if stored {
			e.storedWithout(objType, k)
		}
	}
}

// storedWithout fails unless the record of objType key holds none of the derived
// link-sets (docs/api.md, "Semantics").
func (e *env) storedWithout(objType, key string) {
	e.t.Helper()
	raw := e.rawGet(model.ModelKey(objType, key))
	for _, f := range []string{`"Networks"`, `"Policies":{"`, `"AppProfiles"`, `"NetProfiles"`, `"Servicelbs"`, `"Rules"`, `"MatchRules"`} {
		if objType == model.TypeEndpointGroup && f == `"Policies":{"` {
			continue // (a group's own policies: stored, as before)
		}
		if strings.Contains(raw, f) {
			e.t.Errorf("%s %s stored with a derived link-set %s: %s", objType, key, f, raw)
		}
	}
	if objType != model.TypeEndpointGroup && strings.Contains(raw, `"EndpointGroups":{"`) {
		e.t.Errorf("%s %s stored with a derived link-set EndpointGroups: %s", objType, key, raw)
	}
}

// TestLinkSetsDerivedAsBefore: the link-sets netmaster no longer stores read, in GET of one
// object, GET of its collection and inspect's Config, exactly as an earlier build stored
// them (the expected maps below are what its add/remove calls left), through creates,
// updates, a group deleted and made again under its rules, a service moved, and deletes;
// tenants whose names extend another's ("t1" and "t1.x") keep theirs apart. (The same
// scenario's every answer, 245 of them, was compared byte for byte with the ct-window build.)
func TestLinkSetsDerivedAsBefore(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tn := range []string{"t1", "t1.x", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`","link-sets":{}}`, nil)
	}
	e.net("t1", "n1", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.net("t1", "n2", "vxlan", "10.1.2.0/24", "10.1.2.1", 0)
	e.net("t1.x", "n1", "vxlan", "10.1.1.0/24", "", 0)
	e.net("t2", "m", "vlan", "10.3.1.0/24", "", 0)
	e.ok("POST", "/api/v1/netprofiles/t1:np/", `{"bandwidth":"10mbps","burst":100,"profileName":"np","tenantName":"t1"}`, nil)
	for _, p := range []string{"t1:p1", "t1:p2", "t1.x:p1"} {
		tn, name, _ := strings.Cut(p, ":")
		e.ok("POST", "/api/v1/policys/"+p+"/", `{"policyName":"`+name+`","tenantName":"`+tn+`"}`, nil)
	}
	e.ok("POST", "/api/v1/endpointGroups/t1:g1/", `{"groupName":"g1","networkName":"n1","policies":["p1"],"tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:g2/", `{"groupName":"g2","networkName":"n2","policies":["p1","p2"],"netProfile":"np","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1.x:g1/", `{"groupName":"g1","networkName":"n1","policies":["p1"],"tenantName":"t1.x"}`, nil)
	e.ok("POST", "/api/v1/rules/t1:p1:1/", `{"action":"allow","direction":"in","fromEndpointGroup":"g2","policyName":"p1","ruleId":"1","tenantName":"t1","protocol":"tcp","port":80}`, nil)
	e.ok("POST", "/api/v1/rules/t1:p1:2/", `{"action":"allow","direction":"out","toEndpointGroup":"g1","policyName":"p1","ruleId":"2","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/rules/t1:p2:1/", `{"action":"deny","direction":"in","fromIpAddress":"10.9.0.0/16","policyName":"p2","ruleId":"1","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/rules/t1:p2:2/", `{"action":"allow","direction":"in","fromNetwork":"n1","policyName":"p2","ruleId":"2","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/rules/t1.x:p1:1/", `{"action":"allow","direction":"in","fromEndpointGroup":"g1","policyName":"p1","ruleId":"1","tenantName":"t1.x"}`, nil)
	e.ok("POST", "/api/v1/appProfiles/t1:a1/", `{"appProfileName":"a1","endpointGroups":["g1"],"tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/serviceLBs/t1:s1/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"s1","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/serviceLBs/t1:s2/", `{"networkName":"n2","ports":["80:8080:TCP"],"selectors":["app=db"],"serviceName":"s2","tenantName":"t1"}`, nil)

	e.checkLinks("filled", wantLinks{
		tenants: map[string]model.TenantLinkSets{
			"t1": {AppProfiles: links(model.TypeAppProfile, "t1:a1"), EndpointGroups: links(model.TypeEndpointGroup, "t1:g1", "t1:g2"),
				NetProfiles: links(model.TypeNetprofile, "t1:np"), Networks: links(model.TypeNetwork, "t1:n1", "t1:n2"),
				Policies: links(model.TypePolicy, "t1:p1", "t1:p2"), Servicelbs: links(model.TypeServiceLB, "t1:s1", "t1:s2")},
			"t1.x": {EndpointGroups: links(model.TypeEndpointGroup, "t1.x:g1"), Networks: links(model.TypeNetwork, "t1.x:n1"),
				Policies: links(model.TypePolicy, "t1.x:p1")},
			"t2":      {Networks: links(model.TypeNetwork, "t2:m")},
			"default": {},
		},
		networks: map[string]model.NetworkLinkSets{
			"t1:n1":   {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), Servicelbs: links(model.TypeServiceLB, "t1:s1")},
			"t1:n2":   {EndpointGroups: links(model.TypeEndpointGroup, "t1:g2"), Servicelbs: links(model.TypeServiceLB, "t1:s2")},
			"t1.x:n1": {EndpointGroups: links(model.TypeEndpointGroup, "t1.x:g1")},
			"t2:m":    {},
		},
		groups: map[string]map[string]model.Link{
			"t1:g1":   links(model.TypeRule, "t1:p1:2"),
			"t1:g2":   links(model.TypeRule, "t1:p1:1"),
			"t1.x:g1": links(model.TypeRule, "t1.x:p1:1"),
		},
		policies: map[string]model.PolicyLinkSets{
			"t1:p1":   {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1", "t1:g2"), Rules: links(model.TypeRule, "t1:p1:1", "t1:p1:2")},
			"t1:p2":   {EndpointGroups: links(model.TypeEndpointGroup, "t1:g2"), Rules: links(model.TypeRule, "t1:p2:1", "t1:p2:2")},
			"t1.x:p1": {EndpointGroups: links(model.TypeEndpointGroup, "t1.x:g1"), Rules: links(model.TypeRule, "t1.x:p1:1")},
		},
		profiles: map[string]map[string]model.Link{"t1:np": links(model.TypeEndpointGroup, "t1:g2")},
	}, true)

	// Changes: a rule goes, a group takes another policy and the netprofile, the netprofile
	// changes (its groups' states follow), a group is deleted under the rule that names it
	// and made again (it starts with no MatchRules, as before), a service moves.
	e.ok("DELETE", "/api/v1/rules/t1:p1:2/", nil, nil)
	var upd model.EndpointGroup
	e.ok("POST", "/api/v1/endpointGroups/t1:g1/", `{"groupName":"g1","networkName":"n1","policies":["p1","p2"],"netProfile":"np","tenantName":"t1"}`, &upd)
	sameJSON(t, "update answer's policies link-set", upd.LinkSets.Policies, links(model.TypePolicy, "t1:p1", "t1:p2"))
	e.ok("POST", "/api/v1/netprofiles/t1:np/", `{"bandwidth":"20mbps","burst":100,"profileName":"np","tenantName":"t1"}`, nil)
	for _, g := range []string{"g1", "g2"} {
		var st model.EndpointGroupState
		if err := json.Unmarshal([]byte(e.rawGet(model.EPGStateKey(model.EPGStateID(g, "t1")))), &st); err != nil {
			t.Fatal(err)
		}
		if st.Bandwidth != "20mbps" {
			t.Errorf("group %s's state after the netprofile change: bandwidth %q", g, st.Bandwidth)
		}
	}
	e.ok("DELETE", "/api/v1/endpointGroups/t1:g2/", nil, nil)
	var again model.EndpointGroup
	e.ok("POST", "/api/v1/endpointGroups/t1:g2/", `{"groupName":"g2","networkName":"n2","policies":["p2"],"tenantName":"t1"}`, &again)
	if again.LinkSets.MatchRules != nil {
		t.Errorf("group made again under rule t1:p1:1: create answer's MatchRules %v", again.LinkSets.MatchRules)
	}
	e.ok("POST", "/api/v1/rules/t1:p1:3/", `{"action":"allow","direction":"in","fromEndpointGroup":"g2","policyName":"p1","ruleId":"3","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/serviceLBs/t1:s1/", `{"networkName":"n2","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"s1","tenantName":"t1"}`, nil)
	e.ok("DELETE", "/api/v1/serviceLBs/t1:s2/", nil, nil)
	var pupd model.Policy
	e.ok("POST", "/api/v1/policys/t1:p1/", `{"policyName":"p1","tenantName":"t1"}`, &pupd)
	sameJSON(t, "policy update answer's link-sets", pupd.LinkSets, model.PolicyLinkSets{
		EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), Rules: links(model.TypeRule, "t1:p1:1", "t1:p1:3")})
	e.checkLinks("changed", wantLinks{
		tenants: map[string]model.TenantLinkSets{
			"t1": {AppProfiles: links(model.TypeAppProfile, "t1:a1"), EndpointGroups: links(model.TypeEndpointGroup, "t1:g1", "t1:g2"),
				NetProfiles: links(model.TypeNetprofile, "t1:np"), Networks: links(model.TypeNetwork, "t1:n1", "t1:n2"),
				Policies: links(model.TypePolicy, "t1:p1", "t1:p2"), Servicelbs: links(model.TypeServiceLB, "t1:s1")},
		},
		networks: map[string]model.NetworkLinkSets{
			"t1:n1": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1")},
			"t1:n2": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g2"), Servicelbs: links(model.TypeServiceLB, "t1:s1")},
		},
		groups: map[string]map[string]model.Link{
			"t1:g1": nil,
			"t1:g2": links(model.TypeRule, "t1:p1:3"), // (not t1:p1:1: made before the group was)
		},
		policies: map[string]model.PolicyLinkSets{
			"t1:p1": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), Rules: links(model.TypeRule, "t1:p1:1", "t1:p1:3")},
			"t1:p2": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1", "t1:g2"), Rules: links(model.TypeRule, "t1:p2:1", "t1:p2:2")},
		},
		profiles: map[string]map[string]model.Link{"t1:np": links(model.TypeEndpointGroup, "t1:g1")},
	}, true)

	// Deletes empty them again; a netprofile in use and a network with a group are refused.
	if code, _ := e.do("DELETE", "/api/v1/netprofiles/t1:np/", nil); code != 409 {
		t.Errorf("netprofile in use deleted: %d", code)
	}
	if code, _ := e.do("DELETE", "/api/v1/networks/t1:n1/", nil); code != 409 {
		t.Errorf("network with a group deleted: %d", code)
	}
	e.ok("DELETE", "/api/v1/appProfiles/t1:a1/", nil, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:g1/", `{"groupName":"g1","networkName":"n1","policies":[],"tenantName":"t1"}`, nil)
	e.ok("DELETE", "/api/v1/policys/t1:p1/", nil, nil)
	for _, k := range []string{"endpointGroups/t1:g2", "serviceLBs/t1:s1", "networks/t1:n2", "endpointGroups/t1:g1"} {
		e.ok("DELETE", "/api/v1/"+k+"/", nil, nil)
	}
	e.ok("POST", "/api/v1/policys/t1:p1/", `{"policyName":"p1","tenantName":"t1"}`, nil)
	e.checkLinks("emptied", wantLinks{
		tenants: map[string]model.TenantLinkSets{"t1": {NetProfiles: links(model.TypeNetprofile, "t1:np"),
			Networks: links(model.TypeNetwork, "t1:n1"), Policies: links(model.TypePolicy, "t1:p1", "t1:p2")}},
		networks: map[string]model.NetworkLinkSets{"t1:n1": {}},
		policies: map[string]model.PolicyLinkSets{"t1:p1": {}, "t1:p2": {Rules: links(model.TypeRule, "t1:p2:1", "t1:p2:2")}},
		profiles: map[string]map[string]model.Link{"t1:np": nil},
	}, true)
	e.ok("DELETE", "/api/v1/netprofiles/t1:np/", nil, nil)
	for _, tn := range []string{"t1", "t1.x", "t2"} {
		e.checkBooks(tn)
	}
}

// keyClass is the class of key for byte counts: its first segments after /contiv.io/
// ("obj/modeldb/tenant", "state/subnetidx", ...).
func keyClass(key string) string {
	parts := strings.SplitN(strings.TrimPrefix(key, "/contiv.io/"), "/", 4)
	n := 3
	if parts[0] != "obj" {
		n = 2
	}
	return strings.Join(parts[:min(len(parts), n)], "/")
}

// putBytesPer reads etcd's history once and sums, for each change i whose revisions were
// (revs[i], revs[i+1]], the bytes of its puts by key class.
func putBytesPer(t *testing.T, raw *clientv3.Client, revs []int64) []map[string]int {
	t.Helper()
	puts, err := statetest.Puts(context.Background(), raw, "/contiv.io/", revs[0], revs[len(revs)-1])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]int, len(revs)-1)
	for i := range out {
		out[i] = map[string]int{}
	}
	i := 0
	for _, p := range puts {
		for p.Rev > revs[i+1] {
			i++
		}
		out[i][keyClass(p.Key)] += p.Bytes
	}
	return out
}

// TestCreateBytesDoNotGrowWithTenant: what one create writes to etcd (its revisions in the
// watch history) does not grow with the number of objects its tenant, policy or group
// already has: the n-th network, group, policy, netprofile, app profile, service and rule
// costs what the first did, and the tenant, policy and group records keep their size.
// Before, each create rewrote the tenant's link-sets (and a rule its policy's and group's):
// the 200th policy wrote ~12 KB, the 300th rule ~26 KB.
func TestCreateBytesDoNotGrowWithTenant(t *testing.T) {
	const n, window = 200, 20
	e := newEnv(t, "bridge")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	e.net("t1", "base", "vxlan", "10.200.0.0/16", "", 0)
	e.ok("POST", "/api/v1/policys/t1:rules/", `{"policyName":"rules","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:named/", `{"groupName":"named","networkName":"base","policies":["rules"],"tenantName":"t1"}`, nil)
	sizes := func() map[string]int {
		return map[string]int{"tenant": len(e.rawGet(model.ModelKey(model.TypeTenant, "t1"))),
			"policy": len(e.rawGet(model.ModelKey(model.TypePolicy, "t1:rules"))),
			"group":  len(e.rawGet(model.ModelKey(model.TypeEndpointGroup, "t1:named"))),
			"net":    len(e.rawGet(model.ModelKey(model.TypeNetwork, "t1:base")))}
	}
	before := sizes()
	kinds := []struct {
		name string
		post func(i int)
	}{
		{"network", func(i int) {
			e.net("t1", fmt.Sprintf("n%d", i), "vxlan", fmt.Sprintf("10.%d.%d.0/24", 1+i/250, i%250), "", 0)
		}},
		{"group", func(i int) {
			e.ok("POST", fmt.Sprintf("/api/v1/endpointGroups/t1:g%d/", i), fmt.Sprintf(`{"groupName":"g%d","networkName":"base","tenantName":"t1"}`, i), nil)
		}},
		{"policy", func(i int) {
			e.ok("POST", fmt.Sprintf("/api/v1/policys/t1:p%d/", i), fmt.Sprintf(`{"policyName":"p%d","tenantName":"t1"}`, i), nil)
		}},
		{"netprofile", func(i int) {
			e.ok("POST", fmt.Sprintf("/api/v1/netprofiles/t1:np%d/", i), fmt.Sprintf(`{"bandwidth":"10mbps","burst":100,"profileName":"np%d","tenantName":"t1"}`, i), nil)
		}},
		{"appProfile", func(i int) {
			e.ok("POST", fmt.Sprintf("/api/v1/appProfiles/t1:a%d/", i), fmt.Sprintf(`{"appProfileName":"a%d","endpointGroups":["g%d"],"tenantName":"t1"}`, i, i), nil)
		}},
		{"service", func(i int) {
			e.ok("POST", fmt.Sprintf("/api/v1/serviceLBs/t1:s%d/", i), fmt.Sprintf(`{"networkName":"base","ports":["80:8080:TCP"],"selectors":["app=s%d"],"serviceName":"s%d","tenantName":"t1"}`, i, i), nil)
		}},
		{"rule", func(i int) { // (every rule names the group the policy is attached to)
			e.ok("POST", fmt.Sprintf("/api/v1/rules/t1:rules:%d/", i), fmt.Sprintf(
				`{"action":"allow","direction":"in","fromEndpointGroup":"named","policyName":"rules","ruleId":"%d","tenantName":"t1","protocol":"tcp","port":%d}`, i, 1000+i), nil)
		}},
	}
	for _, k := range kinds {
		revs := []int64{e.rev()}
		for i := 0; i < n; i++ {
			k.post(i)
			revs = append(revs, e.rev())
		}
		per := putBytesPer(t, e.raw, revs)
		first, last := map[string]int{}, map[string]int{}
		for i, b := range per {
			if i < window {
				first = sumClasses(first, b)
			} else if i >= n-window {
				last = sumClasses(last, b)
			}
		}
		// (The subnet index counts too: a record per network.)
		f, l := total(first)/window, total(last)/window
		t.Logf("%-10s bytes per create: first %d: %d, last %d: %d (last by key: %v)",
			k.name, window, f, window, l, perCreate(last, window))
		if l > f+64 { // (the usage record's numbers grow a digit or two)
			t.Errorf("%s: a create writes %d bytes after %d of them, %d at first", k.name, l, n-window, f)
		}
	}
	after := sizes()
	for rec, b := range before {
		if after[rec] != b {
			t.Errorf("%s record grew from %d to %d bytes while its tenant filled", rec, b, after[rec])
		}
	}
}

func sumClasses(into, b map[string]int) map[string]int {
	if into == nil {
		into = map[string]int{}
	}
	for k, v := range b {
		into[k] += v
	}
	return into
}

func total(m map[string]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

func perCreate(m map[string]int, n int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v / n
	}
	return out
}

// TestLegacyLinkSets: records an earlier build wrote, with full link-sets (some of them
// stale: links to objects gone), read with the derived link-sets only; creates and deletes
// neither read-modify-write nor break on them; the next start stores them without the
// derived link-sets, once (a second start writes nothing), and the tenant's books stay
// exact throughout.
func TestLegacyLinkSets(t *testing.T) {
	store, url := statetest.Store(t)
	e := newEnvOn(t, store, url, "bridge")
	ctx := context.Background()
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	e.net("t1", "n1", "vxlan", "10.1.1.0/24", "", 0)
	e.ok("POST", "/api/v1/netprofiles/t1:np/", `{"bandwidth":"10mbps","profileName":"np","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/policys/t1:p1/", `{"policyName":"p1","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:g1/", `{"groupName":"g1","networkName":"n1","policies":["p1"],"netProfile":"np","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/rules/t1:p1:1/", `{"action":"allow","direction":"in","fromEndpointGroup":"g1","policyName":"p1","ruleId":"1","tenantName":"t1"}`, nil)

	// As an earlier build stored them, plus links to objects that are gone (an earlier
	// build's bug, or Contiv's): derived values win.
	legacy := map[string]any{
		model.ModelKey(model.TypeTenant, "t1"): model.Tenant{Key: "t1", TenantName: "t1", LinkSets: model.TenantLinkSets{
			Networks: links(model.TypeNetwork, "t1:n1", "t1:gone"), EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"),
			Policies: links(model.TypePolicy, "t1:p1", "t1:p9"), NetProfiles: links(model.TypeNetprofile, "t1:np"),
			Servicelbs: links(model.TypeServiceLB, "t1:s9")}},
		model.ModelKey(model.TypePolicy, "t1:p1"): model.Policy{Key: "t1:p1", PolicyName: "p1", TenantName: "t1",
			LinkSets: model.PolicyLinkSets{EndpointGroups: links(model.TypeEndpointGroup, "t1:g1", "t1:g9"), Rules: links(model.TypeRule, "t1:p1:1", "t1:p1:9")},
			Links:    model.PolicyLinks{Tenant: model.Link{ObjType: model.TypeTenant, ObjKey: "t1"}}},
		model.ModelKey(model.TypeNetwork, "t1:n1"):       nil, // (read and rewritten below)
		model.ModelKey(model.TypeNetprofile, "t1:np"):    nil,
		model.ModelKey(model.TypeEndpointGroup, "t1:g1"): nil,
	}
	var n model.Network
	e.ok("GET", "/api/v1/networks/t1:n1/", nil, &n)
	n.LinkSets.Servicelbs = links(model.TypeServiceLB, "t1:s9")
	legacy[model.ModelKey(model.TypeNetwork, "t1:n1")] = n
	var np model.Netprofile
	e.ok("GET", "/api/v1/netprofiles/t1:np/", nil, &np)
	np.LinkSets.EndpointGroups = links(model.TypeEndpointGroup, "t1:g1", "t1:g9")
	legacy[model.ModelKey(model.TypeNetprofile, "t1:np")] = np
	var g model.EndpointGroup
	e.ok("GET", "/api/v1/endpointGroups/t1:g1/", nil, &g)
	g.LinkSets.MatchRules = links(model.TypeRule, "t1:p1:1", "t1:p1:9")
	legacy[model.ModelKey(model.TypeEndpointGroup, "t1:g1")] = g
	err := e.m.update(withoutQuota(ctx), func(tx *state.Tx) error { // (booked, as an earlier build's writes were)
		for k, v := range legacy {
			if err := tx.Put(k, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.checkBooks("t1")
	want := wantLinks{
		tenants: map[string]model.TenantLinkSets{"t1": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"),
			NetProfiles: links(model.TypeNetprofile, "t1:np"), Networks: links(model.TypeNetwork, "t1:n1"), Policies: links(model.TypePolicy, "t1:p1")}},
		networks: map[string]model.NetworkLinkSets{"t1:n1": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1")}},
		groups:   map[string]map[string]model.Link{"t1:g1": links(model.TypeRule, "t1:p1:1")},
		policies: map[string]model.PolicyLinkSets{"t1:p1": {EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), Rules: links(model.TypeRule, "t1:p1:1")}},
		profiles: map[string]map[string]model.Link{"t1:np": links(model.TypeEndpointGroup, "t1:g1")},
	}
	e.checkLinks("legacy records", want, false)

	// Creates and deletes leave the legacy records alone (no read-modify-write) and work.
	modRev := func(key string) int64 {
		t.Helper()
		resp, err := e.raw.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %v %v", key, resp, err)
		}
		return resp.Kvs[0].ModRevision
	}
	revs := map[string]int64{}
	for k := range legacy {
		revs[k] = modRev(k)
	}
	e.net("t1", "n2", "vxlan", "10.1.2.0/24", "", 0)
	e.ok("POST", "/api/v1/policys/t1:p2/", `{"policyName":"p2","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/rules/t1:p1:2/", `{"action":"allow","direction":"out","toEndpointGroup":"g1","policyName":"p1","ruleId":"2","tenantName":"t1"}`, nil)
	e.ok("DELETE", "/api/v1/rules/t1:p1:1/", nil, nil)
	e.ok("POST", "/api/v1/serviceLBs/t1:s1/", `{"networkName":"n1","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"s1","tenantName":"t1"}`, nil)
	e.ok("DELETE", "/api/v1/policys/t1:p2/", nil, nil)
	e.ok("DELETE", "/api/v1/networks/t1:n2/", nil, nil)
	for k, r := range revs {
		if got := modRev(k); got != r {
			t.Errorf("%s rewritten by a create or delete of another object", k)
		}
	}
	want.tenants["t1"] = model.TenantLinkSets{EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), NetProfiles: links(model.TypeNetprofile, "t1:np"),
		Networks: links(model.TypeNetwork, "t1:n1"), Policies: links(model.TypePolicy, "t1:p1"), Servicelbs: links(model.TypeServiceLB, "t1:s1")}
	want.networks["t1:n1"] = model.NetworkLinkSets{EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), Servicelbs: links(model.TypeServiceLB, "t1:s1")}
	want.groups["t1:g1"] = links(model.TypeRule, "t1:p1:2")
	want.policies["t1:p1"] = model.PolicyLinkSets{EndpointGroups: links(model.TypeEndpointGroup, "t1:g1"), Rules: links(model.TypeRule, "t1:p1:2")}
	e.checkLinks("after creates and deletes", want, false)
	e.checkBooks("t1")

	// The next start stores them without the derived link-sets; the one after writes nothing.
	e2 := newEnvOn(t, store, url, "bridge")
	e2.checkLinks("after a restart", want, true)
	e2.checkBooks("t1")
	snap, rev := e2.snapshot()
	e3 := newEnvOn(t, store, url, "bridge")
	if snap2, rev2 := e3.snapshot(); snap2 != snap || rev2 != rev {
		t.Errorf("a second start rewrote records")
	}
}
