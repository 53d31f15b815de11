package policy

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestParseAddrs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "10.1.1.5", want: []string{"10.1.1.5/32"}},
		{in: "10.1.1.5/24", want: []string{"10.1.1.0/24"}},
		{in: "0.0.0.0/0", want: []string{"0.0.0.0/0"}},
		{in: "10.1.1.4-7", want: []string{"10.1.1.4/30"}},
		{in: "10.1.1.1-10", want: []string{"10.1.1.1/32", "10.1.1.2/31", "10.1.1.4/30", "10.1.1.8/31", "10.1.1.10/32"}},
		{in: "10.1.1.0-255", want: []string{"10.1.1.0/24"}},
		{in: "10.1.1.9-9", want: []string{"10.1.1.9/32"}},
		{in: "10.1.1.200-255/24", want: []string{"10.1.1.200/29", "10.1.1.208/28", "10.1.1.224/27"}},
		{in: "10.1.1.200-255/30", err: "not inside 10.1.1.200/30"},
		{in: "10.1.1.9-8", err: "range end"},
		{in: "10.1.1.9-256", err: "range end"},
		{in: "10.1.1.9/33", err: "prefix length"},
		{in: "2001:db8::1", err: "not an IPv4 address"},
		{in: "web", err: "not an IPv4 address"},
	} {
		got, err := ParseAddrs(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseAddrs(%q) err = %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAddrs(%q): %v", c.in, err)
			continue
		}
		var gs []string
		for _, p := range got {
			gs = append(gs, p.String())
		}
		if !reflect.DeepEqual(gs, c.want) {
			t.Errorf("ParseAddrs(%q) = %v, want %v", c.in, gs, c.want)
		}
	}
	// Cover property: every address of a range is in exactly one prefix, no other is.
	ps := RangePrefixes(netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.1.17"))
	for a := netip.MustParseAddr("10.0.0.0"); a.Less(netip.MustParseAddr("10.0.1.40")); a = a.Next() {
		n := 0
		for _, p := range ps {
			if p.Contains(a) {
				n++
			}
		}
		in := !a.Less(netip.MustParseAddr("10.0.0.3")) && !netip.MustParseAddr("10.0.1.17").Less(a)
		if (n == 1) != in || n > 1 {
			t.Fatalf("%v covered %d times (in range %v) by %v", a, n, in, ps)
		}
	}
	if all := RangePrefixes(netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255")); len(all) != 1 || all[0] != pfx("0.0.0.0/0") {
		t.Fatalf("full range = %v", all)
	}
}

// rec builds a directional record the way netmaster writes it.
func rec(id string, f func(r *model.OfnetPolicyRule)) model.CfgPolicyRule {
	r := model.OfnetPolicyRule{RuleId: id, Priority: 1, Action: "allow"}
	if f != nil {
		f(&r)
	}
	return model.CfgPolicyRule{ID: id, OfnetPolicyRule: r}
}

