package master

import (
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

const maxEPGID = 65535

func validateEPG(e *model.EndpointGroup) error {
	for _, f := range []struct{ name, v string }{{"tenantName", e.TenantName}, {"groupName", e.GroupName}, {"networkName", e.NetworkName}} {
		if err := checkName(f.name, f.v, 64); err != nil {
			return err
		}
	}
	if e.IpPool != "" {
		if err := checkRegex("ipPool", e.IpPool, reIPPool, "an IPv4 range like 10.1.1.10-10.1.1.20", 0); err != nil {
			return err
		}
	}
	if err := checkNames("policies", e.Policies, 64); err != nil {
		return err
	}
	if err := checkNames("extContractsGrps", e.ExtContractsGrps, 64); err != nil {
		return err
	}
	if e.NetProfile != "" {
		if err := checkName("netProfile", e.NetProfile, 64); err != nil {
			return err
		}
	}
	return checkOptName("cfgdTag", e.CfgdTag, 128)
}

func epgOps() objOps[model.EndpointGroup] {
	return objOps[model.EndpointGroup]{
		coll: model.CollEndpointGroups, objType: model.TypeEndpointGroup,
		key:      func(e *model.EndpointGroup) string { return model.ScopedKey(e.TenantName, e.GroupName) },
		setKey:   func(e *model.EndpointGroup, k string) { e.Key = k },
		validate: validateEPG,
		save:     saveEPG,
		remove:   removeEPG,
		inspect:  inspectEPG,
		links:    deriveEPGLinks,
	}
}

// parsePool returns the pool's first and last address.
func parsePool(pool string) (uint32, uint32, error) {
	a, b, isRange := strings.Cut(pool, "-")
	first, err := parseIP4("ipPool", a)
	if err != nil {
		return 0, 0, err
	}
	last := first
	if isRange {
		if last, err = parseIP4("ipPool", b); err != nil {
			return 0, 0, err
		}
	}
	if last < first {
		return 0, 0, badReq("ipPool: %q has its start after its end", pool)
	}
	return first, last, nil
}

func netprofileFor(tx *state.Tx, tenant, name string) (*model.Netprofile, error) {
	if name == "" {
		return &model.Netprofile{}, nil
	}
	np, found, err := getT[model.Netprofile](tx, model.ModelKey(model.TypeNetprofile, model.ScopedKey(tenant, name)))
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, unproc("netProfile: netprofile %q does not exist in tenant %q", name, tenant)
	}
	return np, nil
}

