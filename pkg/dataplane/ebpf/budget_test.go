package ebpf

import (
	"testing"

	"github.com/cilium/ebpf/asm"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// Every program's verifier budget (issue "Datapath v3"): at most a quarter of the
// instruction limit and 448 bytes of stack on its deepest call chain, so a newer clang, a
// stricter kernel or the next stage still fit.
const (
	budgetInsns = VerifierLimit / 4
	budgetStack = 448
)

// legacyBudgets are the programs that predate the staged pipeline and are over the
// budget: each may not grow past its ceiling (today's figure plus a few percent), and
// each entry goes once its program is split into stages. Lower a ceiling whenever a
// change lowers its program; never raise one to make a change fit.
var legacyBudgets = map[string]struct{ insns, stack int }{
	contivbpfProgCbFromContainer: {640_000, 512},
	contivbpfProgCbFromWire:      {290_000, budgetStack},
	contivbpfProgCbFromUplink:    {budgetInsns, 512},
	contivbpfProgCbFromOverlay:   {budgetInsns, 512},
}

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
		if l, ok := legacyBudgets[b.Program]; ok {
			insns, stack = l.insns, l.stack
		}
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
	stack, chain, err := deepestChain(insns, []int{8, 100, 24 + 40, 8})
	if err != nil {
		t.Fatal(err)
	}
	// main 16 + a 112 = 128; main 16 + b (64-24 → 48) + cb 16 = 80.
	if stack != 128 || len(chain) != 2 || chain[1] != "a" {
		t.Errorf("got %d %v, want 128 [main a]", stack, chain)
	}
	if _, _, err := deepestChain(insns, []int{8}); err == nil {
		t.Error("a depth list that does not match the functions was accepted")
	}
}
