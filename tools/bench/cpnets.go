package main

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
)

// cpNetworksStage measures cp.create_10k_networks_s: 100 tenants of 100 VXLAN networks
// each created through netmaster at url (8 clients at once, tenants interleaved), and
// cp.create_10k_networks_end_vs_start, the rate of the last 1,000 creates against the
// first 1,000's (goal: completes, >= 0.5). Before the subnet index every create listed
// every network of the cluster, and before local VLANs could run out the 4,095th VXLAN
// network was refused. The global VXLAN range is widened to 1-16000 (its largest width)
// first.
func cpNetworksStage(ctx context.Context, client *http.Client, url string, w io.Writer, r *report) error {
	const tenants, perTenant, workers, window = 100, 100, 8, 1000
	// The default VXLAN range (1-10000) leaves no room beside the other stages' networks.
	if err := cpbench.SetVXLANs(ctx, client, url, "1-16000"); err != nil {
		return err
	}
	if err := cpbench.CreateTenants(ctx, client, url, "bn", tenants); err != nil {
		return err
	}
	res, err := cpbench.Networks(ctx, cpbench.NetworksOptions{URL: url, Tenants: tenants, PerTenant: perTenant,
		TenantPrefix: "bn", Workers: workers, Window: window, ClientFor: func(int) *http.Client { return client }})
	if err != nil {
		return err
	}
	all, startRate, endRate := res.Elapsed.Seconds(), res.StartRate, res.EndRate
	table(w, "control plane: 100 tenants x 100 VXLAN networks (8 clients)", []string{"what", "value"}, [][]string{
		{"total seconds", fmt.Sprintf("%.1f", all)},
		{"creates/s, first 1,000", fmt.Sprintf("%.0f", startRate)},
		{"creates/s, last 1,000", fmt.Sprintf("%.0f", endRate)}})
	r.add("cp.create_10k_networks_s", round1(all), "s")
	r.add("cp.create_10k_networks_end_vs_start", round2(endRate/startRate), "ratio")
	return nil
}
