package master

import (
	"fmt"
	"sort"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

const (
	maxVXLANWidth = 16000
	maxVNI        = 1<<24 - 1
	numVLANs      = 4096
)

type usedTags struct {
	vlans, vnis, local map[int]string    // tag → network id
	tenants            map[string]string // network id → tenant
}

func collectUsedTags(tx *state.Tx) (usedTags, error) {
	u := usedTags{vlans: map[int]string{}, vnis: map[int]string{}, local: map[int]string{}, tenants: map[string]string{}}
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return u, err
	}
	for _, n := range nets {
		u.tenants[n.ID] = n.Tenant
		switch n.PktTagType {
		case "vlan":
			u.vlans[n.PktTag] = n.ID
		case "vxlan":
			u.vnis[n.ExtPktTag] = n.ID
			u.local[n.PktTag] = n.ID
		}
	}
	return u, nil
}

// writeTagResources rebuilds the auto-vlan and auto-vxlan records for the given ranges,
// refusing ranges that would exclude a tag in use.
func writeTagResources(tx *state.Tx, vlanLo, vlanHi, vxLo, vxHi int) error {
	u, err := collectUsedTags(tx)
	if err != nil {
		return err
	}
	for v, id := range u.vlans {
		if v < vlanLo || v > vlanHi {
			return conflict("vlans: range %s excludes VLAN %d used by network %s", fmtRange(vlanLo, vlanHi), v, id)
		}
	}
	for v, id := range u.vnis {
		if v < vxLo || v > vxHi {
			return conflict("vxlans: range %s excludes VXLAN %d used by network %s", fmtRange(vxLo, vxHi), v, id)
		}
	}
	vcfg := model.NewBitset(numVLANs)
	vcfg.SetRange(uint(vlanLo), uint(vlanHi))
	vfree := vcfg.Clone()
	for v := range u.vlans {
		vfree.Clear(uint(v))
	}
	start := vxLo - 1
	xcfg := model.NewBitset(uint(vxHi - start + 1))
	xcfg.SetRange(uint(vxLo-start), uint(vxHi-start))
	xfree := xcfg.Clone()
	for v := range u.vnis {
		xfree.Clear(uint(v - start))
	}
	lcfg := model.NewBitset(numVLANs)
	lcfg.SetRange(1, numVLANs-2)
	lfree := lcfg.Clone()
	for v := range u.local {
		lfree.Clear(uint(v))
	}
	if err := tx.Put(model.VlanResCfgKey, model.VlanResourceCfg{ID: "global", VLANs: vcfg}); err != nil {
		return err
	}
	if err := tx.Put(model.VlanResOperKey, model.VlanResourceOper{ID: "global", FreeVLANs: vfree}); err != nil {
		return err
	}
	if err := tx.Put(model.VxlanResCfgKey, model.VxlanResourceCfg{ID: "global", VXLANs: xcfg, LocalVLANs: lcfg, FreeVXLANsStart: uint(start)}); err != nil {
		return err
	}
	return tx.Put(model.VxlanResOperKey, model.VxlanResourceOper{ID: "global", FreeVXLANs: xfree, FreeLocalVLANs: lfree})
}

// allocVLAN takes the requested VLAN (0 = lowest free sc allows) out of the free list.
func allocVLAN(tx *state.Tx, req int, sc tagScope) (int, error) {
	var cfg model.VlanResourceCfg
	var oper model.VlanResourceOper
	if err := getBoth(tx, model.VlanResCfgKey, &cfg, model.VlanResOperKey, &oper); err != nil {
		return 0, err
	}
	if req > 0 {
		if !cfg.VLANs.Test(uint(req)) {
			return 0, conflict("pktTag: VLAN %d is outside the global vlan range", req)
		}
		if !oper.FreeVLANs.Test(uint(req)) {
			return 0, conflict("pktTag: VLAN %d is already in use", req)
		}
		oper.FreeVLANs.Clear(uint(req))
		return req, tx.Put(model.VlanResOperKey, oper)
	}
	v, ok := sc.next(oper.FreeVLANs, 0, 1)
	if !ok {
		return 0, sc.exhausted("VLAN")
	}
	oper.FreeVLANs.Clear(uint(v))
	return v, tx.Put(model.VlanResOperKey, oper)
}

