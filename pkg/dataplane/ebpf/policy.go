package ebpf

import (
	"context"
	"fmt"
	"net"
	"sort"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

const maxRules = 64 // CB_MAX_RULES in bpf/lib/policy.h

// UpsertPolicy implements dataplane.Driver: the rule set of one endpoint group replaces the
// previous one (both directions written before the old entries go).
func (d *Driver) UpsertPolicy(ctx context.Context, p dataplane.PolicySet) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertPolicy(p)
}

// compileRules turns a rule set into the two per-direction map values.
func compileRules(p dataplane.PolicySet) (egress, ingress []contivbpfCbRule, err error) {
	if p.EPGID == 0 {
		return nil, nil, fmt.Errorf("policy: epgID is 0")
	}
	type ranked struct {
		r  contivbpfCbRule
		id string
	}
	var eg, in []ranked
	for _, r := range p.Rules {
		if r.Priority < 1 || r.Priority > 100 {
			return nil, nil, fmt.Errorf("policy %d rule %s: priority %d out of 1-100", p.EPGID, r.ID, r.Priority)
		}
		var c contivbpfCbRule
		switch r.Action {
		case dataplane.ActionAllow:
			c.Action = uint8(contivbpfCbRuleActionCB_ACT_ALLOW)
			c.Prio = uint16(2 * r.Priority)
		case dataplane.ActionDeny:
			c.Action = uint8(contivbpfCbRuleActionCB_ACT_DENY)
			c.Prio = uint16(2*r.Priority + 1) // deny wins ties
		default:
			return nil, nil, fmt.Errorf("policy %d rule %s: action %q must be allow or deny", p.EPGID, r.ID, r.Action)
		}
		if r.Remote.IsValid() {
			if !r.Remote.Addr().Is4() {
				return nil, nil, fmt.Errorf("policy %d rule %s: remote %v is not IPv4", p.EPGID, r.ID, r.Remote)
			}
			m := r.Remote.Masked()
			c.RemoteIp = ip4(m.Addr())
			var b [4]byte
			copy(b[:], net.CIDRMask(m.Bits(), 32))
			c.RemoteMask = binaryNative(b[:])
		}
		c.RemoteEpg = r.RemoteEPG
		c.Proto = r.Proto
		c.Port = nport(r.Port)
		if r.SynOnly {
			c.Flags = 1
		}
		if r.Ingress {
			in = append(in, ranked{c, r.ID})
		} else {
			eg = append(eg, ranked{c, r.ID})
		}
	}
	sorted := func(rs []ranked, dir string) ([]contivbpfCbRule, error) {
		if len(rs) > maxRules {
			return nil, fmt.Errorf("policy %d: %d %s rules, at most %d", p.EPGID, len(rs), dir, maxRules)
		}
		sort.SliceStable(rs, func(i, j int) bool {
			if rs[i].r.Prio != rs[j].r.Prio {
				return rs[i].r.Prio > rs[j].r.Prio
			}
			return rs[i].id < rs[j].id
		})
		out := make([]contivbpfCbRule, len(rs))
		for i := range rs {
			out[i] = rs[i].r
		}
		return out, nil
	}
	if egress, err = sorted(eg, "egress"); err != nil {
		return nil, nil, err
	}
	if ingress, err = sorted(in, "ingress"); err != nil {
		return nil, nil, err
	}
	return egress, ingress, nil
}

func (d *Driver) upsertPolicy(p dataplane.PolicySet) error {
	eg, in, err := compileRules(p)
	if err != nil {
		return err
	}
	for dir, rules := range [][]contivbpfCbRule{eg, in} {
		key := contivbpfCbPolKey{Epg: p.EPGID, Dir: uint8(dir)}
		if len(rules) == 0 {
			if err := mapDel(d.objs.CbPolicies, &key); err != nil {
				return fmt.Errorf("policy %d: delete empty direction: %w", p.EPGID, err)
			}
			continue
		}
		v := contivbpfCbPolicy{Count: uint32(len(rules)), Generation: d.gen}
		copy(v.Rules[:], rules)
		if err := d.mapPut(contivbpfMapCbPolicies, d.objs.CbPolicies, &key, &v); err != nil {
			return fmt.Errorf("policy %d: %w", p.EPGID, err)
		}
	}
	_, had := d.policies[p.EPGID]
	d.policies[p.EPGID] = p
	if !had {
		return d.writeConfig()
	}
	return nil
}

// DeletePolicy implements dataplane.Driver. Established flows keep going (conntrack), as
// with any stateful firewall; new flows are no longer checked against the group's rules.
func (d *Driver) DeletePolicy(ctx context.Context, epgID uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.check(); err != nil {
		return err
	}
	return d.deletePolicy(epgID)
}

func (d *Driver) deletePolicy(epgID uint16) error {
	for dir := uint8(0); dir < 2; dir++ {
		if err := mapDel(d.objs.CbPolicies, &contivbpfCbPolKey{Epg: epgID, Dir: dir}); err != nil {
			return fmt.Errorf("policy %d: delete: %w", epgID, err)
		}
	}
	if _, had := d.policies[epgID]; had {
		delete(d.policies, epgID)
		return d.writeConfig()
	}
	return nil
}
