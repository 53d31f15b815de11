package master

import (
	"fmt"
	"testing"
)

// TestLargePolicies: a policy of 300 port rules (600 datapath rule records) attaches to a
// new group in one change, and a policy on 60 groups takes another rule (each change used
// to exceed etcd's default of 128 operations per transaction and answer 500).
func TestLargePolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("large etcd transactions")
	}
	e := newEnv(t, "bridge")
	e.net("default", "n1", "vxlan", "10.1.0.0/16", "10.1.0.1", 0)
	e.ok("POST", "/api/v1/policys/default:big/", `{"policyName":"big","tenantName":"default"}`, nil)
	for i := 1; i <= 300; i++ {
		e.ok("POST", fmt.Sprintf("/api/v1/rules/default:big:%d/", i), fmt.Sprintf(
			`{"action":"allow","direction":"in","policyName":"big","ruleId":"%d","tenantName":"default","protocol":"tcp","port":%d,"priority":%d}`, i, 1000+i, 1+i%100), nil)
	}
	e.ok("POST", "/api/v1/endpointGroups/default:g0/", `{"groupName":"g0","networkName":"n1","policies":["big"],"tenantName":"default"}`, nil)

	e.ok("POST", "/api/v1/policys/default:wide/", `{"policyName":"wide","tenantName":"default"}`, nil)
	for i := 1; i <= 60; i++ {
		e.ok("POST", fmt.Sprintf("/api/v1/endpointGroups/default:w%d/", i), fmt.Sprintf(`{"groupName":"w%d","networkName":"n1","policies":["wide"],"tenantName":"default"}`, i), nil)
	}
	e.ok("POST", "/api/v1/rules/default:wide:1/", `{"action":"deny","direction":"in","policyName":"wide","ruleId":"1","tenantName":"default","protocol":"tcp","port":22}`, nil)
	e.ok("POST", "/api/v1/rules/default:wide:2/", `{"action":"allow","direction":"out","policyName":"wide","ruleId":"2","tenantName":"default","protocol":"udp","port":53}`, nil)
	if got := e.rawGet("/contiv.io/state/policy/default:w60:default:wide"); got == "" {
		t.Fatal("group w60's policy record missing")
	}
}
