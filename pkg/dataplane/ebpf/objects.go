package ebpf

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/containerend"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// mapPut writes one entry; a full map becomes an ErrMapFull error and is counted.
func (d *Driver) mapPut(name string, m *ebpf.Map, key, val any) error {
	err := m.Update(key, val, ebpf.UpdateAny)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.E2BIG) || errors.Is(err, syscall.ENOSPC) {
		d.countFull(name)
		d.log.Error("bpf map full", "map", name, "max_entries", m.MaxEntries())
		return fmt.Errorf("ebpf: map %s is full (%d entries; raise MapEntries): %w", name, m.MaxEntries(), ErrMapFull)
	}
	return fmt.Errorf("ebpf: update map %s: %w", name, err)
}

func mapDel(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// endpointKey is the cb_endpoints key of address ip on network nr (local or remote).
func endpointKey(nr netRec, ip netip.Addr) contivbpfCbEpKey {
	return contivbpfCbEpKey{Net: nr.key, Ip: ip4(ip)}
}

// ---- networks ----

// UpsertNetwork implements dataplane.Driver.
func (d *Driver) UpsertNetwork(ctx context.Context, n dataplane.Network) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertNetwork(n)
}

func (d *Driver) upsertNetwork(n dataplane.Network) error {
	if err := n.Validate(); err != nil {
		return err
	}
	if !n.Subnet.Addr().Is4() {
		return fmt.Errorf("network %s: subnet %v is not IPv4", n.ID, n.Subnet)
	}
	n.MTU = containerend.MTU(n)
	key := netKey(n)
	vrf := vrfOf(n.ID)
	for id, r := range d.eps.networks {
		if id != n.ID && r.key == key {
			return fmt.Errorf("network %s: %s tag %d already used by network %s", n.ID, n.Encap, n.Tag, id)
		}
		if r.vrf == vrf && tenantOf(id) != tenantOf(n.ID) {
			return fmt.Errorf("network %s: tenant %q hashes to the routing domain of tenant %q", n.ID, tenantOf(n.ID), tenantOf(id))
		}
	}
	old, had := d.eps.networks[n.ID]
	if had && old.key != key && d.networkInUse(n.ID) {
		return fmt.Errorf("network %s: cannot change encap/tag while endpoints use it", n.ID)
	}
	v := networkValue(n, vrf)
	v.Generation = d.gen
	if err := d.mapPut(contivbpfMapCbNetworks, d.objs.CbNetworks, key, &v); err != nil {
		return fmt.Errorf("network %s: %w", n.ID, err)
	}
	if had && old.key != key {
		if err := mapDel(d.objs.CbNetworks, old.key); err != nil {
			return fmt.Errorf("network %s: delete old entry: %w", n.ID, err)
		}
	}
	d.eps.networks[n.ID] = netRec{net: n, key: key, vrf: vrf}
	d.eps.publishNetNames()
	if err := d.syncTenantNet(vrf, n.Subnet); err != nil {
		return fmt.Errorf("network %s: %w", n.ID, err)
	}
	if had && (old.vrf != vrf || old.net.Subnet.Masked() != n.Subnet.Masked()) {
		if err := d.syncTenantNet(old.vrf, old.net.Subnet); err != nil {
			return fmt.Errorf("network %s: %w", n.ID, err)
		}
	}
	return nil
}

// syncTenantNet makes cb_tenant_nets' entry for subnet in routing domain vrf name a
// network of this host that has it, or removes it when none does: the node port stage
// refuses clients from the wire claiming such an address (bpf/lib/nodeport.h).
func (d *Driver) syncTenantNet(vrf uint32, subnet netip.Prefix) error {
	m := subnet.Masked()
	k := contivbpfCbTnetKey{Prefixlen: 32 + uint32(m.Bits()), Zone: vrf, Addr: ip4(m.Addr())}
	for _, nr := range d.eps.networks {
		if nr.vrf == vrf && nr.net.Subnet.Masked() == m {
			return d.mapPut(contivbpfMapCbTenantNets, d.objs.CbTenantNets, &k, &contivbpfCbTnet{Net: nr.key, Generation: d.gen})
		}
	}
	if err := mapDel(d.objs.CbTenantNets, &k); err != nil {
		return fmt.Errorf("delete %s entry %v: %w", contivbpfMapCbTenantNets, m, err)
	}
	return nil
}

