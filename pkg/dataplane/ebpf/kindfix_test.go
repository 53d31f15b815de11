package ebpf

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// legacyLayout is t (a struct of this build with a member "kind" followed by "pad") as the
// builds before the kind field laid it out: no "kind", and "pad" one byte longer in its
// place.
func legacyLayout(t *testing.T, typ btf.Type) btf.Type {
	t.Helper()
	st, ok := asStruct(btf.Copy(typ))
	if !ok {
		t.Fatalf("%v is no struct", typ)
	}
	var kindOff btf.Bits
	var members []btf.Member
	for _, m := range st.Members {
		switch m.Name {
		case "kind":
			kindOff = m.Offset
			continue
		case "pad":
			m.Offset = kindOff
			m.Type = &btf.Array{Index: &btf.Int{Name: "int", Size: 4}, Type: &btf.Int{Name: "unsigned char", Size: 1}, Nelems: uint32(sizeOf(m.Type)) + 1}
		}
		members = append(members, m)
	}
	st.Members = members
	return st
}

// TestLegacyNodePortZonesMigrate: a host upgraded from a build that kept node port flows in
// the tenant's zone with the top bit flipped keeps them, as node port flows of the tenant's
// zone (kind CB_CT_KIND_NODEPORT), in conntrack, NAT (keys and the reverse map's values)
// and fragment records, in the first copy and the catch-up copy alike. A tenant whose own
// zone has the bit set, a removed tenant's leftovers and the node port fragment records'
// zone stay as they are; maps of this layout are not touched.
func TestLegacyNodePortZonesMigrate(t *testing.T) {
	testroot.Need(t)
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	pinRoot := filepath.Join("/sys/fs/bpf", conformance.Prefix()+"-kind")
	if err := os.MkdirAll(pinRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pinRoot) })
	const low, high, gone = 0x12345678, 0x9abcdef0, 0x55555555 // tenants' zones (high has the bit), a removed one's
	pin := func(name string, legacyKey, legacyValue bool) *ebpf.Map {
		t.Helper()
		ms := spec.Maps[name].Copy()
		if legacyKey {
			ms.Key = legacyLayout(t, ms.Key)
		}
		if legacyValue {
			ms.Value = legacyLayout(t, ms.Value)
		}
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { m.Close() })
		if err := m.Pin(filepath.Join(pinRoot, name)); err != nil {
			t.Fatal(err)
		}
		return m
	}
	nets := pin(contivbpfMapCbNetworks, false, false)
	for i, z := range []uint32{low, high} {
		if err := nets.Put(uint32(i+1), contivbpfCbNetwork{Vrf: z, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	ct := pin(contivbpfMapCbCt, true, false)
	snat := pin(contivbpfMapCbSnat, true, false)
	rev := pin(contivbpfMapCbSnatRev, false, true)
	frags := pin(contivbpfMapCbNatFrags, true, false)
	current := pin(contivbpfMapCbFrags, false, false) // this build's layout: not migrated

	// Keys of the legacy layouts have the kind byte as pad: zero.
	ctKey := func(z uint32, sport uint16) contivbpfCbCtKey {
		return contivbpfCbCtKey{Zone: z, Saddr: 0x0a000001, Daddr: 0x0a000002, Sport: sport, Dport: 80, Proto: 6}
	}
	entry := contivbpfCbCtEntry{Expires: 1 << 62, Flags: uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), State: 2}
	cases := []struct {
		zone, wantZone uint32
		wantKind       uint8
	}{
		{low, low, 0},
		{low ^ legacyZoneNodePort, low, ctKindNodePort},
		{high, high, 0},
		{high ^ legacyZoneNodePort, high, ctKindNodePort},
		{gone, gone, 0},
		{gone ^ legacyZoneNodePort, gone ^ legacyZoneNodePort, 0},
	}
	for i, c := range cases {
		if err := ct.Put(ctKey(c.zone, uint16(1000+i)), entry); err != nil {
			t.Fatal(err)
		}
		sk := contivbpfCbSnatKey{Zone: c.zone, Saddr: 0x0a000001, Daddr: 0x08080808, Sport: uint16(1000 + i), Dport: 53, Proto: 17}
		if err := snat.Put(sk, contivbpfCbSnatEntry{Expires: 1 << 62, NatPort: uint16(2000 + i), State: 1}); err != nil {
			t.Fatal(err)
		}
		rk := contivbpfCbSnatRkey{Raddr: 0x08080808, Rport: 53, NatPort: uint16(2000 + i), Proto: 17}
		if err := rev.Put(rk, contivbpfCbSnatRval{Zone: c.zone, Saddr: 0x0a000001, Sport: uint16(1000 + i)}); err != nil {
			t.Fatal(err)
		}
		fk := contivbpfCbFragKey{Zone: c.zone, Saddr: 0x0a000001, Daddr: 0x0a000002, Id: uint16(i), Proto: 17}
		if err := frags.Put(fk, contivbpfCbNatfrag{Expires: 1 << 62}); err != nil {
			t.Fatal(err)
		}
	}
	npIn := contivbpfCbFragKey{Zone: natFragNodePortIn, Saddr: 0x01020304, Daddr: 0x0a000002, Id: 99, Proto: 17}
	if err := frags.Put(npIn, contivbpfCbNatfrag{Expires: 1 << 62}); err != nil {
		t.Fatal(err)
	}

	d := &Driver{cfg: config{Options: Options{PinRoot: pinRoot}}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ms, err := d.planMigrations(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer closeMigrations(ms)
	byName := map[string]*migration{}
	for _, mg := range ms {
		byName[mg.name] = mg
	}
	for _, name := range []string{contivbpfMapCbCt, contivbpfMapCbSnat, contivbpfMapCbSnatRev, contivbpfMapCbNatFrags} {
		if byName[name] == nil || byName[name].fix == nil {
			t.Fatalf("%s: not migrated with the legacy kind fix (%v)", name, byName[name])
		}
	}
	if mg := byName[contivbpfMapCbFrags]; mg != nil || current == nil {
		t.Fatalf("%s of this build's layout migrated: %s", contivbpfMapCbFrags, mg.why)
	}
	// A flow the old programs open while the new ones load: carried by the catch-up copy.
	late := ctKey(low^legacyZoneNodePort, 4000)
	if err := ct.Put(late, entry); err != nil {
		t.Fatal(err)
	}
	if err := copyEntries(byName[contivbpfMapCbCt], nil, true); err != nil {
		t.Fatal(err)
	}
	newCt, newSnat, newRev, newFrags := byName[contivbpfMapCbCt].new, byName[contivbpfMapCbSnat].new, byName[contivbpfMapCbSnatRev].new, byName[contivbpfMapCbNatFrags].new
	for i, c := range cases {
		k := ctKey(c.wantZone, uint16(1000+i))
		k.Kind = c.wantKind
		var e contivbpfCbCtEntry
		if err := newCt.Lookup(k, &e); err != nil || e != entry {
			t.Errorf("zone %#x: conntrack entry under %+v: %+v, %v", c.zone, k, e, err)
		}
		sk := contivbpfCbSnatKey{Zone: c.wantZone, Kind: c.wantKind, Saddr: 0x0a000001, Daddr: 0x08080808, Sport: uint16(1000 + i), Dport: 53, Proto: 17}
		var se contivbpfCbSnatEntry
		if err := newSnat.Lookup(sk, &se); err != nil || se.NatPort != uint16(2000+i) {
			t.Errorf("zone %#x: NAT entry under %+v: %+v, %v", c.zone, sk, se, err)
		}
		rk := contivbpfCbSnatRkey{Raddr: 0x08080808, Rport: 53, NatPort: uint16(2000 + i), Proto: 17}
		var rv contivbpfCbSnatRval
		if err := newRev.Lookup(rk, &rv); err != nil || rv.Zone != c.wantZone || rv.Kind != c.wantKind || rv.Sport != uint16(1000+i) {
			t.Errorf("zone %#x: reverse NAT value %+v, %v; want zone %#x kind %d", c.zone, rv, err, c.wantZone, c.wantKind)
		}
		fk := contivbpfCbFragKey{Zone: c.wantZone, Kind: c.wantKind, Saddr: 0x0a000001, Daddr: 0x0a000002, Id: uint16(i), Proto: 17}
		var fe contivbpfCbNatfrag
		if err := newFrags.Lookup(fk, &fe); err != nil {
			t.Errorf("zone %#x: fragment record under %+v: %v", c.zone, fk, err)
		}
	}
	lk := ctKey(low, 4000)
	lk.Kind = ctKindNodePort
	var e contivbpfCbCtEntry
	if err := newCt.Lookup(lk, &e); err != nil {
		t.Errorf("the flow opened during the upgrade: not under %+v after the catch-up copy: %v", lk, err)
	}
	var fe contivbpfCbNatfrag
	if err := newFrags.Lookup(npIn, &fe); err != nil {
		t.Errorf("node port fragment record (zone %#x): %v", uint32(natFragNodePortIn), err)
	}
	if n := countMap(newCt); n != len(cases)+1 {
		t.Errorf("%d conntrack entries after the migration, want %d", n, len(cases)+1)
	}
}
