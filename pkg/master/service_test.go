package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

func TestServiceProviders(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "svcnet", "vxlan", "10.10.0.0/24", "10.10.0.1", 0)
	e.net("default", "app", "vxlan", "10.20.0.0/24", "10.20.0.1", 0)
	e.ok("POST", "/api/v1/serviceLBs/default:web/", `{"networkName":"svcnet","ipAddress":"10.10.0.100","ports":["80:8080:TCP"],"selectors":["app=web","tier=fe"],"serviceName":"web","tenantName":"default"}`, nil)
	ep := e.createEP("default", "app", "", "p1", "")
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, ContainerID: "p1", Tenant: "default",
		Network: "app", Event: "start", Labels: map[string]string{"app": "web", "tier": "fe", "x": "y"}}, nil)
	// An address that is no endpoint of the tenant never becomes a backend.
	if code, out := e.do("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: "10.20.0.99", Tenant: "default", Event: "start",
		Labels: map[string]string{"app": "web", "tier": "fe"}}); code != 422 || !strings.Contains(out, "not an endpoint") {
		t.Fatalf("updateEndpoint for a non-endpoint: %d %s", code, out)
	}
	if got := e.rawGet("/contiv.io/state/provider/web:default"); got != `{"id":"web:default","ServiceName":"web:default","Providers":["10.20.0.2"]}` {
		t.Fatalf("provider record %s", got)
	}
	var st model.CfgServiceLBState
	if err := json.Unmarshal([]byte(e.rawGet("/contiv.io/state/serviceLB/web:default")), &st); err != nil {
		t.Fatal(err)
	}
	p := st.Providers["10.20.0.2:default"]
	if st.IPAddress != "10.10.0.100" || p == nil || p.EpIDKey != "app.default-p1" || p.Services[0] != "web:default" {
		t.Fatalf("service state %+v", st)
	}
	var si model.ServiceLBInspect
	e.ok("GET", "/api/v1/inspect/serviceLBs/default:web/", nil, &si)
	if si.Oper.NumProviders != 1 || si.Oper.ServiceVip != "10.10.0.100" || si.Oper.Providers[0].Labels == "" {
		t.Fatalf("service inspect %+v", si.Oper)
	}
	// Identical re-post is a no-op; a changed one keeps the VIP.
	before, rev := e.snapshot()
	e.ok("POST", "/api/v1/serviceLBs/default:web/", `{"networkName":"svcnet","ipAddress":"10.10.0.100","ports":["80:8080:TCP"],"selectors":["app=web","tier=fe"],"serviceName":"web","tenantName":"default"}`, nil)
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("identical service re-post wrote state")
	}
	e.ok("POST", "/api/v1/serviceLBs/default:web/", `{"networkName":"svcnet","ports":["80:8080:TCP","443:8443:TCP"],"selectors":["app=web"],"serviceName":"web","tenantName":"default"}`, nil)
	var svc model.ServiceLB
	e.ok("GET", "/api/v1/serviceLBs/default:web/", nil, &svc)
	if svc.IpAddress != "" || len(svc.Ports) != 2 {
		t.Fatalf("updated service %+v: the config keeps what was posted (the VIP lives in Oper)", svc)
	}
	var si2 model.ServiceLBInspect
	e.ok("GET", "/api/v1/inspect/serviceLBs/default:web/", nil, &si2)
	if si2.Oper.ServiceVip != "10.10.0.100" {
		t.Fatalf("VIP not kept across the update: %+v", si2.Oper)
	}
	// Relabelled away from the selector, it is no backend any more (control plane issue,
	// item 7); relabelled back, it is one again.
	relabel := func(labels map[string]string) {
		t.Helper()
		e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, ContainerID: "p1", Tenant: "default",
			Network: "app", Event: "start", Labels: labels}, nil)
	}
	relabel(map[string]string{"app": "db"})
	if got := e.rawGet("/contiv.io/state/provider/web:default"); !strings.Contains(got, `"Providers":[]`) {
		t.Fatalf("provider after relabelling away from the selector %s", got)
	}
	relabel(map[string]string{"app": "web"})
	if got := e.rawGet("/contiv.io/state/provider/web:default"); !strings.Contains(got, `"Providers":["10.20.0.2"]`) {
		t.Fatalf("provider after relabelling back %s", got)
	}
	// Provider that dies is removed; deleting the endpoint removes its provider too.
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, Tenant: "default", Event: "die"}, nil)
	if got := e.rawGet("/contiv.io/state/provider/web:default"); !strings.Contains(got, `"Providers":[]`) {
		t.Fatalf("provider after die %s", got)
	}
	e.ok("DELETE", "/api/v1/serviceLBs/default:web/", nil, nil)
	if ns := netState(t, e, "svcnet.default"); ns.IPAllocMap.Test(100) {
		t.Fatal("VIP not released")
	}
}

func TestNoForwardingMode(t *testing.T) {
	e := newEnv(t, "")
	if got := e.rawGet(model.GlobConfigKey); !strings.Contains(got, `"fwd-mode":""`) {
		t.Fatalf("glob config %s", got)
	}
	code, out := e.do("POST", "/api/v1/networks/default:n/", model.Network{TenantName: "default", NetworkName: "n", Encap: "vxlan", Subnet: "10.1.1.0/24"})
	if code != http.StatusConflict || !strings.Contains(out, "forwarding mode") {
		t.Fatalf("network without fwd mode: %d %s", code, out)
	}
	// Setting it through the API unblocks network creation.
	var g model.Global
	e.ok("GET", "/api/v1/globals/global/", nil, &g)
	g.FwdMode = "routing"
	e.ok("POST", "/api/v1/globals/global/", g, nil)
	e.net("default", "n", "vxlan", "10.1.1.0/24", "", 0)
}

