package ebpf

import (
	"sort"
	"testing"

	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

// progFuncs is one program's functions as the object holds them: each function's direct
// callees (bpf-to-bpf calls), its tail calls' indexes (-1: not a constant the test can
// read), the maps its own body reads (globals too: .bss, .data, .rodata) and whether BTF
// declares it global (the verifier checks a global function once, on its own, whatever
// its callers pass).
type progFuncs struct {
	main   string
	calls  map[string][]string
	tails  map[string][]int64
	maps   map[string]map[string]bool
	global map[string]bool
}

// funcsOf reads program name's functions from the object.
func funcsOf(t *testing.T, name string) progFuncs {
	t.Helper()
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	p := spec.Programs[name]
	if p == nil {
		t.Fatalf("no program %s in the object", name)
	}
	f := progFuncs{main: name, calls: map[string][]string{}, tails: map[string][]int64{},
		maps: map[string]map[string]bool{}, global: map[string]bool{}}
	cur := ""
	var r3 int64 = -1
	for _, ins := range p.Instructions {
		if sym := ins.Symbol(); sym != "" {
			cur, r3 = sym, -1
			f.calls[cur] = f.calls[cur] // (a function that calls nothing is one too)
			f.maps[cur] = map[string]bool{}
			if fn := btf.FuncMetadata(&ins); fn != nil && fn.Linkage == btf.GlobalFunc {
				f.global[cur] = true
			}
		}
		if ins.IsLoadFromMap() {
			f.maps[cur][ins.Reference()] = true
		}
		switch {
		case ins.IsFunctionCall() && ins.Reference() != "":
			f.calls[cur] = append(f.calls[cur], ins.Reference())
		case ins.IsBuiltinCall() && asm.BuiltinFunc(ins.Constant) == asm.FnTailCall:
			f.tails[cur] = append(f.tails[cur], r3)
		case ins.Dst == asm.R3 && ins.OpCode.Class().IsALU() && ins.OpCode.ALUOp() == asm.Mov &&
			ins.OpCode.Source() == asm.ImmSource:
			r3 = ins.Constant
		case ins.Dst == asm.R3:
			r3 = -1
		}
	}
	return f
}

// all is every function of the program (its own and those it reaches).
func (f progFuncs) all() map[string]bool {
	m := map[string]bool{}
	for fn := range f.calls {
		m[fn] = true
	}
	return m
}

// TestOneWayIn: a container's packet has one way in (issue 33: "one way in per direction;
// the fast path is a stage, not a second copy of the logic"). The entry program's own
// body calls one function, the fast stage, which is global (verified once, on its own,
// for an interface entry of the array); the entry
// program makes one tail call in all, to the container stage (CB_CALL_CONTAINER); and no
// function the container stage or a stage after it calls from its own body (the identity
// checks, ARP, QoS, the full stage's parse, judgement and ways outside) is in the entry
// program. Nor does the entry's own body read any map but the interface table (the array,
// and the hash through the per-CPU copy), the program array, the drop counters and the
// globals: a path or check inlined into it (a function the compiler inlines shows no
// call) would look up endpoints, conntrack or policy there. A second fast path beside the
// fast stage, a stage's logic copied into the entry, or a second tail call (to the way
// outside, say) fails it. That the fast stage
// takes a packet as the container stage would is TestFastPathIsTheFullStage's. (Every
// program records its drops through cb_emit_drop, drop.h: the one function they share
// that decides nothing.)
func TestOneWayIn(t *testing.T) {
	entry := funcsOf(t, contivbpfProgCbFromContainer)
	const fast, drop = "cb_fast_stage", "cb_emit_drop"
	var own []string
	for _, fn := range entry.calls[entry.main] {
		if fn != drop {
			own = append(own, fn)
		}
	}
	if len(own) != 1 || own[0] != fast {
		t.Errorf("%s's own body calls %v, want only %s (and %s)", entry.main, own, fast, drop)
	}
	if !entry.global[fast] {
		t.Errorf("%s is not a global function: the verifier checks it once per kind of entry pointer", fast)
	}
	var tails []int64
	where := map[string]bool{}
	for fn, ix := range entry.tails {
		tails = append(tails, ix...)
		where[fn] = true
	}
	if len(tails) != 1 || tails[0] != 0 || !where[entry.main] { // CB_CALL_CONTAINER
		t.Errorf("%s makes tail calls %v (in %v), want one, to CB_CALL_CONTAINER (0), from its own body", entry.main, tails, where)
	}
	allowed := map[string]bool{contivbpfMapCbIfaceDirect: true, contivbpfMapCbIfaces: true,
		contivbpfMapCbIfaceScratch: true, contivbpfMapCbCalls: true, contivbpfMapCbReasons: true,
		".bss": true, ".data": true, ".rodata": true}
	var extra []string
	for m := range entry.maps[entry.main] {
		if !allowed[m] {
			extra = append(extra, m)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("%s's own body reads %v: logic of a stage inlined into the entry", entry.main, extra)
	}
	in := entry.all()
	for _, stage := range []string{contivbpfProgCbStageContainer, contivbpfProgCbStageIpv4Judge,
		contivbpfProgCbStageOutside, contivbpfProgCbStageEgress} {
		s := funcsOf(t, stage)
		var both []string
		for _, fn := range s.calls[s.main] {
			if in[fn] && fn != drop {
				both = append(both, fn)
			}
		}
		sort.Strings(both)
		if len(both) > 0 {
			t.Errorf("%s calls %v from its own body, and %s holds them too: a second way into the stage's logic",
				stage, both, entry.main)
		}
	}
}
