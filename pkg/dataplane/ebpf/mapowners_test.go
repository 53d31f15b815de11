package ebpf

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Every map of the loaded collection has exactly one owner, which declares the Go types
// its entries are encoded with (of the map's key and value sizes) and either a generation
// sweep or how else its entries are collected: a map added to bpf/ without an owner fails
// here, so neither Sync's sweep nor an upgrade's migration can forget it. No root needed.
func TestMapOwnersCoverBuild(t *testing.T) {
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]int{}
	for i, o := range mapOwners() {
		if o.sweep == nil && o.gc == "" {
			t.Errorf("owner %d (%s): neither a sweep nor how its maps are collected", i, o.concern)
		}
		if o.together && len(o.maps) < 2 {
			t.Errorf("owner %d (%s): a migration group of %d map", i, o.concern, len(o.maps))
		}
		for _, m := range o.maps {
			if prev, dup := owner[m.name]; dup {
				t.Errorf("map %s: owned by owners %d and %d", m.name, prev, i)
			}
			owner[m.name] = i
			ms, ok := spec.Maps[m.name]
			if !ok {
				t.Errorf("map %s: owned but not in the build", m.name)
				continue
			}
			if (m.key == nil) != (ms.KeySize == 0) || (m.value == nil) != (ms.ValueSize == 0) {
				t.Errorf("map %s: declared types %v → %v for key/value sizes %d/%d", m.name, m.key, m.value, ms.KeySize, ms.ValueSize)
				continue
			}
			if m.key != nil && (m.key.Size() != uintptr(ms.KeySize) || m.value.Size() != uintptr(ms.ValueSize)) {
				t.Errorf("map %s: %v (%d bytes) → %v (%d bytes), the map has %d → %d", m.name,
					m.key, m.key.Size(), m.value, m.value.Size(), ms.KeySize, ms.ValueSize)
			}
		}
	}
	for name := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // global variables' sections
		}
		if _, ok := owner[name]; !ok {
			t.Errorf("map %s: no owner in mapOwners (its garbage collection and migration)", name)
		}
	}
	// The documented order: a stale set's head, then its prefixes, then its record; the
	// memberships after the services they name.
	if owner[contivbpfMapCbKsetHeads] != owner[contivbpfMapCbKcidrs] || owner[contivbpfMapCbKcidrs] >= owner[contivbpfMapCbKsets] {
		t.Errorf("NetworkPolicy sets: heads (owner %d) and prefixes (%d) must be swept before the records (%d)",
			owner[contivbpfMapCbKsetHeads], owner[contivbpfMapCbKcidrs], owner[contivbpfMapCbKsets])
	}
	if owner[contivbpfMapCbMembers] < owner[contivbpfMapCbServices] {
		t.Errorf("memberships (owner %d) swept before services (%d)", owner[contivbpfMapCbMembers], owner[contivbpfMapCbServices])
	}
	if g := migrationGroups(); len(g) != 1 || strings.Join(g[0], ",") != "cb_pol_heads,cb_pol_rules,cb_pol_cidrs" {
		t.Errorf("migration groups %v, want the compiled policy's three maps", g)
	}
}

// A MapEntries whose multiple does not fit a map's uint32 size is refused by New, naming
// the field, before anything is opened: sized as before, cb_ct (4 × MapEntries) of
// 1<<30+1 wrapped to 4 entries and one of 1<<30 to 0. The host namespace named does not
// exist, so a New that let the size through fails there instead, touching nothing (no
// root needed).
func TestMapOwnersSizeOverflowRefused(t *testing.T) {
	host := dataplane.HostConfig{Host: "sizecheck", NetNS: filepath.Join(t.TempDir(), "no-such-netns")}
	for _, n := range []int{1<<30 + 1, 1 << 30, math.MaxUint32} {
		_, err := New(context.Background(), host, Options{PinRoot: t.TempDir(), MapEntries: n})
		if err == nil || !strings.Contains(err.Error(), "mapEntries") {
			t.Errorf("MapEntries %d: err %v, want mapEntries out of range", n, err)
		}
	}
}

// The arrays indexed by an endpoint's counter slot (allocSlot hands out slots below
// cb_ep_counters' size) are all as large as cb_ep_counters, and the conntrack table is the
// 4 × MapEntries that DefaultCTQuota and ctInLimit assume, as the hand-kept size lists
// before the owners had them: an owner whose scale drifts fails here. No root needed.
func TestMapOwnersSlotArraysSized(t *testing.T) {
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	sizeMaps(spec, n)
	slots := spec.Maps[contivbpfMapCbEpCounters].MaxEntries
	if slots != n {
		t.Errorf("%s: %d entries, want MapEntries (%d)", contivbpfMapCbEpCounters, slots, n)
	}
	for _, name := range []string{contivbpfMapCbQos, contivbpfMapCbCtOwned, contivbpfMapCbCtOwnedIn} {
		if got := spec.Maps[name].MaxEntries; got != slots {
			t.Errorf("%s: %d entries, want %s's %d (one per counter slot)", name, got, contivbpfMapCbEpCounters, slots)
		}
	}
	if got := spec.Maps[contivbpfMapCbCt].MaxEntries; got != 4*n {
		t.Errorf("%s: %d entries, want 4 × MapEntries (%d)", contivbpfMapCbCt, got, 4*n)
	}
}