// A container's name is set only on the endpoint the caller names: never on whatever
// endpoint holds the address (a reused address, or another host's endpoint).
func TestUpdateEndpointName(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "app", "vxlan", "10.20.0.0/24", "10.20.0.1", 0)
	ep := e.createEP("default", "app", "", "p1", "")
	if code, out := e.do("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, Tenant: "default",
		Network: "app", Event: "start", EndpointID: "someone-else", EPCommonName: "web"}); code != 422 || !strings.Contains(out, "EPCommonName") {
		t.Fatalf("name for another endpoint: %d %s", code, out)
	}
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, Tenant: "default",
		Network: "app", Event: "start", EndpointID: ep.EndpointID, EPCommonName: "web"}, nil)
	var st model.CfgEndpointState
	if err := json.Unmarshal([]byte(e.rawGet(model.EpStateKey(ep.ID))), &st); err != nil {
		t.Fatal(err)
	}
	if st.EPCommonName != "web" {
		t.Errorf("epCommonName %q", st.EPCommonName)
	}
}

// TestEndpointLabelsBounded (control plane issue, item 7; found by review): labels a
// selector could not name, or beyond the bounds, are left out of what is stored and
// copied into service records, and the update goes on: the endpoint keeps its name and
// the services its other labels select (a buildpacks image's 6 KB JSON label included).
// Past the count or total bounds every label is left out.
func TestEndpointLabelsBounded(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "app", "vxlan", "10.20.0.0/24", "10.20.0.1", 0)
	e.ok("POST", "/api/v1/serviceLBs/default:web/", `{"networkName":"app","ipAddress":"10.20.0.100","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"web","tenantName":"default"}`, nil)
	ep := e.createEP("default", "app", "", "p1", "")
	post := func(labels map[string]string) {
		t.Helper()
		e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, ContainerID: "p1",
			Tenant: "default", Network: "app", Event: "start", EndpointID: "p1", EPCommonName: "web-1", Labels: labels}, nil)
	}
	stored := func() map[string]string {
		t.Helper()
		var st model.CfgServiceLBState
		if err := json.Unmarshal([]byte(e.rawGet(model.SvcLBStateKey("web:default"))), &st); err != nil {
			t.Fatal(err)
		}
		if p := st.Providers[ep.IPAddress+":default"]; p != nil {
			return p.Labels
		}
		return nil
	}
	post(map[string]string{"app": "web", "desc": "two\nlines", "app.kubernetes.io/name": "web",
		"io.buildpacks.lifecycle.metadata": `{"buildpacks":[` + strings.Repeat(`{"key":"paketo-buildpacks/x","version":"1.2.3"},`, 120) + `{}]}`,
		"a\x00b":                           "v", "a=b": "v", "c": "v\x00"})
	got := stored()
	if got == nil || got["app"] != "web" || got["desc"] != "two\nlines" || got["app.kubernetes.io/name"] != "web" {
		t.Fatalf("usable labels not kept (or not a backend): %q", got)
	}
	for _, k := range []string{"io.buildpacks.lifecycle.metadata", "a\x00b", "a=b", "c"} {
		if _, ok := got[k]; ok {
			t.Errorf("label %q kept", k)
		}
	}
	many := map[string]string{"app": "web"}
	for i := 0; i < 300; i++ {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	post(many)
	if got := stored(); got != nil {
		t.Errorf("past the count bound it is still a backend by its labels: %d labels", len(got))
	}
}

// TestStartKeepsKubernetesBackends (found by review): an updateEndpoint "start" never
// removes a pod from a Kubernetes Service, whose backends come from EndpointSlices (its
// record has no selector).
func TestStartKeepsKubernetesBackends(t *testing.T) {
	e := newEnv(t, "routing")
	e.net("default", "app", "vxlan", "10.20.0.0/24", "10.20.0.1", 0)
	web := e.podEP("default", "app", "c1", "prod/web-1")
	rec := model.CfgServiceLBState{ID: "k8s_prod_web:default", ServiceName: "k8s_prod_web", Tenant: "default", IPAddress: "10.96.0.10",
		Ports: []string{"80:8080:TCP"}, Providers: map[string]*model.Provider{web.IPAddress: {IPAddress: web.IPAddress, Container: "prod/web-1"}}}
	if res := e.m.PutK8sService(context.Background(), "k8s_", rec); res.Err != nil || !res.Written {
		t.Fatalf("put: %+v", res)
	}
	e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: web.IPAddress, ContainerID: "c1",
		Tenant: "default", Network: "app", Event: "start", Labels: map[string]string{"app": "web"}}, nil)
	var st model.CfgServiceLBState
	if err := json.Unmarshal([]byte(e.rawGet(model.SvcLBStateKey(rec.ID))), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Providers) == 0 {
		t.Errorf("the EndpointSlice backend was removed: %+v", st.Providers)
	}
}
