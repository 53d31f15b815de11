package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"time"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// Service upserts as the agent timed them (contiv_netplugin_driver_call_seconds).
var (
	svcUpsertSum   = regexp.MustCompile(`(?m)^contiv_netplugin_driver_call_seconds_sum\{object="service",verb="upsert"\} (\S+)$`)
	svcUpsertCount = regexp.MustCompile(`(?m)^contiv_netplugin_driver_call_seconds_count\{object="service",verb="upsert"\} (\S+)$`)
)

// scaleOVSServices measures what one service change costs the OVS backend when a host
// holds n services: one OVS host (real netplugin --dataplane=ovs, private OVS), three
// labelled containers, n services selecting them (3 backends each), created through
// netmaster's REST API. Figures, from the agent's own timing of its driver calls: the
// mean upsert of the last tenth of the creates (made one at a time), and the mean upsert when a fourth
// container with the label gives every service a new backend (n upserts in a burst),
// with the time until the agent applied them all.
func scaleOVSServices(ctx context.Context, cfg config, w io.Writer, r *report, n int) error {
	fmt.Fprintf(w, "\n#### scale (ovs): service changes with %d services on one host\n", n)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + "o", Hosts: 1, BinDir: cfg.bin, Dataplane: "ovs", Logger: quiet})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the ovs scale cluster: %v\n", err)
		}
	}()
	h := c.Hosts[0]
	const net, vips = "ovsb", "ovsvips"
	if err := c.CreateNetwork(ctx, "default", net, "vxlan", "10.151.0.0/24", "10.151.0.1"); err != nil {
		return err
	}
	if err := c.CreateNetwork(ctx, "default", vips, "vxlan", "10.152.0.0/16", "10.152.0.1"); err != nil {
		return err
	}
	label := func(ct *sim.Container) error {
		return c.MasterDo(ctx, "POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ct.IP.Addr().String(),
			ContainerID: ct.ID, Tenant: "default", Network: net, Event: "start", Labels: map[string]string{"app": "ovsscale"}}, nil)
	}
	for i := range 3 {
		ct, err := c.AddContainer(ctx, h, fmt.Sprintf("b%d", i), "default", net)
		if err != nil {
			return err
		}
		if err := label(ct); err != nil {
			return err
		}
	}
	create := func(ctx context.Context, i int) error {
		name := fmt.Sprintf("o%d", i)
		return c.MasterDo(ctx, "POST", "/api/v1/serviceLBs/default:"+name+"/", map[string]any{"tenantName": "default", "networkName": vips,
			"serviceName": name, "ipAddress": fmt.Sprintf("10.152.%d.%d", 1+i/250, 2+i%250), "selectors": []string{"app=ovsscale"},
			"ports": []string{"80:8080:TCP"}}, nil)
	}
	upserts := func() (sum, count float64) {
		return metricValue(ctx, h, svcUpsertSum), metricValue(ctx, h, svcUpsertCount)
	}
	head := n - n/10
	t0 := time.Now()
	if err := createConcurrently(ctx, 0, head, 8, create); err != nil {
		return fmt.Errorf("%d services: %w", head, err)
	}
	if err := waitAppliedServices(ctx, h, head, 10*time.Minute); err != nil {
		return err
	}
	s0, n0 := upserts()
	// The measured tenth one at a time: the figure is the backend's cost, not the two
	// cores shared with netmaster and etcd creating at full speed.
	if err := createConcurrently(ctx, head, n, 1, create); err != nil {
		return fmt.Errorf("%d services: %w", n, err)
	}
	if err := waitAppliedServices(ctx, h, n, 10*time.Minute); err != nil {
		return err
	}
	s1, n1 := upserts()
	fmt.Fprintf(w, "%d services created and applied in %.1fs\n", n, time.Since(t0).Seconds())
	if n1 <= n0 || s0 < 0 {
		return fmt.Errorf("the agent timed no service upserts (count %v → %v)", n0, n1)
	}
	createMs := (s1 - s0) / (n1 - n0) * 1000
	// Every service gains a backend: n upserts in one burst.
	t1 := time.Now()
	ct, err := c.AddContainer(ctx, h, "b3", "default", net)
	if err != nil {
		return err
	}
	if err := label(ct); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	var s2, n2 float64
	for {
		if s2, n2 = upserts(); n2-n1 >= float64(n) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("backend added: the agent applied %.0f of %d service updates", n2-n1, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	burst := time.Since(t1)
	addMs := (s2 - s1) / (n2 - n1) * 1000
	table(w, fmt.Sprintf("ovs: one service change with %d services installed (the agent's driver call time)", n),
		[]string{"change", "ms per change"},
		[][]string{{fmt.Sprintf("create (last %d)", n-head), fmt.Sprintf("%.2f", createMs)},
			{fmt.Sprintf("backend added to all %d (burst applied in %.1fs)", n, burst.Seconds()), fmt.Sprintf("%.2f", addMs)}})
	lbl := stepLabel(n)
	r.add("scale.ovs_service_create_ms_"+lbl, round2(createMs), "ms")
	r.add("scale.ovs_backend_add_ms_"+lbl, round2(addMs), "ms")
	r.add("scale.ovs_backend_add_burst_s_"+lbl, round2(burst.Seconds()), "s")
	return nil
}
