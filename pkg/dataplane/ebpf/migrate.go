package ebpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Map layout migration (upgrade to a build whose maps differ from the pinned ones).
//
// New compares every pinned map with the build's MapSpec: type, key/value size, max
// entries, flags, and the BTF layout (member names, offsets, sizes) of struct keys and
// values. A map that differs is migrated without a traffic gap:
//
//  1. a new, unpinned map is created from the spec and every entry of the pinned map is
//     copied into it, converted field by field by BTF member name (members present in both
//     layouts with the same size are copied, nested structs that grew by their own
//     members, new members are zero) or by a converter;
//  2. the programs are loaded against the new maps (and the pinned ones that still match);
//  3. every pinned tcx link is switched to the new programs with link.Update (atomic);
//  4. a catch-up copy carries what the old programs wrote meanwhile: new entries
//     (conntrack), entries they changed (unless the new programs wrote them since: the
//     newer state wins), and per-CPU counter increments (added to the new programs'
//     counts); then the new map is pinned under a temporary name and renamed over the old
//     pin; the old map is freed with the last program that used it.
//
// If anything fails before step 3 nothing pinned has changed. A resize that cannot hold
// the existing entries is refused, and so is a map with entries that neither a converter
// nor field names can convert (an empty one migrates).

// entryConverter converts one entry of a pinned map into the layout of the new build.
// vals holds one value, or one per possible CPU for per-CPU maps. keep=false drops the
// entry.
type entryConverter func(key []byte, vals [][]byte) (nkey []byte, nvals [][]byte, keep bool, err error)

// migration is one pinned map being replaced by a map of the new layout.
type migration struct {
	name string
	path string
	why  string
	spec *ebpf.MapSpec
	old  *ebpf.Map
	new  *ebpf.Map
	// snap holds every entry of the old map as the first copy read it, and snapNew what
	// that copy wrote into the new map (by new key): the catch-up copy carries what the
	// old programs changed meanwhile without undoing what the new programs wrote since.
	snap    map[string][][]byte
	snapNew map[string][][]byte
	// fix, when set, finishes each converted entry (legacyKindFix).
	fix func(key []byte, vals [][]byte) ([]byte, [][]byte)
}

// migrationTempPrefix names the temporary pin of a migrated map before its rename (bpffs
// refuses names with a dot).
const migrationTempPrefix = "migrating_"

// migrationGroups are maps the programs read as one structure (their owner says so:
// mapOwner.together): when one of a group migrates, all of it does, so the programs still
// on the links keep reading the old set and the new programs get the new one. Migrating
// one alone splits it between the two: the compiled policy's heads name versions whose
// keys the agent writes into its new rules and prefix maps only, and a running program
// that read a new head from a shared heads map missed every key and admitted every flow
// until its link moved.
func migrationGroups() [][]string {
	var out [][]string
	for _, o := range mapOwners() {
		if !o.together {
			continue
		}
		g := make([]string, len(o.maps))
		for i, m := range o.maps {
			g[i] = m.name
		}
		out = append(out, g)
	}
	return out
}

// groupMigrations returns, for each pinned map that matches spec but belongs to a group
// with a map that does not, why it migrates all the same.
func (d *Driver) groupMigrations(spec *ebpf.CollectionSpec) map[string]string {
	out := map[string]string{}
	for _, g := range migrationGroups() {
		for _, name := range g {
			ms, ok := spec.Maps[name]
			if !ok {
				continue
			}
			old, err := ebpf.LoadPinnedMap(filepath.Join(d.cfg.PinRoot, name), nil)
			if err != nil {
				continue // none pinned (or unreadable: planMigrations says so)
			}
			why := layoutDiff(ms, old)
			old.Close()
			if why == "" {
				continue
			}
			for _, other := range g {
				if other != name {
					out[other] = fmt.Sprintf("migrates with %s (%s)", name, why)
				}
			}
			break
		}
	}
	return out
}

