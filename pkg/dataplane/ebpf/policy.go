package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sort"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// MaxRules is how many rules one endpoint group may have per direction (CB_MAX_RULES in
// bpf/lib/policy.h).
const MaxRules = 1024

// PolicyError says a group's rule set could not be installed (a rule is invalid, there
// are more than MaxRules in one direction, or its compiled form does not fit the maps). The group is failed closed: every new flow
// from or to it is denied, and established ones are cut on their next packet, until a
// valid rule set (or its deletion) replaces it.
type PolicyError struct {
	EPGID uint16
	Err   error
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("policy %d: failed closed (all traffic of the group denied): %v", e.EPGID, e.Err)
}

func (e *PolicyError) Unwrap() error { return e.Err }

// UpsertPolicy implements dataplane.Driver: the rule set of one endpoint group replaces the
// previous one (both directions written before the old entries go).
func (d *Driver) UpsertPolicy(ctx context.Context, p dataplane.PolicySet) error {
	defer d.lock(cPols, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertPolicy(p)
}

// compileRules turns a rule set into the two per-direction map values.
func compileRules(p dataplane.PolicySet) (egress, ingress []contivbpfCbRule, err error) {
	eg, in, err := compileRuleSet(p)
	if err != nil {
		return nil, nil, err
	}
	strip := func(rs []rankedRule) []contivbpfCbRule {
		out := make([]contivbpfCbRule, len(rs))
		for i := range rs {
			out[i] = rs[i].r
		}
		return out
	}
	return strip(eg), strip(in), nil
}

// rankedRule is a compiled rule with the id of the rule it came from.
type rankedRule struct {
	r  contivbpfCbRule
	id string
}

// compileRuleSet is compileRules keeping each entry's rule id (in map order).
func compileRuleSet(p dataplane.PolicySet) (egress, ingress []rankedRule, err error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	type ranked = rankedRule
	var eg, in []ranked
	for _, r := range p.Rules {
		var c contivbpfCbRule
		switch r.Action {
		case dataplane.ActionAllow:
			c.Action = uint8(contivbpfCbRuleActionCB_ACT_ALLOW)
			c.Prio = uint16(2 * r.Priority)
		case dataplane.ActionDeny:
			c.Action = uint8(contivbpfCbRuleActionCB_ACT_DENY)
			c.Prio = uint16(2*r.Priority + 1) // deny wins ties
		}
		if r.Remote.IsValid() {
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
	sorted := func(rs []ranked, dir string) ([]ranked, error) {
		if len(rs) > MaxRules {
			return nil, fmt.Errorf("policy %d: %d %s rules, at most %d", p.EPGID, len(rs), dir, MaxRules)
		}
		sort.SliceStable(rs, func(i, j int) bool {
			if rs[i].r.Prio != rs[j].r.Prio {
				return rs[i].r.Prio > rs[j].r.Prio
			}
			return rs[i].id < rs[j].id
		})
		return rs, nil
	}
	if egress, err = sorted(eg, "egress"); err != nil {
		return nil, nil, err
	}
	if ingress, err = sorted(in, "ingress"); err != nil {
		return nil, nil, err
	}
	return egress, ingress, nil
}

// policiesKey is the cb_policies key (and the compiled tables', poltables.go) of group epg's
// rules of direction dir (contivbpfCbPolDir).
func policiesKey(epg uint16, dir uint8) contivbpfCbPolKey {
	return contivbpfCbPolKey{Epg: epg, Dir: dir}
}

func (d *Driver) upsertPolicy(p dataplane.PolicySet) error {
	if p.EPGID == 0 {
		return fmt.Errorf("policy: epgID is 0")
	}
	old, had := d.pols.policies[p.EPGID]
	_, wasFailed := d.pols.failed[p.EPGID]
	if had && !wasFailed && reflect.DeepEqual(old.Rules, p.Rules) {
		return d.installPolicy(p) // (for the generation) no verdict changes
	}
	// The group's flows are judged again: its stamp before the rules, the clock after.
	return d.change([]uint16{p.EPGID}, nil, func() error {
		d.pols.inChange = true
		defer func() { d.pols.inChange = false }()
		return d.installPolicy(p)
	})
}

// installPolicy writes group p.EPGID's rule set and state (failing it closed when it
// cannot).
func (d *Driver) installPolicy(p dataplane.PolicySet) error {
	eg, in, err := compileRules(p)
	if err != nil {
		return d.failClosed(p.EPGID, err)
	}
	for dir, rules := range [][]contivbpfCbRule{eg, in} {
		key := policiesKey(p.EPGID, uint8(dir))
		if len(rules) == 0 {
			if err := d.pols.pol.remove(key); err != nil {
				return fmt.Errorf("policy %d: delete empty direction: %w", p.EPGID, err)
			}
			if err := mapDel(d.objs.CbPolicies, &key); err != nil {
				return fmt.Errorf("policy %d: delete empty direction: %w", p.EPGID, err)
			}
			continue
		}
		// The list (listings, verification, a restart's source) and its compiled form.
		v := contivbpfCbPolicy{Count: uint32(len(rules)), Generation: d.gen}
		copy(v.Rules[:], rules)
		if err := d.mapPut(contivbpfMapCbPolicies, d.objs.CbPolicies, &key, &v); err != nil {
			return d.failClosed(p.EPGID, err)
		}
		if err := d.pols.pol.install(key, rules, d.gen); err != nil {
			return d.failClosed(p.EPGID, fmt.Errorf("compile the %s rules: %w", [2]string{"egress", "ingress"}[dir], err))
		}
	}
	var flags uint32
	if len(eg)+len(in) > 0 {
		flags = uint32(contivbpfCbEpgFlagsCB_EPG_RULES)
	}
	if err := d.putEPGState(p.EPGID, flags, d.gen); err != nil {
		return d.failClosed(p.EPGID, fmt.Errorf("write group state: %w", err))
	}
	d.pols.policies[p.EPGID] = p
	delete(d.pols.failed, p.EPGID)
	d.pols.noteFeatures()
	return nil
}

// failClosed puts a group whose rule set cannot be installed into deny-all and returns
// the *PolicyError that says so (joined with any error of doing it).
func (d *Driver) failClosed(epg uint16, cause error) error {
	perr := &PolicyError{EPGID: epg, Err: cause}
	prev, again := d.pols.failed[epg]
	again = again && prev.Error() == cause.Error() // a retry of the same refusal
	if !again {
		d.log.Error("policy failed closed", "epg", epg, "err", cause)
	}
	delete(d.pols.policies, epg)
	d.pols.failed[epg] = cause
	d.pols.noteFeatures()
	// Written every time (with this generation), so a Sync's sweep never reopens it.
	write := func() error {
		if err := d.putEPGState(epg, uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL), d.gen); err != nil {
			return fmt.Errorf("policy %d: write deny-all state: %w", epg, err)
		}
		return nil
	}
	if again {
		// Established flows were cut when it first closed.
		if err := write(); err != nil {
			return errors.Join(perr, err)
		}
		return perr
	}
	// Stamped before DENY_ALL is written, so its flows are cut on their next packet;
	// within an upsert's change the group is stamped already and the clock published
	// after this write (announce holds the clock: a second one here would wait for it).
	if d.pols.inChange {
		if err := write(); err != nil {
			return errors.Join(perr, err)
		}
		return perr
	}
	if err := d.change([]uint16{epg}, nil, write); err != nil {
		return errors.Join(perr, err)
	}
	return perr
}

// FailedPolicies reports the groups that are failed closed, with why: as of the last
// policy change, without waiting for one in progress (/metrics reads it).
func (d *Driver) FailedPolicies() map[uint16]string {
	out := map[uint16]string{}
	if p := d.pols.failedNow.Load(); p != nil {
		for g, why := range *p {
			out[g] = why
		}
	}
	return out
}

// DeletePolicy implements dataplane.Driver. The group's stamp moves, so its established
// flows are judged again (without its rules) on their next packet.
func (d *Driver) DeletePolicy(ctx context.Context, epgID uint16) error {
	defer d.lock(cPols, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deletePolicy(epgID)
}

func (d *Driver) deletePolicy(epgID uint16) error {
	_, had := d.pols.policies[epgID]
	_, failed := d.pols.failed[epgID]
	if had || failed { // its flows are judged again without its rules
		return d.change([]uint16{epgID}, nil, func() error { return d.removePolicy(epgID) })
	}
	return d.removePolicy(epgID)
}

// removePolicy deletes group epgID's rules and clears its state (keeping its stamp).
func (d *Driver) removePolicy(epgID uint16) error {
	for dir := uint8(0); dir < 2; dir++ {
		key := policiesKey(epgID, dir)
		if err := d.pols.pol.remove(key); err != nil {
			return fmt.Errorf("policy %d: delete: %w", epgID, err)
		}
		if err := mapDel(d.objs.CbPolicies, &key); err != nil {
			return fmt.Errorf("policy %d: delete: %w", epgID, err)
		}
	}
	if err := d.putEPGState(epgID, 0, 0); err != nil {
		return fmt.Errorf("policy %d: clear group state: %w", epgID, err)
	}
	delete(d.pols.policies, epgID)
	delete(d.pols.failed, epgID)
	d.pols.noteFeatures()
	return nil
}

// compilePinnedPolicies compiles every rule list in cb_policies into the lookup maps (at
// start, before this build's programs are attached). A list that cannot be compiled or
// installed fails its group closed, as its upsert would: stamped, its clock published
// with the configuration written next.
func (d *Driver) compilePinnedPolicies() error {
	t, err := newPolTables(d.objs.CbPolHeads, d.objs.CbPolRules, d.objs.CbPolCidrs, d.mapPut)
	if err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	d.pols.pol = t
	failed, err := t.compileAll(d.objs.CbPolicies)
	if err != nil {
		d.log.Warn("compiled policy maps: stale entries left", "err", err)
	}
	var groups []uint16
	for epg := range failed {
		groups = append(groups, epg)
	}
	if len(groups) > 0 {
		if err := d.stampNext(groups, nil); err != nil {
			return err
		}
	}
	for epg, cause := range failed {
		d.log.Error("policy failed closed", "epg", epg, "err", cause)
		d.pols.failed[epg] = cause
		d.pols.noteFeatures()
		if err := d.putEPGState(epg, uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL), d.gen); err != nil {
			return fmt.Errorf("ebpf: policy %d: write deny-all state: %w", epg, err)
		}
	}
	return nil
}
