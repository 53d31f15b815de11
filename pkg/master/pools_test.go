package master

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// svcBody is a Contiv serviceLB of tenant tn on network "app" with the node ports given.
func svcBody(tn, name, vip string, nodePorts ...string) string {
	ports, nps := []string{}, []string{}
	for i, np := range nodePorts {
		ports = append(ports, fmt.Sprintf(`"%d:8080:TCP"`, 80+i))
		nps = append(nps, fmt.Sprintf(`"%s:%d:TCP"`, np, 80+i))
	}
	if len(ports) == 0 {
		ports = []string{`"80:8080:TCP"`}
	}
	return fmt.Sprintf(`{"networkName":"app","ipAddress":%q,"ports":[%s],"nodePorts":[%s],"selectors":["app=x"],"serviceName":%q,"tenantName":%q}`,
		vip, strings.Join(ports, ","), strings.Join(nps, ","), name, tn)
}

// TestQuotaNodePorts (issue 34, item 3): node ports count against a per-tenant quota.
// A Contiv serviceLB past it is 403 naming the kind and the limit, nothing written, while
// another tenant still takes ports; a Kubernetes Service past it keeps its other ports and
// the ports it holds, the rest dropped with the reason (never a failed record); a port
// another tenant's service holds is dropped without naming that service; a usage record
// counted before node ports were (no version) is recounted at start.
func TestQuotaNodePorts(t *testing.T) {
	e := newEnv(t, "routing")
	e = newEnvOn(t, e.store, e.url, "routing", withQuota(map[string]int64{model.QuotaNodePorts: 2}))
	for i, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
		e.net(tn, "app", "vxlan", fmt.Sprintf("10.%d.0.0/24", 91+i), "", 0)
	}
	e.ok("POST", "/api/v1/serviceLBs/t1:a/", svcBody("t1", "a", "10.91.0.200", "30001", "30002"), nil)
	before, rev := e.snapshot()
	code, msg := e.do("POST", "/api/v1/serviceLBs/t1:b/", svcBody("t1", "b", "10.91.0.201", "30003"))
	if code != http.StatusForbidden || !strings.Contains(msg, `tenant "t1": nodePorts quota exceeded: limit 2, 2 in use`) {
		t.Fatalf("t1's third node port: %d %s", code, msg)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused node port changed etcd")
	}
	e.ok("POST", "/api/v1/serviceLBs/t1:b/", svcBody("t1", "b", "10.91.0.201"), nil) // (without node ports: fine)
	e.ok("POST", "/api/v1/serviceLBs/t2:a/", svcBody("t2", "a", "10.92.0.200", "30004"), nil)
	if u := e.checkBooks("t1"); u[model.QuotaNodePorts] != 2 {
		t.Fatalf("t1's usage: %v", u)
	}

	// Kubernetes: t2 holds one of two; a Service asking for three (one t1's) keeps one.
	ctx := context.Background()
	rec := model.CfgServiceLBState{ID: "k8s_prod_web:t2", ServiceName: "k8s_prod_web", Tenant: "t2", IPAddress: "10.96.0.10",
		Ports: []string{"80:8080:TCP", "81:8081:TCP", "82:8082:TCP", "83:8083:TCP"}, Providers: map[string]*model.Provider{},
		NodePorts: []string{"30001:80:TCP", "30010:81:TCP", "30011:82:TCP", "30012:83:TCP"}}
	res := e.m.PutK8sService(ctx, "k8s_", rec)
	dropped := strings.Join(res.NodePortsDropped, "; ")
	if res.Err != nil || !res.Written || len(res.NodePortsDropped) != 3 ||
		!strings.Contains(dropped, "30001:80:TCP (used by a service of another tenant)") ||
		!strings.Contains(dropped, `30011:82:TCP (past tenant "t2"'s nodePorts quota of 2)`) || strings.Contains(dropped, "t1") {
		t.Fatalf("kubernetes service past the quota: %+v", res)
	}
	if got := e.rawGet(model.NodePortKey(30010, "tcp")); got != `"k8s_prod_web:t2"` {
		t.Fatalf("node port within the quota: %s", got)
	}
	// Its held port stays first when a lowered quota leaves no room; one it gives up
	// makes room for another.
	e.ok("PUT", "/api/v1/quotas/t2/", `{"nodePorts":1}`, nil)
	rec.NodePorts = []string{"30013:80:TCP", "30010:81:TCP"}
	if res := e.m.PutK8sService(ctx, "k8s_", rec); res.Err != nil || len(res.NodePortsDropped) != 1 || !strings.HasPrefix(res.NodePortsDropped[0], "30013:80:TCP (past") {
		t.Fatalf("lowered quota: %+v", res)
	}
	e.ok("DELETE", "/api/v1/serviceLBs/t2:a/", nil, nil)
	rec.NodePorts = []string{"30014:80:TCP"}
	if res := e.m.PutK8sService(ctx, "k8s_", rec); res.Err != nil || len(res.NodePortsDropped) != 0 {
		t.Fatalf("swapping its one port: %+v", res)
	}
	if e.rawGet(model.NodePortKey(30010, "tcp")) != "" || e.checkBooks("t2")[model.QuotaNodePorts] != 1 {
		t.Fatal("the port given up is still held")
	}

	// A usage record of an older netmaster (no version, no node ports) is recounted.
	e.checkOldUsageRecounted(`{"tenant":"t1","usage":{"networks":1}}`, "t1", model.QuotaNodePorts, 2)
}