// networkValue is the cb_networks entry of n in routing domain vrf (generation 0).
func networkValue(n dataplane.Network, vrf uint32) contivbpfCbNetwork {
	m := n.Subnet.Masked()
	v := contivbpfCbNetwork{
		Subnet: ip4(m.Addr()),
		Mask:   binaryNative(maskOf(m.Bits())),
		Tag:    n.Tag,
		Mtu:    uint16(n.MTU),
		Encap:  uint8(contivbpfCbEncapCB_ENCAP_VXLAN),
		Vrf:    vrf,
	}
	if n.Encap == dataplane.EncapVLAN {
		v.Encap = uint8(contivbpfCbEncapCB_ENCAP_VLAN)
	}
	if n.Gateway.IsValid() {
		v.Gateway = ip4(n.Gateway)
	}
	if !n.NoSNAT {
		v.Flags |= uint8(contivbpfCbNetFlagsCB_NET_SNAT)
	}
	return v
}

// putRoute records (routing mode) which network of the tenant holds ip.
func (d *Driver) putRoute(nr netRec, ip netip.Addr) error {
	if !d.routing() {
		return nil
	}
	k := contivbpfCbRouteKey{Vrf: nr.vrf, Ip: ip4(ip)}
	var cur contivbpfCbRoute
	if err := d.objs.CbRoutes.Lookup(&k, &cur); err == nil && cur.Net != nr.key && cur.Generation == d.gen {
		return fmt.Errorf("ip %v is already routed to another network of tenant %q", ip, tenantOf(nr.net.ID))
	}
	return d.mapPut(contivbpfMapCbRoutes, d.objs.CbRoutes, &k, &contivbpfCbRoute{Net: nr.key, Generation: d.gen})
}

// dropRoute removes ip's route if it points at network key net.
func (d *Driver) dropRoute(net uint32, ip uint32) error {
	if !d.routing() {
		return nil
	}
	for _, nr := range d.eps.networks {
		if nr.key != net {
			continue
		}
		k := contivbpfCbRouteKey{Vrf: nr.vrf, Ip: ip}
		var cur contivbpfCbRoute
		if err := d.objs.CbRoutes.Lookup(&k, &cur); err == nil && cur.Net == net {
			return mapDel(d.objs.CbRoutes, &k)
		}
	}
	return nil
}

func binaryNative(mask net.IPMask) uint32 {
	var b [4]byte
	copy(b[:], mask)
	return binary.NativeEndian.Uint32(b[:])
}

func (d *Driver) networkInUse(id string) bool {
	for _, r := range d.eps.endpoints {
		if nr, ok := d.eps.networks[id]; ok && r.key.Net == nr.key {
			return true
		}
	}
	for _, r := range d.eps.remotes {
		if r.ep.NetworkID == id {
			return true
		}
	}
	return false
}

// DeleteNetwork implements dataplane.Driver. A network still used by endpoints is refused.
func (d *Driver) DeleteNetwork(ctx context.Context, id string) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deleteNetwork(id)
}

func (d *Driver) deleteNetwork(id string) error {
	r, ok := d.eps.networks[id]
	if !ok {
		return nil
	}
	if d.networkInUse(id) {
		return fmt.Errorf("network %s: still has endpoints", id)
	}
	if err := mapDel(d.objs.CbNetworks, r.key); err != nil {
		return fmt.Errorf("network %s: delete map entry: %w", id, err)
	}
	delete(d.eps.networks, id)
	d.eps.publishNetNames()
	if err := d.syncTenantNet(r.vrf, r.net.Subnet); err != nil {
		return fmt.Errorf("network %s: %w", id, err)
	}
	return nil
}

