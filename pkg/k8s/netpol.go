package k8s

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// PolicyPod is what NetworkPolicy compilation needs to know about one pod: its labels
// and container ports (for named ports), and, when it is attached to a Contiv network,
// its endpoint (id and address).
type PolicyPod struct {
	Namespace string
	Name      string
	Labels    map[string]string
	Ports     []corev1.ContainerPort
	// EndpointID and IP are the pod's Contiv endpoint; "" / invalid when it has none
	// (host network, not attached yet, another CNI): it is then neither isolated nor
	// a peer anyone's rules can name.
	EndpointID string
	IP         netip.Addr
	// Tenant owns the endpoint's network: pod peers count only within the selected
	// pod's tenant (another tenant's address may be one of this tenant's too).
	Tenant string
	// Node is the pod's spec.nodeName: only an endpoint of that host is the pod's.
	Node string
}

// Key is "namespace/name".
func (p PolicyPod) Key() string { return p.Namespace + "/" + p.Name }

var anywhere = netip.MustParsePrefix("0.0.0.0/0")

// CompilePolicies compiles NetworkPolicies (networking.k8s.io/v1) into one record per
// pod endpoint that some policy selects (docs/kubernetes.md "NetworkPolicy"): a pod is
// isolated for a direction when any policy that selects it has that direction in its
// policyTypes, and then admits only what the union of those policies' rules allows.
// Peers become prefixes: pod and namespace selectors the /32s of the Contiv endpoints of
// the pods they select, ipBlock its CIDR minus its excepts (IPv4); ports become a
// protocol and a port range, named ports resolved in the destination pod's containers.
// What cannot be compiled narrows access and is reported in warnings (keyed by policy
// "namespace/name"), never widens it. Records are keyed by endpoint id.
func CompilePolicies(pols []*networkingv1.NetworkPolicy, pods []PolicyPod, nsLabels map[string]map[string]string) (map[string]model.K8sPodPolicy, map[string][]string) {
	out := map[string]model.K8sPodPolicy{}
	warn := map[string][]string{}
	byNS := map[string][]PolicyPod{}
	for _, p := range pods {
		byNS[p.Namespace] = append(byNS[p.Namespace], p)
	}
	note := func(pol *networkingv1.NetworkPolicy, format string, args ...any) {
		k := pol.Namespace + "/" + pol.Name
		msg := fmt.Sprintf(format, args...)
		if !slices.Contains(warn[k], msg) {
			warn[k] = append(warn[k], msg)
		}
	}
	sorted := slices.Clone(pols)
	slices.SortFunc(sorted, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, pol := range sorted {
		ingress, egress := policyTypes(pol)
		sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
		failClosed := false
		if err != nil {
			// Which pods it means is unknown: isolate the whole namespace with no rules
			// from this policy (narrower than any reading of it).
			note(pol, "podSelector: %v: every pod of the namespace isolated by this policy, no rules from it", err)
			failClosed, sel = true, labels.Everything()
		}
		for _, pod := range byNS[pol.Namespace] {
			if pod.EndpointID == "" || !pod.IP.Is4() || !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			rec := out[pod.EndpointID]
			rec.ID, rec.Pod, rec.IPAddress = pod.EndpointID, pod.Key(), pod.IP.String()
			rec.Policies = append(rec.Policies, pol.Namespace+"/"+pol.Name)
			if ingress {
				rec.IngressIsolated = true
				if !failClosed {
					for i, r := range pol.Spec.Ingress {
						rec.Ingress = append(rec.Ingress, compileRule(pol, fmt.Sprintf("ingress[%d]", i), r.From, r.Ports, pod, true, byNS, nsLabels, note)...)
					}
				}
			}
			if egress {
				rec.EgressIsolated = true
				if !failClosed {
					for i, r := range pol.Spec.Egress {
						rec.Egress = append(rec.Egress, compileRule(pol, fmt.Sprintf("egress[%d]", i), r.To, r.Ports, pod, false, byNS, nsLabels, note)...)
					}
				}
			}
			out[pod.EndpointID] = rec
		}
	}
	for id, rec := range out {
		rec.Ingress, rec.Egress = aggregateRules(rec.Ingress), aggregateRules(rec.Egress)
		for _, dir := range []struct {
			name  string
			rules *[]model.K8sPodRule
		}{{"ingress", &rec.Ingress}, {"egress", &rec.Egress}} {
			if n := len(*dir.rules); n > dataplane.MaxPodRules {
				// Too many to install even after merging prefixes: that direction admits
				// nothing (the other keeps its rules).
				*dir.rules = nil
				for _, p := range rec.Policies {
					warn[p] = append(warn[p], fmt.Sprintf("pod %s: %d %s rules after merging prefixes, at most %d: its %s admits nothing", rec.Pod, n, dir.name, dataplane.MaxPodRules, dir.name))
				}
			}
		}
		out[id] = rec
	}
	return out, warn
}

// policyTypes is the spec's policyTypes or, when empty, Kubernetes' default: Ingress
// always, Egress when the policy has egress rules.
func policyTypes(pol *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(pol.Spec.PolicyTypes) == 0 {
		return true, len(pol.Spec.Egress) > 0
	}
	for _, t := range pol.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// peerTarget is one resolved peer: a prefix and, for a pod, the pod (named ports of
// egress rules resolve in it).
type peerTarget struct {
	prefix netip.Prefix
	pod    *PolicyPod
}

// compileRule turns one ingress or egress rule of pol, for selected pod self, into rules.
func compileRule(pol *networkingv1.NetworkPolicy, where string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort,
	self PolicyPod, ingress bool, byNS map[string][]PolicyPod, nsLabels map[string]map[string]string, note func(*networkingv1.NetworkPolicy, string, ...any)) []model.K8sPodRule {
	var targets []peerTarget
	if len(peers) == 0 {
		targets = []peerTarget{{prefix: anywhere}}
	}
	for i, peer := range peers {
		targets = append(targets, resolvePeer(pol, fmt.Sprintf("%s.%s[%d]", where, map[bool]string{true: "from", false: "to"}[ingress], i), peer, byNS, nsLabels, note)...)
	}
	var out []model.K8sPodRule
	for _, t := range targets {
		if t.pod != nil && (t.pod.Tenant != self.Tenant || self.Tenant == "") {
			note(pol, "%s: pod %s is in tenant %q, %s in %q: tenants never reach each other, no rule", where, t.pod.Key(), t.pod.Tenant, self.Key(), self.Tenant)
			continue
		}
		if len(ports) == 0 {
			out = append(out, model.K8sPodRule{Remote: t.prefix.String()})
			continue
		}
		for j, p := range ports {
			proto, ok := protoNumber(p.Protocol)
			if !ok {
				note(pol, "%s.ports[%d]: protocol %s not supported: no rule", where, j, *p.Protocol)
				continue
			}
			r := model.K8sPodRule{Remote: t.prefix.String(), Proto: proto}
			switch {
			case p.Port == nil:
			case p.Port.StrVal != "":
				// A named port is the destination's: the selected pod's own for ingress,
				// the peer pod's for egress (an address block has no named ports).
				dst := &self
				if !ingress {
					dst = t.pod
				}
				if dst == nil && len(peers) == 0 {
					// Egress to anywhere on a named port: to every pod of the tenant
					// that has a port of that name, on its number.
					out = append(out, namedPortAnywhere(self, p.Port.StrVal, p.Protocol, proto, byNS)...)
					continue
				}
				if dst == nil {
					note(pol, "%s.ports[%d]: named port %q towards an ipBlock: no rule", where, j, p.Port.StrVal)
					continue
				}
				n, ok := namedPort(*dst, p.Port.StrVal, p.Protocol)
				if !ok {
					continue // the pod has no such port: nothing to allow
				}
				r.PortMin, r.PortMax = n, n
			default:
				n := p.Port.IntVal
				if n < 1 || n > 65535 {
					note(pol, "%s.ports[%d]: port %d out of range: no rule", where, j, n)
					continue
				}
				r.PortMin, r.PortMax = uint16(n), uint16(n)
				if p.EndPort != nil {
					if *p.EndPort < n || *p.EndPort > 65535 {
						note(pol, "%s.ports[%d]: endPort %d: no rule", where, j, *p.EndPort)
						continue
					}
					r.PortMax = uint16(*p.EndPort)
				}
			}
			out = append(out, r)
		}
	}
	return out
}

// resolvePeer turns one peer into prefixes.
func resolvePeer(pol *networkingv1.NetworkPolicy, where string, peer networkingv1.NetworkPolicyPeer, byNS map[string][]PolicyPod,
	nsLabels map[string]map[string]string, note func(*networkingv1.NetworkPolicy, string, ...any)) []peerTarget {
	if peer.IPBlock != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			note(pol, "%s: ipBlock with selectors is invalid: no rule", where)
			return nil
		}
		pfxs, err := ipBlockPrefixes(peer.IPBlock)
		if err != nil {
			note(pol, "%s: %v: no rule", where, err)
			return nil
		}
		out := make([]peerTarget, len(pfxs))
		for i, p := range pfxs {
			out[i] = peerTarget{prefix: p}
		}
		return out
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		note(pol, "%s: empty peer: no rule", where)
		return nil
	}
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			note(pol, "%s: podSelector: %v: no rule", where, err)
			return nil
		}
		podSel = s
	}
	namespaces := []string{pol.Namespace}
	if peer.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			note(pol, "%s: namespaceSelector: %v: no rule", where, err)
			return nil
		}
		namespaces = namespaces[:0]
		for ns, l := range nsLabels {
			if s.Matches(labels.Set(l)) {
				namespaces = append(namespaces, ns)
			}
		}
		slices.Sort(namespaces)
	}
	var out []peerTarget
	for _, ns := range namespaces {
		for i := range byNS[ns] {
			p := &byNS[ns][i]
			if p.EndpointID != "" && p.IP.Is4() && podSel.Matches(labels.Set(p.Labels)) {
				out = append(out, peerTarget{prefix: netip.PrefixFrom(p.IP, 32), pod: p})
			}
		}
	}
	return out
}

