package sim

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestKubernetesServices runs a real kube-apiserver inside host 1's namespace, netmaster in
// kubernetes mode syncing Services/EndpointSlices from it, and netplugins reading pod
// labels from it; pods on two hosts are reached through a Service's ClusterIP on both
// datapaths, only ready endpoints are used, and unsupported or bad input is reported.
func TestKubernetesServices(t *testing.T) {
	testroot.Need(t)
	for _, dp := range []string{"ebpf", "ovs"} {
		t.Run(dp, func(t *testing.T) { kubernetesServices(t, dp) })
	}
}

func kubernetesServices(t *testing.T, dp string) {
	bin := buildBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 2, BinDir: bin, Dataplane: dp, KubeAPI: true})
	api := c.KubeAPI
	if dp == "ovs" {
		t.Cleanup(func() {
			if t.Failed() { // what the bridges and the userspace tunnel state held when it failed
				for _, h := range c.Hosts {
					dir := filepath.Join(c.WorkDir, h.Name, "ovs")
					out, _ := exec.Command("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "unix:"+filepath.Join(dir, "contivbr.mgmt")).CombinedOutput()
					t.Logf("%s flows:\n%s", h.Name, out)
					for _, cmd := range []string{"tnl/neigh/show", "ovs/route/show", "tnl/ports/show", "dpctl/dump-flows"} {
						ac := exec.Command("ovs-appctl", "-t", filepath.Join(dir, "ovs-vswitchd.ctl"), cmd)
						out, _ := ac.CombinedOutput()
						t.Logf("%s %s:\n%s", h.Name, cmd, out)
					}
				}
			}
		})
	}
	if err := c.CreateNetwork(ctx, "default", "kn", "vxlan", "10.105.0.0/24", "10.105.0.1"); err != nil {
		t.Fatal(err)
	}
	cs := api.Admin
	// Pods exist in the API before the runtime attaches them: their label picks the network
	// (the CNI request names none).
	pods := []*Container{}
	for i, h := range []*Host{c.Hosts[0], c.Hosts[1], c.Hosts[1]} {
		name := fmt.Sprintf("web%d", i)
		if i == 2 {
			name = "client"
		}
		api.Pod(t, "default", name, h.Name, map[string]string{k8s.LabelNetwork: "kn", "app": strings.TrimRight(name, "0123456789")})
		ct, err := c.AddContainer(ctx, h, name, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if !ct.IP.Contains(netip.MustParseAddr("10.105.0.2")) {
			t.Fatalf("pod %s got %v: its label's network was not used", name, ct.IP)
		}
		pods = append(pods, ct)
	}
	web0, web1, client := pods[0], pods[1], pods[2]
	// A pod whose label names a network that does not exist: the ADD fails naming it.
	api.Pod(t, "default", "lost", c.Hosts[0].Name, map[string]string{k8s.LabelNetwork: "nosuch"})
	if _, err := c.AddContainer(ctx, c.Hosts[0], "lost", "", ""); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("pod labelled with an unknown network: %v", err)
	}
	for _, be := range []*Container{web0, web1} {
		if err := c.ServeName(be, 8080); err != nil {
			t.Fatal(err)
		}
	}

	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP
	// No controller manager runs: the test writes the EndpointSlice the endpointslice
	// controller would (the named target port resolves to 8080 there).
	putSlice(ctx, t, cs, "web", map[*Container]bool{web0: true, web1: true})

	// The overlay first: the client reaches the pod on the other host directly.
	eventually(t, "client reaches web0 across hosts", 30*time.Second, func() error {
		_, err := AskName(ctx, client, net.JoinHostPort(web0.IP.Addr().String(), "8080"))
		return err
	})
	seen := map[string]bool{}
	eventually(t, "ClusterIP reaches both pods", 30*time.Second, func() error {
		name, err := AskName(ctx, client, net.JoinHostPort(vip, "80"))
		if err != nil {
			return err
		}
		seen[name] = true
		if !seen["web0"] || !seen["web1"] {
			return fmt.Errorf("answered by %v so far", seen)
		}
		return nil
	})
	// sessionAffinity ClientIP: the client's connections all reach one pod.
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	if svc, err = cs.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "affinity in the state", 20*time.Second, func() error {
		if r := serviceState(ctx, t, c, "k8s_default_web:default"); r.SessionAffinity != "ClientIP" {
			return fmt.Errorf("sessionAffinity %q", r.SessionAffinity)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // the agents apply the record
	sticky := map[string]int{}
	for i := 0; i < 8; i++ {
		name, err := AskName(ctx, client, net.JoinHostPort(vip, "80"))
		if err != nil {
			t.Fatal(err)
		}
		sticky[name]++
	}
	if len(sticky) != 1 {
		t.Fatalf("with sessionAffinity ClientIP the client reached %v", sticky)
	}
	rec := serviceState(ctx, t, c, "k8s_default_web:default")
	if rec.IPAddress != vip || len(rec.Ports) != 1 || rec.Ports[0] != "80:8080:TCP" || len(rec.NodePorts) != 1 || len(rec.Providers) != 2 {
		t.Fatalf("serviceLB state of the Service: %+v", rec)
	}

	// web0 is no longer ready: new connections go to web1 only.
	putSlice(ctx, t, cs, "web", map[*Container]bool{web0: false, web1: true})
	eventually(t, "not-ready endpoint left out", 20*time.Second, func() error {
		if r := serviceState(ctx, t, c, "k8s_default_web:default"); len(r.Providers) != 1 {
			return fmt.Errorf("%d providers", len(r.Providers))
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // the agents apply the record
	for i := 0; i < 6; i++ {
		name, err := AskName(ctx, client, net.JoinHostPort(vip, "80"))
		if err != nil || name != "web1" {
			t.Fatalf("after web0 turned not ready: %q %v", name, err)
		}
	}

	// Bad input: an endpoint address no Contiv endpoint holds is left out (and reported);
	// a Service labelled with a tenant that does not exist is refused; internalTrafficPolicy
	// Local is reported as unsupported. None of it disturbs the working Service.
	local := corev1.ServiceInternalTrafficPolicyLocal
	slice := putSlice(ctx, t, cs, "web", map[*Container]bool{web1: true})
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.105.0.250"}})
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ghost", Labels: map[string]string{k8s.LabelTenant: "nosuch"}},
		Spec: corev1.ServiceSpec{InternalTrafficPolicy: &local,
			Ports: []corev1.ServicePort{{Port: 81, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "events for bad input", 20*time.Second, func() error {
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var got []string
		for _, e := range evs.Items {
			got = append(got, e.InvolvedObject.Name+" "+e.Reason+": "+e.Message)
		}
		all := strings.Join(got, "\n")
		for _, want := range []string{"ghost ContivServiceRefused", "tenant", "internalTrafficPolicy Local is not supported", "web ContivServicePartlySupported", "10.105.0.250"} {
			if !strings.Contains(all, want) {
				return fmt.Errorf("no %q in events:\n%s", want, all)
			}
		}
		return nil
	})
	if r := serviceState(ctx, t, c, "k8s_default_web:default"); len(r.Providers) != 1 {
		t.Fatalf("unknown endpoint address reached the state: %+v", r.Providers)
	}
	if name, err := AskName(ctx, client, net.JoinHostPort(vip, "80")); err != nil || name != "web1" {
		t.Fatalf("Service after bad input: %q %v", name, err)
	}
	// Programmed: web and the API server's own "kubernetes" Service (its endpoint, the API
	// server on the host network, is no Contiv endpoint: left out and reported). Failed: ghost.
	metrics, err := masterMetrics(c)
	if err != nil || !strings.Contains(metrics, "contiv_k8s_services_failed 1") || !strings.Contains(metrics, "contiv_k8s_services 2") {
		t.Fatalf("netmaster metrics: %v\n%s", err, grepLines(metrics, "contiv_"))
	}

	hostsInSync(ctx, t, c, bin)
	// netctl trace through the VIP on the client's host names the service's choice.
	out, err := Exec(ctx, client.Host.Name, filepath.Join(bin, "netctl"), "--agent-token", c.InspectToken, "trace", "--agent", "http://"+client.Host.Inspect,
		"--from", client.EndpointID, "--to", vip, "--port", "80")
	if err != nil || !strings.Contains(out, vip+":80 is a service VIP: backend ") || strings.Contains(out, "verdict: dropped") {
		t.Errorf("netctl trace through the VIP (%s): %v\n%s", dp, err, out)
	}

	// Deleting the Service removes its VIP from every datapath.
	if err := cs.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Service deleted", 20*time.Second, func() error {
		if _, err := AskName(ctx, client, net.JoinHostPort(vip, "80")); err == nil {
			return fmt.Errorf("the VIP still answers")
		}
		return nil
	})
}

// putSlice writes the Service's one EndpointSlice: the pods (their pod name is the part of
// the container name after the host's) with their readiness, port "http" = 8080.
func putSlice(ctx context.Context, t *testing.T, cs kubernetes.Interface, svc string, ready map[*Container]bool) *discoveryv1.EndpointSlice {
	t.Helper()
	name, port, proto := "http", int32(8080), corev1.ProtocolTCP
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for ct, r := range ready {
		r := r
		pod := strings.TrimPrefix(ct.Name, ct.Host.Name+"-")
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ct.IP.Addr().String()}, Conditions: discoveryv1.EndpointConditions{Ready: &r},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod}})
	}
	old, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, sl.Name, metav1.GetOptions{})
	if err == nil {
		sl.ResourceVersion = old.ResourceVersion
		out, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	out, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// serviceState is netmaster's serviceLB state record id (GET /services), empty if none.
func serviceState(ctx context.Context, t *testing.T, c *Cluster, id string) model.CfgServiceLBState {
	t.Helper()
	var all []model.CfgServiceLBState
	if err := c.MasterDo(ctx, "GET", "/services", nil, &all); err != nil {
		t.Fatalf("serviceLB state: %v", err)
	}
	for _, st := range all {
		if st.ID == id {
			return st
		}
	}
	return model.CfgServiceLBState{}
}

func masterMetrics(c *Cluster) (string, error) {
	resp, err := c.httpClient(c.Hosts[0].Name).Get(c.MasterURL() + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
