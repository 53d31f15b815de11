package master

import (
	"context"
	"fmt"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// scopedModelTypes are the model objects keyed "<tenant>:<name>" netmaster serves.
var scopedModelTypes = []string{model.TypeNetwork, model.TypeEndpointGroup, model.TypePolicy, model.TypeRule,
	model.TypeAppProfile, model.TypeServiceLB, model.TypeNetprofile, model.TypeExtContractsGroup}

// recountTenant counts tenant's records as tx sees them (its own writes included): what
// its usage record holds when every change was booked. Its listings span every tenant's
// records and put no commit guards (Tx.ListUnguarded): any write anywhere under them would
// make the transaction start over, and under endpoint churn through another netmaster it
// never committed. A caller that writes the result must have read the tenant's usage record
// in tx (a guard): every change of the tenant's records rewrites that record.
func recountTenant(tx *state.Tx, tenant string) (*model.TenantUsage, error) {
	kvs, nets, err := tenantRecordKVs(tx, tenant)
	if err != nil {
		return nil, fmt.Errorf("recount the usage of tenant %q: %w", tenant, err)
	}
	byNet := func(netID string) (string, error) { return nets[netID], nil }
	u := &model.TenantUsage{Tenant: tenant, Usage: zeroUsage()}
	for _, kv := range kvs {
		c, err := tenantRecord(kv.Key, kv.Value, byNet)
		if err != nil {
			return nil, err
		}
		if c.tenant != tenant {
			continue
		}
		if c.kind != "" {
			u.Usage[c.kind]++
		}
		u.Usage[model.QuotaBytes] += c.size
	}
	return u, nil
}

// tenantRecordKVs lists the records that may be tenant's (a superset: the caller keeps those
// tenantRecord gives to tenant) and every network's tenant by id.
func tenantRecordKVs(tx *state.Tx, tenant string) ([]state.KV, map[string]string, error) {
	var out []state.KV
	add := func(prefix string) error {
		kvs, err := tx.ListUnguarded(prefix)
		out = append(out, kvs...)
		return err
	}
	for _, typ := range scopedModelTypes {
		if err := add(model.ModelKey(typ, model.ScopedKey(tenant, ""))); err != nil {
			return nil, nil, err
		}
	}
	tkey := model.ModelKey(model.TypeTenant, tenant)
	if v, found, err := tx.GetRaw(tkey); err != nil {
		return nil, nil, err
	} else if found {
		out = append(out, state.KV{Key: tkey, Value: v})
	}
	for _, p := range []string{model.EPGStatePrefix, model.SvcLBStatePrefix, model.ProviderPrefix, model.NodePortPrefix,
		model.PolicyStatePrefix + tenant + ":", model.RuleStatePrefix + tenant + ":"} {
		if err := add(p); err != nil {
			return nil, nil, err
		}
	}
	netKVs, err := tx.ListUnguarded(model.NetStatePrefix)
	if err != nil {
		return nil, nil, err
	}
	out = append(out, netKVs...)
	nets := map[string]string{}
	var mine []*model.CfgNetworkState
	for _, kv := range netKVs {
		var ns model.CfgNetworkState
		if kv.Decode(&ns) != nil {
			continue
		}
		nets[ns.ID] = ns.Tenant
		if ns.Tenant == tenant {
			mine = append(mine, &ns)
		}
	}
	eps, err := endpointKVs(tx, mine)
	return append(out, eps...), nets, err
}

// endpointKVs lists the endpoint records of nets: one key range per network
// ("<net>.<tenant>-<container>"), or every endpoint record when a network counts more
// endpoints than its range holds (host endpoints are keyed "<host>-native-intf").
func endpointKVs(tx *state.Tx, nets []*model.CfgNetworkState) ([]state.KV, error) {
	var out []state.KV
	for _, ns := range nets {
		kvs, err := tx.ListUnguarded(model.EpStatePrefix + ns.ID + "-")
		if err != nil {
			return nil, err
		}
		in := 0
		for _, kv := range kvs {
			if jsonField(kv.Value, func(v *model.CfgEndpointState) string { return v.NetID }) == ns.ID {
				in++
			}
		}
		if in < ns.EpCount {
			return tx.ListUnguarded(model.EpStatePrefix)
		}
		out = append(out, kvs...)
	}
	return out, nil
}

// reconcileUsage writes the usage record of every tenant that has none (a netmaster
// upgraded to quotas, a record lost) or one of an older model.UsageVersion (counted before
// a kind was), one transaction per tenant.
func (m *Master) reconcileUsage(ctx context.Context) error {
	tenants, _, err := m.store.List(ctx, model.ModelKey(model.TypeTenant, ""))
	if err != nil {
		return fmt.Errorf("list tenants: %w", err)
	}
	for _, kv := range tenants {
		tenant := kv.Key[len(model.ModelKey(model.TypeTenant, "")):]
		err := m.update(withoutQuota(ctx), func(tx *state.Tx) error {
			old, found, err := getT[model.TenantUsage](tx, model.QuotaUsageKey(tenant))
			if err != nil || (found && old.Version == model.UsageVersion) {
				return err
			}
			u, err := recountTenant(tx, tenant)
			if err != nil {
				return err
			}
			m.log.Info("quota: recounted the usage of a tenant without a current usage record", "tenant", tenant, "usage", u.Usage)
			return putUsage(tx, u)
		})
		if err != nil {
			return fmt.Errorf("recount the usage of tenant %q: %w", tenant, err)
		}
	}
	return nil
}
