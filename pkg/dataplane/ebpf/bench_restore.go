//go:build cbbench

package ebpf

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// benchRestoreSlot is the stack slot the restoring copy keeps the context in: just below
// the entry program's own frame (24 bytes, rounded to 32 by the verifier anyway), so the
// program's stack depth does not move.
const benchRestoreSlot = -32

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
	// Entry: keep the context; the first instruction keeps the program's metadata.
	out = append(out, asm.StoreMem(asm.RFP, benchRestoreSlot, asm.R1, asm.DWord).WithMetadata(orig[0].Metadata))
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
		asm.LoadMem(asm.R1, asm.RFP, benchRestoreSlot, asm.DWord),
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
