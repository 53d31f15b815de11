package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Per-endpoint counters live in the per-CPU array cb_ep_counters, indexed by a slot the
// driver allocates per local endpoint and stores in both of its entries (cb_ifaces for
// what it sends, cb_endpoints for what it receives), so the datapath pays two inlined
// array lookups instead of two hash lookups. Slot 0 is never allocated ("no counters").
// A slot is zeroed when it is handed out (its counters, its conntrack counts in
// cb_ct_owned and cb_ct_owned_in, and its rate-limit buckets in cb_qos), so a reused slot never shows the counts of the endpoint that had it before; after a restart the slots are read back from cb_ifaces.

// legacyMetricsMap is the counter map of builds before slots (per-CPU hash by {net, ip});
// New copies its counts into the adopted endpoints' slots, then removes its pin.
const legacyMetricsMap = "cb_ep_metrics"

// allocSlot hands out the lowest free slot, zeroed.
func (d *Driver) allocSlot(ik string) (uint32, error) {
	limit := d.objs.CbEpCounters.MaxEntries()
	for s := uint32(1); s < limit; s++ {
		if _, used := d.eps.slots[s]; used {
			continue
		}
		if err := d.objs.CbEpCounters.Put(s, make([]contivbpfCbEpStats, ebpf.MustPossibleCPU())); err != nil {
			return 0, fmt.Errorf("zero counter slot %d: %w", s, err)
		}
		for _, m := range []*ebpf.Map{d.objs.CbCtOwned, d.objs.CbCtOwnedIn} {
			if err := m.Put(s, contivbpfCbCtCount{}); err != nil {
				return 0, fmt.Errorf("zero conntrack count of slot %d: %w", s, err)
			}
		}
		// Full buckets: putQoS keeps the state of a bucket whose rate and burst did not
		// change, which must not be the previous holder's debt.
		if d.objs.CbQos != nil {
			if err := d.objs.CbQos.Update(s, &contivbpfCbQosEntry{}, ebpf.UpdateLock); err != nil {
				return 0, fmt.Errorf("zero rate limits of slot %d: %w", s, err)
			}
		}
		d.eps.slots[s] = ik
		return s, nil
	}
	d.countFull(contivbpfMapCbEpCounters)
	return 0, fmt.Errorf("ebpf: map %s is full (%d slots; raise MapEntries): %w", contivbpfMapCbEpCounters, limit-1, ErrMapFull)
}

func (d *Driver) freeSlot(s uint32) {
	if s != 0 {
		delete(d.eps.slots, s)
	}
}

// adoptSlot claims the slot an adopted endpoint's iface entry names. An entry without a
// usable slot (migrated from a build before slots, or a clash) gets a new one, seeded
// from the legacy counters when they exist, and both map entries are rewritten with it.
func (d *Driver) adoptSlot(r *epRec, ifindex uint32, ifc contivbpfCbIface) error {
	if s := ifc.Slot; s != 0 && s < d.objs.CbEpCounters.MaxEntries() {
		if _, used := d.eps.slots[s]; !used {
			d.eps.slots[s] = r.id
			r.slot = s
			return nil
		}
	}
	s, err := d.allocSlot(r.id)
	if err != nil {
		return fmt.Errorf("endpoint %s: %w", r.id, err)
	}
	r.slot = s
	if d.legacyMetrics != nil {
		var vals []contivbpfCbEpStats
		if err := d.legacyMetrics.Lookup(&r.key, &vals); err == nil {
			if err := d.objs.CbEpCounters.Put(s, vals); err != nil {
				d.log.Warn("copy legacy endpoint counters", "endpoint", r.id, "err", err)
			}
		}
	}
	ifc.Slot = s
	if err := d.ifaces().put(ifindex, &ifc, d.mapPut); err != nil {
		return fmt.Errorf("endpoint %s: write counter slot to its interface entry: %w", r.id, err)
	}
	var ep contivbpfCbEndpoint
	err = d.objs.CbEndpoints.Lookup(&r.key, &ep)
	if errors.Is(err, ebpf.ErrKeyNotExist) || (err == nil && ep.Ifindex != ifindex) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("endpoint %s: read %s: %w", r.id, contivbpfMapCbEndpoints, err)
	}
	ep.Slot = s
	if err := d.objs.CbEndpoints.Update(&r.key, &ep, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("endpoint %s: write counter slot to %s: %w", r.id, contivbpfMapCbEndpoints, err)
	}
	return nil
}
