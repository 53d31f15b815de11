package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// agentCluster is one netmaster process with an admin token, agents bound to hosts h1 and
// h2, and an agent token bound to no host; tenants t1 and t2 exist.
type agentCluster struct {
	url                   string
	admin, h1, h2, shared *apiClient
	rev                   func() int64
	etcdURL               string
}

func startAgentCluster(t *testing.T, name string) *agentCluster {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const (
		tAdmin  = "admin-token-0123456789"
		tH1     = "agent-h1-token-0123456789"
		tH2     = "agent-h2-token-0123456789"
		tShared = "agent-shared-token-0123456789"
	)
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("%s admin ops\n%s agent host:h1\n%s agent host:h2\n%s agent agents\n",
		tAdmin, tH1, tH2, tShared)), 0o600); err != nil {
		t.Fatal(err)
	}
	etcdURL := statetest.Etcd(t)
	p := startNetmaster(t, name, etcdURL, "--auth-tokens", tokens)
	c := func(tok string) *apiClient { return client(t, tlsconf.Files{}, tok) }
	ac := &agentCluster{url: p.url, admin: c(tAdmin), h1: c(tH1), h2: c(tH2), shared: c(tShared), rev: etcdRevision(t, etcdURL), etcdURL: etcdURL}
	eventually(t, 30*time.Second, "netmaster up", func() error {
		if st, body := ac.admin.call(t, "GET", p.url+"/info", ""); st != 200 || !strings.Contains(body, `"current-state":"leader"`) {
			return fmt.Errorf("%d %s", st, body)
		}
		return nil
	})
	ac.admin.must(t, "POST", p.url+"/api/v1/globals/global/", `{"name":"global","networkInfraType":"default","vlans":"1-4094","vxlans":"1-10000","fwdMode":"routing","arpMode":"proxy","pvtSubnet":"172.19.0.0/16"}`, 200)
	for _, tn := range []string{"t1", "t2"} {
		ac.admin.must(t, "POST", p.url+"/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, 200)
	}
	return ac
}

// refused runs do, which must answer want and leave etcd as it was.
func (ac *agentCluster) refused(t *testing.T, what string, want int, do func() (int, string)) {
	t.Helper()
	before := ac.rev()
	if st, body := do(); st != want {
		t.Errorf("%s: %d %s, want %d", what, st, body, want)
	} else if !strings.Contains(body, ":") {
		t.Errorf("%s: %d without a message naming the field: %q", what, st, body)
	}
	if after := ac.rev(); after != before {
		t.Errorf("%s: refused, but etcd changed (revision %d → %d)", what, before, after)
	}
}

// TestAgentNetworkCreateNarrow: a bound agent creates networks with what Docker's driver
// sends (names, subnet, gateway, VXLAN); a pkt-tag, VLAN encapsulation, an infra network, a
// cfgdTag, IPv6 or NAT settings are refused 403 naming the field, nothing written; an
// admin and an unbound agent token create them as before, and the agent's creates are
// charged to the tenant's quota.
func TestAgentNetworkCreateNarrow(t *testing.T) {
	ac := startAgentCluster(t, "nm-narrow")
	subnets := map[string]int{}
	net := func(name, extra string) string {
		if subnets[name] == 0 {
			subnets[name] = len(subnets) + 1
		}
		return fmt.Sprintf(`{"tenantName":"t1","networkName":"%s","encap":"vxlan","subnet":"10.8.%d.0/24"%s}`, name, subnets[name], extra)
	}
	post := func(c *apiClient, name, body string) func() (int, string) {
		return func() (int, string) { return c.call(t, "POST", ac.url+"/api/v1/networks/t1:"+name+"/", body) }
	}
	for _, c := range []struct{ field, extra string }{
		{"pktTag", `,"pktTag":77`},
		{"encap", `,"encap":"vlan"`},
		{"nwType", `,"nwType":"infra"`},
		{"cfgdTag", `,"cfgdTag":"fabric-a"`},
		{"ipv6Subnet", `,"ipv6Subnet":"fd00:8::/64"`},
		{"natDisabled", `,"natDisabled":true`},
	} {
		body := strings.Replace(net("x", c.extra), `"encap":"vxlan",`, "", strings.Count(c.extra, "encap"))
		ac.refused(t, "h1 creates a network with "+c.field, 403, post(ac.h1, "x", body))
		if _, out := ac.h1.call(t, "POST", ac.url+"/api/v1/networks/t1:x/", body); !strings.Contains(out, c.field+":") {
			t.Errorf("the refusal of %s does not name it: %s", c.field, out)
		}
	}
	ac.h1.must(t, "POST", ac.url+"/api/v1/networks/t1:dock/", net("dock", `,"nwType":"data"`), 200)
	ac.shared.must(t, "POST", ac.url+"/api/v1/networks/t1:sharedtag/", net("sharedtag", `,"pktTag":78`), 200)
	ac.admin.must(t, "POST", ac.url+"/api/v1/networks/t1:admintag/", net("admintag", `,"pktTag":79`), 200)
	// Quota: the tenant holds 3 networks; at 3 the agent's next create is refused.
	ac.admin.must(t, "PUT", ac.url+"/api/v1/quotas/t1/", `{"networks":3}`, 200)
	ac.refused(t, "h1 creates a network beyond the tenant's quota", 403, post(ac.h1, "over", net("over", "")))
}

