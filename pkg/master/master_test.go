package master

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

type env struct {
	t     *testing.T
	store *state.Store
	url   string // etcd
	m     *Master
	srv   *httptest.Server
	raw   *clientv3.Client
}

func newEnv(t *testing.T, fwd string) *env {
	t.Helper()
	store, url := statetest.Store(t)
	return newEnvOn(t, store, url, fwd)
}

// newEnvEtcd runs a Master on an embedded etcd of its own started with cfg (its data
// directory, client and peer URLs filled in): for tests that need etcd's limits changed.
func newEnvEtcd(t *testing.T, cfg etcdembed.Config, fwd string) *env {
	t.Helper()
	ctx := context.Background()
	cfg.DataDir = t.TempDir()
	cfg.ClientURL = fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	cfg.PeerURL = fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	srv, err := etcdembed.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	store, err := state.Open(ctx, []string{cfg.ClientURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return newEnvOn(t, store, cfg.ClientURL, fwd)
}

// newEnvOn runs a Master on store (etcd at url); opts change its Config.
func newEnvOn(t *testing.T, store *state.Store, url, fwd string, opts ...func(*Config)) *env {
	t.Helper()
	cfg := Config{Store: store, FwdMode: fwd, ClusterMode: "docker",
		Version: model.VersionInfo{Version: "test", GitCommit: "abc", BuildTime: "now"}}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return &env{t: t, store: store, url: url, m: m, srv: srv, raw: raw}
}

// do sends body (string, or any value JSON-encoded) and returns status and body.
func (e *env) do(method, path string, body any) (int, string) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// Real statuses (Contiv's own clients get 500 + text; see TestContivErrorCompat).
	req.Header.Set("Accept", ProblemJSON)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") == ProblemJSON {
		var p Problem
		if err := json.Unmarshal(out, &p); err != nil || p.Status != resp.StatusCode {
			e.t.Fatalf("%s %s: problem body %q (%v)", method, path, out, err)
		}
		return resp.StatusCode, p.Detail
	}
	return resp.StatusCode, string(out)
}

// ok asserts a 200 and decodes the body into v (if non-nil).
func (e *env) ok(method, path string, body, v any) {
	e.t.Helper()
	code, out := e.do(method, path, body)
	if code != http.StatusOK {
		e.t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(out), v); err != nil {
			e.t.Fatalf("%s %s: decode %q: %v", method, path, out, err)
		}
	}
}

func (e *env) rawGet(key string) string {
	e.t.Helper()
	resp, err := e.raw.Get(context.Background(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// snapshot returns every key/value under /contiv.io/ and the store revision.
func (e *env) snapshot() (string, int64) {
	e.t.Helper()
	resp, err := e.raw.Get(context.Background(), "/contiv.io/", clientv3.WithPrefix())
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%s=%s\n", kv.Key, kv.Value)
	}
	return b.String(), resp.Header.Revision
}

func (e *env) alloc(netID string) string {
	e.t.Helper()
	var r model.AllocAddressResponse
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: netID}, &r)
	return r.IPv4Address
}

func (e *env) createEP(tenant, net, group, container, ip string) model.CfgEndpointState {
	e.t.Helper()
	var r model.CreateEndpointResponse
	e.ok("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: tenant, NetworkName: net, ServiceName: group,
		EndpointID: container, EPCommonName: "c-" + container,
		ConfigEP: model.ConfigEP{Container: container, Host: "host1", IPAddress: ip, ServiceName: group}}, &r)
	return r.EndpointConfig
}

// net posts a network the way Contiv's client does (no key, link-sets/links empty).
func (e *env) net(tenant, name, encap, subnet, gw string, tag int) {
	e.t.Helper()
	e.ok("POST", "/api/v1/networks/"+tenant+":"+name+"/", model.Network{TenantName: tenant, NetworkName: name,
		Encap: encap, Subnet: subnet, Gateway: gw, PktTag: tag, NwType: "data"}, nil)
}

