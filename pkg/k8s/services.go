package k8s

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// ServicePrefix starts the serviceLB state names of Kubernetes Services:
// "k8s_<namespace>_<name>". '_' is in neither Contiv's nor Kubernetes' names, so these
// never collide with a Contiv serviceLB or with each other.
const ServicePrefix = "k8s_"

// ServiceName is the serviceLB name of Kubernetes Service namespace/name.
func ServiceName(namespace, name string) string { return ServicePrefix + namespace + "_" + name }

// DefaultTenant is the tenant of a Service without an io.contiv.tenant label (Contiv's).
const DefaultTenant = "default"

// ServiceRecord maps one Service (in a namespace with nsLabels) and its EndpointSlices onto
// Contiv's serviceLB state (what
// every agent programs, on both datapaths): the ClusterIP as the VIP, one
// "port:targetPort:PROTO" per TCP/UDP port, "nodePort:port:PROTO" for NodePort and
// LoadBalancer Services, the ready IPv4 endpoints as providers and the terminating ones
// that still serve as draining providers (not-ready ones are left out), sessionAffinity
// ClientIP. ok is false for Services that get no VIP (headless,
// ExternalName, no IPv4 ClusterIP). Warnings name what is not supported and was ignored.
// Providers carry only their address; netmaster resolves and checks them.
func ServiceRecord(svc *corev1.Service, nsLabels map[string]string, slices_ []*discoveryv1.EndpointSlice) (rec model.CfgServiceLBState, warnings []string, ok bool) {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return rec, nil, false
	}
	var vip netip.Addr
	for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
			vip = a
			break
		}
	}
	if !vip.IsValid() { // headless ("None"), not yet allocated, or IPv6 only
		return rec, nil, false
	}
	tenant, err := TenantOf(svc.Namespace, nsLabels, svc.Labels)
	if err != nil {
		return rec, []string{"not programmed: " + err.Error()}, false
	}
	if tenant == "" {
		tenant = DefaultTenant
	}
	name := ServiceName(svc.Namespace, svc.Name)
	rec = model.CfgServiceLBState{
		ID: model.ServiceID(name, tenant), ServiceName: name, Tenant: tenant, IPAddress: vip.String(),
		Selectors: svc.Spec.Selector, Providers: map[string]*model.Provider{},
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		rec.SessionAffinity = string(corev1.ServiceAffinityClientIP)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			warnings = append(warnings, "sessionAffinity timeoutSeconds is not applied: a client keeps its endpoint while the endpoints do not change")
		}
	}
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		warnings = append(warnings, "externalTrafficPolicy Local is not supported: node ports balance over every endpoint")
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		warnings = append(warnings, "internalTrafficPolicy Local is not supported: the VIP balances over every endpoint")
	}
	if len(svc.Spec.ExternalIPs) > 0 || len(svc.Status.LoadBalancer.Ingress) > 0 {
		warnings = append(warnings, "external and load-balancer IPs are not programmed: only the ClusterIP and node ports")
	}

	// The slices, in a stable order; their ports resolve each Service port's target (named
	// target ports too). The datapath has one target port per Service port, so endpoints
	// of a slice that resolves a port differently from the first are left out.
	sl := slices.Clone(slices_)
	slices.SortFunc(sl, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	targets := map[string]int32{} // service port name -> target port
	for _, s := range sl {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		sliceTargets := map[string]int32{}
		for _, p := range s.Ports {
			if p.Port != nil {
				sliceTargets[deref(p.Name)] = *p.Port
			}
		}
		consistent := true
		for n, t := range sliceTargets {
			if old, seen := targets[n]; seen && old != t {
				consistent = false
			}
		}
		if !consistent {
			warnings = append(warnings, fmt.Sprintf("EndpointSlice %s maps a port to another target port than the others: its endpoints are left out", s.Name))
			continue
		}
		for n, t := range sliceTargets {
			targets[n] = t
		}
		for _, ep := range s.Endpoints {
			// Terminating and still serving: drained (its connections go on, no new
			// ones); terminating and not serving, or not ready: left out.
			terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			draining := terminating && ep.Conditions.Serving != nil && *ep.Conditions.Serving
			if (terminating && !draining) || (!terminating && ep.Conditions.Ready != nil && !*ep.Conditions.Ready) {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !ip.Is4() {
					continue
				}
				if old := rec.Providers[ip.String()]; old != nil && !old.Draining {
					continue // listed twice: serving beats draining
				}
				p := &model.Provider{IPAddress: ip.String(), Tenant: tenant, Draining: draining}
				if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
					p.Container = ep.TargetRef.Namespace + "/" + ep.TargetRef.Name
				}
				rec.Providers[ip.String()] = p
			}
		}
	}
	for _, sp := range svc.Spec.Ports {
		proto := strings.ToUpper(string(sp.Protocol))
		if proto == "" {
			proto = "TCP"
		}
		if proto != "TCP" && proto != "UDP" {
			warnings = append(warnings, fmt.Sprintf("port %d/%s: only TCP and UDP are balanced", sp.Port, proto))
			continue
		}
		// The slices' port of the same name decides (that resolves named target ports);
		// without one, a numeric targetPort, else the port itself (a named target port no
		// slice resolves has no endpoints to send to anyway).
		target, found := targets[sp.Name]
		if !found {
			target = sp.Port
			if sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal > 0 {
				target = sp.TargetPort.IntVal
			}
		}
		rec.Ports = append(rec.Ports, strconv.Itoa(int(sp.Port))+":"+strconv.Itoa(int(target))+":"+proto)
		if sp.NodePort != 0 && (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) {
			rec.NodePorts = append(rec.NodePorts, strconv.Itoa(int(sp.NodePort))+":"+strconv.Itoa(int(sp.Port))+":"+proto)
		}
	}
	if len(rec.Ports) == 0 {
		return rec, append(warnings, "no TCP or UDP port: nothing to balance"), false
	}
	return rec, warnings, true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// informerSet runs a shared informer factory and reports, coalesced, that something in