// checkOldUsageRecounted writes old as tenant's usage record (one an older netmaster
// counted, without kind) and checks that GET and a restart recount kind to want.
func (e *env) checkOldUsageRecounted(old, tenant, kind string, want int64) {
	e.t.Helper()
	if _, err := e.raw.Put(context.Background(), model.QuotaUsageKey(tenant), old); err != nil {
		e.t.Fatal(err)
	}
	if got := e.usage(tenant)[kind]; got != want {
		e.t.Errorf("GET with an old record: %d %s, want %d", got, kind, want)
	}
	newEnvOn(e.t, e.store, e.url, "routing")
	if u := e.checkBooks(tenant); u[kind] != want || u[model.QuotaNetworks] != 1 {
		e.t.Errorf("recounted at start: %v", u)
	}
}

// TestTagRangeBodies (review of issue 34, item 4): a quota body's tag ranges outside the
// ids of their kind (0, 4095, 16777216), reversed, negative, spaced or not strings are 400
// naming the field, nothing written; one with leading zeros is written as netmaster reads
// it ("0100-0149": "100-149"; before: kept as sent, so GET and netctl showed "0100-0149"
// while every check and message used 100-149).
func TestTagRangeBodies(t *testing.T) {
	e := newEnv(t, "routing")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	before, rev := e.snapshot()
	for body, want := range map[string]string{
		`{"vlans":"0-10"}`:                   `vlans: "0-10" must lie within 1-4094`,
		`{"vlans":"4000-4095"}`:              `vlans: "4000-4095" must lie within 1-4094`,
		`{"vxlans":"16777200-16777216"}`:     `vxlans: "16777200-16777216" must lie within 1-16777215`,
		`{"vlans":"199-100"}`:                `vlans: "199-100" has its start after its end`,
		`{"vlans":"-5-10"}`:                  `vlans: "-5-10" is not a range like 100-199`,
		`{"vlans":"100 - 199"}`:              `vlans: "100 - 199" is not a range like 100-199`,
		`{"vxlans":""}`:                      `vxlans: "" is not a range like 100-199`,
		`{"vxlans":6000}`:                    `quota "vxlans": want a range like "100-199"`,
		`{"vlans":"100-199","networks":"x"}`: `quota "networks": want a whole number`,
	} {
		if code, msg := e.do("PUT", "/api/v1/quotas/t1/", body); code != http.StatusBadRequest || !strings.Contains(msg, want) {
			t.Errorf("%s: %d %s, want 400 with %s", body, code, msg, want)
		}
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused range changed etcd")
	}
	var q model.TenantQuota
	e.ok("PUT", "/api/v1/quotas/t1/", `{"vlans":"0100-0149","vxlans":"00006000-6099"}`, &q)
	if q.VLANs != "100-149" || q.VXLANs != "6000-6099" {
		t.Errorf("ranges with leading zeros written as %q, %q; want 100-149, 6000-6099", q.VLANs, q.VXLANs)
	}
	if got := e.rawGet(model.QuotaLimitsKey("t1")); !strings.Contains(got, `"vlans":"100-149"`) {
		t.Errorf("limits record: %s", got)
	}
}

