package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// egressStage compares a container reaching the outside through the eBPF egress NAT
// (docs/host-routing.md) with the kernel's MASQUERADE on a router of the same shape
// (netbench.Masquerade): throughput, new connections/s, request/response latency. It runs
// its own one-host cluster with the simulation's external namespace.
func egressStage(ctx context.Context, cfg config, dp string, w io.Writer, r *report) error {
	if dp != "ebpf" {
		fmt.Fprintf(w, "\n(egress: the %s dataplane has no egress NAT yet; skipped)\n", dp)
		return nil
	}
	fmt.Fprintf(w, "\n#### egress (%s): one simulated host with the external namespace\n", dp)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + "e", Hosts: 1, BinDir: cfg.bin, Dataplane: dp, Logger: quiet, External: true,
		// The DNS figures measure the responder, not its per-endpoint rate limit.
		PluginArgs: func(*sim.Cluster, *sim.Host) []string { return []string{"--dns-rate", "1000000"} }})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the egress cluster: %v\n", err)
		}
	}()
	if err := c.CreateNetwork(ctx, "default", benchNet, "vxlan", benchSubnet, benchGW); err != nil {
		return err
	}
	a, err := c.AddContainer(ctx, c.Hosts[0], "a", "default", benchNet)
	if err != nil {
		return err
	}
	world := c.External.World.String()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := a.Exec(ctx, "ping", "-c", "1", "-W", "1", world)
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s cannot reach the outside %s: %v: %s", a.Name, world, err, out)
		}
	}
	mtu, err := ipMTU(ctx, a.Name)
	if err != nil {
		return err
	}
	topo, err := netbench.Masquerade(c.Prefix+"m", mtu)
	if err != nil {
		return err
	}
	defer topo.Close()
	base := &path{label: "kernel MASQUERADE", clientNS: topo.Namespaces[0], serverNS: topo.Namespaces[3], serverIP: netbench.MasqServerIP}
	test := &path{label: dp + " egress", clientNS: a.Name, serverNS: c.External.NS, serverIP: world}
	if _, err := netbench.Run(base.clientNS, "ping", "-c", "1", "-W", "2", base.serverIP); err != nil {
		return fmt.Errorf("masquerade baseline not connected: %w", err)
	}
	d := &dpRun{dp: dp, cfg: cfg, w: w, r: r, c: c, ratios: map[string]float64{}}
	if err := d.compare(ctx, base, test, true); err != nil {
		return err
	}
	if err := dnsFigures(ctx, dp, a, w, r); err != nil {
		r.fail(dp+".dns", err)
	}
	if err := nodePortFigures(ctx, cfg, dp, c, a, mtu, w, r); err != nil {
		r.fail(dp+".nodeport", err)
	}
	d.reportPair("egress", "masq", "kernel MASQUERADE", fmt.Sprintf("%s egress: container -> outside through eBPF source NAT vs a kernel MASQUERADE router of the same shape (MTU %d), %d/%d/%d alternating rounds",
		dp, mtu, cfg.tputRounds, cfg.crrRounds, cfg.rrRounds), base, test, nil)
	return nil
}

// dnsFigures measures the DNS responder from container a: the answer time of its own name
// (one query at a time, 1,000 queries) and the answers per second 8 concurrent askers get
// for 2 s. Queries go to the network's gateway, as a resolver in the container sends them.
func dnsFigures(ctx context.Context, dp string, a *sim.Container, w io.Writer, r *report) error {
	q := new(dns.Msg)
	q.SetQuestion("a.", dns.TypeA)
	gw := net.JoinHostPort(benchGW, "53")
	dial := func() (*dns.Conn, error) {
		conn, err := sim.DialContext(ctx, a.Name, "udp4", gw)
		if err != nil {
			return nil, err
		}
		return &dns.Conn{Conn: conn}, nil
	}
	ask := func(co *dns.Conn) error {
		_ = co.SetDeadline(time.Now().Add(2 * time.Second))
		if err := co.WriteMsg(q); err != nil {
			return err
		}
		m, err := co.ReadMsg()
		if err != nil {
			return err
		}
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
			return fmt.Errorf("answer for a.: %v", m)
		}
		return nil
	}
	co, err := dial()
	if err != nil {
		return err
	}
	defer co.Close()
	var samples []time.Duration
	for i := 0; i < 1000; i++ {
		start := time.Now()
		if err := ask(co); err != nil {
			return fmt.Errorf("query %d: %w", i, err)
		}
		samples = append(samples, time.Since(start))
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	deadline := time.Now().Add(2 * time.Second)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dial()
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for time.Now().Before(deadline) {
				if err := ask(c); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("concurrent queries: %w", err)
	}
	qps := float64(n.Load()) / 2
	p50, p99 := netbench.Percentile(samples, 50), netbench.Percentile(samples, 99)
	table(w, fmt.Sprintf("%s DNS responder: a container's own name through its gateway (1,000 sequential queries; 8 askers for 2 s)", dp),
		[]string{"answer p50 us", "answer p99 us", "answers/s"},
		[][]string{{fmt.Sprintf("%.1f", us(p50)), fmt.Sprintf("%.1f", us(p99)), fmt.Sprintf("%.0f", qps)}})
	r.add(dp+".dns.p50_us", us(p50), "us")
	r.add(dp+".dns.p99_us", us(p99), "us")
	r.add(dp+".dns.qps", float64(int64(qps)), "answers/s")
	return nil
}

