//go:build cbbench

package ebpf

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// restoreSlot is the stack slot a restoring copy of the entry program whose own
// instructions (before its first subprogram) are ins keeps the context in: the 8 bytes
// below the lowest the program addresses (a load or store off the frame pointer, or an
// offset added to a copy of it), so no local of the program's shares it. The frame grows
// by at most 8 bytes. A miss is loud, never silent: a program whose frame cannot grow, or
// a local this scan did not see (the context slot overwritten), fails the verifier.
func restoreSlot(ins asm.Instructions) int16 {
	low := int64(0)
	// fp holds, for each register that holds the frame pointer plus an offset, the offset.
	fp := map[asm.Register]int64{asm.RFP: 0}
	at := func(r asm.Register, off int64) {
		if base, ok := fp[r]; ok {
			low = min(low, base+off)
		}
	}
	for _, in := range ins {
		op := in.OpCode
		cls := op.Class()
		switch {
		case cls.IsLoad() && op.Mode() == asm.MemMode:
			at(in.Src, int64(in.Offset))
			delete(fp, in.Dst)
		case cls.IsStore():
			at(in.Dst, int64(in.Offset))
		case cls.IsALU() && op.ALUOp() == asm.Mov && op.Source() == asm.RegSource:
			if base, ok := fp[in.Src]; ok {
				fp[in.Dst] = base
			} else {
				delete(fp, in.Dst)
			}
		case cls.IsALU() && op.ALUOp() == asm.Add && op.Source() == asm.ImmSource:
			if base, ok := fp[in.Dst]; ok && in.Dst != asm.RFP {
				fp[in.Dst] = base + in.Constant
				at(in.Dst, 0)
			}
		case cls.IsALU() || cls.IsLoad():
			delete(fp, in.Dst)
		case op.JumpOp() == asm.Call:
			for r := asm.R0; r <= asm.R5; r++ {
				delete(fp, r)
			}
		}
	}
	down := -((-low + 7) / 8 * 8) // low rounded down to a multiple of 8
	return int16(down - 8)
}

// The restoring copies MeasurePaths loads: the service flow's packet and the established
// direct flow's.
const (
	benchRestoreSvc    = "cb_bench_rst_svc"
	benchRestoreDirect = "cb_bench_rst_direct"
)

// restoring returns a copy of the entry program spec p that, whenever it returns, first
// writes the first len(pkt) bytes (a multiple of 2, at most 64) of pkt back over the
// packet: a path that rewrites its packet (DNAT, MACs) then meets the same packet on every
// one of Program.Benchmark's repeated runs, hot, as a flow's packets meet it. The copy runs
// the program's own instructions; what it adds (a stack store at entry, the stores before
// it returns) is the same for any packet, so the difference of two packets' times through
// copies of it is the difference of their paths.
func restoring(p *ebpf.ProgramSpec, pkt []byte) (*ebpf.ProgramSpec, error) {
	if len(pkt)%2 != 0 || len(pkt) > 64 {
		return nil, fmt.Errorf("restoring %s: %d bytes to restore, want an even count up to 64", p.Name, len(pkt))
	}
	const label = "cb_bench_restore"
	orig := p.Instructions
	end := len(orig)
	for i := 1; i < len(orig); i++ {
		if orig[i].Symbol() != "" {
			end = i // the first subprogram
			break
		}
	}
	var out asm.Instructions
	slot := restoreSlot(orig[:end])
	// Entry: keep the context; the first instruction keeps the program's metadata.
	out = append(out, asm.StoreMem(asm.RFP, slot, asm.R1, asm.DWord).WithMetadata(orig[0].Metadata))
	out = append(out, orig[0].WithMetadata(asm.Metadata{}).WithSource(orig[0].Source()))
	for _, ins := range orig[1:end] {
		if ins.OpCode.JumpOp() == asm.Exit {
			ins = asm.Ja.Label(label).WithSource(ins.Source())
		}
		out = append(out, ins)
	}
	// Exit: the verdict aside, the packet's bytes back (when it still has them), return.
	var stores asm.Instructions
	for off := 0; off < len(pkt); {
		if len(pkt)-off >= 4 {
			stores = append(stores, asm.StoreImm(asm.R2, int16(off), int64(int32(binary.LittleEndian.Uint32(pkt[off:]))), asm.Word))
			off += 4
			continue
		}
		stores = append(stores, asm.StoreImm(asm.R2, int16(off), int64(binary.LittleEndian.Uint16(pkt[off:])), asm.Half))
		off += 2
	}
	out = append(out,
		asm.Mov.Reg(asm.R6, asm.R0).WithSymbol(label),
		asm.LoadMem(asm.R1, asm.RFP, slot, asm.DWord),
		asm.LoadMem(asm.R2, asm.R1, 76, asm.Word), // skb->data
		asm.LoadMem(asm.R3, asm.R1, 80, asm.Word), // skb->data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, int32(len(pkt))),
		asm.JGT.Reg(asm.R4, asm.R3, label+"_out"),
	)
	out = append(out, stores...)
	out = append(out, asm.Mov.Reg(asm.R0, asm.R6).WithSymbol(label+"_out"), asm.Return())
	out = append(out, orig[end:]...)
	c := p.Copy()
	c.Name = "cb_bench_rst" // a kernel name: 15 characters at most
	c.Instructions = out
	return c, nil
}
