package master

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Derived link-sets (docs/api.md, "Semantics" ★). Contiv stores in a tenant the links to
// every object it owns, in a policy its rules and groups, in a group the rules that name it,
// in a network its groups and services, in a netprofile its groups, and rewrites the whole
// record on every create and delete of one of them: filling a tenant or a policy wrote
// O(n²) bytes into etcd's history (2,000 rules in one policy left 97 MB), and every create
// in a tenant conflicted with every other on the tenant record. Here those link-sets are
// stored empty and filled when an object is read (GET of one object or a collection, the
// inspect's Config, a create's or update's answer) from listings of the tenant's scoped
// prefixes, each collection read once per request. Values a record still holds (written
// by an earlier build or by Contiv) are replaced by the derived ones.

// linkSource reads, in one snapshot, the records derived link-sets are made of: keys only
// where the link's owner is in the key, values where it is in a field. Each collection is
// read once; when every object being filled is of one tenant, only that tenant's range.
type linkSource struct {
	tx     *state.Tx
	tenant string // the one tenant of the objects filled; "" several (every tenant is read)
	keys   map[string][]state.KV
	vals   map[string][]state.KV
}

func newLinkSource(tx *state.Tx, tenants []string) *linkSource {
	src := &linkSource{tx: tx, keys: map[string][]state.KV{}, vals: map[string][]state.KV{}}
	for i, t := range tenants {
		if i == 0 {
			src.tenant = t
		} else if t != src.tenant {
			src.tenant = ""
			break
		}
	}
	return src
}

// records lists the objects of objType in scope (with their values when vals).
func (s *linkSource) records(objType string, vals bool) ([]state.KV, error) {
	cache, list := s.keys, s.tx.Keys
	if vals {
		cache, list = s.vals, s.tx.List
	}
	if kvs, ok := cache[objType]; ok {
		return kvs, nil
	}
	prefix := model.ModelKey(objType, "")
	if s.tenant != "" {
		prefix = model.ModelKey(objType, model.ScopedKey(s.tenant, ""))
	}
	kvs, err := list(prefix)
	if err != nil {
		return nil, err
	}
	cache[objType] = kvs
	return kvs, nil
}

// modelKeyOf is the model key of record kv of objType.
func modelKeyOf(objType string, kv state.KV) string {
	return strings.TrimPrefix(kv.Key, model.ModelKey(objType, ""))
}

// linkGroups collects links by the key of the object whose link-set holds them.
type linkGroups map[string]map[string]linkAt

// linkAt is a link and the create revision of the object it points at.
type linkAt struct {
	model.Link
	created int64
}

func (g linkGroups) add(owner, objType, key string, created int64) {
	if g[owner] == nil {
		g[owner] = map[string]linkAt{}
	}
	g[owner][key] = linkAt{Link: model.Link{ObjType: objType, ObjKey: key}, created: created}
}

// set returns owner's links (nil for none, as a stored empty link-set reads); with since
// (a create revision), only those to objects created after it.
func (g linkGroups) set(owner string, since int64) map[string]model.Link {
	var out map[string]model.Link
	for k, l := range g[owner] {
		if since > 0 && l.created > 0 && l.created < since {
			continue
		}
		if out == nil {
			out = map[string]model.Link{}
		}
		out[k] = l.Link
	}
	return out
}

// byKeys groups the objects of objType by owner(their model key) ("" : no owner).
func (s *linkSource) byKeys(objType string, owner func(key string) string) (linkGroups, error) {
	kvs, err := s.records(objType, false)
	if err != nil {
		return nil, err
	}
	g := linkGroups{}
	for _, kv := range kvs {
		k := modelKeyOf(objType, kv)
		if o := owner(k); o != "" {
			g.add(o, objType, k, kv.CreateRev)
		}
	}
	return g, nil
}

// byValues groups the objects of objType (decoded as T) by the owners owners names.
func byValues[T any](s *linkSource, objType string, owners func(v *T) []string) (linkGroups, error) {
	kvs, err := s.records(objType, true)
	if err != nil {
		return nil, err
	}
	g := linkGroups{}
	for _, kv := range kvs {
		var v T
		if json.Unmarshal(kv.Value, &v) != nil {
			continue // (a record no one can read links nothing, as before)
		}
		k := modelKeyOf(objType, kv)
		for _, o := range owners(&v) {
			if o != "" {
				g.add(o, objType, k, kv.CreateRev)
			}
		}
	}
	return g, nil
}

