package ebpf

// The host path and egress NAT (bpf/lib/nat.h, docs/host-routing.md): which addresses are
// the host's (cb_host_ips, kept current from the host's address list), how the host reaches
// its local endpoints (a /32 route and a permanent neighbour entry per endpoint veth, and
// cb_host_routes), and which device and address egress
// NAT uses (cb_config, cb_from_uplink on that device).

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Egress NAT defaults: the port range lies above Linux's default ephemeral range
// (32768-60999), so the host's own connections never pick a port egress flows use.
const (
	DefaultEgressPortMin = 61000
	DefaultEgressPortMax = 65535
	// rtProtoContivBPF marks the host routes the driver installs (`ip route show proto 203`).
	rtProtoContivBPF = 203
	egressLinkPrefix = "egress_"
	// underlayLinkPrefix names cb_from_underlay's link on the VTEP's device when that is
	// not the egress device (resolveUnderlay).
	underlayLinkPrefix = "underlay_"
	sockLBLink         = "cgroup_connect4"
)

// egress is the resolved egress NAT configuration (zero: egress off).
type egress struct {
	ip      netip.Addr
	ifname  string
	ifindex int
	portMin uint16
	portMax uint16
}

// resolveEgress finds the egress device: Options.EgressIf, or the device holding the
// NAT address (Options.SNATIP, default the VTEP). An address given explicitly that no
// device holds is an error; a VTEP that no device holds (tests, a VTEP behind NAT) turns
// egress off with a warning.
func (d *Driver) resolveEgress() (egress, error) {
	c := d.cfg
	e := egress{ip: c.SNATIP, portMin: c.EgressPortMin, portMax: c.EgressPortMax}
	explicit := e.ip.IsValid()
	if !explicit {
		e.ip = c.VTEP
	}
	if e.portMin == 0 && e.portMax == 0 {
		e.portMin, e.portMax = DefaultEgressPortMin, DefaultEgressPortMax
	}
	if e.portMin == 0 || e.portMax < e.portMin {
		return egress{}, fmt.Errorf("ebpf: egress ports %d-%d: want 1 <= min <= max", e.portMin, e.portMax)
	}
	if !e.ip.IsValid() {
		return egress{}, nil
	}
	if !e.ip.Is4() {
		return egress{}, fmt.Errorf("ebpf: snat ip %v is not IPv4", e.ip)
	}
	addrs, err := d.nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return egress{}, fmt.Errorf("ebpf: list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == e.ip {
			e.ifindex = a.LinkIndex
		}
	}
	if c.EgressIf != "" {
		l, err := d.nl.LinkByName(c.EgressIf)
		if err != nil {
			return egress{}, fmt.Errorf("ebpf: egress device %s: %w", c.EgressIf, err)
		}
		e.ifindex = l.Attrs().Index
	}
	if e.ifindex == 0 {
		if explicit {
			return egress{}, fmt.Errorf("ebpf: snat ip %v: no device of this host holds it", e.ip)
		}
		d.log.Warn("egress NAT off: no device holds the VTEP address", "vtep", e.ip)
		return egress{}, nil
	}
	l, err := d.nl.LinkByIndex(e.ifindex)
	if err != nil {
		return egress{}, fmt.Errorf("ebpf: egress device %d: %w", e.ifindex, err)
	}
	e.ifname = l.Attrs().Name
	if vx := c.VXLANPort; vx >= int(e.portMin) && vx <= int(e.portMax) {
		// cb_overlay_in hands every UDP packet to this port to the vxlan device.
		return egress{}, fmt.Errorf("ebpf: egress ports %d-%d include the vxlan port %d", e.portMin, e.portMax, vx)
	}
	d.warnPortOverlap(e)
	return e, nil
}

