package master

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/netprofile"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func appProfileOps() objOps[model.AppProfile] {
	return objOps[model.AppProfile]{
		coll: model.CollAppProfiles, objType: model.TypeAppProfile,
		key:    func(a *model.AppProfile) string { return model.ScopedKey(a.TenantName, a.AppProfileName) },
		setKey: func(a *model.AppProfile, k string) { a.Key = k },
		validate: func(a *model.AppProfile) error {
			if err := checkName("tenantName", a.TenantName, 64); err != nil {
				return err
			}
			if err := checkName("appProfileName", a.AppProfileName, 64); err != nil {
				return err
			}
			return checkNames("endpointGroups", a.EndpointGroups, 64)
		},
		save: func(m *Master, tx *state.Tx, a, old *model.AppProfile) error {
			if err := requireTenant(tx, a.TenantName); err != nil {
				return err
			}
			if old != nil {
				if err := setAppProfileLinks(tx, old, false); err != nil {
					return err
				}
			}
			a.LinkSets = model.AppProfileLinkSets{}
			a.Links = model.AppProfileLinks{Tenant: model.Link{ObjType: model.TypeTenant, ObjKey: a.TenantName}}
			for _, g := range a.EndpointGroups {
				k := model.ScopedKey(a.TenantName, g)
				if ok, err := tx.Get(model.ModelKey(model.TypeEndpointGroup, k), &model.EndpointGroup{}); err != nil {
					return err
				} else if !ok {
					return unproc("endpointGroups: endpoint group %q does not exist in tenant %q", g, a.TenantName)
				}
				addLink(&a.LinkSets.EndpointGroups, model.TypeEndpointGroup, k)
			}
			if err := setAppProfileLinks(tx, a, true); err != nil {
				return err
			}
			return tx.Put(model.ModelKey(model.TypeAppProfile, a.Key), a)
		},
		remove: func(m *Master, tx *state.Tx, a *model.AppProfile) error {
			if err := setAppProfileLinks(tx, a, false); err != nil {
				return err
			}
			tx.Delete(model.ModelKey(model.TypeAppProfile, a.Key))
			return nil
		},
	}
}