// ipBlockPrefixes is cidr minus every except, as prefixes (IPv4 only).
func ipBlockPrefixes(b *networkingv1.IPBlock) ([]netip.Prefix, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return nil, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, err)
	}
	if !cidr.Addr().Is4() {
		return nil, fmt.Errorf("ipBlock cidr %s is not IPv4 (pods here have IPv4 addresses only)", cidr)
	}
	set := []netip.Prefix{cidr.Masked()}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil || !ex.Addr().Is4() {
			return nil, fmt.Errorf("ipBlock except %q is not an IPv4 CIDR", e)
		}
		var next []netip.Prefix
		for _, p := range set {
			next = append(next, subtract(p, ex.Masked())...)
		}
		set = next
	}
	return set, nil
}

// subtract returns p minus x as prefixes.
func subtract(p, x netip.Prefix) []netip.Prefix {
	if !p.Overlaps(x) {
		return []netip.Prefix{p}
	}
	if x.Bits() <= p.Bits() {
		return nil // x covers p
	}
	// Split p in halves; keep the half without x, recurse into the other.
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	b := p.Addr().As4()
	bit := p.Bits()
	b[bit/8] |= 1 << (7 - bit%8)
	hi := netip.PrefixFrom(netip.AddrFrom4(b), p.Bits()+1)
	if lo.Overlaps(x) {
		return append(subtract(lo, x), hi)
	}
	return append([]netip.Prefix{lo}, subtract(hi, x)...)
}

