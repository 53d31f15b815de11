package master

// This file: address allocation, IPv4 (the lowest free address of the network or its
// EPG pool) and IPv6 (the next host id after the last one, contiv.md 3.6).

import (
	"fmt"
	"math/big"
	"net/netip"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// allocIPv4 reserves preferred (if given) or allocates the lowest free address, from the
// EPG's pool when epg has one. It updates ns (and epg) in memory and buffers chunked map
// changes in tx; callers write ns and epg.
func allocIPv4(tx *state.Tx, ns *model.CfgNetworkState, epg *model.EndpointGroupState, preferred string) (string, error) {
	sn, err := subnetOfState(ns)
	if err != nil {
		return "", err
	}
	nm, err := netAllocMap(tx, ns)
	if err != nil {
		return "", err
	}
	var pm addrMap
	if epg != nil && epg.IPPool != "" {
		if pm, err = epgAllocMap(tx, ns, epg); err != nil {
			return "", err
		}
	}
	if preferred != "" {
		a, err := parseIP4("IPv4Address", strings.SplitN(preferred, "/", 2)[0])
		if err != nil {
			return "", err
		}
		if !sn.contains(a) {
			return "", unproc("address %s is not inside subnet %s/%d of network %s", addr4(a), ns.SubnetIP, ns.SubnetLen, ns.ID)
		}
		off := uint(a - sn.base)
		if off == 0 || off == uint(sn.size()-1) {
			return "", unproc("address %s is the network or broadcast address of %s/%d", addr4(a), ns.SubnetIP, ns.SubnetLen)
		}
		if err := nm.Set(off); err != nil {
			return "", err
		}
		if pm != nil {
			if first, last, err := parsePool(epg.IPPool); err == nil && a >= first && a <= last {
				if err := pm.Set(off); err != nil {
					return "", err
				}
			}
		}
		return addr4(a).String(), nil
	}
	if pm != nil {
		off, ok, err := allocLowest(pm)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", conflict("auto allocation failed - address exhaustion in pool %s of endpoint group %s", epg.IPPool, epg.ID)
		}
		if err := nm.Set(off); err != nil {
			return "", err
		}
		ns.EpAddrCount++
		return addr4(sn.base + uint32(off)).String(), nil
	}
	off, ok, err := allocLowest(nm)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", conflict("auto allocation failed - address exhaustion in subnet %s/%d", ns.SubnetIP, ns.SubnetLen)
	}
	ns.EpAddrCount++
	return addr4(sn.base + uint32(off)).String(), nil
}

// releaseIPv4 frees ip in ns, or in the pool of the EPG (among epgs) that contains it. The
// network/broadcast/gateway addresses and addresses outside the range are never freed.
// It returns the EPG state it changed, if any.
func releaseIPv4(tx *state.Tx, ns *model.CfgNetworkState, epgs []*model.EndpointGroupState, ip string) (*model.EndpointGroupState, error) {
	sn, err := subnetOfState(ns)
	if err != nil {
		return nil, err
	}
	a, err := parseIP4("IPv4Address", strings.SplitN(ip, "/", 2)[0])
	if err != nil {
		return nil, err
	}
	if !sn.contains(a) {
		return nil, unproc("address %s is not inside subnet %s/%d of network %s", addr4(a), ns.SubnetIP, ns.SubnetLen, ns.ID)
	}
	off := uint(a - sn.base)
	for _, g := range epgs {
		if g.IPPool == "" || g.NetworkName != ns.NetworkName || g.TenantName != ns.Tenant {
			continue
		}
		first, last, err := parsePool(g.IPPool)
		if err != nil || a < first || a > last {
			continue
		}
		pm, err := epgAllocMap(tx, ns, g)
		if err != nil {
			return nil, err
		}
		if used, err := pm.Test(off); err != nil {
			return nil, err
		} else if used {
			if err := pm.Clear(off); err != nil {
				return nil, err
			}
			if ns.EpAddrCount > 0 {
				ns.EpAddrCount--
			}
		}
		return g, nil
	}
	if off == 0 || off == uint(sn.size()-1) || ns.Gateway == addr4(a).String() {
		return nil, nil
	}
	if first, last, ok := strings.Cut(ns.IPAddrRange, "-"); ok {
		f, _ := parseIP4("", first)
		l, _ := parseIP4("", last)
		if a < f || a > l {
			return nil, nil
		}
	}
	nm, err := netAllocMap(tx, ns)
	if err != nil {
		return nil, err
	}
	if used, err := nm.Test(off); err != nil {
		return nil, err
	} else if used {
		if err := nm.Clear(off); err != nil {
			return nil, err
		}
		if ns.EpAddrCount > 0 {
			ns.EpAddrCount--
		}
	}
	return nil, nil
}

