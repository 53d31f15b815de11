package ovs

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Conntrack limits (docs/ovs.md "Conntrack limits"). The eBPF datapath counts its entries
// per local endpoint (HostConfig.CTQuota, drop_ct_quota), apart for the flows an endpoint
// opens and those opened toward it; the userspace datapath of OVS counts connections per
// conntrack zone only (dpctl/ct-set-limits). A tenant (its VRF id) has two zones here: its
// own, for the connections its local endpoints open, and its inbound zone, for those
// opened from other hosts toward them (vrf.go, pipeline.go "Opener zones"). Each is
// limited to the sum of the tenant's local endpoints' quotas: CTQuota × the tenant's
// endpoints on this host (at least one), the inbound zones of all tenants together at most
// half the table (inboundShares). A commit past a limit is refused, and ct_check
// drops the packet (pipeline.go ctCheckFlows): a tenant at its own zone's limit opens no
// new connection, one at its inbound zone's limit is opened none from other hosts; its
// established ones keep working, and what other hosts open does not take what its
// endpoints open. The other tenants are not affected. The hairpin zones are not limited (a
// hairpin connection holds an entry of the tenant's zone too).

// ctZoneLimits is the limit of every tenant zone of vrf, own and inbound: quota for each
// endpoint of the tenant in st (at least one); the inbound zones share inboundMax (0: no
// cap; inboundShares). None without a quota.
func ctZoneLimits(st *dataplane.Index, vrf map[string]uint32, quota int, inboundMax uint32) map[uint16]uint32 {
	out := map[uint16]uint32{}
	if quota <= 0 {
		return out
	}
	eps := map[string]uint64{}
	for _, ep := range st.Endpoints {
		eps[tenantOf(ep.NetworkID)]++
	}
	inbound := inboundZones(vrf)
	want := map[uint16]uint32{}
	for t, v := range vrf {
		limit := uint32(min(uint64(quota)*max(eps[t], 1), math.MaxUint32))
		out[uint16(v)] = limit
		if in := inbound[v]; in != v {
			want[uint16(in)] = limit
		}
	}
	maps.Copy(out, inboundShares(want, inboundMax))
	return out
}

