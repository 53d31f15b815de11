package k8s_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/contivbpf/contivbpf/pkg/k8s"
)

func slice(name string, port int32, portName string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	proto := corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}}, Endpoints: eps}
}

func ep(ip string, ready, terminating *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
}

func TestServiceRecord(t *testing.T) {
	yes, no := true, false
	base := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "prod"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Type: corev1.ServiceTypeClusterIP,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}}
	}

	// Named target port from the slices; only ready, not terminating, IPv4 endpoints.
	s := base()
	v6 := slice("v6", 8080, "http", ep("fd00::1", nil, nil))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	rec, warns, ok := k8s.ServiceRecord(s, nil, []*discoveryv1.EndpointSlice{
		slice("a", 8080, "http", ep("10.1.0.2", &yes, nil), ep("10.1.0.3", &no, nil), ep("10.1.0.4", nil, nil), ep("10.1.0.5", &yes, &yes)), v6})
	if !ok || len(warns) != 0 || rec.ID != "k8s_prod_web:default" || rec.Tenant != "default" || rec.IPAddress != "10.96.0.10" ||
		!slices.Equal(rec.Ports, []string{"80:8080:TCP"}) || len(rec.NodePorts) != 0 {
		t.Fatalf("record %+v warnings %v ok %v", rec, warns, ok)
	}
	var got []string
	for ip := range rec.Providers {
		got = append(got, ip)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"10.1.0.2", "10.1.0.4"}) {
		t.Fatalf("providers %v, want the ready ones", got)
	}
	// Terminating and still serving: a draining provider; terminating and not serving: out.
	serving := ep("10.1.0.6", &no, &yes)
	serving.Conditions.Serving = &yes
	gone := ep("10.1.0.7", &no, &yes)
	gone.Conditions.Serving = &no
	rec, _, _ = k8s.ServiceRecord(s, nil, []*discoveryv1.EndpointSlice{slice("a", 8080, "http", ep("10.1.0.2", &yes, nil), serving, gone)})
	if p := rec.Providers["10.1.0.6"]; len(rec.Providers) != 2 || p == nil || !p.Draining || rec.Providers["10.1.0.2"].Draining {
		t.Fatalf("terminating endpoints: %+v", rec.Providers)
	}

	// NodePort type, tenant label, numeric target port without slices, SCTP reported,
	// ClientIP affinity kept.
	s = base()
	s.Labels = map[string]string{k8s.LabelTenant: "blue"}
	s.Spec.Type = corev1.ServiceTypeNodePort
	s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	s.Spec.Ports = []corev1.ServicePort{
		{Name: "dns", Port: 53, TargetPort: intstr.FromInt(5353), Protocol: corev1.ProtocolUDP, NodePort: 30053},
		{Name: "s", Port: 9, Protocol: corev1.ProtocolSCTP},
	}
	rec, warns, ok = k8s.ServiceRecord(s, nil, nil)
	if !ok || rec.ID != "k8s_prod_web:blue" || !slices.Equal(rec.Ports, []string{"53:5353:UDP"}) || !slices.Equal(rec.NodePorts, []string{"30053:53:UDP"}) || len(rec.Providers) != 0 {
		t.Fatalf("node port record %+v", rec)
	}
	if w := strings.Join(warns, "|"); strings.Contains(w, "sessionAffinity") || !strings.Contains(w, "SCTP") || rec.SessionAffinity != "ClientIP" {
		t.Fatalf("warnings %v, affinity %q", warns, rec.SessionAffinity)
	}

	// Slices that disagree on a port's target: the later one's endpoints are left out.
	rec, warns, _ = k8s.ServiceRecord(base(), nil, []*discoveryv1.EndpointSlice{
		slice("a", 8080, "http", ep("10.1.0.2", nil, nil)), slice("b", 9090, "http", ep("10.1.0.3", nil, nil))})
	if len(rec.Providers) != 1 || rec.Providers["10.1.0.2"] == nil || len(warns) != 1 || !strings.Contains(warns[0], "EndpointSlice b") {
		t.Fatalf("inconsistent slices: %+v %v", rec.Providers, warns)
	}

	// A namespace bound to a tenant decides; a Service label naming another tenant is
	// refused (a namespace's users cannot place VIPs or node ports in another tenant).
	s = base()
	if rec, _, ok := k8s.ServiceRecord(s, map[string]string{k8s.LabelTenant: "blue"}, nil); !ok || rec.Tenant != "blue" || rec.ID != "k8s_prod_web:blue" {
		t.Fatalf("bound namespace: %+v", rec)
	}
	s.Labels = map[string]string{k8s.LabelTenant: "red"}
	if rec, warns, ok := k8s.ServiceRecord(s, map[string]string{k8s.LabelTenant: "blue"}, nil); ok || len(warns) != 1 || !strings.Contains(warns[0], "bound to tenant \"blue\"") {
		t.Fatalf("Service label against its namespace's tenant: %+v %v", rec, warns)
	}

	// No VIP: headless, ExternalName, not yet allocated, IPv6 only; no TCP/UDP port.
	for name, mod := range map[string]func(*corev1.Service){
		"headless":     func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone },
		"externalName": func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName; s.Spec.ClusterIP = "" },
		"unallocated":  func(s *corev1.Service) { s.Spec.ClusterIP = "" },
		"ipv6":         func(s *corev1.Service) { s.Spec.ClusterIP = "fd00::10"; s.Spec.ClusterIPs = []string{"fd00::10"} },
		"sctp only":    func(s *corev1.Service) { s.Spec.Ports[0].Protocol = corev1.ProtocolSCTP },
	} {
		s := base()
		mod(s)
		if rec, _, ok := k8s.ServiceRecord(s, nil, nil); ok {
			t.Errorf("%s: programmed %+v", name, rec)
		}
	}
}
