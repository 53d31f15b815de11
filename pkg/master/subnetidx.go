package master

import (
	"maps"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// The subnet index (model.SubnetIndexPrefix): what a new network's subnets are checked
// against, a record per network under its tenant's prefix and, for a VLAN network, one
// under the VLAN prefix, written and deleted with the network state in the same
// transaction. A create reads its tenant's records (and in routing mode a VLAN network
// every VLAN network's) and writes its own: its bytes do not grow with the tenant or the
// cluster. Before, every create listed every network state of the cluster: its cost grew
// with the cluster, and any write to any network state (another tenant's endpoint taking
// an address) made it start over.
//
// A create reads its records without a commit guard on each (a guard per record listed
// gave a tenant's 50th create 105 etcd compares, which etcd evaluates key by key: CPU per
// create grew with the tenant, issue 34's cp.create_10k_networks_s) and guards instead
// one record, model.SubnetIndexGuardKey, that every change to the records rewrites
// (indexNetwork, and the repairs here): two creates that race in one tenant conflict on
// it, and the later runs again on the records the earlier wrote. A network a build
// without the index creates meanwhile is not seen by the racing create (it does not
// rewrite the guard): it is by the next, whose check finds it missing from the records.

// subnetRecords reads the index's records under prefix, by network id, for an overlap
// check, guarded by the record at guard (not each record). When they disagree with what
// current says is in use (no records yet, or networks created or deleted by a build
// without the index, running beside this one or before it again), what the network
// states keep selects is returned instead, and up to subnetRepairBatch records are
// repaired in tx (the first layout's record legacy goes; guard is rewritten, Partial
// while records are left to repair). current gets each record's etcd ModRevision too (0:
// written by tx) and the guard record (Value nil: none), and may drop from the records
// those it finds stale, which the repair then writes again.
func subnetRecords(tx *state.Tx, prefix, guard, legacy string, keep func(*model.CfgNetworkState) bool,
	current func(recs map[string]model.SubnetRecord, modRevs map[string]int64, guard state.KV) (bool, error)) (map[string]model.SubnetRecord, error) {
	guardKV, _, err := tx.GetKV(guard)
	if err != nil {
		return nil, err
	}
	kvs, err := tx.ListUnguarded(prefix)
	if err != nil {
		return nil, err
	}
	recs := make(map[string]model.SubnetRecord, len(kvs))
	modRevs := make(map[string]int64, len(kvs))
	for _, kv := range kvs {
		var r model.SubnetRecord
		if err := kv.Decode(&r); err != nil {
			return nil, err
		}
		id := strings.TrimPrefix(kv.Key, prefix)
		recs[id], modRevs[id] = r, kv.ModRev
	}
	if ok, err := current(recs, modRevs, guardKV); err != nil || ok {
		return recs, err
	}
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return nil, err
	}
	built := map[string]model.SubnetRecord{}
	for _, ns := range nets {
		if keep(ns) {
			built[ns.ID] = subnetRecord(ns)
		}
	}
	// The check uses what was just built; the records are repaired a batch per
	// transaction (an external etcd takes 128 operations per transaction by default), so
	// a tenant of many networks converges over its next creates, each checked right.
	var gone, stale []string
	for _, id := range slices.Sorted(maps.Keys(recs)) {
		if _, ok := built[id]; !ok {
			gone = append(gone, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(built)) {
		if r, ok := recs[id]; !ok || r != built[id] {
			stale = append(stale, id)
		}
	}
	tx.Delete(legacy)
	if err := tx.Put(guard, model.SubnetIndexGuard{Partial: len(gone)+len(stale) > subnetRepairBatch}); err != nil {
		return nil, err
	}
	for i, id := range append(gone, stale...) {
		if i == subnetRepairBatch {
			break
		}
		if i < len(gone) {
			tx.Delete(prefix + id)
		} else if err := tx.Put(prefix+id, built[id]); err != nil {
			return nil, err
		}
	}
	return built, nil
}

// subnetRepairBatch is how many index records one transaction repairs at most.
const subnetRepairBatch = 50

func subnetRecord(ns *model.CfgNetworkState) model.SubnetRecord {
	r := model.SubnetRecord{Tenant: ns.Tenant, Encap: ns.PktTagType, SubnetIP: ns.SubnetIP, SubnetLen: ns.SubnetLen,
		IPv6Subnet: ns.IPv6Subnet, IPv6SubnetLen: ns.IPv6SubnetLen}
	if ns.PktTagType == "vlan" {
		r.PktTag = ns.PktTag
	}
	return r
}

// tenantSubnets is tenant's records of the subnet index, by network id, for an overlap
// check: they must name exactly the tenant's networks, as their model records say (every
// build writes those; a key-only listing of the tenant's range, guarded as the records are),
// and each be no older than its network's model record: a build without the index that
// deleted a network and created it again (on another subnet, say) left the record of the
// first (its ModRevision below the model record's CreateRevision; a build with the index
// writes both in one transaction, and a repair after).
func tenantSubnets(tx *state.Tx, tenant string) (map[string]model.SubnetRecord, error) {
	return subnetRecords(tx, model.SubnetIndexTenantPrefix(tenant), model.SubnetIndexGuardKey(tenant), model.LegacySubnetIndexKeys(tenant)[0],
		func(ns *model.CfgNetworkState) bool { return ns.Tenant == tenant },
		func(recs map[string]model.SubnetRecord, modRevs map[string]int64, _ state.KV) (bool, error) {
			prefix := model.ModelKey(model.TypeNetwork, tenant+":")
			kvs, err := tx.KeysUnguarded(prefix)
			if err != nil || len(kvs) != len(recs) {
				return false, err
			}
			ok := true
			for _, kv := range kvs {
				id := model.NetworkID(strings.TrimPrefix(kv.Key, prefix), tenant)
				if _, in := recs[id]; !in {
					return false, nil
				}
				if r := modRevs[id]; r != 0 && r < kv.CreateRev {
					delete(recs, id) // (stale: written again by the repair)
					ok = false
				}
			}
			return ok, nil
		})
}

// vlanSubnets is the subnet index's records of every VLAN network, for an overlap check:
// their VLANs must be exactly the VLANs in use (the auto-vlan records, which every build
// keeps; only VLAN networks take VLANs), and no VLAN may have been taken or given back
// since the records were last whole (their guard record at least as new as the VLANs'
// oper record, which every build rewrites with each VLAN network it creates or deletes,
// and a build with the index rewrites the guard with it): a build without the index that
// deleted a VLAN network and created one on the same VLAN and another subnet leaves the
// VLANs in use as they were, and the record of the first.
func vlanSubnets(tx *state.Tx) (map[string]model.SubnetRecord, error) {
	return subnetRecords(tx, model.SubnetIndexVLANPrefix, model.SubnetIndexVLANGuardKey, model.LegacySubnetIndexKeys("")[1], func(ns *model.CfgNetworkState) bool { return ns.PktTagType == "vlan" },
		func(recs map[string]model.SubnetRecord, _ map[string]int64, guard state.KV) (bool, error) {
			var g model.SubnetIndexGuard
			if guard.Value == nil || guard.Decode(&g) != nil || g.Partial {
				return false, nil // (never whole, unreadable or a repair left to finish: rebuilt)
			}
			cfg, found, err := getT[model.VlanResourceCfg](tx, model.VlanResCfgKey)
			if err != nil || !found {
				return false, err
			}
			operKV, found, err := tx.GetKV(model.VlanResOperKey)
			if err != nil || !found {
				return false, err
			}
			if guard.ModRev != 0 && guard.ModRev < operKV.ModRev {
				return false, nil
			}
			var oper model.VlanResourceOper
			if err := operKV.Decode(&oper); err != nil {
				return false, err
			}
			tags := map[int]bool{}
			for _, r := range recs {
				if r.PktTag <= 0 || tags[r.PktTag] || !cfg.VLANs.Test(uint(r.PktTag)) || oper.FreeVLANs.Test(uint(r.PktTag)) {
					return false, nil // (a stale or doubled record)
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

// indexNetwork writes network state ns's records of the subnet index (add=false: deletes
// them) and rewrites their guards (a repair left to finish stays marked): one key each,
// whatever else the index holds.
func indexNetwork(tx *state.Tx, ns *model.CfgNetworkState, add bool) error {
	type rec struct{ key, guard string }
	recs := []rec{{model.SubnetIndexTenantPrefix(ns.Tenant) + ns.ID, model.SubnetIndexGuardKey(ns.Tenant)}}
	if ns.PktTagType == "vlan" {
		recs = append(recs, rec{model.SubnetIndexVLANPrefix + ns.ID, model.SubnetIndexVLANGuardKey})
	}
	for _, r := range recs {
		g := model.SubnetIndexGuard{}
		if r.guard == model.SubnetIndexVLANGuardKey { // (only vlanSubnets reads the mark)
			kv, found, err := tx.GetKV(r.guard)
			if err != nil {
				return err
			}
			if found && kv.Decode(&g) != nil {
				g.Partial = true // (unreadable: the next check rebuilds)
			}
		}
		if err := tx.Put(r.guard, model.SubnetIndexGuard{Network: ns.ID, Partial: g.Partial}); err != nil {
			return err
		}
		if !add {
			tx.Delete(r.key)
			continue
		}
		if err := tx.Put(r.key, subnetRecord(ns)); err != nil {
			return err
		}
	}
	return nil
}
