package ebpf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Sync implements dataplane.Driver: everything in s is written with a new generation,
// then entries, veths and links from older generations are swept. If any upsert fails
// nothing is swept (a failed entry still carries its old generation and must not be
// removed while it is desired); the error lists every failure. Invalid remote endpoints
// are the exception: they are left out (like the OVS backend), everything else is
// applied and swept, and the error names each of them.
func (d *Driver) Sync(ctx context.Context, s dataplane.State) error {
	defer d.lock(cAll, 0)()
	if err := d.check(); err != nil {
		return err
	}
	if err := d.nextGeneration(); err != nil {
		return err
	}
	var errs []error
	wantNets := map[string]bool{}
	for _, n := range s.Networks {
		wantNets[n.ID] = true
		if err := d.upsertNetwork(n); err != nil {
			errs = append(errs, err)
		}
	}
	wantPeers := map[string]bool{}
	for _, p := range s.Peers {
		wantPeers[p.Host] = true
		if err := d.upsertPeer(p); err != nil {
			errs = append(errs, err)
		}
	}
	wantEPs := map[string]bool{}
	wantIfs := map[string]bool{d.cfg.VXLANIf: true}
	if d.cfg.VLANIf != "" {
		wantIfs[d.cfg.VLANIf] = true
	}
	if d.egress.ifindex != 0 {
		wantIfs[egressLinkPrefix+d.egress.ifname] = true
	}
	if d.underlay.ifindex != 0 {
		wantIfs[underlayLinkPrefix+d.underlay.ifname] = true
	}
	if d.xdp.ifindex != 0 {
		wantIfs[xdpLinkPrefix+d.xdp.ifname] = true
	}
	if d.sockLB != "" {
		wantIfs[sockLBLink] = true
	}
	if err := d.syncHostIPs(); err != nil {
		return err
	}
	for _, ep := range s.Endpoints {
		wantEPs[indexKey(ep.ID)] = true
		wantIfs[ep.HostIfName] = true
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("ebpf: sync: %w", err)
		}
		if err := d.upsertEndpoint(ep); err != nil {
			errs = append(errs, err)
		}
	}
	// An invalid remote endpoint (dataplane.RemoteEndpoint.Validate for its network's
	// encapsulation, or a network that is not in s) is left out of the desired state and
	// reported; it does not hold back the rest, nor the sweep.
	var bad []error
	wantRemotes := map[string]bool{}
	for _, ep := range s.RemoteEndpoints {
		if !wantNets[ep.NetworkID] {
			if err := ep.Validate(""); err != nil {
				bad = append(bad, err)
			} else {
				bad = append(bad, fmt.Errorf("remote endpoint %s: network %q is not known", ep.ID, ep.NetworkID))
			}
			continue
		}
		if _, err := d.checkRemote(ep); err != nil {
			if _, known := d.eps.networks[ep.NetworkID]; known {
				bad = append(bad, err)
				continue
			}
			// Its network failed to program: a real failure, reported below.
		}
		wantRemotes[ep.ID] = true
		if err := d.upsertRemote(ep); err != nil {
			errs = append(errs, err)
		}
	}
	wantPols := map[uint16]bool{}
	for _, p := range s.Policies {
		wantPols[p.EPGID] = true
		if err := d.upsertPolicy(p); err != nil {
			// A rule set that cannot be installed is failed closed (deny-all) and
			// reported; like an invalid remote it does not hold back the sweep.
			var perr *PolicyError
			if errors.As(err, &perr) && d.pols.failed[p.EPGID] != nil {
				bad = append(bad, err)
				continue
			}
			errs = append(errs, err)
		}
	}
	wantPodPols := map[string]bool{}
	for _, p := range s.PodPolicies {
		wantPodPols[p.ID] = true
		if err := d.upsertPodPolicy(p); err != nil {
			// Failed closed and reported, like a group's rule set, when its deny-all
			// entry is in place; otherwise (map full) nothing may be swept.
			var perr *PodPolicyError
			if rec := d.np.podPols[p.ID]; errors.As(err, &perr) && rec != nil && rec.failed != nil && rec.written && d.np.kpodOwner[rec.key] == p.ID {
				bad = append(bad, err)
				continue
			}
			errs = append(errs, err)
		}
	}
	wantSvcs := map[string]bool{}
	for _, sv := range s.Services {
		wantSvcs[sv.ID] = true
		if err := d.upsertService(sv); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: sync (nothing swept): %w", errors.Join(append(errs, bad...)...))
	}

	// Sweep: objects the index knows, then anything left in the maps from older generations.
	for _, id := range sortedKeys(d.svc.services) {
		if !wantSvcs[id] {
			if err := d.deleteService(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Upserts touch only their own host-service entries: entries a previous run left
	// are swept here, once.
	if err := d.syncHostSvcs(); err != nil {
		errs = append(errs, err)
		d.svc.hostSvcsStale = true
	} else {
		d.svc.hostSvcsStale = false
	}
	for _, id := range sortedKeys(d.np.podPols) {
		if !wantPodPols[id] {
			if err := d.deletePodPolicy(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for epg := range d.pols.failed {
		if !wantPols[epg] {
			if err := d.deletePolicy(epg); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for epg := range d.pols.policies {
		if !wantPols[epg] {
			if err := d.deletePolicy(epg); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, ik := range sortedKeys(d.eps.endpoints) {
		if !wantEPs[ik] {
			if err := d.deleteEndpoint(ik); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, id := range sortedKeys(d.eps.remotes) {
		if !wantRemotes[id] {
			if err := d.deleteRemote(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, h := range sortedKeys(d.eps.peers) {
		if !wantPeers[h] {
			if err := d.deletePeer(h); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, id := range sortedKeys(d.eps.networks) {
		if !wantNets[id] {
			if err := d.deleteNetwork(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, d.sweepMaps()...)
	errs = append(errs, d.sweepLinks(wantIfs)...)
	errs = appendErr(errs, d.dropCarried()) // the indexes are complete now
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: sync sweep: %w", errors.Join(append(errs, bad...)...))
	}
	if err := errors.Join(bad...); err != nil {
		return fmt.Errorf("ebpf: sync (applied the rest): %w", err)
	}
	return nil
}

// sweepEPGStates clears the group state of groups no rule set of this generation wrote (an
// array: entries are zeroed, not deleted).
func (d *Driver) sweepEPGStates() []error {
	var (
		k     uint32
		v     contivbpfCbEpgState
		stale []uint32
	)
	it := d.objs.CbEpgs.Iterate()
	for it.Next(&k, &v) {
		if v.Flags != 0 && v.Generation != d.gen {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return []error{fmt.Errorf("iterate %s: %w", contivbpfMapCbEpgs, err)}
	}
	if len(stale) == 0 {
		return nil
	}
	var errs []error
	groups := make([]uint16, len(stale))
	for i, g := range stale {
		groups[i] = uint16(g)
	}
	// Their flows are judged again without their rules (stamps kept, and moved).
	err := d.change(groups, nil, func() error {
		for _, g := range groups {
			if err := d.putEPGState(g, 0, 0); err != nil {
				errs = append(errs, fmt.Errorf("clear group %d state: %w", g, err))
			}
		}
		return nil
	})
	return appendErr(errs, err)
}

// sweepLinks removes pinned links and endpoint veths that are not wanted.
func (d *Driver) sweepLinks(want map[string]bool) []error {
	var errs []error
	ents, err := os.ReadDir(filepath.Join(d.cfg.PinRoot, linksDir))
	if err != nil {
		return []error{fmt.Errorf("read pinned links: %w", err)}
	}
	// Veths of other agents (other pin roots) in this namespace are left alone (owner.go);
	// ownership is decided before the unwanted pinned links go.
	links, lerr := d.nl.LinkList()
	var stale []netlink.Link
	for _, l := range links {
		if _, own := d.ownedEndpointLink(l); own && !want[l.Attrs().Name] {
			stale = append(stale, l)
		}
	}
	if lerr != nil {
		return append(errs, fmt.Errorf("list links: %w", lerr))
	}
	// Each veth goes before its program (unplug); a veth that stays keeps it.
	kept := map[string]bool{}
	for _, l := range stale {
		if err := d.unplug(l.Attrs().Name, l); err != nil {
			errs = append(errs, fmt.Errorf("stale: %w", err))
			kept[l.Attrs().Name] = true
		}
	}
	for _, e := range ents {
		if !want[e.Name()] && !kept[e.Name()] {
			d.detachTCX(e.Name())
		}
	}
	return errs
}

func appendErr(errs []error, err error) []error {
	if err != nil {
		return append(errs, err)
	}
	return errs
}

// sweepGen deletes every entry of m whose generation (read by gen) differs from cur.
func sweepGen[K, V any](m *ebpf.Map, name string, cur uint32, gen func(*K, *V) uint32) []error {
	_, errs := sweepGenKeys(m, name, cur, gen)
	return errs
}

// sweepGenKeys is sweepGen that also returns the keys it found stale.
func sweepGenKeys[K, V any](m *ebpf.Map, name string, cur uint32, gen func(*K, *V) uint32) ([]K, []error) {
	var (
		k     K
		v     V
		stale []K
		errs  []error
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if gen(&k, &v) != cur {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("iterate %s: %w", name, err))
	}
	for i := range stale {
		errs = appendErr(errs, mapDel(m, &stale[i]))
	}
	return stale, errs
}
