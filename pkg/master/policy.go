package master

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func policyOps() objOps[model.Policy] {
	return objOps[model.Policy]{
		coll: model.CollPolicies, objType: model.TypePolicy,
		key:    func(p *model.Policy) string { return model.ScopedKey(p.TenantName, p.PolicyName) },
		setKey: func(p *model.Policy, k string) { p.Key = k },
		validate: func(p *model.Policy) error {
			if err := checkName("tenantName", p.TenantName, 64); err != nil {
				return err
			}
			return checkName("policyName", p.PolicyName, 64)
		},
		save: func(m *Master, tx *state.Tx, p, old *model.Policy) error {
			if err := requireTenant(tx, p.TenantName); err != nil {
				return err
			}
			if old != nil {
				p.LinkSets, p.Links = old.LinkSets, old.Links
				clearPolicyLinks(p) // (derived when read: links.go)
			} else {
				p.LinkSets = model.PolicyLinkSets{}
				p.Links = model.PolicyLinks{Tenant: model.Link{ObjType: model.TypeTenant, ObjKey: p.TenantName}}
			}
			return tx.Put(model.ModelKey(model.TypePolicy, p.Key), p)
		},
		remove: func(m *Master, tx *state.Tx, p *model.Policy) error {
			epgs, err := listT[model.EndpointGroup](tx, model.ModelKey(model.TypeEndpointGroup, p.TenantName+":"))
			if err != nil {
				return err
			}
			for _, e := range epgs {
				for _, ep := range e.Policies {
					if ep == p.PolicyName {
						return conflict("policy %s is attached to endpoint group %s", p.Key, e.Key)
					}
				}
			}
			kvs, err := tx.List(model.ModelKey(model.TypeRule, p.Key+":"))
			if err != nil {
				return err
			}
			for _, kv := range kvs {
				tx.Delete(kv.Key)
			}
			tx.Delete(model.ModelKey(model.TypePolicy, p.Key))
			return nil
		},
		inspect: func(m *Master, tx *state.Tx, p *model.Policy) (any, error) {
			out := model.PolicyInspect{Config: *p}
			epgs, err := listT[model.EndpointGroupState](tx, model.EPGStatePrefix)
			if err != nil {
				return nil, err
			}
			groups := map[string]bool{}
			for _, g := range epgs {
				if ok, err := tx.Get(model.PolicyStateKey(model.EpgPolicyID(model.ScopedKey(g.TenantName, g.GroupName), p.Key)), &model.EpgPolicy{}); err != nil {
					return nil, err
				} else if ok {
					groups[g.ID] = true
				}
			}
			eps, err := tenantEndpoints(tx, p.TenantName) // a policy's groups are its tenant's
			if err != nil {
				return nil, err
			}
			for _, ep := range eps {
				if groups[ep.EndpointGroupKey] {
					out.Oper.Endpoints = append(out.Oper.Endpoints, endpointOper(ep, ""))
				}
			}
			out.Oper.NumEndpoints = len(out.Oper.Endpoints)
			return out, nil
		},
		links: derivePolicyLinks,
	}
}