// warnPortOverlap logs when the host's ephemeral port range reaches into the egress NAT
// range (the host's connections and egress flows could then pick the same port).
func (d *Driver) warnPortOverlap(e egress) {
	var raw []byte
	_ = nsexec.Run(d.cfg.NetNS, func() error {
		var err error
		raw, err = os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		return err
	})
	f := strings.Fields(string(raw))
	if len(f) != 2 {
		return
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 == nil && err2 == nil && hi >= int(e.portMin) && lo <= int(e.portMax) {
		d.log.Warn("the host's ephemeral ports overlap the egress NAT ports", "ip_local_port_range", fmt.Sprintf("%d-%d", lo, hi),
			"egress_ports", fmt.Sprintf("%d-%d", e.portMin, e.portMax))
	}
}

// underlay is the device holding the VTEP, where the overlay's packets arrive from other
// hosts, when cb_from_uplink must sit on it and the egress device is another (zero: none).
type underlay struct {
	ifname  string
	ifindex int
}

// resolveUnderlay finds the device holding the VTEP when it is not the egress device:
// cb_from_underlay drops there what the wire may not bring in (cb_underlay_drop: the deny
// list's sources, and with Options.Encrypted the clear overlay). With encryption on a
// VTEP no device of the wire holds is an error (the clear overlay could not be refused);
// off, there is then nothing to put there (zero), as when the egress device holds it.
func (d *Driver) resolveUnderlay() (underlay, error) {
	dev, err := d.vtepDevice("encrypted overlay")
	if err != nil {
		if d.cfg.Encrypted {
			return underlay{}, err
		}
		return underlay{}, nil
	}
	if dev.ifindex == d.egress.ifindex {
		return underlay{}, nil
	}
	return dev, nil
}

// vtepDevice is the device holding the VTEP, where the overlay's packets from other hosts
// arrive, for what (the feature that must sit there, named in the errors): never
// loopback or a dummy device (a routed VTEP), which no packet from the underlay enters.
func (d *Driver) vtepDevice(what string) (underlay, error) {
	if !d.cfg.VTEP.Is4() {
		return underlay{}, fmt.Errorf("ebpf: %s: vtep %v is not IPv4", what, d.cfg.VTEP)
	}
	addrs, err := d.nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return underlay{}, fmt.Errorf("ebpf: list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); !ok || ip != d.cfg.VTEP {
			continue
		}
		l, err := d.nl.LinkByIndex(a.LinkIndex)
		if err != nil {
			return underlay{}, fmt.Errorf("ebpf: vtep device %d: %w", a.LinkIndex, err)
		}
		// A VTEP on a device no wire reaches (loopback, dummy: a routed VTEP) would put
		// the check where no peer's packet arrives.
		if l.Attrs().Flags&net.FlagLoopback != 0 || l.Type() == "dummy" {
			return underlay{}, fmt.Errorf("ebpf: %s: the vtep %v is on %s (%s), which no packet from the underlay enters, so packets from other hosts could not be checked there", what, d.cfg.VTEP, l.Attrs().Name, l.Type())
		}
		return underlay{ifname: l.Attrs().Name, ifindex: a.LinkIndex}, nil
	}
	return underlay{}, fmt.Errorf("ebpf: %s: no device of this host holds the vtep %v, so packets from other hosts could not be checked there", what, d.cfg.VTEP)
}

// attachEgress puts cb_from_uplink on the egress device, and cb_from_underlay on the
// VTEP's device when that is another one (resolveUnderlay).
func (d *Driver) attachEgress() error {
	if d.egress.ifindex != 0 {
		if err := d.ensureTCX(egressLinkPrefix+d.egress.ifname, d.egress.ifindex, d.objs.CbFromUplink, contivbpfProgCbFromUplink); err != nil {
			return err
		}
	}
	if d.underlay.ifindex == 0 {
		return nil
	}
	return d.ensureTCX(underlayLinkPrefix+d.underlay.ifname, d.underlay.ifindex, d.objs.CbFromUnderlay, contivbpfProgCbFromUnderlay)
}