// ---- peers ----

// UpsertPeer implements dataplane.Driver.
func (d *Driver) UpsertPeer(ctx context.Context, p dataplane.Peer) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertPeer(p)
}

func (d *Driver) upsertPeer(p dataplane.Peer) error {
	if p.Host == "" {
		return fmt.Errorf("peer: host is empty")
	}
	if !p.VTEP.Is4() {
		return fmt.Errorf("peer %s: vtep %v is not IPv4", p.Host, p.VTEP)
	}
	if err := d.mapPut(contivbpfMapCbPeers, d.objs.CbPeers, ip4(p.VTEP), &contivbpfCbPeer{Generation: d.gen}); err != nil {
		return fmt.Errorf("peer %s: %w", p.Host, err)
	}
	if old, ok := d.eps.peers[p.Host]; ok && old != p.VTEP {
		if err := d.dropPeerKey(p.Host); err != nil {
			d.eps.peers[p.Host] = old
			return err
		}
	}
	d.eps.peers[p.Host] = p.VTEP
	return nil
}

// dropPeerKey deletes a VTEP entry unless another host still uses that address.
func (d *Driver) dropPeerKey(host string) error {
	a := d.eps.peers[host]
	for h, v := range d.eps.peers {
		if h != host && v == a {
			return nil
		}
	}
	if err := mapDel(d.objs.CbPeers, ip4(a)); err != nil {
		return fmt.Errorf("peer %s: delete map entry: %w", host, err)
	}
	return nil
}

// DeletePeer implements dataplane.Driver.
func (d *Driver) DeletePeer(ctx context.Context, host string) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deletePeer(host)
}

func (d *Driver) deletePeer(host string) error {
	if _, ok := d.eps.peers[host]; !ok {
		return nil
	}
	if err := d.dropPeerKey(host); err != nil {
		return err
	}
	delete(d.eps.peers, host)
	return nil
}

// ---- remote endpoints ----

// UpsertRemoteEndpoint implements dataplane.Driver.
func (d *Driver) UpsertRemoteEndpoint(ctx context.Context, ep dataplane.RemoteEndpoint) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertRemote(ep)
}

func (d *Driver) upsertRemote(ep dataplane.RemoteEndpoint) (retErr error) {
	nr, err := d.checkRemote(ep)
	if err != nil {
		return err
	}
	key := endpointKey(nr, ep.IP)
	var cur contivbpfCbEndpoint
	err = d.objs.CbEndpoints.Lookup(&key, &cur)
	if err == nil && cur.Flags&uint32(contivbpfCbEpFlagsCB_EP_LOCAL) != 0 {
		return fmt.Errorf("remote endpoint %s: ip %v is a local endpoint of network %s", ep.ID, ep.IP, ep.NetworkID)
	}
	if err != nil || cur.Epg != ep.EPGID {
		// Its flows are judged again with its new group (stamps.go): as for a local one. A
		// new holder of the address too: an earlier holder's entries (deleted, not swept
		// yet) must not carry on under its verdicts.
		if err := d.announce(moveStamps(nr.vrf, ep.EPGID)); err != nil {
			return d.published(fmt.Errorf("remote endpoint %s: %w", ep.ID, err))
		}
		defer func() { retErr = d.published(retErr) }()
	}
	v := contivbpfCbEndpoint{Epg: ep.EPGID, Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE), Generation: d.gen}
	if ep.VTEP.IsValid() { // VXLAN always; a VLAN remote may have none (unused there)
		v.Vtep = ip4(ep.VTEP)
	}
	copy(v.Mac[:], ep.MAC)
	if err := d.putRoute(nr, ep.IP); err != nil {
		return fmt.Errorf("remote endpoint %s: %w", ep.ID, err)
	}
	if err := d.mapPut(contivbpfMapCbEndpoints, d.objs.CbEndpoints, &key, &v); err != nil {
		return fmt.Errorf("remote endpoint %s: %w", ep.ID, err)
	}
	if old, ok := d.eps.remotes[ep.ID]; ok && old.key != key {
		if err := mapDel(d.objs.CbEndpoints, &old.key); err != nil {
			return fmt.Errorf("remote endpoint %s: delete old entry: %w", ep.ID, err)
		}
	}
	d.setRemote(ep.ID, remoteRec{ep: ep, key: key})
	return nil
}

