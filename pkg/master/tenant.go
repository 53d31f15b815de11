package master

import (
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func tenantOps() objOps[model.Tenant] {
	return objOps[model.Tenant]{
		coll: model.CollTenants, objType: model.TypeTenant,
		key:    func(t *model.Tenant) string { return t.TenantName },
		setKey: func(t *model.Tenant, k string) { t.Key = k },
		validate: func(t *model.Tenant) error {
			if err := checkName("tenantName", t.TenantName, 64); err != nil {
				return err
			}
			return checkOptName("defaultNetwork", t.DefaultNetwork, 64)
		},
		save: func(m *Master, tx *state.Tx, t, old *model.Tenant) error {
			if old != nil {
				return conflict("tenant %q already exists: tenants can't be updated", t.TenantName)
			}
			t.LinkSets = model.TenantLinkSets{} // (derived when read: links.go)
			return tx.Put(model.ModelKey(model.TypeTenant, t.Key), t)
		},
		remove: func(m *Master, tx *state.Tx, t *model.Tenant) error {
			for _, typ := range []string{model.TypeNetwork, model.TypeEndpointGroup, model.TypePolicy,
				model.TypeAppProfile, model.TypeNetprofile, model.TypeServiceLB, model.TypeExtContractsGroup} {
				kvs, err := tx.Keys(model.ModelKey(typ, t.TenantName+":"))
				if err != nil {
					return err
				}
				if len(kvs) > 0 {
					return conflict("tenant %q still has %d %s object(s)", t.TenantName, len(kvs), typ)
				}
			}
			tx.Delete(model.ModelKey(model.TypeTenant, t.Key))
			tx.Delete(model.LegacySubnetIndexKeys(t.TenantName)[0])      // (the first layout's record)
			tx.DeletePrefix(model.SubnetIndexTenantPrefix(t.TenantName)) // (records an older build left)
			tx.Delete(model.SubnetIndexGuardKey(t.TenantName))
			tx.Delete(model.QuotaLimitsKey(t.Key)) // (its usage record goes when nothing of it is left)
			return nil
		},
		inspect: inspectTenant,
		links:   deriveTenantLinks,
	}
}

func requireTenant(tx *state.Tx, tenant string) error {
	ok, err := tx.Get(model.ModelKey(model.TypeTenant, tenant), &model.Tenant{})
	if err != nil {
		return err
	}
	if !ok {
		return unproc("tenantName: tenant %q does not exist", tenant)
	}
	return nil
}

func inspectTenant(m *Master, tx *state.Tx, t *model.Tenant) (any, error) {
	oper := model.TenantOper{}
	count := func(typ string) (int, error) {
		kvs, err := tx.Keys(model.ModelKey(typ, t.TenantName+":"))
		return len(kvs), err
	}
	var err error
	if oper.TotalAppProfiles, err = count(model.TypeAppProfile); err != nil {
		return nil, err
	}
	if oper.TotalEPGs, err = count(model.TypeEndpointGroup); err != nil {
		return nil, err
	}
	if oper.TotalNetprofiles, err = count(model.TypeNetprofile); err != nil {
		return nil, err
	}
	if oper.TotalPolicies, err = count(model.TypePolicy); err != nil {
		return nil, err
	}
	if oper.TotalServicelbs, err = count(model.TypeServiceLB); err != nil {
		return nil, err
	}
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return nil, err
	}
	eps, err := tenantEndpoints(tx, t.TenantName)
	if err != nil {
		return nil, err
	}
	for _, n := range nets {
		if n.Tenant != t.TenantName {
			continue
		}
		oper.TotalNetworks++
		no, err := networkOper(tx, n, eps)
		if err != nil {
			return nil, err
		}
		oper.Networks = append(oper.Networks, no)
		oper.Endpoints = append(oper.Endpoints, no.Endpoints...)
	}
	oper.TotalEndpoints = len(oper.Endpoints)
	return model.TenantInspect{Config: *t, Oper: oper}, nil
}