// syncHostIPs makes cb_host_ips the host's IPv4 addresses (loopback excluded).
func (d *Driver) syncHostIPs() error {
	if d.objs.CbHostIps == nil {
		return nil
	}
	addrs, err := d.nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("ebpf: list host addresses: %w", err)
	}
	want := map[uint32]bool{}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || ip.IsLoopback() || ip.IsUnspecified() {
			continue
		}
		k := ip4(ip)
		want[k] = true
		if err := d.mapPut(contivbpfMapCbHostIps, d.objs.CbHostIps, k, &contivbpfCbHostIp{Generation: d.gen}); err != nil {
			return fmt.Errorf("ebpf: host address %v: %w", ip, err)
		}
	}
	if err := deleteUnwanted[uint32, contivbpfCbHostIp](d.objs.CbHostIps, want); err != nil {
		return fmt.Errorf("ebpf: %s: %w", contivbpfMapCbHostIps, err)
	}
	return nil
}

// watchHostIPs keeps cb_host_ips current while the driver runs: every address change in
// the host namespace triggers a resync. It stops when stop is closed.
func (d *Driver) watchHostIPs(stop chan struct{}) error {
	ch := make(chan netlink.AddrUpdate, 64)
	opts := netlink.AddrSubscribeOptions{ErrorCallback: func(err error) {
		select {
		case <-stop: // closing
			return
		default:
		}
		// The subscription ends with its error (e.g. ENOBUFS after a burst): resync and
		// subscribe again.
		d.log.Warn("host address watch failed; resubscribing", "err", err)
		go func() {
			select {
			case <-stop:
			case <-time.After(time.Second):
				defer d.lock(cEps, 0)()
				if d.closed {
					return
				}
				if err := d.syncHostIPs(); err != nil {
					d.log.Warn("host addresses", "err", err)
				}
				if err := d.watchHostIPs(stop); err != nil {
					d.log.Warn("host address watch", "err", err)
				}
			}
		}()
	}}
	if d.hostNS >= 0 {
		ns := netns.NsHandle(d.hostNS)
		opts.Namespace = &ns
	}
	if err := netlink.AddrSubscribeWithOptions(ch, stop, opts); err != nil {
		return fmt.Errorf("ebpf: watch host addresses: %w", err)
	}
	go func() {
		for range ch {
			// Coalesce a burst of updates into one resync.
			for len(ch) > 0 {
				<-ch
			}
			unlock := d.lock(cEps, 0)
			if !d.closed {
				if err := d.syncHostIPs(); err != nil {
					d.log.Warn("host addresses", "err", err)
				}
			}
			unlock()
		}
	}()
	return nil
}

// ensureHostRoute lets the host reach local endpoint ik (address ip, MAC mac, host veth
// ifname/ifindex): a /32 route and a permanent neighbour entry on the veth, and the
// cb_host_routes entry (the datapath hands a packet to the host only from the veth the
// host's route for its source leads to). An address already routed to another live local
// endpoint (overlapping tenants) stays with it; this endpoint then does not reach the host
// (drop_host_no_route, logged here).
func (d *Driver) ensureHostRoute(ik string, ip netip.Addr, mac net.HardwareAddr, ifname string, ifindex int) error {
	// Every endpoint gets its neighbour entry (the DNS responder answers on the veth a
	// query came in on, also to an endpoint that does not hold the route).
	n := &netlink.Neigh{LinkIndex: ifindex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := d.nl.NeighSet(n); err != nil {
		return fmt.Errorf("host neighbour %v on %s: %w", ip, ifname, err)
	}
	if owner, ok := d.eps.hostRoutes[ip]; ok && owner != ik {
		if _, live := d.eps.endpoints[owner]; live {
			d.log.Warn("host route: address already routed to another local endpoint", "ip", ip, "endpoint", ik, "owner", owner)
			return nil
		}
	}
	if why := d.hostRouteForbidden(ip, ifindex); why != "" {
		d.log.Warn("host route refused: the host keeps its own path to this address", "ip", ip, "endpoint", ik, "why", why)
		return nil
	}
	r := &netlink.Route{LinkIndex: ifindex, Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Scope: netlink.SCOPE_LINK, Protocol: rtProtoContivBPF}
	if err := d.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("host route to %v via %s: %w", ip, ifname, err)
	}
	if err := d.mapPut(contivbpfMapCbHostRoutes, d.objs.CbHostRoutes, ip4(ip), &contivbpfCbHostRoute{Ifindex: uint32(ifindex), Generation: d.gen}); err != nil {
		return fmt.Errorf("host route to %v: %w", ip, err)
	}
	d.eps.hostRoutes[ip] = ik
	return nil
}

