//go:build cbbench

package ebpf

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// benchRejudge times pkt (an established tracked flow's packet that the program forwards
// locally) in n single runs right after change(i, true) and n single runs right after
// change(i, false) (the same writes but the policy epoch's: the agent's syscalls disturb
// the caches alike), interleaved, and returns the medians as a PathCost named
// rejudge-other-tenant (NsPerPk: after a change, Before: without its epoch part). Each run
// must forward the packet.
func benchRejudge(prog *ebpf.Program, reasons *ebpf.Map, pkt []byte, n int, change func(i int, epoch bool) error) (PathCost, error) {
	n = max(n, 200)
	before, err := readReasons(reasons)
	if err != nil {
		return PathCost{}, err
	}
	var after, plain []float64
	for i := range n {
		if err := change(i, false); err != nil {
			return PathCost{}, fmt.Errorf("writes %d: %w", i, err)
		}
		_, d, err := prog.Benchmark(append([]byte(nil), pkt...), 1, nil)
		if err != nil {
			return PathCost{}, fmt.Errorf("run without a change: %w", err)
		}
		plain = append(plain, float64(d.Nanoseconds()))
		if err := change(i, true); err != nil {
			return PathCost{}, fmt.Errorf("change %d: %w", i, err)
		}
		_, d, err = prog.Benchmark(append([]byte(nil), pkt...), 1, nil)
		if err != nil {
			return PathCost{}, fmt.Errorf("run after a change: %w", err)
		}
		after = append(after, float64(d.Nanoseconds()))
	}
	got, err := readReasons(reasons)
	if err != nil {
		return PathCost{}, err
	}
	if fwd := got[FwdLocal].Packets - before[FwdLocal].Packets; fwd != uint64(2*n) {
		moved := map[Reason]uint64{}
		for r, c := range got {
			if d := c.Packets - before[r].Packets; d != 0 {
				moved[r] = d
			}
		}
		return PathCost{}, fmt.Errorf("%d of %d runs forwarded locally (reasons counted: %v)", fwd, 2*n, moved)
	}
	return PathCost{Name: "rejudge-other-tenant", Program: "cb_from_container", Reason: FwdLocal, NsPerPk: benchMedian(after),
		Before: benchMedian(plain), Single: true}, nil
}

// benchOtherTenantChange changes group epg's rule set (a UDP deny whose priority follows
// i) as the agent's UpsertPolicy does (stamps.go): the group stamped with the clock's
// next value, the compiled rules replaced, then the clock published; without epoch, the
// rules alone.
func benchOtherTenantChange(objs *contivbpfObjects, pt *polTables, epg uint16, i int, epoch bool) error {
	rules := []contivbpfCbRule{{Prio: uint16(3 + 2*(i%50)), Action: uint8(contivbpfCbRuleActionCB_ACT_DENY), Proto: 17}}
	if !epoch {
		rules[0].Prio++ // another list than the change's
		return pt.install(contivbpfCbPolKey{Epg: epg}, rules, 0)
	}
	var clock uint32
	if err := objs.CbPolicyEpoch.Get(&clock); err != nil {
		return err
	}
	clock++
	if err := stampGroups(objs.CbEpgs, objs.CbZoneStamps, clock, []uint16{epg}, nil); err != nil {
		return err
	}
	if err := pt.install(contivbpfCbPolKey{Epg: epg}, rules, 0); err != nil {
		return err
	}
	return objs.CbPolicyEpoch.Set(clock)
}
