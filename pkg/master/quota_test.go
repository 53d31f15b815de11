package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func withQuota(q map[string]int64) func(*Config) { return func(c *Config) { c.Quota = q } }

// usage reads tenant's usage through the API.
func (e *env) usage(tenant string) map[string]int64 {
	e.t.Helper()
	var q model.TenantQuota
	e.ok("GET", "/api/v1/quotas/"+tenant+"/", nil, &q)
	return q.Usage
}

// checkBooks fails unless tenant's usage record holds exactly what a recount finds, and its
// bytes what the tenant's records under /contiv.io/ weigh (by key pattern).
func (e *env) checkBooks(tenant string) map[string]int64 {
	e.t.Helper()
	var booked *model.TenantUsage
	var recount *model.TenantUsage
	err := e.m.read(context.Background(), func(tx *state.Tx) error {
		var err error
		if booked, _, err = getT[model.TenantUsage](tx, model.QuotaUsageKey(tenant)); err != nil {
			return err
		}
		recount, err = recountTenant(tx, tenant)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if booked == nil {
		booked = &model.TenantUsage{Usage: zeroUsage()}
	}
	for _, k := range model.QuotaKinds() {
		if booked.Usage[k] != recount.Usage[k] {
			e.t.Fatalf("tenant %s: booked usage %v, a recount finds %v", tenant, booked.Usage, recount.Usage)
		}
	}
	if b := e.ownedBytes(tenant); b != booked.Usage[model.QuotaBytes] {
		e.t.Fatalf("tenant %s: booked %d bytes, its records weigh %d", tenant, booked.Usage[model.QuotaBytes], b)
	}
	return booked.Usage
}

// ownedBytes weighs tenant's records in etcd by their key patterns (its networks' ids
// found from the network records' tenant).
func (e *env) ownedBytes(tenant string) int64 {
	e.t.Helper()
	resp, err := e.raw.Get(context.Background(), "/contiv.io/", clientv3.WithPrefix())
	if err != nil {
		e.t.Fatal(err)
	}
	var nets []string
	for _, kv := range resp.Kvs {
		var ns model.CfgNetworkState
		if strings.HasPrefix(string(kv.Key), model.NetStatePrefix) && json.Unmarshal(kv.Value, &ns) == nil && ns.Tenant == tenant {
			nets = append(nets, ns.ID)
		}
	}
	owned := func(k string, v []byte) bool {
		var ns model.CfgNetworkState
		switch {
		case k == model.ModelKey(model.TypeTenant, tenant):
			return true
		case strings.HasPrefix(k, model.ModelDBPrefix):
			return strings.Contains(k, "/"+tenant+":")
		case strings.HasPrefix(k, model.NetStatePrefix):
			return json.Unmarshal(v, &ns) == nil && ns.Tenant == tenant
		case strings.HasPrefix(k, model.EpStatePrefix):
			for _, n := range nets {
				if strings.HasPrefix(k, model.EpStatePrefix+n+"-") {
					return true
				}
			}
		case strings.HasPrefix(k, model.EPGStatePrefix), strings.HasPrefix(k, model.SvcLBStatePrefix), strings.HasPrefix(k, model.ProviderPrefix):
			return strings.HasSuffix(k, ":"+tenant)
		case strings.HasPrefix(k, model.PolicyStatePrefix), strings.HasPrefix(k, model.RuleStatePrefix):
			return strings.Contains(k, "/"+tenant+":")
		case strings.HasPrefix(k, model.NodePortPrefix): // (its value: the service's id)
			return strings.HasSuffix(string(v), ":"+tenant+`"`)
		}
		return false
	}
	var n int64
	for _, kv := range resp.Kvs {
		if owned(string(kv.Key), kv.Value) {
			n += int64(len(kv.Key) + len(kv.Value))
		}
	}
	return n
}

// tenantFixture gives tenant tn (subnets 10.<o>.x.0/24) one of every kind: two networks,
// a group with a policy of two rules, an app profile, a service and two endpoints.
func (e *env) tenantFixture(tn string, o int) {
	e.t.Helper()
	e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	e.net(tn, "n1", "vxlan", fmt.Sprintf("10.%d.1.0/24", o), fmt.Sprintf("10.%d.1.1", o), 0)
	e.net(tn, "svc", "vxlan", fmt.Sprintf("10.%d.2.0/24", o), "", 0)
	e.ok("POST", "/api/v1/policys/"+tn+":p1/", `{"policyName":"p1","tenantName":"`+tn+`"}`, nil)
	for i := 1; i <= 2; i++ {
		e.ok("POST", fmt.Sprintf("/api/v1/rules/%s:p1:%d/", tn, i), fmt.Sprintf(`{"action":"allow","direction":"in","policyName":"p1","ruleId":"%d","tenantName":"%s","protocol":"tcp","port":%d}`, i, tn, 80+i), nil)
	}
	e.ok("POST", "/api/v1/endpointGroups/"+tn+":g1/", `{"groupName":"g1","networkName":"n1","policies":["p1"],"tenantName":"`+tn+`"}`, nil)
	e.ok("POST", "/api/v1/appProfiles/"+tn+":a1/", `{"appProfileName":"a1","endpointGroups":["g1"],"tenantName":"`+tn+`"}`, nil)
	e.ok("POST", "/api/v1/serviceLBs/"+tn+":s1/", `{"networkName":"svc","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"s1","tenantName":"`+tn+`"}`, nil)
	ep := e.createEP(tn, "n1", "g1", "c1", "")
	e.createEP(tn, "n1", "", "c2", "")
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, ContainerID: "c1",
		Tenant: tn, Network: "g1", Event: "start", Labels: map[string]string{"app": "web"}}, nil)
}