func TestCompileRule(t *testing.T) {
	const base = "t:web:t:p:t:p:"
	for _, c := range []struct {
		name  string
		rec   model.CfgPolicyRule
		epg   uint16
		rules []dataplane.PolicyRule // nil with err == "" means a reply rule
		err   string                 // substring; also must name the rule
	}{
		{name: "in deny tcp setup", rec: rec(base+"1:inRx", func(r *model.OfnetPolicyRule) {
			r.DstEndpointGroup, r.IpProtocol, r.TcpFlags, r.Action = 2, 6, "syn,!ack", "deny"
		}), epg: 2, rules: []dataplane.PolicyRule{{ID: base + "1:inRx", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: "deny"}}},
		{name: "in allow tcp 80 from group", rec: rec(base+"2:inRx", func(r *model.OfnetPolicyRule) {
			r.Priority, r.DstEndpointGroup, r.SrcEndpointGroup, r.IpProtocol, r.DstPort = 10, 2, 1, 6, 80
		}), epg: 2, rules: []dataplane.PolicyRule{{ID: base + "2:inRx", Priority: 10, Ingress: true, RemoteEPG: 1, Proto: 6, Port: 80, Action: "allow"}}},
		{name: "reply rule skipped", rec: rec(base+"2:inTx", func(r *model.OfnetPolicyRule) {
			r.SrcEndpointGroup, r.DstEndpointGroup, r.SrcPort, r.IpProtocol = 2, 1, 80, 6
		}), epg: 2},
		{name: "out udp 53 to host", rec: rec(base+"3:outTx", func(r *model.OfnetPolicyRule) {
			r.Priority, r.SrcEndpointGroup, r.DstIpAddr, r.IpProtocol, r.DstPort = 5, 2, "8.8.8.8/32", 17, 53
		}), epg: 2, rules: []dataplane.PolicyRule{{ID: base + "3:outTx", Priority: 5, Remote: pfx("8.8.8.8/32"), Proto: 17, Port: 53, Action: "allow"}}},
		{name: "in from ip range", rec: rec(base+"4:inRx", func(r *model.OfnetPolicyRule) {
			r.DstEndpointGroup, r.SrcIpAddr, r.Action = 2, "10.1.1.3-4", "deny"
		}), epg: 2, rules: []dataplane.PolicyRule{
			{ID: base + "4:inRx", Priority: 1, Ingress: true, Remote: pfx("10.1.1.3/32"), Action: "deny"},
			{ID: base + "4:inRx", Priority: 1, Ingress: true, Remote: pfx("10.1.1.4/32"), Action: "deny"}}},
		{name: "icmp port dropped", rec: rec(base+"5:outTx", func(r *model.OfnetPolicyRule) {
			r.SrcEndpointGroup, r.IpProtocol, r.DstPort, r.DstIpAddr = 2, 1, 80, "10.1.0.0/16"
		}), epg: 2, rules: []dataplane.PolicyRule{{ID: base + "5:outTx", Priority: 1, Remote: pfx("10.1.0.0/16"), Proto: 1, Action: "allow"}}},
		{name: "host bits masked", rec: rec(base+"6:outTx", func(r *model.OfnetPolicyRule) {
			r.SrcEndpointGroup, r.DstIpAddr = 2, "10.1.2.3/16"
		}), epg: 2, rules: []dataplane.PolicyRule{{ID: base + "6:outTx", Priority: 1, Remote: pfx("10.1.0.0/16"), Action: "allow"}}},
		{name: "bad direction", rec: rec(base+"7:sideways", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup = 2 }), err: "RuleId: direction suffix"},
		{name: "no group", rec: rec(base+"8:inRx", nil), err: "DstEndpointGroup: group id 0 out of 1..65535"},
		{name: "group too big", rec: rec(base+"9:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup = 70000 }), err: "SrcEndpointGroup: group id 70000"},
		{name: "remote group negative", rec: rec(base+"10:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.DstEndpointGroup = 2, -1 }), err: "DstEndpointGroup: group id -1"},
		{name: "priority 0", rec: rec(base+"11:inRx", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup, r.Priority = 2, 0 }), err: "Priority: 0 out of 1..100"},
		{name: "priority 101", rec: rec(base+"12:inRx", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup, r.Priority = 2, 101 }), err: "Priority: 101"},
		{name: "action", rec: rec(base+"13:inRx", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup, r.Action = 2, "Allow" }), err: `Action: "Allow" must be allow or deny`},
		{name: "to-ip on in rule", rec: rec(base+"14:inRx", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup, r.DstIpAddr = 2, "10.1.1.2" }), err: "DstIpAddr"},
		{name: "src port", rec: rec(base+"15:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.SrcPort = 2, 80 }), err: "SrcPort: 80"},
		{name: "flags", rec: rec(base+"16:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.IpProtocol, r.TcpFlags = 2, 6, "fin" }), err: "TcpFlags"},
		{name: "syn with port", rec: rec(base+"17:outTx", func(r *model.OfnetPolicyRule) {
			r.SrcEndpointGroup, r.IpProtocol, r.DstPort, r.TcpFlags = 2, 6, 80, "syn,!ack"
		}), err: "TcpFlags: syn,!ack needs protocol 6 and port 0"},
		{name: "bad address", rec: rec(base+"18:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.DstIpAddr = 2, "10.1.1" }), err: "DstIpAddr"},
		{name: "reply rule bad group", rec: rec(base+"19:outRx", nil), err: "DstEndpointGroup: group id 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			epg, rules, err := CompileRule(c.rec.OfnetPolicyRule)
			if c.err != "" {
				var re *RuleError
				if err == nil || !strings.Contains(err.Error(), c.err) || !errors.As(err, &re) || re.RuleID != c.rec.ID {
					t.Fatalf("err = %v, want *RuleError for %s containing %q", err, c.rec.ID, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if epg != c.epg || !reflect.DeepEqual(rules, c.rules) {
				t.Fatalf("got epg %d %+v\nwant epg %d %+v", epg, rules, c.epg, c.rules)
			}
		})
	}
}

func TestCompileStateSortsMergesAndReports(t *testing.T) {
	r1 := rec("a:web:inRx", func(r *model.OfnetPolicyRule) {
		r.DstEndpointGroup, r.IpProtocol, r.TcpFlags, r.Action = 2, 6, "syn,!ack", "deny"
	})
	r2 := rec("b:web:inRx", func(r *model.OfnetPolicyRule) {
		r.DstEndpointGroup, r.SrcEndpointGroup, r.IpProtocol, r.DstPort, r.Priority = 2, 1, 6, 80, 10
	})
	r3 := rec("c:web:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.Priority, r.Action = 2, 10, "deny" })
	r4 := rec("d:db:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.Priority = 1, 50 })
	bad := rec("e:db:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup, r.Priority = 1, 500 })
	unknown := rec("f:x:outTx", func(r *model.OfnetPolicyRule) { r.SrcEndpointGroup = 9 })
	// r2 only in state/policy; r1 in both (identical); r3 in both (different).
	r3b := r3.OfnetPolicyRule
	r3b.Priority = 11
	wrongGroup := rec("g:web:inRx", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup = 1 })
	s := State{
		Groups: []model.EndpointGroupState{{ID: "db:t", EndpointGroupID: 1}, {ID: "web:t", EndpointGroupID: 2}, {ID: "huge:t", EndpointGroupID: 1 << 16}},
		Policies: []model.EpgPolicy{{ID: "t:web:t:p", EndpointGroupID: 2, RuleMaps: map[string]*model.RuleMap{
			"t:p:1": {OfnetRules: map[string]*model.OfnetPolicyRule{r1.ID: &r1.OfnetPolicyRule, r2.ID: &r2.OfnetPolicyRule, r3.ID: &r3b, wrongGroup.ID: &wrongGroup.OfnetPolicyRule}},
		}}},
		Rules: []model.CfgPolicyRule{r4, r3, bad, r1, unknown},
	}
	sets, err := Compile(s)
	want := []dataplane.PolicySet{
		{EPGID: 1, Rules: []dataplane.PolicyRule{{ID: "d:db:outTx", Priority: 50, Action: "allow"}}},
		{EPGID: 2, Rules: []dataplane.PolicyRule{
			{ID: "b:web:inRx", Priority: 10, Ingress: true, RemoteEPG: 1, Proto: 6, Port: 80, Action: "allow"},
			{ID: "a:web:inRx", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: "deny"},
		}},
	}
	if !reflect.DeepEqual(sets, want) {
		t.Fatalf("sets\n got %+v\nwant %+v", sets, want)
	}
	if err == nil {
		t.Fatal("no error for bad records")
	}
	var msgs []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var re *RuleError
		if !errors.As(e, &re) {
			t.Fatalf("%v is not a *RuleError", e)
		}
		msgs = append(msgs, re.RuleID+" "+re.Field)
	}
	wantMsgs := []string{"c:web:outTx id", "e:db:outTx Priority", "endpointGroup huge:t endpointGroupId", "f:x:outTx endpointGroupId", "g:web:inRx endpointGroupId"}
	if !reflect.DeepEqual(msgs, wantMsgs) {
		t.Fatalf("errors %q\nwant %q\n(%v)", msgs, wantMsgs, err)
	}
	// Determinism: input order does not matter.
	s.Rules = []model.CfgPolicyRule{unknown, r1, bad, r3, r4}
	sets2, err2 := Compile(s)
	if !reflect.DeepEqual(sets, sets2) || err.Error() != err2.Error() {
		t.Fatal("Compile depends on input order")
	}
	// Empty state compiles to nothing, without error.
	if sets, err := Compile(State{}); err != nil || len(sets) != 0 {
		t.Fatalf("empty: %v %v", sets, err)
	}
	// A record whose id and RuleId disagree is refused.
	mis := rec("x:inRx", func(r *model.OfnetPolicyRule) { r.DstEndpointGroup = 1 })
	mis.RuleId = "y:inRx"
	if _, err := Compile(State{Rules: []model.CfgPolicyRule{mis}}); err == nil || !strings.Contains(err.Error(), "policy rule x:inRx: RuleId") {
		t.Fatalf("mismatched ids: %v", err)
	}
}

func TestSortRulesOrder(t *testing.T) {
	rules := []dataplane.PolicyRule{
		{ID: "b", Priority: 5, Action: "allow"},
		{ID: "a", Priority: 5, Action: "allow", Ingress: true},
		{ID: "a", Priority: 5, Action: "allow"},
		{ID: "z", Priority: 5, Action: "deny"},
		{ID: "c", Priority: 100, Action: "allow", Remote: pfx("10.0.0.2/32")},
		{ID: "c", Priority: 100, Action: "allow", Remote: pfx("10.0.0.1/32")},
		{ID: "y", Priority: 1, Action: "deny"},
	}
	SortRules(rules)
	var got []string
	for _, r := range rules {
		d := "out"
		if r.Ingress {
			d = "in"
		}
		got = append(got, r.ID+"/"+d+"/"+r.Remote.String())
	}
	want := []string{"c/out/10.0.0.1/32", "c/out/10.0.0.2/32", "z/out/invalid Prefix", "a/out/invalid Prefix", "a/in/invalid Prefix", "b/out/invalid Prefix", "y/out/invalid Prefix"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %q\nwant %q", got, want)
	}
}
