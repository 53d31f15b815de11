package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestTenThousandNetworks (issue 34, item 3: "10,000 networks across 100 tenants must
// fit") runs one netmaster on its embedded etcd with --insecure --auth-tokens. An admin
// widens the global VXLAN range to 1-16000 and gives each of 100 tenants a VXLAN range of
// 100 ids; each tenant's tenant-admin token then creates its 100 networks through the REST
// API, 12 creates in flight, tenants interleaved (cpbench.Networks, the bench stage
// cp.create_10k_networks_s). Every create must succeed, netmaster's CPU time per create
// (utime+stime from /proc, its embedded etcd's included) over the last 1,000 creates be at
// most maxCPUGrowth times the first 1,000's (the rates, which other work on the machine
// moves, are only logged: issue 34's goal, the end's rate at least half the start's, is
// CPU per create at most doubled, and the margin below that catches a doubling on a
// loaded machine), every tenant's VNIs lie in its range (no VNI or host-local
// VLAN held twice) and its usage count 100 networks within its limit; a 101st tenant
// without a range, created after them, still gets its networks, with VNIs outside every
// range (the pools are not exhausted). Before the subnet index every create listed every
// network, and before local VLANs could run out the 4,095th VXLAN network was refused.
func TestTenThousandNetworks(t *testing.T) {
	const maxCPUGrowth = 1.5
	const tenants, perTenant, workers, late = 100, 100, 12, 10
	tokenOf := func(i int) string { return fmt.Sprintf("tt%03d-tenant-admin-token-0123456789", i) }
	var lines strings.Builder
	fmt.Fprintf(&lines, "%s admin alice\n", tAdmin)
	for i := 0; i <= tenants; i++ {
		fmt.Fprintf(&lines, "%s tenant-admin:tt%d tt%d\n", tokenOf(i), i, i)
	}
	env := newPlainEnv(t, lines.String())
	p, cli, _ := embeddedNetmaster(t, "nm-10k", env.flags...)
	admin := env.client(t, tAdmin)
	waitLeader(t, admin, p)

	ctx := ctxT(t, 5*time.Minute)
	tr := &http.Transport{MaxIdleConnsPerHost: 2 * workers}
	clientOf := func(i int) *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: auth.Bearer(tokenOf(i), tr)}
	}
	adminHC := clientOf(0)
	adminHC.Transport = auth.Bearer(tAdmin, tr)
	if err := cpbench.SetVXLANs(ctx, adminHC, p.url, "1-16000"); err != nil {
		t.Fatal(err)
	}
	if err := cpbench.CreateTenants(ctx, adminHC, p.url, "tt", tenants); err != nil {
		t.Fatal(err)
	}
	rangeOf := func(i int) (lo, hi int) { return 1 + perTenant*i, perTenant * (i + 1) }
	for i := range tenants {
		lo, hi := rangeOf(i)
		admin.must(t, "PUT", fmt.Sprintf("%s/api/v1/quotas/tt%d/", p.url, i), fmt.Sprintf(`{"vxlans":"%d-%d"}`, lo, hi), 200)
	}

	clients := make([]*http.Client, tenants)
	for i := range clients {
		clients[i] = clientOf(i)
	}
	res, err := cpbench.Networks(ctx, cpbench.NetworksOptions{URL: p.url, Tenants: tenants, PerTenant: perTenant,
		TenantPrefix: "tt", Workers: workers, Window: 1000, ClientFor: func(i int) *http.Client { return clients[i] },
		CPU: func() (time.Duration, error) { return cpbench.ProcessCPU(p.cmd.Process.Pid) }})
	t.Logf("%d networks in %s (%d creates in flight): %.0f creates/s over the first 1,000, %.0f over the last 1,000 (%.2f); netmaster's CPU per create %s then %s (%.2f)",
		res.Created, res.Elapsed.Round(100*time.Millisecond), workers, res.StartRate, res.EndRate, res.EndRate/max(res.StartRate, 1e-9),
		res.StartCPU.Round(10*time.Microsecond), res.EndCPU.Round(10*time.Microsecond), float64(res.EndCPU)/float64(max(res.StartCPU, 1)))
	if err != nil {
		t.Fatalf("after %d of %d creates: %v", res.Created, tenants*perTenant, err)
	}
	// Judged by netmaster's own CPU per create (its embedded etcd's included), which other
	// work on the machine does not move as it moves the rates (those are only logged).
	if res.StartCPU <= 0 || float64(res.EndCPU) > maxCPUGrowth*float64(res.StartCPU) {
		t.Errorf("netmaster's CPU per create grew from %s over the first 1,000 creates to %s over the last 1,000: more than %.1f times",
			res.StartCPU, res.EndCPU, maxCPUGrowth)
	}

	// A tenant created after them, without a range, still gets networks: outside every range.
	lateTenant := fmt.Sprintf("tt%d", tenants)
	admin.must(t, "POST", p.url+"/api/v1/tenants/"+lateTenant+"/", `{"tenantName":"`+lateTenant+`"}`, 200)
	lateC := env.client(t, tokenOf(tenants))
	for n := range late {
		lateC.must(t, "POST", p.url+"/api/v1/networks/"+lateTenant+":"+cpbench.NetworkName(n)+"/",
			fmt.Sprintf(`{"tenantName":%q,"networkName":%q,"encap":"vxlan","subnet":%q}`, lateTenant, cpbench.NetworkName(n), cpbench.NetworkSubnet(tenants, n)), 200)
	}

	// Every VNI in its tenant's range (the late tenant's beyond all ranges), none twice.
	nets := networkStates(ctx, t, cli)
	if len(nets) != tenants*perTenant+late {
		t.Errorf("%d network records, want %d", len(nets), tenants*perTenant+late)
	}
	vnis, locals := map[int]string{}, map[int]string{}
	perTenantSeen := map[string]int{}
	for _, n := range nets {
		var i int
		if _, err := fmt.Sscanf(n.Tenant, "tt%d", &i); err != nil {
			t.Errorf("network %s of an unknown tenant %q", n.ID, n.Tenant)
			continue
		}
		perTenantSeen[n.Tenant]++
		lo, hi := rangeOf(i)
		if i == tenants {
			lo, hi = perTenant*tenants+1, 16000
		}
		if n.ExtPktTag < lo || n.ExtPktTag > hi {
			t.Errorf("network %s: VNI %d outside %d-%d", n.ID, n.ExtPktTag, lo, hi)
		}
		if other, dup := vnis[n.ExtPktTag]; dup {
			t.Errorf("VNI %d held by %s and %s", n.ExtPktTag, other, n.ID)
		}
		vnis[n.ExtPktTag] = n.ID
		if other, dup := locals[n.PktTag]; dup && n.PktTag != 0 {
			t.Errorf("host-local VLAN %d held by %s and %s", n.PktTag, other, n.ID)
		}
		locals[n.PktTag] = n.ID
	}
	for i := 0; i <= tenants; i++ {
		want := perTenant
		if i == tenants {
			want = late
		}
		tn := fmt.Sprintf("tt%d", i)
		if perTenantSeen[tn] != want {
			t.Errorf("tenant %s holds %d networks, want %d", tn, perTenantSeen[tn], want)
		}
		q := admin.quota(t, p.url+"/api/v1/quotas/"+tn+"/")
		if q.Usage[model.QuotaNetworks] != int64(want) || q.Usage[model.QuotaNetworks] > q.Limits[model.QuotaNetworks] {
			t.Errorf("tenant %s's quota: %d networks in use of %d, want %d", tn, q.Usage[model.QuotaNetworks], q.Limits[model.QuotaNetworks], want)
		}
	}
}

// networkStates reads every network's state record (its VNI and host-local VLAN) from etcd.
func networkStates(ctx context.Context, t *testing.T, cli *clientv3.Client) []model.CfgNetworkState {
	t.Helper()
	resp, err := cli.Get(ctx, model.NetStatePrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]model.CfgNetworkState, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var n model.CfgNetworkState
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			t.Fatalf("%s: %v", kv.Key, err)
		}
		out = append(out, n)
	}
	return out
}