// TestQuotaUsageBooks (issue 34, item 2): every create, update and delete books its
// tenant's usage in the same transaction: counts by kind and the bytes of the tenant's
// records, equal at every step to a recount and to the records' weight in etcd; another
// tenant's books are untouched; deleting everything (the tenant last) leaves no record.
func TestQuotaUsageBooks(t *testing.T) {
	e := newEnv(t, "routing")
	e.tenantFixture("t1", 41)
	e.tenantFixture("t2", 42)
	u := e.checkBooks("t1")
	want := map[string]int64{model.QuotaNetworks: 2, model.QuotaEndpointGroups: 1, model.QuotaPolicies: 1, model.QuotaRules: 2,
		model.QuotaAppProfiles: 1, model.QuotaServices: 1, model.QuotaEndpoints: 2}
	for k, v := range want {
		if u[k] != v {
			t.Errorf("t1 usage %s = %d, want %d (%v)", k, u[k], v, u)
		}
	}
	if u[model.QuotaBytes] < 2000 {
		t.Errorf("t1 usage bytes %d: too few for its records", u[model.QuotaBytes])
	}
	if got := e.usage("t1"); got[model.QuotaBytes] != u[model.QuotaBytes] {
		t.Errorf("GET quota: %v, want %v", got, u)
	}
	t2 := e.checkBooks("t2")
	steps := []struct{ method, path string }{
		{"DELETE", "/api/v1/rules/t1:p1:2/"},
		{"DELETE", "/api/v1/appProfiles/t1:a1/"},
		{"DELETE", "/api/v1/serviceLBs/t1:s1/"},
		{"POST", "/plugin/deleteEndpoint"},
		{"DELETE", "/api/v1/endpointGroups/t1:g1/"},
		{"DELETE", "/api/v1/policys/t1:p1/"},
		{"DELETE", "/api/v1/networks/t1:svc/"},
	}
	for _, s := range steps {
		var body any
		if s.method == "POST" {
			body = model.DeleteEndpointRequest{TenantName: "t1", NetworkName: "n1", EndpointID: "c1"}
		}
		e.ok(s.method, s.path, body, nil)
		e.checkBooks("t1")
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "t1", NetworkName: "n1", EndpointID: "c2"}, nil)
	e.ok("DELETE", "/api/v1/networks/t1:n1/", nil, nil)
	if u := e.checkBooks("t1"); u[model.QuotaBytes] == 0 || u[model.QuotaNetworks] != 0 || u[model.QuotaEndpoints] != 0 {
		t.Errorf("t1 with only its tenant object: %v", u)
	}
	e.ok("DELETE", "/api/v1/tenants/t1/", nil, nil)
	if got := e.rawGet(model.QuotaUsageKey("t1")); got != "" {
		t.Errorf("a deleted tenant's usage record stays: %s", got)
	}
	if got := e.checkBooks("t2"); got[model.QuotaBytes] != t2[model.QuotaBytes] {
		t.Errorf("t2's books moved with t1's changes: %v → %v", t2, got)
	}
}

