package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// k8sStage measures the Kubernetes integration (docs/kubernetes.md) with a real
// kube-apiserver inside host 1's namespace: CNI ADD with pod labels from the API (host 1's
// agent) against ADD with the network in the CNI arguments (host 2's agent, no API),
// interleaved; EndpointSlice change → the other host's agent has applied it; and 1,000
// Services with 10 endpoints each, from the first API call to every one applied by host 2's
// agent, with that agent's CPU time.
func k8sStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	fmt.Fprintf(w, "\n#### k8s (ebpf): kube-apiserver, netmaster --mode kubernetes, two hosts\n")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Prefix: cfg.prefix + "k", Hosts: 2, BinDir: cfg.bin, Dataplane: "ebpf", Logger: quiet,
		KubeAPI: true, KubeAPIPlugin: func(c *sim.Cluster, h *sim.Host) bool { return h == c.Hosts[0] }, // host 2: no API, CNI args
		NetmasterArgs: noQuotas}) // (1,001 Services in tenant default)
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintf(w, "cleanup of the k8s cluster: %v\n", err)
		}
	}()
	api := c.KubeAPI
	if err := c.CreateNetwork(ctx, "default", "kb", "vxlan", "10.106.0.0/16", "10.106.0.1"); err != nil {
		return err
	}
	h1, h2 := c.Hosts[0], c.Hosts[1]
	cs := api.Admin
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

	// 1. CNI ADD: pods exist in the API first (the kubelet calls CNI after binding).
	const n = 40
	for i := 0; i < n; i++ {
		if _, err := api.CreatePod(ctx, "default", fmt.Sprintf("p%d", i), h1.Name, map[string]string{k8s.LabelNetwork: "kb", "app": "kb"}); err != nil {
			return err
		}
	}
	var withAPI, withArgs []time.Duration
	var pods []*sim.Container // host 1's, attached with the API: they may back Services
	for i := 0; i < n && ctx.Err() == nil; i++ {
		t0 := time.Now()
		ct, err := c.AddContainer(ctx, h1, fmt.Sprintf("p%d", i), "", "")
		if err != nil {
			return fmt.Errorf("ADD with labels from the API: %w", err)
		}
		withAPI = append(withAPI, time.Since(t0))
		pods = append(pods, ct)
		t0 = time.Now()
		if _, err = c.AddContainer(ctx, h2, fmt.Sprintf("q%d", i), "default", "kb"); err != nil {
			return fmt.Errorf("ADD with CNI args: %w", err)
		}
		withArgs = append(withArgs, time.Since(t0))
	}
	a50, a99 := netbench.Percentile(withAPI, 50), netbench.Percentile(withAPI, 99)
	b50, b99 := netbench.Percentile(withArgs, 50), netbench.Percentile(withArgs, 99)
	r.add("k8s.cni_add_api_p50_ms", ms(a50), "ms")
	r.add("k8s.cni_add_api_p99_ms", ms(a99), "ms")
	r.add("k8s.cni_add_args_p50_ms", ms(b50), "ms")
	r.add("k8s.cni_add_args_p99_ms", ms(b99), "ms")
	r.add("k8s.cni_add_api_extra_p50_ms", ms(a50-b50), "ms")
	table(w, fmt.Sprintf("k8s: CNI ADD (AddPod over the socket), %d pods each, interleaved", n), []string{"labels from", "p50 ms", "p99 ms"},
		[][]string{{"pod cache (API)", fmt.Sprintf("%.1f", ms(a50)), fmt.Sprintf("%.1f", ms(a99))},
			{"CNI args (no API)", fmt.Sprintf("%.1f", ms(b50)), fmt.Sprintf("%.1f", ms(b99))}})

	// 2. EndpointSlice change → applied by the other host's agent.
	if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lat"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	ep := func(i int) sliceEP { return sliceEP{ip: pods[i].IP.Addr().String(), pod: fmt.Sprintf("p%d", i)} }
	var lat []time.Duration
	const changes = 30
	for i := 0; i < changes && ctx.Err() == nil; i++ {
		eps := []sliceEP{ep(0), ep(1 + i%(len(pods)-1))}
		t0 := time.Now()
		if err := putEndpointSlice(ctx, cs, "default", "lat", 80, eps); err != nil {
			return err
		}
		if err := waitServices(ctx, h2, func(svcs []dataplane.Service) bool {
			for _, s := range svcs {
				if s.ID == "k8s_default_lat:default" {
					return len(s.Backends) == 2 && slices.Contains(s.Backends, netip.MustParseAddr(eps[1].ip))
				}
			}
			return false
		}); err != nil {
			return fmt.Errorf("EndpointSlice change %d: %w", i, err)
		}
		lat = append(lat, time.Since(t0))
	}
	l50, l99 := netbench.Percentile(lat, 50), netbench.Percentile(lat, 99)
	r.add("k8s.endpointslice_p50_ms", ms(l50), "ms")
	r.add("k8s.endpointslice_p99_ms", ms(l99), "ms")
	fmt.Fprintf(w, "EndpointSlice update → applied by the other host's agent (%d changes): p50 %.1f ms, p99 %.1f ms\n", changes, ms(l50), ms(l99))

	// 3. NetworkPolicy change → enforced (programmed into the datapath maps) on both hosts.
	if err := netpolLatency(ctx, c, w, r); err != nil {
		return err
	}

	// 4. 1,000 Services with 10 endpoints each.
	const nsvc, per = 1000, 10
	cpu0, err := cpbench.ProcessCPU(h2.Plugin.PID())
	if err != nil {
		return err
	}
	t0 := time.Now()
	for i := 0; i < nsvc && ctx.Err() == nil; i++ {
		name := fmt.Sprintf("s%d", i)
		if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		var eps []sliceEP
		for j := 0; j < per; j++ {
			eps = append(eps, ep((i*per+j)%len(pods)))
		}
		if err := putEndpointSlice(ctx, cs, "default", name, 8080, eps); err != nil {
			return err
		}
	}
	created := time.Since(t0)
	err = waitServicesFor(ctx, h2, 5*time.Minute, func(svcs []dataplane.Service) bool {
		full := 0
		for _, s := range svcs {
			if strings.HasPrefix(s.ID, "k8s_default_s") && len(s.Backends) == per {
				full++
			}
		}
		return full == nsvc
	})
	if err != nil {
		return fmt.Errorf("%d services: %w", nsvc, err)
	}
	all := time.Since(t0)
	cpu1, err := cpbench.ProcessCPU(h2.Plugin.PID())
	if err != nil {
		return err
	}
	r.add("k8s.svc1000_s", round1(all.Seconds()), "s")
	r.add("k8s.svc1000_api_s", round1(created.Seconds()), "s")
	r.add("k8s.svc1000_agent_cpu_s", round1((cpu1 - cpu0).Seconds()), "s")
	fmt.Fprintf(w, "%d Services × %d endpoints: API calls done after %.1fs, all applied by host 2's agent after %.1fs; that agent used %.1fs CPU\n",
		nsvc, per, created.Seconds(), all.Seconds(), (cpu1 - cpu0).Seconds())
	return nil
}

