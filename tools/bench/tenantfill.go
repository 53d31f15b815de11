package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// tenantFillKind is one kind of object the tenant-fill stage creates up to its quota.
type tenantFillKind struct {
	name  string
	count int
	path  func(i int) string
	body  func(i int) string
}

// tenantFillKinds are what one tenant creates: every default count but endpoints
// (master.DefaultQuota), its 1,000 rules in one policy attached to a group.
func tenantFillKinds(tenant string) []tenantFillKind {
	q := master.DefaultQuota()
	return []tenantFillKind{
		{"networks", int(q[model.QuotaNetworks]), func(i int) string { return fmt.Sprintf("networks/%s:n%d", tenant, i) },
			func(i int) string {
				return fmt.Sprintf(`{"tenantName":%q,"networkName":"n%d","encap":"vxlan","subnet":"10.%d.%d.0/24"}`, tenant, i, 1+i/250, i%250)
			}},
		{"policies", int(q[model.QuotaPolicies]), func(i int) string { return fmt.Sprintf("policys/%s:p%d", tenant, i) },
			func(i int) string { return fmt.Sprintf(`{"tenantName":%q,"policyName":"p%d"}`, tenant, i) }},
		{"endpointGroups", int(q[model.QuotaEndpointGroups]), func(i int) string { return fmt.Sprintf("endpointGroups/%s:g%d", tenant, i) },
			func(i int) string {
				return fmt.Sprintf(`{"tenantName":%q,"groupName":"g%d","networkName":"n%d","policies":["p%d"]}`, tenant, i, i%500, i%500)
			}},
		{"rules", int(q[model.QuotaRules]), func(i int) string { return fmt.Sprintf("rules/%s:p0:%d", tenant, i) },
			func(i int) string {
				return fmt.Sprintf(`{"tenantName":%q,"policyName":"p0","ruleId":"%d","direction":"in","action":"allow","fromEndpointGroup":"g1","protocol":"tcp","port":%d}`,
					tenant, i, 1+i%65535)
			}},
		{"serviceLBs", int(q[model.QuotaServices]), func(i int) string { return fmt.Sprintf("serviceLBs/%s:s%d", tenant, i) },
			func(i int) string {
				return fmt.Sprintf(`{"tenantName":%q,"serviceName":"s%d","networkName":"n%d","ports":["80:8080:TCP"],"selectors":["app=s%d"]}`, tenant, i, i%500, i)
			}},
		{"appProfiles", int(q[model.QuotaAppProfiles]), func(i int) string { return fmt.Sprintf("appProfiles/%s:a%d", tenant, i) },
			func(i int) string {
				return fmt.Sprintf(`{"tenantName":%q,"appProfileName":"a%d","endpointGroups":["g%d"]}`, tenant, i, i)
			}},
	}
}