// checkRemote validates a remote endpoint against its network's encapsulation
// (dataplane.RemoteEndpoint.Validate): a VXLAN remote needs a VTEP, a VLAN remote does not.
func (d *Driver) checkRemote(ep dataplane.RemoteEndpoint) (netRec, error) {
	nr, ok := d.eps.networks[ep.NetworkID]
	if !ok {
		if err := ep.Validate(""); err != nil {
			return netRec{}, err
		}
		return netRec{}, fmt.Errorf("remote endpoint %s: network %q is not known", ep.ID, ep.NetworkID)
	}
	if err := ep.Validate(nr.net.Encap); err != nil {
		return netRec{}, err
	}
	return nr, nil
}

// DeleteRemoteEndpoint implements dataplane.Driver.
func (d *Driver) DeleteRemoteEndpoint(ctx context.Context, id string) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deleteRemote(id)
}

func (d *Driver) deleteRemote(id string) error {
	r, ok := d.eps.remotes[id]
	if !ok {
		return nil
	}
	var cur contivbpfCbEndpoint
	// The entry is this record's unless another record holds the address now: a local
	// endpoint, or a remote one under another id (the endpoint moved between hosts).
	if err := d.objs.CbEndpoints.Lookup(&r.key, &cur); err == nil && cur.Flags&uint32(contivbpfCbEpFlagsCB_EP_REMOTE) != 0 &&
		d.addrHolders(r.key) <= 1 {
		if err := mapDel(d.objs.CbEndpoints, &r.key); err != nil {
			return fmt.Errorf("remote endpoint %s: delete map entry: %w", id, err)
		}
		if err := d.dropRoute(r.key.Net, r.key.Ip); err != nil {
			return fmt.Errorf("remote endpoint %s: delete route: %w", id, err)
		}
	}
	d.dropRemote(id)
	d.flushCT(r.key)
	return nil
}

// flushCT queues the conntrack entries of an endpoint address for deletion, once its
// record is dropped: not while another record (local or remote) holds the address, whose
// flows they are now (a group change moved the policy epoch, so they are judged again).
func (d *Driver) flushCT(k contivbpfCbEpKey) {
	if d.ctgc == nil || d.addrHolders(k) > 0 {
		return
	}
	if nr, ok := d.networkByKey(k.Net); ok {
		d.ctgc.flush(nr.vrf, addrFrom(k.Ip))
	}
}

// ---- local endpoints ----

// indexKey is the endpoint's id as stored in the veth alias after the pin tag
// (endpointAlias; IFLA_IFALIAS holds 255 bytes; ids over 120 bytes are hashed).
func indexKey(id string) string {
	if len(aliasPrefix)+len(id) <= 120 {
		return id
	}
	h := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(h[:16])
}

// UpsertEndpoint implements dataplane.Driver: veth pair, container-side configuration,
// map entries and the tcx attachment. On failure everything this call created is removed.
func (d *Driver) UpsertEndpoint(ctx context.Context, ep dataplane.Endpoint) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertEndpoint(ep)
}

