package master

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func validateNetwork(n *model.Network) error {
	if err := checkName("tenantName", n.TenantName, 64); err != nil {
		return err
	}
	if err := checkName("networkName", n.NetworkName, 64); err != nil {
		return err
	}
	if n.NwType == "" {
		n.NwType = "data"
	}
	if err := checkOneOf("nwType", n.NwType, "infra", "data"); err != nil {
		return err
	}
	if err := checkOneOf("encap", n.Encap, "vlan", "vxlan"); err != nil {
		return err
	}
	if err := checkIntRange("pktTag", n.PktTag, 0, 16777216); err != nil {
		return err
	}
	if n.Encap == "vlan" && n.PktTag > 4094 {
		return badReq("pktTag: VLAN %d is out of range 1..4094", n.PktTag)
	}
	if n.Subnet == "" {
		return badReq("subnet: required")
	}
	sn, err := parseSubnet4("subnet", n.Subnet)
	if err != nil {
		return err
	}
	if n.Gateway != "" {
		if err := checkRegex("gateway", n.Gateway, reIP4, "an IPv4 address", 0); err != nil {
			return err
		}
		gw, _ := parseIP4("gateway", n.Gateway)
		if !sn.contains(gw) {
			return badReq("gateway: %s is outside subnet %s", n.Gateway, n.Subnet)
		}
		if gw == sn.base || gw == sn.base+sn.size()-1 {
			return badReq("gateway: %s is the network or broadcast address of %s", n.Gateway, n.Subnet)
		}
	}
	if n.Ipv6Subnet != "" {
		s6, err := parseSubnet6("ipv6Subnet", n.Ipv6Subnet)
		if err != nil {
			return err
		}
		if n.Ipv6Gateway != "" {
			a, err := netip.ParseAddr(n.Ipv6Gateway)
			if err != nil || !a.Is6() {
				return badReq("ipv6Gateway: %q is not an IPv6 address", n.Ipv6Gateway)
			}
			if !s6.prefix.Contains(a) {
				return badReq("ipv6Gateway: %s is outside ipv6Subnet %s", n.Ipv6Gateway, n.Ipv6Subnet)
			}
		}
	} else if n.Ipv6Gateway != "" {
		return badReq("ipv6Gateway: given without ipv6Subnet")
	}
	return checkOptName("cfgdTag", n.CfgdTag, 128)
}

func networkOps() objOps[model.Network] {
	return objOps[model.Network]{
		coll: model.CollNetworks, objType: model.TypeNetwork,
		key:      func(n *model.Network) string { return model.ScopedKey(n.TenantName, n.NetworkName) },
		setKey:   func(n *model.Network, k string) { n.Key = k },
		validate: validateNetwork,
		claim: func(ctx context.Context, tx *state.Tx, key string, obj, old *model.Network) error {
			if err := checkTagChoice(ctx, tx, obj, old); err != nil {
				return err
			}
			return claimNetwork(ctx, tx, key, obj, old)
		},
		save:   saveNetwork,
		remove: removeNetwork,
		links:  deriveNetworkLinks,
		inspect: func(m *Master, tx *state.Tx, n *model.Network) (any, error) {
			ns, found, err := tenantNetwork(tx, n.NetworkName, n.TenantName)
			if err != nil {
				return nil, err
			}
			out := model.NetworkInspect{Config: *n}
			if found {
				eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix+ns.ID+"-")
				if err != nil {
					return nil, err
				}
				if out.Oper, err = networkOper(tx, ns, eps); err != nil {
					return nil, err
				}
			}
			return out, nil
		},
	}
}