// hostRouteForbidden says why the host must not route ip to an endpoint ("" = it may): a
// tenant chooses its subnets, and a /32 route would divert the host's own traffic to an
// address it reaches otherwise: one of its own addresses, a peer's VTEP, or an address on a
// network the host is attached to (the underlay: etcd, netmaster, its resolvers).
func (d *Driver) hostRouteForbidden(ip netip.Addr, ifindex int) string {
	var v contivbpfCbHostIp
	if d.objs.CbHostIps != nil && d.objs.CbHostIps.Lookup(ip4(ip), &v) == nil {
		return "an address of this host"
	}
	for host, vtep := range d.eps.peers {
		if vtep == ip {
			return "the VTEP of host " + host
		}
	}
	routes, err := d.nl.RouteGet(ip.AsSlice())
	if err != nil || len(routes) == 0 {
		return ""
	}
	r := routes[0]
	if r.LinkIndex == ifindex || r.Gw != nil {
		return "" // already ours, or only the default route's way
	}
	if _, own := d.endpointByIfindex(r.LinkIndex); own {
		return ""
	}
	if l, err := d.nl.LinkByIndex(r.LinkIndex); err == nil {
		return "on the network of " + l.Attrs().Name
	}
	return "on a network the host is attached to"
}

// dropHostRoute forgets ip's host route if endpoint ik holds it (the kernel removes the
// route itself with the veth).
func (d *Driver) dropHostRoute(ik string, ip netip.Addr) error {
	if d.eps.hostRoutes[ip] != ik {
		return nil
	}
	delete(d.eps.hostRoutes, ip)
	if err := mapDel(d.objs.CbHostRoutes, ip4(ip)); err != nil {
		return fmt.Errorf("delete host route entry %v: %w", ip, err)
	}
	return nil
}

// cgroupRoot returns the cgroup v2 directory the socket LB attaches to ("" = none).
func (d *Driver) cgroupRoot() string {
	switch d.cfg.CgroupPath {
	case "off":
		return ""
	case "":
		for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
			var st unix.Statfs_t
			if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
				return p
			}
		}
		d.log.Warn("no cgroup v2 mount: the host's own processes cannot reach service VIPs and node ports")
		return ""
	}
	return d.cfg.CgroupPath
}

// attachSockLB attaches cb_sock_connect4 to the cgroup root (through a link pinned under
// PinRoot/links, updated in place on restart). The program acts only for sockets of this
// host's namespace (its cookie in cb_config), so several agents on one machine each serve
// their own.
func (d *Driver) attachSockLB() error {
	root := d.cgroupRoot()
	if root == "" || d.objs.CbSockConnect4 == nil {
		return nil
	}
	err := nsexec.Run(d.cfg.NetNS, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		d.netnsCookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return fmt.Errorf("ebpf: host namespace cookie: %w", err)
	}
	path := filepath.Join(d.cfg.PinRoot, linksDir, sockLBLink)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		if err := l.Update(d.objs.CbSockConnect4); err != nil {
			l.Close()
			return fmt.Errorf("ebpf: update socket LB link: %w", err)
		}
		d.setLink(&attachment{ifname: sockLBLink, program: contivbpfProgCbSockConnect4, link: l, hook: "cgroup-connect4"})
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ebpf: load pinned link %s: %w", path, err)
	} else {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: ebpf.AttachCGroupInet4Connect, Program: d.objs.CbSockConnect4})
		if err != nil {
			return fmt.Errorf("ebpf: attach socket LB to cgroup %s: %w", root, err)
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("ebpf: pin socket LB link: %w", err)
		}
		d.setLink(&attachment{ifname: sockLBLink, program: contivbpfProgCbSockConnect4, link: l, hook: "cgroup-connect4"})
	}
	d.sockLB = root
	return d.writeConfig()
}

