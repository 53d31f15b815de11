package master

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// as returns a copy of e whose requests reach the API as id (what auth.Middleware puts
// in the context of an authenticated request).
func (e *env) as(id auth.Identity) *env {
	e.t.Helper()
	h := e.m.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(auth.WithIdentity(r.Context(), id)))
	}))
	e.t.Cleanup(srv.Close)
	c := *e
	c.srv = srv
	return &c
}

// TestServicesReadIsolation (issue 34, item 4): GET /services lists a tenant-admin only
// its tenant's services (before: every tenant's, with VIPs and backends' addresses,
// container ids and labels); GET /service/<id> of a record of another tenant is 404 for
// it, also when the id names the caller's tenant; the host collection (Bgps) lists
// nothing for it. Admins and requests without an identity see everything.
func TestServicesReadIsolation(t *testing.T) {
	e := newEnv(t, "bridge")
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	e.net("t1", "app", "vxlan", "10.31.0.0/24", "10.31.0.1", 0)
	e.net("t2", "app", "vxlan", "10.32.0.0/24", "10.32.0.1", 0)
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/serviceLBs/"+tn+":web/", `{"networkName":"app","ports":["80:8080:TCP"],"selectors":["app=web"],"serviceName":"web","tenantName":"`+tn+`"}`, nil)
		ep := e.createEP(tn, "app", "", "ctr-"+tn, "")
		e.ok("POST", "/plugin/updateEndpoint", model.UpdateEndpointRequest{IPAddress: ep.IPAddress, ContainerID: "ctr-" + tn,
			Tenant: tn, Network: "app", Event: "start", Labels: map[string]string{"app": "web", "secret": "label-" + tn}}, nil)
	}
	// A record whose id names t1 but which belongs to t2 (never written by netmaster;
	// whatever wrote it, t1 does not see it).
	forged, _ := json.Marshal(model.CfgServiceLBState{ID: "odd:t1", ServiceName: "odd", Tenant: "t2", IPAddress: "10.32.0.77"})
	if _, err := e.raw.Put(context.Background(), model.SvcLBStateKey("odd:t1"), string(forged)); err != nil {
		t.Fatal(err)
	}
	e.ok("POST", "/api/v1/Bgps/h1/", `{"hostname":"h1","routerip":"192.0.2.5/24","as":"65001","neighbor-as":"65000","neighbor":"192.0.2.1"}`, nil)

	ids := func(c *env) []string {
		t.Helper()
		var svcs []model.CfgServiceLBState
		c.ok("GET", "/services", nil, &svcs)
		var out []string
		for _, s := range svcs {
			out = append(out, s.ID)
		}
		return out
	}
	t1 := e.as(auth.Identity{Name: "bob", Role: "tenant-admin:t1", Via: "token"})
	admin := e.as(auth.Identity{Name: "alice", Role: auth.RoleAdmin, Via: "token"})
	if got := ids(t1); !slices.Equal(got, []string{"web:t1"}) {
		t.Errorf("tenant-admin t1 lists services %v, want only web:t1", got)
	}
	for _, c := range []*env{admin, e} {
		if got := ids(c); !slices.Equal(got, []string{"odd:t1", "web:t1", "web:t2"}) {
			t.Errorf("admin (or no identity) lists services %v, want all three", got)
		}
	}
	var own model.CfgServiceLBState
	t1.ok("GET", "/service/web:t1", nil, &own)
	if len(own.Providers) != 1 {
		t.Errorf("t1's own service: %+v, want its backend", own)
	}
	for _, id := range []string{"web:t2", "odd:t1", "nosuch:t1"} {
		if code, out := t1.do("GET", "/service/"+id, nil); code != http.StatusNotFound || strings.Contains(out, "10.32.") || strings.Contains(out, "label-t2") {
			t.Errorf("tenant-admin t1 GET /service/%s: %d %q, want 404 without the record", id, code, out)
		}
	}
	admin.ok("GET", "/service/web:t2", nil, nil)
	var bgps []json.RawMessage
	if t1.ok("GET", "/api/v1/Bgps/", nil, &bgps); len(bgps) != 0 {
		t.Errorf("tenant-admin lists hosts' bgp objects: %s", bgps)
	}
	if admin.ok("GET", "/api/v1/Bgps/", nil, &bgps); len(bgps) != 1 {
		t.Errorf("admin lists %d bgp objects, want 1", len(bgps))
	}
	// The global objects' inspects count the caller's tenant only (found by review: they
	// told every tenant how many networks and which tags the others had).
	var gi model.GlobalInspect
	t1.ok("GET", "/api/v1/inspect/globals/global/", nil, &gi)
	if gi.Oper.NumNetworks != 1 || gi.Oper.VlansInUse != "" || gi.Oper.VxlansInUse != "" {
		t.Errorf("tenant-admin's global inspect: %+v, want its 1 network and no tags in use", gi.Oper)
	}
	admin.ok("GET", "/api/v1/inspect/globals/global/", nil, &gi)
	if gi.Oper.NumNetworks != 2 || gi.Oper.VxlansInUse == "" {
		t.Errorf("admin's global inspect: %+v, want 2 networks and their tags", gi.Oper)
	}
	// A VXLAN network's host-local VLAN (pktTag) comes from one pool for every tenant: a
	// tenant-admin sees its VNI (externalPktTag), not that VLAN, in the network's and the
	// tenant's inspect; admins see both.
	var ni model.NetworkInspect
	t1.ok("GET", "/api/v1/inspect/networks/t1:app/", nil, &ni)
	if ni.Oper.PktTag != 0 || ni.Oper.ExternalPktTag == 0 {
		t.Errorf("tenant-admin's network inspect: pktTag %d externalPktTag %d, want 0 and the VNI", ni.Oper.PktTag, ni.Oper.ExternalPktTag)
	}
	admin.ok("GET", "/api/v1/inspect/networks/t1:app/", nil, &ni)
	if ni.Oper.PktTag == 0 {
		t.Errorf("admin's network inspect: no pktTag")
	}
	var ti model.TenantInspect
	t1.ok("GET", "/api/v1/inspect/tenants/t1/", nil, &ti)
	if len(ti.Oper.Networks) != 1 || ti.Oper.Networks[0].PktTag != 0 {
		t.Errorf("tenant-admin's tenant inspect: %+v, want its network without pktTag", ti.Oper.Networks)
	}
}

// TestRoutes: Routes reads every route of the router (the walk of TestReadIsolation in
// cmd/netmaster depends on it), with their methods.
func TestRoutes(t *testing.T) {
	rts, err := Routes()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, rt := range rts {
		got[rt.Path] = append(got[rt.Path], rt.Methods...)
	}
	for path, want := range map[string][]string{
		"/services":                        {"GET"},
		"/service/{id}":                    {"GET"},
		"/version":                         {"GET"},
		"/api/v1/networks/":                {"GET"},
		"/api/v1/networks/{key}/":          {"GET", "POST", "PUT", "DELETE"},
		"/api/v1/inspect/Bgps/{key}/":      {"GET"},
		"/api/v1/inspect/endpoints/{key}/": {"GET"},
		"/plugin/createEndpoint":           {"POST"},
	} {
		for _, m := range want {
			if !slices.Contains(got[path], m) {
				t.Errorf("Routes: %s %s missing (have %v)", m, path, got[path])
			}
		}
	}
	if len(rts) < 70 {
		t.Errorf("Routes: %d routes, want every collection's", len(rts))
	}
}