// planMigrations creates and fills a new map for every pinned map that does not match spec.
// On error every map it created is closed and nothing pinned is touched.
func (d *Driver) planMigrations(spec *ebpf.CollectionSpec) (out []*migration, err error) {
	defer func() {
		if err != nil {
			closeMigrations(out)
			out = nil
		}
	}()
	names := make([]string, 0, len(spec.Maps))
	for n, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	together := d.groupMigrations(spec)
	owned := ownedMaps()
	var zones map[uint32]bool // the tenants' zones, read once if a legacy kind fix needs them
	for _, name := range names {
		ms := spec.Maps[name]
		path := filepath.Join(d.cfg.PinRoot, name)
		_ = os.Remove(filepath.Join(d.cfg.PinRoot, migrationTempPrefix+name)) // left by a crash
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("ebpf: load pinned map %s: %w", path, err)
		}
		why := layoutDiff(ms, old)
		if why == "" {
			why = together[name]
		}
		if why == "" {
			old.Close()
			continue
		}
		mg := &migration{name: name, path: path, why: why, spec: ms, old: old}
		out = append(out, mg)
		if site := owned[name].kind; site != nil && site.legacy(ms, old) {
			if zones == nil {
				if zones, err = pinnedZones(filepath.Join(d.cfg.PinRoot, contivbpfMapCbNetworks)); err != nil {
					return out, fmt.Errorf("ebpf: migrate map %s: %w", name, err)
				}
			}
			mg.fix = site.fix(zones)
		}
		ns := ms.Copy()
		ns.Pinning = ebpf.PinNone
		if mg.new, err = ebpf.NewMap(ns); err != nil {
			return out, fmt.Errorf("ebpf: migrate map %s (%s): create new map: %w", name, why, err)
		}
		if err := copyEntries(mg, owned[name].convert, false); err != nil {
			return out, fmt.Errorf("ebpf: migrate map %s (%s): %w", name, why, err)
		}
		d.log.Info("bpf map layout changed; migrating", "map", name, "change", why, "entries", countMap(mg.new))
	}
	return out, nil
}

// finishMigrations runs after every link uses the new programs: it copies entries the old
// programs added meanwhile and re-pins the new maps in place of the old ones.
func (d *Driver) finishMigrations(ms []*migration) error {
	owned := ownedMaps()
	for _, mg := range ms {
		if err := copyEntries(mg, owned[mg.name].convert, true); err != nil {
			d.log.Warn("bpf map migration: catch-up copy failed", "map", mg.name, "err", err)
		}
		p := d.mapField(mg.name)
		if p == nil {
			return fmt.Errorf("ebpf: migrate map %s: not a map of this build", mg.name)
		}
		tmp := filepath.Join(filepath.Dir(mg.path), migrationTempPrefix+mg.name)
		if err := (*p).Pin(tmp); err != nil {
			return fmt.Errorf("ebpf: migrate map %s: pin %s: %w", mg.name, tmp, err)
		}
		if err := os.Rename(tmp, mg.path); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("ebpf: migrate map %s: rename %s over %s: %w", mg.name, tmp, mg.path, err)
		}
		// Reopen from the final path so Unpin (Teardown) removes the right file.
		m, err := ebpf.LoadPinnedMap(mg.path, nil)
		if err != nil {
			return fmt.Errorf("ebpf: migrate map %s: reopen %s: %w", mg.name, mg.path, err)
		}
		(*p).Close()
		*p = m
		d.log.Info("bpf map migrated", "map", mg.name, "change", mg.why)
	}
	closeMigrations(ms)
	return nil
}

func closeMigrations(ms []*migration) {
	for _, mg := range ms {
		if mg.old != nil {
			mg.old.Close()
			mg.old = nil
		}
		if mg.new != nil {
			mg.new.Close()
			mg.new = nil
		}
	}
}

// removeForeignPins unpins maps under the pin root that this build does not have (maps of
// an earlier build, after migration). Links and directories are left alone.
func (d *Driver) removeForeignPins(spec *ebpf.CollectionSpec) {
	ents, err := os.ReadDir(d.cfg.PinRoot)
	if err != nil {
		return
	}
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasPrefix(n, "cb_") {
			continue
		}
		if _, ok := spec.Maps[n]; ok {
			continue
		}
		if err := os.Remove(filepath.Join(d.cfg.PinRoot, n)); err != nil {
			d.log.Warn("remove pin of an earlier build", "pin", n, "err", err)
			continue
		}
		d.log.Info("removed pinned map of an earlier build", "map", n)
	}
}

