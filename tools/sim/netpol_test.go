package sim

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestKubernetesNetworkPolicy: NetworkPolicies from a real kube-apiserver, compiled by
// netmaster's leader, enforced by both hosts' agents, with real TCP between pods in two
// namespaces on two hosts, on both datapaths: deny-all, allow from a namespace, allow from
// a pod label on a named port, the union of policies, egress to an ipBlock except a /32,
// and everything open again once the policies are gone.
func TestKubernetesNetworkPolicy(t *testing.T) {
	testroot.Need(t)
	for _, dp := range []string{"ebpf", "ovs"} {
		t.Run(dp, func(t *testing.T) { kubernetesNetworkPolicy(t, dp) })
	}
}

func kubernetesNetworkPolicy(t *testing.T, dp string) {
	bin := buildBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 2, BinDir: bin, Dataplane: dp, KubeAPI: true})
	cs := c.KubeAPI.Admin
	if err := c.CreateNetwork(ctx, "default", "np", "vxlan", "10.106.0.0/24", "10.106.0.1"); err != nil {
		t.Fatal(err)
	}
	for ns, team := range map[string]string{"np-a": "x", "np-b": "y"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": team}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(ns, name string, h *Host, ports ...corev1.ContainerPort) *Container {
		t.Helper()
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{k8s.LabelNetwork: "np", "app": name}},
			Spec:       corev1.PodSpec{NodeName: h.Name, Containers: []corev1.Container{{Name: "c", Image: "k8stest.invalid/pause:1", Ports: ports}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ct, err := c.AddPod(ctx, h, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
	server := pod("np-a", "server", c.Hosts[0], corev1.ContainerPort{Name: "http", ContainerPort: 8080}, corev1.ContainerPort{Name: "alt", ContainerPort: 9090})
	other := pod("np-a", "other", c.Hosts[0])
	friend := pod("np-a", "friend", c.Hosts[1])
	client := pod("np-b", "client", c.Hosts[1])
	for _, s := range []struct {
		ct   *Container
		port int
	}{{server, 8080}, {server, 9090}, {friend, 8080}} {
		if err := c.ServeName(s.ct, s.port); err != nil {
			t.Fatal(err)
		}
	}
	reach := func(from, to *Container, port int) error {
		_, err := AskName(ctx, from, net.JoinHostPort(to.IP.Addr().String(), fmt.Sprint(port)))
		return err
	}
	// expect waits until every pair answers (ok) or is refused (!ok), then checks once
	// more that none of them changed.
	type pair struct {
		from, to *Container
		port     int
		ok       bool
	}
	expect := func(what string, pairs ...pair) {
		t.Helper()
		check := func() error {
			for _, p := range pairs {
				err := reach(p.from, p.to, p.port)
				switch {
				case p.ok && err != nil:
					return fmt.Errorf("%s → %s:%d refused: %v", p.from.Name, p.to.Name, p.port, err)
				case !p.ok && err == nil:
					return fmt.Errorf("%s → %s:%d still answers", p.from.Name, p.to.Name, p.port)
				}
			}
			return nil
		}
		eventually(t, what, 30*time.Second, check)
		if err := check(); err != nil {
			t.Fatalf("%s: not stable: %v", what, err)
		}
	}
	create := func(p *networkingv1.NetworkPolicy) {
		t.Helper()
		if _, err := cs.NetworkingV1().NetworkPolicies(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(ns, name string) {
		t.Helper()
		if err := cs.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sel := func(k, v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	}
	tcp := corev1.ProtocolTCP

	expect("no policy: everything open",
		pair{client, server, 8080, true}, pair{other, server, 8080, true}, pair{server, friend, 8080, true})

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np-a", Name: "deny-all"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	expect("deny-all ingress in np-a",
		pair{client, server, 8080, false}, pair{other, server, 8080, false}, pair{client, friend, 8080, false},
		pair{server, friend, 8080, false})
	monitorSees(ctx, t, c, bin, "drop_netpol", server.IP.Addr().String()+":8080", func() { _ = reach(client, server, 8080) })

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np-a", Name: "from-team-y"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y")}}}}}})
	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np-a", Name: "other-on-alt"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "other")}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &intstr.IntOrString{Type: intstr.String, StrVal: "alt"}}}}}}})
	expect("allow from a namespace, from a pod label on a named port (union with deny-all)",
		pair{client, server, 8080, true}, pair{client, server, 9090, true},
		pair{other, server, 9090, true}, pair{other, server, 8080, false},
		pair{client, friend, 8080, false})
	hostsInSync(ctx, t, c, bin)

	remove("np-a", "deny-all")
	friendBlock := friend.IP.Addr().String() + "/32"
	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np-a", Name: "server-out"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.106.0.0/24", Except: []string{friendBlock}}}}}}}})
	expect("egress to an ipBlock except a /32 (replies to allowed ingress still pass)",
		pair{server, friend, 8080, false}, pair{client, friend, 8080, true}, pair{client, server, 8080, true})

	for _, n := range []string{"from-team-y", "other-on-alt", "server-out"} {
		remove("np-a", n)
	}
	expect("policies gone: everything open again",
		pair{client, server, 8080, true}, pair{other, server, 8080, true}, pair{server, friend, 8080, true})
}
