package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// denyListKey names the deny list in the agent's errors.
const denyListKey = "prefilter"

// checkPrefilter refuses a deny list record the datapath cannot apply (netmaster writes
// none): a CIDR that is not an IPv4 prefix, or /0.
func checkPrefilter(p *model.Prefilter) error {
	pfx, err := netip.ParsePrefix(p.CIDR)
	if err != nil || !pfx.Addr().Is4() || pfx.Bits() == 0 {
		return fmt.Errorf("cidr %q: not an IPv4 prefix longer than /0", p.CIDR)
	}
	return nil
}

// denyList is this host's deny list from the records (a.mu held), sorted, one entry per
// prefix. With a driver that has no prefilter, a list that is not empty is reported in bad;
// so is an entry holding a peer host's VTEP (peerVTEPIn), which stays in the list.
func (a *Agent) denyList(bad map[string]error) []netip.Prefix {
	var out []netip.Prefix
	hosts := slices.Sorted(maps.Keys(a.rec.hostVTEPs))
	for id, p := range a.rec.prefilters {
		if !p.AppliesTo(a.cfg.Host) {
			continue
		}
		pfx, err := netip.ParsePrefix(p.CIDR)
		if err != nil {
			continue
		}
		out = append(out, pfx.Masked())
		if host, vtep, ok := a.peerVTEPIn(hosts, pfx); ok {
			bad[denyListKey+"/"+id] = fmt.Errorf("cidr %s holds the VTEP %s of host %q: this host drops every overlay packet from it (the host's VTEP came after the entry; drop the entry or narrow it)", p.CIDR, vtep, host)
		}
	}
	slices.SortFunc(out, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	out = slices.Compact(out)
	if _, ok := a.driver.(dataplane.SourceDenier); !ok && len(out) > 0 {
		bad[denyListKey] = fmt.Errorf("%d deny list prefixes for this host not applied: this dataplane has no prefilter", len(out))
	}
	return out
}

// applyDenyList gives the driver the deny list of a full pass when it differs from what
// it holds (a failure is retried by the next full pass).
func (a *Agent) applyDenyList(ctx context.Context, v view) error {
	d, ok := a.driver.(dataplane.SourceDenier)
	if !ok || !v.sc.all || a.denyApplied != nil && slices.Equal(a.denyApplied, v.deny) {
		return nil
	}
	if err := d.SetDenySources(ctx, v.deny); err != nil {
		a.denyApplied = nil
		return fmt.Errorf("deny list: %w", err)
	}
	a.denyApplied = append([]netip.Prefix{}, v.deny...)
	return nil
}

// peerVTEPIn is the first of hosts (the durable VTEP records' hosts, sorted) other than
// this one whose VTEP lies in pfx (a.mu held). Netmaster refuses such an entry for the
// hosts it knows when the entry is written; a host that joins later, or whose VTEP
// changes, can still land inside one.
func (a *Agent) peerVTEPIn(hosts []string, pfx netip.Prefix) (string, netip.Addr, bool) {
	for _, h := range hosts {
		if v := a.rec.hostVTEPs[h]; !strings.EqualFold(h, a.cfg.Host) && pfx.Contains(v) {
			return h, v, true
		}
	}
	return "", netip.Addr{}, false
}