// layoutDiff says how a pinned map differs from spec ("" when it matches).
func layoutDiff(ms *ebpf.MapSpec, m *ebpf.Map) string {
	if err := ms.Compatible(m); err != nil {
		return strings.TrimSuffix(err.Error(), ": "+ebpf.ErrMapIncompatible.Error())
	}
	ob := mapBTF(m)
	if ob == nil {
		return "" // no BTF on the pinned map: sizes match, nothing more to compare
	}
	var diffs []string
	for _, kv := range []struct {
		what string
		t    btf.Type
	}{{"key", ms.Key}, {"value", ms.Value}} {
		ns, ok := asStruct(kv.t)
		if !ok {
			continue
		}
		ost, found := findStruct(ob, ns.Name)
		if !found {
			diffs = append(diffs, fmt.Sprintf("%s struct %s not in the pinned map's BTF", kv.what, ns.Name))
			continue
		}
		if !sameLayout(ost, ns) {
			diffs = append(diffs, fmt.Sprintf("%s struct %s layout changed", kv.what, ns.Name))
		}
	}
	return strings.Join(diffs, ", ")
}

func mapBTF(m *ebpf.Map) *btf.Spec {
	h, err := m.Handle()
	if err != nil {
		return nil
	}
	defer h.Close()
	s, err := h.Spec(nil)
	if err != nil {
		return nil
	}
	return s
}

func asStruct(t btf.Type) (*btf.Struct, bool) {
	if t == nil {
		return nil, false
	}
	s, ok := btf.UnderlyingType(t).(*btf.Struct)
	return s, ok && s.Name != ""
}

func findStruct(s *btf.Spec, name string) (*btf.Struct, bool) {
	ts, err := s.AnyTypesByName(name)
	if err != nil {
		return nil, false
	}
	for _, t := range ts {
		if st, ok := t.(*btf.Struct); ok {
			return st, true
		}
	}
	return nil, false
}

func sameLayout(a, b *btf.Struct) bool {
	if a.Size != b.Size || len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		ma, mb := a.Members[i], b.Members[i]
		if ma.Name != mb.Name || ma.Offset != mb.Offset || ma.BitfieldSize != mb.BitfieldSize || sizeOf(ma.Type) != sizeOf(mb.Type) {
			return false
		}
	}
	return true
}

func sizeOf(t btf.Type) int {
	n, err := btf.Sizeof(t)
	if err != nil {
		return -1
	}
	return n
}

// fieldConverter converts bytes of struct from into struct to by member name: members of
// to that from has with the same size are copied, nested structs of another size by their
// members (fieldMoves), the others stay zero. Without struct
// information on either side, equal sizes are copied verbatim.
func fieldConverter(from *btf.Spec, fromSize uint32, to btf.Type, toSize uint32) (func([]byte) ([]byte, error), error) {
	ns, ok := asStruct(to)
	var ost *btf.Struct
	if ok && from != nil {
		ost, ok = findStruct(from, ns.Name)
	}
	if !ok || ost == nil || sameLayout(ost, ns) {
		if fromSize != toSize {
			return nil, fmt.Errorf("size %d → %d and no BTF struct to convert by field", fromSize, toSize)
		}
		return func(b []byte) ([]byte, error) { return bytes.Clone(b), nil }, nil
	}
	moves := fieldMoves(ost, ns, 0, 0)
	return func(b []byte) ([]byte, error) {
		if len(b) < int(fromSize) {
			return nil, fmt.Errorf("value of %d bytes, want %d", len(b), fromSize)
		}
		out := make([]byte, toSize)
		for _, mv := range moves {
			copy(out[mv.to:mv.to+mv.n], b[mv.from:mv.from+mv.n])
		}
		return out, nil
	}, nil
}

// fieldMove copies n bytes at from (the old layout) to to (the new one).
type fieldMove struct{ from, to, n int }

// fieldMoves lists what fieldConverter copies from struct from (at byte offset fromOff of
// the value) into struct to (at toOff): members of the same name and size, and members of
// the same name that are structs of another layout (a bucket that grew a counter) by their
// own members, recursively, so the fields both layouts have keep their values.
func fieldMoves(from, to *btf.Struct, fromOff, toOff int) []fieldMove {
	var moves []fieldMove
	for _, m := range to.Members {
		if m.BitfieldSize != 0 || m.Name == "" {
			continue
		}
		for _, o := range from.Members {
			if o.Name != m.Name || o.BitfieldSize != 0 {
				continue
			}
			fo, no := fromOff+int(o.Offset.Bytes()), toOff+int(m.Offset.Bytes())
			if n := sizeOf(m.Type); sizeOf(o.Type) == n && n > 0 {
				moves = append(moves, fieldMove{fo, no, n})
				continue
			}
			oldSt, ok1 := asStruct(o.Type)
			newSt, ok2 := asStruct(m.Type)
			if ok1 && ok2 && oldSt.Name == newSt.Name {
				moves = append(moves, fieldMoves(oldSt, newSt, fo, no)...)
			}
		}
	}
	return moves
}