func validateRule(r *model.Rule) error {
	for _, f := range []struct{ name, v string }{{"tenantName", r.TenantName}, {"policyName", r.PolicyName}, {"ruleId", r.RuleID}} {
		if err := checkName(f.name, f.v, 64); err != nil {
			return err
		}
	}
	if err := checkOneOf("direction", r.Direction, "in", "out"); err != nil {
		return err
	}
	if r.Priority == 0 {
		r.Priority = 1
	}
	if err := checkIntRange("priority", r.Priority, 1, 100); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"fromEndpointGroup", r.FromEndpointGroup}, {"toEndpointGroup", r.ToEndpointGroup},
		{"fromNetwork", r.FromNetwork}, {"toNetwork", r.ToNetwork}} {
		if err := checkOptName(f.name, f.v, 64); err != nil {
			return err
		}
	}
	for _, f := range []struct{ name, v string }{{"fromIpAddress", r.FromIpAddress}, {"toIpAddress", r.ToIpAddress}} {
		if f.v != "" {
			if err := checkRegex(f.name, f.v, reRuleIP, "an IPv4 address or CIDR", 0); err != nil {
				return err
			}
		}
	}
	if err := checkRegex("protocol", r.Protocol, reProtocol, "tcp, udp, icmp, empty or a protocol number", 0); err != nil {
		return err
	}
	if _, err := protoNum(r.Protocol); err != nil {
		return err
	}
	if err := checkIntRange("port", r.Port, 0, 65535); err != nil {
		return err
	}
	if err := checkOneOf("action", r.Action, "allow", "deny"); err != nil {
		return err
	}
	switch r.Direction {
	case "in":
		if r.ToEndpointGroup != "" || r.ToNetwork != "" {
			return badReq("toEndpointGroup/toNetwork: not allowed in an incoming rule")
		}
		if r.FromNetwork != "" && (r.FromIpAddress != "" || r.FromEndpointGroup != "") {
			return badReq("fromNetwork: can't be combined with fromIpAddress or fromEndpointGroup")
		}
	case "out":
		if r.FromEndpointGroup != "" || r.FromNetwork != "" || r.FromIpAddress != "" {
			return badReq("fromEndpointGroup/fromNetwork/fromIpAddress: not allowed in an outgoing rule")
		}
		if r.ToNetwork != "" && (r.ToIpAddress != "" || r.ToEndpointGroup != "") {
			return badReq("toNetwork: can't be combined with toIpAddress or toEndpointGroup")
		}
	}
	return nil
}