func (d *Driver) upsertEndpoint(ep dataplane.Endpoint) (retErr error) {
	if err := ep.Validate(); err != nil {
		return err
	}
	clock := d.stepClock()
	nr, ok := d.eps.networks[ep.NetworkID]
	if !ok {
		return fmt.Errorf("endpoint %s: network %q is not known", ep.ID, ep.NetworkID)
	}
	if !nr.net.Subnet.Contains(ep.IP) {
		return fmt.Errorf("endpoint %s: ip %v outside subnet %v", ep.ID, ep.IP, nr.net.Subnet)
	}
	ik := indexKey(ep.ID)
	key := endpointKey(nr, ep.IP)
	alias := d.endpointAlias(ik)
	legacy := aliasPrefix + ik // veths of builds before pin-scoped aliases
	// A legacy alias names no agent: the veth is this one's with evidence in its own state
	// (owner.go), or when no program judges it (an orphan: its pins lost); one another
	// agent on this host judges would be lost to it (set down, a second program attached,
	// then swept or torn down by the wrong agent).
	ours := func(l netlink.Link) bool {
		if l.Type() != "veth" {
			return false
		}
		if l.Attrs().Alias == alias {
			return true
		}
		if l.Attrs().Alias != legacy {
			return false
		}
		_, own := d.ownedEndpointLink(l)
		return own || d.unjudged(l.Attrs().Index)
	}
	// Every check comes before an existing endpoint is replaced: a refused update leaves
	// the old endpoint (veth, map entries, link) forwarding.
	var cur contivbpfCbEndpoint
	// A new holder of the address stamps its group too: the flows of an earlier holder
	// (deleted, their entries not swept yet) must not carry on under its verdicts.
	epgChanged := true
	if err := d.objs.CbEndpoints.Lookup(&key, &cur); err == nil {
		epgChanged = cur.Epg != ep.EPGID
		if cur.Flags&uint32(contivbpfCbEpFlagsCB_EP_REMOTE) != 0 {
			return fmt.Errorf("endpoint %s: ip %v is a remote endpoint of network %s", ep.ID, ep.IP, ep.NetworkID)
		}
		if owner, ok := d.endpointByIfindex(int(cur.Ifindex)); ok && owner != ik {
			return fmt.Errorf("endpoint %s: ip %v already used by local endpoint %s", ep.ID, ep.IP, d.eps.endpoints[owner].id)
		}
		// Otherwise the entry is ours or stale (its veth vanished with its container).
	}
	host, err := d.nl.LinkByName(ep.HostIfName)
	if err == nil && !ours(host) {
		return fmt.Errorf("endpoint %s: interface %s exists and is not this endpoint's veth", ep.ID, ep.HostIfName)
	}
	if old, ok := d.eps.endpoints[ik]; ok && (old.hostIf != ep.HostIfName || old.key != key) {
		if err := d.deleteEndpoint(ik); err != nil {
			return fmt.Errorf("endpoint %s: replace: %w", ep.ID, err)
		}
		host, err = d.nl.LinkByName(ep.HostIfName)
	}

	created := false
	if err == nil {
		if !ours(host) {
			return fmt.Errorf("endpoint %s: interface %s exists and is not this endpoint's veth", ep.ID, ep.HostIfName)
		}
		if host.Attrs().Alias != alias {
			if err := d.nl.LinkSetAlias(host, alias); err != nil {
				return fmt.Errorf("endpoint %s: scope alias of %s: %w", ep.ID, ep.HostIfName, err)
			}
		}
	} else {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("endpoint %s: look up %s: %w", ep.ID, ep.HostIfName, err)
		}
		if host, err = d.createVeth(ep, nr.net.MTU, alias); err != nil {
			return fmt.Errorf("endpoint %s: %w", ep.ID, err)
		}
		created = true
	}
	ifindex := host.Attrs().Index
	// The host end is up only while its program is attached (the container's packets
	// would otherwise enter the host's stack unjudged): a new one is created down, and
	// one kept without a known attachment (adopted without its pin) goes down first.
	if a, ok := d.links[ep.HostIfName]; !created && (!ok || a.ifindex != ifindex) {
		if err := d.nl.LinkSetDown(host); err != nil {
			return fmt.Errorf("endpoint %s: set %s down until its program is attached: %w", ep.ID, ep.HostIfName, err)
		}
	}
	clock.mark(StepVeth)
	defer func() {
		if retErr == nil {
			return
		}
		if created {
			_ = d.unplug(ep.HostIfName, host)
			_ = d.ifaces().del(uint32(ifindex))
			_ = mapDel(d.objs.CbEndpoints, &key)
			_ = d.dropRoute(key.Net, key.Ip)
		}
	}()
	if err := containerend.Configure(d.nl, ep, nr.net); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	clock.mark(StepContainer)
	if host.Attrs().MTU != nr.net.MTU {
		if err := d.nl.LinkSetMTU(host, nr.net.MTU); err != nil {
			return fmt.Errorf("endpoint %s: set mtu of %s: %w", ep.ID, ep.HostIfName, err)
		}
	}
	clock.mark(StepHostLink)

	// Counters first (a kept slot keeps its counts; a new one starts at zero), then the
	// lookups the datapath uses.
	slot := uint32(0)
	if r, ok := d.eps.endpoints[ik]; ok {
		slot = r.slot
	}
	if slot == 0 {
		s, err := d.allocSlot(ik)
		if err != nil {
			return fmt.Errorf("endpoint %s: %w", ep.ID, err)
		}
		slot = s
		defer func() {
			if retErr != nil {
				d.freeSlot(slot)
			}
		}()
	}
	if epgChanged {
		// Its flows are judged again with its new group: that group (or the zone, for no
		// group) stamped before its entries move, the clock published after (stamps.go)
		// and before the netlink work below, which holds no other concern's change.
		if err := d.announce(moveStamps(nr.vrf, ep.EPGID)); err != nil {
			return d.published(fmt.Errorf("endpoint %s: %w", ep.ID, err))
		}
		err = d.published(d.putEndpointEntries(ep, nr, key, ifindex, slot))
	} else {
		err = d.putEndpointEntries(ep, nr, key, ifindex, slot)
	}
	if err != nil {
		return err
	}
	clock.mark(StepMaps)
	if err := d.ensureTCX(ep.HostIfName, ifindex, d.objs.CbFromContainer, contivbpfProgCbFromContainer); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	if err := d.nl.LinkSetUp(host); err != nil {
		return fmt.Errorf("endpoint %s: set %s up: %w", ep.ID, ep.HostIfName, err)
	}
	clock.mark(StepTCX)
	d.setEndpoint(ik, epRec{id: ep.ID, hostIf: ep.HostIfName, ifindex: ifindex, key: key, slot: slot})
	if err := d.ensureHostRoute(ik, ep.IP, ep.MAC, ep.HostIfName, ifindex); err != nil {
		d.dropEndpoint(ik)
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	return nil
}