func isPerCPU(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash:
		return true
	}
	return false
}

func isArray(t ebpf.MapType) bool { return t == ebpf.Array || t == ebpf.PerCPUArray }

// copyEntries copies mg.old into mg.new. With catchUp only keys missing from mg.new are
// added (entries the old programs created after the first copy). Without conv, entries
// are converted by field (fieldConverter); a map whose entries cannot be converted that
// way migrates only while empty.
func copyEntries(mg *migration, conv entryConverter, catchUp bool) error {
	old, nm, ms := mg.old, mg.new, mg.spec
	switch old.Type() {
	case ebpf.RingBuf, ebpf.PerfEventArray:
		return nil // streams, no entries
	}
	keyT, valT := ms.Key, ms.Value
	if conv == nil {
		ob := mapBTF(old)
		kc, kerr := fieldConverter(ob, old.KeySize(), keyT, nm.KeySize())
		vc, verr := fieldConverter(ob, old.ValueSize(), valT, nm.ValueSize())
		switch {
		case kerr == nil && verr == nil:
		case catchUp || countMap(old) == 0:
			// Entries that cannot be converted by field: the map migrates only while
			// empty (a key that was no struct, such as cb_vips' bare VIP before zones),
			// and its catch-up copy carries nothing.
			return nil
		case kerr != nil:
			return fmt.Errorf("key: %w", kerr)
		default:
			return fmt.Errorf("value: %w", verr)
		}
		conv = func(k []byte, vs [][]byte) ([]byte, [][]byte, bool, error) {
			nk, err := kc(k)
			if err != nil {
				return nil, nil, false, err
			}
			nvs := make([][]byte, len(vs))
			for i, v := range vs {
				if nvs[i], err = vc(v); err != nil {
					return nil, nil, false, err
				}
			}
			return nk, nvs, true, nil
		}
	}
	perCPU := isPerCPU(old.Type())
	if isPerCPU(nm.Type()) != perCPU {
		return errors.New("per-CPU and shared maps cannot be converted into each other without a converter")
	}
	newVal := func(m *ebpf.Map) any {
		if perCPU {
			return reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(m.ValueSize()), reflect.TypeOf(byte(0)))), ebpf.MustPossibleCPU(), ebpf.MustPossibleCPU()).Interface()
		}
		return make([]byte, m.ValueSize())
	}
	split := func(v any) [][]byte {
		if !perCPU {
			return [][]byte{v.([]byte)}
		}
		rv := reflect.ValueOf(v)
		out := make([][]byte, rv.Len())
		for i := range out {
			b := make([]byte, rv.Index(i).Len())
			reflect.Copy(reflect.ValueOf(b), rv.Index(i))
			out[i] = b
		}
		return out
	}
	join := func(m *ebpf.Map, vs [][]byte) any {
		if !perCPU {
			return vs[0]
		}
		v := newVal(m)
		rv := reflect.ValueOf(v)
		for i := 0; i < rv.Len() && i < len(vs); i++ {
			reflect.Copy(rv.Index(i), reflect.ValueOf(vs[i]))
		}
		return v
	}
	if !catchUp && !isArray(old.Type()) && old.Type() != ebpf.LRUHash && old.Type() != ebpf.LRUCPUHash {
		if n := countMap(old); n > int(nm.MaxEntries()) {
			return fmt.Errorf("%d entries do not fit in %d (raise MapEntries)", n, nm.MaxEntries())
		}
	}
	lookupNew := func(k []byte) ([][]byte, error) {
		v := newVal(nm)
		if err := nm.Lookup(k, v); err != nil {
			return nil, err
		}
		return split(v), nil
	}
	k := make([]byte, old.KeySize())
	v := newVal(old)
	it := old.Iterate()
	for it.Next(&k, v) {
		vs := split(v)
		if isArray(old.Type()) {
			idx := uint32(0)
			if len(k) >= 4 {
				idx = uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24
			}
			if idx >= nm.MaxEntries() {
				if !allZero(vs) {
					return fmt.Errorf("entry %d does not fit in %d entries", idx, nm.MaxEntries())
				}
				continue
			}
		}
		nk, nvs, keep, err := conv(k, vs)
		if err != nil {
			return fmt.Errorf("convert entry: %w", err)
		}
		if !keep {
			continue
		}
		if mg.fix != nil {
			nk, nvs = mg.fix(nk, nvs)
		}
		if !catchUp {
			if mg.snap == nil {
				mg.snap, mg.snapNew = map[string][][]byte{}, map[string][][]byte{}
			}
			mg.snap[string(k)] = cloneVals(vs)
			mg.snapNew[string(nk)] = cloneVals(nvs)
		}
		flag := ebpf.UpdateAny
		if catchUp {
			prev, seen := mg.snap[string(k)]
			if seen && equalVals(prev, vs) {
				continue // the old programs did not touch it
			}
			if !seen {
				flag = ebpf.UpdateNoExist // new during the window
			} else if nvs, keep, err = catchUpValue(lookupNew, nk, prev, vs, nvs, mg.snapNew[string(nk)], perCPU, old.ValueSize() == nm.ValueSize()); err != nil || !keep {
				if err != nil {
					return fmt.Errorf("catch up entry: %w", err)
				}
				continue
			}
		}
		err = nm.Update(nk, join(nm, nvs), flag)
		switch {
		case err == nil, catchUp && errors.Is(err, ebpf.ErrKeyExist):
		case errors.Is(err, syscall.E2BIG) || errors.Is(err, syscall.ENOSPC):
			if catchUp {
				return nil
			}
			return fmt.Errorf("entries do not fit in %d (raise MapEntries): %w", nm.MaxEntries(), err)
		default:
			return fmt.Errorf("write entry: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate: %w", err)
	}
	return nil
}