// TestTagRangeConflictNamesLowest (review of issue 34, item 4): a range that holds several
// of another tenant's tags is refused naming the lowest, the same answer every time
// (before: whichever tag a map handed out first, so two tries of one request told
// different networks apart).
func TestTagRangeConflictNamesLowest(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	for i := 0; i < 8; i++ {
		e.net("t2", fmt.Sprintf("n%d", i), "vlan", fmt.Sprintf("10.95.%d.0/24", i), "", 150+i)
	}
	for try := 0; try < 10; try++ {
		code, msg := e.do("PUT", "/api/v1/quotas/t1/", `{"vlans":"140-160"}`)
		if code != http.StatusConflict || !strings.Contains(msg, `range 140-160 holds VLAN 150 of network n0.t2`) {
			t.Fatalf("try %d: %d %s, want 409 naming VLAN 150", try, code, msg)
		}
	}
}

// TestGlobalRangeHoldsTenantRanges (review of issue 34, item 4): the global vlans/vxlans
// ranges may not shrink past a tenant's tag range (409 naming it, nothing written); before,
// they could, and the tenant's automatic tags stopped short while every later change of its
// quota was 409 "not inside the global range" until the range was moved.
func TestGlobalRangeHoldsTenantRanges(t *testing.T) {
	e := newEnv(t, "bridge")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	e.ok("PUT", "/api/v1/quotas/t1/", `{"vlans":"100-149","vxlans":"6000-6099"}`, nil)
	global := func(vlans, vxlans string) string {
		return fmt.Sprintf(`{"name":"global","vlans":%q,"vxlans":%q,"pvtSubnet":"172.19.0.0/16","fwdMode":"bridge"}`, vlans, vxlans)
	}
	before, rev := e.snapshot()
	for _, bad := range []struct{ vlans, vxlans, want string }{
		{"1-120", "1-10000", `vlans: range 1-120 leaves out tenant "t1"'s vlans range 100-149`},
		{"120-4094", "1-10000", `vlans: range 120-4094 leaves out tenant "t1"'s vlans range 100-149`},
		{"1-4094", "1-6050", `vxlans: range 1-6050 leaves out tenant "t1"'s vxlans range 6000-6099`},
	} {
		if code, msg := e.do("POST", "/api/v1/globals/global/", global(bad.vlans, bad.vxlans)); code != http.StatusConflict || !strings.Contains(msg, bad.want) {
			t.Errorf("global %s %s: %d %s, want 409 with %s", bad.vlans, bad.vxlans, code, msg, bad.want)
		}
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused global change wrote to etcd")
	}
	e.ok("POST", "/api/v1/globals/global/", global("100-200", "6000-7000"), nil)
	e.ok("PUT", "/api/v1/quotas/t1/", `{"networks":3}`, nil)
}