func saveEPG(m *Master, tx *state.Tx, e, old *model.EndpointGroup) error {
	if err := requireTenant(tx, e.TenantName); err != nil {
		return err
	}
	epgID := model.EPGStateID(e.GroupName, e.TenantName)
	netID := model.NetworkID(e.NetworkName, e.TenantName)
	for _, p := range e.Policies {
		if ok, err := tx.Get(model.ModelKey(model.TypePolicy, model.ScopedKey(e.TenantName, p)), &model.Policy{}); err != nil {
			return err
		} else if !ok {
			return unproc("policies: policy %q does not exist in tenant %q", p, e.TenantName)
		}
	}
	for _, c := range e.ExtContractsGrps {
		if ok, err := tx.Get(model.ModelKey(model.TypeExtContractsGroup, model.ScopedKey(e.TenantName, c)), &model.ExtContractsGroup{}); err != nil {
			return err
		} else if !ok {
			return unproc("extContractsGrps: external contracts group %q does not exist in tenant %q", c, e.TenantName)
		}
	}
	np, err := netprofileFor(tx, e.TenantName, e.NetProfile)
	if err != nil {
		return err
	}
	var st *model.EndpointGroupState
	var oldPolicies []string
	if old != nil {
		if old.NetworkName != e.NetworkName {
			return conflict("networkName: can't change the network of endpoint group %s", e.Key)
		}
		if old.IpPool != e.IpPool {
			return conflict("ipPool: can't change the ip pool of endpoint group %s", e.Key)
		}
		if old.CfgdTag != e.CfgdTag {
			return conflict("cfgdTag: can't change the tag of endpoint group %s", e.Key)
		}
		e.LinkSets, e.Links = old.LinkSets, old.Links
		clearEPGLinks(e) // (derived when read: links.go)
		oldPolicies = old.Policies
		var found bool
		if st, found, err = getT[model.EndpointGroupState](tx, model.EPGStateKey(epgID)); err != nil {
			return err
		} else if !found {
			return conflict("endpoint group %s has no state record", e.Key)
		}
		if old.NetProfile != e.NetProfile {
			e.Links.NetProfile = model.Link{}
		}
	} else {
		ns, found, err := tenantNetwork(tx, e.NetworkName, e.TenantName)
		if err != nil {
			return err
		}
		if !found {
			return unproc("networkName: network %q does not exist in tenant %q", e.NetworkName, e.TenantName)
		}
		if ok, err := tx.Get(model.ModelKey(model.TypeNetwork, e.Key), &model.Network{}); err != nil {
			return err
		} else if ok {
			return conflict("groupName: %q clashes with network %s", e.GroupName, e.Key)
		}
		st = &model.EndpointGroupState{ID: epgID, GroupName: e.GroupName, TenantName: e.TenantName,
			NetworkName: e.NetworkName, PktTagType: ns.PktTagType, PktTag: ns.PktTag, ExtPktTag: ns.ExtPktTag,
			IPPool: e.IpPool, GroupTag: e.CfgdTag}
		if st.GroupTag == "" {
			st.GroupTag = e.GroupName + "." + e.TenantName
		}
		if st.EndpointGroupID, err = freeEPGID(tx); err != nil {
			return err
		}
		if e.IpPool != "" {
			sn, err := subnetOfState(ns)
			if err != nil {
				return err
			}
			first, last, err := parsePool(e.IpPool)
			if err != nil {
				return err
			}
			if !sn.contains(first) || !sn.contains(last) {
				return unproc("ipPool: %s is not inside the subnet %s/%d of network %s", e.IpPool, ns.SubnetIP, ns.SubnetLen, netID)
			}
			nm, err := netAllocMap(tx, ns)
			if err != nil {
				return err
			}
			if off, used, err := nm.NextSet(uint(first-sn.base), uint(last-sn.base)); err != nil {
				return err
			} else if used {
				return conflict("ipPool: address %s of %s is already allocated in network %s", addr4(sn.base+uint32(off)), e.IpPool, netID)
			}
			if err := nm.SetRange(uint(first-sn.base), uint(last-sn.base)); err != nil {
				return err
			}
			if useChunks(sn.size()) {
				st.EPGIPAllocStore = chunkedStore
				if err := newChunkMap(tx, epgAllocPrefix(netID, epgID), uint(sn.size()), poolBase(sn, first, last)).init(); err != nil {
					return err
				}
			} else {
				pm := model.NewBitset(uint(sn.size()))
				used := poolBase(sn, first, last)
				for off := uint(0); off < pm.Len(); off++ {
					if used(off) {
						pm.Set(off)
					}
				}
				st.EPGIPAllocMap = pm
			}
			if err := tx.Put(model.NetStateKey(netID), ns); err != nil {
				return err
			}
		}
		e.LinkSets = model.EndpointGroupLinkSets{}
		e.Links = model.EndpointGroupLinks{
			Network: model.Link{ObjType: model.TypeNetwork, ObjKey: model.ScopedKey(e.TenantName, e.NetworkName)},
			Tenant:  model.Link{ObjType: model.TypeTenant, ObjKey: e.TenantName},
		}
	}
	st.DSCP, st.Bandwidth, st.Burst = np.DSCP, np.Bandwidth, np.Burst
	if e.NetProfile != "" {
		e.Links.NetProfile = model.Link{ObjType: model.TypeNetprofile, ObjKey: model.ScopedKey(e.TenantName, e.NetProfile)}
	}
	e.LinkSets.ExtContractsGrps = nil
	for _, c := range e.ExtContractsGrps {
		addLink(&e.LinkSets.ExtContractsGrps, model.TypeExtContractsGroup, model.ScopedKey(e.TenantName, c))
	}
	if err := tx.Put(model.EPGStateKey(epgID), st); err != nil {
		return err
	}
	// Policies: detach removed ones, attach new ones.
	for _, p := range oldPolicies {
		if !slices.Contains(e.Policies, p) {
			if err := detachPolicy(tx, e, p); err != nil {
				return err
			}
		}
	}
	for _, p := range e.Policies {
		if !slices.Contains(oldPolicies, p) {
			if err := attachPolicy(tx, e, st.EndpointGroupID, p); err != nil {
				return err
			}
		}
	}
	return tx.Put(model.ModelKey(model.TypeEndpointGroup, e.Key), e)
}

