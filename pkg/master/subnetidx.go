package master

import (
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
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return nil, err
	}
	idx = &model.SubnetIndex{Nets: map[string]model.SubnetRecord{}}
	for _, ns := range nets {
		if keep(ns) {
			idx.Nets[ns.ID] = subnetRecord(ns)
		}
	}
	return idx, nil
}

func subnetRecord(ns *model.CfgNetworkState) model.SubnetRecord {
	return model.SubnetRecord{Tenant: ns.Tenant, Encap: ns.PktTagType, SubnetIP: ns.SubnetIP, SubnetLen: ns.SubnetLen,
		IPv6Subnet: ns.IPv6Subnet, IPv6SubnetLen: ns.IPv6SubnetLen}
}

// tenantSubnets is tenant's record of the subnet index.
func tenantSubnets(tx *state.Tx, tenant string) (*model.SubnetIndex, error) {
	return subnetIndex(tx, model.SubnetIndexKey(tenant), func(ns *model.CfgNetworkState) bool { return ns.Tenant == tenant })
}

// vlanSubnets is the subnet index's record of every VLAN network.
func vlanSubnets(tx *state.Tx) (*model.SubnetIndex, error) {
	return subnetIndex(tx, model.VLANSubnetIndexKey, func(ns *model.CfgNetworkState) bool { return ns.PktTagType == "vlan" })
}

// indexNetwork adds network state ns to the subnet index (add=false: removes it). A
// missing record is built first when adding; removing from a missing one changes nothing
// (it is built, without ns, when next needed).
func indexNetwork(tx *state.Tx, ns *model.CfgNetworkState, add bool) error {
	type rec struct {
		key string
		get func() (*model.SubnetIndex, error)
	}
	recs := []rec{{model.SubnetIndexKey(ns.Tenant), func() (*model.SubnetIndex, error) { return tenantSubnets(tx, ns.Tenant) }}}
	if ns.PktTagType == "vlan" {
		recs = append(recs, rec{model.VLANSubnetIndexKey, func() (*model.SubnetIndex, error) { return vlanSubnets(tx) }})
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