func protoNum(p string) (uint8, error) {
	switch p {
	case "":
		return 0, nil
	case "tcp":
		return 6, nil
	case "udp":
		return 17, nil
	case "icmp":
		return 1, nil
	case "igmp":
		return 2, nil
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 255 {
		return 0, badReq("protocol: %q is not a protocol name or a number 0..255", p)
	}
	return uint8(n), nil
}

func ruleOps() objOps[model.Rule] {
	return objOps[model.Rule]{
		coll: model.CollRules, objType: model.TypeRule,
		key:      func(r *model.Rule) string { return model.RuleKey(r.TenantName, r.PolicyName, r.RuleID) },
		setKey:   func(r *model.Rule, k string) { r.Key = k },
		validate: validateRule,
		save:     saveRule,
		remove:   removeRule,
	}
}

func saveRule(m *Master, tx *state.Tx, r, old *model.Rule) error {
	if old != nil {
		return conflict("rule %s already exists: rules can't be updated", r.Key)
	}
	policyKey := model.ScopedKey(r.TenantName, r.PolicyName)
	if ok, err := tx.Get(model.ModelKey(model.TypePolicy, policyKey), &model.Policy{}); err != nil {
		return err
	} else if !ok {
		return unproc("policyName: policy %q does not exist in tenant %q", r.PolicyName, r.TenantName)
	}
	for _, g := range []struct{ f, v string }{{"fromEndpointGroup", r.FromEndpointGroup}, {"toEndpointGroup", r.ToEndpointGroup}} {
		if g.v == "" {
			continue
		}
		if ok, err := tx.Get(model.ModelKey(model.TypeEndpointGroup, model.ScopedKey(r.TenantName, g.v)), &model.EndpointGroup{}); err != nil {
			return err
		} else if !ok {
			return unproc("%s: endpoint group %q does not exist in tenant %q", g.f, g.v, r.TenantName)
		}
	}
	// As Contiv: a rule naming a network carries that network's subnet as its address.
	for _, n := range []struct {
		f, v string
		ip   *string
	}{{"fromNetwork", r.FromNetwork, &r.FromIpAddress}, {"toNetwork", r.ToNetwork, &r.ToIpAddress}} {
		if n.v == "" {
			continue
		}
		var nw model.Network
		if ok, err := tx.Get(model.ModelKey(model.TypeNetwork, model.ScopedKey(r.TenantName, n.v)), &nw); err != nil {
			return err
		} else if !ok {
			return unproc("%s: network %q does not exist in tenant %q", n.f, n.v, r.TenantName)
		}
		*n.ip = nw.Subnet
	}
	r.LinkSets = model.RuleLinkSets{}
	addLink(&r.LinkSets.Policies, model.TypePolicy, policyKey)
	r.Links = model.RuleLinks{}
	if g := r.FromEndpointGroup + r.ToEndpointGroup; g != "" {
		epgKey := model.ScopedKey(r.TenantName, g)
		// (The group lists the rules that name it, Contiv's link-sets.MatchRules, and the
		// policy its rules: both derived when read, links.go.)
		r.Links.MatchEndpointGroup = model.Link{ObjType: model.TypeEndpointGroup, ObjKey: epgKey}
	}
	if err := tx.Put(model.ModelKey(model.TypeRule, r.Key), r); err != nil {
		return err
	}
	// Expand into every EPG the policy is attached to.
	eps, err := epgPoliciesOf(tx, policyKey)
	if err != nil {
		return err
	}
	for _, ep := range eps {
		if err := addRuleToEpgPolicy(tx, ep, r); err != nil {
			return err
		}
	}
	return nil
}

func removeRule(m *Master, tx *state.Tx, r *model.Rule) error {
	policyKey := model.ScopedKey(r.TenantName, r.PolicyName)
	eps, err := epgPoliciesOf(tx, policyKey)
	if err != nil {
		return err
	}
	for _, ep := range eps {
		if err := deleteRuleRecords(tx, ep.ID+":"+r.Key+":"); err != nil {
			return err
		}
		if rm := ep.RuleMaps[r.Key]; rm != nil { // a record written with Contiv's RuleMaps
			for id := range rm.OfnetRules {
				tx.Delete(model.RuleStateKey(id))
			}
			delete(ep.RuleMaps, r.Key)
			if err := tx.Put(model.PolicyStateKey(ep.ID), ep); err != nil {
				return err
			}
		}
	}
	tx.Delete(model.ModelKey(model.TypeRule, r.Key))
	return nil
}

// epgPoliciesOf lists the EpgPolicy records of one policy (ids end in ":<policyKey>").
func epgPoliciesOf(tx *state.Tx, policyKey string) ([]*model.EpgPolicy, error) {
	all, err := listT[model.EpgPolicy](tx, model.PolicyStatePrefix)
	if err != nil {
		return nil, err
	}
	var out []*model.EpgPolicy
	for _, ep := range all {
		parts := strings.SplitN(ep.ID, ":", 3)
		if len(parts) == 3 && parts[2] == policyKey {
			out = append(out, ep)
		}
	}
	return out, nil
}

func attachPolicy(tx *state.Tx, e *model.EndpointGroup, groupID int, policy string) error {
	policyKey := model.ScopedKey(e.TenantName, policy)
	id := model.EpgPolicyID(e.Key, policyKey)
	ep := &model.EpgPolicy{ID: id, EpgPolicyKey: id, EndpointGroupID: groupID, RuleMaps: map[string]*model.RuleMap{}}
	rules, err := listT[model.Rule](tx, model.ModelKey(model.TypeRule, policyKey+":"))
	if err != nil {
		return err
	}
	for _, r := range rules {
		if err := addRuleToEpgPolicy(tx, ep, r); err != nil {
			return err
		}
	}
	addLink(&e.LinkSets.Policies, model.TypePolicy, policyKey)
	return tx.Put(model.PolicyStateKey(id), ep)
}

func detachPolicy(tx *state.Tx, e *model.EndpointGroup, policy string) error {
	policyKey := model.ScopedKey(e.TenantName, policy)
	id := model.EpgPolicyID(e.Key, policyKey)
	ep, found, err := getT[model.EpgPolicy](tx, model.PolicyStateKey(id))
	if err != nil {
		return err
	}
	if found {
		if err := deleteRuleRecords(tx, id+":"); err != nil {
			return err
		}
		for _, rm := range ep.RuleMaps { // a record written with Contiv's RuleMaps
			for rid := range rm.OfnetRules {
				tx.Delete(model.RuleStateKey(rid))
			}
		}
		tx.Delete(model.PolicyStateKey(id))
	}
	delLink(&e.LinkSets.Policies, policyKey)
	return nil
}

// deleteRuleRecords deletes the policyRule records whose ids start with idPrefix: every
// record of one EPG policy ("<epgPolicyID>:") or of one rule in it ("<epgPolicyID>:<ruleKey>:").
// Names cannot contain ':', so the prefix matches nothing else.
func deleteRuleRecords(tx *state.Tx, idPrefix string) error {
	kvs, err := tx.List(model.RuleStatePrefix + idPrefix)
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		tx.Delete(kv.Key)
	}
	return nil
}