// inboundShares divides total among the inbound zones of want (zone: the limit its
// endpoints' quotas ask for) so that their limits add up to no more than total, as the
// eBPF datapath counts every flow opened from outside together (cb_config.ct_in_limit):
// OVS limits zones one by one, so without this every tenant's inbound zone could take its
// share of the table and together take all of it. Max-min fair: a zone asking less than
// an equal share of what is left gets what it asks, the rest is shared equally by the
// others (in zone order, so the result does not depend on map order). Every zone gets at
// least 1 (a limit of 0 would be no limit), so with more zones than total the sum is the
// number of zones. total 0: every zone gets what it asks.
func inboundShares(want map[uint16]uint32, total uint32) map[uint16]uint32 {
	out := make(map[uint16]uint32, len(want))
	zones := slices.SortedFunc(maps.Keys(want), func(a, b uint16) int {
		if c := cmp.Compare(want[a], want[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	left := uint64(total)
	for i, z := range zones {
		if total == 0 {
			out[z] = want[z]
			continue
		}
		share := max(min(uint64(want[z]), left/uint64(len(zones)-i)), 1)
		out[z] = uint32(share)
		left -= min(share, left)
	}
	return out
}

// inboundLimit is the most connections all tenants' inbound zones together may hold on a
// table of maxconns: half of it, as the eBPF datapath keeps half its table for what its
// endpoints open (cb_config.ct_in_limit). Other hosts' openings toward the endpoints of
// one tenant, or of all, so never take the whole table, whatever the quota and the
// endpoints.
func inboundLimit(maxconns uint64) uint32 {
	return uint32(min(max(maxconns/2, 1), math.MaxUint32))
}

// zoneOwner is a limited zone's tenant and whose openings it holds: "local" (its local
// endpoints'), "remote" (other hosts', the inbound zone) or "any" (a tenant with one zone
// for both, vrf.go inboundZone).
type zoneOwner struct {
	tenant, opener string
}

// zoneOwners names the tenant zones of vrf.
func zoneOwners(vrf map[string]uint32) map[uint16]zoneOwner {
	out := map[uint16]zoneOwner{}
	inbound := inboundZones(vrf)
	for t, v := range vrf {
		in := inbound[v]
		if in == v {
			out[uint16(v)] = zoneOwner{t, "any"}
			continue
		}
		out[uint16(v)], out[uint16(in)] = zoneOwner{t, "local"}, zoneOwner{t, "remote"}
	}
	return out
}

// ctZoneLimit is one zone of dpctl/ct-get-limits.
type ctZoneLimit struct {
	limit, count uint32
}

// parseCTLimits reads dpctl/ct-get-limits ("default limit=0" then "zone=5,limit=2,count=1"
// per zone).
func parseCTLimits(out string) map[uint16]ctZoneLimit {
	zones := map[uint16]ctZoneLimit{}
	for _, line := range strings.Split(out, "\n") {
		var zone, limit, count uint64
		ok := true
		for _, kv := range strings.Split(strings.TrimSpace(line), ",") {
			k, v, found := strings.Cut(kv, "=")
			n, err := strconv.ParseUint(v, 10, 32)
			if !found || err != nil {
				ok = false
				break
			}
			switch k {
			case "zone":
				zone = n
			case "limit":
				limit = n
			case "count":
				count = n
			default:
				ok = false
			}
		}
		if ok && strings.HasPrefix(strings.TrimSpace(line), "zone=") && zone <= math.MaxUint16 {
			zones[uint16(zone)] = ctZoneLimit{limit: uint32(limit), count: uint32(count)}
		}
	}
	return zones
}

// applyCTLimits sets vswitchd's zone limits to what d.state asks for. The first call (and
// the first after vswitchd restarted: d.ctLimits nil) reads what it holds, so the limits
// a previous agent set on tenant zones (own and inbound: 1..0x7fff) that are no longer
// wanted go too. Call with d.mu held.
func (d *Driver) applyCTLimits(ctx context.Context) error {
	var inboundMax uint32
	if d.host.CTQuota > 0 {
		out, err := d.appctl(ctx, "dpctl/ct-get-maxconns")
		if err != nil {
			return fmt.Errorf("ovs: read the conntrack table size: %w", err)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
		if err != nil {
			return fmt.Errorf("ovs: conntrack table size %q: %w", out, err)
		}
		inboundMax = inboundLimit(n)
	}
	want := ctZoneLimits(d.state, d.vrfIDs, d.host.CTQuota, inboundMax)
	if d.ctLimits == nil {
		out, err := d.appctl(ctx, "dpctl/ct-get-limits")
		if err != nil && len(want) == 0 {
			// Nothing to set (no quota): a previous agent's limits, if any, stay.
			d.log.Warn("conntrack zone limits not readable; limits a previous agent set stay", "err", err)
			d.ctLimits = map[uint16]uint32{}
			return nil
		}
		if err != nil {
			return fmt.Errorf("ovs: read conntrack zone limits: %w", err)
		}
		have := map[uint16]uint32{}
		for z, l := range parseCTLimits(out) {
			if z != 0 && z&hairpinZoneBit == 0 {
				have[z] = l.limit
			}
		}
		d.ctLimits = have
	}
	var set, del []string
	for _, z := range slices.Sorted(maps.Keys(want)) {
		if l, ok := d.ctLimits[z]; !ok || l != want[z] {
			set = append(set, fmt.Sprintf("zone=%d,limit=%d", z, want[z]))
		}
	}
	for _, z := range slices.Sorted(maps.Keys(d.ctLimits)) {
		if _, ok := want[z]; !ok {
			del = append(del, strconv.Itoa(int(z)))
		}
	}
	// A zone's limit is changed in place (ct-set-limits on a zone that has one keeps its
	// count): deleting it first would forget the connections it holds.
	if len(set) > 0 {
		if _, err := d.appctl(ctx, append([]string{"dpctl/ct-set-limits"}, set...)...); err != nil {
			d.ctLimits = nil // read again next time
			return fmt.Errorf("ovs: set conntrack zone limits: %w", err)
		}
	}
	if len(del) > 0 {
		if _, err := d.appctl(ctx, "dpctl/ct-del-limits", "zone="+strings.Join(del, ",")); err != nil {
			d.ctLimits = nil
			return fmt.Errorf("ovs: delete conntrack zone limits: %w", err)
		}
	}
	if len(set)+len(del) > 0 {
		d.log.Debug("conntrack zone limits", "set", set, "deleted", del)
	}
	d.ctLimits = want
	tenants := map[uint16]zoneOwner{}
	for z, o := range zoneOwners(d.vrfIDs) {
		if _, ok := want[z]; ok {
			tenants[z] = o
		}
	}
	d.limMu.Lock()
	d.limTenants = tenants
	d.limMu.Unlock()
	return nil
}

// removeCTLimits deletes the zone limits this driver set (Teardown).
func (d *Driver) removeCTLimits(ctx context.Context) error {
	if len(d.ctLimits) == 0 {
		return nil
	}
	var zones []string
	for _, z := range slices.Sorted(maps.Keys(d.ctLimits)) {
		zones = append(zones, strconv.Itoa(int(z)))
	}
	if _, err := d.appctl(ctx, "dpctl/ct-del-limits", "zone="+strings.Join(zones, ",")); err != nil {
		return fmt.Errorf("ovs: delete conntrack zone limits: %w", err)
	}
	d.ctLimits = nil
	return nil
}

// limitedZones returns the limited zones and their owners (metrics; no driver lock).
func (d *Driver) limitedZones() map[uint16]zoneOwner {
	d.limMu.Lock()
	defer d.limMu.Unlock()
	return d.limTenants
}