// netpolLatency changes a NetworkPolicy's allowed port and waits until both hosts'
// datapaths hold the new rule for the pod it selects (netctl bpf netpol on each).
func netpolLatency(ctx context.Context, c *sim.Cluster, w io.Writer, r *report) error {
	cs := c.KubeAPI.Admin
	h1 := c.Hosts[0]
	if _, err := c.KubeAPI.CreatePod(ctx, "default", "np0", h1.Name, map[string]string{k8s.LabelNetwork: "kb", "app": "np"}); err != nil {
		return err
	}
	ct, err := c.AddContainer(ctx, h1, "np0", "", "")
	if err != nil {
		return fmt.Errorf("netpol pod: %w", err)
	}
	ip := ct.IP.Addr().String()
	tcp := corev1.ProtocolTCP
	pol := func(port int32) *networkingv1.NetworkPolicy {
		p := intstr.FromInt32(port)
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "lat", Namespace: "default"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "np"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}}}}}
	}
	has := func(h *sim.Host, port int32) bool {
		var l dataplane.Listing
		if err := h.InspectGet(ctx, "/inspect/bpf/netpol", &l); err != nil {
			return false
		}
		for _, row := range l.Rows {
			if len(row) == len(l.Columns) && row[1] == ip && row[3] == "ingress" && row[8] == fmt.Sprint(port) {
				return true
			}
		}
		return false
	}
	cur, err := cs.NetworkingV1().NetworkPolicies("default").Create(ctx, pol(1000), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	var lat []time.Duration
	const changes = 30
	for i := 1; i <= changes && ctx.Err() == nil; i++ {
		port := int32(1000 + i)
		next := pol(port)
		next.ResourceVersion = cur.ResourceVersion
		t0 := time.Now()
		if cur, err = cs.NetworkingV1().NetworkPolicies("default").Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			return err
		}
		deadline := t0.Add(30 * time.Second)
		for !(has(c.Hosts[0], port) && has(c.Hosts[1], port)) {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("NetworkPolicy change %d: port %d not programmed on both hosts within 30s", i, port)
			}
			time.Sleep(5 * time.Millisecond)
		}
		lat = append(lat, time.Since(t0))
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p50, p99 := netbench.Percentile(lat, 50), netbench.Percentile(lat, 99)
	r.add("k8s.netpol_p50_ms", ms(p50), "ms")
	r.add("k8s.netpol_p99_ms", ms(p99), "ms")
	fmt.Fprintf(w, "NetworkPolicy update → programmed on both hosts (%d changes): p50 %.1f ms, p99 %.1f ms\n", changes, ms(p50), ms(p99))
	return nil
}

// sliceEP is one ready endpoint: a pod's address and name.
type sliceEP struct{ ip, pod string }

// putEndpointSlice creates or replaces Service svc's one EndpointSlice: the pods, ready,
// with port (unnamed) target.
func putEndpointSlice(ctx context.Context, cs kubernetes.Interface, ns, svc string, target int32, eps []sliceEP) error {
	proto := corev1.ProtocolTCP
	name := ""
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &target, Protocol: &proto}},
	}
	ready := true
	for _, e := range eps {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.pod}})
	}
	old, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, sl.Name, metav1.GetOptions{})
	if err == nil {
		sl.ResourceVersion = old.ResourceVersion
		_, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, sl, metav1.UpdateOptions{})
		return err
	}
	_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{})
	return err
}

func waitServices(ctx context.Context, h *sim.Host, ok func([]dataplane.Service) bool) error {
	return waitServicesFor(ctx, h, 30*time.Second, ok)
}

// waitServicesFor polls h's applied services (/svcstats) every 5 ms until ok holds.
func waitServicesFor(ctx context.Context, h *sim.Host, d time.Duration, ok func([]dataplane.Service) bool) error {
	deadline := time.Now().Add(d)
	for {
		var out struct {
			Services []dataplane.Service `json:"services"`
		}
		err := h.InspectGet(ctx, "/svcstats", &out)
		if err == nil && ok(out.Services) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not applied within %s (%d services, %v)", d, len(out.Services), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
