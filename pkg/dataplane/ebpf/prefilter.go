package ebpf

import (
	"fmt"
	"net/netip"
	"sort"
)

// denyMax is cb_deny_src's size (CB_DENY_MAX in bpf/lib/prefilter.h).
const denyMax = 1024

// syncDenySources makes cb_deny_src hold exactly prefixes (the operator's deny list for
// this host, dataplane.State.DenySources) and asks writeConfig for CB_FEAT_DENY while it
// holds one: the underlay's IPv4 packets from them are dropped (drop_denied_source) by
// cb_xdp_uplink, or cb_from_uplink without it. New prefixes go in before stale ones go
// out. A prefix that is not IPv4, or past the map's size, is left out and named in the
// error; the rest is applied.
func (d *Driver) syncDenySources(prefixes []netip.Prefix) error {
	if d.objs.CbDenySrc == nil {
		return nil
	}
	var bad []string
	want := map[contivbpfCbDenyKey]bool{}
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
		if err := d.mapPut(contivbpfMapCbDenySrc, d.objs.CbDenySrc, &k, uint32(1)); err != nil {
			return fmt.Errorf("ebpf: deny %v: %w", p, err)
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

// DeniesSources implements dataplane.SourceDenier: the deny list is applied.
func (d *Driver) DeniesSources() bool { return true }
