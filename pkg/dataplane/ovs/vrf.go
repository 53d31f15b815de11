package ovs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// VRF ids are the conntrack zones of tenants. They must stay with their tenant for as
// long as conntrack entries of that zone can exist: numbering tenants afresh (e.g. by
// sorted name) would hand one tenant's live entries to another when a tenant is added or
// removed. So an id is allocated once, persisted in the integration bridge's
// external_ids (a restarted agent keeps the numbering), and given back only after its
// zone was flushed.

// extVRFs is the bridge external_ids key holding the tenant → VRF id map as JSON.
const extVRFs = "contivbpf-vrfs"

// parseVRFs reads the persisted map ("" = none).
func parseVRFs(s string) (map[string]uint32, error) {
	m := map[string]uint32{}
	if s == "" {
		return m, nil
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("vrf ids %q: %w", s, err)
	}
	for t, id := range m {
		if id == 0 || id > 0xffff {
			return nil, fmt.Errorf("vrf ids: tenant %q has id %d outside 1-65535", t, id)
		}
	}
	return m, nil
}

func formatVRFs(m map[string]uint32) string {
	b, _ := json.Marshal(m) // keys are sorted: the text is stable
	return string(b)
}

// Zones of a tenant with VRF id v: v itself holds the connections its local endpoints
// open, v|inboundZoneBit those opened from other hosts (the overlay, the VLAN uplink) toward
// them, each with a limit of its own (ctlimit.go), and v|hairpinZoneBit the SNAT entries of
// its hairpin connections. maxVRF is the largest id handed out. Ids up to 0x7fff were
// handed out before the inbound zones came: such a tenant's connections from other hosts
// stay in its own zone (inboundZones), and it keeps its hairpin zone (hairpinZone).
const (
	maxVRF         = 0x3fff
	inboundZoneBit = 0x4000
	hairpinZoneBit = 0x8000
)

// inboundZones maps the VRF of every tenant of vrf to its inbound zone, the zone of the
// connections opened from other hosts toward its local endpoints: v|inboundZoneBit, or v
// itself (one zone for both, as before the split) when v is an id persisted above maxVRF
// or another tenant holds v|inboundZoneBit as its VRF. vrf must be every id held (d.vrfIDs,
// ids.vrf), not only the tenants with a network here: a tenant whose networks are gone
// keeps its zone, and its connections in it, until releaseVRFs flushes it.
func inboundZones(vrf map[string]uint32) map[uint32]uint32 {
	held := make(map[uint32]bool, len(vrf))
	for _, v := range vrf {
		held[v] = true
	}
	out := make(map[uint32]uint32, len(vrf))
	for _, v := range vrf {
		in := v | inboundZoneBit
		if v == 0 || v > maxVRF || held[in] {
			in = v
		}
		out[v] = in
	}
	return out
}

// tenantZones returns every conntrack zone that holds the connections of a tenant of vrf
// (its own and its inbound zone; not the hairpin zones), each with its tenant's VRF.
func tenantZones(vrf map[string]uint32) map[uint16]uint32 {
	out := map[uint16]uint32{}
	for v, in := range inboundZones(vrf) {
		out[uint16(v)], out[uint16(in)] = v, v
	}
	return out
}

// assignVRF returns the id of tenant, allocating the smallest one no tenant in ids holds.
func assignVRF(ids map[string]uint32, tenant string) (uint32, error) {
	if id, ok := allocID(ids, tenant, maxVRF); ok {
		return id, nil
	}
	return 0, fmt.Errorf("tenant %s: all %d conntrack zones are in use", tenant, maxVRF)
}

// allocID returns key's id in ids, allocating the smallest free one of 1..max for a new
// key; false when all are taken.
func allocID(ids map[string]uint32, key string, max uint32) (uint32, bool) {
	if id, ok := ids[key]; ok {
		return id, true
	}
	taken := make([]uint64, max/64+1) // a bit per id: cheaper than a map at 10,000s of keys
	for _, id := range ids {
		if id <= max {
			taken[id/64] |= 1 << (id % 64)
		}
	}
	for id := uint32(1); id <= max; id++ {
		if taken[id/64]&(1<<(id%64)) == 0 {
			ids[key] = id
			return id, true
		}
	}
	return 0, false
}

// staleVRFs returns the tenants of ids that have no network in live, sorted.
func staleVRFs(ids map[string]uint32, live map[string]bool) []string {
	var out []string
	for _, t := range slices.Sorted(maps.Keys(ids)) {
		if !live[t] {
			out = append(out, t)
		}
	}
	return out
}

// nxtCTFlushZone is the Nicira message that deletes every conntrack entry of one zone.
const nxtCTFlushZone = 29

// ctFlushZone flushes conntrack zone (NXT_CT_FLUSH_ZONE), confirmed by a barrier.
func (c *ofConn) ctFlushZone(ctx context.Context, zone uint16) error {
	body := make([]byte, 8)
	binary.BigEndian.PutUint16(body[6:], zone) // struct nx_zone_id: 6 zero bytes, zone
	if err := c.nxRequest(ctx, nxtCTFlushZone, body); err != nil {
		return fmt.Errorf("flush conntrack zone %d: %w", zone, err)
	}
	return nil
}

// loadVRFs reads the persisted VRF ids of the integration bridge.
func (d *Driver) loadVRFs() error {
	br := d.db.bridge(d.opts.Bridge)
	if br == nil {
		return errors.New("ovs: integration bridge missing")
	}
	ids, err := parseVRFs(br.ExternalIDs[extVRFs])
	if err != nil {
		return fmt.Errorf("ovs: bridge %s: %w", d.opts.Bridge, err)
	}
	d.vrfIDs = ids
	return nil
}

// saveVRFs persists ids when they differ from what the bridge holds.
func (d *Driver) saveVRFs(ctx context.Context, ids map[string]uint32) error {
	if br := d.db.bridge(d.opts.Bridge); br != nil && br.ExternalIDs[extVRFs] == formatVRFs(ids) {
		return nil
	}
	if err := d.db.ensureBridge(ctx, d.opts.Bridge, true, map[string]string{extVRFs: formatVRFs(ids)}); err != nil {
		return fmt.Errorf("ovs: persist vrf ids: %w", err)
	}
	return nil
}

// releaseVRFs flushes the zones of tenants that no longer have a network (no flow uses
// them any more: their own, inbound and hairpin zones) and frees their ids. A failed flush
// keeps the id reserved.
func (d *Driver) releaseVRFs(ctx context.Context, st *dataplane.Index) error {
	live := map[string]bool{}
	for id := range st.Networks {
		live[tenantOf(id)] = true
	}
	stale := staleVRFs(d.vrfIDs, live)
	if len(stale) == 0 {
		return nil
	}
	ids := maps.Clone(d.vrfIDs)
	var errs []error
	inbound := inboundZones(d.vrfIDs)
	for _, t := range stale {
		v := ids[t]
		zones := []uint16{uint16(v)}
		if in := inbound[v]; in != v {
			zones = append(zones, uint16(in))
		}
		if hz, ok := hairpinZone(v); ok {
			zones = append(zones, hz)
		}
		var failed error
		for _, z := range zones {
			if err := d.conn.ctFlushZone(ctx, z); err != nil {
				failed = err
			}
		}
		if failed != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t, failed))
			continue
		}
		d.log.Debug("conntrack zones flushed", "tenant", t, "zones", zones)
		delete(ids, t)
	}
	if err := d.saveVRFs(ctx, ids); err != nil {
		return errors.Join(append(errs, err)...)
	}
	d.vrfIDs = ids
	return errors.Join(errs...)
}
