package k8s

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/contivbpf/contivbpf/pkg/model"
)

func npol(ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func tcpPort(p intstr.IntOrString) networkingv1.NetworkPolicyPort {
	tcp := corev1.ProtocolTCP
	return networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &p}
}

// TestCompilePolicies: the classic cases on a fixed cluster: namespaces a (team=x) and b
// and c (team=y); a/web (app=web, port "http" 8080), a/db (app=db), b/cli (app=cli),
// a/nocontiv (app=web, no Contiv endpoint) in tenant t, c/other (app=cli) in tenant blue
// with a/db's address.
func TestCompilePolicies(t *testing.T) {
	pods := []PolicyPod{
		{Namespace: "a", Name: "web", Labels: map[string]string{"app": "web"}, EndpointID: "ep-web", IP: netip.MustParseAddr("10.1.0.2"), Tenant: "t",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}},
		{Namespace: "a", Name: "db", Labels: map[string]string{"app": "db"}, EndpointID: "ep-db", IP: netip.MustParseAddr("10.1.0.3"), Tenant: "t"},
		{Namespace: "b", Name: "cli", Labels: map[string]string{"app": "cli"}, EndpointID: "ep-cli", IP: netip.MustParseAddr("10.1.0.4"), Tenant: "t"},
		{Namespace: "c", Name: "other", Labels: map[string]string{"app": "cli"}, EndpointID: "ep-other", IP: netip.MustParseAddr("10.1.0.3"), Tenant: "blue"},
		{Namespace: "a", Name: "nocontiv", Labels: map[string]string{"app": "web"}},
	}
	nss := map[string]map[string]string{"a": {"team": "x"}, "b": {"team": "y"}, "c": {"team": "y"}}
	r := func(remote string, proto uint8, lo, hi uint16) model.K8sPodRule {
		return model.K8sPodRule{Remote: remote, Proto: proto, PortMin: lo, PortMax: hi}
	}
	endPort := int32(9000)
	udp := corev1.ProtocolUDP
	cases := []struct {
		name  string
		pols  []*networkingv1.NetworkPolicy
		want  map[string]model.K8sPodPolicy
		warns int
	}{
		{"deny all ingress in a", []*networkingv1.NetworkPolicy{npol("a", "deny", networkingv1.NetworkPolicySpec{})},
			map[string]model.K8sPodPolicy{
				"ep-web": {ID: "ep-web", Pod: "a/web", IPAddress: "10.1.0.2", IngressIsolated: true, Policies: []string{"a/deny"}},
				"ep-db":  {ID: "ep-db", Pod: "a/db", IPAddress: "10.1.0.3", IngressIsolated: true, Policies: []string{"a/deny"}},
			}, 0},
		{"allow from a namespace", []*networkingv1.NetworkPolicy{npol("a", "from-y", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "db"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y")}}}},
		})}, map[string]model.K8sPodPolicy{
			"ep-db": {ID: "ep-db", Pod: "a/db", IPAddress: "10.1.0.3", IngressIsolated: true, Policies: []string{"a/from-y"}, Ingress: []model.K8sPodRule{r("10.1.0.4/32", 0, 0, 0)}},
		}, 1}, // c/other is another tenant's pod: left out (its address is a/db's own)
		{"allow from a pod label, named port", []*networkingv1.NetworkPolicy{npol("a", "web-from-db", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "web"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "db")}},
				Ports: []networkingv1.NetworkPolicyPort{tcpPort(intstr.FromString("http")), tcpPort(intstr.FromString("nope"))}}},
		})}, map[string]model.K8sPodPolicy{
			"ep-web": {ID: "ep-web", Pod: "a/web", IPAddress: "10.1.0.2", IngressIsolated: true, Policies: []string{"a/web-from-db"}, Ingress: []model.K8sPodRule{r("10.1.0.3/32", 6, 8080, 8080)}},
		}, 0},
		{"egress to an ipBlock except a /32, endPort", []*networkingv1.NetworkPolicy{npol("b", "out", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/30", Except: []string{"10.1.0.2/32"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntStr(intstr.FromInt32(8000)), EndPort: &endPort}}}},
		})}, map[string]model.K8sPodPolicy{
			"ep-cli": {ID: "ep-cli", Pod: "b/cli", IPAddress: "10.1.0.4", EgressIsolated: true, Policies: []string{"b/out"},
				Egress: []model.K8sPodRule{r("10.1.0.0/31", 6, 8000, 9000), r("10.1.0.3/32", 6, 8000, 9000)}},
		}, 0},
		{"egress named port resolves in the peer", []*networkingv1.NetworkPolicy{npol("b", "dns", networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "x")}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptrIntStr(intstr.FromString("dns"))}}}},
		})}, map[string]model.K8sPodPolicy{
			"ep-cli": {ID: "ep-cli", Pod: "b/cli", IPAddress: "10.1.0.4", EgressIsolated: true, Policies: []string{"b/dns"}, Egress: []model.K8sPodRule{r("10.1.0.2/32", 17, 53, 53)}},
		}, 0},
		{"union of two policies, combined selectors", []*networkingv1.NetworkPolicy{
			npol("a", "p1", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "cli")}}}}}),
			npol("a", "p2", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "web")}}}, {Ports: []networkingv1.NetworkPolicyPort{tcpPort(intstr.FromInt32(5432))}}}}),
		}, map[string]model.K8sPodPolicy{
			"ep-db": {ID: "ep-db", Pod: "a/db", IPAddress: "10.1.0.3", IngressIsolated: true, Policies: []string{"a/p1", "a/p2"},
				Ingress: []model.K8sPodRule{r("10.1.0.4/32", 0, 0, 0), r("0.0.0.0/0", 6, 5432, 5432)}},
		}, 1},
		{"unsupported or invalid parts narrow and warn", []*networkingv1.NetworkPolicy{npol("a", "odd", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/64"}}, {}}}}})},
			map[string]model.K8sPodPolicy{
				"ep-db": {ID: "ep-db", Pod: "a/db", IPAddress: "10.1.0.3", IngressIsolated: true, Policies: []string{"a/odd"}},
			}, 2},
		{"a bad podSelector isolates the namespace", []*networkingv1.NetworkPolicy{npol("a", "bad", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{}}})},
			map[string]model.K8sPodPolicy{
				"ep-web": {ID: "ep-web", Pod: "a/web", IPAddress: "10.1.0.2", IngressIsolated: true, Policies: []string{"a/bad"}},
				"ep-db":  {ID: "ep-db", Pod: "a/db", IPAddress: "10.1.0.3", IngressIsolated: true, Policies: []string{"a/bad"}},
			}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, warns := CompilePolicies(c.pols, pods, nss)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			n := 0
			for _, w := range warns {
				n += len(w)
			}
			if n != c.warns {
				t.Errorf("warnings %v, want %d", warns, c.warns)
			}
		})
	}
}

