package ebpf

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// polTables owns the compiled policy maps (cb_pol_heads, cb_pol_rules, cb_pol_cidrs): it
// writes a rule list's compiled keys under a fresh version, switches the (EPG, direction)
// head to it, and removes what the head no longer points at. Not safe for concurrent use
// (the driver holds its lock).
//
// Why a packet never sees a half-written rule set (bpf/lib/policy.h cb_rules_match):
//   - a new version's keys are written while the head still names the old version: no
//     packet looks them up;
//   - the head is replaced by one map update, an atomic element swap (the map has
//     BPF_F_NO_PREALLOC: the element a packet found stays intact until it is done);
//   - the old version's keys are deleted only after that: a packet that read the old head
//     and misses a key being deleted reads the head again after its lookups, finds the new
//     version and looks again; only an answer taken between two equal head reads counts.
//   - versions only grow (across restarts too: newPolTables starts above every version
//     in the maps), so "the same version" never means another rule set.
type polTables struct {
	heads, rules, cidrs *ebpf.Map
	// put writes one entry (the driver's mapPut: a full map is counted and logged).
	put func(name string, m *ebpf.Map, key, val any) error
	ver uint32 // last version handed out
	// live is what each head in the maps points at.
	live map[contivbpfCbPolKey]*polLive
}

// polLive is one installed rule list: its version, the keys written for it and the list
// it was compiled from.
type polLive struct {
	ver   uint32
	rules []contivbpfCbRule
	keys  []contivbpfCbPolRuleKey
	cidrs []contivbpfCbPolCidrKey
}

// newPolTables starts above every version found in the maps.
func newPolTables(heads, rules, cidrs *ebpf.Map, put func(string, *ebpf.Map, any, any) error) (*polTables, error) {
	t := &polTables{heads: heads, rules: rules, cidrs: cidrs, put: put, live: map[contivbpfCbPolKey]*polLive{}}
	var (
		hk contivbpfCbPolKey
		hv contivbpfCbPolHead
		rk contivbpfCbPolRuleKey
		rv contivbpfCbPolRule
		ck contivbpfCbPolCidrKey
		cv contivbpfCbPolCidr
	)
	it := heads.Iterate()
	for it.Next(&hk, &hv) {
		t.ver = max(t.ver, hv.Ver)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolHeads, err)
	}
	it = rules.Iterate()
	for it.Next(&rk, &rv) {
		t.ver = max(t.ver, rk.Ver)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolRules, err)
	}
	it = cidrs.Iterate()
	for it.Next(&ck, &cv) {
		t.ver = max(t.ver, ck.Ver)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolCidrs, err)
	}
	return t, nil
}

// nextVer is a version no entry of the maps has.
func (t *polTables) nextVer() uint32 {
	for {
		t.ver++
		if t.ver == 0 {
			continue
		}
		inUse := false
		for _, l := range t.live {
			inUse = inUse || l.ver == t.ver
		}
		if !inUse {
			return t.ver
		}
	}
}

// install makes rules (sorted, as in cb_policies) the rule list of key, with the agent's
// generation gen. An unchanged list only has its head's generation rewritten. On error
// the head still names the previous version (or none) and the new keys are gone.
func (t *polTables) install(key contivbpfCbPolKey, rules []contivbpfCbRule, gen uint32) error {
	prev := t.live[key]
	if prev != nil && slices.Equal(prev.rules, rules) {
		var h contivbpfCbPolHead
		if err := t.heads.Lookup(&key, &h); err == nil && h.Ver == prev.ver {
			if h.Generation == gen {
				return nil
			}
			h.Generation = gen
			return t.put(contivbpfMapCbPolHeads, t.heads, &key, &h)
		}
	}
	c, err := compilePolicy(rules)
	if err != nil {
		return err
	}
	l := &polLive{ver: t.nextVer(), rules: slices.Clone(rules)}
	if err := t.write(l, c); err != nil {
		return errors.Join(err, t.drop(l))
	}
	h := contivbpfCbPolHead{Ver: l.ver, Generation: gen, Count: uint32(c.count), Classes: c.classes}
	if err := t.put(contivbpfMapCbPolHeads, t.heads, &key, &h); err != nil {
		return errors.Join(err, t.drop(l))
	}
	t.live[key] = l
	if prev != nil {
		return t.drop(prev)
	}
	return nil
}

// write puts c's keys and prefixes under l's version (recording them in l).
func (t *polTables) write(l *polLive, c *polCompiled) error {
	for i, k := range c.keys {
		rk := contivbpfCbPolRuleKey{Ver: l.ver, RemoteEpg: k.remoteEPG, Port: k.port, Proto: k.proto}
		rv := contivbpfCbPolRule{Any: k.any}
		if len(k.cidrs) > 0 {
			rv.Cidrs = uint32(i + 1)
			for _, cd := range k.cidrs {
				ck := contivbpfCbPolCidrKey{Prefixlen: uint32(64 + cd.bits), Ver: l.ver, Slot: rv.Cidrs, Ip: cd.ip}
				if err := t.put(contivbpfMapCbPolCidrs, t.cidrs, &ck, &cd.best); err != nil {
					return err
				}
				l.cidrs = append(l.cidrs, ck)
			}
		}
		if err := t.put(contivbpfMapCbPolRules, t.rules, &rk, &rv); err != nil {
			return err
		}
		l.keys = append(l.keys, rk)
	}
	return nil
}