// networkEPGs lists the EPG states of one network.
func networkEPGs(tx *state.Tx, ns *model.CfgNetworkState) ([]*model.EndpointGroupState, error) {
	all, err := listT[model.EndpointGroupState](tx, model.EPGStatePrefix)
	if err != nil {
		return nil, err
	}
	var out []*model.EndpointGroupState
	for _, g := range all {
		if g.NetworkName == ns.NetworkName && g.TenantName == ns.Tenant {
			out = append(out, g)
		}
	}
	return out, nil
}

// resolveNetworkID maps a plugin NetworkID ("net.tenant", "net:epg.tenant", optionally with
// a docker "|pool" suffix) to the network state and the EPG state (nil if none).
func resolveNetworkID(tx *state.Tx, id string) (*model.CfgNetworkState, *model.EndpointGroupState, error) {
	id, _, _ = strings.Cut(id, "|")
	if netName, rest, ok := strings.Cut(id, ":"); ok {
		for i := 0; i < len(rest); i++ {
			if rest[i] != '.' {
				continue
			}
			group, tenant := rest[:i], rest[i+1:]
			ns, found, err := tenantNetwork(tx, netName, tenant)
			if err != nil {
				return nil, nil, err
			}
			if !found {
				continue
			}
			g, found, err := getT[model.EndpointGroupState](tx, model.EPGStateKey(model.EPGStateID(group, tenant)))
			if err != nil {
				return nil, nil, err
			}
			if found {
				return ns, g, nil
			}
		}
		return nil, nil, unproc("NetworkID: no network/endpoint group matches %q", id)
	}
	ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(id))
	if err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, unproc("NetworkID: network %q does not exist", id)
	}
	return ns, nil, nil
}

// networkByPool finds the network whose subnet is pool ("10.1.1.0/24" or "10.1.1.0/24:tenant").
func networkByPool(tx *state.Tx, pool string) (*model.CfgNetworkState, error) {
	p, tenant, _ := strings.Cut(pool, ":")
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return nil, err
	}
	for _, n := range nets {
		if fmt.Sprintf("%s/%d", n.SubnetIP, n.SubnetLen) == p && (tenant == "" || n.Tenant == tenant) {
			return n, nil
		}
	}
	return nil, unproc("AddressPool: no network has subnet %q", pool)
}

// checkPreferred refuses a requested address ip of network ns that somebody holds: the
// gateway, an endpoint, a service VIP, or (unless adoptPending) any allocated address.
// adoptPending is for createEndpoint after Docker's IPAM step: the address was allocated
// by /plugin/allocAddress and no endpoint holds it yet. field names the request field.
func checkPreferred(tx *state.Tx, ns *model.CfgNetworkState, field, ip string, adoptPending bool) error {
	ip = strings.SplitN(ip, "/", 2)[0]
	sn, err := subnetOfState(ns)
	if err != nil {
		return err
	}
	a, err := parseIP4(field, ip)
	if err != nil {
		return err
	}
	if !sn.contains(a) {
		return unproc("%s: address %s is not inside subnet %s/%d of network %s", field, ip, ns.SubnetIP, ns.SubnetLen, ns.ID)
	}
	if ns.Gateway == addr4(a).String() {
		return conflict("%s: %s is the gateway of network %s", field, ip, ns.ID)
	}
	used, err := allocatedIn(tx, ns, field, ip)
	if err != nil {
		return err
	}
	// Every VIP is allocated in its network's map: a free address needs no scan of the
	// services (a list of all of them, per request, made creating the 10,000th cost
	// 10,000 decodes).
	if holder, err := addressHolder(tx, ns, addr4(a).String(), used); err != nil {
		return err
	} else if holder != "" {
		return conflict("%s: %s is already used by %s", field, ip, holder)
	}
	if adoptPending {
		return nil
	}
	if used {
		return conflict("%s: %s is already allocated in network %s", field, ip, ns.ID)
	}
	return nil
}

// allocatedIn says whether IPv4 address ip (field names it) is allocated in network ns's
// map; an address outside its subnet is not.
func allocatedIn(tx *state.Tx, ns *model.CfgNetworkState, field, ip string) (bool, error) {
	sn, err := subnetOfState(ns)
	if err != nil {
		return false, err
	}
	a, err := parseIP4(field, strings.SplitN(ip, "/", 2)[0])
	if err != nil {
		return false, err
	}
	if !sn.contains(a) {
		return false, nil
	}
	nm, err := netAllocMap(tx, ns)
	if err != nil {
		return false, err
	}
	return nm.Test(uint(a - sn.base))
}