func ptrIntStr(v intstr.IntOrString) *intstr.IntOrString { return &v }

func TestIPBlockExcept(t *testing.T) {
	got, err := ipBlockPrefixes(&networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.2.3/32", "10.128.0.0/9"}})
	if err != nil {
		t.Fatal(err)
	}
	// Every address of 10/8 is covered once, except the excluded ones.
	for _, a := range []string{"10.0.0.0", "10.1.2.2", "10.1.2.4", "10.127.255.255"} {
		n := 0
		for _, p := range got {
			if p.Contains(netip.MustParseAddr(a)) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s covered %d times by %v", a, n, got)
		}
	}
	for _, a := range []string{"10.1.2.3", "10.128.0.1", "10.255.255.255", "11.0.0.0"} {
		for _, p := range got {
			if p.Contains(netip.MustParseAddr(a)) {
				t.Errorf("%s is in %v", a, p)
			}
		}
	}
	if len(got) != 23 {
		t.Errorf("%d prefixes, want 23 (10.0.0.0/9 split around a /32: one per prefix length /10../32)", len(got))
	}
}

// TestAggregatePrefixes: the merged set covers exactly the addresses of the input.
func TestAggregatePrefixes(t *testing.T) {
	var in []netip.Prefix
	want := map[netip.Addr]bool{}
	for i := 0; i < 256; i++ {
		if i%7 == 3 || (i >= 64 && i < 128) || i == 200 {
			a := netip.AddrFrom4([4]byte{10, 2, 0, byte(i)})
			in = append(in, netip.PrefixFrom(a, 32), netip.PrefixFrom(a, 32)) // repeated too
			want[a] = true
		}
	}
	in = append(in, netip.MustParsePrefix("10.2.0.96/27")) // covered
	got := aggregatePrefixes(in)
	for i := 0; i < 256; i++ {
		a := netip.AddrFrom4([4]byte{10, 2, 0, byte(i)})
		n := 0
		for _, p := range got {
			if p.Contains(a) {
				n++
			}
		}
		if (n == 1) != want[a] || n > 1 {
			t.Fatalf("%v covered %d times by %v", a, n, got)
		}
	}
	if len(got) > 40 {
		t.Errorf("%d prefixes for a /26 and ~40 scattered addresses: not merged", len(got))
	}
	if g := aggregatePrefixes([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/25"), netip.MustParsePrefix("10.0.0.128/25")}); len(g) != 1 || g[0].String() != "10.0.0.0/24" {
		t.Errorf("siblings: %v", g)
	}
}

// TestCompileAtScale: 2,000 peer pods with consecutive addresses become a handful of
// rules; too many rules in one direction empty only that direction; every endpoint of a
// pod (a stale one too) is isolated; egress on a named port without peers reaches the
// pods that have that port.
func TestCompileAtScale(t *testing.T) {
	var pods []PolicyPod
	for i := 0; i < 2000; i++ {
		pods = append(pods, PolicyPod{Namespace: "big", Name: fmt.Sprintf("p%d", i), Labels: map[string]string{"app": "p"},
			EndpointID: fmt.Sprintf("ep%d", i), IP: netip.AddrFrom4([4]byte{10, 3, byte(i / 256), byte(i % 256)}), Tenant: "t"})
	}
	target := PolicyPod{Namespace: "big", Name: "db", Labels: map[string]string{"app": "db"}, EndpointID: "ep-db", IP: netip.MustParseAddr("10.9.0.1"), Tenant: "t",
		Ports: []corev1.ContainerPort{{Name: "pg", ContainerPort: 5432}}}
	stale := target
	stale.EndpointID, stale.IP = "ep-db-old", netip.MustParseAddr("10.9.0.2")
	pods = append(pods, target, stale)
	allowAll := npol("big", "from-p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "p")}}}}})
	got, warns := CompilePolicies([]*networkingv1.NetworkPolicy{allowAll}, pods, map[string]map[string]string{"big": {}})
	db := got["ep-db"]
	if len(db.Ingress) == 0 || len(db.Ingress) > 8 || len(warns) != 0 {
		t.Fatalf("2,000 consecutive peers compiled to %d rules (%v), warnings %v", len(db.Ingress), db.Ingress, warns)
	}
	if old := got["ep-db-old"]; !old.IngressIsolated || len(old.Ingress) != len(db.Ingress) {
		t.Fatalf("the pod's second endpoint: %+v", old)
	}

	// 2,000 scattered peers (every other address) cannot merge: ingress admits nothing,
	// egress keeps its rule.
	for i := range pods[:2000] {
		pods[i].IP = netip.AddrFrom4([4]byte{10, 4, byte(i / 128), byte(i % 128 * 2)})
	}
	both := npol("big", "both", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "p")}}}},
		Egress:  []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntStr(intstr.FromInt32(53))}}}}})
	got, warns = CompilePolicies([]*networkingv1.NetworkPolicy{both}, pods, map[string]map[string]string{"big": {}})
	db = got["ep-db"]
	if !db.IngressIsolated || db.Ingress != nil || len(db.Egress) != 1 || len(warns["big/both"]) != 2 {
		t.Fatalf("overflow: ingress %d rules, egress %v, warnings %v", len(db.Ingress), db.Egress, warns)
	}

	// Egress on a named port, no peers: to the pods with that port.
	named := npol("big", "to-pg", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "p"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntStr(intstr.FromString("pg"))}}}}})
	got, _ = CompilePolicies([]*networkingv1.NetworkPolicy{named}, pods, map[string]map[string]string{"big": {}})
	if e := got["ep0"].Egress; len(e) != 2 || e[0] != (model.K8sPodRule{Remote: "10.9.0.1/32", Proto: 6, PortMin: 5432, PortMax: 5432}) || e[1].Remote != "10.9.0.2/32" {
		t.Fatalf("named port to anywhere: %v", e)
	}
}