func setAppProfileLinks(tx *state.Tx, a *model.AppProfile, add bool) error {
	for _, g := range a.EndpointGroups {
		if err := mutate(tx, model.ModelKey(model.TypeEndpointGroup, model.ScopedKey(a.TenantName, g)), func(e *model.EndpointGroup) {
			clearEPGLinks(e) // (a record of an earlier build's: derived when read)
			if add {
				e.Links.AppProfile = model.Link{ObjType: model.TypeAppProfile, ObjKey: a.Key}
			} else if e.Links.AppProfile.ObjKey == a.Key {
				e.Links.AppProfile = model.Link{}
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

func netprofileOps() objOps[model.Netprofile] {
	return objOps[model.Netprofile]{
		coll: model.CollNetprofiles, objType: model.TypeNetprofile,
		key:    func(p *model.Netprofile) string { return model.ScopedKey(p.TenantName, p.ProfileName) },
		setKey: func(p *model.Netprofile, k string) { p.Key = k },
		validate: func(p *model.Netprofile) error {
			if err := checkName("tenantName", p.TenantName, 64); err != nil {
				return err
			}
			if err := checkName("profileName", p.ProfileName, 64); err != nil {
				return err
			}
			if len(p.Bandwidth) > 64 {
				return badReq("bandwidth: %q is longer than 64 characters", p.Bandwidth)
			}
			// One parser for netmaster and agents (units: docs/netprofiles.md).
			if err := netprofile.CheckProfile(p.Bandwidth, p.DSCP, p.Burst); err != nil {
				return badReq("%v", err)
			}
			return nil
		},
		save: func(m *Master, tx *state.Tx, p, old *model.Netprofile) error {
			if err := requireTenant(tx, p.TenantName); err != nil {
				return err
			}
			if old != nil {
				p.LinkSets, p.Links = old.LinkSets, old.Links
				clearNetprofileLinks(p) // (derived when read: links.go)
				// Push the new limits into every EPG using the profile.
				epgs, err := netprofileGroups(tx, p.TenantName, p.ProfileName)
				if err != nil {
					return err
				}
				for _, e := range epgs {
					if err := mutate(tx, model.EPGStateKey(model.EPGStateID(e.GroupName, e.TenantName)), func(s *model.EndpointGroupState) {
						s.DSCP, s.Bandwidth, s.Burst = p.DSCP, p.Bandwidth, p.Burst
					}); err != nil {
						return err
					}
				}
			} else {
				p.LinkSets = model.NetprofileLinkSets{}
				p.Links = model.NetprofileLinks{Tenant: model.Link{ObjType: model.TypeTenant, ObjKey: p.TenantName}}
			}
			return tx.Put(model.ModelKey(model.TypeNetprofile, p.Key), p)
		},
		remove: func(m *Master, tx *state.Tx, p *model.Netprofile) error {
			epgs, err := netprofileGroups(tx, p.TenantName, p.ProfileName)
			if err != nil {
				return err
			}
			if len(epgs) > 0 {
				return conflict("netprofile %s is used by endpoint group %s", p.Key, epgs[0].Key)
			}
			tx.Delete(model.ModelKey(model.TypeNetprofile, p.Key))
			return nil
		},
		links: deriveNetprofileLinks,
	}
}

func bgpOps() objOps[model.Bgp] {
	return objOps[model.Bgp]{
		coll: model.CollBgps, objType: model.TypeBgp,
		key:    func(b *model.Bgp) string { return b.Hostname },
		setKey: func(b *model.Bgp, k string) { b.Key = k },
		validate: func(b *model.Bgp) error {
			if err := checkName("hostname", b.Hostname, 256); err != nil {
				return err
			}
			if err := checkRegex("routerip", b.Routerip, reRouterIP, "an IPv4 address with prefix length like 50.1.1.1/24", 0); err != nil {
				return err
			}
			if len(b.As) > 64 || len(b.NeighborAs) > 64 {
				return badReq("as/neighbor-as: longer than 64 characters")
			}
			// Contiv took any string; a session needs AS numbers (asplain, 1-4294967295).
			for field, v := range map[string]string{"as": b.As, "neighbor-as": b.NeighborAs} {
				if n, err := strconv.ParseUint(v, 10, 32); v != "" && (err != nil || n == 0) {
					return badReq("%s: %q is not an AS number (1-4294967295)", field, v)
				}
			}
			if b.Neighbor != "" {
				if err := checkRegex("neighbor", b.Neighbor, reIP4, "an IPv4 address", 15); err != nil {
					return err
				}
				rip, err1 := netip.ParsePrefix(b.Routerip)
				nb, err2 := netip.ParseAddr(b.Neighbor)
				if err1 == nil && err2 == nil && (!rip.Contains(nb) || nb == rip.Addr()) {
					return badReq("neighbor: %s is not another address on routerip's network %s (BGP runs over that link)", b.Neighbor, rip.Masked())
				}
			}
			return nil
		},
		save: func(m *Master, tx *state.Tx, b, old *model.Bgp) error {
			if err := tx.Put(model.BgpStateKey(b.Hostname), model.CfgBgpState{ID: b.Hostname, Hostname: b.Hostname,
				RouterIP: b.Routerip, As: b.As, NeighborAs: b.NeighborAs, Neighbor: b.Neighbor}); err != nil {
				return err
			}
			return tx.Put(model.ModelKey(model.TypeBgp, b.Key), b)
		},
		remove: func(m *Master, tx *state.Tx, b *model.Bgp) error {
			tx.Delete(model.BgpStateKey(b.Hostname))
			tx.Delete(model.BgpOperKey(b.Hostname))
			tx.Delete(model.ModelKey(model.TypeBgp, b.Key))
			return nil
		},
		inspect: func(m *Master, tx *state.Tx, b *model.Bgp) (any, error) {
			in := model.BgpInspect{Config: *b}
			// The host's netplugin publishes its session; a missing record is no error
			// (no agent yet, or one that has not reported).
			if _, err := tx.Get(model.BgpOperKey(b.Hostname), &in.Oper); err != nil {
				return nil, err
			}
			return in, nil
		},
	}
}

func extContractsOps() objOps[model.ExtContractsGroup] {
	return objOps[model.ExtContractsGroup]{
		coll: model.CollExtContractsGroups, objType: model.TypeExtContractsGroup,
		key:    func(c *model.ExtContractsGroup) string { return model.ScopedKey(c.TenantName, c.ContractsGroupName) },
		setKey: func(c *model.ExtContractsGroup, k string) { c.Key = k },
		validate: func(c *model.ExtContractsGroup) error {
			if err := checkName("tenantName", c.TenantName, 64); err != nil {
				return err
			}
			if err := checkName("contractsGroupName", c.ContractsGroupName, 64); err != nil {
				return err
			}
			if err := checkContracts("contracts", c.Contracts); err != nil {
				return err
			}
			return checkOneOf("contractsType", c.ContractsType, "provided", "consumed")
		},
		save: func(m *Master, tx *state.Tx, c, old *model.ExtContractsGroup) error {
			if err := requireTenant(tx, c.TenantName); err != nil {
				return err
			}
			if old != nil {
				c.LinkSets, c.Links = old.LinkSets, old.Links
			} else {
				c.LinkSets = model.ExtContractsGroupLinkSets{}
				c.Links = model.ExtContractsGroupLinks{Tenant: model.Link{ObjType: model.TypeTenant, ObjKey: c.TenantName}}
			}
			return tx.Put(model.ModelKey(model.TypeExtContractsGroup, c.Key), c)
		},
		remove: func(m *Master, tx *state.Tx, c *model.ExtContractsGroup) error {
			epgs, err := listT[model.EndpointGroup](tx, model.ModelKey(model.TypeEndpointGroup, c.TenantName+":"))
			if err != nil {
				return err
			}
			for _, e := range epgs {
				for _, g := range e.ExtContractsGrps {
					if g == c.ContractsGroupName {
						return conflict("external contracts group %s is used by endpoint group %s", c.Key, e.Key)
					}
				}
			}
			tx.Delete(model.ModelKey(model.TypeExtContractsGroup, c.Key))
			return nil
		},
	}
}

func aciGwOps() objOps[model.AciGw] {
	return objOps[model.AciGw]{
		coll: model.CollAciGws, objType: model.TypeAciGw,
		key:    func(a *model.AciGw) string { return a.Name },
		setKey: func(a *model.AciGw, k string) { a.Key = k },
		validate: func(a *model.AciGw) error {
			if a.Name != "aciGw" {
				return badReq("name: %q must be \"aciGw\"", a.Name)
			}
			for _, f := range []struct {
				name, v string
				re      func(string) bool
			}{{"pathBindings", a.PathBindings, rePath.MatchString}, {"nodeBindings", a.NodeBindings, reNode.MatchString}} {
				if len(f.v) > 2048 {
					return badReq("%s: longer than 2048 characters", f.name)
				}
				if f.v == "" {
					continue
				}
				for _, p := range strings.Split(f.v, ",") {
					if !f.re(p) {
						return badReq("%s: %q is not a valid binding", f.name, p)
					}
				}
			}
			if err := checkOptName("physicalDomain", a.PhysicalDomain, 128); err != nil {
				return err
			}
			if a.EnforcePolicies == "" {
				a.EnforcePolicies = "yes"
			}
			if a.IncludeCommonTenant == "" {
				a.IncludeCommonTenant = "no"
			}
			if err := checkOneOf("enforcePolicies", a.EnforcePolicies, "yes", "no"); err != nil {
				return err
			}
			return checkOneOf("includeCommonTenant", a.IncludeCommonTenant, "yes", "no")
		},
		save: func(m *Master, tx *state.Tx, a, old *model.AciGw) error {
			return tx.Put(model.ModelKey(model.TypeAciGw, a.Key), a)
		},
		remove: func(m *Master, tx *state.Tx, a *model.AciGw) error {
			tx.Delete(model.ModelKey(model.TypeAciGw, a.Key))
			return nil
		},
		inspect: func(m *Master, tx *state.Tx, a *model.AciGw) (any, error) {
			kvs, err := tx.List(model.ModelKey(model.TypeAppProfile, ""))
			if err != nil {
				return nil, err
			}
			return model.AciGwInspect{Config: *a, Oper: model.AciGwOper{NumAppProfiles: len(kvs)}}, nil
		},
	}
}