// syncHostSvcs makes cb_host_svcs the VIP:port/proto keys exactly one tenant's services
// have (the host belongs to no tenant: an address two tenants use answers neither).
func (d *Driver) syncHostSvcs() error {
	if d.objs.CbHostSvcs == nil {
		return nil
	}
	want := map[contivbpfCbHostSvcKey]bool{}
	for hk, zs := range d.svc.hostSvcIdx {
		if len(zs) != 1 {
			continue
		}
		want[hk] = true
		if err := d.putHostSvc(hk); err != nil {
			return err
		}
	}
	if err := deleteUnwanted[contivbpfCbHostSvcKey, contivbpfCbHostSvc](d.objs.CbHostSvcs, want); err != nil {
		return fmt.Errorf("ebpf: %s: %w", contivbpfMapCbHostSvcs, err)
	}
	return nil
}

// updateHostSvcs rewrites the cb_host_svcs entries of the service ports in keys (those a
// service change touched) from the index: only those, so a change costs its own ports.
func (d *Driver) updateHostSvcs(keys ...[]contivbpfCbSvcKey) error {
	if d.objs.CbHostSvcs == nil {
		return nil
	}
	for _, ks := range keys {
		for _, k := range ks {
			hk := contivbpfCbHostSvcKey{Vip: k.Vip, Port: k.Port, Proto: k.Proto}
			if len(d.svc.hostSvcIdx[hk]) == 1 {
				if err := d.putHostSvc(hk); err != nil {
					return err
				}
				continue
			}
			if err := mapDel(d.objs.CbHostSvcs, &hk); err != nil {
				return fmt.Errorf("ebpf: host service %v:%d: %w", addrFrom(hk.Vip), hport(hk.Port), err)
			}
		}
	}
	return nil
}

func (d *Driver) putHostSvc(hk contivbpfCbHostSvcKey) error {
	for z := range d.svc.hostSvcIdx[hk] {
		if err := d.mapPut(contivbpfMapCbHostSvcs, d.objs.CbHostSvcs, &hk, &contivbpfCbHostSvc{Zone: z, Generation: d.gen}); err != nil {
			return fmt.Errorf("ebpf: host service %v:%d: %w", addrFrom(hk.Vip), hport(hk.Port), err)
		}
	}
	return nil
}

// indexSvcKeys counts (delta ±1) a service's ports in the per-zone host-service index.
func (d *Driver) indexSvcKeys(keys []contivbpfCbSvcKey, delta int) {
	for _, k := range keys {
		hk := contivbpfCbHostSvcKey{Vip: k.Vip, Port: k.Port, Proto: k.Proto}
		zs := d.svc.hostSvcIdx[hk]
		if zs == nil {
			zs = map[uint32]int{}
			d.svc.hostSvcIdx[hk] = zs
		}
		if zs[k.Zone] += delta; zs[k.Zone] <= 0 {
			delete(zs, k.Zone)
			if len(zs) == 0 {
				delete(d.svc.hostSvcIdx, hk)
			}
		}
	}
}

// deleteUnwanted deletes every entry of m whose key want does not hold.
func deleteUnwanted[K comparable, V any](m *ebpf.Map, want map[K]bool) error {
	var k K
	var v V
	var stale []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	for i := range stale {
		if err := mapDel(m, &stale[i]); err != nil {
			return fmt.Errorf("delete stale entry: %w", err)
		}
	}
	return nil
}
