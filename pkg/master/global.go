package master

import (
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func validateGlobal(g *model.Global) error {
	if g.Name != "global" {
		return badReq("name: %q must be \"global\"", g.Name)
	}
	if g.NetworkInfraType == "" {
		g.NetworkInfraType = "default"
	}
	if err := checkOneOf("networkInfraType", g.NetworkInfraType, "default", "aci", "aci-opflex"); err != nil {
		return err
	}
	if g.FwdMode != "" {
		if err := checkOneOf("fwdMode", g.FwdMode, "bridge", "routing"); err != nil {
			return err
		}
	}
	if g.ArpMode == "" {
		g.ArpMode = "proxy"
	}
	if err := checkOneOf("arpMode", g.ArpMode, "proxy", "flood"); err != nil {
		return err
	}
	if g.Encryption != "" {
		if err := checkOneOf("encryption", g.Encryption, model.EncryptionNone, model.EncryptionWireGuard); err != nil {
			return err
		}
	}
	if err := checkRegex("vlans", g.Vlans, reVlanRange, "a VLAN range like 1-4094", 0); err != nil {
		return err
	}
	lo, hi, err := parseRange("vlans", g.Vlans)
	if err != nil {
		return err
	}
	if lo < 1 || hi > 4094 {
		return badReq("vlans: %q must lie within 1-4094", g.Vlans)
	}
	if err := checkRegex("vxlans", g.Vxlans, reVxlanRng, "a VXLAN range like 1-10000", 0); err != nil {
		return err
	}
	lo, hi, err = parseRange("vxlans", g.Vxlans)
	if err != nil {
		return err
	}
	if lo < 1 || hi > maxVNI {
		return badReq("vxlans: %q must lie within 1-%d", g.Vxlans, maxVNI)
	}
	if hi-lo+1 > maxVXLANWidth {
		return badReq("vxlans: %q is wider than %d VNIs", g.Vxlans, maxVXLANWidth)
	}
	return checkRegex("pvtSubnet", g.PvtSubnet, rePvtSubnet, "an IPv4 /16 like 172.19.0.0/16", 0)
}

// saveGlobal writes the global object and every record derived from it.
func saveGlobal(tx *state.Tx, g, old *model.Global) error {
	if err := validateGlobal(g); err != nil {
		return err
	}
	if g.Encryption == "" && old != nil {
		g.Encryption = old.Encryption // (a client that does not know the field)
	}
	if g.Encryption == "" {
		g.Encryption = model.EncryptionNone
	}
	g.Key = "global"
	if old != nil && (old.FwdMode != g.FwdMode || old.PvtSubnet != g.PvtSubnet) {
		nets, err := tx.List(model.NetStatePrefix)
		if err != nil {
			return err
		}
		if len(nets) > 0 && old.FwdMode != g.FwdMode {
			return conflict("fwdMode: can't change forwarding mode from %q to %q while %d network(s) exist", old.FwdMode, g.FwdMode, len(nets))
		}
		if len(nets) > 0 && old.PvtSubnet != g.PvtSubnet {
			return conflict("pvtSubnet: can't change private subnet while %d network(s) exist", len(nets))
		}
		if g.FwdMode == "routing" && old.FwdMode != "routing" {
			bgps, err := tx.List(model.ModelKey(model.TypeBgp, ""))
			if err != nil {
				return err
			}
			if len(bgps) > 0 {
				return conflict("fwdMode: can't change to routing while BGP configs exist")
			}
		}
	}
	vlo, vhi, _ := parseRange("vlans", g.Vlans)
	xlo, xhi, _ := parseRange("vxlans", g.Vxlans)
	if err := checkGlobalHoldsRanges(tx, span{vlo, vhi}, span{xlo, xhi}); err != nil {
		return err
	}
	if err := writeTagResources(tx, vlo, vhi, xlo, xhi); err != nil {
		return err
	}
	// The agents' record keeps Contiv's bytes while encryption is off (none: left out,
	// which clusterenc.Of reads as none).
	enc := g.Encryption
	if enc == model.EncryptionNone {
		enc = ""
	}
	if err := tx.Put(model.GlobConfigKey, model.GlobConfig{ID: "global", NwInfraType: g.NetworkInfraType,
		FwdMode: g.FwdMode, ArpMode: g.ArpMode, PvtSubnet: g.PvtSubnet, Encryption: enc}); err != nil {
		return err
	}
	if err := tx.Put(model.GStateCfgKey, model.GStateCfg{ID: "global", Auto: model.AutoRanges{VLANs: g.Vlans, VXLANs: g.Vxlans}}); err != nil {
		return err
	}
	var oper model.GStateOper
	if _, err := tx.Get(model.GStateOperKey, &oper); err != nil {
		return err
	}
	oper.ID = "global"
	oper.FreeVXLANsStart = uint(xlo - 1)
	if err := tx.Put(model.GStateOperKey, oper); err != nil {
		return err
	}
	return tx.Put(model.ModelKey(model.TypeGlobal, "global"), g)
}

func globalOps() objOps[model.Global] {
	return objOps[model.Global]{
		coll: model.CollGlobals, objType: model.TypeGlobal,
		key:      func(g *model.Global) string { return g.Name },
		setKey:   func(g *model.Global, k string) { g.Key = k },
		validate: validateGlobal,
		save: func(m *Master, tx *state.Tx, g, old *model.Global) error {
			return saveGlobal(tx, g, old)
		},
		remove: func(m *Master, tx *state.Tx, old *model.Global) error {
			return conflict("global: the global object can't be deleted")
		},
		inspect: func(m *Master, tx *state.Tx, g *model.Global) (any, error) {
			u, err := collectUsedTags(tx)
			if err != nil {
				return nil, err
			}
			var oper model.GStateOper
			if _, err := tx.Get(model.GStateOperKey, &oper); err != nil {
				return nil, err
			}
			nets, err := tx.List(model.NetStatePrefix)
			if err != nil {
				return nil, err
			}
			return model.GlobalInspect{Config: *g, Oper: model.GlobalOper{
				ClusterMode: m.cfg.ClusterMode, DefaultNetwork: oper.DefaultNetwork,
				FreeVXLANsStart: int(oper.FreeVXLANsStart), NumNetworks: len(nets),
				VlansInUse: inUseString(u.vlans), VxlansInUse: inUseString(u.vnis),
			}}, nil
		},
	}
}
