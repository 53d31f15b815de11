package main

import (
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
