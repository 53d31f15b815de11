package policy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/policy"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func values[T any](m map[string]T) []T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]T, 0, len(m))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

// TestCompileMasterState creates policy through netmaster's REST handler on a private
// etcd, reads back the state records it writes and compiles them.
func TestCompileMasterState(t *testing.T) {
	ctx := context.Background()
	store, _ := statetest.Store(t)
	m, err := master.New(ctx, master.Config{Store: store, FwdMode: "bridge", ClusterMode: "docker"})
	if err != nil {
		t.Fatalf("master.New: %v", err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	post := func(path, body string) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/api/v1/"+path+"/", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, out)
		}
	}
	post("networks/default:n1", `{"tenantName":"default","networkName":"n1","encap":"vxlan","subnet":"10.1.0.0/16","gateway":"10.1.0.1","nwType":"data"}`)
	post("policys/default:p", `{"policyName":"p","tenantName":"default"}`)
	post("endpointGroups/default:db", `{"groupName":"db","networkName":"n1","tenantName":"default"}`)
	post("endpointGroups/default:other", `{"groupName":"other","networkName":"n1","tenantName":"default"}`)
	post("endpointGroups/default:web", `{"groupName":"web","networkName":"n1","policies":["p"],"tenantName":"default"}`)
	rule := func(id, body string) {
		post("rules/default:p:"+id, `{"policyName":"p","tenantName":"default","ruleId":"`+id+`",`+body+`}`)
	}
	rule("1", `"action":"deny","direction":"in","priority":1,"protocol":"tcp"`)
	rule("2", `"action":"allow","direction":"in","fromEndpointGroup":"db","port":80,"priority":10,"protocol":"tcp"`)
	rule("3", `"action":"allow","direction":"out","toIpAddress":"8.8.8.8","port":53,"priority":5,"protocol":"udp"`)
	rule("4", `"action":"deny","direction":"out","toNetwork":"n1","protocol":"icmp","priority":2`)
	rule("5", `"action":"deny","direction":"in","fromIpAddress":"10.1.0.3-6","priority":20`)
	rule("6", `"action":"allow","direction":"in","toIpAddress":"10.1.0.9","priority":30`)

	groups, err := state.ListJSON[model.EndpointGroupState](ctx, store, model.EPGStatePrefix)
	if err != nil {
		t.Fatal(err)
	}
	pols, err := state.ListJSON[model.EpgPolicy](ctx, store, model.PolicyStatePrefix)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := state.ListJSON[model.CfgPolicyRule](ctx, store, model.RuleStatePrefix)
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]uint16{}
	for _, g := range groups {
		id[g.GroupName] = uint16(g.EndpointGroupID)
	}
	if len(id) != 3 || id["db"] == 0 || id["web"] == 0 || id["other"] == 0 {
		t.Fatalf("groups %v", id)
	}

	s := policy.State{Groups: values(groups), Policies: values(pols), Rules: values(rules)}
	sets, err := policy.Compile(s)
	// Rule 6 carries a destination inside web (toIpAddress of an incoming rule): refused by name.
	pre := "default:web:default:p:default:p:"
	if err == nil || err.Error() != "policy rule "+pre+"6:inRx: DstIpAddr: \"10.1.0.9\": an address inside the rule's own group (toIpAddress of an incoming rule) can't be enforced" {
		t.Fatalf("Compile error = %v", err)
	}
	web := id["web"]
	want := []dataplane.PolicySet{{EPGID: web, Rules: []dataplane.PolicyRule{
		{ID: pre + "5:inRx", Priority: 20, Ingress: true, Remote: netip.MustParsePrefix("10.1.0.3/32"), Action: "deny"},
		{ID: pre + "5:inRx", Priority: 20, Ingress: true, Remote: netip.MustParsePrefix("10.1.0.4/31"), Action: "deny"},
		{ID: pre + "5:inRx", Priority: 20, Ingress: true, Remote: netip.MustParsePrefix("10.1.0.6/32"), Action: "deny"},
		{ID: pre + "2:inRx", Priority: 10, Ingress: true, RemoteEPG: id["db"], Proto: 6, Port: 80, Action: "allow"},
		{ID: pre + "3:outTx", Priority: 5, Remote: netip.MustParsePrefix("8.8.8.8/32"), Proto: 17, Port: 53, Action: "allow"},
		{ID: pre + "4:outTx", Priority: 2, Remote: netip.MustParsePrefix("10.1.0.0/16"), Proto: 1, Action: "deny"},
		{ID: pre + "1:inRx", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: "deny"},
	}}}
	if !reflect.DeepEqual(sets, want) {
		t.Fatalf("sets\n got %+v\nwant %+v", sets, want)
	}
	// The same from the policyRule records alone (what the agent watches).
	if only, err := policy.Compile(policy.State{Rules: values(rules)}); err == nil || !reflect.DeepEqual(only, want) {
		t.Fatalf("rules only: %+v %v", only, err)
	}

	ip := netip.MustParseAddr
	for _, c := range []struct {
		pkt  policy.Packet
		want string
	}{
		{policy.Packet{SrcEPG: id["db"], DstEPG: web, SrcIP: ip("10.1.0.10"), DstIP: ip("10.1.0.20"), Proto: 6, DstPort: 80, SYN: true}, "allow 2:inRx"},
		{policy.Packet{SrcEPG: id["other"], DstEPG: web, SrcIP: ip("10.1.0.11"), DstIP: ip("10.1.0.20"), Proto: 6, DstPort: 80, SYN: true}, "deny 1:inRx"},
		{policy.Packet{SrcEPG: id["db"], DstEPG: web, SrcIP: ip("10.1.0.5"), DstIP: ip("10.1.0.20"), Proto: 6, DstPort: 80, SYN: true}, "deny 5:inRx"},
		{policy.Packet{SrcEPG: web, DstEPG: id["db"], SrcIP: ip("10.1.0.20"), DstIP: ip("10.1.0.10"), Proto: 1}, "deny 4:outTx"},
		{policy.Packet{SrcEPG: web, SrcIP: ip("10.1.0.20"), DstIP: ip("8.8.8.8"), Proto: 1}, "allow "},
		{policy.Packet{SrcEPG: id["db"], DstEPG: id["other"], SrcIP: ip("10.1.0.10"), DstIP: ip("10.1.0.11"), Proto: 6, DstPort: 22, SYN: true}, "allow "},
	} {
		v := policy.Decide(sets, c.pkt)
		got := string(v.Action) + " " + strings.TrimPrefix(v.RuleID, pre)
		if got != c.want {
			t.Errorf("%+v: %s, want %s", c.pkt, got, c.want)
		}
	}
	mp, err := policy.Encode(sets, 0)
	if err != nil {
		t.Fatal(err)
	}
	// One entry per (key, prefix): rule 5 gives three, rules 1-4 one each.
	if len(mp.Entries) != 7 {
		t.Fatalf("%d entries: %+v", len(mp.Entries), mp.Entries)
	}
}