// tenantLinkSets are the tenant's derived link-sets: one per type of object it owns.
var tenantLinkSets = []struct {
	objType string
	set     func(*model.TenantLinkSets) *map[string]model.Link
}{
	{model.TypeAppProfile, func(l *model.TenantLinkSets) *map[string]model.Link { return &l.AppProfiles }},
	{model.TypeEndpointGroup, func(l *model.TenantLinkSets) *map[string]model.Link { return &l.EndpointGroups }},
	{model.TypeNetprofile, func(l *model.TenantLinkSets) *map[string]model.Link { return &l.NetProfiles }},
	{model.TypeNetwork, func(l *model.TenantLinkSets) *map[string]model.Link { return &l.Networks }},
	{model.TypePolicy, func(l *model.TenantLinkSets) *map[string]model.Link { return &l.Policies }},
	{model.TypeServiceLB, func(l *model.TenantLinkSets) *map[string]model.Link { return &l.Servicelbs }},
}

// The clear* functions empty the derived link-sets of a record about to be stored; the
// derive* functions fill them for objects read (created: each object's create revision).

func clearTenantLinks(t *model.Tenant) {
	for _, ls := range tenantLinkSets {
		*ls.set(&t.LinkSets) = nil
	}
}

func deriveTenantLinks(src *linkSource, ts []*model.Tenant, _ []int64) error {
	for _, ls := range tenantLinkSets {
		g, err := src.byKeys(ls.objType, scopedTenant)
		if err != nil {
			return err
		}
		for _, t := range ts {
			*ls.set(&t.LinkSets) = g.set(t.TenantName, 0)
		}
	}
	return nil
}

func clearPolicyLinks(p *model.Policy) { p.LinkSets.Rules, p.LinkSets.EndpointGroups = nil, nil }

func derivePolicyLinks(src *linkSource, ps []*model.Policy, _ []int64) error {
	rules, err := src.byKeys(model.TypeRule, rulePolicy)
	if err != nil {
		return err
	}
	groups, err := byValues(src, model.TypeEndpointGroup, func(e *model.EndpointGroup) []string {
		out := make([]string, len(e.Policies))
		for i, p := range e.Policies {
			out[i] = model.ScopedKey(e.TenantName, p)
		}
		return out
	})
	if err != nil {
		return err
	}
	for _, p := range ps {
		k := model.ScopedKey(p.TenantName, p.PolicyName)
		p.LinkSets.Rules, p.LinkSets.EndpointGroups = rules.set(k, 0), groups.set(k, 0)
	}
	return nil
}

// rulePolicy is the policy key of rule key "<tenant>:<policy>:<ruleId>" ("" not a rule's).
func rulePolicy(key string) string {
	i := strings.LastIndexByte(key, ':')
	if i < 0 || strings.Count(key, ":") != 2 {
		return ""
	}
	return key[:i]
}

func clearEPGLinks(e *model.EndpointGroup) { e.LinkSets.MatchRules = nil }