func TestBootstrapState(t *testing.T) {
	e := newEnv(t, "bridge")
	if got, want := e.rawGet(model.GlobConfigKey), `{"id":"global","nw-infra-type":"default","fwd-mode":"bridge","arp-mode":"proxy","pvt-subnet":"172.19.0.0/16"}`; got != want {
		t.Fatalf("GlobConfig\n got %s\nwant %s", got, want)
	}
	if got, want := e.rawGet(model.GStateCfgKey), `{"id":"global","auto":{"VLANs":"1-4094","VXLANs":"1-10000"}}`; got != want {
		t.Fatalf("gstate cfg %s", got)
	}
	if got, want := e.rawGet(model.GStateOperKey), `{"id":"global","defaultNetwork":"","freeVXLANsStart":0}`; got != want {
		t.Fatalf("gstate oper %s", got)
	}
	var tn model.Tenant
	e.ok("GET", "/api/v1/tenants/default/", nil, &tn)
	if tn.TenantName != "default" || tn.Key != "default" {
		t.Fatalf("default tenant %+v", tn)
	}
	var g model.Global
	e.ok("GET", "/api/v1/globals/global/", nil, &g)
	if g.FwdMode != "bridge" || g.Vlans != "1-4094" || g.Vxlans != "1-10000" || g.PvtSubnet != "172.19.0.0/16" || g.ArpMode != "proxy" {
		t.Fatalf("global %+v", g)
	}
	var v model.VersionInfo
	e.ok("GET", "/version", nil, &v)
	if v.Version != "test" {
		t.Fatalf("version %+v", v)
	}
	// A second master on the same store changes nothing.
	before, rev := e.snapshot()
	if _, err := New(context.Background(), Config{Store: e.store, FwdMode: "bridge"}); err != nil {
		t.Fatal(err)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatalf("second New rewrote state")
	}
	// Trailing slash is mandatory.
	if code, _ := e.do("GET", "/api/v1/tenants/default", nil); code != http.StatusNotFound {
		t.Fatalf("no trailing slash: %d", code)
	}
}

func TestNetworkStateMatchesContivExample(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "contiv-net", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	ep := e.createEP("default", "contiv-net", "", "c1", "")
	want := `{"id":"contiv-net.default","tenant":"default","networkName":"contiv-net","nwType":"data","pktTagType":"vxlan",` +
		`"pktTag":1,"extPktTag":1,"subnetIP":"10.1.1.0","subnetLen":24,"gateway":"10.1.1.1",` +
		`"ipAddrRange":"10.1.1.0-10.1.1.255","epAddrCount":1,"epCount":1,` +
		`"ipAllocMap":"AAAAAAAAAQAAAAAAAAAABwAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAA==",` +
		`"ipv6SubnetIP":"","ipv6SubnetLen":0,"ipv6Gateway":"","ipv6AllocMap":null,"ipv6LastHost":"",` +
		`"networkTag":"contiv-net.default"}`
	if got := e.rawGet("/contiv.io/state/nets/contiv-net.default"); got != want {
		t.Fatalf("network state\n got %s\nwant %s", got, want)
	}
	wantEP := `{"id":"contiv-net.default-c1","netID":"contiv-net.default","endpointID":"c1","serviceName":"",` +
		`"endpointGroupId":0,"endpointGroupKey":"","ipAddress":"10.1.1.2","ipv6Address":"","macAddress":"02:02:0a:01:01:02",` +
		`"homingHost":"host1","intfName":"","vtepIP":"","labels":null,"containerId":"c1","epCommonName":"c-c1"}`
	if got := e.rawGet("/contiv.io/state/eps/contiv-net.default-c1"); got != wantEP {
		t.Fatalf("endpoint state\n got %s\nwant %s", got, wantEP)
	}
	if ep.MacAddress != "02:02:0a:01:01:02" || ep.HomingHost != "host1" {
		t.Fatalf("response %+v", ep)
	}
	// Idempotent create.
	again := e.createEP("default", "contiv-net", "", "c1", "")
	if !reflect.DeepEqual(again, ep) {
		t.Fatalf("second create differs: %+v", again)
	}
	if got := e.rawGet("/contiv.io/state/nets/contiv-net.default"); got != want {
		t.Fatalf("idempotent create changed network state: %s", got)
	}
	// Model object as stored.
	if got := e.rawGet("/contiv.io/obj/modeldb/network/default:contiv-net"); !strings.Contains(got, `"links":{"Tenant":{"type":"tenant","key":"default"}}`) {
		t.Fatalf("network model %s", got)
	}
	// Delete releases the address: next endpoint gets .2 again.
	var dr model.DeleteEndpointResponse
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "contiv-net", EndpointID: "c1"}, &dr)
	if dr.EndpointConfig.IPAddress != "10.1.1.2" {
		t.Fatalf("delete response %+v", dr)
	}
	if e.rawGet("/contiv.io/state/eps/contiv-net.default-c1") != "" {
		t.Fatal("endpoint state left behind")
	}
	if ep2 := e.createEP("default", "contiv-net", "", "c2", ""); ep2.IPAddress != "10.1.1.2" {
		t.Fatalf("reuse: %s", ep2.IPAddress)
	}
}