// drop deletes the keys and prefixes of l (no head may name its version any more).
func (t *polTables) drop(l *polLive) error {
	var errs []error
	for i := range l.keys {
		if err := mapDel(t.rules, &l.keys[i]); err != nil {
			errs = append(errs, fmt.Errorf("delete %s entry: %w", contivbpfMapCbPolRules, err))
		}
	}
	for i := range l.cidrs {
		if err := mapDel(t.cidrs, &l.cidrs[i]); err != nil {
			errs = append(errs, fmt.Errorf("delete %s entry: %w", contivbpfMapCbPolCidrs, err))
		}
	}
	return errors.Join(errs...)
}

// remove deletes key's head, then the keys it named.
func (t *polTables) remove(key contivbpfCbPolKey) error {
	if err := mapDel(t.heads, &key); err != nil {
		return fmt.Errorf("delete %s entry: %w", contivbpfMapCbPolHeads, err)
	}
	l := t.live[key]
	delete(t.live, key)
	if l == nil {
		return nil
	}
	return t.drop(l)
}

// sweep removes the heads whose generation is not gen (their rule lists were not part of
// the last Sync; cb_policies' entries go the same way), then every key and prefix of a
// version no head names (left by an earlier run or a crash).
func (t *polTables) sweep(gen uint32) []error {
	var (
		errs  []error
		stale []contivbpfCbPolKey
		hk    contivbpfCbPolKey
		hv    contivbpfCbPolHead
	)
	it := t.heads.Iterate()
	for it.Next(&hk, &hv) {
		if hv.Generation != gen {
			stale = append(stale, hk)
		}
	}
	if err := it.Err(); err != nil {
		return []error{fmt.Errorf("iterate %s: %w", contivbpfMapCbPolHeads, err)}
	}
	for _, k := range stale {
		errs = appendErr(errs, t.remove(k))
	}
	return append(errs, t.sweepOrphans()...)
}

// sweepOrphans deletes the keys and prefixes of versions no head names.
func (t *polTables) sweepOrphans() []error {
	live := map[uint32]bool{}
	var (
		errs []error
		hk   contivbpfCbPolKey
		hv   contivbpfCbPolHead
	)
	it := t.heads.Iterate()
	for it.Next(&hk, &hv) {
		live[hv.Ver] = true
	}
	if err := it.Err(); err != nil {
		return []error{fmt.Errorf("iterate %s: %w", contivbpfMapCbPolHeads, err)}
	}
	var (
		rk    contivbpfCbPolRuleKey
		rv    contivbpfCbPolRule
		ck    contivbpfCbPolCidrKey
		cv    contivbpfCbPolCidr
		rdead []contivbpfCbPolRuleKey
		cdead []contivbpfCbPolCidrKey
	)
	it = t.rules.Iterate()
	for it.Next(&rk, &rv) {
		if !live[rk.Ver] {
			rdead = append(rdead, rk)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolRules, err))
	}
	it = t.cidrs.Iterate()
	for it.Next(&ck, &cv) {
		if !live[ck.Ver] {
			cdead = append(cdead, ck)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolCidrs, err))
	}
	for i := range rdead {
		errs = appendErr(errs, mapDel(t.rules, &rdead[i]))
	}
	for i := range cdead {
		errs = appendErr(errs, mapDel(t.cidrs, &cdead[i]))
	}
	return errs
}

// compileAll installs every rule list of cb_policies (pol), for a start: the programs of
// this build look up the compiled form, so it must hold what an earlier run (or an
// earlier build, which scanned cb_policies) enforced before their links take this
// build's programs. Then keys of versions no head names go. Lists that cannot be
// installed are returned by group, for the caller to fail closed.
func (t *polTables) compileAll(pol *ebpf.Map) (map[uint16]error, error) {
	var (
		k    contivbpfCbPolKey
		v    contivbpfCbPolicy
		keys []contivbpfCbPolKey
		vals []contivbpfCbPolicy
	)
	it := pol.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
		vals = append(vals, v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolicies, err)
	}
	failed := map[uint16]error{}
	want := map[contivbpfCbPolKey]bool{}
	for i, k := range keys {
		want[k] = true
		n := min(int(vals[i].Count), MaxRules)
		if int(vals[i].Count) > MaxRules {
			failed[k.Epg] = fmt.Errorf("%s entry of %d rules, at most %d", contivbpfMapCbPolicies, vals[i].Count, MaxRules)
			continue
		}
		if err := t.install(k, vals[i].Rules[:n], vals[i].Generation); err != nil {
			failed[k.Epg] = fmt.Errorf("compile the rules of direction %d: %w", k.Dir, err)
		}
	}
	// Heads of lists that are no longer in cb_policies.
	var (
		hk    contivbpfCbPolKey
		hv    contivbpfCbPolHead
		stale []contivbpfCbPolKey
	)
	hit := t.heads.Iterate()
	for hit.Next(&hk, &hv) {
		if !want[hk] {
			stale = append(stale, hk)
		}
	}
	if err := hit.Err(); err != nil {
		return failed, fmt.Errorf("iterate %s: %w", contivbpfMapCbPolHeads, err)
	}
	var errs []error
	for _, hk := range stale {
		errs = appendErr(errs, t.remove(hk))
	}
	errs = append(errs, t.sweepOrphans()...)
	return failed, errors.Join(errs...)
}

// objsPolTables is a polTables over objs' maps that writes without a driver (tests and
// the bench fixtures, which fill maps directly).
func objsPolTables(objs *contivbpfObjects) (*polTables, error) {
	return newPolTables(objs.CbPolHeads, objs.CbPolRules, objs.CbPolCidrs, plainPut)
}

// plainPut writes one map element without a driver's accounting (tests and the bench
// fixtures); the driver's is Driver.mapPut.
func plainPut(name string, m *ebpf.Map, k, v any) error {
	if err := m.Put(k, v); err != nil {
		return fmt.Errorf("update %s: %w", name, err)
	}
	return nil
}