func saveNetwork(m *Master, tx *state.Tx, n, old *model.Network) error {
	if old != nil {
		return conflict("network %s already exists: can't change network parameters after it is created", n.Key)
	}
	var g model.Global
	if _, err := tx.Get(model.ModelKey(model.TypeGlobal, "global"), &g); err != nil {
		return err
	}
	if g.FwdMode == "" {
		return conflict("global forwarding mode is not set: run `netctl global set --fwd-mode bridge|routing` first")
	}
	if err := requireTenant(tx, n.TenantName); err != nil {
		return err
	}
	if ok, err := tx.Get(model.ModelKey(model.TypeEndpointGroup, n.Key), &model.EndpointGroup{}); err != nil {
		return err
	} else if ok {
		return conflict("networkName: %q clashes with endpoint group %s", n.NetworkName, n.Key)
	}
	sn, _ := parseSubnet4("subnet", n.Subnet)
	var s6 subnet6
	if n.Ipv6Subnet != "" {
		s6, _ = parseSubnet6("ipv6Subnet", n.Ipv6Subnet)
	}
	// The networks to check against (the subnet index, subnetidx.go): the tenant's own
	// and, for a VLAN network in routing mode, every VLAN network. Routing mode routes VLAN
	// networks natively when hosts speak BGP (docs/bgp.md): the fabric has one table, so
	// their subnets may not overlap across tenants either.
	native := g.FwdMode == "routing" && n.Encap == "vlan"
	check, err := tenantSubnets(tx, n.TenantName)
	if err != nil {
		return err
	}
	if native {
		vlans, err := vlanSubnets(tx)
		if err != nil {
			return err
		}
		check = maps.Clone(check)
		maps.Copy(check, vlans)
	}
	for _, oid := range slices.Sorted(maps.Keys(check)) { // (one answer for one state)
		o := check[oid]
		osn, err := subnetOfState(&model.CfgNetworkState{ID: oid, SubnetIP: o.SubnetIP, SubnetLen: o.SubnetLen})
		if err != nil {
			return err
		}
		if osn.contains(sn.base) || sn.contains(osn.base) {
			if o.Tenant != n.TenantName {
				// (The other tenant's network is not named: found by review.)
				return conflict("subnet: %s overlaps a network of another tenant; VLAN networks are routed natively in routing mode and may not overlap", n.Subnet)
			}
			return conflict("subnet: %s overlaps network %s (%s/%d)", n.Subnet, oid, o.SubnetIP, o.SubnetLen)
		}
		if n.Ipv6Subnet != "" && o.IPv6Subnet != "" {
			op, err := netip.ParsePrefix(fmt.Sprintf("%s/%d", o.IPv6Subnet, o.IPv6SubnetLen))
			if err == nil && op.Overlaps(s6.prefix) {
				if o.Tenant != n.TenantName {
					return conflict("ipv6Subnet: %s overlaps a network of another tenant", n.Ipv6Subnet)
				}
				return conflict("ipv6Subnet: %s overlaps network %s (%s)", n.Ipv6Subnet, oid, op)
			}
		}
	}
	id := model.NetworkID(n.NetworkName, n.TenantName)
	// Network ids are "<net>.<tenant>" and names may contain dots: network "a1" of tenant
	// "b1.c1" and network "a1.b1" of tenant "c1" spell the same id. The first keeps it.
	if other, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(id)); err != nil {
		return err
	} else if found && !other.Owns(n.NetworkName, n.TenantName) {
		// (Not naming the holder: it is another tenant's.)
		return conflict("network %q of tenant %q would use state key %s, which another network holds: choose another name",
			n.NetworkName, n.TenantName, model.NetStateKey(id))
	}
	ns := model.CfgNetworkState{ID: id, Tenant: n.TenantName, NetworkName: n.NetworkName, NwType: n.NwType,
		PktTagType: n.Encap, SubnetIP: addr4(sn.base).String(), SubnetLen: uint(sn.plen), Gateway: n.Gateway,
		IPAddrRange: addr4(sn.first).String() + "-" + addr4(sn.end).String(), NetworkTag: n.CfgdTag, NatDisabled: n.NatDisabled}
	if ns.NetworkTag == "" {
		ns.NetworkTag = id
	}
	var gw uint32
	if n.Gateway != "" {
		gw, _ = parseIP4("gateway", n.Gateway)
	}
	if useChunks(sn.size()) {
		ns.IPAllocStore = chunkedStore
		if err := newChunkMap(tx, netAllocRoot(id)+"net/", uint(sn.size()), netBase(sn, gw, n.Gateway != "")).init(); err != nil {
			return err
		}
	} else {
		ns.IPAllocMap = newIPMap(sn, gw, n.Gateway != "")
	}
	if n.Ipv6Subnet != "" {
		ns.IPv6Subnet = s6.prefix.Addr().String()
		ns.IPv6SubnetLen = uint(s6.prefix.Bits())
		ns.IPv6Gateway = n.Ipv6Gateway
		if n.Ipv6Gateway != "" {
			if err := reserveIPv6(&ns, n.Ipv6Gateway); err != nil {
				return err
			}
		}
	}
	sc, err := scopeOf(tx, n.TenantName, n.Encap)
	if err != nil {
		return err
	}
	switch n.Encap {
	case "vlan":
		v, err := allocVLAN(tx, n.PktTag, sc)
		if err != nil {
			return err
		}
		ns.PktTag = v
	case "vxlan":
		vni, local, err := allocVXLAN(tx, n.PktTag, sc)
		if err != nil {
			return err
		}
		ns.PktTag, ns.ExtPktTag = local, vni
	}
	if err := tx.Put(model.NetStateKey(id), &ns); err != nil {
		return err
	}
	if err := indexNetwork(tx, &ns, true); err != nil {
		return err
	}
	n.LinkSets = model.NetworkLinkSets{} // (derived when read: links.go)
	n.Links = model.NetworkLinks{Tenant: model.Link{ObjType: model.TypeTenant, ObjKey: n.TenantName}}
	return tx.Put(model.ModelKey(model.TypeNetwork, n.Key), n)
}

