package master

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Per-tenant tag ranges (issue 34): an admin gives a tenant the VLAN and VXLAN ids its
// networks draw from (quota fields "vlans", "vxlans"). Explicit tags leaked other tenants'
// networks before: a taken tag answered 409, and the next automatic tag counted everyone's
// networks. Now a tenant-admin's explicit tag must lie in its tenant's range (403
// otherwise, taken or not; without a range it may not choose one), so it can only collide
// with its own; a tenant with a range draws automatic tags from it; nobody else's network
// takes a tag in a tenant's range (others' automatic tags skip every range, an admin's or
// agent's explicit one there is 409); and two tenants' ranges never overlap.

// span is an inclusive range of tags.
type span struct{ lo, hi int }

func (s span) has(v int) bool       { return s.lo <= v && v <= s.hi }
func (s span) String() string       { return fmtRange(s.lo, s.hi) }
func (s span) overlaps(o span) bool { return s.lo <= o.hi && o.lo <= s.hi }

// tagKind names the range field and the tag of an encap ("vlan" or "vxlan").
func tagKind(encap string) (field, tag string) {
	if encap == "vlan" {
		return model.QuotaVLANs, "VLAN"
	}
	return model.QuotaVXLANs, "VXLAN"
}

// rangeOf returns the range field of r ("" none: ok false).
func rangeOf(r model.TagRanges, field string) (span, bool) {
	s := r.VLANs
	if field == model.QuotaVXLANs {
		s = r.VXLANs
	}
	if s == "" {
		return span{}, false
	}
	lo, hi, err := parseRange(field, s)
	return span{lo, hi}, err == nil
}

// checkTagRange refuses (400) a range field that is not "lo-hi" within the ids of its kind,
// and returns it as netmaster writes it ("0100-0199": "100-199").
func checkTagRange(field, s string) (string, error) {
	re, max := reVlanRange, 4094
	if field == model.QuotaVXLANs {
		re, max = reVxlanRng, maxVNI
	}
	if err := checkRegex(field, s, re, "a range like 100-199", 0); err != nil {
		return "", err
	}
	lo, hi, err := parseRange(field, s)
	if err != nil {
		return "", err
	}
	if lo < 1 || hi > max {
		return "", badReq("%s: %q must lie within 1-%d", field, s, max)
	}
	return fmtRange(lo, hi), nil
}

// tenantTagRanges reads every tenant's tag ranges (records that do not decode are left
// out: they hold no range), listed with a guard: a range set concurrently makes a network
// create run again.
func tenantTagRanges(tx *state.Tx) (map[string]model.TagRanges, error) {
	kvs, err := tx.List(model.QuotaLimitsPrefix)
	if err != nil {
		return nil, err
	}
	out := map[string]model.TagRanges{}
	for _, kv := range kvs {
		var l model.TenantQuotaLimits
		if json.Unmarshal(kv.Value, &l) == nil && l.TagRanges != (model.TagRanges{}) {
			out[strings.TrimPrefix(kv.Key, model.QuotaLimitsPrefix)] = l.TagRanges
		}
	}
	return out, nil
}

// tagScope is where a tenant's automatic tags of one kind come from: its range, else
// anywhere but the other tenants' ranges.
type tagScope struct {
	tenant, field string
	own           *span
	others        []span
}

// scopeOf is tenant's tagScope for encap.
func scopeOf(tx *state.Tx, tenant, encap string) (tagScope, error) {
	field, _ := tagKind(encap)
	sc := tagScope{tenant: tenant, field: field}
	all, err := tenantTagRanges(tx)
	if err != nil {
		return sc, err
	}
	for t, r := range all {
		s, ok := rangeOf(r, field)
		switch {
		case !ok:
		case t == tenant:
			sc.own = &s
		default:
			sc.others = append(sc.others, s)
		}
	}
	sort.Slice(sc.others, func(i, j int) bool { return sc.others[i].lo < sc.others[j].lo })
	return sc, nil
}

// next returns the lowest tag ≥ from that free (its free list, tag v at bit v-base) holds
// and the scope allows.
func (sc tagScope) next(free model.Bitset, base, from int) (int, bool) {
	if sc.own != nil {
		from = max(from, sc.own.lo)
	}
	for {
		b, ok := free.NextSet(uint(max(from-base, 0)))
		v := int(b) + base
		if !ok || (sc.own != nil && v > sc.own.hi) {
			return 0, false
		}
		i := sort.Search(len(sc.others), func(i int) bool { return sc.others[i].hi >= v })
		if i == len(sc.others) || !sc.others[i].has(v) {
			return v, true
		}
		from = sc.others[i].hi + 1
	}
}

