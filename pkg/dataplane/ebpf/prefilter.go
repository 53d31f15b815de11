package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"sort"

	"github.com/cilium/ebpf"
)

// denyMax is cb_deny_src's size (CB_DENY_MAX in bpf/lib/prefilter.h).
const denyMax = 1024

// SetDenySources implements dataplane.SourceDenier: cb_deny_src holds exactly prefixes
// (the operator's deny list for this host) and the config has CB_FEAT_DENY while it holds
// one: the underlay's IPv4 packets from them are dropped (drop_denied_source) by
// cb_xdp_uplink, or cb_from_uplink without it. New prefixes go in before stale ones go
// out. A prefix that is not IPv4, or past the map's size, is left out and named in the
// error; the rest is applied. A host where neither program sits on a device (no device
// holds the VTEP, no egress device, no XDP) checks no packet against the list: a list
// that is not empty is written and refused with an error saying so. The map is pinned: a restarted driver keeps enforcing the
// list (adoptDenySources) until the agent sets it again.
func (d *Driver) SetDenySources(ctx context.Context, prefixes []netip.Prefix) error {
	defer d.lock(cAll, 0)()
	if err := d.check(); err != nil {
		return err
	}
	if err := d.setDenySources(prefixes); err != nil {
		_ = d.writeConfig()
		return err
	}
	if err := d.writeConfig(); err != nil {
		return err
	}
	if len(prefixes) > 0 && d.egress.ifindex == 0 && d.underlay.ifindex == 0 && d.xdp.ifindex == 0 {
		return fmt.Errorf("ebpf: deny list: %d prefixes held but checked on no device: no device of this host holds the VTEP %v and no egress device is set, so cb_from_uplink sits on none and no XDP prefilter runs", len(prefixes), d.cfg.VTEP)
	}
	return nil
}

// setDenySources is SetDenySources' map work, for a caller holding the lock. New
// prefixes go in before stale ones go out, but for a list that does not fit beside the
// stale ones (a full list replaced): then the stale ones make room first.
func (d *Driver) setDenySources(prefixes []netip.Prefix) error {
	if d.objs.CbDenySrc == nil {
		return nil
	}
	var bad []string
	want := map[contivbpfCbDenyKey]bool{}
	var fresh []contivbpfCbDenyKey // (in the list's order)
	held, err := denyHeld(d.objs.CbDenySrc)
	if err != nil {
		return err
	}
	for _, p := range prefixes {
		if !p.Addr().Is4() || !p.IsValid() {
			bad = append(bad, p.String())
			continue
		}
		p = p.Masked()
		k := contivbpfCbDenyKey{Prefixlen: uint32(p.Bits()), Addr: ip4(p.Addr())}
		if want[k] {
			continue
		}
		if len(want) == denyMax {
			bad = append(bad, p.String()+" (the list holds "+fmt.Sprint(denyMax)+")")
			continue
		}
		want[k] = true
		if !held[k] {
			fresh = append(fresh, k)
		}
	}
	if len(held)+len(fresh) > int(d.objs.CbDenySrc.MaxEntries()) {
		if err := deleteUnwanted[contivbpfCbDenyKey, uint32](d.objs.CbDenySrc, want); err != nil {
			return fmt.Errorf("ebpf: %s: %w", contivbpfMapCbDenySrc, err)
		}
	}
	for _, k := range fresh {
		if err := d.mapPut(contivbpfMapCbDenySrc, d.objs.CbDenySrc, &k, uint32(1)); err != nil {
			return fmt.Errorf("ebpf: deny %v/%d: %w", addrFrom(k.Addr), k.Prefixlen, err)
		}
	}
	if err := deleteUnwanted[contivbpfCbDenyKey, uint32](d.objs.CbDenySrc, want); err != nil {
		return fmt.Errorf("ebpf: %s: %w", contivbpfMapCbDenySrc, err)
	}
	var f uint32
	if len(want) > 0 {
		f = uint32(contivbpfCbFeaturesCB_FEAT_DENY)
	}
	d.denyFeat.Store(f)
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("ebpf: deny list: prefixes not applied (IPv4 only, at most %d): %v", denyMax, bad)
	}
	return nil
}

// denyHeld is the set of prefixes cb_deny_src holds.
func denyHeld(m *ebpf.Map) (map[contivbpfCbDenyKey]bool, error) {
	held := map[contivbpfCbDenyKey]bool{}
	var k contivbpfCbDenyKey
	var v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		held[k] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("ebpf: read %s: %w", contivbpfMapCbDenySrc, err)
	}
	return held, nil
}

// adoptDenySources takes the deny list an earlier run left in the pinned map as the one in
// force (New): its feature bit stays set through the first Sync, until the agent sets
// the list again.
func (d *Driver) adoptDenySources() error {
	if d.objs.CbDenySrc == nil {
		return nil
	}
	held, err := denyHeld(d.objs.CbDenySrc)
	if err != nil {
		return err
	}
	if len(held) > 0 {
		d.denyFeat.Store(uint32(contivbpfCbFeaturesCB_FEAT_DENY))
	}
	return nil
}