// addRuleToEpgPolicy expands r for the EPG of ep (contiv.md 8.3) and writes the policyRule
// records. Unlike Contiv, the EpgPolicy record does not copy the rule and its expansion
// into RuleMaps: that made every record grow with the policy, so one rule added to a
// policy on 100 groups rewrote 100 copies of the whole policy (tens of MB with 1,000
// rules, far past etcd's request limit). Record ids are "<epgPolicyID>:<ruleKey>:<dir>",
// which is all detach and rule removal need; RuleMaps of records Contiv wrote are still
// honoured.
func addRuleToEpgPolicy(tx *state.Tx, ep *model.EpgPolicy, r *model.Rule) error {
	groupID := func(name string) (int, error) {
		if name == "" {
			return 0, nil
		}
		st, found, err := getT[model.EndpointGroupState](tx, model.EPGStateKey(model.EPGStateID(name, r.TenantName)))
		if err != nil {
			return 0, err
		}
		if !found {
			return 0, unproc("endpoint group %q of rule %s does not exist", name, r.Key)
		}
		return st.EndpointGroupID, nil
	}
	netSubnet := func(name string) (string, error) {
		if name == "" {
			return "", nil
		}
		ns, found, err := tenantNetwork(tx, name, r.TenantName)
		if err != nil {
			return "", err
		}
		if !found {
			return "", unproc("network %q of rule %s does not exist", name, r.Key)
		}
		return fmt.Sprintf("%s/%d", ns.SubnetIP, ns.SubnetLen), nil
	}
	proto, err := protoNum(r.Protocol)
	if err != nil {
		return err
	}
	withPort := (proto == 6 || proto == 17) && r.Port != 0
	flags := ""
	if proto == 6 && r.Port == 0 {
		flags = "syn,!ack"
	}
	base := ep.ID + ":" + r.Key
	mk := func(dir string) *model.OfnetPolicyRule {
		return &model.OfnetPolicyRule{RuleId: base + ":" + dir, Priority: r.Priority, IpProtocol: proto, Action: r.Action}
	}
	rules := map[string]*model.OfnetPolicyRule{}
	switch r.Direction {
	case "in":
		remote, err := groupID(r.FromEndpointGroup)
		if err != nil {
			return err
		}
		remoteIP := r.FromIpAddress
		if remoteIP == "" {
			if remoteIP, err = netSubnet(r.FromNetwork); err != nil {
				return err
			}
		}
		rx := mk("inRx")
		rx.DstEndpointGroup, rx.SrcEndpointGroup = ep.EndpointGroupID, remote
		rx.SrcIpAddr, rx.DstIpAddr, rx.DstPort, rx.TcpFlags = remoteIP, r.ToIpAddress, uint16(r.Port), flags
		rules[rx.RuleId] = rx
		if withPort {
			t := mk("inTx")
			t.SrcEndpointGroup, t.DstEndpointGroup = ep.EndpointGroupID, remote
			t.DstIpAddr, t.SrcIpAddr, t.SrcPort = remoteIP, r.ToIpAddress, uint16(r.Port)
			rules[t.RuleId] = t
		}
	case "out":
		remote, err := groupID(r.ToEndpointGroup)
		if err != nil {
			return err
		}
		remoteIP := r.ToIpAddress
		if remoteIP == "" {
			if remoteIP, err = netSubnet(r.ToNetwork); err != nil {
				return err
			}
		}
		t := mk("outTx")
		t.SrcEndpointGroup, t.DstEndpointGroup = ep.EndpointGroupID, remote
		t.DstIpAddr, t.DstPort, t.TcpFlags = remoteIP, uint16(r.Port), flags
		rules[t.RuleId] = t
		if withPort {
			rx := mk("outRx")
			rx.DstEndpointGroup, rx.SrcEndpointGroup = ep.EndpointGroupID, remote
			rx.SrcIpAddr, rx.SrcPort = remoteIP, uint16(r.Port)
			rules[rx.RuleId] = rx
		}
	}
	for id, or := range rules {
		if err := tx.Put(model.RuleStateKey(id), model.CfgPolicyRule{ID: id, OfnetPolicyRule: *or}); err != nil {
			return err
		}
	}
	return nil
}