// protoNumber maps a NetworkPolicyPort protocol (default TCP).
func protoNumber(p *corev1.Protocol) (uint8, bool) {
	if p == nil {
		return 6, true
	}
	switch *p {
	case corev1.ProtocolTCP:
		return 6, true
	case corev1.ProtocolUDP:
		return 17, true
	case corev1.ProtocolSCTP:
		return 132, true
	}
	return 0, false
}

// namedPortAnywhere is an egress rule per pod of self's tenant that has a port name
// (with protocol proto), to that pod's /32 on its number.
func namedPortAnywhere(self PolicyPod, name string, p *corev1.Protocol, proto uint8, byNS map[string][]PolicyPod) []model.K8sPodRule {
	var out []model.K8sPodRule
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		for _, pod := range byNS[ns] {
			if pod.EndpointID == "" || !pod.IP.Is4() || pod.Tenant != self.Tenant || self.Tenant == "" {
				continue
			}
			if n, ok := namedPort(pod, name, p); ok {
				out = append(out, model.K8sPodRule{Remote: netip.PrefixFrom(pod.IP, 32).String(), Proto: proto, PortMin: n, PortMax: n})
			}
		}
	}
	return out
}

// namedPort finds a container port by name (and protocol) in pod.
func namedPort(pod PolicyPod, name string, proto *corev1.Protocol) (uint16, bool) {
	want := corev1.ProtocolTCP
	if proto != nil {
		want = *proto
	}
	for _, cp := range pod.Ports {
		p := cp.Protocol
		if p == "" {
			p = corev1.ProtocolTCP
		}
		if cp.Name == name && p == want && cp.ContainerPort > 0 && cp.ContainerPort <= 65535 {
			return uint16(cp.ContainerPort), true
		}
	}
	return 0, false
}

