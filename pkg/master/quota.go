package master

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Per-tenant quotas. Every write transaction (Master.update) ends with account: it reads
// what the transaction changes among the records a tenant owns (tenantRecord), adds the
// differences in counts and bytes to each tenant's usage record, and refuses, with nothing
// written, a change that takes a tenant past a limit. The usage record is read with a
// commit guard and every change of a tenant's records rewrites it, so two transactions
// that race for a tenant's last unit are serialised by etcd: one retries and is refused.

// DefaultQuota returns the per-tenant limits netmaster applies unless told otherwise: room
// for a 10,000-network cluster of 100 tenants (500 networks each), while one tenant's
// records stay far below etcd's 2 GiB default quota (64 MiB each). A create writes the same
// bytes whatever its tenant holds (link-sets are derived when read: links.go), so the counts
// bound what a tenant's creates cost in etcd's history linearly (docs/api.md, "Quotas").
func DefaultQuota() map[string]int64 {
	return map[string]int64{
		model.QuotaNetworks:       500,
		model.QuotaEndpointGroups: 500,
		// Endpoint group ids (1-65535) are one pool every tenant shares: 655 each leaves
		// room for 100 tenants (65,500), also when an admin raises a tenant's groups.
		model.QuotaEPGIDs:   655,
		model.QuotaPolicies: 500,
		model.QuotaRules:    1000,
		model.QuotaServices: 500,
		// The node port range (30000-32767, per protocol) is shared by every tenant: 27
		// each leaves room for 100 tenants (2,700 of 2,768 ports), whichever protocol.
		model.QuotaNodePorts:   27,
		model.QuotaAppProfiles: 100,
		model.QuotaNetprofiles: 100,
		model.QuotaEndpoints:   20000,
		model.QuotaBytes:       64 << 20,
	}
}

// counted is what one record counts for: its tenant ("" none), the kind it is one of (""
// bytes only) and its size (key and value).
type counted struct {
	tenant, kind string
	size         int64
}

// netTenantFunc returns the tenant of the network state with id netID ("" unknown).
type netTenantFunc func(netID string) (string, error)

// modelKinds are the model objects counted as a kind; the other tenant objects count bytes.
var modelKinds = map[string]string{
	model.TypeNetwork: model.QuotaNetworks, model.TypeEndpointGroup: model.QuotaEndpointGroups,
	model.TypePolicy: model.QuotaPolicies, model.TypeRule: model.QuotaRules, model.TypeAppProfile: model.QuotaAppProfiles,
	// Netprofiles link into the tenant object like the kinds above: each create rewrites
	// a link-set that grows with them, so bytes alone left their history unbounded.
	model.TypeNetprofile: model.QuotaNetprofiles,
}

// globalModelTypes are model objects of no tenant.
var globalModelTypes = map[string]bool{model.TypeGlobal: true, model.TypeBgp: true, model.TypeAciGw: true}

// countedPrefixes hold the records a tenant owns (tenantRecord). Allocation maps, pending
// addresses and Kubernetes NetworkPolicy records are not counted: the first are bounded by
// the networks' subnets, the last must never be refused (a pod would lose its isolation).
// Node port claims are, and endpoint group state records count as the ids they hold: both
// pools are shared by every tenant.
var countedPrefixes = []string{model.ModelDBPrefix, model.NetStatePrefix, model.EpStatePrefix, model.EPGStatePrefix,
	model.PolicyStatePrefix, model.RuleStatePrefix, model.SvcLBStatePrefix, model.ProviderPrefix, model.NodePortPrefix}