// TestAgentHostScope: an admin's host scope (/api/v1/hostScopes/<host>/) confines the
// host's bound agent: an endpoint, a network or an address outside the tenants and
// networks listed is refused 403 naming the field, nothing written. A host without a scope
// serves every tenant (Contiv's behaviour), so does an unbound agent token; only admins set
// or drop scopes; dropping one lets the host serve every tenant again.
func TestAgentHostScope(t *testing.T) {
	ac := startAgentCluster(t, "nm-scope")
	for _, n := range []struct{ tenant, net, subnet string }{{"t1", "n1", "10.7.1.0/24"}, {"t2", "n2", "10.7.2.0/24"}, {"t2", "n3", "10.7.3.0/24"}} {
		ac.admin.must(t, "POST", ac.url+"/api/v1/networks/"+n.tenant+":"+n.net+"/", `{"tenantName":"`+n.tenant+`","networkName":"`+n.net+`","encap":"vxlan","subnet":"`+n.subnet+`"}`, 200)
	}
	ep := func(c *apiClient, host, tenant, net, container string) func() (int, string) {
		return func() (int, string) {
			return c.call(t, "POST", ac.url+"/plugin/createEndpoint", fmt.Sprintf(
				`{"TenantName":"%s","NetworkName":"%s","EndpointID":"%s","ConfigEP":{"Container":"%s","Host":"%s"}}`, tenant, net, container, container, host))
		}
	}
	must := func(what string, do func() (int, string)) {
		t.Helper()
		if st, body := do(); st != 200 {
			t.Errorf("%s: %d %s, want 200", what, st, body)
		}
	}
	must("h1 without a scope serves tenant t2", ep(ac.h1, "h1", "t2", "n2", "c0"))
	const scope = "/api/v1/hostScopes/h1/"
	for _, c := range []*apiClient{ac.h1, ac.h2, ac.shared} {
		ac.refused(t, "an agent sets a host scope", 403, func() (int, string) {
			return c.call(t, "PUT", ac.url+scope, `{"tenants":["t1","t2"]}`)
		})
	}
	ac.refused(t, "a scope naming a network without its tenant", 400, func() (int, string) {
		return ac.admin.call(t, "PUT", ac.url+scope, `{"networks":["n3"]}`)
	})
	ac.admin.must(t, "PUT", ac.url+scope, `{"tenants":["t1"],"networks":["t2:n3"]}`, 200)
	if st, body := ac.h1.call(t, "GET", ac.url+"/api/v1/hostScopes/", ""); st != 200 || !strings.Contains(body, `"networks":["t2:n3"]`) {
		t.Errorf("an agent reads the scopes: %d %s", st, body)
	}
	for _, c := range []struct {
		what, field string
		do          func() (int, string)
	}{
		{"h1 creates an endpoint in a tenant outside its scope", "TenantName", ep(ac.h1, "h1", "t2", "n2", "c1")},
		{"h1 re-creates its endpoint of a tenant no longer in its scope", "TenantName", ep(ac.h1, "h1", "t2", "n2", "c0")},
		{"h1 creates a network in a tenant outside its scope", "tenantName", func() (int, string) {
			return ac.h1.call(t, "POST", ac.url+"/api/v1/networks/t2:dock/", `{"tenantName":"t2","networkName":"dock","encap":"vxlan","subnet":"10.7.9.0/24"}`)
		}},
		{"h1 allocates an address outside its scope", "NetworkID", func() (int, string) {
			return ac.h1.call(t, "POST", ac.url+"/plugin/allocAddress", `{"NetworkID":"n2.t2"}`)
		}},
	} {
		ac.refused(t, c.what, 403, c.do)
		if _, body := c.do(); !strings.Contains(body, c.field+": host ") {
			t.Errorf("%s: the refusal does not name %s: %s", c.what, c.field, body)
		}
	}
	must("h1 creates an endpoint in a tenant of its scope", ep(ac.h1, "h1", "t1", "n1", "c2"))
	must("h1 creates an endpoint in a network of its scope", ep(ac.h1, "h1", "t2", "n3", "c3"))
	must("h1 creates a network in a tenant of its scope", func() (int, string) {
		return ac.h1.call(t, "POST", ac.url+"/api/v1/networks/t1:dock/", `{"tenantName":"t1","networkName":"dock","encap":"vxlan","subnet":"10.7.8.0/24"}`)
	})
	must("h2 (no scope) creates an endpoint in tenant t2", ep(ac.h2, "h2", "t2", "n2", "c4"))
	must("the unbound agent token creates an endpoint of h1 in tenant t2", ep(ac.shared, "h1", "t2", "n2", "c5"))
	must("h1 deletes its endpoint outside its scope", func() (int, string) {
		return ac.h1.call(t, "POST", ac.url+"/plugin/deleteEndpoint", `{"TenantName":"t2","NetworkName":"n2","EndpointID":"c0"}`)
	})
	ac.admin.must(t, "DELETE", ac.url+scope, "", 200)
	must("h1 serves every tenant once its scope is dropped", ep(ac.h1, "h1", "t2", "n2", "c6"))
	ac.admin.must(t, "GET", ac.url+scope, "", 404)
}