func freeEPGID(tx *state.Tx) (int, error) {
	sts, err := listT[model.EndpointGroupState](tx, model.EPGStatePrefix)
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	for _, s := range sts {
		used[s.EndpointGroupID] = true
	}
	for id := 1; id <= maxEPGID; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, conflict("no free endpoint group id left (max %d)", maxEPGID)
}

func removeEPG(m *Master, tx *state.Tx, e *model.EndpointGroup) error {
	aps, err := listT[model.AppProfile](tx, model.ModelKey(model.TypeAppProfile, e.TenantName+":"))
	if err != nil {
		return err
	}
	for _, ap := range aps {
		if slices.Contains(ap.EndpointGroups, e.GroupName) {
			return conflict("endpoint group %s is used by app profile %s", e.Key, ap.Key)
		}
	}
	epgID := model.EPGStateID(e.GroupName, e.TenantName)
	st, found, err := getT[model.EndpointGroupState](tx, model.EPGStateKey(epgID))
	if err != nil {
		return err
	}
	if found {
		if st.EpCount > 0 {
			return conflict("endpoint group %s still has %d endpoint(s)", e.Key, st.EpCount)
		}
		if st.IPPool != "" {
			netID := model.NetworkID(e.NetworkName, e.TenantName)
			ns, nfound, err := tenantNetwork(tx, e.NetworkName, e.TenantName)
			if err != nil {
				return err
			}
			if nfound {
				first, last, err := parsePool(st.IPPool)
				if err != nil {
					return err
				}
				sn, err := subnetOfState(ns)
				if err != nil {
					return err
				}
				nm, err := netAllocMap(tx, ns)
				if err != nil {
					return err
				}
				if err := nm.ClearRange(uint(first-sn.base), uint(last-sn.base)); err != nil {
					return err
				}
				if err := tx.Put(model.NetStateKey(netID), ns); err != nil {
					return err
				}
				tx.DeletePrefix(epgAllocPrefix(netID, epgID))
			}
		}
		tx.Delete(model.EPGStateKey(epgID))
	}
	for _, p := range e.Policies {
		if err := detachPolicy(tx, e, p); err != nil {
			return err
		}
	}
	tx.Delete(model.ModelKey(model.TypeEndpointGroup, e.Key))
	return nil
}

func inspectEPG(m *Master, tx *state.Tx, e *model.EndpointGroup) (any, error) {
	out := model.EndpointGroupInspect{Config: *e}
	st, found, err := getT[model.EndpointGroupState](tx, model.EPGStateKey(model.EPGStateID(e.GroupName, e.TenantName)))
	if err != nil || !found {
		return out, err
	}
	out.Oper = model.EndpointGroupOper{ExternalPktTag: st.ExtPktTag, GroupTag: st.GroupTag, NumEndpoints: st.EpCount, PktTag: st.PktTag}
	netID := model.NetworkID(e.NetworkName, e.TenantName)
	if st.IPPool != "" {
		if ns, ok, err := tenantNetwork(tx, e.NetworkName, e.TenantName); err == nil && ok {
			if sn, err := subnetOfState(ns); err == nil {
				first, last, _ := parsePool(st.IPPool)
				outside := func(off uint) bool {
					a := sn.base + uint32(off)
					return a < first || a > last
				}
				pm, err := epgAllocMap(tx, ns, st)
				if err != nil {
					return nil, err
				}
				bits, err := pm.Bits()
				if err != nil {
					return nil, err
				}
				out.Oper.AllocatedIPAddresses = formatRanges(sn, bits, true, outside)
				out.Oper.AvailableIPAddresses = formatRanges(sn, bits, false, outside)
			}
		}
	}
	eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix+netID+"-")
	if err != nil {
		return nil, err
	}
	for _, ep := range eps {
		if ep.NetID == netID && ep.EndpointGroupKey == st.ID {
			out.Oper.Endpoints = append(out.Oper.Endpoints, endpointOper(ep, ""))
		}
	}
	return out, nil
}