// it changed (the watchers below embed it).
type informerSet struct {
	factory informers.SharedInformerFactory
	synced  []cache.InformerSynced
	changed chan struct{} // buffered(1): a pending change
}

func newInformerSet(cs kubernetes.Interface) *informerSet {
	return &informerSet{factory: informers.NewSharedInformerFactory(cs, 0), changed: make(chan struct{}, 1)}
}

// watch makes every add, update and delete of inf a change, and waits for its first list.
func (s *informerSet) watch(inf cache.SharedIndexInformer) error {
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.kick() },
		UpdateFunc: func(any, any) { s.kick() },
		DeleteFunc: func(any) { s.kick() },
	}
	if _, err := inf.AddEventHandler(h); err != nil {
		return fmt.Errorf("informer handler: %w", err)
	}
	s.synced = append(s.synced, inf.HasSynced)
	return nil
}

func (s *informerSet) kick() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Changed delivers a value after changes (coalesced).
func (s *informerSet) Changed() <-chan struct{} { return s.changed }

// Run starts the informers and waits for their first lists; it returns false if ctx
// ended first. The informers stop with ctx.
func (s *informerSet) Run(ctx context.Context) bool {
	s.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		s.factory.Shutdown()
	}()
	return cache.WaitForCacheSync(ctx.Done(), s.synced...)
}

// ServiceWatcher watches Services and EndpointSlices cluster-wide (netmaster's leader runs
// it) and reports, on every change, the serviceLB records they map to.
type ServiceWatcher struct {
	*informerSet
	log    *slog.Logger
	svcs   corelisters.ServiceLister
	slices discoverylisters.EndpointSliceLister
	nss    corelisters.NamespaceLister
}

// NewServiceWatcher builds the watcher; Run starts it.
func NewServiceWatcher(cs kubernetes.Interface, log *slog.Logger) (*ServiceWatcher, error) {
	w := &ServiceWatcher{informerSet: newInformerSet(cs), log: log}
	si := w.factory.Core().V1().Services()
	ei := w.factory.Discovery().V1().EndpointSlices()
	ni := w.factory.Core().V1().Namespaces()
	w.svcs, w.slices, w.nss = si.Lister(), ei.Lister(), ni.Lister()
	for _, inf := range []cache.SharedIndexInformer{si.Informer(), ei.Informer(), ni.Informer()} {
		if err := w.watch(inf); err != nil {
			return nil, fmt.Errorf("service watcher: %w", err)
		}
	}
	return w, nil
}

// Records maps every Service now in the cache; warnings are keyed "namespace/name".
func (w *ServiceWatcher) Records() ([]model.CfgServiceLBState, map[string][]string, error) {
	svcs, err := w.svcs.List(labels.Everything())
	if err != nil {
		return nil, nil, fmt.Errorf("list services: %w", err)
	}
	warn := map[string][]string{}
	var out []model.CfgServiceLBState
	for _, s := range svcs {
		sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name})
		sl, err := w.slices.EndpointSlices(s.Namespace).List(sel)
		if err != nil {
			return nil, nil, fmt.Errorf("list endpointslices of %s/%s: %w", s.Namespace, s.Name, err)
		}
		ns, err := w.nss.Get(s.Namespace)
		if err != nil { // not in the cache yet: never let the Service's own label decide
			warn[s.Namespace+"/"+s.Name] = []string{"namespace not known yet: not programmed"}
			continue
		}
		rec, ws, ok := ServiceRecord(s, ns.Labels, sl)
		if len(ws) > 0 {
			warn[s.Namespace+"/"+s.Name] = ws
		}
		if ok {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b model.CfgServiceLBState) int { return cmp.Compare(a.ID, b.ID) })
	return out, warn, nil
}
