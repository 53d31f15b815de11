package ebpf

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// VerifierLimit is the kernel's bound on the instructions the verifier processes for one
// program (BPF_COMPLEXITY_LIMIT_INSNS); StackLimit its bound on a call chain's stack.
const (
	VerifierLimit = 1_000_000
	StackLimit    = 512
)

// ProgramBudget is what the verifier reported when it loaded one program: how much of its
// budget the program takes, so growth is seen before a newer clang or kernel refuses it.
type ProgramBudget struct {
	Program string
	// Insns is "processed N insns": instructions the verifier walked, over every path.
	Insns int
	// States and PeakStates are its total_states and peak_states.
	States, PeakStates int
	// Stack is the deepest call chain's combined stack, each frame rounded as the
	// verifier adds it for a JITed program (16 bytes), and Chain that chain's functions.
	Stack int
	Chain []string
}

// bpfLoopInlineFrame is what the verifier adds to a function's frame when it inlines its
// bpf_loop calls (three saved registers), after checking the combined stack.
const bpfLoopInlineFrame = 24

var (
	reProcessed = regexp.MustCompile(`processed (\d+) insns .* total_states (\d+) peak_states (\d+)`)
	reStack     = regexp.MustCompile(`(?m)^stack depth ([0-9+]+)$`)
)

// MeasureBudgets loads every program of the committed object (private, unpinned maps;
// nothing attached) with the verifier's statistics on and reports each one's budget,
// sorted by program name. Needs root.
func MeasureBudgets() ([]ProgramBudget, error) {
	spec, err := loadContivbpf()
	if err != nil {
		return nil, fmt.Errorf("budget: load spec: %w", err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
	if err != nil {
		return nil, fmt.Errorf("budget: load programs: %w", err)
	}
	defer coll.Close()
	var out []ProgramBudget
	for name, p := range coll.Programs {
		live, err := liveFuncs(p)
		if err != nil {
			return nil, fmt.Errorf("budget: %s: %w", name, err)
		}
		b, err := parseBudget(name, p.VerifierLog, spec.Programs[name].Instructions, live)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b ProgramBudget) int { return strings.Compare(a.Program, b.Program) })
	return out, nil
}

// liveFuncs are the names of the functions the kernel kept of program p: it removes a
// function every call of which it found dead (a stage that reaches it on no path), after
// its stack check, and its log prints no depth for it.
func liveFuncs(p *ebpf.Program) (map[string]bool, error) {
	info, err := p.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	fis, err := info.FuncInfos()
	if err != nil {
		return nil, fmt.Errorf("function infos: %w", err)
	}
	live := map[string]bool{}
	for _, fi := range fis {
		live[fi.Func.Name] = true
	}
	return live, nil
}

// parseBudget reads a LogLevelStats verifier log of program name, whose instructions
// (with its subprograms, in the order the kernel numbers them) are insns, of which the
// kernel kept the functions named in live (nil: all).
func parseBudget(name, log string, insns asm.Instructions, live map[string]bool) (ProgramBudget, error) {
	b := ProgramBudget{Program: name}
	m := reProcessed.FindStringSubmatch(log)
	if m == nil {
		return b, fmt.Errorf("budget: %s: no statistics in the verifier log %q", name, log)
	}
	b.Insns, _ = strconv.Atoi(m[1])
	b.States, _ = strconv.Atoi(m[2])
	b.PeakStates, _ = strconv.Atoi(m[3])
	s := reStack.FindStringSubmatch(log)
	if s == nil {
		return b, fmt.Errorf("budget: %s: no stack depths in the verifier log %q", name, log)
	}
	var depths []int
	for _, f := range strings.Split(s[1], "+") {
		d, err := strconv.Atoi(f)
		if err != nil {
			return b, fmt.Errorf("budget: %s: stack depth %q: %w", name, s[1], err)
		}
		depths = append(depths, d)
	}
	stack, chain, err := deepestChain(insns, depths, live)
	if err != nil {
		return b, fmt.Errorf("budget: %s: %w", name, err)
	}
	b.Stack, b.Chain = stack, chain
	return b, nil
}

// deepestChain walks the call graph of insns (calls and the callbacks handed to helpers
// such as bpf_loop, which the verifier counts as calls) from the entry function and
// returns the deepest chain's stack as the verifier checks it: depths[i] (the frame of the
// i-th function in instruction order, as the log prints it) rounded up to 16 bytes per
// frame (a JITed program). The log prints frames after bpf_loop calls were inlined, which
// gives their caller bpfLoopInlineFrame bytes more than the check saw: taken off only
// where the call is inlined (loopInlined). Functions not in live (nil: all live) are the
// ones the kernel removed as dead: the log prints no depth for them, yet the kernel's
// check walked them (before it removed them) as frames of 0 bytes, calls included, and
// so does the chain.
func deepestChain(insns asm.Instructions, depths []int, live map[string]bool) (int, []string, error) {
	var fns []string
	index := map[string]int{}
	calls := map[int][]string{}
	loops := map[int]bool{}
	targets := jumpTargets(insns)
	cur := -1
	for i, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			cur = len(fns)
			index[sym] = cur
			fns = append(fns, sym)
		}
		if cur >= 0 && ins.IsBuiltinCall() && ins.Constant == int64(asm.FnLoop) && loopInlined(insns, i, targets) {
			loops[cur] = true
		}
		if cur >= 0 && (ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer()) && ins.Reference() != "" {
			calls[cur] = append(calls[cur], ins.Reference())
		}
	}
	// The log's depths are the kept functions', in order; a removed one's frame is 0.
	frames := make([]int, len(fns))
	kept := 0
	for i, fn := range fns {
		if live != nil && !live[fn] {
			continue
		}
		if kept < len(depths) {
			frames[i] = depths[kept]
		}
		kept++
	}
	if kept != len(depths) {
		return 0, nil, fmt.Errorf("%d functions kept but %d stack depths", kept, len(depths))
	}
	type best struct {
		stack int
		chain []string
	}
	memo := map[int]best{}
	onPath := map[int]bool{}
	var walk func(i int) (best, error)
	walk = func(i int) (best, error) {
		if b, ok := memo[i]; ok {
			return b, nil
		}
		if onPath[i] {
			return best{}, fmt.Errorf("recursion through %s", fns[i])
		}
		onPath[i] = true
		defer delete(onPath, i)
		var deepest best
		for _, callee := range calls[i] {
			j, ok := index[callee]
			if !ok {
				return best{}, fmt.Errorf("%s calls unknown function %s", fns[i], callee)
			}
			b, err := walk(j)
			if err != nil {
				return best{}, err
			}
			if b.stack > deepest.stack {
				deepest = b
			}
		}
		d := frames[i]
		if loops[i] {
			d = max(d-bpfLoopInlineFrame, 0)
		}
		b := best{stack: (d+15)&^15 + deepest.stack, chain: append([]string{fns[i]}, deepest.chain...)}
		memo[i] = b
		return b, nil
	}
	if len(fns) == 0 {
		return 0, nil, fmt.Errorf("no functions")
	}
	b, err := walk(0)
	return b.stack, b.chain, err
}

