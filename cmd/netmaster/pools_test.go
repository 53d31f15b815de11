package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// poolTokens are the callers of the shared-pool tests: an admin, a read-only scraper, an
// agent, the tenant-admins of t1 and t2 and the netmasters' peer token.
const tPoolT1, tPoolT2 = "t1-pool-admin-token-0123456789", "t2-pool-admin-token-0123456789"

func poolEnv(t *testing.T, flags ...string) (*secureEnv, []*proc, func() int64) {
	t.Helper()
	sec := newSecureEnv(t, fmt.Sprintf("%s admin alice\n%s read-only scraper\n%s agent docker\n%s tenant-admin:t1 bob\n%s tenant-admin:t2 carol\n%s netmaster peers\n",
		tAdmin, tRO, tAgent, tPoolT1, tPoolT2, tPeer))
	sec.flags = append(sec.flags, flags...)
	etcdURL := statetest.Etcd(t)
	return sec, sec.start(t, etcdURL, "nm-a", "nm-b"), etcdRevision(t, etcdURL)
}

// svcLB is a Contiv serviceLB of tenant tn on its network "app" with the node ports given.
func svcLB(tn, name, vip string, nodePorts ...int) string {
	var ports, nps []string
	for i, np := range nodePorts {
		ports = append(ports, fmt.Sprintf(`"%d:8080:TCP"`, 80+i))
		nps = append(nps, fmt.Sprintf(`"%d:%d:TCP"`, np, 80+i))
	}
	return fmt.Sprintf(`{"networkName":"app","ipAddress":%q,"ports":[%s],"nodePorts":[%s],"selectors":["app=x"],"serviceName":%q,"tenantName":%q}`,
		vip, strings.Join(ports, ","), strings.Join(nps, ","), name, tn)
}

