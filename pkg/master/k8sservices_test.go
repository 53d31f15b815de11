package master

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// podEP creates an endpoint the way an agent with a Kubernetes API does: for pod ns/name.
func (e *env) podEP(tenant, net, container, pod string) model.CfgEndpointState {
	e.t.Helper()
	var r model.CreateEndpointResponse
	e.ok("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: tenant, NetworkName: net,
		EndpointID: container, EPCommonName: strings.ReplaceAll(pod, "/", "-"), K8sPod: pod, ConfigEP: model.ConfigEP{Container: container, Host: "host1"}}, &r)
	return r.EndpointConfig
}

// TestK8sServices: records of Kubernetes Services are checked like a Contiv serviceLB
// (tenant, node ports unique across all services) and more: a backend must be the Contiv
// endpoint of the very pod the EndpointSlice names, in the Service's namespace; the VIP may
// not shadow an address of the tenant; a taken node port is left out, not the Service; a
// Service whose endpoints are all outside Contiv gets no VIP. Unchanged records are not
// rewritten, and pruning deletes only prefixed records (and those of deleted tenants).
func TestK8sServices(t *testing.T) {
	e := newEnv(t, "routing")
	ctx := context.Background()
	e.net("default", "app", "vxlan", "10.20.0.0/24", "10.20.0.1", 0)
	web := e.podEP("default", "app", "c1", "prod/web-1")
	other := e.podEP("default", "app", "c2", "dev/db-1") // another namespace's pod
	plain := e.createEP("default", "app", "", "c3", "")  // attached without the API
	e.ok("POST", "/api/v1/serviceLBs/default:np/", `{"networkName":"app","ipAddress":"10.20.0.200","ports":["80:8080:TCP"],"nodePorts":["30080:80:TCP"],"selectors":["app=x"],"serviceName":"np","tenantName":"default"}`, nil)

	rec := model.CfgServiceLBState{ID: "k8s_prod_web:default", ServiceName: "k8s_prod_web", Tenant: "default", IPAddress: "10.96.0.10",
		Ports: []string{"80:8080:TCP"}, NodePorts: []string{"30081:80:TCP", "30080:80:UDP"}, Selectors: map[string]string{"app": "web"},
		Providers: map[string]*model.Provider{
			web.IPAddress:   {IPAddress: web.IPAddress, Container: "prod/web-1"},
			other.IPAddress: {IPAddress: other.IPAddress, Container: "dev/db-1"}, // a slice naming another namespace's pod
			plain.IPAddress: {IPAddress: plain.IPAddress},                        // no pod
			"10.20.0.250":   {IPAddress: "10.20.0.250", Container: "prod/ghost"}, // not a Contiv endpoint
		}}
	res := e.m.PutK8sService(ctx, "k8s_", rec)
	if res.Err != nil || !res.Written || len(res.Dropped) != 3 {
		t.Fatalf("put: %+v", res)
	}
	var st model.CfgServiceLBState
	if err := json.Unmarshal([]byte(e.rawGet(model.SvcLBStateKey(rec.ID))), &st); err != nil {
		t.Fatal(err)
	}
	p := st.Providers[web.IPAddress+":default"]
	if len(st.Providers) != 1 || p == nil || p.EpIDKey != web.ID || st.Selectors != nil || st.IPAddress != "10.96.0.10" {
		t.Fatalf("state %+v", st)
	}
	if got := e.rawGet(model.NodePortKey(30081, "tcp")); got != `"k8s_prod_web:default"` {
		t.Fatalf("node port claim %s", got)
	}
	// Unchanged: not rewritten.
	_, rev := e.snapshot()
	if res := e.m.PutK8sService(ctx, "k8s_", rec); res.Err != nil || res.Written {
		t.Fatalf("unchanged put: %+v", res)
	}
	if _, rev2 := e.snapshot(); rev2 != rev {
		t.Fatal("unchanged record rewritten")
	}
	// A node port another service holds, or outside the range, is left out; the rest works.
	r2 := rec
	r2.NodePorts = []string{"30080:80:TCP", "8080:80:TCP", "30081:80:TCP"}
	res = e.m.PutK8sService(ctx, "k8s_", r2)
	if res.Err != nil || len(res.NodePortsDropped) != 2 || !strings.Contains(strings.Join(res.NodePortsDropped, " "), "np:default") {
		t.Fatalf("node port conflicts: %+v", res)
	}
	if got := e.rawGet(model.NodePortKey(30080, "tcp")); got != `"np:default"` {
		t.Fatalf("the Contiv service lost its node port: %s", got)
	}

	// Refused, nothing written: an unknown tenant, a name without the prefix, a malformed
	// port, a VIP equal to a Contiv VIP or to an endpoint of the tenant.
	before, _ := e.snapshot()
	bad := map[string]func(*model.CfgServiceLBState){
		"unknown tenant": func(r *model.CfgServiceLBState) { r.Tenant, r.ID = "nosuch", "k8s_prod_web:nosuch" },
		"no prefix":      func(r *model.CfgServiceLBState) { r.ServiceName, r.ID = "web", "web:default" },
		"bad port":       func(r *model.CfgServiceLBState) { r.Ports = []string{"80:0:TCP"} },
		"contiv VIP":     func(r *model.CfgServiceLBState) { r.IPAddress = "10.20.0.200" },
		"endpoint IP":    func(r *model.CfgServiceLBState) { r.IPAddress = other.IPAddress },
		"not IPv4":       func(r *model.CfgServiceLBState) { r.IPAddress = "fd00::1" },
	}
	for name, mod := range bad {
		r := rec
		mod(&r)
		if res := e.m.PutK8sService(ctx, "k8s_", r); res.Err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if after, _ := e.snapshot(); after != before {
		t.Fatal("a refused record changed state")
	}
	r3 := rec
	r3.IPAddress = "10.20.0.200"
	res = e.m.PutK8sService(ctx, "k8s_", r3)
	var ae *apiError
	if !errors.As(res.Err, &ae) || ae.code != 409 || !strings.Contains(res.Err.Error(), "np:default") {
		t.Fatalf("VIP of a Contiv service: %v", res.Err)
	}

	// Endpoints all outside Contiv: no VIP, and the earlier record goes with its node ports.
	r4 := rec
	r4.Providers = map[string]*model.Provider{"192.168.1.10": {IPAddress: "192.168.1.10"}}
	if res := e.m.PutK8sService(ctx, "k8s_", r4); res.Err != nil || !res.Skipped {
		t.Fatalf("all endpoints foreign: %+v", res)
	}
	if e.rawGet(model.SvcLBStateKey(rec.ID)) != "" || e.rawGet(model.NodePortKey(30081, "tcp")) != "" {
		t.Fatal("a Service without Contiv endpoints kept its VIP")
	}

	// Prune: the Contiv service stays, Kubernetes ones not kept go, and so do kept ones
	// whose tenant was deleted.
	if res := e.m.PutK8sService(ctx, "k8s_", rec); res.Err != nil {
		t.Fatal(res.Err)
	}
	gone, err := e.m.PruneK8sServices(ctx, "k8s_", map[string]bool{})
	if err != nil || len(gone) != 1 || gone[0] != rec.ID {
		t.Fatalf("prune: %v %v", gone, err)
	}
	if e.rawGet(model.SvcLBStateKey(rec.ID)) != "" || e.rawGet(model.NodePortKey(30081, "tcp")) != "" || e.rawGet(model.SvcLBStateKey("np:default")) == "" {
		t.Fatal("prune removed the wrong records")
	}
	e.ok("POST", "/api/v1/tenants/blue/", `{"tenantName":"blue"}`, nil)
	blue := model.CfgServiceLBState{ID: "k8s_prod_b:blue", ServiceName: "k8s_prod_b", Tenant: "blue", IPAddress: "10.96.0.11", Ports: []string{"80:80:TCP"}}
	if res := e.m.PutK8sService(ctx, "k8s_", blue); res.Err != nil || !res.Written {
		t.Fatalf("blue: %+v", res)
	}
	e.ok("DELETE", "/api/v1/tenants/blue/", nil, nil)
	if gone, err := e.m.PruneK8sServices(ctx, "k8s_", map[string]bool{blue.ID: true}); err != nil || len(gone) != 1 {
		t.Fatalf("record of a deleted tenant kept: %v %v", gone, err)
	}
}

// TestK8sPodPolicies: a pod's NetworkPolicy record is written only for that pod's own
// endpoint and address, unchanged records are not rewritten, and deleting the endpoint
// deletes its record.
func TestK8sPodPolicies(t *testing.T) {
	e := newEnv(t, "routing")
	ctx := context.Background()
	e.net("default", "app", "vxlan", "10.21.0.0/24", "10.21.0.1", 0)
	web := e.podEP("default", "app", "c1", "prod/web-1")
	eps, err := e.m.K8sPodEndpoints(ctx)
	if err != nil || len(eps["prod/web-1"]) != 1 || eps["prod/web-1"][0].ID != web.ID || eps["prod/web-1"][0].IP.String() != web.IPAddress || eps["prod/web-1"][0].Tenant != "default" {
		t.Fatalf("pod endpoints %+v %v", eps, err)
	}
	rec := model.K8sPodPolicy{ID: web.ID, Pod: "prod/web-1", IPAddress: web.IPAddress, IngressIsolated: true,
		Ingress: []model.K8sPodRule{{Remote: "10.21.0.0/24"}}}
	for _, bad := range []model.K8sPodPolicy{
		{ID: web.ID, Pod: "prod/other", IPAddress: web.IPAddress},     // another pod's name
		{ID: web.ID, Pod: "prod/web-1", IPAddress: "10.21.0.99"},      // not its address
		{ID: "app.default-nosuch", Pod: "prod/web-1", IPAddress: "1"}, // no endpoint
		{ID: web.ID, Pod: "no-slash", IPAddress: web.IPAddress},
	} {
		if _, err := e.m.PutK8sPodPolicy(ctx, bad); err == nil {
			t.Errorf("record %+v accepted", bad)
		}
	}
	if w, err := e.m.PutK8sPodPolicy(ctx, rec); err != nil || !w {
		t.Fatalf("put: %v %v", w, err)
	}
	if w, err := e.m.PutK8sPodPolicy(ctx, rec); err != nil || w {
		t.Fatalf("unchanged put: written=%v %v", w, err)
	}
	if ids, err := e.m.K8sPodPolicyIDs(ctx); err != nil || len(ids) != 1 || ids[0] != web.ID {
		t.Fatalf("ids %v %v", ids, err)
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "app", EndpointID: "c1"}, nil)
	if ids, err := e.m.K8sPodPolicyIDs(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("after the endpoint was deleted: ids %v %v", ids, err)
	}
}
