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

// natDead is a flow entry a sweep found to delete: expired when read, or of a flushed
// address (deleted whatever its state).
type natDead struct {
	k       contivbpfCbSnatKey
	flushed bool
}

func (n natGC) sweep(now uint64, flushes map[ctFlush]bool) (deleted, live int, err error) {
	dead, err := n.scanFlows(now, flushes)
	if err != nil {
		return 0, 0, err
	}
	deleted, errs := n.deleteFlows(now, dead)
	var v contivbpfCbSnatEntry
	var rk contivbpfCbSnatRkey
	var rv contivbpfCbSnatRval
	var stale []contivbpfCbSnatRkey
	rit := n.replies.Iterate()
	for rit.Next(&rk, &rv) {
		fk := contivbpfCbSnatKey{Zone: rv.Zone, Kind: rv.Kind, Saddr: rv.Saddr, Daddr: rk.Raddr, Sport: rv.Sport, Dport: rk.Rport, Proto: rk.Proto}
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

// scanFlows reads the flow table once.
func (n natGC) scanFlows(now uint64, flushes map[ctFlush]bool) ([]natDead, error) {
	var k contivbpfCbSnatKey
	var v contivbpfCbSnatEntry
	var dead []natDead
	it := n.flows.Iterate()
	for it.Next(&k, &v) {
		if flushed := flushes[ctFlush{k.Zone, k.Saddr}]; flushed || v.Expires < now {
			dead = append(dead, natDead{k, flushed})
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", contivbpfMapCbSnat, err)
	}
	return dead, nil
}

// deleteFlows deletes what scanFlows found. An expired flow is read again first: the
// datapath overwrites it when the flow opens again, maybe since the scan read it (as in
// the conntrack collector, ctGC.apply).
func (n natGC) deleteFlows(now uint64, dead []natDead) (deleted int, errs []error) {
	var v contivbpfCbSnatEntry
	for i := range dead {
		if !dead[i].flushed {
			err := n.flows.Lookup(&dead[i].k, &v)
			if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				// The map cannot be read: delete nothing more this pass.
				return deleted, append(errs, fmt.Errorf("read %s: %w", contivbpfMapCbSnat, err))
			}
			if err != nil || v.Expires >= now {
				continue // gone, or opened again since the scan
			}
		}
		if err := n.flows.Delete(&dead[i].k); err == nil {
			deleted++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return deleted, errs
}
