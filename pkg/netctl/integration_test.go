package netctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// startMaster runs a real netmaster API on a private embedded etcd behind httptest; opts
// change its Config.
func startMaster(t *testing.T, opts ...func(*master.Config)) string {
	t.Helper()
	store, _ := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := master.Config{
		Store:   store,
		FwdMode: "bridge",
		Version: model.VersionInfo{Version: "test", GitCommit: "g", BuildTime: "b"},
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := master.New(ctx, cfg)
	if err != nil {
		t.Fatalf("master.New: %v", err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestEndToEndAgainstMaster drives the CLI against the real API: create, list (golden),
// inspect, refused deletes, remove.
func TestEndToEndAgainstMaster(t *testing.T) {
	url := startMaster(t)
	ok := func(want string, args ...string) string {
		t.Helper()
		r := runNetctl(t, url, args...)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("netctl %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
		if want != "*" && r.stdout != want {
			t.Fatalf("netctl %s: stdout %q, want %q", strings.Join(args, " "), r.stdout, want)
		}
		return r.stdout
	}
	fails := func(code int, msgPart string, args ...string) {
		t.Helper()
		r := runNetctl(t, url, args...)
		if r.code != code || !strings.HasPrefix(r.stderr, "Error: ") || !strings.Contains(r.stderr, msgPart) ||
			strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("netctl %s: exit %d stderr %q, want exit %d and one line containing %q",
				strings.Join(args, " "), r.code, r.stderr, code, msgPart)
		}
	}

	ok("Creating tenant: blue\n", "tenant", "create", "blue")
	checkGolden(t, "e2e_tenant_ls", ok("*", "tenant", "ls"), false)

	ok("Creating network default:contiv-net\n", "network", "create", "--subnet", "10.1.2.0/24", "-g", "10.1.2.1", "contiv-net")
	ok("Creating network default:vlan-net\n", "net", "create", "vlan-net", "-e", "vlan", "-p", "100",
		"-s", "20.1.1.0/24", "--s6", "2001::/100", "--g6", "2001::1", "--tag", "mytag")
	ok("Creating network blue:blue-net\n", "net", "create", "-t", "blue", "-s", "10.9.0.0/16", "blue-net")
	// Same output as Contiv's captured `netctl net ls` (contiv.md 4.2).
	checkGolden(t, "network_ls", ok("*", "net", "ls"), true)
	checkGolden(t, "e2e_network_ls_all", ok("*", "net", "ls", "-a"), false)
	ok("blue-net\n", "net", "ls", "-q", "-t", "blue")
	fails(ExitAPI, "", "net", "create", "-s", "10.1.2.0/25", "overlap")

	ok("Creating policy default:prod-web\n", "policy", "create", "prod-web")
	ok("Creating EndpointGroup default:db\n", "group", "create", "contiv-net", "db")
	ok("", "policy", "rule-add", "prod-web", "3", "-d", "out", "-p", "5", "-s", "8.8.8.8/32", "-l", "udp", "-P", "53")
	ok("", "policy", "rule-add", "prod-web", "2", "-p", "10", "-g", "db", "-l", "tcp", "-P", "80")
	ok("", "policy", "rule-add", "prod-web", "1", "-l", "tcp", "-j", "deny")
	// Same output as Contiv's captured `netctl policy rule-ls` (contiv.md 4.2).
	checkGolden(t, "policy_rule_ls", ok("*", "policy", "rule-ls", "prod-web"), true)
	ok("Creating EndpointGroup default:web\n", "group", "create", "-p", "prod-web", "contiv-net", "web")
	checkGolden(t, "e2e_group_ls", ok("*", "group", "ls"), false)
	checkGolden(t, "e2e_policy_ls", ok("*", "policy", "ls", "-a"), false)
	checkGolden(t, "e2e_global_info", ok("*", "global", "info"), false)

	var ni model.NetworkInspect
	if err := json.Unmarshal([]byte(ok("*", "net", "inspect", "contiv-net")), &ni); err != nil {
		t.Fatalf("net inspect: %v", err)
	}
	if ni.Config.Subnet != "10.1.2.0/24" || ni.Config.Gateway != "10.1.2.1" || ni.Oper.PktTag == 0 {
		t.Fatalf("net inspect: unexpected %+v", ni)
	}
	var ti model.TenantInspect
	if err := json.Unmarshal([]byte(ok("*", "tenant", "inspect", "default")), &ti); err != nil || ti.Config.TenantName != "default" {
		t.Fatalf("tenant inspect: %v %+v", err, ti)
	}

	// Refused operations: netmaster's message, exit 3.
	fails(ExitAPI, "", "policy", "rm", "prod-web")          // attached to web
	fails(ExitAPI, "", "net", "rm", "contiv-net")           // has groups
	fails(ExitAPI, "", "net", "ls", "-t", "nosuchtenant")   // tenant must exist
	fails(ExitAPI, "", "policy", "rule-ls", "nosuchpolicy") // policy must exist

	// Remove everything again.
	ok("", "group", "rm", "web")
	ok("", "group", "rm", "db")
	ok("", "policy", "rule-rm", "prod-web", "1")
	ok("3\n2\n", "policy", "rule-ls", "-q", "prod-web") // priority 5 before 10
	ok("Deleting policy default:prod-web\n", "policy", "rm", "prod-web")
	ok("Deleting network default:contiv-net\n", "net", "rm", "contiv-net")
	ok("Deleting network default:vlan-net\n", "net", "delete", "vlan-net")
	fails(ExitAPI, "", "tenant", "rm", "blue") // still has blue-net
	ok("Deleting network blue:blue-net\n", "net", "rm", "-t", "blue", "blue-net")
	ok("Deleting tenant blue\n", "tenant", "rm", "blue")
	ok("default\n", "tenant", "ls", "-q")
	ok("[]\n", "net", "ls", "-j", "-a")
}

// TestEndpointList: `endpoint ls` lists endpoints with container names, addresses, groups
// and hosts, per tenant, network and host; `endpoint inspect` finds one by container name.
func TestEndpointList(t *testing.T) {
	url := startMaster(t)
	post := func(path, body string) {
		t.Helper()
		resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
	}
	post("/api/v1/tenants/blue/", `{"tenantName":"blue"}`)
	post("/api/v1/networks/default:n1/", `{"tenantName":"default","networkName":"n1","encap":"vxlan","subnet":"10.31.0.0/24","gateway":"10.31.0.1"}`)
	post("/api/v1/networks/blue:n2/", `{"tenantName":"blue","networkName":"n2","encap":"vxlan","subnet":"10.32.0.0/24"}`)
	post("/api/v1/endpointGroups/default:web/", `{"tenantName":"default","groupName":"web","networkName":"n1"}`)
	for _, ep := range []struct{ tenant, net, group, id, host string }{
		{"default", "n1", "web", "c1", "hostA"}, {"default", "n1", "", "c2", "hostB"}, {"blue", "n2", "", "c3", "hostA"},
	} {
		post("/plugin/createEndpoint", fmt.Sprintf(`{"TenantName":%q,"NetworkName":%q,"ServiceName":%q,"EndpointID":%q,"EPCommonName":"name-%s","ConfigEP":{"Container":%q,"Host":%q,"ServiceName":%q}}`,
			ep.tenant, ep.net, ep.group, ep.id, ep.id, ep.id, ep.host, ep.group))
	}
	r := runNetctl(t, url, "endpoint", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "n1.default-c1") || !strings.Contains(r.stdout, "name-c1") ||
		!strings.Contains(r.stdout, "10.31.0.2") || !strings.Contains(r.stdout, "web:default") || !strings.Contains(r.stdout, "hostB") ||
		strings.Contains(r.stdout, "c3") {
		t.Fatalf("ep ls: %d %q\n%s", r.code, r.stderr, r.stdout)
	}
	if r := runNetctl(t, url, "ep", "ls", "--host", "hostA", "-a"); r.code != 0 || !strings.Contains(r.stdout, "n2.blue-c3") ||
		!strings.Contains(r.stdout, "n1.default-c1") || strings.Contains(r.stdout, "c2") {
		t.Fatalf("ep ls --host hostA -a: %d %q\n%s", r.code, r.stderr, r.stdout)
	}
	if r := runNetctl(t, url, "ep", "ls", "-t", "nobody"); r.code == 0 {
		t.Fatalf("ep ls of a missing tenant: %+v", r)
	}
	if r := runNetctl(t, url, "ep", "inspect", "name-c2"); r.code != 0 || !strings.Contains(r.stdout, `"n1.default-c2"`) {
		t.Fatalf("ep inspect by container name: %d %q\n%s", r.code, r.stderr, r.stdout)
	}
}