// TestNodePortQuota (issue 34, item 3) runs two netmasters with TLS and tokens and a
// default of 2 node ports per tenant: t1's tenant-admin takes two, a third (another
// service or the same one grown) is 403 naming the tenant, the kind and the limit, through
// leader and follower, etcd untouched; t2 still takes its own; the admin is not held to
// it; the quota API, `/metrics` and the usage record show the node ports.
func TestNodePortQuota(t *testing.T) {
	sec, ps, rev := poolEnv(t, "--quota-node-ports", "2")
	admin, ro, t1, t2 := sec.client(t, tAdmin), sec.client(t, tRO), sec.client(t, tPoolT1), sec.client(t, tPoolT2)
	leader, follower := secureLeader(t, admin, ps)
	for i, tn := range []string{"t1", "t2"} {
		admin.must(t, "POST", leader.url+"/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, 200)
		admin.must(t, "POST", leader.url+"/api/v1/networks/"+tn+":app/", netBodyIn(tn, "app", 84, i), 200)
	}
	t1.must(t, "POST", follower.url+"/api/v1/serviceLBs/t1:a/", svcLB("t1", "a", "10.84.0.200", 30101, 30102), 200)
	for _, via := range []*proc{leader, follower} {
		for _, try := range []struct{ path, body string }{
			{"/api/v1/serviceLBs/t1:b/", svcLB("t1", "b", "10.84.0.201", 30103)},
			{"/api/v1/serviceLBs/t1:a/", svcLB("t1", "a", "10.84.0.200", 30101, 30102, 30103)},
		} {
			before := rev()
			st, out := t1.call(t, "POST", via.url+try.path, try.body)
			if st != 403 || !strings.Contains(out, `tenant \"t1\": nodePorts quota exceeded: limit 2, 2 in use`) {
				t.Errorf("POST %s via %s: %d %s, want 403 naming the node port quota", try.path, via.name, st, out)
			}
			if rev() != before {
				t.Errorf("POST %s refused but etcd changed", try.path)
			}
		}
	}
	t2.must(t, "POST", leader.url+"/api/v1/serviceLBs/t2:a/", svcLB("t2", "a", "10.84.1.200", 30103), 200)
	admin.must(t, "POST", follower.url+"/api/v1/serviceLBs/t1:c/", svcLB("t1", "c", "10.84.0.202", 30104), 200)
	if q := t1.quota(t, follower.url+"/api/v1/quotas/t1/"); q.Usage[model.QuotaNodePorts] != 3 || q.Limits[model.QuotaNodePorts] != 2 {
		t.Errorf("t1's quota: %+v", q)
	}
	_, m := ro.call(t, "GET", leader.url+"/metrics", "")
	for _, want := range []string{`contiv_netmaster_tenant_usage{kind="nodePorts",tenant="t1"} 3`, `contiv_netmaster_tenant_quota{kind="nodePorts",tenant="t2"} 2`,
		`contiv_netmaster_tenant_usage{kind="nodePorts",tenant="t2"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Deleting frees them for the tenant-admin again.
	admin.must(t, "DELETE", leader.url+"/api/v1/serviceLBs/t1:c/", "", 200)
	t1.must(t, "DELETE", leader.url+"/api/v1/serviceLBs/t1:a/", "", 200)
	t1.must(t, "POST", follower.url+"/api/v1/serviceLBs/t1:b/", svcLB("t1", "b", "10.84.0.201", 30101, 30105), 200)
}

// TestEPGIDQuota (issue 34) runs two netmasters with TLS and tokens, a default of 2
// endpoint group ids per tenant and room for 10 groups: endpoint group ids are one pool
// every tenant shares, and before only the groups' count (an etcd-size bound) held a
// tenant back. t1's tenant-admin takes two; a third is 403 naming the tenant, the kind and
// the limit, through leader and follower, etcd untouched; t2 still takes its own; the admin
// is not held to it; the quota API and /metrics show the ids.
func TestEPGIDQuota(t *testing.T) {
	sec, ps, rev := poolEnv(t, "--quota-endpoint-group-ids", "2", "--quota-endpoint-groups", "10")
	admin, ro, t1, t2 := sec.client(t, tAdmin), sec.client(t, tRO), sec.client(t, tPoolT1), sec.client(t, tPoolT2)
	leader, follower := secureLeader(t, admin, ps)
	for i, tn := range []string{"t1", "t2"} {
		admin.must(t, "POST", leader.url+"/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, 200)
		admin.must(t, "POST", leader.url+"/api/v1/networks/"+tn+":app/", netBodyIn(tn, "app", 87, i), 200)
	}
	group := func(tn, name string) (string, string) {
		return "/api/v1/endpointGroups/" + tn + ":" + name + "/", fmt.Sprintf(`{"groupName":%q,"networkName":"app","tenantName":%q}`, name, tn)
	}
	for _, g := range []string{"g1", "g2"} {
		path, body := group("t1", g)
		t1.must(t, "POST", follower.url+path, body, 200)
	}
	for _, via := range []*proc{leader, follower} {
		path, body := group("t1", "g3")
		before := rev()
		st, out := t1.call(t, "POST", via.url+path, body)
		if st != 403 || !strings.Contains(out, `tenant \"t1\": endpointGroupIds quota exceeded: limit 2, 2 in use`) {
			t.Errorf("POST %s via %s: %d %s, want 403 naming the endpoint group id quota", path, via.name, st, out)
		}
		if rev() != before {
			t.Errorf("POST %s refused but etcd changed", path)
		}
	}
	path, body := group("t2", "g1")
	t2.must(t, "POST", leader.url+path, body, 200)
	path, body = group("t1", "g3")
	admin.must(t, "POST", follower.url+path, body, 200)
	if q := t1.quota(t, follower.url+"/api/v1/quotas/t1/"); q.Usage[model.QuotaEPGIDs] != 3 || q.Limits[model.QuotaEPGIDs] != 2 {
		t.Errorf("t1's quota: %+v", q)
	}
	_, m := ro.call(t, "GET", leader.url+"/metrics", "")
	for _, want := range []string{`contiv_netmaster_tenant_usage{kind="endpointGroupIds",tenant="t1"} 3`,
		`contiv_netmaster_tenant_quota{kind="endpointGroupIds",tenant="t2"} 2`, `contiv_netmaster_tenant_usage{kind="endpointGroupIds",tenant="t2"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Deleting frees one for the tenant-admin again.
	t1.must(t, "DELETE", leader.url+"/api/v1/endpointGroups/t1:g3/", "", 200)
	t1.must(t, "DELETE", leader.url+"/api/v1/endpointGroups/t1:g2/", "", 200)
	path, body = group("t1", "g4")
	t1.must(t, "POST", follower.url+path, body, 200)
}

// netTagBody is a network of tenant tn with encap and pktTag tag (0: allocated).
func netTagBody(tn, name, encap string, tag, a, b int) string {
	return fmt.Sprintf(`{"tenantName":%q,"networkName":%q,"encap":%q,"pktTag":%d,"subnet":"10.%d.%d.0/24"}`, tn, name, encap, tag, a, b)
}

// tagsOf reads a network's oper tags (VLAN: pktTag; VXLAN: the VNI) as c.
func tagsOf(t *testing.T, c *apiClient, url string) (vlan, vni int) {
	t.Helper()
	st, out := c.call(t, "GET", url, "")
	var in model.NetworkInspect
	if st != 200 || json.Unmarshal([]byte(out), &in) != nil {
		t.Fatalf("GET %s: %d %s", url, st, out)
	}
	return in.Oper.PktTag, in.Oper.ExternalPktTag
}

// TestTagRanges (issue 34, item 4) runs two netmasters with TLS and tokens. Before: a
// tenant-admin's explicit pkt-tag another tenant held answered 409 "in use" (a probe of
// which tags exist) and automatic tags counted every tenant's networks. Now: without a
// range a tenant-admin may not choose a tag (403, taken or not); an admin gives tenants
// tag ranges that may not overlap, leave the global range or hold another tenant's tag
// (409); a tenant-admin's explicit tag outside its range is 403 whether another tenant
// holds it or not (the answer never names that tenant), inside it collides only with its
// own; automatic tags come from the tenant's range, and tenants without one get tags
// outside every range; an admin's explicit tag in another tenant's range is 409; only
// admins set ranges; a tenant-admin reads its own; DELETE drops them.
func TestTagRanges(t *testing.T) {
	sec, ps, rev := poolEnv(t)
	admin, t1 := sec.client(t, tAdmin), sec.client(t, tPoolT1)
	leader, follower := secureLeader(t, admin, ps)
	for _, tn := range []string{"t1", "t2", "t3"} {
		admin.must(t, "POST", leader.url+"/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, 200)
	}
	admin.must(t, "POST", leader.url+"/api/v1/networks/t2:held/", netTagBody("t2", "held", "vlan", 150, 85, 0), 200)
	admin.must(t, "POST", leader.url+"/api/v1/networks/t2:heldx/", netTagBody("t2", "heldx", "vxlan", 5050, 85, 1), 200)
	refused := func(c *apiClient, via *proc, path, body string, code int, want string) {
		t.Helper()
		before := rev()
		st, out := c.call(t, "POST", via.url+path, body)
		if st != code || !strings.Contains(out, want) || strings.Contains(out, "t2") || strings.Contains(out, "held") {
			t.Errorf("POST %s via %s: %d %s, want %d with %q and no word of t2", path, via.name, st, out, code, want)
		}
		if rev() != before {
			t.Errorf("POST %s refused but etcd changed", path)
		}
	}
	// No range: no explicit tag for a tenant-admin, free or taken alike.
	for _, via := range []*proc{leader, follower} {
		refused(t1, via, "/api/v1/networks/t1:a/", netTagBody("t1", "a", "vlan", 150, 86, 0), 403, `choosing a VLAN needs a vlans range for tenant \"t1\"`)
		refused(t1, via, "/api/v1/networks/t1:a/", netTagBody("t1", "a", "vlan", 151, 86, 0), 403, `choosing a VLAN needs a vlans range for tenant \"t1\"`)
		refused(t1, via, "/api/v1/networks/t1:a/", netTagBody("t1", "a", "vxlan", 5050, 86, 0), 403, `choosing a VXLAN needs a vxlans range`)
	}

	// Ranges: only admins set them; no overlap, no other tenant's tag, inside the global.
	for _, bad := range []struct{ body, want string }{
		{`{"vlans":"140-160"}`, `range 140-160 holds VLAN 150 of network held.t2 of tenant \"t2\"`},
		{`{"vxlans":"5000-5099"}`, `range 5000-5099 holds VXLAN 5050`},
		{`{"vxlans":"9990-10099"}`, `not inside the global vxlans range 1-10000`},
	} {
		before := rev()
		if st, out := admin.call(t, "PUT", follower.url+"/api/v1/quotas/t1/", bad.body); st != 409 || !strings.Contains(out, bad.want) {
			t.Errorf("range %s: %d %s, want 409 with %q", bad.body, st, out, bad.want)
		}
		if rev() != before {
			t.Errorf("range %s refused but etcd changed", bad.body)
		}
	}
	for _, bad := range []string{`{"vlans":"100-5000"}`, `{"vlans":"1-2-3"}`, `{"vlans":7}`, `{"networks":"7"}`} {
		if st, out := admin.call(t, "PUT", leader.url+"/api/v1/quotas/t1/", bad); st != 400 {
			t.Errorf("range %s: %d %s, want 400", bad, st, out)
		}
	}
	t1.must(t, "PUT", leader.url+"/api/v1/quotas/t1/", `{"vlans":"100-149"}`, 403)
	admin.must(t, "PUT", leader.url+"/api/v1/quotas/t1/", `{"vlans":"100-149","vxlans":"6000-6099"}`, 200)
	admin.must(t, "PUT", follower.url+"/api/v1/quotas/t2/", `{"vlans":"150-160"}`, 200)
	if st, out := admin.call(t, "PUT", leader.url+"/api/v1/quotas/t3/", `{"vlans":"149-149"}`); st != 409 || !strings.Contains(out, `overlaps tenant \"t1\"'s vlans range 100-149`) {
		t.Errorf("overlapping range: %d %s", st, out)
	}
	if q := t1.quota(t, follower.url+"/api/v1/quotas/t1/"); q.VLANs != "100-149" || q.VXLANs != "6000-6099" {
		t.Errorf("t1 reads its ranges: %+v", q)
	}

	// With a range: outside it 403 whether taken (150: t2's) or free; inside, its own.
	for _, via := range []*proc{leader, follower} {
		refused(t1, via, "/api/v1/networks/t1:a/", netTagBody("t1", "a", "vlan", 150, 86, 0), 403, `VLAN 150 is outside tenant \"t1\"'s vlans range 100-149`)
		refused(t1, via, "/api/v1/networks/t1:a/", netTagBody("t1", "a", "vlan", 99, 86, 0), 403, `VLAN 99 is outside tenant \"t1\"'s vlans range 100-149`)
		refused(t1, via, "/api/v1/networks/t1:a/", netTagBody("t1", "a", "vxlan", 5050, 86, 0), 403, `VXLAN 5050 is outside tenant \"t1\"'s vxlans range 6000-6099`)
	}
	t1.must(t, "POST", leader.url+"/api/v1/networks/t1:a/", netTagBody("t1", "a", "vlan", 120, 86, 0), 200)
	refused(t1, follower, "/api/v1/networks/t1:b/", netTagBody("t1", "b", "vlan", 120, 86, 1), 409, "VLAN 120 is already in use")
	t1.must(t, "POST", follower.url+"/api/v1/networks/t1:b/", netTagBody("t1", "b", "vlan", 0, 86, 1), 200)
	t1.must(t, "POST", follower.url+"/api/v1/networks/t1:c/", netTagBody("t1", "c", "vxlan", 0, 86, 2), 200)
	if v, _ := tagsOf(t, t1, leader.url+"/api/v1/inspect/networks/t1:b/"); v != 100 {
		t.Errorf("t1's automatic VLAN: %d, want 100 (its range's first)", v)
	}
	if _, x := tagsOf(t, t1, leader.url+"/api/v1/inspect/networks/t1:c/"); x != 6000 {
		t.Errorf("t1's automatic VXLAN: %d, want 6000 (its range's first)", x)
	}

	// Without a range: automatic tags outside every range; an admin's explicit tag in
	// another tenant's range is 409 (admins read every quota).
	for i := 0; i < 2; i++ {
		admin.must(t, "POST", leader.url+fmt.Sprintf("/api/v1/networks/t3:v%d/", i), netTagBody("t3", fmt.Sprintf("v%d", i), "vlan", 0, 87, i), 200)
	}
	admin.must(t, "PUT", leader.url+"/api/v1/quotas/t3/", `{"vlans":"1-2"}`, 200) // (its own tags: fine)
	admin.must(t, "POST", leader.url+"/api/v1/networks/t2:v/", netTagBody("t2", "v", "vlan", 0, 85, 9), 200)
	admin.must(t, "DELETE", leader.url+"/api/v1/quotas/t2/", "", 200)
	admin.must(t, "POST", leader.url+"/api/v1/networks/t2:w/", netTagBody("t2", "w", "vlan", 0, 85, 10), 200)
	if v, _ := tagsOf(t, admin, leader.url+"/api/v1/inspect/networks/t2:w/"); v != 3 {
		t.Errorf("automatic VLAN of a tenant without a range: %d, want 3 (the first outside t1's and t3's)", v)
	}
	if st, out := admin.call(t, "POST", follower.url+"/api/v1/networks/t2:x/", netTagBody("t2", "x", "vlan", 130, 85, 11)); st != 409 || !strings.Contains(out, `VLAN 130 lies in tenant \"t1\"'s vlans range 100-149`) {
		t.Errorf("admin's tag in t1's range: %d %s", st, out)
	}
	admin.must(t, "POST", follower.url+"/api/v1/networks/t2:y/", netTagBody("t2", "y", "vlan", 170, 85, 12), 200)
	admin.must(t, "DELETE", leader.url+"/api/v1/quotas/t1/", "", 200)
	if q := admin.quota(t, follower.url+"/api/v1/quotas/t1/"); q.VLANs != "" || q.VXLANs != "" {
		t.Errorf("after DELETE: %+v", q)
	}
}