func removeNetwork(m *Master, tx *state.Tx, n *model.Network) error {
	id := model.NetworkID(n.NetworkName, n.TenantName)
	epgs, err := listT[model.EndpointGroup](tx, model.ModelKey(model.TypeEndpointGroup, n.TenantName+":"))
	if err != nil {
		return err
	}
	for _, e := range epgs {
		if e.NetworkName == n.NetworkName {
			return conflict("network %s has endpoint group %s: delete it first", n.Key, e.Key)
		}
	}
	svcs, err := listT[model.ServiceLB](tx, model.ModelKey(model.TypeServiceLB, n.TenantName+":"))
	if err != nil {
		return err
	}
	for _, s := range svcs {
		if s.NetworkName == n.NetworkName {
			return conflict("network %s has service %s: delete it first", n.Key, s.Key)
		}
	}
	ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(id))
	if err != nil {
		return err
	}
	if found && ns.Owns(n.NetworkName, n.TenantName) { // never another network's state
		if ns.EpCount > 0 {
			return conflict("network %s still has %d endpoint(s)", n.Key, ns.EpCount)
		}
		eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix+id+"-")
		if err != nil {
			return err
		}
		for _, ep := range eps {
			if ep.NetID == id {
				return conflict("network %s still has endpoint %s", n.Key, ep.ID)
			}
		}
		switch ns.PktTagType {
		case "vlan":
			err = releaseVLAN(tx, ns.PktTag)
		case "vxlan":
			err = releaseVXLAN(tx, ns.ExtPktTag, ns.PktTag)
		}
		if err != nil {
			return err
		}
		tx.Delete(model.NetStateKey(id))
		if err := indexNetwork(tx, ns, false); err != nil {
			return err
		}
		tx.DeletePrefix(model.PendingPrefix + id + "/") // (its addresses' pending records)
		tx.DeletePrefix(netAllocRoot(id))
	}
	tx.Delete(model.ModelKey(model.TypeNetwork, n.Key))
	return nil
}

func endpointOper(ep *model.CfgEndpointState, portName string) model.EndpointOper {
	o := model.EndpointOper{Key: ep.ID, ContainerID: ep.ContainerID, ContainerName: ep.EPCommonName,
		EndpointGroupId: ep.EndpointGroupID, EndpointGroupKey: ep.EndpointGroupKey, EndpointID: ep.EndpointID,
		HomingHost: ep.HomingHost, IntfName: ep.IntfName, MacAddress: ep.MacAddress, Network: ep.NetID,
		ServiceName: ep.ServiceName, VtepIP: ep.VtepIP, IpAddress: []string{ep.IPAddress, ep.IPv6Address}}
	if len(ep.Labels) > 0 {
		o.Labels = fmt.Sprintf("%s", ep.Labels)
	}
	if portName != "" {
		o.VirtualPort = "v" + portName
	}
	return o
}

