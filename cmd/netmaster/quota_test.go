package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// quotaOf decodes a quota answer (GET /api/v1/quotas/<tenant>/).
func quotaOf(t *testing.T, body string) model.TenantQuota {
	t.Helper()
	var q model.TenantQuota
	if err := json.Unmarshal([]byte(body), &q); err != nil {
		t.Fatalf("quota %q: %v", body, err)
	}
	return q
}

// quota reads a tenant's quota as c.
func (c *apiClient) quota(t *testing.T, url string) model.TenantQuota {
	t.Helper()
	st, out := c.call(t, "GET", url, "")
	if st != 200 {
		t.Fatalf("GET %s: %d %s", url, st, out)
	}
	return quotaOf(t, out)
}

// netBodyIn is a network of tenant tn in subnet 10.<a>.<b>.0/24.
func netBodyIn(tn, name string, a, b int) string {
	return fmt.Sprintf(`{"tenantName":%q,"networkName":%q,"encap":"vxlan","subnet":"10.%d.%d.0/24"}`, tn, name, a, b)
}

// TestTenantQuotas (issue 34, item 2) runs two netmasters with TLS and tokens and default
// limits of 3 networks and 6 policies per tenant. A tenant-admin filling its network quota
// gets 403 naming the tenant, the kind and the limit (nothing written) while another
// tenant still creates; an agent (Docker's network create) is held to the same quota; the
// admin raises and lowers the limit (below usage: creates refused, deletes pass); the
// tenant-admin reads its own quota, gets 403 for another's and for setting one; read-only
// reads; /metrics (read-only token) carries every tenant's usage and limits, and stays 403
// for the tenant-admin; 16 concurrent creates at quota-1 through leader and follower make
// exactly one policy.
func TestTenantQuotas(t *testing.T) {
	const tT1, tT2 = "t1-admin-token-0123456789", "t2-admin-token-0123456789"
	sec := newSecureEnv(t, fmt.Sprintf("%s admin alice\n%s read-only scraper\n%s agent docker\n%s tenant-admin:t1 bob\n%s tenant-admin:t2 carol\n%s netmaster peers\n",
		tAdmin, tRO, tAgent, tT1, tT2, tPeer))
	sec.flags = append(sec.flags, "--quota-networks", "3", "--quota-policies", "6")
	etcdURL := statetest.Etcd(t)
	ps := sec.start(t, etcdURL, "nm-a", "nm-b")
	admin, ro, agent, t1, t2 := sec.client(t, tAdmin), sec.client(t, tRO), sec.client(t, tAgent), sec.client(t, tT1), sec.client(t, tT2)
	leader, follower := secureLeader(t, admin, ps)
	for _, tn := range []string{"t1", "t2"} {
		admin.must(t, "POST", leader.url+"/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, 200)
	}
	rev := etcdRevision(t, etcdURL)
	for i, via := range []*proc{leader, follower, leader} {
		t1.must(t, "POST", via.url+fmt.Sprintf("/api/v1/networks/t1:n%d/", i), netBodyIn("t1", fmt.Sprintf("n%d", i), 81, i), 200)
	}
	refused := func(c *apiClient, via *proc, path, body, want string) {
		t.Helper()
		before := rev()
		st, out := c.call(t, "POST", via.url+path, body)
		if st != 403 || !strings.Contains(out, want) {
			t.Errorf("POST %s via %s: %d %s, want 403 with %q", path, via.name, st, out, want)
		}
		if rev() != before {
			t.Errorf("POST %s refused but etcd changed", path)
		}
	}
	for _, via := range []*proc{leader, follower} {
		refused(t1, via, "/api/v1/networks/t1:n3/", netBodyIn("t1", "n3", 81, 3), `tenant \"t1\": networks quota exceeded: limit 3, 3 in use`)
		refused(agent, via, "/api/v1/networks/t1:docker/", netBodyIn("t1", "docker", 81, 9), "networks quota exceeded: limit 3")
	}
	t2.must(t, "POST", follower.url+"/api/v1/networks/t2:n0/", netBodyIn("t2", "n0", 82, 0), 200)

	// Who reads and sets quotas.
	q := t1.quota(t, follower.url+"/api/v1/quotas/t1/")
	if q.Usage[model.QuotaNetworks] != 3 || q.Limits[model.QuotaNetworks] != 3 || q.Limits[model.QuotaPolicies] != 6 || q.Usage[model.QuotaBytes] == 0 {
		t.Errorf("t1's own quota: %+v", q)
	}
	if _, out := t1.call(t, "GET", leader.url+"/api/v1/quotas/", ""); strings.Contains(out, `"t2"`) || !strings.Contains(out, `"t1"`) {
		t.Errorf("t1's quota list: %s", out)
	}
	for _, rq := range []struct {
		c            *apiClient
		method, path string
		want         int
	}{
		{t1, "GET", "/api/v1/quotas/t2/", 403},
		{t1, "PUT", "/api/v1/quotas/t1/", 403},
		{t1, "DELETE", "/api/v1/quotas/t1/", 403},
		{t2, "GET", "/api/v1/quotas/t1/", 403},
		{agent, "PUT", "/api/v1/quotas/t1/", 403},
		{ro, "PUT", "/api/v1/quotas/t1/", 403},
		{ro, "GET", "/api/v1/quotas/t1/", 200},
		{agent, "GET", "/api/v1/quotas/t2/", 200},
	} {
		for _, via := range []*proc{leader, follower} {
			before := rev()
			st, out := rq.c.call(t, rq.method, via.url+rq.path, `{"networks":100}`)
			if st != rq.want || (st == 403 && strings.Contains(out, `"usage"`)) {
				t.Errorf("%s %s via %s: %d %s, want %d", rq.method, rq.path, via.name, st, out, rq.want)
			}
			if st == 403 && rev() != before {
				t.Errorf("%s %s refused but etcd changed", rq.method, rq.path)
			}
		}
	}

	// The admin raises, then lowers below usage: creates refused, deletes pass.
	admin.must(t, "PUT", follower.url+"/api/v1/quotas/t1/", `{"networks":5}`, 200)
	for i := 3; i < 5; i++ {
		t1.must(t, "POST", leader.url+fmt.Sprintf("/api/v1/networks/t1:n%d/", i), netBodyIn("t1", fmt.Sprintf("n%d", i), 81, i), 200)
	}
	refused(t1, leader, "/api/v1/networks/t1:n5/", netBodyIn("t1", "n5", 81, 5), "networks quota exceeded: limit 5, 5 in use")
	admin.must(t, "PUT", leader.url+"/api/v1/quotas/t1/", `{"networks":2}`, 200)
	refused(t1, follower, "/api/v1/networks/t1:n5/", netBodyIn("t1", "n5", 81, 5), "networks quota exceeded: limit 2, 5 in use")
	t1.must(t, "DELETE", follower.url+"/api/v1/networks/t1:n4/", "", 200)
	t2.must(t, "POST", leader.url+"/api/v1/networks/t2:n1/", netBodyIn("t2", "n1", 82, 1), 200)

	// /metrics: the admin's and operators' view of every tenant; 403 for a tenant-admin.
	_, m := ro.call(t, "GET", follower.url+"/metrics", "")
	for _, want := range []string{`contiv_netmaster_tenant_usage{kind="networks",tenant="t1"} 4`, `contiv_netmaster_tenant_quota{kind="networks",tenant="t1"} 2`,
		`contiv_netmaster_tenant_usage{kind="networks",tenant="t2"} 2`, `contiv_netmaster_tenant_quota{kind="policies",tenant="t2"} 6`,
		`contiv_netmaster_tenant_usage{kind="bytes",tenant="t1"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if _, m := ro.call(t, "GET", leader.url+"/metrics", ""); !strings.Contains(m, `contiv_netmaster_quota_refused_total{kind="networks",tenant="t1"}`) {
		t.Errorf("the leader's /metrics lacks the refusals")
	}
	t1.must(t, "GET", leader.url+"/metrics", "", 403)

	// 16 concurrent creates at quota-1, through both netmasters: one wins.
	for i := 0; i < 5; i++ {
		t2.must(t, "POST", leader.url+fmt.Sprintf("/api/v1/policys/t2:p%d/", i), fmt.Sprintf(`{"policyName":"p%d","tenantName":"t2"}`, i), 200)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := 0; i < 16; i++ {
		via := ps[i%2]
		wg.Go(func() {
			st, _ := t2.call(t, "POST", via.url+fmt.Sprintf("/api/v1/policys/t2:r%d/", i), fmt.Sprintf(`{"policyName":"r%d","tenantName":"t2"}`, i))
			mu.Lock()
			codes[st]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[200] != 1 || codes[403] != 15 {
		t.Errorf("16 racing creates at quota-1: statuses %v, want one 200 and 15 403", codes)
	}
	if q := admin.quota(t, leader.url+"/api/v1/quotas/t2/"); q.Usage[model.QuotaPolicies] != 6 {
		t.Errorf("t2 after the race: %+v", q.Usage)
	}
}

// TestQuotaRestart (issue 34, item 2) runs netmaster with --insecure (no tokens: the
// anonymous caller, whoever it is, is held to the quotas) and a default of 2 networks: a
// tenant at its limit is refused; after a restart with its usage record lost, the usage is
// recounted at start, the limit an admin set stays, and the limits still hold.
func TestQuotaRestart(t *testing.T) {
	etcdURL := statetest.Etcd(t)
	flags := []string{"--quota-networks", "2"}
	nm := startNetmaster(t, "nm-1", etcdURL, flags...)
	leaderOf(t, []*proc{nm}, 20*time.Second)
	mustCall(t, "POST", nm.url+"/api/v1/tenants/t1/", `{"tenantName":"t1"}`, 200)
	for i := 0; i < 2; i++ {
		mustCall(t, "POST", nm.url+fmt.Sprintf("/api/v1/networks/t1:n%d/", i), netBodyIn("t1", fmt.Sprintf("n%d", i), 83, i), 200)
	}
	if st, body, _ := call("POST", nm.url+"/api/v1/networks/t1:n2/", netBodyIn("t1", "n2", 83, 2)); st != 403 || !strings.Contains(body, "networks quota exceeded: limit 2") {
		t.Fatalf("third network with --insecure: %d %s", st, body)
	}
	mustCall(t, "PUT", nm.url+"/api/v1/quotas/t1/", `{"policies":1}`, 200)
	before := quotaOf(t, mustCall(t, "GET", nm.url+"/api/v1/quotas/t1/", "", 200))

	nm.kill()
	raw := rawEtcd(t, etcdURL)
	if _, err := raw.Delete(context.Background(), model.QuotaUsageKey("t1")); err != nil {
		t.Fatal(err)
	}
	nm = startNetmaster(t, "nm-2", etcdURL, flags...)
	leaderOf(t, []*proc{nm}, 30*time.Second) // (once the killed one's lock expired)
	if r, err := raw.Get(context.Background(), model.QuotaUsageKey("t1")); err != nil || len(r.Kvs) == 0 {
		t.Fatalf("the lost usage record was not recounted at start: %v", err)
	}
	after := quotaOf(t, mustCall(t, "GET", nm.url+"/api/v1/quotas/t1/", "", 200))
	for _, k := range model.QuotaKinds() {
		if after.Usage[k] != before.Usage[k] || after.Limits[k] != before.Limits[k] {
			t.Errorf("after the restart %s: usage %d limit %d, before %d %d", k, after.Usage[k], after.Limits[k], before.Usage[k], before.Limits[k])
		}
	}
	if st, body, _ := call("POST", nm.url+"/api/v1/networks/t1:n2/", netBodyIn("t1", "n2", 83, 2)); st != 403 {
		t.Errorf("third network after the restart: %d %s", st, body)
	}
	mustCall(t, "POST", nm.url+"/api/v1/policys/t1:p1/", `{"policyName":"p1","tenantName":"t1"}`, 200)
	if st, body, _ := call("POST", nm.url+"/api/v1/policys/t1:p2/", `{"policyName":"p2","tenantName":"t1"}`); st != 403 || !strings.Contains(body, "policies quota exceeded: limit 1") {
		t.Errorf("second policy past the admin's limit: %d %s", st, body)
	}
}
