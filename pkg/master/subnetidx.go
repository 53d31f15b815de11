package master

import (
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// The subnet index (model.SubnetIndexPrefix): what a new network's subnets are checked
// against, one record per tenant and one of every VLAN network, kept with the network
// states in the same transactions. Before, every create listed every network state of the
// cluster: its cost grew with the cluster, and any write to any network state (another
// tenant's endpoint taking an address) made it start over.

// subnetIndex reads the index record at key; a missing one (networks made by a build
// without the index) is built from the network states keep selects.
func subnetIndex(tx *state.Tx, key string, keep func(*model.CfgNetworkState) bool) (*model.SubnetIndex, error) {
	idx, found, err := getT[model.SubnetIndex](tx, key)
	if err != nil || found {
		if idx != nil && idx.Nets == nil {
			idx.Nets = map[string]model.SubnetRecord{}
		}
		return idx, err
	}
	return buildSubnetIndex(tx, keep)
}

// checkedSubnetIndex is subnetIndex for an overlap check: a record that disagrees with
// what current says is in use (networks created or deleted by a build without the index,
// running beside this one or before it again) is rebuilt, and written in tx so that
// indexNetwork adds to the rebuilt one.
func checkedSubnetIndex(tx *state.Tx, key string, keep func(*model.CfgNetworkState) bool,
	current func(*model.SubnetIndex) (bool, error)) (*model.SubnetIndex, error) {
	idx, found, err := getT[model.SubnetIndex](tx, key)
	if err != nil {
		return nil, err
	}
	if found {
		if idx.Nets == nil {
			idx.Nets = map[string]model.SubnetRecord{}
		}
		if ok, err := current(idx); err != nil || ok {
			return idx, err
		}
	}
	if idx, err = buildSubnetIndex(tx, keep); err != nil {
		return nil, err
	}
	return idx, tx.Put(key, idx)
}

// buildSubnetIndex builds an index record from the network states keep selects.
func buildSubnetIndex(tx *state.Tx, keep func(*model.CfgNetworkState) bool) (*model.SubnetIndex, error) {
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return nil, err
	}
	idx := &model.SubnetIndex{Nets: map[string]model.SubnetRecord{}}
	for _, ns := range nets {
		if keep(ns) {
			idx.Nets[ns.ID] = subnetRecord(ns)
		}
	}
	return idx, nil
}

func subnetRecord(ns *model.CfgNetworkState) model.SubnetRecord {
	r := model.SubnetRecord{Tenant: ns.Tenant, Encap: ns.PktTagType, SubnetIP: ns.SubnetIP, SubnetLen: ns.SubnetLen,
		IPv6Subnet: ns.IPv6Subnet, IPv6SubnetLen: ns.IPv6SubnetLen}
	if ns.PktTagType == "vlan" {
		r.PktTag = ns.PktTag
	}
	return r
}

func ofTenant(tenant string) func(*model.CfgNetworkState) bool {
	return func(ns *model.CfgNetworkState) bool { return ns.Tenant == tenant }
}

func vlanNet(ns *model.CfgNetworkState) bool { return ns.PktTagType == "vlan" }

// tenantSubnets is tenant's record of the subnet index, for an overlap check: it must
// name exactly the tenant's networks, as their model records say (every build writes
// those; a key-only listing of the tenant's range).
func tenantSubnets(tx *state.Tx, tenant string) (*model.SubnetIndex, error) {
	return checkedSubnetIndex(tx, model.SubnetIndexKey(tenant), ofTenant(tenant), func(idx *model.SubnetIndex) (bool, error) {
		prefix := model.ModelKey(model.TypeNetwork, tenant+":")
		kvs, err := tx.Keys(prefix)
		if err != nil {
			return false, err
		}
		if len(kvs) != len(idx.Nets) {
			return false, nil
		}
		for _, kv := range kvs {
			if _, in := idx.Nets[model.NetworkID(strings.TrimPrefix(kv.Key, prefix), tenant)]; !in {
				return false, nil
			}
		}
		return true, nil
	})
}

// vlanSubnets is the subnet index's record of every VLAN network, for an overlap check:
// its networks' VLANs must be exactly the VLANs in use (the auto-vlan records, which every
// build keeps; only VLAN networks take VLANs).
func vlanSubnets(tx *state.Tx) (*model.SubnetIndex, error) {
	return checkedSubnetIndex(tx, model.VLANSubnetIndexKey, vlanNet, func(idx *model.SubnetIndex) (bool, error) {
		cfg, found, err := getT[model.VlanResourceCfg](tx, model.VlanResCfgKey)
		if err != nil || !found {
			return false, err
		}
		oper, found, err := getT[model.VlanResourceOper](tx, model.VlanResOperKey)
		if err != nil || !found {
			return false, err
		}
		tags := map[int]bool{}
		for _, r := range idx.Nets {
			if r.PktTag <= 0 || tags[r.PktTag] || !cfg.VLANs.Test(uint(r.PktTag)) || oper.FreeVLANs.Test(uint(r.PktTag)) {
				return false, nil // (a record of a build that kept no tags, a stale or doubled one)
			}
			tags[r.PktTag] = true
		}
		inUse := 0
		for v := uint(1); v < cfg.VLANs.Len(); v++ {
			if cfg.VLANs.Test(v) && !oper.FreeVLANs.Test(v) {
				inUse++
			}
		}
		return inUse == len(tags), nil
	})
}

// indexNetwork adds network state ns to the subnet index (add=false: removes it). A
// missing record is built first when adding; removing from a missing one changes nothing
// (it is built, without ns, when next needed).
func indexNetwork(tx *state.Tx, ns *model.CfgNetworkState, add bool) error {
	type rec struct {
		key string
		get func() (*model.SubnetIndex, error)
	}
	recs := []rec{{model.SubnetIndexKey(ns.Tenant), func() (*model.SubnetIndex, error) {
		return subnetIndex(tx, model.SubnetIndexKey(ns.Tenant), ofTenant(ns.Tenant))
	}}}
	if ns.PktTagType == "vlan" {
		recs = append(recs, rec{model.VLANSubnetIndexKey, func() (*model.SubnetIndex, error) {
			return subnetIndex(tx, model.VLANSubnetIndexKey, vlanNet)
		}})
	}
	for _, r := range recs {
		if !add {
			idx, found, err := getT[model.SubnetIndex](tx, r.key)
			if err != nil {
				return err
			}
			if !found {
				continue
			}
			if _, ok := idx.Nets[ns.ID]; !ok {
				continue
			}
			delete(idx.Nets, ns.ID)
			if err := tx.Put(r.key, idx); err != nil {
				return err
			}
			continue
		}
		idx, err := r.get()
		if err != nil {
			return err
		}
		idx.Nets[ns.ID] = subnetRecord(ns)
		if err := tx.Put(r.key, idx); err != nil {
			return err
		}
	}
	return nil
}
