package ebpf

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// Every program's verifier budget (issue "Datapath v3"): at most a quarter of the
// instruction limit and 448 bytes of stack on its deepest call chain, so a newer clang, a
// stricter kernel or the next stage still fit.
const (
	budgetInsns = VerifierLimit / 4
	budgetStack = 448
)

// TestVerifierBudget loads every program with the verifier's statistics and fails when
// one takes more than its budget of processed instructions or of stack.
func TestVerifierBudget(t *testing.T) {
	testroot.Need(t)
	t.Parallel()
	budgets, err := MeasureBudgets()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	if len(budgets) != len(spec.Programs) {
		t.Fatalf("measured %d programs, the object has %d", len(budgets), len(spec.Programs))
	}
	for _, b := range budgets {
		insns, stack := budgetInsns, budgetStack
		t.Logf("%s: %d instructions verified (%.1f %% of the limit), %d states, stack %d bytes (%v)",
			b.Program, b.Insns, 100*float64(b.Insns)/VerifierLimit, b.States, b.Stack, b.Chain)
		if b.Insns > insns {
			t.Errorf("%s: the verifier processed %d instructions, over its budget of %d", b.Program, b.Insns, insns)
		}
		if b.Stack > stack {
			t.Errorf("%s: its deepest call chain takes %d bytes of stack, over its budget of %d: %v", b.Program, b.Stack, stack, b.Chain)
		}
		if b.Stack > StackLimit {
			t.Errorf("%s: computed stack %d is over the kernel's %d, yet it loaded: the chain computation is wrong", b.Program, b.Stack, StackLimit)
		}
	}
}

