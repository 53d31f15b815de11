package ebpf

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// enum cb_svc_flags (not in the generated bindings: no C type uses the enum).
const svcAffinity = 1

type svcRec struct {
	svc       dataplane.Service
	id        uint32
	zone      uint32 // the tenant's routing domain: only its networks see the VIP
	keys      []contivbpfCbSvcKey
	nBackends int
	members   []contivbpfCbMemberKey
	nodePorts []contivbpfCbNpKey
}

// newLBSeed is a random cb_lb_seed: the service flow hash is keyed per agent run, so a
// client cannot pick its backend by choosing its ports.
func newLBSeed() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return binary.LittleEndian.Uint32(b[:])
}

// flowHash is cb_flow_hash (lb.h): MurmurHash3 (x86_32) of a flow's three words as they
// lie in the packet (addresses and ports in network order, loaded little-endian), seeded
// with seed ^ proto. A backend index is flowHash % backends.
func flowHash(seed uint32, src, dst netip.AddrPort, proto uint8) uint32 {
	word := func(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	var ports [4]byte
	binary.BigEndian.PutUint16(ports[0:], src.Port())
	binary.BigEndian.PutUint16(ports[2:], dst.Port())
	h := seed ^ uint32(proto)
	for _, k := range []uint32{word(s4[:]), word(d4[:]), word(ports[:])} {
		k *= 0xcc9e2d51
		k = k<<15 | k>>17
		k *= 0x1b873593
		h ^= k
		h = h<<13 | h>>19
		h = h*5 + 0xe6546b64
	}
	h ^= 12
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// nodePortEntry is the cb_nodeports entry of service port p of the service at vip in
// zone (generation 0): its one encoding, for the apply and Verify.
func nodePortEntry(zone uint32, vip netip.Addr, p dataplane.ServicePort) (contivbpfCbNpKey, contivbpfCbNp) {
	return contivbpfCbNpKey{Port: nport(p.NodePort), Proto: p.Proto},
		contivbpfCbNp{Zone: zone, Vip: ip4(vip), SvcPort: nport(p.Port)}
}

// vipKey is the cb_vips key of a service address in zone.
func vipKey(zone uint32, vip netip.Addr) *contivbpfCbVipKey {
	return &contivbpfCbVipKey{Zone: zone, Vip: ip4(vip)}
}

// backendKey is the cb_backends key of backend index i of service slot id.
func backendKey(id, i uint32) *contivbpfCbBackendKey {
	return &contivbpfCbBackendKey{SvcId: id, Index: i}
}

// zoneOfTenant is the routing domain of a tenant (the same hash networks use).
func zoneOfTenant(tenant string) uint32 { return vrfOf("." + tenant) }

// UpsertService implements dataplane.Driver: VIP:port/proto entries, the backend list and
// the VIP for the ARP responder. Every backend must be a known (local or remote) endpoint:
// otherwise nothing changes and the error names it.
func (d *Driver) UpsertService(ctx context.Context, s dataplane.Service) error {
	defer d.lock(cSvc, cEps)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertService(s)
}

func tenantOf(networkID string) string {
	if i := strings.LastIndex(networkID, "."); i >= 0 {
		return networkID[i+1:]
	}
	return ""
}

// resolveBackend finds the network key of an endpoint address, preferring the service's
// tenant when several networks hold it (then the lowest key, for a stable answer).
func (d *Driver) resolveBackend(tenant string, ip netip.Addr) (uint32, bool) {
	var best uint32
	found, bestTenant := false, false
	for key := range d.eps.addrNets[ip4(ip)] {
		nr, _ := d.networkByKey(key)
		same := tenantOf(nr.net.ID) == tenant
		if !found || (same && !bestTenant) || (same == bestTenant && key < best) {
			best, found, bestTenant = key, true, same
		}
	}
	return best, found
}

// setEndpoint / dropEndpoint write d.endpoints (by index key), setRemote / dropRemote
// d.remotes (by id), keeping the address index (addrNets) in step.
func (d *Driver) setEndpoint(ik string, r epRec)   { putIndexed(d, d.eps.endpoints, ik, r) }
func (d *Driver) dropEndpoint(ik string)           { dropIndexed(d, d.eps.endpoints, ik) }
func (d *Driver) setRemote(id string, r remoteRec) { putIndexed(d, d.eps.remotes, id, r) }
func (d *Driver) dropRemote(id string)             { dropIndexed(d, d.eps.remotes, id) }

// addressed is an endpoint record with its datapath key.
type addressed interface{ epKey() contivbpfCbEpKey }

func (r epRec) epKey() contivbpfCbEpKey     { return r.key }
func (r remoteRec) epKey() contivbpfCbEpKey { return r.key }

func putIndexed[R addressed](d *Driver, m map[string]R, id string, r R) {
	dropIndexed(d, m, id)
	m[id] = r
	d.indexAddr(r.epKey(), 1)
}

func dropIndexed[R addressed](d *Driver, m map[string]R, id string) {
	if old, ok := m[id]; ok {
		d.indexAddr(old.epKey(), -1)
		delete(m, id)
	}
}

// addrHolders is how many endpoint records (local and remote) hold address k.
func (d *Driver) addrHolders(k contivbpfCbEpKey) int { return d.eps.addrNets[k.Ip][k.Net] }

func (d *Driver) indexAddr(k contivbpfCbEpKey, delta int) {
	if k.Ip == 0 {
		return // a record without its datapath entry (adopted veth not yet synced)
	}
	m := d.eps.addrNets[k.Ip]
	if m == nil {
		m = map[uint32]int{}
		d.eps.addrNets[k.Ip] = m
	}
	if m[k.Net] += delta; m[k.Net] <= 0 {
		delete(m, k.Net)
		if len(m) == 0 {
			delete(d.eps.addrNets, k.Ip)
		}
	}
}

func (d *Driver) upsertService(s dataplane.Service) (retErr error) {
	if err := s.Validate(); err != nil {
		return err
	}
	if len(s.Backends) > d.cfg.MapEntries {
		return fmt.Errorf("service %s: %d backends exceed MapEntries", s.ID, len(s.Backends))
	}
	tenant, _ := dataplane.ServiceTenant(s.ID)
	zone := zoneOfTenant(tenant)
	var keys []contivbpfCbSvcKey
	targets := map[contivbpfCbSvcKey]uint16{}
	for _, p := range s.Ports {
		tp := p.TargetPort
		if tp == 0 {
			tp = p.Port
		}
		k := contivbpfCbSvcKey{Zone: zone, Vip: ip4(s.VIP), Port: nport(p.Port), Proto: p.Proto}
		keys = append(keys, k)
		targets[k] = tp
	}
	nodePorts := map[contivbpfCbNpKey]contivbpfCbNp{}
	var npKeys []contivbpfCbNpKey
	for _, p := range s.Ports {
		if p.NodePort == 0 {
			continue
		}
		k, v := nodePortEntry(zone, s.VIP, p)
		v.Generation = d.gen
		nodePorts[k] = v
		npKeys = append(npKeys, k)
	}
	for _, k := range keys {
		if id, ok := d.svc.svcKeyOwner[k]; ok && id != s.ID {
			return fmt.Errorf("service %s: %v port %d/%d already used by service %s", s.ID, s.VIP, hport(k.Port), k.Proto, id)
		}
	}
	for _, k := range npKeys {
		if id, ok := d.svc.npOwner[k]; ok && id != s.ID {
			return fmt.Errorf("service %s: node port %d/%d already used by service %s", s.ID, hport(k.Port), k.Proto, id)
		}
	}
	// Backends take new flows (cb_backends); draining ones are members only: the flows
	// they have keep going, no new one is balanced to them.
	backends := make([]contivbpfCbBackend, 0, len(s.Backends))
	var draining []contivbpfCbBackend
	seen := map[netip.Addr]bool{}
	for i, b := range append(slices.Clone(s.Backends), s.Draining...) {
		if !b.Is4() {
			return fmt.Errorf("service %s: backend %v is not IPv4", s.ID, b)
		}
		if seen[b] {
			continue
		}
		seen[b] = true
		net, ok := d.resolveBackend(tenant, b)
		if !ok {
			return fmt.Errorf("service %s: backend %v is not a known endpoint", s.ID, b)
		}
		if nr, ok := d.networkByKey(net); !ok || tenantOf(nr.net.ID) != tenant {
			return fmt.Errorf("service %s: backend %v is not an endpoint of tenant %q", s.ID, b, tenant)
		}
		be := contivbpfCbBackend{Ip: ip4(b), Net: net, Generation: d.gen}
		if i < len(s.Backends) {
			backends = append(backends, be)
		} else {
			draining = append(draining, be)
		}
	}
	var flags uint16
	if s.AffinityClientIP {
		flags |= svcAffinity
	}

	old, had := d.svc.services[s.ID]
	id := old.id
	if !had {
		// After a restart the pinned entries keep their id: reuse it so live flows see
		// consistent backends while Sync rewrites them.
		var cur contivbpfCbSvc
		if err := d.objs.CbServices.Lookup(&keys[0], &cur); err == nil && !d.svcIDUsed(cur.Id) {
			id = cur.Id
		} else {
			d.svc.nextSvcID++
			id = d.svc.nextSvcID
		}
	}
	// Members and backends first (grown list), then the service entries (new count), then
	// shrink. A flow whose backend is no longer a member is re-balanced by the datapath.
	var members []contivbpfCbMemberKey
	for _, b := range append(slices.Clone(backends), draining...) {
		mk := contivbpfCbMemberKey{SvcId: id, Ip: b.Ip}
		members = append(members, mk)
		if err := d.mapPut(contivbpfMapCbMembers, d.objs.CbMembers, &mk, &contivbpfCbMember{Net: b.Net, Generation: d.gen}); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
	}
	if err := svcRevBump(d.objs.CbSvcRevs, id); err != nil {
		return fmt.Errorf("service %s: %w", s.ID, err)
	}
	for i := range backends {
		if err := d.mapPut(contivbpfMapCbBackends, d.objs.CbBackends, backendKey(id, uint32(i)), &backends[i]); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
	}
	// A new service port on an endpoint's own address (a VIP normally is none): the
	// datapath's fast path trusts a direct flow's entry of the current policy epoch to be
	// no service's (cb_fast_pass), so such flows are judged again on their next packet:
	// the endpoints' groups (or zone) stamped before the service is written (stamps.go).
	added := false
	for _, k := range keys {
		var cur contivbpfCbSvc
		added = added || d.objs.CbServices.Lookup(&k, &cur) != nil
	}
	if groups, zones := d.groupsAt(zone, s.VIP, added); len(groups)+len(zones) > 0 {
		if err := d.announce(groups, zones); err != nil {
			return d.published(fmt.Errorf("service %s: %w", s.ID, err))
		}
		defer func() { retErr = d.published(retErr) }()
	}
	for _, k := range keys {
		v := contivbpfCbSvc{Id: id, Count: uint32(len(backends)), TargetPort: nport(targets[k]), Flags: flags, Generation: d.gen}
		if err := d.mapPut(contivbpfMapCbServices, d.objs.CbServices, &k, &v); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
	}
	if err := d.mapPut(contivbpfMapCbVips, d.objs.CbVips, vipKey(zone, s.VIP), &contivbpfCbVip{Generation: d.gen}); err != nil {
		return fmt.Errorf("service %s: %w", s.ID, err)
	}
	for _, k := range npKeys {
		v := nodePorts[k]
		if err := d.mapPut(contivbpfMapCbNodeports, d.objs.CbNodeports, &k, &v); err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
	}
	rec := svcRec{svc: s, id: id, zone: zone, keys: keys, nBackends: len(backends), members: members, nodePorts: npKeys}
	d.setService(s.ID, rec)
	if had {
		if err := d.dropServiceRest(old, rec); err != nil {
			return d.settleHostSvcs(err, old.keys, keys)
		}
	}
	if !had || len(old.nodePorts) != len(npKeys) {
		if err := d.writeConfig(); err != nil {
			return d.settleHostSvcs(err, old.keys, keys)
		}
	}
	return d.settleHostSvcs(nil, old.keys, keys)
}

// settleHostSvcs brings cb_host_svcs in line with the index after a service change that
// touched keys (err: how the change itself went). Only those keys normally; if an earlier
// change could not settle its keys, the whole table once, so a retry of a service that
// is already recorded (or already gone) still repairs the entries it left behind.
func (d *Driver) settleHostSvcs(err error, keys ...[]contivbpfCbSvcKey) error {
	var serr error
	if d.svc.hostSvcsStale {
		serr = d.syncHostSvcs()
	} else {
		serr = d.updateHostSvcs(keys...)
	}
	d.svc.hostSvcsStale = err != nil || serr != nil
	return errors.Join(err, serr)
}

// setService records service id, keeping the port indexes.
func (d *Driver) setService(id string, r svcRec) {
	d.dropService(id)
	d.svc.services[id] = r
	d.indexSvcKeys(r.keys, 1)
	for _, k := range r.keys {
		d.svc.svcKeyOwner[k] = id
	}
	for _, k := range r.nodePorts {
		d.svc.npOwner[k] = id
	}
	d.svc.noteFeatures()
}

func (d *Driver) dropService(id string) {
	old, ok := d.svc.services[id]
	if !ok {
		return
	}
	d.indexSvcKeys(old.keys, -1)
	for _, k := range old.keys {
		if d.svc.svcKeyOwner[k] == id {
			delete(d.svc.svcKeyOwner, k)
		}
	}
	for _, k := range old.nodePorts {
		if d.svc.npOwner[k] == id {
			delete(d.svc.npOwner, k)
		}
	}
	delete(d.svc.services, id)
	d.svc.noteFeatures()
}

// dropServiceRest removes what old had and cur does not (keys, backend slots, VIP).
func (d *Driver) dropServiceRest(old, cur svcRec) error {
	keep := map[contivbpfCbSvcKey]bool{}
	for _, k := range cur.keys {
		keep[k] = true
	}
	for _, k := range old.keys {
		if !keep[k] {
			if err := mapDel(d.objs.CbServices, &k); err != nil {
				return fmt.Errorf("service %s: delete port entry: %w", old.svc.ID, err)
			}
		}
	}
	for i := cur.nBackends; i < old.nBackends; i++ {
		if err := mapDel(d.objs.CbBackends, backendKey(old.id, uint32(i))); err != nil {
			return fmt.Errorf("service %s: delete backend slot: %w", old.svc.ID, err)
		}
	}
	keepNP := map[contivbpfCbNpKey]bool{}
	for _, k := range cur.nodePorts {
		keepNP[k] = true
	}
	for _, k := range old.nodePorts {
		if !keepNP[k] {
			if err := mapDel(d.objs.CbNodeports, &k); err != nil {
				return fmt.Errorf("service %s: delete node port: %w", old.svc.ID, err)
			}
		}
	}
	keepMember := map[contivbpfCbMemberKey]bool{}
	for _, m := range cur.members {
		keepMember[m] = true
	}
	var errs []error
	left := false
	for _, m := range old.members {
		if !keepMember[m] {
			if err := mapDel(d.objs.CbMembers, &m); err != nil {
				errs = append(errs, fmt.Errorf("service %s: delete backend membership: %w", old.svc.ID, err))
			}
			left = true
		}
	}
	if left {
		// After the memberships (also when one failed: those that went, went): a flow the
		// datapath trusts by the revision it recorded is checked again on its next packet
		// (bpf/lib/lb.h, cb_svc_revs).
		if err := svcRevBump(d.objs.CbSvcRevs, old.id); err != nil {
			errs = append(errs, fmt.Errorf("service %s: %w", old.svc.ID, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if (old.svc.VIP != cur.svc.VIP || old.zone != cur.zone) && !d.vipInUse(old.zone, old.svc.VIP) {
		if err := mapDel(d.objs.CbVips, vipKey(old.zone, old.svc.VIP)); err != nil {
			return fmt.Errorf("service %s: delete vip: %w", old.svc.ID, err)
		}
	}
	return nil
}

// svcRevSlots is the number of revision slots, bpf/lib/lb.h's CB_SVC_REV_SLOTS (the size
// of cb_svc_revs, which the agent never resizes).
const svcRevSlots = 65536

// svcRevBump moves service id's revision on (cb_svc_revs[id mod svcRevSlots], bpf/lib/lb.h):
// after a backend of service id lost its membership, and whenever the service is written
// (so an agent that starts again, or after an older build ran without revisions, trusts no
// flow's earlier check). Ids svcRevSlots apart share a slot, and so their bumps.
func svcRevBump(m *ebpf.Map, id uint32) error {
	if m.MaxEntries() != svcRevSlots {
		return fmt.Errorf("map %s holds %d revisions, want %d", contivbpfMapCbSvcRevs, m.MaxEntries(), svcRevSlots)
	}
	slot := id % svcRevSlots
	var r contivbpfCbSvcRev
	if err := m.Lookup(slot, &r); err != nil {
		return fmt.Errorf("read the revision of service id %d: %w", id, err)
	}
	r.Rev++
	if r.Rev == 0 {
		r.Rev = 1 // 0 is "never checked"
	}
	if err := m.Put(slot, &r); err != nil {
		return fmt.Errorf("write the revision of service id %d: %w", id, err)
	}
	return nil
}

// networkByKey finds the network of a datapath network key.
func (d *Driver) networkByKey(key uint32) (netRec, bool) {
	for _, r := range d.eps.networks {
		if r.key == key {
			return r, true
		}
	}
	return netRec{}, false
}

func (d *Driver) svcIDUsed(id uint32) bool {
	for _, r := range d.svc.services {
		if r.id == id {
			return true
		}
	}
	return false
}

func (d *Driver) vipInUse(zone uint32, vip netip.Addr) bool {
	for _, r := range d.svc.services {
		if r.zone == zone && r.svc.VIP == vip {
			return true
		}
	}
	return false
}

// DeleteService implements dataplane.Driver. Connections already balanced keep their
// backend until their conntrack entries expire.
func (d *Driver) DeleteService(ctx context.Context, id string) error {
	defer d.lock(cSvc, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deleteService(id)
}

func (d *Driver) deleteService(id string) error {
	old, ok := d.svc.services[id]
	if !ok {
		return nil
	}
	d.dropService(id)
	if err := d.dropServiceRest(old, svcRec{svc: dataplane.Service{ID: id}}); err != nil {
		d.setService(id, old)
		// The config again, with the service's feature bits back: another concern may
		// have written it while they were off (its writes no longer wait for this one).
		if cerr := d.writeConfig(); cerr != nil {
			return errors.Join(err, cerr)
		}
		return err
	}
	if err := d.settleHostSvcs(nil, old.keys); err != nil {
		return err
	}
	return d.writeConfig()
}

// groupsAt is what the endpoints (local or remote) at ip in the networks of routing domain
// zone stamp: their groups, the zone for one without a group (none unless added).
func (d *Driver) groupsAt(zone uint32, ip netip.Addr, added bool) (groups []uint16, zones []uint32) {
	var ep contivbpfCbEndpoint
	if !added {
		return nil, nil
	}
	for _, nr := range d.eps.networks {
		if nr.vrf == zone && d.objs.CbEndpoints.Lookup(new(endpointKey(nr, ip)), &ep) == nil {
			if ep.Epg == 0 {
				zones = append(zones, zone)
			} else {
				groups = append(groups, ep.Epg)
			}
		}
	}
	return groups, zones
}
