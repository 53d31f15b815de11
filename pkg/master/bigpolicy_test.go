package master

import (
	"context"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestLargePolicies: a policy of 1,000 port rules attaches to 100 groups, one change per
// group, and then takes another rule and loses one, each in one change. Before, an EPG's
// policy record copied every rule, so the first attach already exceeded etcd's request
// limit (413) and a rule change rewrote 100 copies of the policy.
func TestLargePolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("large etcd transactions")
	}
	const rules, groups = 1000, 100
	e := newEnv(t, "bridge")
	ctx := context.Background()
	e.net("default", "n1", "vxlan", "10.1.0.0/16", "10.1.0.1", 0)
	e.ok("POST", "/api/v1/policys/default:big/", `{"policyName":"big","tenantName":"default"}`, nil)
	for i := 1; i <= rules; i++ {
		e.ok("POST", fmt.Sprintf("/api/v1/rules/default:big:%d/", i), fmt.Sprintf(
			`{"action":"allow","direction":"in","policyName":"big","ruleId":"%d","tenantName":"default","protocol":"tcp","port":%d,"priority":%d}`, i, 1000+i, 1+i%100), nil)
	}
	for g := 0; g < groups; g++ {
		e.ok("POST", fmt.Sprintf("/api/v1/endpointGroups/default:g%d/", g), fmt.Sprintf(`{"groupName":"g%d","networkName":"n1","policies":["big"],"tenantName":"default"}`, g), nil)
	}
	count := func(prefix string) int64 {
		t.Helper()
		resp, err := e.raw.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if n := count(model.RuleStatePrefix); n != 2*rules*groups {
		t.Fatalf("%d policyRule records, want %d", n, 2*rules*groups)
	}
	// One more rule: 2 records in each of the 100 groups, one change.
	from := e.rev()
	e.ok("POST", "/api/v1/rules/default:big:x/", `{"action":"deny","direction":"in","policyName":"big","ruleId":"x","tenantName":"default","protocol":"tcp","port":22}`, nil)
	if b := putBytes(t, e.raw, from, e.rev()); b > 200_000 {
		t.Errorf("adding one rule to a policy on %d groups wrote %d bytes", groups, b)
	}
	if e.rawGet(model.RuleStateKey("default:g99:default:big:default:big:x:inTx")) == "" {
		t.Fatal("new rule not expanded into group g99")
	}
	// Rule 1 goes; rule 10's records stay (prefix "…:1:" must not match "…:10:").
	e.ok("DELETE", "/api/v1/rules/default:big:1/", nil, nil)
	if n := count(model.RuleStatePrefix + "default:g42:default:big:default:big:1:"); n != 0 {
		t.Fatalf("rule 1 left %d records in g42", n)
	}
	if n := count(model.RuleStatePrefix + "default:g42:default:big:default:big:10:"); n != 2 {
		t.Fatalf("rule 10 has %d records in g42, want 2", n)
	}
	// Detach from one group; the others keep theirs.
	e.ok("POST", "/api/v1/endpointGroups/default:g7/", `{"groupName":"g7","networkName":"n1","policies":[],"tenantName":"default"}`, nil)
	if n := count(model.RuleStatePrefix + "default:g7:"); n != 0 {
		t.Fatalf("detached group g7 keeps %d records", n)
	}
	if n := count(model.RuleStatePrefix); n != 2*int64(rules)*(groups-1) {
		t.Fatalf("%d policyRule records after detach, want %d", n, 2*rules*(groups-1))
	}
}

// TestContivRuleMapsHonoured: an EpgPolicy record written by Contiv lists its expansions
// in RuleMaps; removing the rule and detaching the policy delete those records too.
func TestContivRuleMapsHonoured(t *testing.T) {
	e := newEnv(t, "bridge")
	ctx := context.Background()
	e.net("default", "n1", "vxlan", "10.1.0.0/16", "10.1.0.1", 0)
	e.ok("POST", "/api/v1/policys/default:p/", `{"policyName":"p","tenantName":"default"}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:1/", `{"action":"allow","direction":"in","policyName":"p","ruleId":"1","tenantName":"default","protocol":"tcp","port":80}`, nil)
	e.ok("POST", "/api/v1/rules/default:p:2/", `{"action":"allow","direction":"in","policyName":"p","ruleId":"2","tenantName":"default","protocol":"tcp","port":81}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","policies":["p"],"tenantName":"default"}`, nil)
	id := "default:web:default:p"
	legacy := map[string]string{"default:p:1": "legacy-1", "default:p:2": "legacy-2"}
	ep := model.EpgPolicy{ID: id, EpgPolicyKey: id, EndpointGroupID: 1, RuleMaps: map[string]*model.RuleMap{}}
	for rk, rid := range legacy {
		ep.RuleMaps[rk] = &model.RuleMap{OfnetRules: map[string]*model.OfnetPolicyRule{rid: {RuleId: rid}}}
		if err := e.store.Put(ctx, model.RuleStateKey(rid), model.CfgPolicyRule{ID: rid}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.store.Put(ctx, model.PolicyStateKey(id), ep); err != nil {
		t.Fatal(err)
	}
	e.ok("DELETE", "/api/v1/rules/default:p:1/", nil, nil)
	if e.rawGet(model.RuleStateKey("legacy-1")) != "" || e.rawGet(model.RuleStateKey("legacy-2")) == "" {
		t.Fatal("rule removal did not follow Contiv's RuleMaps")
	}
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n1","policies":[],"tenantName":"default"}`, nil)
	resp, err := e.raw.Get(ctx, model.RuleStatePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("records left after detach: %v %v", resp, err)
	}
}

// TestPolicyAttachTooLarge: an attach whose datapath records do not fit one etcd
// transaction answers 413 with the counts, never 500, and writes nothing (control plane
// issue, item 7: a 4,100-rule policy attach answered 500 "trying to send message larger
// than max"). etcd here allows 128 operations (an external etcd's default --max-txn-ops), so
// 70 rules (2 records each) pass it.
func TestPolicyAttachTooLarge(t *testing.T) {
	e := newEnvEtcd(t, etcdembed.Config{MaxTxnOps: 128}, "bridge")
	e.net("default", "n1", "vxlan", "10.1.1.0/24", "", 0)
	e.ok("POST", "/api/v1/policys/default:p/", `{"policyName":"p","tenantName":"default"}`, nil)
	for i := 0; i < 70; i++ {
		e.ok("POST", fmt.Sprintf("/api/v1/rules/default:p:r%d/", i),
			fmt.Sprintf(`{"action":"allow","direction":"in","port":%d,"protocol":"tcp","policyName":"p","ruleId":"r%d","tenantName":"default"}`, 1000+i, i), nil)
	}
	e.ok("POST", "/api/v1/endpointGroups/default:g/", `{"groupName":"g","networkName":"n1","tenantName":"default"}`, nil)
	before, rev := e.snapshot()
	code, out := e.do("POST", "/api/v1/endpointGroups/default:g/", `{"groupName":"g","networkName":"n1","policies":["p"],"tenantName":"default"}`)
	if code != 413 || !strings.Contains(out, "too large") {
		t.Errorf("attach of 70 rules past 128 operations: %d %.300s, want 413 naming the size", code, out)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Errorf("the refused attach changed etcd")
	}
}
