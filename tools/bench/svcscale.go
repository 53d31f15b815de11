package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// svcscaleStage measures new connections/s through a service VIP while the number of
// installed services grows (1, 1,000, 10,000 by default), alternating round by round
// with kube-proxy's iptables mode on a router of the Masquerade shape holding the same
// number of services (netbench.KubeProxy). One simulated eBPF host: client a, server b
// (label app=crr, the backend of the measured service); the services come through
// netmaster's REST API and are counted applied from the agent's contiv_netplugin_services
// gauge.
// Each round also times a→b directly: the VIP figures divided by it are what is compared
// across steps, so the machine drifting between steps does not look like a scale cost.
func svcscaleStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	fmt.Fprintf(w, "\n#### svcscale (ebpf): new connections through a VIP with %v services installed\n", cfg.svcSteps)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + "v", Hosts: 1, BinDir: cfg.bin, Dataplane: "ebpf", Logger: quiet})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the svcscale cluster: %v\n", err)
		}
	}()
	const svcNet, svcSubnet, svcGW = "svc-net", "10.130.0.0/24", "10.130.0.1"
	if err := c.CreateNetwork(ctx, "default", benchNet, "vxlan", benchSubnet, benchGW); err != nil {
		return err
	}
	if err := c.CreateNetwork(ctx, "default", svcNet, "vxlan", svcSubnet, svcGW); err != nil {
		return err
	}
	h1 := c.Hosts[0]
	a, err := c.AddContainer(ctx, h1, "a", "default", benchNet)
	if err != nil {
		return err
	}
	b, err := c.AddContainer(ctx, h1, "b", "default", benchNet)
	if err != nil {
		return err
	}
	if err := c.MasterDo(ctx, "POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: b.IP.Addr().String(),
		ContainerID: b.ID, Tenant: "default", Network: benchNet, Event: "start", Labels: map[string]string{"app": "crr"}}, nil); err != nil {
		return err
	}
	srv, err := netbench.StartServer(netbench.NSPath(b.Name), fmt.Sprintf("%s:%d", b.IP.Addr(), echoPort))
	if err != nil {
		return err
	}
	defer srv.Close()
	mtu, err := ipMTU(ctx, a.Name)
	if err != nil {
		return err
	}
	kp, err := netbench.NewKubeProxy(c.Prefix+"k", mtu, 80, echoPort)
	if err != nil {
		return err
	}
	defer kp.Close()
	ksrv, err := netbench.StartServer(netbench.NSPath(kp.Namespaces[3]), fmt.Sprintf("%s:%d", netbench.MasqServerIP, echoPort))
	if err != nil {
		return err
	}
	defer ksrv.Close()

	// The measured service "crr" (tenant default, VIP 10.130.0.100) and n-1 others
	// (svcFills); every service is installed on every host all the same.
	const target = "10.130.0.100"
	if err := c.MasterDo(ctx, "POST", "/api/v1/serviceLBs/default:crr/", map[string]any{"tenantName": "default", "networkName": svcNet,
		"serviceName": "crr", "ipAddress": target, "selectors": []string{"app=crr"}, "ports": []string{fmt.Sprintf("80:%d:TCP", echoPort)}}, nil); err != nil {
		return err
	}
	fills := &svcFills{c: c, port: fmt.Sprintf("80:%d:TCP", echoPort)}
	have := 1 // crr
	testDial, baseDial := netbench.NewDialer(netbench.NSPath(a.Name)), netbench.NewDialer(netbench.NSPath(kp.Namespaces[0]))
	var firstNorm float64
	for _, n := range cfg.svcSteps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		label := stepLabel(n)
		// For iptables the measured service sits in the middle of the chain: half the
		// rules scanned, kube-proxy's average (for eBPF the position means nothing).
		cpu0, err := cpbench.ProcessCPU(h1.Plugin.PID())
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := fills.ensureTenants(ctx, n-1); err != nil {
			return fmt.Errorf("%d services: tenants: %w", n, err)
		}
		if err := createConcurrently(ctx, have-1, n-1, 8, fills.create); err != nil {
			return fmt.Errorf("%d services: %w", n, err)
		}
		created := time.Since(t0)
		if err := waitAppliedServices(ctx, h1, n, 10*time.Minute); err != nil {
			return fmt.Errorf("%d services: %w", n, err)
		}
		applied := time.Since(t0)
		cpu1, err := cpbench.ProcessCPU(h1.Plugin.PID())
		if err != nil {
			return err
		}
		added := n - have
		have = n
		t1 := time.Now()
		if err := kp.SetServices(n); err != nil {
			return err
		}
		iptLoad := time.Since(t1)
		test := target + ":80"
		base := netbench.KubeProxyVIP(n/2) + ":80"
		direct := fmt.Sprintf("%s:%d", b.IP.Addr(), echoPort)
		if err := waitCRR(ctx, testDial, test); err != nil {
			return fmt.Errorf("%d services: VIP %s: %w", n, test, err)
		}
		if err := waitCRR(ctx, baseDial, base); err != nil {
			return fmt.Errorf("%d services: kube-proxy VIP %s: %w", n, base, err)
		}
		var vipR, dirR, iptR, vsIpt, norm []float64
		for i := 0; i < cfg.crrRounds; i++ {
			paths := []struct {
				d    *netbench.Dialer
				addr string
				out  *float64
			}{{testDial, test, nil}, {baseDial, base, nil}, {testDial, direct, nil}}
			var v [3]float64
			for j := range paths {
				paths[j].out = &v[j]
			}
			if i%2 == 1 { // alternate the order round by round
				paths[0], paths[1] = paths[1], paths[0]
			}
			for _, p := range paths {
				x, err := netbench.CRR(ctx, p.d, p.addr, cfg.crrTime)
				if err != nil {
					return fmt.Errorf("%d services: crr %s: %w", n, p.addr, err)
				}
				*p.out = x
			}
			vipR, iptR, dirR = append(vipR, v[0]), append(iptR, v[1]), append(dirR, v[2])
			vsIpt, norm = append(vsIpt, ratio(v[0], v[1])), append(norm, ratio(v[0], v[2]))
		}
		r.add("svcscale.crr_"+label, math.Round(median(vipR)), "conn/s")
		r.add("svcscale.crr_iptables_"+label, math.Round(median(iptR)), "conn/s")
		r.add("svcscale.crr_direct_"+label, math.Round(median(dirR)), "conn/s")
		r.add("svcscale.crr_"+label+"_vs_iptables", round3(median(vsIpt)), "ratio")
		r.add("svcscale.crr_"+label+"_vs_direct", round3(median(norm)), "ratio")
		if added > 0 {
			r.add("svcscale.apply_"+label+"_s", round1(applied.Seconds()), "s")
			r.add("svcscale.agent_cpu_ms_per_svc_"+label, round2(float64((cpu1-cpu0).Microseconds())/1000/float64(added)), "ms")
		}
		table(w, fmt.Sprintf("svcscale: %d services (%d added through REST in %.1fs, applied by the agent after %.1fs using %.1fs CPU; iptables-restore of %d services %.2fs), new TCP connections/s, %d alternating rounds",
			n, added, created.Seconds(), applied.Seconds(), (cpu1-cpu0).Seconds(), n, iptLoad.Seconds(), cfg.crrRounds),
			[]string{"path", "conn/s", "vs iptables", "vs direct a→b"},
			[][]string{
				{"ebpf VIP", fmt.Sprintf("%.0f", median(vipR)), fmt.Sprintf("%.3f", median(vsIpt)), fmt.Sprintf("%.3f", median(norm))},
				{"kube-proxy iptables VIP", fmt.Sprintf("%.0f", median(iptR)), "1", ""},
				{"ebpf direct a→b", fmt.Sprintf("%.0f", median(dirR)), "", "1"},
			})
		if firstNorm == 0 {
			firstNorm = median(norm)
			continue
		}
		if n == cfg.svcSteps[len(cfg.svcSteps)-1] {
			first := stepLabel(cfg.svcSteps[0])
			r.add(fmt.Sprintf("svcscale.crr_%s_vs_%s", label, first), round3(median(norm)/firstNorm), "ratio")
		}
	}
	return nil
}