// TestQuotaRefusesCreates (issue 34, item 2): a tenant at its network limit is refused
// (403 naming the tenant, the kind and the limit; Contiv's clients get it as 500 with the
// same text) and nothing is written, while another tenant still creates; an admin is never
// refused, and once over the limit the tenant still deletes.
func TestQuotaRefusesCreates(t *testing.T) {
	e := newEnv(t, "routing")
	store, url := e.store, e.url
	e = newEnvOn(t, store, url, "routing", withQuota(map[string]int64{model.QuotaNetworks: 2}))
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	e.net("t1", "a", "vxlan", "10.51.1.0/24", "", 0)
	e.net("t1", "b", "vxlan", "10.51.2.0/24", "", 0)
	before, rev := e.snapshot()
	code, msg := e.do("POST", "/api/v1/networks/t1:c/", model.Network{TenantName: "t1", NetworkName: "c", Encap: "vxlan", Subnet: "10.51.3.0/24"})
	if code != http.StatusForbidden || !strings.Contains(msg, `tenant "t1"`) || !strings.Contains(msg, "networks quota exceeded: limit 2") {
		t.Fatalf("third network: %d %q, want 403 naming tenant, kind and limit", code, msg)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused create changed etcd")
	}
	resp, err := http.Post(e.srv.URL+"/api/v1/networks/t1:c/", "application/json", strings.NewReader(`{"tenantName":"t1","networkName":"c","encap":"vxlan","subnet":"10.51.3.0/24"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("Contiv client: %d, want 500 (Contiv's error status)", resp.StatusCode)
	}
	e.net("t2", "a", "vxlan", "10.52.1.0/24", "", 0)
	admin := e.as(auth.Identity{Name: "alice", Role: auth.RoleAdmin, Via: "token"})
	admin.net("t1", "c", "vxlan", "10.51.3.0/24", "", 0)
	anon := e.as(auth.Identity{Name: "anonymous", Role: auth.RoleAdmin, Via: "insecure"})
	if code, msg := anon.do("POST", "/api/v1/networks/t1:d/", model.Network{TenantName: "t1", NetworkName: "d", Encap: "vxlan", Subnet: "10.51.4.0/24"}); code != http.StatusForbidden {
		t.Errorf("the anonymous caller of an open netmaster: %d %q, want 403", code, msg)
	}
	e.ok("DELETE", "/api/v1/networks/t1:c/", nil, nil)
	e.ok("DELETE", "/api/v1/networks/t1:b/", nil, nil)
	e.net("t1", "b", "vxlan", "10.51.2.0/24", "", 0)
	if u := e.checkBooks("t1"); u[model.QuotaNetworks] != 2 {
		t.Errorf("t1 networks %d, want 2", u[model.QuotaNetworks])
	}
}

// TestQuotaRace (issue 34, item 2): 24 concurrent creates through two Masters on one etcd
// (each its own lock: only etcd's transaction orders them) when the tenant is one below
// its limit: exactly one succeeds, for policies (no other record ties them) and networks.
func TestQuotaRace(t *testing.T) {
	limits := map[string]int64{model.QuotaPolicies: 5, model.QuotaNetworks: 3}
	e1 := newEnv(t, "routing")
	e1 = newEnvOn(t, e1.store, e1.url, "routing", withQuota(limits))
	e2 := newEnvOn(t, e1.store, e1.url, "routing", withQuota(limits))
	e1.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	for i := 0; i < 4; i++ {
		e1.ok("POST", fmt.Sprintf("/api/v1/policys/t1:p%d/", i), fmt.Sprintf(`{"policyName":"p%d","tenantName":"t1"}`, i), nil)
	}
	e1.net("t1", "n0", "vxlan", "10.61.0.0/24", "", 0)
	e1.net("t1", "n1", "vxlan", "10.61.1.0/24", "", 0)
	race := func(path func(i int) string, body func(i int) string) int {
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := 0; i < 24; i++ {
			c := []*env{e1, e2}[i%2]
			wg.Go(func() {
				code, msg := c.do("POST", path(i), body(i))
				mu.Lock()
				defer mu.Unlock()
				switch code {
				case http.StatusOK:
					won++
				case http.StatusForbidden:
				default:
					t.Errorf("racing create %d: %d %s", i, code, msg)
				}
			})
		}
		wg.Wait()
		return won
	}
	if won := race(func(i int) string { return fmt.Sprintf("/api/v1/policys/t1:r%d/", i) },
		func(i int) string { return fmt.Sprintf(`{"policyName":"r%d","tenantName":"t1"}`, i) }); won != 1 {
		t.Errorf("%d racing policy creates at quota-1 succeeded, want 1", won)
	}
	if won := race(func(i int) string { return fmt.Sprintf("/api/v1/networks/t1:r%d/", i) },
		func(i int) string {
			return fmt.Sprintf(`{"tenantName":"t1","networkName":"r%d","encap":"vxlan","subnet":"10.62.%d.0/24"}`, i, i)
		}); won != 1 {
		t.Errorf("%d racing network creates at quota-1 succeeded, want 1", won)
	}
	// The usage record alone orders them: bare writes of rules (no other record read or
	// written) by two Masters, at quota-1.
	e1.ok("PUT", "/api/v1/quotas/t1/", `{"rules":1}`, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := 0; i < 24; i++ {
		m := []*Master{e1.m, e2.m}[i%2]
		wg.Go(func() {
			err := m.update(context.Background(), func(tx *state.Tx) error {
				key := fmt.Sprintf("t1:p0:%d", i)
				return tx.Put(model.ModelKey(model.TypeRule, key), model.Rule{Key: key, TenantName: "t1", PolicyName: "p0", RuleID: fmt.Sprint(i)})
			})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won++
			} else if statusOf(err) != http.StatusForbidden {
				t.Errorf("bare rule write %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if won != 1 {
		t.Errorf("%d racing bare rule writes at quota-1 succeeded, want 1", won)
	}
	if u := e1.checkBooks("t1"); u[model.QuotaPolicies] != 5 || u[model.QuotaNetworks] != 3 || u[model.QuotaRules] != 1 {
		t.Errorf("usage after the races: %v", u)
	}
}

// TestQuotaOverrides (issue 34, item 2): an admin raises and lowers a tenant's limits
// (merged, null back to the default, DELETE drops them all); lowered below usage, creates
// are refused and deletes pass; bad kinds, negative limits and unknown tenants are refused;
// a tenant-admin reads its own quota, never another's, and sets none; a deleted tenant's
// limits go with it.
func TestQuotaOverrides(t *testing.T) {
	e := newEnv(t, "routing")
	e = newEnvOn(t, e.store, e.url, "routing", withQuota(map[string]int64{model.QuotaPolicies: 2, model.QuotaRules: 100}))
	admin := e.as(auth.Identity{Name: "alice", Role: auth.RoleAdmin, Via: "token"})
	bob := e.as(auth.Identity{Name: "bob", Role: "tenant-admin:t1", Via: "token"})
	for _, tn := range []string{"t1", "t2"} {
		admin.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	policy := func(c *env, name string) (int, string) {
		return c.do("POST", "/api/v1/policys/t1:"+name+"/", `{"policyName":"`+name+`","tenantName":"t1"}`)
	}
	var q model.TenantQuota
	quota := func(method, body string) model.TenantQuota {
		t.Helper()
		var q model.TenantQuota
		admin.ok(method, "/api/v1/quotas/t1/", body, &q)
		return q
	}
	q = quota("PUT", `{"policies":4}`)
	if q.Limits[model.QuotaPolicies] != 4 || q.Overrides[model.QuotaPolicies] != 4 || q.Limits[model.QuotaRules] != 100 {
		t.Fatalf("after raising: %+v", q)
	}
	for i := 0; i < 4; i++ {
		if code, msg := policy(bob, fmt.Sprint("p", i)); code != http.StatusOK {
			t.Fatalf("policy %d under the raised limit: %d %s", i, code, msg)
		}
	}
	if code, msg := policy(bob, "p4"); code != http.StatusForbidden || !strings.Contains(msg, "limit 4") {
		t.Fatalf("fifth policy: %d %s", code, msg)
	}
	quota("POST", `{"policies":1,"rules":0}`)
	if code, _ := policy(bob, "p4"); code != http.StatusForbidden {
		t.Fatalf("create below usage: %d, want 403", code)
	}
	bob.ok("DELETE", "/api/v1/policys/t1:p3/", nil, nil)
	if code, msg := bob.do("POST", "/api/v1/rules/t1:p0:1/", `{"action":"allow","direction":"in","policyName":"p0","ruleId":"1","tenantName":"t1"}`); code != http.StatusForbidden || !strings.Contains(msg, "rules quota exceeded: limit 0") {
		t.Fatalf("rule at limit 0: %d %s", code, msg)
	}
	q = quota("PUT", `{"policies":null}`)
	if q.Limits[model.QuotaPolicies] != 2 || q.Overrides[model.QuotaRules] != 0 || len(q.Overrides) != 1 {
		t.Fatalf("after dropping the policies limit: %+v", q)
	}
	q = quota("DELETE", "")
	if q.Overrides != nil || e.rawGet(model.QuotaLimitsKey("t1")) != "" || q.Usage[model.QuotaPolicies] != 3 {
		t.Fatalf("after DELETE: %+v", q)
	}
	for body, want := range map[string]int{`{"nets":1}`: 400, `{"networks":-1}`: 400, `{"networks":"x"}`: 400, `[1]`: 400} {
		if code, msg := admin.do("PUT", "/api/v1/quotas/t1/", body); code != want {
			t.Errorf("PUT %s: %d %s, want %d", body, code, msg, want)
		}
	}
	if code, _ := admin.do("PUT", "/api/v1/quotas/nosuch/", `{"networks":1}`); code != http.StatusNotFound {
		t.Errorf("quota of a missing tenant: %d, want 404", code)
	}
	// A tenant-admin: its own quota, never another's, and no writes.
	bob.ok("GET", "/api/v1/quotas/t1/", nil, &q)
	var list []model.TenantQuota
	if bob.ok("GET", "/api/v1/quotas/", nil, &list); len(list) != 1 || list[0].Tenant != "t1" {
		t.Errorf("tenant-admin's quota list: %+v", list)
	}
	if admin.ok("GET", "/api/v1/quotas/", nil, &list); len(list) != 3 {
		t.Errorf("admin's quota list: %d tenants, want default, t1, t2", len(list))
	}
	for _, rq := range [][3]string{{"GET", "/api/v1/quotas/t2/", ""}, {"PUT", "/api/v1/quotas/t1/", `{"policies":9}`}, {"DELETE", "/api/v1/quotas/t1/", ""}} {
		if code, msg := bob.do(rq[0], rq[1], rq[2]); code != http.StatusForbidden || strings.Contains(msg, `"usage"`) {
			t.Errorf("tenant-admin %s %s: %d %s, want 403", rq[0], rq[1], code, msg)
		}
	}
	admin.ok("PUT", "/api/v1/quotas/t2/", `{"networks":7}`, nil)
	admin.ok("DELETE", "/api/v1/tenants/t2/", nil, nil)
	if got := e.rawGet(model.QuotaLimitsKey("t2")); got != "" {
		t.Errorf("a deleted tenant's limits stay: %s", got)
	}
}

// TestQuotaEndpointsBytesServices (issue 34, item 2): the endpoint limit holds for the
// agents' createEndpoint, the bytes limit for any change that grows a tenant's records,
// and the service limit for netmaster's Kubernetes sync (PutK8sService) too; what is
// refused writes nothing.
func TestQuotaEndpointsBytesServices(t *testing.T) {
	e := newEnv(t, "routing")
	e = newEnvOn(t, e.store, e.url, "routing", withQuota(map[string]int64{model.QuotaEndpoints: 2, model.QuotaServices: 1}))
	e.net("default", "app", "vxlan", "10.71.0.0/24", "10.71.0.1", 0)
	e.podEP("default", "app", "c1", "prod/web-1")
	e.podEP("default", "app", "c2", "prod/web-2")
	before, rev := e.snapshot()
	code, msg := e.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "default", NetworkName: "app",
		EndpointID: "c3", ConfigEP: model.ConfigEP{Container: "c3", Host: "host1"}})
	if code != http.StatusForbidden || !strings.Contains(msg, "endpoints quota exceeded: limit 2") {
		t.Fatalf("third endpoint: %d %s", code, msg)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused endpoint changed etcd")
	}
	ctx := context.Background()
	svc := func(name, vip string) K8sServiceResult {
		return e.m.PutK8sService(ctx, "k8s_", model.CfgServiceLBState{ID: name + ":default", ServiceName: name, Tenant: "default",
			IPAddress: vip, Ports: []string{"80:8080:TCP"}, Providers: map[string]*model.Provider{}})
	}
	if res := svc("k8s_prod_a", "10.96.0.10"); res.Err != nil {
		t.Fatalf("first service: %+v", res)
	}
	if res := svc("k8s_prod_b", "10.96.0.11"); res.Err == nil || statusOf(res.Err) != http.StatusForbidden || !strings.Contains(res.Err.Error(), "serviceLBs quota exceeded") {
		t.Fatalf("second service: %+v", res)
	}
	u := e.checkBooks("default")
	// One policy (its object and the tenant's link to it) weighs about 230 bytes.
	e.ok("PUT", "/api/v1/quotas/default/", fmt.Sprintf(`{"bytes":%d}`, u[model.QuotaBytes]+300), nil)
	if code, msg := e.do("POST", "/api/v1/policys/default:b/", `{"policyName":"b","tenantName":"default"}`); code != http.StatusOK {
		t.Fatalf("a policy within the bytes left: %d %s", code, msg)
	}
	if code, msg := e.do("POST", "/api/v1/policys/default:c/", `{"policyName":"c","tenantName":"default"}`); code != http.StatusForbidden || !strings.Contains(msg, "bytes quota exceeded") {
		t.Fatalf("policy past the bytes limit: %d %s", code, msg)
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "app", EndpointID: "c2"}, nil)
	e.checkBooks("default")
}

// TestQuotaRecountAtStart (issue 34, item 2): a tenant whose usage record is missing (a
// netmaster upgraded to quotas, a record lost) is recounted when a netmaster starts, to
// what the books held; the limits an admin set stay.
func TestQuotaRecountAtStart(t *testing.T) {
	e := newEnv(t, "routing")
	e.tenantFixture("t1", 81)
	e.ok("PUT", "/api/v1/quotas/t1/", `{"networks":9}`, nil)
	want := e.checkBooks("t1")
	for _, tn := range []string{"t1", "default"} {
		if _, err := e.raw.Delete(context.Background(), model.QuotaUsageKey(tn)); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.usage("t1"); got[model.QuotaBytes] != want[model.QuotaBytes] {
		t.Errorf("GET without a record: %v, want the recount %v", got, want)
	}
	e2 := newEnvOn(t, e.store, e.url, "routing")
	if e.rawGet(model.QuotaUsageKey("t1")) == "" || e.rawGet(model.QuotaUsageKey("default")) == "" {
		t.Fatal("start did not recount the missing usage records")
	}
	if got := e2.checkBooks("t1"); got[model.QuotaNetworks] != want[model.QuotaNetworks] || got[model.QuotaBytes] != want[model.QuotaBytes] {
		t.Errorf("recounted %v, want %v", got, want)
	}
	var q model.TenantQuota
	if e2.ok("GET", "/api/v1/quotas/t1/", nil, &q); q.Limits[model.QuotaNetworks] != 9 {
		t.Errorf("limits after the restart: %+v", q)
	}
}

// TestQuotaMetricsSkipUnreadable: one usage record that does not decode leaves out that
// tenant's figures only, and is counted (contiv_netmaster_quota_records_unreadable); before,
// it hid every tenant's usage and limits from /metrics.
func TestQuotaMetricsSkipUnreadable(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", model.Tenant{TenantName: tn}, nil)
	}
	e.net("t2", "n1", "vxlan", "10.1.1.0/24", "", 0)
	if _, err := e.raw.Put(context.Background(), model.QuotaUsageKey("t1"), "{not json"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.m.Collectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var t2Networks, unreadable float64 = -1, -1
	eachGauge(fams, func(name string, labels map[string]string, v float64) {
		switch {
		case name == "contiv_netmaster_tenant_usage" && labels["tenant"] == "t2" && labels["kind"] == "networks":
			t2Networks = v
		case name == "contiv_netmaster_tenant_usage" && labels["tenant"] == "t1":
			t.Errorf("t1's unreadable usage reported: %v %v", labels, v)
		case name == "contiv_netmaster_quota_records_unreadable":
			unreadable = v
		}
	})
	if t2Networks != 1 || unreadable != 1 {
		t.Fatalf("t2's networks %v (want 1), unreadable records %v (want 1)", t2Networks, unreadable)
	}
}

// TestQuotaMetricsHostileRecords (review of d128c5e): what anything holding an etcd
// certificate can write under the quota prefixes hides at most its own tenant's figures.
// A limits record that does not decode must leave its tenant out (not report the defaults
// as its limits), and a usage record whose key is not valid UTF-8 must not fail the
// scrape (MustNewConstMetric panics on such a label value; the registry recovers, and
// promhttp then answers every /metrics scrape 500).
func TestQuotaMetricsHostileRecords(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", model.Tenant{TenantName: tn}, nil)
	}
	e.net("t1", "n1", "vxlan", "10.1.1.0/24", "", 0)
	e.net("t2", "n1", "vxlan", "10.1.1.0/24", "", 0)
	ctx := context.Background()
	if _, err := e.raw.Put(ctx, model.QuotaLimitsKey("t1"), "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw.Put(ctx, model.QuotaUsagePrefix+"bad\xff", `{"usage":{"networks":1}}`); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.m.Collectors()...)
	// (promhttp's default answers a scrape whose Gather failed with 500: all of /metrics.)
	fams, err := reg.Gather()
	if err != nil {
		t.Errorf("a usage key that is not UTF-8 fails the whole scrape: %v", firstLine(err))
	}
	var t2Networks, unreadable float64 = -1, -1
	eachGauge(fams, func(name string, labels map[string]string, v float64) {
		switch {
		case name == "contiv_netmaster_tenant_quota" && labels["tenant"] == "t1":
			t.Errorf("t1's limits record is unreadable, yet limits are reported for it: %v %v", labels, v)
		case name == "contiv_netmaster_tenant_usage" && labels["tenant"] == "t2" && labels["kind"] == "networks":
			t2Networks = v
		case name == "contiv_netmaster_quota_records_unreadable":
			unreadable = v
		}
	})
	if t2Networks != 1 || unreadable != 2 {
		t.Errorf("t2's networks %v (want 1), unreadable records %v (want 2)", t2Networks, unreadable)
	}
}

// firstLine is err without the stack trace a recovered panic's error carries.
func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "stack trace=")
	return s
}

// eachGauge calls fn with every gauge of fams: its family's name, labels and value.
func eachGauge(fams []*dto.MetricFamily, fn func(name string, labels map[string]string, v float64)) {
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			fn(f.GetName(), labels, mt.GetGauge().GetValue())
		}
	}
}