// cpTenantFillStage measures cp.tenant_fill_etcd_mb (issue 34): one tenant creates objects
// up to its default quota (tenantFillKinds, 3,100 creates; one more of each kind must be
// refused with 403) through a netmaster running in this process, with netmaster's default
// quotas, on a private embedded etcd with etcd's default quota (2 GiB) and netmaster's
// auto-compaction (10,000 revisions). Every 50 of its creates another tenant creates a
// policy, which must succeed. Figures: etcd's file size after the fill (goal: below 10% of
// the etcd quota), the bytes the fill wrote into etcd's history (keys and values of every
// put, from the watch history), the other tenant's failed creates (goal 0), the seconds.
// Before link-sets were derived when read, each create rewrote its tenant's record (and a
// rule its policy's and group's) with every link: O(n^2) bytes.
func cpTenantFillStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	const etcdQuota = 2 << 30
	hs, store, stop, err := inProcessMaster(ctx, cfg.prefix+"tf-", etcdQuota,
		master.Config{FwdMode: "bridge", ClusterMode: "docker", Quota: master.DefaultQuota()})
	if err != nil {
		return err
	}
	defer stop()
	post := func(path, body string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/api/v1/"+path+"/", bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", master.ProblemJSON)
		resp, err := hs.Client().Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(out)), nil
	}
	for _, t := range []string{"fill", "other"} {
		if code, out, err := post("tenants/"+t, fmt.Sprintf(`{"tenantName":%q}`, t)); err != nil || code != http.StatusOK {
			return fmt.Errorf("create tenant %s: %d %s %v", t, code, out, err)
		}
	}
	if code, out, err := post("networks/other:n", `{"tenantName":"other","networkName":"n","encap":"vxlan","subnet":"10.200.0.0/24"}`); err != nil || code != http.StatusOK {
		return fmt.Errorf("create the other tenant's network: %d %s %v", code, out, err)
	}
	rev := func() (int64, error) {
		resp, err := store.Client().Get(ctx, "/contiv.io/none")
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	from, err := rev()
	if err != nil {
		return err
	}
	start := time.Now()
	creates, otherCreates, otherFailed := 0, 0, 0
	var otherErr string
	var rows [][]string
	for _, k := range tenantFillKinds("fill") {
		t0 := time.Now()
		for i := 0; i < k.count; i++ {
			if code, out, err := post(k.path(i), k.body(i)); err != nil || code != http.StatusOK {
				return fmt.Errorf("%s %d of %d: %d %s %v", k.name, i+1, k.count, code, out, err)
			}
			creates++
			if creates%50 == 0 {
				otherCreates++
				code, out, err := post(fmt.Sprintf("policys/other:p%d", otherCreates), fmt.Sprintf(`{"tenantName":"other","policyName":"p%d"}`, otherCreates))
				if err != nil || code != http.StatusOK {
					otherFailed++
					otherErr = fmt.Sprintf("%d %s %v", code, out, err)
				}
			}
		}
		secs := time.Since(t0).Seconds()
		code, out, err := post(k.path(k.count), k.body(k.count))
		if err != nil {
			return err
		}
		if code != http.StatusForbidden {
			return fmt.Errorf("%s past the default quota (%d): %d %s, want 403", k.name, k.count, code, out)
		}
		rows = append(rows, []string{k.name, fmt.Sprint(k.count), fmt.Sprintf("%.1f", secs), "403"})
	}
	all := time.Since(start).Seconds()
	to, err := rev()
	if err != nil {
		return err
	}
	h := store.Health(ctx)
	if !h.Reachable {
		return fmt.Errorf("etcd status after the fill: %v", h.Err)
	}
	dbMB := float64(h.DBSize) / (1 << 20)
	written := -1.0
	if puts, err := statetest.Puts(ctx, store.Client(), "/contiv.io/", from, to); err == nil {
		n := 0
		for _, p := range puts {
			n += p.Bytes
		}
		written = float64(n) / (1 << 20)
	} else {
		r.fail("cp.tenant_fill_written_mb", err)
	}
	rows = append(rows,
		[]string{"etcd file after (MB)", fmt.Sprintf("%.1f", dbMB), "", fmt.Sprintf("%.1f%% of %d MB", 100*dbMB/(etcdQuota>>20), etcdQuota>>20)},
		[]string{"written into etcd's history (MB)", fmt.Sprintf("%.1f", written), "", ""},
		[]string{"other tenant's creates failed", fmt.Sprintf("%d of %d", otherFailed, otherCreates), "", otherErr})
	table(w, fmt.Sprintf("control plane: one tenant fills its default quotas (%d creates in %.0f s), another keeps creating", creates, all),
		[]string{"kind", "created", "seconds", "next"}, rows)
	r.add("cp.tenant_fill_etcd_mb", round1(dbMB), "MB")
	if written >= 0 {
		r.add("cp.tenant_fill_written_mb", round1(written), "MB")
	}
	r.add("cp.tenant_fill_other_failed", float64(otherFailed), "count")
	r.add("cp.tenant_fill_s", round1(all), "s")
	return nil
}