// svcFills creates services in tenants of 100 (svt<k>, each with a network "vips",
// 10.140.0.0/24 + k) whose selector matches nothing there (no backend). Contiv's object
// model keeps every service's link in its tenant and network objects, so one tenant with
// 10,000 services makes each create rewrite ~1 MB (netmaster then creates ~14/s and its
// etcd history grows by gigabytes); a cluster of that size has many tenants anyway.
type svcFills struct {
	c       *sim.Cluster
	port    string // "svcPort:targetPort:proto" of every service
	tenants int    // created so far
}

const svcsPerTenant = 100

// vip is the tenant and VIP of service i.
func (f *svcFills) vip(i int) (tenant, vip string) {
	k := i / svcsPerTenant
	return fmt.Sprintf("svt%d", k), fmt.Sprintf("10.%d.%d.%d", 140+k/256, k%256, 2+i%svcsPerTenant)
}

// ensureTenants creates the tenants and networks services 0..n-1 need.
func (f *svcFills) ensureTenants(ctx context.Context, n int) error {
	for ; f.tenants*svcsPerTenant < n; f.tenants++ {
		name := fmt.Sprintf("svt%d", f.tenants)
		if err := f.c.MasterDo(ctx, "POST", "/api/v1/tenants/"+name+"/", map[string]any{"tenantName": name}, nil); err != nil {
			return err
		}
		_, vip := f.vip(f.tenants * svcsPerTenant)
		subnet := vip[:strings.LastIndexByte(vip, '.')] + ".0/24"
		if err := f.c.CreateNetwork(ctx, name, "vips", "vxlan", subnet, strings.TrimSuffix(subnet, "0/24")+"1"); err != nil {
			return err
		}
	}
	return nil
}