// addressHolder names the endpoint or service of network ns that holds ip, or "";
// services are looked at only when ip is allocated in the network's map (allocated).
func addressHolder(tx *state.Tx, ns *model.CfgNetworkState, ip string, allocated bool) (string, error) {
	eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix+ns.ID+"-")
	if err != nil {
		return "", err
	}
	for _, ep := range eps {
		if ep.NetID == ns.ID && ep.IPAddress == ip {
			return "endpoint " + ep.ID, nil
		}
	}
	if !allocated {
		return "", nil
	}
	svcs, err := listT[model.CfgServiceLBState](tx, model.SvcLBStatePrefix)
	if err != nil {
		return "", err
	}
	for _, s := range svcs {
		if s.Tenant == ns.Tenant && s.Network == ns.NetworkName && s.IPAddress == ip {
			return "the VIP of service " + s.ID, nil
		}
	}
	return "", nil
}

// allocIPv6 allocates the next host id after the last one, skipping used ids and wrapping.
func allocIPv6(ns *model.CfgNetworkState) (string, error) {
	sn, err := parseSubnet6("ipv6Subnet", ns.IPv6Subnet+"/"+fmt.Sprint(ns.IPv6SubnetLen))
	if err != nil {
		return "", err
	}
	hb := sn.hostBits()
	total := new(big.Int).Lsh(big.NewInt(1), uint(hb)) // ids 1..total-1
	maxIDs := new(big.Int).Sub(total, big.NewInt(1))
	if big.NewInt(int64(len(ns.IPv6AllocMap))).Cmp(maxIDs) >= 0 {
		return "", conflict("ipv6 auto allocation failed - address exhaustion in subnet %s/%d", ns.IPv6Subnet, ns.IPv6SubnetLen)
	}
	cur := big.NewInt(0)
	if ns.IPv6LastHost != "" {
		if a, err := netip.ParseAddr(ns.IPv6LastHost); err == nil {
			b := a.As16()
			cur.SetBytes(b[:])
		}
	}
	one := big.NewInt(1)
	for i := 0; i <= len(ns.IPv6AllocMap)+1; i++ {
		cur.Add(cur, one)
		if cur.Cmp(total) >= 0 {
			cur.SetInt64(1)
		}
		var hbuf [16]byte
		cur.FillBytes(hbuf[:])
		id := netip.AddrFrom16(hbuf).String()
		if ns.IPv6AllocMap[id] {
			continue
		}
		if ns.IPv6AllocMap == nil {
			ns.IPv6AllocMap = map[string]bool{}
		}
		ns.IPv6AllocMap[id] = true
		ns.IPv6LastHost = id
		return sn.addr(cur).String(), nil
	}
	return "", conflict("ipv6 auto allocation failed - address exhaustion in subnet %s/%d", ns.IPv6Subnet, ns.IPv6SubnetLen)
}

// reserveIPv6 marks a given address as used; it must be inside the network's v6 subnet and
// not in use (the gateway's is marked when the network is made).
func reserveIPv6(ns *model.CfgNetworkState, addr string) error {
	sn, err := parseSubnet6("ipv6Subnet", ns.IPv6Subnet+"/"+fmt.Sprint(ns.IPv6SubnetLen))
	if err != nil {
		return err
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is6() || !sn.prefix.Contains(a) {
		return unproc("IPv6Address: %q is not inside %s", addr, sn.prefix)
	}
	if ns.IPv6AllocMap[sn.hostID(a)] {
		// Held by an endpoint or the gateway: a second holder would share its traffic,
		// and releasing either would free the other's address.
		return conflict("IPv6Address: %s is already in use", addr)
	}
	if ns.IPv6AllocMap == nil {
		ns.IPv6AllocMap = map[string]bool{}
	}
	ns.IPv6AllocMap[sn.hostID(a)] = true
	return nil
}

// releaseIPv6 frees addr's host id (computed against the IPv6 subnet, unlike Contiv).
func releaseIPv6(ns *model.CfgNetworkState, addr string) {
	if ns.IPv6Subnet == "" || addr == "" {
		return
	}
	sn, err := parseSubnet6("ipv6Subnet", ns.IPv6Subnet+"/"+fmt.Sprint(ns.IPv6SubnetLen))
	if err != nil {
		return
	}
	a, err := netip.ParseAddr(strings.SplitN(addr, "/", 2)[0])
	if err != nil || !sn.prefix.Contains(a) {
		return
	}
	if gw, err := netip.ParseAddr(ns.IPv6Gateway); err == nil && gw == a {
		return
	}
	delete(ns.IPv6AllocMap, sn.hostID(a))
	if len(ns.IPv6AllocMap) == 0 {
		ns.IPv6AllocMap = nil
	}
}

// allocLowest sets and returns the lowest clear bit.
func allocLowest(m addrMap) (uint, bool, error) {
	off, ok, err := m.NextClear(0)
	if err != nil || !ok {
		return 0, false, err
	}
	return off, true, m.Set(off)
}