func isCounted(key string) bool {
	for _, p := range countedPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// tenantRecord says which tenant record key (value val) belongs to and what it counts for.
func tenantRecord(key string, val []byte, netTenant netTenantFunc) (counted, error) {
	c := counted{size: int64(len(key) + len(val))}
	var err error
	switch {
	case strings.HasPrefix(key, model.ModelDBPrefix):
		c.tenant, c.kind = modelRecord(strings.TrimPrefix(key, model.ModelDBPrefix))
	case strings.HasPrefix(key, model.NetStatePrefix):
		c.tenant = jsonField(val, func(v *struct{ Tenant string }) string { return v.Tenant })
	case strings.HasPrefix(key, model.EpStatePrefix):
		c.kind = model.QuotaEndpoints
		c.tenant, err = netTenant(jsonField(val, func(v *struct{ NetID string }) string { return v.NetID }))
	case strings.HasPrefix(key, model.EPGStatePrefix): // each holds one endpoint group id
		c.kind = model.QuotaEPGIDs
		c.tenant = jsonField(val, func(v *struct{ TenantName string }) string { return v.TenantName })
	case strings.HasPrefix(key, model.SvcLBStatePrefix):
		c.kind = model.QuotaServices
		c.tenant = jsonField(val, func(v *struct{ TenantName string }) string { return v.TenantName })
	case strings.HasPrefix(key, model.NodePortPrefix): // its value: the service id "<name>:<tenant>"
		c.kind = model.QuotaNodePorts
		var id string
		if json.Unmarshal(val, &id) == nil {
			c.tenant = tenantOfID(id)
		}
	case strings.HasPrefix(key, model.ProviderPrefix):
		c.tenant = tenantOfID(strings.TrimPrefix(key, model.ProviderPrefix))
	case strings.HasPrefix(key, model.PolicyStatePrefix): // "<tenant>:<group>:<tenant>:<policy>"
		c.tenant = scopedTenant(strings.TrimPrefix(key, model.PolicyStatePrefix))
	case strings.HasPrefix(key, model.RuleStatePrefix): // the same and ":<tenant>:<policy>:<rule>:<dir>"
		c.tenant = scopedTenant(strings.TrimPrefix(key, model.RuleStatePrefix))
	}
	if c.tenant == "" {
		c.kind = ""
	}
	return c, err
}

// scopedTenant is the tenant of a "<tenant>:..." key or id ("" without a ':').
func scopedTenant(id string) string {
	t, _, ok := strings.Cut(id, ":")
	if !ok {
		return ""
	}
	return t
}

// modelRecord is the tenant and kind of model object "<objType>/<objKey>".
func modelRecord(rest string) (tenant, kind string) {
	typ, key, _ := strings.Cut(rest, "/")
	switch {
	case typ == model.TypeTenant:
		return key, ""
	case globalModelTypes[typ]:
		return "", ""
	}
	if t := scopedTenant(key); t != "" {
		return t, modelKinds[typ]
	}
	return "", ""
}

// jsonField decodes val as T and returns what field picks ("" when val is not T's JSON).
// T is a struct of the fields needed alone (names match JSON keys case-insensitively:
// "tenant", "netID", "tenantName", "tenantname"), so labels and maps are not decoded.
func jsonField[T any](val []byte, field func(*T) string) string {
	var v T
	if json.Unmarshal(val, &v) != nil {
		return ""
	}
	return field(&v)
}

// usageDelta is what one transaction changes in each tenant's usage.
type usageDelta map[string]map[string]int64

func (d usageDelta) add(c counted, sign int64) {
	if c.tenant == "" {
		return
	}
	if d[c.tenant] == nil {
		d[c.tenant] = map[string]int64{}
	}
	if c.kind != "" {
		d[c.tenant][c.kind] += sign
	}
	d[c.tenant][model.QuotaBytes] += sign * c.size
}

// quotaExemptKey marks a context whose writes are never refused for quota (deletes and
// netmaster's own bookkeeping); they are counted all the same.
type quotaExemptKey struct{}

// withoutQuota returns ctx whose writes are not refused for quota.
func withoutQuota(ctx context.Context) context.Context {
	return context.WithValue(ctx, quotaExemptKey{}, true)
}

// quotaExempt reports whether writes of ctx are exempt from quota: an authenticated admin's
// and withoutQuota's. The anonymous caller of a netmaster without authentication
// (--insecure without tokens) may be anyone, so it is held to the quotas like every other
// caller; agents and netmaster's Kubernetes sync are too.
func quotaExempt(ctx context.Context) bool {
	if ctx.Value(quotaExemptKey{}) != nil {
		return true
	}
	id, ok := auth.FromContext(ctx)
	return ok && id.Role == auth.RoleAdmin && id.Via != "insecure"
}

// account books the changes tx holds into the usage records of the tenants they touch and
// refuses (403, nothing written) a change that takes a tenant past one of its limits.
func (m *Master) account(ctx context.Context, tx *state.Tx) error {
	delta, err := transactionDelta(tx)
	if err != nil {
		return err
	}
	tenants := make([]string, 0, len(delta))
	for t := range delta {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	for _, t := range tenants {
		if err := m.book(ctx, tx, t, delta[t]); err != nil {
			return err
		}
	}
	return nil
}

// transactionDelta is what the writes of tx change in each tenant's usage.
func transactionDelta(tx *state.Tx) (usageDelta, error) {
	changes, dels := tx.Changes()
	for _, p := range dels {
		for _, c := range countedPrefixes {
			if strings.HasPrefix(p, c) || strings.HasPrefix(c, p) {
				return nil, errf(http.StatusInternalServerError, "quota accounting: deleting prefix %s would drop counted records unseen", p)
			}
		}
	}
	var keys []string
	for _, c := range changes {
		if isCounted(c.Key) {
			keys = append(keys, c.Key)
		}
	}
	delta := usageDelta{}
	if len(keys) == 0 {
		return delta, nil
	}
	before, err := tx.Before(keys)
	if err != nil {
		return nil, err
	}
	nets := netTenants(tx)
	for _, c := range changes {
		if !isCounted(c.Key) {
			continue
		}
		if old, ok := before[c.Key]; ok {
			r, err := tenantRecord(c.Key, old, nets)
			if err != nil {
				return nil, err
			}
			delta.add(r, -1)
		}
		if !c.Deleted {
			r, err := tenantRecord(c.Key, c.Value, nets)
			if err != nil {
				return nil, err
			}
			delta.add(r, 1)
		}
	}
	return delta, nil
}

// netTenants resolves network ids to tenants as tx sees them (its own writes included),
// else as they were in its snapshot (a network deleted by the transaction), caching.
func netTenants(tx *state.Tx) netTenantFunc {
	seen := map[string]string{}
	return func(netID string) (string, error) {
		if netID == "" {
			return "", nil
		}
		if t, ok := seen[netID]; ok {
			return t, nil
		}
		key := model.NetStateKey(netID)
		val, found, err := tx.GetRaw(key)
		if err != nil {
			return "", err
		}
		if !found {
			old, err := tx.Before([]string{key})
			if err != nil {
				return "", err
			}
			val = old[key]
		}
		seen[netID] = jsonField(val, func(v *struct{ Tenant string }) string { return v.Tenant })
		return seen[netID], nil
	}
}

// book adds d to tenant's usage record (recounting it when the record is missing), checks
// the limits and writes the record back; a record that falls to zero (nothing of the
// tenant is left) is deleted.
func (m *Master) book(ctx context.Context, tx *state.Tx, tenant string, d map[string]int64) error {
	if allZero(d) {
		return nil
	}
	u, found, err := getT[model.TenantUsage](tx, model.QuotaUsageKey(tenant))
	if err != nil {
		return err
	}
	if found && u.Version == model.UsageVersion {
		u.Usage = addUsage(u.Usage, d)
	} else if u, err = recountTenant(tx, tenant); err != nil {
		return err
	}
	if err := m.checkQuota(ctx, tx, tenant, u.Usage, d); err != nil {
		return err
	}
	return putUsage(tx, u)
}

// putUsage writes tenant's usage record, its kinds at zero left out (the record is
// rewritten by every change of the tenant's records: the fewer bytes the better).
func putUsage(tx *state.Tx, u *model.TenantUsage) error {
	if allZero(u.Usage) {
		tx.Delete(model.QuotaUsageKey(u.Tenant))
		return nil
	}
	rec := model.TenantUsage{Tenant: u.Tenant, Usage: map[string]int64{}, Version: model.UsageVersion}
	for k, v := range u.Usage {
		if v != 0 {
			rec.Usage[k] = v
		}
	}
	return tx.Put(model.QuotaUsageKey(u.Tenant), rec)
}

func anyPositive(m map[string]int64) bool {
	for _, v := range m {
		if v > 0 {
			return true
		}
	}
	return false
}

func allZero(m map[string]int64) bool {
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

// addUsage returns u + d over every kind (counts never below zero).
func addUsage(u, d map[string]int64) map[string]int64 {
	out := zeroUsage()
	for _, k := range model.QuotaKinds() {
		out[k] = max(u[k]+d[k], 0)
	}
	return out
}

func zeroUsage() map[string]int64 {
	out := map[string]int64{}
	for _, k := range model.QuotaKinds() {
		out[k] = 0
	}
	return out
}

// checkQuota refuses a change d that raises a kind of tenant's usage (now u) past its limit,
// unless ctx is exempt (quotaExempt). Changes that lower usage, or keep it, always pass.
func (m *Master) checkQuota(ctx context.Context, tx *state.Tx, tenant string, u, d map[string]int64) error {
	if quotaExempt(ctx) || !anyPositive(d) {
		return nil
	}
	limits, _, err := m.limitsOf(tx, tenant)
	if err != nil {
		return err
	}
	for _, k := range model.QuotaKinds() {
		limit, ok := limits[k]
		if !ok || d[k] <= 0 || u[k] <= limit {
			continue
		}
		m.refused.WithLabelValues(tenant, k).Inc()
		return errf(http.StatusForbidden, "tenant %q: %s quota exceeded: limit %d, %d in use, this change adds %d (delete some, or ask an admin to raise the limit)",
			tenant, k, limit, u[k]-d[k], d[k])
	}
	return nil
}

// limitsOf returns the limits in force for tenant (an admin's, else the defaults) and the
// admin's alone.
func (m *Master) limitsOf(tx *state.Tx, tenant string) (limits, overrides map[string]int64, err error) {
	o, found, err := getT[model.TenantQuotaLimits](tx, model.QuotaLimitsKey(tenant))
	if err != nil {
		return nil, nil, err
	}
	limits = map[string]int64{}
	for k, v := range m.cfg.Quota {
		limits[k] = v
	}
	if found {
		overrides = o.Limits
		for k, v := range o.Limits {
			limits[k] = v
		}
	}
	return limits, overrides, nil
}
