//go:build cbbench

package ebpf

import (
	"testing"

	"github.com/cilium/ebpf/asm"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// The restoring copies' context slot lies below every stack byte the program addresses,
// directly or through a copy of the frame pointer, and nowhere deeper than needed.
func TestRestoreSlot(t *testing.T) {
	for _, c := range []struct {
		name string
		ins  asm.Instructions
		want int16
	}{
		{"no stack", asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}, -8},
		{"store", asm.Instructions{asm.StoreImm(asm.RFP, -4, 0, asm.Word)}, -16},
		{"load", asm.Instructions{asm.LoadMem(asm.R3, asm.RFP, -24, asm.DWord)}, -32},
		{"key pointer", asm.Instructions{asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, -20)}, -32},
		{"pointer moved on", asm.Instructions{asm.Mov.Reg(asm.R2, asm.RFP), asm.Add.Imm(asm.R2, -8), asm.Mov.Reg(asm.R3, asm.R2), asm.Add.Imm(asm.R3, -40)}, -56},
		{"store through a copy", asm.Instructions{asm.Mov.Reg(asm.R6, asm.RFP), asm.Add.Imm(asm.R6, -16), asm.StoreImm(asm.R6, -12, 0, asm.Word)}, -40},
		{"register reused", asm.Instructions{asm.Mov.Reg(asm.R2, asm.RFP), asm.Mov.Imm(asm.R2, 7), asm.Add.Imm(asm.R2, -64)}, -8},
		{"clobbered by a call", asm.Instructions{asm.Mov.Reg(asm.R2, asm.RFP), asm.FnMapLookupElem.Call(), asm.Add.Imm(asm.R2, -64)}, -8},
	} {
		if got := restoreSlot(c.ins); got != c.want {
			t.Errorf("%s: slot %d, want %d", c.name, got, c.want)
		}
	}
}

// MeasurePaths must time every path it names, each after checking the packet took it.
func TestMeasurePaths(t *testing.T) {
	testroot.Need(t)
	costs, err := MeasurePaths(20000)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"noop": true, "noop-single": true, "local": true, "ref-forward": true, "arp-reply": true, "tunnel-encap": true,
		"tunnel-decap": true, "drop-unknown-dst": true, "vlan-push": true, "vlan-pop": true, "local-single": true,
		"stage-unknown-iface": true, "stage-not-ipv4": true, "service": true, "ct-established": true, "rejudge-other-tenant": true}
	for _, c := range costs {
		if c.NsPerPk <= 0 {
			t.Errorf("%s: %.1f ns", c.Name, c.NsPerPk)
		}
		// Every path's ratio has its own reference timing; the service path (it rewrites
		// its packet) is timed hot through the restoring copies.
		// (A paired figure, rejudge-other-tenant, is its own reference: Before.)
		if c.RefNs <= 0 && c.Name != "ref-forward" && c.Program != "cb_bench_noop" && c.Before <= 0 {
			t.Errorf("%s: no reference timed around it", c.Name)
		}
		if (c.Name == "service") != (c.BaseNs > 0) {
			t.Errorf("%s: restored difference %.1f ns", c.Name, c.RestoredDiff)
		}
		delete(want, c.Name)
		t.Logf("%-18s %-18s %7.1f ns/packet single=%v", c.Name, c.Program, c.NsPerPk, c.Single)
	}
	if len(want) != 0 {
		t.Errorf("paths not measured: %v", want)
	}
}