// deriveEPGLinks fills MatchRules: the rules naming the group (their MatchEndpointGroup
// link) that were created while this group existed. A rule needs its group to exist, but
// a group may be deleted under its rules and made again; Contiv's and earlier builds'
// new group started with no MatchRules, and so does it here (the rules created before the
// group are left out by their create revision).
func deriveEPGLinks(src *linkSource, es []*model.EndpointGroup, created []int64) error {
	rules, err := byValues(src, model.TypeRule, func(r *model.Rule) []string {
		if k := r.Links.MatchEndpointGroup.ObjKey; k != "" {
			return []string{k}
		}
		if g := r.FromEndpointGroup + r.ToEndpointGroup; g != "" && r.TenantName != "" {
			return []string{model.ScopedKey(r.TenantName, g)}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, e := range es {
		e.LinkSets.MatchRules = rules.set(model.ScopedKey(e.TenantName, e.GroupName), created[i])
	}
	return nil
}

func clearNetworkLinks(n *model.Network) { n.LinkSets.EndpointGroups, n.LinkSets.Servicelbs = nil, nil }

func deriveNetworkLinks(src *linkSource, ns []*model.Network, _ []int64) error {
	groups, err := byValues(src, model.TypeEndpointGroup, func(e *model.EndpointGroup) []string {
		return []string{model.ScopedKey(e.TenantName, e.NetworkName)}
	})
	if err != nil {
		return err
	}
	svcs, err := byValues(src, model.TypeServiceLB, func(s *model.ServiceLB) []string {
		return []string{model.ScopedKey(s.TenantName, s.NetworkName)}
	})
	if err != nil {
		return err
	}
	for _, n := range ns {
		k := model.ScopedKey(n.TenantName, n.NetworkName)
		n.LinkSets.EndpointGroups, n.LinkSets.Servicelbs = groups.set(k, 0), svcs.set(k, 0)
	}
	return nil
}

func clearNetprofileLinks(p *model.Netprofile) { p.LinkSets.EndpointGroups = nil }

func deriveNetprofileLinks(src *linkSource, ps []*model.Netprofile, _ []int64) error {
	groups, err := byValues(src, model.TypeEndpointGroup, func(e *model.EndpointGroup) []string {
		if e.NetProfile == "" {
			return nil
		}
		return []string{model.ScopedKey(e.TenantName, e.NetProfile)}
	})
	if err != nil {
		return err
	}
	for _, p := range ps {
		p.LinkSets.EndpointGroups = groups.set(model.ScopedKey(p.TenantName, p.ProfileName), 0)
	}
	return nil
}

// netprofileGroups lists the endpoint groups of tenant using netprofile np (what the
// netprofile's link-set holds when read).
func netprofileGroups(tx *state.Tx, tenant, np string) ([]*model.EndpointGroup, error) {
	epgs, err := listT[model.EndpointGroup](tx, model.ModelKey(model.TypeEndpointGroup, model.ScopedKey(tenant, "")))
	if err != nil {
		return nil, err
	}
	out := epgs[:0]
	for _, e := range epgs {
		if e.NetProfile == np {
			out = append(out, e)
		}
	}
	return out, nil
}

// storedLinks are the records whose derived link-sets an earlier build (or Contiv) stored.
var storedLinks = []struct {
	objType string
	strip   func(raw []byte) (any, bool)
}{
	{model.TypeTenant, stripper(clearTenantLinks)},
	{model.TypeNetwork, stripper(clearNetworkLinks)},
	{model.TypeEndpointGroup, stripper(clearEPGLinks)},
	{model.TypePolicy, stripper(clearPolicyLinks)},
	{model.TypeNetprofile, stripper(clearNetprofileLinks)},
}

// stripper returns a function that gives record raw without its derived link-sets, and
// whether that changes it (false too for a record it cannot read: left as it is).
func stripper[T any](clear func(*T)) func(raw []byte) (any, bool) {
	return func(raw []byte) (any, bool) {
		var v T
		if json.Unmarshal(raw, &v) != nil {
			return nil, false
		}
		before, err := json.Marshal(&v)
		if err != nil {
			return nil, false
		}
		clear(&v)
		after, err := json.Marshal(&v)
		if err != nil {
			return nil, false
		}
		return &v, string(before) != string(after)
	}
}

// stripBatch bounds the records stripStoredLinks rewrites in one transaction (each read
// is a commit guard: etcd's default --max-txn-ops is 128).
const stripBatch = 50

// stripStoredLinks rewrites the records that still hold derived link-sets (written by an
// earlier build, which rewrote them on every create, or by Contiv) without them, so that
// they stop costing their bytes in every read and in their tenant's quota. Reads fill the
// link-sets in any case (links.go); this only shrinks the records, once: afterwards no
// record has any and a start reads each collection once and writes nothing.
func (m *Master) stripStoredLinks(ctx context.Context) error {
	n := 0
	for _, sl := range storedLinks {
		kvs, _, err := m.store.List(ctx, model.ModelKey(sl.objType, ""))
		if err != nil {
			return fmt.Errorf("list %s records: %w", sl.objType, err)
		}
		var keys []string
		for _, kv := range kvs {
			if _, ok := sl.strip(kv.Value); ok {
				keys = append(keys, kv.Key)
			}
		}
		for start := 0; start < len(keys); start += stripBatch {
			batch := keys[start:min(start+stripBatch, len(keys))]
			err := m.update(withoutQuota(ctx), func(tx *state.Tx) error {
				for _, k := range batch {
					raw, found, err := tx.GetRaw(k)
					if err != nil {
						return err
					}
					if !found {
						continue
					}
					if v, ok := sl.strip(raw); ok {
						if err := tx.Put(k, v); err != nil {
							return err
						}
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("strip the stored link-sets of %s records: %w", sl.objType, err)
			}
		}
		n += len(keys)
	}
	if n > 0 {
		m.log.Info("records of an earlier build stored without their derived link-sets (they are filled when read)", "records", n)
	}
	return nil
}