// TestTagRangeRace (review of issue 34, item 4): two Masters on one etcd. Tenants' ranges
// set at once, each overlapping the next, never both land; a range set while another
// tenant's networks take automatic tags never ends up holding one of them (each side reads
// the other's records with a commit guard: a tag or range written meanwhile makes it run
// again).
func TestTagRangeRace(t *testing.T) {
	e1 := newEnv(t, "bridge")
	e2 := newEnvOn(t, e1.store, e1.url, "bridge")
	const n = 6
	for i := 0; i < n; i++ {
		e1.ok("POST", fmt.Sprintf("/api/v1/tenants/t%d/", i), fmt.Sprintf(`{"tenantName":"t%d"}`, i), nil)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ { // t<i>: 100+10i .. 114+10i, overlapping t<i+1>'s
		wg.Go(func() {
			[]*env{e1, e2}[i%2].do("PUT", fmt.Sprintf("/api/v1/quotas/t%d/", i), fmt.Sprintf(`{"vlans":"%d-%d"}`, 100+10*i, 114+10*i))
		})
	}
	wg.Wait()
	var spans []span
	for i := 0; i < n; i++ {
		var q model.TenantQuota
		e1.ok("GET", fmt.Sprintf("/api/v1/quotas/t%d/", i), nil, &q)
		if q.VLANs == "" {
			continue
		}
		lo, hi, _ := parseRange("vlans", q.VLANs)
		for _, o := range spans {
			if o.overlaps(span{lo, hi}) {
				t.Errorf("ranges %s and t%d's %s overlap", o, i, q.VLANs)
			}
		}
		spans = append(spans, span{lo, hi})
	}

	// t9 (no range) takes automatic VLANs (1, 2, ...) while an admin gives t8 1-20.
	for _, tn := range []string{"t8", "t9"} {
		e1.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			e1.do("POST", fmt.Sprintf("/api/v1/networks/t9:n%d/", i), fmt.Sprintf(`{"tenantName":"t9","networkName":"n%d","encap":"vlan","subnet":"10.97.%d.0/24"}`, i, i))
		})
	}
	wg.Go(func() { e2.do("PUT", "/api/v1/quotas/t8/", `{"vlans":"1-20"}`) })
	wg.Wait()
	var q model.TenantQuota
	e1.ok("GET", "/api/v1/quotas/t8/", nil, &q)
	if q.VLANs == "" {
		return // (the networks came first: the range was refused, rightly)
	}
	for i := 0; i < 8; i++ {
		var in model.NetworkInspect
		if code, _ := e1.do("GET", fmt.Sprintf("/api/v1/inspect/networks/t9:n%d/", i), nil); code != http.StatusOK {
			continue
		}
		e1.ok("GET", fmt.Sprintf("/api/v1/inspect/networks/t9:n%d/", i), nil, &in)
		if in.Oper.PktTag >= 1 && in.Oper.PktTag <= 20 {
			t.Errorf("t9's network n%d took VLAN %d inside t8's range 1-20", i, in.Oper.PktTag)
		}
	}
}

// epgBody is endpoint group name of tenant tn on its network "app".
func epgBody(tn, name string) string {
	return fmt.Sprintf(`{"groupName":%q,"networkName":"app","tenantName":%q}`, name, tn)
}

// TestQuotaEPGIDs (issue 34): endpoint group ids are one pool of 65,535 every tenant
// shares; before, only the endpointGroups limit (an etcd-size bound an admin may raise)
// stood between one tenant and all of them. Each group's state record now counts as an id
// held (endpointGroupIds): past the limit a create is 403 naming the kind, nothing written,
// while another tenant still takes ids; a delete frees one; a usage record counted before
// ids were (version 1) is recounted on GET and at start.
func TestQuotaEPGIDs(t *testing.T) {
	e := newEnv(t, "routing")
	e = newEnvOn(t, e.store, e.url, "routing", withQuota(map[string]int64{model.QuotaEndpointGroups: 10, model.QuotaEPGIDs: 2}))
	for i, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
		e.net(tn, "app", "vxlan", fmt.Sprintf("10.%d.0.0/24", 93+i), "", 0)
	}
	e.ok("POST", "/api/v1/endpointGroups/t1:g1/", epgBody("t1", "g1"), nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:g2/", epgBody("t1", "g2"), nil)
	before, rev := e.snapshot()
	code, msg := e.do("POST", "/api/v1/endpointGroups/t1:g3/", epgBody("t1", "g3"))
	if code != http.StatusForbidden || !strings.Contains(msg, `tenant "t1": endpointGroupIds quota exceeded: limit 2, 2 in use`) {
		t.Fatalf("t1's third group id: %d %s", code, msg)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused group changed etcd")
	}
	e.ok("POST", "/api/v1/endpointGroups/t2:g1/", epgBody("t2", "g1"), nil)
	if u := e.checkBooks("t1"); u[model.QuotaEPGIDs] != 2 || u[model.QuotaEndpointGroups] != 2 {
		t.Fatalf("t1's usage: %v", u)
	}
	e.ok("DELETE", "/api/v1/endpointGroups/t1:g2/", nil, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:g3/", epgBody("t1", "g3"), nil)
	e.checkOldUsageRecounted(`{"tenant":"t1","usage":{"networks":1},"version":1}`, "t1", model.QuotaEPGIDs, 2)
}
