package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Node port flows' state before the kind field. Builds before it kept a node port flow's
// conntrack, NAT and fragment entries in its tenant's zone with the top bit flipped
// (legacyZoneNodePort); this one keys them by the tenant's zone and kind
// CB_CT_KIND_NODEPORT (bpf/lib/common.h). Those maps' key layouts changed, so an upgrade
// migrates them (migrate.go), and each entry of a twin zone moves to its tenant's zone
// with the node port kind on the way: a flow established through a node port keeps its
// state across the upgrade.

// legacyZoneNodePort is the bit earlier builds flipped in a tenant's zone for its node
// port flows. zoneOfHash still keeps tenants' zones off natFragNodePortIn with it, so no
// tenant's zone changes.
const legacyZoneNodePort = 0x80000000

// ctKindNodePort is CB_CT_KIND_NODEPORT (bpf/lib/common.h, enum cb_ct_kind): the kind of a
// node port flow's conntrack, NAT and fragment keys (0: an endpoint's own flow).
const ctKindNodePort = 1

// kindSite is where a map's entries hold a zone and its kind: in the key or (cb_snat_rev)
// in the value, at these offsets of this build's layout. The map's owner declares it
// (ownedMap.kind, mapowners.go).
type kindSite struct {
	inValue          bool
	zoneOff, kindOff uintptr
}

// legacy says whether pinned map old (being migrated to ms) is of a build before the kind
// field: its struct at the site has no member "kind". (Without BTF nothing is changed.)
func (s kindSite) legacy(ms *ebpf.MapSpec, old *ebpf.Map) bool {
	t := ms.Key
	if s.inValue {
		t = ms.Value
	}
	ns, ok := asStruct(t)
	if !ok {
		return false
	}
	ob := mapBTF(old)
	if ob == nil {
		return false
	}
	ost, ok := findStruct(ob, ns.Name)
	if !ok {
		return false
	}
	for _, m := range ost.Members {
		if m.Name == "kind" {
			return false
		}
	}
	return true
}

// fix returns the finishing step of a converted entry: a zone that is no tenant's but
// whose twin (legacyZoneNodePort flipped) is becomes that tenant's, with the node port
// kind. zones are the tenants' zones on the host (pinnedZones); an earlier build refused
// tenants whose zones differ by that bit only, so the twin is never ambiguous. Entries of
// any other zone (natFragNodePortIn's records, a removed tenant's leftovers) stay as they are.
func (s kindSite) fix(zones map[uint32]bool) func([]byte, [][]byte) ([]byte, [][]byte) {
	move := func(b []byte) []byte {
		if len(b) < int(s.kindOff)+1 || len(b) < int(s.zoneOff)+4 {
			return b
		}
		z := binary.NativeEndian.Uint32(b[s.zoneOff:])
		if zones[z] || !zones[z^legacyZoneNodePort] {
			return b
		}
		out := append([]byte(nil), b...)
		binary.NativeEndian.PutUint32(out[s.zoneOff:], z^legacyZoneNodePort)
		out[s.kindOff] = ctKindNodePort
		return out
	}
	return func(k []byte, vs [][]byte) ([]byte, [][]byte) {
		if !s.inValue {
			return move(k), vs
		}
		out := make([][]byte, len(vs))
		for i, v := range vs {
			out[i] = move(v)
		}
		return k, out
	}
}

// pinnedZones reads the tenants' zones from the pinned networks map at path (its member
// "vrf", found by BTF in whatever layout that build had): empty when there is none.
func pinnedZones(path string) (map[uint32]bool, error) {
	zones := map[uint32]bool{}
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return zones, nil // no networks pinned: no zone to move entries to
	}
	if err != nil {
		// (Not "no zones": node port state would stay in zones no tenant has.)
		return nil, fmt.Errorf("read the tenants' zones: load %s: %w", path, err)
	}
	defer m.Close()
	ob := mapBTF(m)
	st, ok := (*btf.Struct)(nil), false
	if ob != nil {
		st, ok = findStruct(ob, "cb_network")
	}
	if !ok {
		return nil, fmt.Errorf("pinned %s has no BTF layout of cb_network to find the tenants' zones in", path)
	}
	off := -1
	for _, mb := range st.Members {
		if mb.Name == "vrf" && sizeOf(mb.Type) == 4 {
			off = int(mb.Offset.Bytes())
		}
	}
	if off < 0 {
		return zones, nil // a build before zones: no node port flows either
	}
	k := make([]byte, m.KeySize())
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		if len(v) >= off+4 {
			zones[binary.NativeEndian.Uint32(v[off:])] = true
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the tenants' zones from %s: %w", path, err)
	}
	return zones, nil
}
