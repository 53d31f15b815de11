package master

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestK8sServices: records of Kubernetes Services are checked like a Contiv serviceLB
// (tenant, providers of the tenant, node ports unique across all services), unchanged
// records are not rewritten, and pruning deletes only prefixed records.
func TestK8sServices(t *testing.T) {
	e := newEnv(t, "routing")
	ctx := context.Background()
	e.net("default", "app", "vxlan", "10.20.0.0/24", "10.20.0.1", 0)
	ep := e.createEP("default", "app", "", "p1", "")
	// A Contiv serviceLB holding node port 30080 and a provider-less Contiv service.
	e.ok("POST", "/api/v1/serviceLBs/default:np/", `{"networkName":"app","ports":["80:8080:TCP"],"nodePorts":["30080:80:TCP"],"selectors":["app=x"],"serviceName":"np","tenantName":"default"}`, nil)

	rec := model.CfgServiceLBState{ID: "k8s_prod_web:default", ServiceName: "k8s_prod_web", Tenant: "default", IPAddress: "10.96.0.10",
		Ports: []string{"80:8080:TCP"}, NodePorts: []string{"30081:80:TCP"}, Selectors: map[string]string{"app": "web"},
		Providers: map[string]*model.Provider{ep.IPAddress: {IPAddress: ep.IPAddress}, "10.20.0.250": {IPAddress: "10.20.0.250"}}}
	res := e.m.PutK8sService(ctx, "k8s_", rec)
	if res.Err != nil || !res.Written || len(res.Dropped) != 1 || res.Dropped[0] != "10.20.0.250" {
		t.Fatalf("put: %+v", res)
	}
	var st model.CfgServiceLBState
	if err := json.Unmarshal([]byte(e.rawGet(model.SvcLBStateKey(rec.ID))), &st); err != nil {
		t.Fatal(err)
	}
	p := st.Providers[ep.IPAddress+":default"]
	if len(st.Providers) != 1 || p == nil || p.EpIDKey != "app.default-p1" || st.Selectors != nil || st.IPAddress != "10.96.0.10" {
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

	// Bad input: a node port the Contiv service holds, an unknown tenant, a name without the
	// prefix, a malformed port: refused, nothing written.
	before, _ := e.snapshot()
	bad := map[string]func(*model.CfgServiceLBState){
		"node port taken": func(r *model.CfgServiceLBState) { r.NodePorts = []string{"30080:80:TCP"} },
		"unknown tenant": func(r *model.CfgServiceLBState) {
			r.Tenant, r.ID = "nosuch", "k8s_prod_web:nosuch"
		},
		"no prefix": func(r *model.CfgServiceLBState) { r.ServiceName, r.ID = "web", "web:default" },
		"bad port":  func(r *model.CfgServiceLBState) { r.Ports = []string{"80:0:TCP"} },
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
	res = e.m.PutK8sService(ctx, "k8s_", func() model.CfgServiceLBState { r := rec; r.NodePorts = []string{"30080:80:TCP"}; return r }())
	var ae *apiError
	if !errors.As(res.Err, &ae) || ae.code != 409 || !strings.Contains(res.Err.Error(), "already used by service np:default") {
		t.Fatalf("node port conflict: %v", res.Err)
	}

	// Prune: the Contiv service stays, the Kubernetes one goes with its node port.
	gone, err := e.m.PruneK8sServices(ctx, "k8s_", map[string]bool{})
	if err != nil || len(gone) != 1 || gone[0] != rec.ID {
		t.Fatalf("prune: %v %v", gone, err)
	}
	if e.rawGet(model.SvcLBStateKey(rec.ID)) != "" || e.rawGet(model.NodePortKey(30081, "tcp")) != "" || e.rawGet(model.SvcLBStateKey("np:default")) == "" {
		t.Fatal("prune removed the wrong records")
	}
}