// exhausted is the 409 for a scope without a free tag.
func (sc tagScope) exhausted(tag string) error {
	if sc.own != nil {
		return conflict("pktTag: no free %s left in tenant %q's %s range %s", tag, sc.tenant, sc.field, sc.own)
	}
	return conflict("pktTag: no free %s left in the global %s range (outside the tenants' ranges)", tag, strings.ToLower(tag))
}

// checkTagChoice decides whether the caller (ctx) may create network n with its explicit
// tag: a tenant-admin only inside its tenant's range (403 otherwise, whether the tag is
// taken or not: the answer tells nothing of other tenants), anyone else (admins, agents)
// anywhere but inside another tenant's range (409: they read every tenant's quota).
func checkTagChoice(ctx context.Context, tx *state.Tx, n, old *model.Network) error {
	if n == nil || old != nil || n.PktTag == 0 {
		return nil
	}
	field, tag := tagKind(n.Encap)
	all, err := tenantTagRanges(tx)
	if err != nil {
		return err
	}
	own, ok := rangeOf(all[n.TenantName], field)
	if _, scoped := auth.TenantScope(ctx); scoped {
		if !ok {
			return errf(http.StatusForbidden, "pktTag: choosing a %s needs a %s range for tenant %q (set by an admin: netctl tenant quota --%s) or an admin; leave pktTag 0 for one to be allocated",
				tag, field, n.TenantName, field)
		}
		if !own.has(n.PktTag) {
			return errf(http.StatusForbidden, "pktTag: %s %d is outside tenant %q's %s range %s", tag, n.PktTag, n.TenantName, field, own)
		}
		return nil
	}
	for _, t := range slices.Sorted(maps.Keys(all)) {
		if s, ok := rangeOf(all[t], field); ok && t != n.TenantName && s.has(n.PktTag) {
			return conflict("pktTag: %s %d lies in tenant %q's %s range %s", tag, n.PktTag, t, field, s)
		}
	}
	return nil
}

// checkTenantRanges refuses (409) tenant's ranges r when one overlaps another tenant's,
// leaves the global range, or holds a tag another tenant's network has.
func checkTenantRanges(tx *state.Tx, tenant string, r model.TagRanges) error {
	if r == (model.TagRanges{}) {
		return nil
	}
	all, err := tenantTagRanges(tx)
	if err != nil {
		return err
	}
	var g model.GStateCfg
	if _, err := tx.Get(model.GStateCfgKey, &g); err != nil {
		return err
	}
	used, err := collectUsedTags(tx)
	if err != nil {
		return err
	}
	for _, k := range []struct {
		field, tag, global string
		inUse              map[int]string
	}{{model.QuotaVLANs, "VLAN", g.Auto.VLANs, used.vlans}, {model.QuotaVXLANs, "VXLAN", g.Auto.VXLANs, used.vnis}} {
		s, ok := rangeOf(r, k.field)
		if !ok {
			continue
		}
		if lo, hi, err := parseRange(k.field, k.global); err == nil && (s.lo < lo || s.hi > hi) {
			return conflict("%s: range %s is not inside the global %s range %s", k.field, s, k.field, k.global)
		}
		for _, t := range slices.Sorted(maps.Keys(all)) {
			if o, ok := rangeOf(all[t], k.field); ok && t != tenant && o.overlaps(s) {
				return conflict("%s: range %s overlaps tenant %q's %s range %s", k.field, s, t, k.field, o)
			}
		}
		for _, v := range slices.Sorted(maps.Keys(k.inUse)) { // (one answer for one state)
			if id := k.inUse[v]; s.has(v) && used.tenants[id] != tenant {
				return conflict("%s: range %s holds %s %d of network %s of tenant %q", k.field, s, k.tag, v, id, used.tenants[id])
			}
		}
	}
	return nil
}

// checkGlobalHoldsRanges refuses (409) global tag ranges that would leave part of a
// tenant's range outside them: its automatic tags would stop short and every later change
// of its quota would be refused (checkTenantRanges) until an admin moved the range.
func checkGlobalHoldsRanges(tx *state.Tx, vlans, vxlans span) error {
	all, err := tenantTagRanges(tx)
	if err != nil {
		return err
	}
	for _, t := range slices.Sorted(maps.Keys(all)) {
		for _, k := range []struct {
			field  string
			global span
		}{{model.QuotaVLANs, vlans}, {model.QuotaVXLANs, vxlans}} {
			if s, ok := rangeOf(all[t], k.field); ok && (s.lo < k.global.lo || s.hi > k.global.hi) {
				return conflict("%s: range %s leaves out tenant %q's %s range %s (change it first: netctl tenant quota %s --%s)",
					k.field, k.global, t, k.field, s, t, k.field)
			}
		}
	}
	return nil
}
