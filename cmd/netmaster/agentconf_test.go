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
	ac := &agentCluster{url: p.url, admin: c(tAdmin), h1: c(tH1), h2: c(tH2), shared: c(tShared), rev: etcdRevision(t, etcdURL)}
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