// catchUpValue decides what the catch-up copy writes for an entry the old programs changed
// after the first copy (prev → cur, converted: conv). Per-CPU counters of an unchanged
// layout get the old programs' increments added to whatever the new programs counted
// since; any other entry is overwritten only if the new programs have not written it
// since the first copy (firstNew is what that copy wrote), so a newer state always wins.
func catchUpValue(lookup func([]byte) ([][]byte, error), nk []byte, prev, cur, conv, firstNew [][]byte, perCPU, sameLayout bool) ([][]byte, bool, error) {
	now, err := lookup(nk)
	if err != nil {
		return conv, true, nil // gone from the new map (deleted since): write it back
	}
	if perCPU && sameLayout && isCounterLayout(cur) {
		out := make([][]byte, len(now))
		for c := range now {
			out[c] = append([]byte(nil), now[c]...)
			if c >= len(cur) || c >= len(prev) {
				continue
			}
			for off := 0; off+8 <= len(out[c]); off += 8 {
				delta := binary.NativeEndian.Uint64(cur[c][off:]) - binary.NativeEndian.Uint64(prev[c][off:])
				binary.NativeEndian.PutUint64(out[c][off:], binary.NativeEndian.Uint64(out[c][off:])+delta)
			}
		}
		return out, true, nil
	}
	if !equalVals(now, firstNew) {
		return nil, false, nil // the new programs wrote it: theirs is newer
	}
	return conv, true, nil
}

// isCounterLayout: values made of 64-bit words (the per-CPU counter maps).
func isCounterLayout(vs [][]byte) bool {
	return len(vs) > 0 && len(vs[0]) > 0 && len(vs[0])%8 == 0
}

func cloneVals(vs [][]byte) [][]byte {
	out := make([][]byte, len(vs))
	for i, v := range vs {
		out[i] = append([]byte(nil), v...)
	}
	return out
}

func equalVals(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func allZero(vs [][]byte) bool {
	for _, v := range vs {
		for _, b := range v {
			if b != 0 {
				return false
			}
		}
	}
	return true
}

// countMap counts the entries of a hash map (arrays: max entries).
func countMap(m *ebpf.Map) int {
	if isArray(m.Type()) {
		return int(m.MaxEntries())
	}
	k := make([]byte, m.KeySize())
	n := 0
	it := m.Iterate()
	var v any = make([]byte, m.ValueSize())
	if isPerCPU(m.Type()) {
		v = reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(m.ValueSize()), reflect.TypeOf(byte(0)))), ebpf.MustPossibleCPU(), ebpf.MustPossibleCPU()).Interface()
	}
	for it.Next(&k, v) {
		n++
	}
	return n
}
