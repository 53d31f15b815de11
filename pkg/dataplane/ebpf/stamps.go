package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Policy epochs per group and per zone (bpf/lib/stamps.h; docs/conntrack.md "Policy
// epochs"). The driver's policy clock (d.epoch, the programs' cb_policy_epoch, persisted
// in cb_config.policy_epoch) counts changes that can alter verdicts. A change takes the
// next value and stamps what it touches: a group (cb_epgs[g].changed) for its rule set,
// its fail-closed state and endpoints entering or leaving it; a zone (cb_zone_stamps) for
// its NetworkPolicy and endpoints entering or leaving "no group". A conntrack entry is
// judged again only when a stamp of its groups or zone is newer than the clock it
// recorded.
//
// Every change is written in three steps, each map write one syscall:
//
//  1. announce: the stamps (the clock's next value), before anything the change alters;
//  2. the change's own writes (rules, group flags, an endpoint's group, a pod's entry);
//  3. publish: the clock (writeConfig), after them.
//
// What a packet sees between any two of these writes (it reads the clock as it arrives,
// then the state, and an entry's groups before their stamps):
//   - before 1: the old state and stamps; entries it judges record the old clock and are
//     judged again after step 1 (the new stamp is newer than any clock published before);
//   - between 1 and 2 (stamps new, state old): every entry of the touched groups or zone is
//     stale, so the fast paths decline and the full stage judges it by the old state,
//     recording the old clock: judged again later. Nothing passes on an old verdict once
//     the stamp is readable;
//   - between 2 and 3 (state new, clock old): same, by the new state; still recorded under
//     the old clock, so judged once more after 3;
//   - after 3: a packet that read the new clock reads the new state after it (loads are not
//     reordered with loads on x86), so an entry recording that clock was judged by it.
//
// Were the stamp written after the state instead, a packet between the two could pass
// the fast path on a verdict the new rules would refuse; were the clock published before
// the state, a packet could record the new clock for a verdict made by the old state and
// never be judged again.

// zoneStampSlots is CB_ZONE_STAMP_SLOTS: zones share slots by their low bits.
const zoneStampSlots = 65536

// zoneSlot is zone's slot in cb_zone_stamps.
func zoneSlot(zone uint32) uint32 { return zone & (zoneStampSlots - 1) }

// stampLater is the later of two stamps (serial numbers, as cb_stamp_later).
func stampLater(a, b uint32) uint32 {
	if int32(a-b) >= 0 {
		return a
	}
	return b
}

// stampGroups writes stamp c into the state of each group (keeping its flags and
// generation) and into each zone's slot.
func stampGroups(epgs, zones *ebpf.Map, c uint32, groups []uint16, zoneIDs []uint32) error {
	for _, g := range groups {
		var st contivbpfCbEpgState
		if err := epgs.Lookup(uint32(g), &st); err != nil {
			return fmt.Errorf("stamp group %d: read %s: %w", g, contivbpfMapCbEpgs, err)
		}
		st.Changed = c
		if err := epgs.Put(uint32(g), &st); err != nil {
			return fmt.Errorf("stamp group %d: %w", g, err)
		}
	}
	for _, z := range zoneIDs {
		if err := zones.Put(zoneSlot(z), &contivbpfCbZoneStamp{Changed: c}); err != nil {
			return fmt.Errorf("stamp zone %#x: %w", z, err)
		}
	}
	return nil
}

// announce is step 1 of a change to groups and zones: the clock's next value, written as
// their stamp (not yet published: publish). It takes clockMu, which published releases:
// every announce is followed by exactly one published, and no change of another concern
// announces or publishes in between (a clock published in the middle of this change would
// be newer than this change's stamp, and a verdict taken on its old state could record it).
func (d *Driver) announce(groups []uint16, zones []uint32) error {
	d.clockMu.Lock()
	return d.stampNext(groups, zones)
}

// stampNext is announce for callers holding clockMu or running alone (New).
func (d *Driver) stampNext(groups []uint16, zones []uint32) error {
	d.epoch++
	d.epgMu.Lock()
	defer d.epgMu.Unlock()
	if err := stampGroups(d.objs.CbEpgs, d.objs.CbZoneStamps, d.epoch, groups, zones); err != nil {
		return fmt.Errorf("ebpf: announce a policy change: %w", err)
	}
	return nil
}

// published is step 3: the clock (with the rest of the config) published after the
// change's writes, whose error err is (joined with publishing's).
func (d *Driver) published(err error) error {
	defer d.clockMu.Unlock()
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	d.pubEpoch = d.epoch
	if perr := d.writeConfigLocked(); perr != nil {
		return errors.Join(err, perr)
	}
	return err
}

// change announces a change to groups and zones, runs its writes and publishes it.
func (d *Driver) change(groups []uint16, zones []uint32, write func() error) error {
	if err := d.announce(groups, zones); err != nil {
		return d.published(err)
	}
	return d.published(write())
}

// moveStamps is what an endpoint of zone moving to group epg stamps: that group ("no
// group", 0, as the zone). Not the group it leaves: every entry of the endpoint's flows is
// checked against the stamps of the groups its addresses have now, so the new group's
// stamp alone has each of them judged again, and the old group's other flows keep theirs.
func moveStamps(zone uint32, epg uint16) (groups []uint16, zones []uint32) {
	if epg == 0 {
		return nil, []uint32{zone}
	}
	return []uint16{epg}, nil
}

// putEPGState writes group epg's flags and generation, keeping its stamp (epgMu: a
// change of another concern may stamp the group meanwhile).
func (d *Driver) putEPGState(epg uint16, flags, gen uint32) error {
	d.epgMu.Lock()
	defer d.epgMu.Unlock()
	var st contivbpfCbEpgState
	if err := d.objs.CbEpgs.Lookup(uint32(epg), &st); err != nil {
		return fmt.Errorf("read %s: %w", contivbpfMapCbEpgs, err)
	}
	st.Flags, st.Generation = flags, gen
	return d.objs.CbEpgs.Put(uint32(epg), &st)
}

// resumeClock sets the clock at start: the pinned one, or the latest stamp if an agent
// stopped between a change's stamps and its clock (the clock must not be older than a
// stamp, or entries judged from now on would be judged on every packet until the next
// change). After an upgrade from a build with one global epoch (cb_epgs migrated: no
// stamps), every group and zone is stamped with the next value instead, so each entry that
// build wrote is judged once more and none is trusted on the old epoch alone.
func (d *Driver) resumeClock(pinned uint32, upgraded bool) error {
	d.epoch = pinned
	keys, states, err := readArray[contivbpfCbEpgState](d.objs.CbEpgs)
	if err != nil {
		return err
	}
	zkeys, zones, err := readArray[contivbpfCbZoneStamp](d.objs.CbZoneStamps)
	if err != nil {
		return err
	}
	if upgraded {
		d.epoch++
		for i := range states {
			states[i].Changed = d.epoch
		}
		for i := range zones {
			zones[i].Changed = d.epoch
		}
		if _, err := d.objs.CbEpgs.BatchUpdate(keys, states, nil); err != nil {
			return fmt.Errorf("ebpf: stamp every group after the upgrade: %w", err)
		}
		if _, err := d.objs.CbZoneStamps.BatchUpdate(zkeys, zones, nil); err != nil {
			return fmt.Errorf("ebpf: stamp every zone after the upgrade: %w", err)
		}
		d.log.Info("policy epochs per group: every group and zone stamped once (upgrade)", "clock", d.epoch)
		return nil
	}
	for _, s := range states {
		d.epoch = stampLater(d.epoch, s.Changed)
	}
	for _, z := range zones {
		d.epoch = stampLater(d.epoch, z.Changed)
	}
	return nil
}

// readArray reads every element of an array map with uint32 keys in one batch.
func readArray[V any](m *ebpf.Map) ([]uint32, []V, error) {
	n := int(m.MaxEntries())
	keys, vals := make([]uint32, n), make([]V, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, nil, fmt.Errorf("ebpf: read map %v: %w", m, err)
	}
	return keys[:got], vals[:got], nil
}

// stampView tells, for listings, whether a conntrack entry is older than the stamps of its
// flow's groups and zone (the datapath would judge it again on its next packet): the
// groups of the addresses as cb_endpoints holds them now, the stamps as the maps do.
type stampView struct {
	epgs, zones *ebpf.Map
	netpol      bool                 // NetworkPolicy is on: every flow also reads its zone's stamp
	groupAt     map[[2]uint32]uint16 // {zone, address} → group
	groups      map[uint16]uint32
	slots       map[uint32]uint32
}

// newStampView reads the endpoints' groups; vrfOf gives a network key's routing domain.
func newStampView(objs *contivbpfObjects, vrfOf map[uint32]uint32, netpol bool) (*stampView, error) {
	v := &stampView{epgs: objs.CbEpgs, zones: objs.CbZoneStamps, netpol: netpol, groupAt: map[[2]uint32]uint16{},
		groups: map[uint16]uint32{}, slots: map[uint32]uint32{}}
	var k contivbpfCbEpKey
	var ep contivbpfCbEndpoint
	it := objs.CbEndpoints.Iterate()
	for it.Next(&k, &ep) {
		if zone, ok := vrfOf[k.Net]; ok {
			v.groupAt[[2]uint32{zone, k.Ip}] = ep.Epg
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", contivbpfMapCbEndpoints, err)
	}
	return v, nil
}

// stale says whether an entry of key k recorded at clock epoch is older than its stamps.
func (v *stampView) stale(k contivbpfCbCtKey, epoch uint32) bool {
	var need uint32
	zone := v.netpol
	for _, a := range []uint32{k.Saddr, k.Daddr} {
		g := v.groupAt[[2]uint32{k.Zone, a}]
		if g == 0 {
			zone = true
			continue
		}
		s, ok := v.groups[g]
		if !ok {
			var st contivbpfCbEpgState
			_ = v.epgs.Lookup(uint32(g), &st) // unreadable: 0, never stale by it
			s, v.groups[g] = st.Changed, st.Changed
		}
		need = stampLater(need, s)
	}
	if zone {
		slot := zoneSlot(k.Zone)
		s, ok := v.slots[slot]
		if !ok {
			var zs contivbpfCbZoneStamp
			_ = v.zones.Lookup(slot, &zs)
			s, v.slots[slot] = zs.Changed, zs.Changed
		}
		need = stampLater(need, s)
	}
	return int32(epoch-need) < 0
}