// TestDeepestChain checks the chain computation on a small call graph: frames rounded to
// 16 bytes, the deepest branch chosen, a bpf_loop caller's inlining bytes taken off and a
// callback counted as a call.
func TestDeepestChain(t *testing.T) {
	insns := asm.Instructions{
		asm.Call.Label("a").WithSymbol("main"),
		asm.Call.Label("b"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("a"),
		asm.Return(),
		asm.LoadImm(asm.R2, 0, asm.DWord).WithSymbol("b"),
		asm.FnLoop.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("cb"),
		asm.Return(),
	}
	// b hands cb to bpf_loop (a function pointer load referencing it).
	insns[5] = asm.Instruction{OpCode: asm.LoadImmOp(asm.DWord), Dst: asm.R2, Src: asm.PseudoFunc}.WithSymbol("b").WithReference("cb")
	stack, chain, err := deepestChain(insns, []int{8, 100, 24 + 40, 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// main 16 + a 112 = 128; main 16 + b (64-24 → 48) + cb 16 = 80.
	if stack != 128 || len(chain) != 2 || chain[1] != "a" {
		t.Errorf("got %d %v, want 128 [main a]", stack, chain)
	}
	if _, _, err := deepestChain(insns, []int{8}, nil); err == nil {
		t.Error("a depth list that does not match the functions was accepted")
	}
	// The kernel removed a (every call of it dead): no depth printed, yet its check walked
	// it as a frame of 0 bytes, its calls included (found by review: a removed function's
	// calls were skipped, and a chain through it went uncounted).
	live := map[string]bool{"main": true, "b": true, "cb": true}
	stack, chain, err = deepestChain(insns, []int{8, 24 + 40, 8}, live)
	if err != nil {
		t.Fatal(err)
	}
	if stack != 96 || len(chain) != 3 || chain[1] != "b" {
		t.Errorf("a removed: got %d %v, want 96 [main b cb]", stack, chain)
	}
	through := asm.Instructions{
		asm.Call.Label("x").WithSymbol("main"),
		asm.Call.Label("f"),
		asm.Return(),
		asm.Call.Label("d").WithSymbol("x"), // dead: d is removed
		asm.Return(),
		asm.Call.Label("f").WithSymbol("d"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("f"),
		asm.Return(),
	}
	live = map[string]bool{"main": true, "x": true, "f": true}
	stack, chain, err = deepestChain(through, []int{16, 240, 240}, live)
	if err != nil {
		t.Fatal(err)
	}
	if stack != 496 || len(chain) != 4 || chain[2] != "d" {
		t.Errorf("through a removed function: got %d %v, want 496 [main x d f]", stack, chain)
	}
}

// TestDeepestChainLoopFlags (found by reviews of the budget test): the verifier adds
// bpfLoopInlineFrame to a bpf_loop caller only when it inlines the call (flags a known 0
// on every path). A call whose flags come from the packet, directly or along a jump that
// lands on the call itself ("if r4 != 0 goto call; r4 = 0; call"), is not inlined:
// nothing may be taken off, or a chain the verifier checks at 448 + 16 bytes (over the
// budget) would be reported as 432. Inlined, the log prints 464 + 16 and the check saw
// 440 + 16: 24 come off. All three chains are 464 as the verifier checks them.
func TestDeepestChainLoopFlags(t *testing.T) {
	testroot.Need(t)
	mark := asm.LoadMem(asm.R4, asm.R1, 8, asm.Word) // __sk_buff.mark: not a known constant
	for _, tc := range []struct {
		name        string
		pre, atCall asm.Instructions // R4's writes before R1-R3 are set, and right before the call
	}{
		{"flags-from-packet", asm.Instructions{mark}, nil},
		{"flags-zero", asm.Instructions{asm.Mov.Imm(asm.R4, 0)}, nil},
		{"jump-onto-the-call", asm.Instructions{mark}, asm.Instructions{
			{OpCode: asm.JNE.Op(asm.ImmSource), Dst: asm.R4, Offset: 1, Constant: 0}, // to the call
			asm.Mov.Imm(asm.R4, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := loopProgramStack(t, tc.pre, tc.atCall); got != 448+16 {
				t.Errorf("computed stack %d, want %d", got, 448+16)
			}
		})
	}
}

// loopProgramStack loads a program whose main function (440 bytes of stack) hands a
// callback (16 bytes) to bpf_loop, R4 (the flags) written by pre and atCall, and returns
// the stack parseBudget computes for it.
func loopProgramStack(t *testing.T, pre, atCall asm.Instructions) int {
	t.Helper()
	i64 := &btf.Int{Name: "long", Size: 8, Encoding: btf.Signed}
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	vp := &btf.Pointer{Target: &btf.Void{}}
	mainFn := &btf.Func{Name: "main", Linkage: btf.GlobalFunc, Type: &btf.FuncProto{Return: &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
		Params: []btf.FuncParam{{Name: "ctx", Type: vp}}}}
	cbFn := &btf.Func{Name: "cb", Linkage: btf.StaticFunc, Type: &btf.FuncProto{Return: i64,
		Params: []btf.FuncParam{{Name: "i", Type: u32}, {Name: "data", Type: vp}}}}
	insns := asm.Instructions{
		btf.WithFuncMetadata(asm.Mov.Imm(asm.R0, 0).WithSymbol("main"), mainFn),
		asm.StoreMem(asm.RFP, -440, asm.R0, asm.DWord),
	}
	insns = append(insns, pre...)
	insns = append(insns,
		asm.Mov.Imm(asm.R1, 1),
		asm.Instruction{OpCode: asm.LoadImmOp(asm.DWord), Dst: asm.R2, Src: asm.PseudoFunc, Constant: -1}.WithReference("cb"),
		asm.Mov.Imm(asm.R3, 0))
	insns = append(insns, atCall...)
	insns = append(insns,
		asm.FnLoop.Call(),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		btf.WithFuncMetadata(asm.Mov.Imm(asm.R0, 0).WithSymbol("cb"), cbFn),
		asm.StoreMem(asm.RFP, -16, asm.R0, asm.DWord),
		asm.Mov.Imm(asm.R0, 1),
		asm.Return())
	p, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{Name: "budget_loop", Type: ebpf.SchedCLS, License: "GPL", Instructions: insns},
		ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b, err := parseBudget("budget_loop", p.VerifierLog, insns, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("verifier: %s; computed %d %v", p.VerifierLog, b.Stack, b.Chain)
	return b.Stack
}
