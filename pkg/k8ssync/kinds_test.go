package k8ssync

import (
	"fmt"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/contivbpf/contivbpf/pkg/k8s"
)

// TestPolicyWarnKinds: the compiler's warnings land in their metric kind, not "other".
func TestPolicyWarnKinds(t *testing.T) {
	var pods []k8s.PolicyPod
	for i := range 1100 { // every other address: nothing merges
		pods = append(pods, k8s.PolicyPod{Namespace: "a", Name: fmt.Sprintf("p%d", i), Labels: map[string]string{"app": "p"},
			EndpointID: fmt.Sprintf("ep%d", i), IP: netip.AddrFrom4([4]byte{10, 5, byte(i / 128), byte(i % 128 * 2)}), Tenant: "t"})
	}
	pods = append(pods, k8s.PolicyPod{Namespace: "b", Name: "x", Labels: map[string]string{"app": "x"}, EndpointID: "epx", IP: netip.MustParseAddr("10.6.0.1"), Tenant: "blue"})
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "p"}}
	pol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "pol"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "p"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: sel}, {IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/64"}},
				{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}},
			}}}}}
	_, warns := k8s.CompilePolicies([]*networkingv1.NetworkPolicy{pol}, pods, map[string]map[string]string{"a": {}, "b": {}})
	kinds := map[string]bool{}
	for _, ws := range warns {
		for _, w := range ws {
			kinds[policyWarnKind(w)] = true
		}
	}
	for _, want := range []string{"too_many_rules", "ip_block", "other_tenant"} {
		if !kinds[want] {
			t.Errorf("no %s among %v (warnings %v)", want, kinds, warns)
		}
	}
	if kinds["other"] {
		t.Errorf("a warning classified as other: %v", warns)
	}
}
