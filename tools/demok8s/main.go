// Command demok8s is the `make demo-k8s` walkthrough: a real kube-apiserver (built from the
// Go module proxy, cached outside the repo) inside the first of two simulated nodes,
// netmaster in kubernetes mode and a netplugin per node reading pod labels from it; pods
// created in the API and attached through the CNI socket as a runtime would, a namespace
// bound to a tenant refusing a pod that names another, and a Service balanced across both
// nodes by its ClusterIP, then a NetworkPolicy that blocks the client and is changed to
// allow it, and a pod created through a real container runtime (a private containerd's
// CRI plugin executing the CNI chain). Every step prints what it does; any failure exits
// non-zero after cleaning up.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/contivbpf/contivbpf/internal/testkit/critest"
	"github.com/contivbpf/contivbpf/internal/testkit/k8stest"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/tools/sim"
)

func main() {
	dp := flag.String("dataplane", "ebpf", "ebpf | ovs")
	bin := flag.String("bin", "", "directory with netmaster, netplugin, netctl (default <repo>/bin)")
	flag.Parse()
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	start := time.Now()
	if err := run(ctx, *dp, *bin); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo-k8s FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("\ndemo-k8s OK (%.1fs)\n", time.Since(start).Seconds())
}

func run(ctx context.Context, dp, bin string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, bpffs)")
	}
	if bin == "" {
		root, err := sim.RepoRoot()
		if err != nil {
			return err
		}
		bin = root + "/bin"
	}
	n := 0
	step := func(format string, a ...any) {
		n++
		fmt.Printf("\n==> [%d] %s\n", n, fmt.Sprintf(format, a...))
	}
	step("kube-apiserver (scripts/kube-apiserver.sh; the first run builds it, several minutes)")
	if _, err := k8stest.Binary(); err != nil {
		return err
	}
	step("two simulated nodes; the API server in node 1's namespace; netmaster --mode kubernetes; netplugins read pod labels (dataplane %s)", dp)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := sim.Start(ctx, sim.Config{Hosts: 2, BinDir: bin, Dataplane: dp, Logger: quiet, KubeAPI: true})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	api := c.KubeAPI
	fmt.Printf("    API server %s, nodes %s (%s) and %s (%s)\n", api.URL, c.Hosts[0].Name, c.Hosts[0].IP, c.Hosts[1].Name, c.Hosts[1].IP)
	cs := api.Admin

	step("tenant blue with network web-net; namespace shop bound to tenant blue (label io.contiv.tenant=blue)")
	if out, err := c.Netctl(ctx, "tenant", "create", "blue"); err != nil {
		return fmt.Errorf("tenant create: %v: %s", err, out)
	}
	if out, err := c.Netctl(ctx, "net", "create", "-t", "blue", "-e", "vxlan", "-s", "10.110.0.0/24", "-g", "10.110.0.1", "web-net"); err != nil {
		return fmt.Errorf("net create: %v: %s", err, out)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop",
		Labels: map[string]string{k8s.LabelTenant: "blue"}}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	step("pods web-1 (node 1) and web-2, client (node 2) created in the API with label io.contiv.network=web-net, then attached through each node's CNI socket")
	type pod struct {
		name string
		h    *sim.Host
		ct   *sim.Container
	}
	pods := []*pod{{name: "web-1", h: c.Hosts[0]}, {name: "web-2", h: c.Hosts[1]}, {name: "client", h: c.Hosts[1]}}
	for _, p := range pods {
		if _, err := api.CreatePod(ctx, "shop", p.name, p.h.Name, map[string]string{k8s.LabelNetwork: "web-net", "app": strings.TrimRight(p.name, "-0123456789")}); err != nil {
			return err
		}
		if p.ct, err = c.AddPod(ctx, p.h, "shop", p.name); err != nil {
			return err
		}
		fmt.Printf("    %-7s on %s: %s\n", p.name, p.h.Name, p.ct.IP)
	}

	step("a pod of namespace shop labelled with another tenant is refused by the CNI ADD")
	if _, err := api.CreatePod(ctx, "shop", "sneaky", c.Hosts[0].Name, map[string]string{k8s.LabelTenant: "default", k8s.LabelNetwork: "web-net"}); err != nil {
		return err
	}
	if _, err := c.AddPod(ctx, c.Hosts[0], "shop", "sneaky"); err == nil {
		return errors.New("the pod naming another tenant was attached")
	} else {
		fmt.Printf("    %v\n", err)
	}

	step("Service shop/web (NodePort, port 80 -> named port http) and its EndpointSlice; netmaster's leader writes it as serviceLB state")
	for _, p := range pods[:2] {
		if err := c.ServeName(p.ct, 8080); err != nil {
			return err
		}
	}
	svc, err := cs.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	name, port, proto, ready := "http", int32(8080), corev1.ProtocolTCP, true
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}}}
	for _, p := range pods[:2] {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.ct.IP.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: p.name}})
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return err
	}
	fmt.Printf("    ClusterIP %s, node port %d\n", svc.Spec.ClusterIP, svc.Spec.Ports[0].NodePort)

	step("client connects to %s:80 six times: answers come from both nodes' pods", svc.Spec.ClusterIP)
	seen := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < 2 || total(seen) < 6 {
		who, err := sim.AskName(ctx, pods[2].ct, net.JoinHostPort(svc.Spec.ClusterIP, "80"))
		if err == nil {
			seen[who]++
			fmt.Printf("    answered by %s\n", who)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ClusterIP answers so far: %v (last error %v)", seen, err)
		}
		if err != nil {
			time.Sleep(200 * time.Millisecond)
		}
	}

	step("node 2's datapath: netctl bpf services (the Service's VIP in tenant blue's zone and its backends)")
	h2 := c.Hosts[1]
	out, err := sim.Exec(ctx, h2.Name, bin+"/netctl", "--agent-token", c.InspectToken, "bpf", "services", "--agent", "http://"+h2.Inspect)
	if err != nil {
		return fmt.Errorf("netctl bpf services: %v: %s", err, out)
	}
	fmt.Print(indent(out))

	step("pod web-3 created through a container runtime: a private containerd's CRI plugin runs its sandbox and executes contivk8s + portmap on node 1")
	root, err := sim.RepoRoot()
	if err != nil {
		return err
	}
	tools, err := os.MkdirTemp("", "cbdemo-cri-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tools)
	pause, plugins, err := critest.Build(ctx, root, tools)
	if err != nil {
		return err
	}
	rt, err := critest.Start(ctx, critest.Options{Dir: filepath.Join(c.WorkDir, "containerd"), ConfList: critest.ConfList(c.Hosts[0].CNISocket), Pause: pause, Plugins: plugins})
	if err != nil {
		return err
	}
	defer rt.Close()
	if _, err := api.CreatePod(ctx, "shop", "web-3", c.Hosts[0].Name, map[string]string{k8s.LabelNetwork: "web-net", "app": "web"}); err != nil {
		return err
	}
	sandbox, ip, err := rt.RunPod(ctx, "shop", "web-3", "uid-web-3")
	if err != nil {
		return err
	}
	fmt.Printf("    sandbox %.12s: %s (tenant blue's web-net, from the pod's labels)\n", sandbox, ip)
	if err := waitFor(30*time.Second, "the client to reach web-3", func() bool {
		_, err := pods[2].ct.Ping(ctx, ip, 1)
		return err == nil
	}); err != nil {
		return err
	}
	fmt.Printf("    client on node 2 pings %s: ok\n", ip)

	step("NetworkPolicy shop/web-ingress selects app=web with no rules: the client's connections through the ClusterIP are refused")
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web-ingress", Namespace: "shop"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if np, err = cs.NetworkingV1().NetworkPolicies("shop").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitFor(30*time.Second, "the policy to block the client", func() bool {
		_, err := sim.AskName(ctx, pods[2].ct, vip)
		return err != nil
	}); err != nil {
		return err
	}
	_, err = sim.AskName(ctx, pods[2].ct, vip)
	fmt.Printf("    client -> %s: %v\n", vip, err)
	out, err = sim.Exec(ctx, h2.Name, bin+"/netctl", "--agent-token", c.InspectToken, "bpf", "netpol", "--agent", "http://"+h2.Inspect)
	if err != nil {
		return fmt.Errorf("netctl bpf netpol: %v: %s", err, out)
	}
	fmt.Print(indent(out))

	step("the policy now allows TCP 8080 from pods labelled app=client: the client is answered again")
	tcp, p8080 := corev1.ProtocolTCP, intstr.FromInt32(8080)
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p8080}}}}
	if _, err := cs.NetworkingV1().NetworkPolicies("shop").Update(ctx, np, metav1.UpdateOptions{}); err != nil {
		return err
	}
	var who string
	if err := waitFor(30*time.Second, "the policy to allow the client", func() bool {
		who, err = sim.AskName(ctx, pods[2].ct, vip)
		return err == nil
	}); err != nil {
		return err
	}
	fmt.Printf("    client -> %s: answered by %s\n", vip, who)

	step("Service deleted: the ClusterIP stops answering")
	if err := cs.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		return err
	}
	for i := 0; ; i++ {
		if _, err := sim.AskName(ctx, pods[2].ct, net.JoinHostPort(svc.Spec.ClusterIP, "80")); err != nil {
			fmt.Printf("    %v\n", err)
			break
		}
		if i > 50 {
			return errors.New("the deleted Service still answers")
		}
		time.Sleep(100 * time.Millisecond)
	}
	step("clean-up: nodes, pods, API server and their files removed")
	return nil
}

// waitFor polls ok every 100 ms until it holds or d passed.
func waitFor(d time.Duration, what string, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func total(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}
