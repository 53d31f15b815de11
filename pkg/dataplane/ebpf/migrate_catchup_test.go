package ebpf

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestMigrationCatchUp: entries the old programs change between the first copy and the
// switch reach the new map, entries the new programs wrote since are not overwritten, and
// per-CPU counters keep both sides' increments.
func TestMigrationCatchUp(t *testing.T) {
	testroot.Need(t)
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string, entries uint32) (*ebpf.Map, *ebpf.MapSpec) {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		ms.MaxEntries = entries
		return testMap(t, ms), ms
	}
	key := func(port uint16) contivbpfCbCtKey {
		return contivbpfCbCtKey{Zone: 1, Saddr: 1, Daddr: 2, Sport: port, Dport: 80, Proto: 6}
	}
	entry := func(state uint8, expires uint64) contivbpfCbCtEntry {
		return contivbpfCbCtEntry{Flags: uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), State: state, Expires: expires}
	}
	oldCT, _ := mk(contivbpfMapCbCt, 16)
	newCT, newSpec := mk(contivbpfMapCbCt, 32)
	for p, e := range map[uint16]contivbpfCbCtEntry{1: entry(1, 100), 2: entry(1, 100), 3: entry(1, 100)} {
		if err := oldCT.Put(key(p), e); err != nil {
			t.Fatal(err)
		}
	}
	mg := &migration{name: contivbpfMapCbCt, old: oldCT, new: newCT, spec: newSpec}
	if err := copyEntries(mg, nil, false); err != nil {
		t.Fatal(err)
	}
	// The window: old programs establish flow 1, touch flow 3 and open flow 4; the new
	// programs have meanwhile closed flow 3.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(oldCT.Put(key(1), entry(2, 900)))
	must(oldCT.Put(key(3), entry(2, 900)))
	must(oldCT.Put(key(4), entry(1, 500)))
	must(newCT.Put(key(3), entry(3, 950)))
	if err := copyEntries(mg, nil, true); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[uint16]contivbpfCbCtEntry{1: entry(2, 900), 2: entry(1, 100), 3: entry(3, 950), 4: entry(1, 500)} {
		var got contivbpfCbCtEntry
		if err := newCT.Lookup(key(p), &got); err != nil || got != want {
			t.Errorf("flow %d after catch-up: %+v (%v), want %+v", p, got, err, want)
		}
	}

	// Per-CPU counters: increments on both sides survive.
	oldR, _ := mk(contivbpfMapCbReasons, 64)
	newR, newRSpec := mk(contivbpfMapCbReasons, 128)
	ncpu := ebpf.MustPossibleCPU()
	vals := func(p, b uint64) []contivbpfCbCounter {
		v := make([]contivbpfCbCounter, ncpu)
		v[0] = contivbpfCbCounter{Packets: p, Bytes: b}
		return v
	}
	must(oldR.Put(uint32(5), vals(10, 100)))
	mr := &migration{name: contivbpfMapCbReasons, old: oldR, new: newR, spec: newRSpec}
	if err := copyEntries(mr, nil, false); err != nil {
		t.Fatal(err)
	}
	must(oldR.Put(uint32(5), vals(15, 150))) // old programs: +5 packets
	must(newR.Put(uint32(5), vals(11, 110))) // new programs: +1 packet
	if err := copyEntries(mr, nil, true); err != nil {
		t.Fatal(err)
	}
	var got []contivbpfCbCounter
	if err := newR.Lookup(uint32(5), &got); err != nil || got[0] != (contivbpfCbCounter{Packets: 16, Bytes: 160}) {
		t.Errorf("counter after catch-up %+v (%v), want 16 packets / 160 bytes", got, err)
	}
}

// TestMigrationWithoutFieldConversion: a pinned map whose key was no struct (cb_vips keyed
// by the bare VIP, before zones) migrates while empty and is refused with entries.
func TestMigrationWithoutFieldConversion(t *testing.T) {
	testroot.Need(t)
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[contivbpfMapCbVips].Copy()
	ms.Pinning = ebpf.PinNone
	ms.MaxEntries = 16
	for _, entries := range []int{0, 1} {
		old := testMap(t, &ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 16})
		for i := 0; i < entries; i++ {
			if err := old.Put(uint32(i+1), uint32(1)); err != nil {
				t.Fatal(err)
			}
		}
		err = copyEntries(&migration{name: contivbpfMapCbVips, old: old, new: testMap(t, ms), spec: ms}, nil, false)
		if entries == 0 && err != nil {
			t.Errorf("empty map: %v, want it migrated", err)
		}
		if entries > 0 && (err == nil || !strings.Contains(err.Error(), "key: size 4 → 8")) {
			t.Errorf("map with an entry: %v, want a 'key: size 4 → 8' error", err)
		}
	}
}

// testMap creates an unpinned map of spec ms, closed when the test ends.
func testMap(t *testing.T, ms *ebpf.MapSpec) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// The driver finds every map of the build by name (mapField: a layout change of any of
// them can be migrated; allMaps: all are unpinned at teardown), so a map added later needs
// no list kept by hand. No root needed.
func TestMapFieldsCoverBuild(t *testing.T) {
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	var d Driver
	all := map[string]bool{}
	for _, m := range d.allMaps() {
		all[m.name] = true
	}
	for name := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // global variables' sections
		}
		if d.mapField(name) == nil {
			t.Errorf("map %s: no driver field found by mapField", name)
		}
		if !all[name] {
			t.Errorf("map %s: not in allMaps", name)
		}
	}
	if d.mapField("cb_no_such_map") != nil {
		t.Error("mapField found a map this build does not have")
	}
}
