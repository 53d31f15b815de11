package ovs

import (
	"fmt"
	"net/netip"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// The Kubernetes NetworkPolicy layer (docs/kubernetes.md "NetworkPolicy"): after the
// group rules allowed a new flow, netpol_egress checks the sender's egress allow-list
// and netpol_ingress the receiver's, each only for pods isolated in that direction
// (a flow to or from a pod without a PodPolicy passes). Established and related packets
// never reach these tables (they bypass policy).

// tpDstMasked matches destination port value/mask (TCP or UDP).
func (f *flow) tpDstMasked(proto uint8, port, mask uint16) *flow {
	if mask == 0xffff {
		return f.tpDst(proto, port)
	}
	field := of.NewTcpDstField(port)
	if proto == 17 {
		field = of.NewUdpDstField(port)
	}
	field.HasMask = true
	field.Mask = of.NewPortField(mask)
	field.Length += uint8(field.Mask.Len())
	return f.m(field, fmt.Sprintf("tp_dst=0x%x/0x%x", port, mask))
}

// portMasks splits lo..hi into value/mask pairs (as ovs-ofctl does for ranges).
func portMasks(lo, hi uint16) [][2]uint16 {
	var out [][2]uint16
	for cur := uint32(lo); cur <= uint32(hi); {
		size := uint32(1)
		for cur&(size*2-1) == 0 && cur+size*2-1 <= uint32(hi) && size < 1<<16 {
			size *= 2
		}
		out = append(out, [2]uint16{uint16(cur), uint16(^(size - 1))})
		cur += size
	}
	return out
}

// netpolFlows compiles the PodPolicies whose network is known (vrf by tenant).
func (pl *pipeline) netpolFlows(d *dataplane.Index, vrf map[string]uint32) ([]*flow, error) {
	flows := []*flow{
		pl.newFlow(tNetpolEgress, 0).goTo(tNetpolIngress),
		pl.newFlow(tNetpolIngress, 0).goTo(tCommit),
	}
	for _, p := range sortedValues(d.PodPolicies, func(p dataplane.PodPolicy) string { return p.ID }) {
		if _, ok := d.Networks[p.NetworkID]; !ok || !p.IP.Is4() {
			continue // no network (yet) or no address: nothing to match
		}
		v := vrf[tenantOf(p.NetworkID)]
		self := netip.PrefixFrom(p.IP, 32)
		failed := p.Validate() != nil
		for _, dir := range []struct {
			table, next tableID
			iso         bool
			rules       []dataplane.PodRule
			ingress     bool
		}{
			{tNetpolEgress, tNetpolIngress, p.EgressIsolated, p.Egress, false},
			{tNetpolIngress, tCommit, p.IngressIsolated, p.Ingress, true},
		} {
			if !dir.iso && !failed {
				continue
			}
			match := func(f *flow) *flow {
				f = f.ip().reg(regVRF, v)
				if dir.ingress {
					return f.ipDst(self)
				}
				return f.ipSrc(self)
			}
			flows = append(flows, match(pl.newFlow(dir.table, 10))) // isolated: drop
			if failed {
				continue
			}
			for _, r := range dir.rules {
				base := func() *flow {
					f := match(pl.newFlow(dir.table, 20))
					if r.Remote.Bits() > 0 {
						if dir.ingress {
							f.ipSrc(r.Remote)
						} else {
							f.ipDst(r.Remote)
						}
					}
					if r.Proto != 0 {
						f.proto(r.Proto)
					}
					return f
				}
				if r.PortMin == 0 || (r.Proto != 6 && r.Proto != 17) {
					if r.PortMin != 0 {
						continue // ports of a protocol without them here: matches nothing
					}
					flows = append(flows, base().goTo(dir.next))
					continue
				}
				for _, pm := range portMasks(r.PortMin, r.PortMax) {
					flows = append(flows, base().tpDstMasked(r.Proto, pm[0], pm[1]).goTo(dir.next))
				}
			}
		}
	}
	return flows, nil
}