// nodePortFigures compares new connections per second from the external namespace to a
// node port on host 1 whose backend is container a (local: the eBPF node port path, the
// client's address kept) with the kube-proxy way, an iptables DNAT on a router of the same
// shape (netbench.NodePortDNAT), alternating rounds.
func nodePortFigures(ctx context.Context, cfg config, dp string, c *sim.Cluster, a *sim.Container, mtu int, w io.Writer, r *report) error {
	const nodePort = 30080
	h1 := c.Hosts[0]
	if err := c.MasterDo(ctx, "POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: a.IP.Addr().String(),
		ContainerID: a.ID, Tenant: "default", Network: benchNet, Event: "start", Labels: map[string]string{"app": "np"}}, nil); err != nil {
		return err
	}
	svc := map[string]any{"tenantName": "default", "networkName": benchNet, "serviceName": "np", "ipAddress": "10.120.0.200",
		"selectors": []string{"app=np"}, "ports": []string{fmt.Sprintf("80:%d:TCP", echoPort)}, "nodePorts": []string{fmt.Sprintf("%d:80:TCP", nodePort)}}
	if err := c.MasterDo(ctx, "POST", "/api/v1/serviceLBs/default:np/", svc, nil); err != nil {
		return err
	}
	srv, err := netbench.StartServer(netbench.NSPath(a.Name), fmt.Sprintf("%s:%d", a.IP.Addr(), echoPort))
	if err != nil {
		return err
	}
	defer srv.Close()
	topo, err := netbench.NodePortDNAT(c.Prefix+"n", mtu, nodePort, echoPort)
	if err != nil {
		return err
	}
	defer topo.Close()
	bsrv, err := netbench.StartServer(netbench.NSPath(topo.Namespaces[0]), fmt.Sprintf("%s:%d", netbench.MasqClientIP, echoPort))
	if err != nil {
		return err
	}
	defer bsrv.Close()
	test := fmt.Sprintf("%s:%d", h1.IP, nodePort)
	base := fmt.Sprintf("10.195.0.1:%d", nodePort)
	testDial, baseDial := netbench.NewDialer(netbench.NSPath(c.External.NS)), netbench.NewDialer(netbench.NSPath(topo.Namespaces[3]))
	if err := waitCRR(ctx, testDial, test); err != nil {
		return fmt.Errorf("node port %s from the outside: %w", test, err)
	}
	var tr, br, ratios []float64
	for i := 0; i < cfg.crrRounds; i++ {
		order := []bool{i%2 == 0, i%2 != 0}
		var t1, b1 float64
		for _, isTest := range order {
			var err error
			if isTest {
				t1, err = netbench.CRR(ctx, testDial, test, cfg.crrTime)
			} else {
				b1, err = netbench.CRR(ctx, baseDial, base, cfg.crrTime)
			}
			if err != nil {
				return fmt.Errorf("node port crr (test %v): %w", isTest, err)
			}
		}
		tr, br, ratios = append(tr, t1), append(br, b1), append(ratios, ratio(t1, b1))
	}
	r.add(dp+".nodeport.crr", median(tr), "conn/s")
	r.add(dp+".nodeport.dnat_crr", median(br), "conn/s")
	r.add(dp+".nodeport.crr_ratio", median(ratios), "ratio")
	table(w, fmt.Sprintf("%s node port: new TCP connections/s from the external namespace to a node port with a local backend vs an iptables DNAT router of the same shape, %d alternating rounds", dp, cfg.crrRounds),
		[]string{"figure", "iptables DNAT", dp + " node port", "ratio"},
		[][]string{{"CRR conn/s", fmt.Sprintf("%.0f", median(br)), fmt.Sprintf("%.0f", median(tr)), fmt.Sprintf("%.3f", median(ratios))}})
	return nil
}
