//go:build cbbench

package ebpf

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// benchRejudge times pkt (an established tracked flow's packet that the program forwards
// locally) in n single runs right after change(i) and n single runs without a change,
// interleaved, and returns the medians as a PathCost named rejudge-other-tenant (NsPerPk:
// after a change, Before: without). Each run must forward the packet.
func benchRejudge(prog *ebpf.Program, reasons *ebpf.Map, pkt []byte, n int, change func(i int) error) (PathCost, error) {
	n = max(n, 200)
	before, err := readReasons(reasons)
	if err != nil {
		return PathCost{}, err
	}
	var after, plain []float64
	for i := range n {
		_, d, err := prog.Benchmark(append([]byte(nil), pkt...), 1, nil)
		if err != nil {
			return PathCost{}, fmt.Errorf("run without a change: %w", err)
		}
		plain = append(plain, float64(d.Nanoseconds()))
		if err := change(i); err != nil {
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
// i) as the agent's UpsertPolicy does: the compiled rules replaced, then the policy epoch
// moved.
func benchOtherTenantChange(objs *contivbpfObjects, pt *polTables, epg uint16, i int) error {
	rules := []contivbpfCbRule{{Prio: uint16(3 + 2*(i%50)), Action: uint8(contivbpfCbRuleActionCB_ACT_DENY), Proto: 17}}
	if err := pt.install(contivbpfCbPolKey{Epg: epg}, rules, 0); err != nil {
		return err
	}
	var epoch uint32
	if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
		return err
	}
	return objs.CbPolicyEpoch.Set(epoch + 1)
}