// jumpTargets returns the indexes (in insns) of the instructions some jump lands on.
func jumpTargets(insns asm.Instructions) map[int]bool {
	at := map[asm.RawInstructionOffset]int{}
	it := insns.Iterate()
	for it.Next() {
		at[it.Offset] = it.Index
	}
	out := map[int]bool{}
	it = insns.Iterate()
	for it.Next() {
		op := it.Ins.OpCode
		if c := op.Class(); (c == asm.JumpClass || c == asm.Jump32Class) && op.JumpOp() != asm.Call && op.JumpOp() != asm.Exit {
			if j, ok := at[it.Offset+1+asm.RawInstructionOffset(it.Ins.Offset)]; ok {
				out[j] = true
			}
		}
	}
	return out
}

// loopInlined says whether the verifier inlines the bpf_loop call at insns[i]: it does
// when the flags (R4) are a known 0 (and the callback is the same on every path, which
// one call site per function gives). Proven only when the last write to R4 before the
// call is "r4 = 0" in straight-line code no jump lands in; otherwise nothing is taken
// off, so the stack is never under-counted.
func loopInlined(insns asm.Instructions, i int, targets map[int]bool) bool {
	if targets[i] {
		return false // a jump lands on the call: R4 may come from elsewhere
	}
	for j := i - 1; j >= 0; j-- {
		ins := insns[j]
		c := ins.OpCode.Class()
		if c == asm.JumpClass || c == asm.Jump32Class {
			return false
		}
		if c == asm.StXClass && ins.OpCode.Mode() == asm.AtomicMode && ins.Src == asm.R4 {
			return false // an atomic fetch writes its source register
		}
		if ins.Dst == asm.R4 && (c.IsALU() || c == asm.LdClass || c == asm.LdXClass) {
			return c.IsALU() && ins.OpCode.ALUOp() == asm.Mov && ins.OpCode.Source() == asm.ImmSource && ins.Constant == 0
		}
		if ins.Symbol() != "" || targets[j] {
			return false // a function's start, or a jump lands here: R4 may come from elsewhere
		}
	}
	return false
}
