package ebpf

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// progFuncs is one program's functions as the object holds them: each function's direct
// callees (bpf-to-bpf calls), its tail calls' indexes (-1: not a constant the test can
// read) and the maps its own body reads (globals too: .bss, .data, .rodata).
type progFuncs struct {
	main  string
	calls map[string][]string
	tails map[string][]int64
	maps  map[string]map[string]bool
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
		maps: map[string]map[string]bool{}}
	cur := ""
	var r3 int64 = -1
	for _, ins := range p.Instructions {
		if sym := ins.Symbol(); sym != "" {
			cur, r3 = sym, -1
			f.calls[cur] = f.calls[cur] // (a function that calls nothing is one too)
			f.maps[cur] = map[string]bool{}
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
// the fast path is a stage, not a second copy of the logic"). In the source, the entry
// program's body calls nothing but the fast stage (cb_fast_stage, inlined into it: the
// entry is its only caller) and the one tail call (cb_stage), besides cb_pull and the
// interface array's lookup. In the object, the entry makes one tail call in all, to the
// container stage (CB_CALL_CONTAINER); it calls only the delivery functions the fast
// stage shares with the stages (sending to another host, an inbound rate limit, a service
// reply's un-NAT, the drop record), and reads only the maps the fast stage reads
// (interface array, endpoints, conntrack, the groups' and services' state, counters): a
// stage's logic inlined into the entry (a function the compiler inlines shows no call)
// would read ARP's, QoS's, policy's, node port's or egress NAT's maps there. And no
// function a stage calls from its own body (the identity checks, ARP, QoS, the full
// stage's parse, judgement and ways outside) is in the entry program. A second fast path
// beside the fast stage, a stage's logic copied into the entry, or a second tail call (to
// the way outside, say) fails it. That the fast stage takes a packet as the container
// stage would is TestFastPathIsTheFullStage's.
func TestOneWayIn(t *testing.T) {
	src, err := os.ReadFile("../../../bpf/contivbpf.c")
	if err != nil {
		t.Fatal(err)
	}
	body := cBody(t, string(src), "int cb_from_container(struct __sk_buff *skb)")
	var called []string
	for _, m := range regexp.MustCompile(`\b([A-Za-z_][A-Za-z0-9_]*)\s*\(`).FindAllStringSubmatch(body, -1) {
		switch m[1] {
		case "if", "while", "for", "return", "sizeof", "cb_pull", "bpf_map_lookup_elem", "cb_fast_stage", "cb_stage":
		default:
			called = append(called, m[1])
		}
	}
	if len(called) > 0 || strings.Count(body, "cb_fast_stage(") != 1 || strings.Count(body, "cb_stage(") != 1 {
		t.Errorf("cb_from_container's body calls %v beside one cb_fast_stage and one cb_stage:\n%s", called, body)
	}

	entry := funcsOf(t, contivbpfProgCbFromContainer)
	const drop = "cb_emit_drop"
	shared := map[string]bool{drop: true, "cb_send_remote": true, "cb_qos_police": true, "cb_l4_nat": true}
	var own []string
	for _, fn := range entry.calls[entry.main] {
		if !shared[fn] {
			own = append(own, fn)
		}
	}
	if len(own) > 0 {
		t.Errorf("%s's own body calls %v: only the fast stage's delivery functions %v belong there", entry.main, own, shared)
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
	allowed := map[string]bool{contivbpfMapCbIfaceDirect: true, contivbpfMapCbCalls: true, contivbpfMapCbReasons: true,
		contivbpfMapCbEndpoints: true, contivbpfMapCbEpCounters: true, contivbpfMapCbCt: true, contivbpfMapCbCtGens: true,
		contivbpfMapCbEpgs: true, contivbpfMapCbZoneStamps: true, contivbpfMapCbKpods: true,
		contivbpfMapCbServices: true, contivbpfMapCbMembers: true, contivbpfMapCbSvcRevs: true,
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

// cBody is the body of the C function whose definition starts with sig in src: from the
// brace after it to the first closing brace at the start of a line.
func cBody(t *testing.T, src, sig string) string {
	t.Helper()
	i := strings.Index(src, sig+"\n{\n")
	if i < 0 {
		t.Fatalf("no %q in the source", sig)
	}
	rest := src[i+len(sig)+3:]
	j := strings.Index(rest, "\n}\n")
	if j < 0 {
		t.Fatalf("%q has no end", sig)
	}
	return rest[:j]
}