func releaseVLAN(tx *state.Tx, v int) error {
	var cfg model.VlanResourceCfg
	var oper model.VlanResourceOper
	if err := getBoth(tx, model.VlanResCfgKey, &cfg, model.VlanResOperKey, &oper); err != nil {
		return err
	}
	if cfg.VLANs.Test(uint(v)) {
		oper.FreeVLANs.Set(uint(v))
	}
	return tx.Put(model.VlanResOperKey, oper)
}

// allocVXLAN takes a VNI (requested or lowest free sc allows) and a host-local VLAN.
func allocVXLAN(tx *state.Tx, req int, sc tagScope) (vni, local int, err error) {
	var cfg model.VxlanResourceCfg
	var oper model.VxlanResourceOper
	if err := getBoth(tx, model.VxlanResCfgKey, &cfg, model.VxlanResOperKey, &oper); err != nil {
		return 0, 0, err
	}
	start := int(cfg.FreeVXLANsStart)
	if req > 0 {
		if req <= start || !cfg.VXLANs.Test(uint(req-start)) {
			return 0, 0, conflict("pktTag: VXLAN %d is outside the global vxlan range", req)
		}
		if !oper.FreeVXLANs.Test(uint(req - start)) {
			return 0, 0, conflict("pktTag: VXLAN %d is already in use", req)
		}
		vni = req
	} else {
		v, ok := sc.next(oper.FreeVXLANs, start, start)
		if !ok {
			return 0, 0, sc.exhausted("VXLAN")
		}
		vni = v
	}
	// The host-local VLAN is Contiv's (its OVS bridge tags a VXLAN network's ports with
	// it); neither of our dataplanes uses one, so a network created once all 4,094 are
	// taken gets none (pktTag 0) instead of a refusal: 4,094 would cap a cluster's VXLAN
	// networks.
	l, ok := oper.FreeLocalVLANs.NextSet(1)
	if ok {
		oper.FreeLocalVLANs.Clear(l)
	} else {
		l = 0
	}
	oper.FreeVXLANs.Clear(uint(vni - start))
	return vni, int(l), tx.Put(model.VxlanResOperKey, oper)
}

func releaseVXLAN(tx *state.Tx, vni, local int) error {
	var cfg model.VxlanResourceCfg
	var oper model.VxlanResourceOper
	if err := getBoth(tx, model.VxlanResCfgKey, &cfg, model.VxlanResOperKey, &oper); err != nil {
		return err
	}
	start := int(cfg.FreeVXLANsStart)
	if vni > start && cfg.VXLANs.Test(uint(vni-start)) {
		oper.FreeVXLANs.Set(uint(vni - start))
	}
	if local > 0 && cfg.LocalVLANs.Test(uint(local)) {
		oper.FreeLocalVLANs.Set(uint(local))
	}
	return tx.Put(model.VxlanResOperKey, oper)
}

func getBoth(tx *state.Tx, k1 string, v1 any, k2 string, v2 any) error {
	for _, p := range []struct {
		k string
		v any
	}{{k1, v1}, {k2, v2}} {
		ok, err := tx.Get(p.k, p.v)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("tag resource %s missing (global object not initialised)", p.k)
		}
	}
	return nil
}

// inUseString renders a set of tags as "1-3, 7".
func inUseString(tags map[int]string) string {
	ts := make([]int, 0, len(tags))
	for t := range tags {
		ts = append(ts, t)
	}
	sort.Ints(ts)
	var parts []string
	for i := 0; i < len(ts); {
		j := i
		for j+1 < len(ts) && ts[j+1] == ts[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(ts[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ts[i], ts[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