func networkOper(tx *state.Tx, ns *model.CfgNetworkState, eps []*model.CfgEndpointState) (model.NetworkOper, error) {
	o := model.NetworkOper{AllocatedAddressesCount: ns.EpAddrCount, ExternalPktTag: ns.ExtPktTag,
		NetworkTag: ns.NetworkTag, NumEndpoints: ns.EpCount, PktTag: ns.PktTag}
	if sn, err := subnetOfState(ns); err == nil {
		first, last, _ := strings.Cut(ns.IPAddrRange, "-")
		fa, _ := parseIP4("", first)
		la, _ := parseIP4("", last)
		outside := func(off uint) bool {
			a := sn.base + uint32(off)
			return off == 0 || off == uint(sn.size()-1) || a < fa || a > la
		}
		nm, err := netAllocMap(tx, ns)
		if err != nil {
			return o, err
		}
		bits, err := nm.Bits()
		if err != nil {
			return o, err
		}
		o.AllocatedIPAddresses = formatRanges(sn, bits, true, outside)
		o.AvailableIPAddresses = formatRanges(sn, bits, false, outside)
	}
	for _, ep := range eps {
		if ep.NetID == ns.ID {
			o.Endpoints = append(o.Endpoints, endpointOper(ep, ""))
		}
	}
	return o, nil
}

// claimNetwork confines agents bound to a host (auth.HostPrefix) to the networks they
// created (Docker's network create on that host): such an agent may create a network, and
// change or delete only one whose creator record (model.NetCreatorKey) names it; found by
// review, a bound agent deleted another tenant's empty network. Posting a network again
// as it is is answered as for anyone (409: every host's Docker creates it). Other callers
// are not confined; a deleted network's record goes with it.
func claimNetwork(ctx context.Context, tx *state.Tx, key string, obj, old *model.Network) error {
	id, _ := auth.FromContext(ctx)
	_, bound := id.BoundHost()
	remove := obj == nil
	var creator string
	had, err := tx.Get(model.NetCreatorKey(key), &creator)
	if err != nil {
		return err
	}
	switch {
	case bound && old != nil && !remove && sameNetwork(obj, old):
	case bound && old != nil && (!had || creator != id.Name):
		return errf(http.StatusForbidden, "network %s: the agent %q may change only networks it created", key, id.Name)
	case remove && had:
		tx.Delete(model.NetCreatorKey(key))
	case bound && old == nil:
		if err := agentNetworkFields(obj); err != nil {
			return err
		}
		h, _ := id.BoundHost()
		if err := inScope(tx, h, "tenantName", obj.TenantName, obj.NetworkName); err != nil {
			return err
		}
		return tx.Put(model.NetCreatorKey(key), id.Name)
	case old == nil && had:
		tx.Delete(model.NetCreatorKey(key)) // (a stale record: the new network is not its)
	}
	return nil
}

// agentNetworkFields refuses (403, naming the field) what a network created by a bound
// agent may not choose: it may set what Docker's driver sends (pkg/dockerplugin, sync.go
// adopt: names, subnet, gateway, VXLAN encapsulation of a data network), nothing else. A
// pkt-tag picks a VLAN or VNI, a VLAN network reaches the physical fabric (and in routing
// mode its subnet blocks every tenant's VLAN networks), an infra network is the hosts' own,
// a cfgdTag names the network to the fabric (ACI), IPv6 and NAT settings are the admin's:
// an admin or tenant-admin creates such networks (issue 34: a bound agent created a VLAN
// network on any tag it named). Quota is charged as for any create.
func agentNetworkFields(n *model.Network) error {
	refuse := func(field, why string) error {
		return errf(http.StatusForbidden, "%s: a network created by a host's agent %s; an admin or the tenant's admin creates such networks", field, why)
	}
	switch {
	case n.PktTag != 0:
		return refuse("pktTag", "takes its tag from the pool")
	case n.Encap != "vxlan":
		return refuse("encap", "is a VXLAN network")
	case n.NwType != "data":
		return refuse("nwType", "is a data network")
	case n.CfgdTag != "":
		return refuse("cfgdTag", "has no configured tag")
	case n.Ipv6Subnet != "" || n.Ipv6Gateway != "":
		return refuse("ipv6Subnet", "has no IPv6 subnet")
	case n.NatDisabled:
		return refuse("natDisabled", "keeps egress NAT")
	}
	return nil
}

// sameNetwork says whether a and b hold the same network (server-owned links aside).
func sameNetwork(a, b *model.Network) bool {
	x, y := *a, *b
	x.LinkSets, y.LinkSets = model.NetworkLinkSets{}, model.NetworkLinkSets{}
	x.Links, y.Links = model.NetworkLinks{}, model.NetworkLinks{}
	return reflect.DeepEqual(x, y)
}
