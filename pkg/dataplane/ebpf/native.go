package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// routerIPLabel is the address label the router-ip gets on the uplink ("<ifname>:cb"), so
// a restarted driver finds the address it added (and only that one) to remove it again.
func routerIPLabel(ifname string) (string, error) {
	if len(ifname)+3 > 15 {
		return "", fmt.Errorf("ebpf: uplink name %q is too long for the router-ip's label %q (at most 12 characters; an unlabelled address could not be told from the operator's)", ifname, ifname+":cb")
	}
	return ifname + ":cb", nil
}

// SetNativeRouting programs the BGP side of the datapath (docs/bgp.md): the router-ip on
// the VLAN uplink and the learned routes in cb_bgp_routes; with a router-ip, routing-mode
// VLAN networks are routed natively (untagged, to the learned next hop) instead of
// 802.1Q-tagged. A zero NativeRouting turns it off. A refused call (bad route, router-ip
// conflict) changes nothing; a map write failing midway leaves withdrawn routes removed
// and is retried by the caller.
func (d *Driver) SetNativeRouting(ctx context.Context, nr dataplane.NativeRouting) error {
	if err := nr.Validate(); err != nil {
		return err
	}
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	if nr.RouterIP.IsValid() {
		if !d.routing() {
			return errors.New("ebpf: native routing (BGP) needs --fwdmode routing")
		}
		if d.upIndex == 0 {
			return errors.New("ebpf: native routing (BGP) needs the uplink its neighbour is on (--vlan-if)")
		}
	}
	want := map[contivbpfCbBgpKey]bool{}
	for _, r := range nr.Routes {
		k := contivbpfCbBgpKey{Prefixlen: uint32(r.Prefix.Bits()), Addr: ip4(r.Prefix.Addr())}
		want[k] = true
	}
	if uint32(len(want)) > d.objs.CbBgpRoutes.MaxEntries() {
		return fmt.Errorf("ebpf: %d learned routes exceed %s (%d entries): %w", len(want), contivbpfMapCbBgpRoutes, d.objs.CbBgpRoutes.MaxEntries(), ErrMapFull)
	}
	if err := d.setRouterIP(nr.RouterIP); err != nil {
		return err
	}
	// Withdrawn routes first: a full trie refuses even updates of existing keys on older
	// kernels, so room is made before anything is written.
	if err := deleteUnwanted[contivbpfCbBgpKey, contivbpfCbBgpRoute](d.objs.CbBgpRoutes, want); err != nil {
		return fmt.Errorf("ebpf: %s: %w", contivbpfMapCbBgpRoutes, err)
	}
	for _, r := range nr.Routes {
		k := contivbpfCbBgpKey{Prefixlen: uint32(r.Prefix.Bits()), Addr: ip4(r.Prefix.Addr())}
		v := contivbpfCbBgpRoute{Nexthop: ip4(r.NextHop), Ifindex: uint32(d.upIndex), Generation: d.gen}
		var old contivbpfCbBgpRoute
		if d.objs.CbBgpRoutes.Lookup(&k, &old) == nil && old.Nexthop == v.Nexthop && old.Ifindex == v.Ifindex {
			continue // unchanged
		}
		if err := d.mapPut(contivbpfMapCbBgpRoutes, d.objs.CbBgpRoutes, &k, &v); err != nil {
			return fmt.Errorf("ebpf: route %v: %w", r.Prefix, err)
		}
	}
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	d.bgpOn = nr.RouterIP.IsValid()
	return d.writeConfigLocked()
}

// setRouterIP makes p the labelled router address on the uplink (removing an earlier one
// of this driver's); an address the operator configured there already is used as it is.
func (d *Driver) setRouterIP(p netip.Prefix) error {
	if d.upIndex == 0 {
		return nil
	}
	up, err := d.nl.LinkByIndex(d.upIndex)
	if err != nil {
		return fmt.Errorf("ebpf: uplink %s: %w", d.cfg.VLANIf, err)
	}
	label, err := routerIPLabel(up.Attrs().Name)
	if err != nil {
		if !p.IsValid() {
			return nil // nothing of ours can be there
		}
		return err
	}
	addrs, err := d.nl.AddrList(up, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("ebpf: addresses of %s: %w", up.Attrs().Name, err)
	}
	have := false
	for _, a := range addrs {
		ap, ok := netip.AddrFromSlice(a.IP.To4())
		ones, _ := a.Mask.Size()
		if ok && p.IsValid() && ap == p.Addr() && ones == p.Bits() {
			have = true
			continue
		}
		if a.Label == label {
			if err := d.nl.AddrDel(up, &a); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
				return fmt.Errorf("ebpf: remove old router-ip %v from %s: %w", a.IPNet, up.Attrs().Name, err)
			}
		}
	}
	if !p.IsValid() || have {
		return nil
	}
	// Checked when the address is added (not on every route update: a tenant network
	// created later must not freeze route programming).
	if why := d.routerIPConflict(p, up.Attrs().Index); why != "" {
		return fmt.Errorf("ebpf: router-ip %v: %s", p, why)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}, Label: label}
	if err := d.nl.AddrAdd(up, a); err != nil {
		return fmt.Errorf("ebpf: add router-ip %v to %s: %w", p, up.Attrs().Name, err)
	}
	d.log.Info("router-ip added to the uplink", "ip", p, "uplink", up.Attrs().Name)
	return nil
}

// routerIPConflict says why p cannot be the router-ip ("" = it can): its network must not
// overlap an address of another of the host's links (the underlay, say: two connected
// routes for one subnet would break it) nor a tenant network's subnet.
func (d *Driver) routerIPConflict(p netip.Prefix, uplink int) string {
	if addrs, err := d.nl.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			ap, ok := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			if !ok || a.LinkIndex == uplink || ap.IsLoopback() {
				continue
			}
			if other := netip.PrefixFrom(ap, ones); other.Overlaps(p) {
				name := fmt.Sprintf("ifindex %d", a.LinkIndex)
				if l, err := d.nl.LinkByIndex(a.LinkIndex); err == nil {
					name = l.Attrs().Name
				}
				return fmt.Sprintf("overlaps %v on %s (another network of this host)", other, name)
			}
		}
	}
	for _, n := range d.eps.networks {
		if n.net.Subnet.Overlaps(p) {
			return fmt.Sprintf("overlaps network %s's subnet %v", n.net.ID, n.net.Subnet)
		}
	}
	return ""
}

// NativeRoutes lists cb_bgp_routes (netctl bpf routes, verify).
func (d *Driver) NativeRoutes() ([]dataplane.Route, error) {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return nil, err
	}
	var out []dataplane.Route
	var k contivbpfCbBgpKey
	var v contivbpfCbBgpRoute
	it := d.objs.CbBgpRoutes.Iterate()
	for it.Next(&k, &v) {
		out = append(out, dataplane.Route{Prefix: netip.PrefixFrom(addrFrom(k.Addr), int(k.Prefixlen)), NextHop: addrFrom(v.Nexthop)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("ebpf: read %s: %w", contivbpfMapCbBgpRoutes, err)
	}
	return out, nil
}