// aggregateRules merges the remote prefixes of rules with the same protocol and ports
// (repeated and covered prefixes dropped, sibling prefixes joined: a namespace's pods with
// consecutive addresses become a few rules), groups in order of first appearance.
func aggregateRules(rs []model.K8sPodRule) []model.K8sPodRule {
	type portKey struct {
		proto    uint8
		min, max uint16
	}
	var order []portKey
	groups := map[portKey][]netip.Prefix{}
	for _, r := range rs {
		k := portKey{r.Proto, r.PortMin, r.PortMax}
		p, err := netip.ParsePrefix(r.Remote)
		if err != nil {
			continue // compiled here: never happens
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], p.Masked())
	}
	var out []model.K8sPodRule
	for _, k := range order {
		for _, p := range aggregatePrefixes(groups[k]) {
			out = append(out, model.K8sPodRule{Remote: p.String(), Proto: k.proto, PortMin: k.min, PortMax: k.max})
		}
	}
	return out
}

// aggregatePrefixes returns the smallest sorted set of IPv4 prefixes covering exactly ps.
func aggregatePrefixes(ps []netip.Prefix) []netip.Prefix {
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range sorted {
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue // covered by the previous one
		}
		out = append(out, p)
	}
	for merged := true; merged; {
		merged = false
		next := out[:0:0]
		for i := 0; i < len(out); i++ {
			if i+1 < len(out) && out[i].Bits() == out[i+1].Bits() && out[i].Bits() > 0 {
				parent := netip.PrefixFrom(out[i].Addr(), out[i].Bits()-1).Masked()
				if parent.Contains(out[i+1].Addr()) {
					next = append(next, parent)
					i++
					merged = true
					continue
				}
			}
			next = append(next, out[i])
		}
		out = next
	}
	return out
}

// PolicyWatcher watches NetworkPolicies, pods and namespaces cluster-wide (netmaster's
// leader runs it); pods are trimmed to their labels and container ports.
type PolicyWatcher struct {
	*informerSet
	pols networkinglisters.NetworkPolicyLister
	pods corelisters.PodLister
	nss  corelisters.NamespaceLister
}

// NewPolicyWatcher builds the watcher; Run starts it.
func NewPolicyWatcher(cs kubernetes.Interface) (*PolicyWatcher, error) {
	w := &PolicyWatcher{informerSet: newInformerSet(cs)}
	pi := w.factory.Networking().V1().NetworkPolicies()
	po := w.factory.Core().V1().Pods()
	ni := w.factory.Core().V1().Namespaces()
	if err := po.Informer().SetTransform(trimPolicyPod); err != nil {
		return nil, fmt.Errorf("policy watcher: pod transform: %w", err)
	}
	if err := ni.Informer().SetTransform(trimNamespace); err != nil {
		return nil, fmt.Errorf("policy watcher: namespace transform: %w", err)
	}
	w.pols, w.pods, w.nss = pi.Lister(), po.Lister(), ni.Lister()
	for _, inf := range []cache.SharedIndexInformer{pi.Informer(), po.Informer(), ni.Informer()} {
		if err := w.watch(inf); err != nil {
			return nil, fmt.Errorf("policy watcher: %w", err)
		}
	}
	return w, nil
}

// trimPolicyPod keeps what compilation reads: name, namespace, labels, container ports.
func trimPolicyPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels, ResourceVersion: p.ResourceVersion},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}} // (only its node's endpoints are the pod's)
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return out, nil
}

// Inputs returns what CompilePolicies needs from the cache: the policies, the pods (no
// endpoints filled in) and every namespace's labels.
func (w *PolicyWatcher) Inputs() ([]*networkingv1.NetworkPolicy, []PolicyPod, map[string]map[string]string, error) {
	pols, err := w.pols.List(labels.Everything())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list networkpolicies: %w", err)
	}
	pods, err := w.pods.List(labels.Everything())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list pods: %w", err)
	}
	nss, err := w.nss.List(labels.Everything())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list namespaces: %w", err)
	}
	nsLabels := make(map[string]map[string]string, len(nss))
	for _, n := range nss {
		nsLabels[n.Name] = n.Labels
	}
	out := make([]PolicyPod, 0, len(pods))
	for _, p := range pods {
		pp := PolicyPod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Node: p.Spec.NodeName}
		for _, c := range p.Spec.Containers {
			pp.Ports = append(pp.Ports, c.Ports...)
		}
		out = append(out, pp)
	}
	return pols, out, nsLabels, nil
}