// putEndpointEntries writes local endpoint ep's map entries: its QoS buckets before the
// entries that turn them on (qos.go), its route, its interface entry and cb_endpoints.
func (d *Driver) putEndpointEntries(ep dataplane.Endpoint, nr netRec, key contivbpfCbEpKey, ifindex int, slot uint32) error {
	if err := d.putQoS(slot, ep.QoS); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	v := contivbpfCbEndpoint{Ifindex: uint32(ifindex), Epg: ep.EPGID, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL), Generation: d.gen, Slot: slot}
	if ep.QoS.IngressRate != 0 {
		v.Flags |= uint32(contivbpfCbEpFlagsCB_EP_QOS_IN)
	}
	copy(v.Mac[:], ep.MAC)
	ifc := contivbpfCbIface{Net: nr.key, Ip: key.Ip, Epg: ep.EPGID, Generation: d.gen, Slot: slot, Vrf: nr.vrf, Qos: qosWord(ep.QoS)}
	copy(ifc.Mac[:], ep.MAC)
	if err := d.putRoute(nr, ep.IP); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	if err := d.ifaces().put(uint32(ifindex), &ifc, d.mapPut); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	if err := d.mapPut(contivbpfMapCbEndpoints, d.objs.CbEndpoints, &key, &v); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	return nil
}

// unjudged reports whether device ifindex has no tcx ingress program at all (a failed
// query: it might have one).
func (d *Driver) unjudged(ifindex int) bool {
	var n int
	err := nsexec.Run(d.cfg.NetNS, func() error {
		r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			n = len(r.Programs)
		}
		return err
	})
	return err == nil && n == 0
}