// create creates service i (its tenant must exist).
func (f *svcFills) create(ctx context.Context, i int) error {
	tenant, vip := f.vip(i)
	name := fmt.Sprintf("s%d", i)
	return f.c.MasterDo(ctx, "POST", "/api/v1/serviceLBs/"+tenant+":"+name+"/", map[string]any{"tenantName": tenant, "networkName": "vips",
		"serviceName": name, "ipAddress": vip, "selectors": []string{"app=crr"}, "ports": []string{f.port}}, nil)
}

// stepLabel names a service count in figure names: 1, 1k, 10k, 2500.
func stepLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// createConcurrently calls create(i) for i in from..to-1 from `workers` goroutines; the
// first error stops the rest.
func createConcurrently(ctx context.Context, from, to, workers int, create func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := create(ctx, i); err != nil {
					once.Do(func() { first = fmt.Errorf("object %d: %w", i, err); cancel() })
				}
			}
		}()
	}
	for i := from; i < to && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

var servicesGauge = regexp.MustCompile(`(?m)^contiv_netplugin_services (\S+)$`)

var failingGauge = regexp.MustCompile(`(?m)^contiv_netplugin_failing_objects (\S+)$`)

// waitAppliedServices polls h's contiv_netplugin_services (a count, not a dump) every
// 100 ms until it reaches n; it gives up after d, or after 30 s without progress (the
// agent's failing objects are then in the error: a full map, a refused service).
func waitAppliedServices(ctx context.Context, h *sim.Host, n int, d time.Duration) error {
	deadline := time.Now().Add(d)
	last, progress := -1.0, time.Now()
	for {
		got := metricValue(ctx, h, servicesGauge)
		if int(got) >= n {
			return nil
		}
		if got != last {
			last, progress = got, time.Now()
		}
		if time.Now().After(deadline) || time.Since(progress) > 30*time.Second || ctx.Err() != nil {
			return fmt.Errorf("the agent applied %.0f of %d services (%.0f failing objects, see its /healthz)", got, n, metricValue(ctx, h, failingGauge))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCRR retries one short connection-rate probe until addr answers (rules propagate).
func waitCRR(ctx context.Context, d *netbench.Dialer, addr string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := netbench.CRR(ctx, d, addr, 100*time.Millisecond)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
