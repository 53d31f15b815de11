package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// natGC collects the egress NAT tables (bpf/lib/nat.h) in the conntrack collector's
// passes: a flow entry goes when it expired or its endpoint's entries are flushed, and a
// reply mapping goes when the flow it names is gone, expired, or moved to another port
// (the datapath reuses such a mapping itself, so this only bounds the table).
type natGC struct {
	flows   *ebpf.Map // cb_snat
	replies *ebpf.Map // cb_snat_rev
}

func (n natGC) sweep(now uint64, flushes map[ctFlush]bool) (deleted, live int, err error) {
	var errs []error
	var k contivbpfCbSnatKey
	var v contivbpfCbSnatEntry
	var dead []contivbpfCbSnatKey
	it := n.flows.Iterate()
	for it.Next(&k, &v) {
		if v.Expires < now || flushes[ctFlush{k.Zone, k.Saddr}] {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", contivbpfMapCbSnat, err)
	}
	for i := range dead {
		if err := n.flows.Delete(&dead[i]); err == nil {
			deleted++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	var rk contivbpfCbSnatRkey
	var rv contivbpfCbSnatRval
	var stale []contivbpfCbSnatRkey
	rit := n.replies.Iterate()
	for rit.Next(&rk, &rv) {
		fk := contivbpfCbSnatKey{Zone: rv.Zone, Saddr: rv.Saddr, Daddr: rk.Raddr, Sport: rv.Sport, Dport: rk.Rport, Proto: rk.Proto}
		if rk.Rport == 0 { // ICMP echo: both ports hold the endpoint's id
			fk.Dport = rv.Sport
		}
		if err := n.flows.Lookup(&fk, &v); err != nil || v.Expires < now || v.NatPort != rk.NatPort {
			stale = append(stale, rk)
		} else {
			live++
		}
	}
	if err := rit.Err(); err != nil {
		return deleted, live, fmt.Errorf("read %s: %w", contivbpfMapCbSnatRev, err)
	}
	for i := range stale {
		if err := n.replies.Delete(&stale[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return deleted, live, fmt.Errorf("delete egress NAT entries: %w", errors.Join(errs...))
	}
	return deleted, live, nil
}