// unplug deletes an endpoint's host veth l (nil: none of ours is left) and only then
// detaches ifname's program: the container never sends through an open hook. A veth that
// cannot be deleted keeps its program.
func (d *Driver) unplug(ifname string, l netlink.Link) error {
	if l != nil {
		if err := d.nl.LinkDel(l); err != nil && !errors.Is(err, syscall.ENODEV) {
			return fmt.Errorf("delete veth %s: %w", ifname, err)
		}
	}
	d.detachTCX(ifname)
	return nil
}

func (d *Driver) endpointByIfindex(ifindex int) (string, bool) {
	for ik, r := range d.eps.endpoints {
		if r.ifindex == ifindex {
			return ik, true
		}
	}
	return "", false
}

// createVeth creates the pair with the container end already in the endpoint's namespace
// (or in the host namespace when ep.NetNS is empty), the host end's ifindex below the
// interface array's end where one is free (addVeth).
func (d *Driver) createVeth(ep dataplane.Endpoint, mtu int, alias string) (netlink.Link, error) {
	// One RTM_NEWLINK: both ends named, sized, placed and the peer's MAC set; the host end
	// stays down until its program is attached. The kernel ignores IFLA_IFALIAS on create,
	// so the alias is a second request.
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: ep.HostIfName, MTU: mtu},
		PeerName:         ep.IfName,
		PeerHardwareAddr: ep.MAC,
		PeerMTU:          uint32(mtu),
	}
	if ep.NetNS != "" {
		cns, err := netns.GetFromPath(ep.NetNS)
		if err != nil {
			return nil, fmt.Errorf("open container netns %s: %w", ep.NetNS, err)
		}
		defer cns.Close()
		veth.PeerNamespace = netlink.NsFd(int(cns))
	}
	host, err := d.addVeth(veth) // its ifindex below cb_iface_direct's end where it can
	if err != nil {
		return nil, err
	}
	if err := d.nl.LinkSetAlias(host, alias); err != nil {
		_ = d.nl.LinkDel(host)
		return nil, fmt.Errorf("set alias of %s: %w", ep.HostIfName, err)
	}
	return host, nil
}

// DeleteEndpoint implements dataplane.Driver: map entries, tcx link and veth pair.
func (d *Driver) DeleteEndpoint(ctx context.Context, id string) error {
	defer d.lock(cEps, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deleteEndpoint(indexKey(id))
}

func (d *Driver) deleteEndpoint(ik string) error {
	r, ok := d.eps.endpoints[ik]
	if !ok {
		return nil
	}
	var errs []error
	var cur contivbpfCbEndpoint
	if err := d.objs.CbEndpoints.Lookup(&r.key, &cur); err == nil && int(cur.Ifindex) == r.ifindex {
		if err := mapDel(d.objs.CbEndpoints, &r.key); err != nil {
			errs = append(errs, fmt.Errorf("delete endpoint entry: %w", err))
		}
		if err := d.dropRoute(r.key.Net, r.key.Ip); err != nil {
			errs = append(errs, fmt.Errorf("delete route: %w", err))
		}
	}
	if err := d.ifaces().del(uint32(r.ifindex)); err != nil {
		errs = append(errs, fmt.Errorf("delete iface entry: %w", err))
	}
	if err := d.dropHostRoute(ik, addrFrom(r.key.Ip)); err != nil {
		errs = append(errs, err)
	}
	var own netlink.Link
	if l, err := d.nl.LinkByName(r.hostIf); err == nil && (l.Attrs().Alias == d.endpointAlias(ik) || l.Attrs().Alias == aliasPrefix+ik) {
		own = l
	}
	if err := d.unplug(r.hostIf, own); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("endpoint %s: %w", r.id, err)
	}
	d.freeSlot(r.slot)
	d.dropEndpoint(ik)
	d.flushCT(r.key)
	return nil
}
