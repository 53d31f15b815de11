package ebpf

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// qosEntry56 is cb_qos_entry as the builds before per-endpoint drop counts laid it out
// (56 bytes): buckets of tat, nsb and tau only.
type qosBucket24 struct{ Tat, Nsb, Tau uint64 }
type qosEntry56 struct {
	Lock, Generation uint32
	Out, In          qosBucket24
}

// legacyQoSLayout is this build's cb_qos_entry type without the buckets' drop counts.
func legacyQoSLayout(t *testing.T, typ btf.Type) btf.Type {
	t.Helper()
	st, ok := asStruct(btf.Copy(typ))
	if !ok {
		t.Fatalf("%v is no struct", typ)
	}
	var bucket *btf.Struct
	var off btf.Bits
	for i, m := range st.Members {
		if b, ok := asStruct(m.Type); ok && b.Name == "cb_qos_bucket" {
			if bucket == nil {
				bucket = b
				var ms []btf.Member
				for _, bm := range b.Members {
					if bm.Name == "tat" || bm.Name == "nsb" || bm.Name == "tau" {
						ms = append(ms, bm)
					}
				}
				b.Members, b.Size = ms, 24
				off = m.Offset
			}
			st.Members[i].Type, st.Members[i].Offset = bucket, off
			off += 24 * 8
		}
	}
	st.Size = uint32(off / 8)
	if st.Size != uint32(binary.Size(qosEntry56{})) {
		t.Fatalf("legacy cb_qos_entry of %d bytes, want %d", st.Size, binary.Size(qosEntry56{}))
	}
	return st
}

// TestQoSMigrateFromUndroppedLayout: a host upgraded from the build whose cb_qos buckets
// had no drop counts (cb_qos_entry 56 → 88 bytes) keeps every limited endpoint's rate,
// burst and bucket state: the buckets are nested structs that grew, and a member copied
// only when its size is unchanged came across as zero, that is unlimited, until a Sync
// rewrote it (fail open).
func TestQoSMigrateFromUndroppedLayout(t *testing.T) {
	testroot.Need(t)
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[contivbpfMapCbQos].Copy()
	ms.Pinning = ebpf.PinNone
	ms.MaxEntries = 8
	oms := ms.Copy()
	oms.Value = legacyQoSLayout(t, oms.Value)
	oms.ValueSize = uint32(binary.Size(qosEntry56{}))
	old := testMap(t, oms)
	want := qosEntry56{Generation: 3, Out: qosBucket24{Tat: 111, Nsb: 222, Tau: 333}, In: qosBucket24{Tat: 444, Nsb: 555, Tau: 666}}
	if err := old.Update(uint32(5), &want, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	nm := testMap(t, ms)
	mg := &migration{name: contivbpfMapCbQos, old: old, new: nm, spec: ms}
	if why := layoutDiff(ms, old); why == "" {
		t.Fatal("the legacy cb_qos does not differ from this build's")
	}
	if err := copyEntries(mg, nil, false); err != nil {
		t.Fatal(err)
	}
	var got contivbpfCbQosEntry
	if err := nm.Lookup(uint32(5), &got); err != nil {
		t.Fatal(err)
	}
	if got.Generation != want.Generation ||
		got.Out.Tat != want.Out.Tat || got.Out.Nsb != want.Out.Nsb || got.Out.Tau != want.Out.Tau ||
		got.In.Tat != want.In.Tat || got.In.Nsb != want.In.Nsb || got.In.Tau != want.In.Tau ||
		got.Out.Dropped != 0 || got.In.DroppedBytes != 0 {
		t.Errorf("migrated cb_qos[5] = %+v, want buckets %+v (drop counts zero)", got, want)
	}

	// Under traffic: the old programs move slot 5's buckets on before the links switch
	// (the catch-up copy carries that), and the new programs slot 6's (theirs is kept).
	other := qosEntry56{Generation: 4, Out: qosBucket24{Tat: 1, Nsb: 2, Tau: 3}}
	if err := old.Update(uint32(6), &other, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	mg = &migration{name: contivbpfMapCbQos, old: old, new: nm, spec: ms}
	if err := copyEntries(mg, nil, false); err != nil {
		t.Fatal(err)
	}
	want.Out.Tat, want.In.Tat = 1111, 4444
	other.Out.Tat = 10
	for slot, v := range map[uint32]qosEntry56{5: want, 6: other} {
		if err := old.Update(slot, &v, ebpf.UpdateLock); err != nil {
			t.Fatal(err)
		}
	}
	newer := contivbpfCbQosEntry{Generation: 4}
	newer.Out.Tat, newer.Out.Nsb, newer.Out.Tau, newer.Out.Dropped = 20, 2, 3, 1
	if err := nm.Update(uint32(6), &newer, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	if err := copyEntries(mg, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := nm.Lookup(uint32(5), &got); err != nil || got.Out.Tat != 1111 || got.In.Tat != 4444 || got.Out.Nsb != 222 || got.In.Tau != 666 {
		t.Errorf("slot 5 after catch-up %+v (%v), want the old programs' tat 1111/4444 with rates kept", got, err)
	}
	if err := nm.Lookup(uint32(6), &got); err != nil || got.Out != newer.Out {
		t.Errorf("slot 6 after catch-up %+v (%v), want the new programs' bucket %+v", got, err, newer.Out)
	}
}
