package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// ifaceTable is the datapath's interface table (bpf/lib/maps.h cb_iface_of): a host-side
// veth's entry by its ifindex. Ifindexes below the array's size live in cb_iface_direct,
// an array the verifier inlines, where an entry is in use when its IP is set; others in
// cb_ifaces, a hash. The container stage reads the array first and falls back to the
// hash, so entries an earlier build wrote to the hash keep working until moved (promote);
// the fast stage reads only the array (a packet whose entry is in the hash takes the
// container stage), and the agent gives new host veths ifindexes inside it (addVeth).
//
// An array entry is written in place: a packet racing an update of its own interface's
// entry may see a mix of that entry's old and new fields, never another interface's. The
// hash is preallocated and reuses an element's memory at once (an update parks the old
// element as the CPU's spare for the next update of any key), so the programs read a hash
// entry only through a copy (cb_iface_copy), never in place across a stage.
type ifaceTable struct {
	direct, hashed *ebpf.Map
}

func (d *Driver) ifaces() ifaceTable { return d.objs.ifaceTable() }

func (o *contivbpfObjects) ifaceTable() ifaceTable {
	return ifaceTable{direct: o.CbIfaceDirect, hashed: o.CbIfaces}
}

// isDirect reports whether ifindex has its place in the array.
func (t ifaceTable) isDirect(ifindex uint32) bool {
	return t.direct != nil && ifindex < t.direct.MaxEntries()
}

// lookup returns ifindex's entry as the datapath sees it (ebpf.ErrKeyNotExist: none).
func (t ifaceTable) lookup(ifindex uint32) (contivbpfCbIface, error) {
	var v contivbpfCbIface
	if t.isDirect(ifindex) {
		if err := t.direct.Lookup(ifindex, &v); err != nil {
			return v, fmt.Errorf("look up ifindex %d in %s: %w", ifindex, contivbpfMapCbIfaceDirect, err)
		}
		if v.Ip != 0 {
			return v, nil
		}
		v = contivbpfCbIface{}
	}
	if err := t.hashed.Lookup(ifindex, &v); err != nil {
		return v, fmt.Errorf("look up ifindex %d in %s: %w", ifindex, contivbpfMapCbIfaces, err)
	}
	return v, nil
}

// put writes ifindex's entry (an entry without an IP is refused: the array could not
// tell it from a free place). hashPut, if not nil, writes to the hash (the driver's
// mapPut, which counts a full map).
//
// An entry with QoS (qos.go) goes to the hash whatever its ifindex, and its place in the
// array is freed after: the destination note (cb_dst_noted) reads only the array and so
// never meets a limited endpoint, and the fast stage (cb_fast_stage), which reads only the
// array, leaves its packets to the container stage, which polices them. Without
// QoS it goes back to the array, and the hash copy is deleted after.
func (t ifaceTable) put(ifindex uint32, v *contivbpfCbIface, hashPut func(name string, m *ebpf.Map, k, v any) error) error {
	if v.Ip == 0 {
		return fmt.Errorf("interface entry of ifindex %d without an IPv4 address", ifindex)
	}
	if !t.isDirect(ifindex) || v.Qos != 0 {
		if hashPut != nil {
			if err := hashPut(contivbpfMapCbIfaces, t.hashed, ifindex, v); err != nil {
				return err
			}
		} else if err := t.hashed.Put(ifindex, v); err != nil {
			return fmt.Errorf("update map %s: %w", contivbpfMapCbIfaces, err)
		}
		if t.isDirect(ifindex) {
			return t.freeDirect(ifindex)
		}
		return nil
	}
	if err := t.direct.Put(ifindex, v); err != nil {
		return fmt.Errorf("update map %s: %w", contivbpfMapCbIfaceDirect, err)
	}
	var cur contivbpfCbIface
	if err := t.hashed.Lookup(ifindex, &cur); err == nil && cur.Qos != 0 {
		if err := mapDel(t.hashed, ifindex); err != nil {
			return fmt.Errorf("delete %s entry %d: %w", contivbpfMapCbIfaces, ifindex, err)
		}
	}
	return nil
}

// freeDirect frees ifindex's place in the array in two writes: first its IP alone is
// cleared (a packet racing it reads the old entry or a free one, cb_iface_get checks the
// IP of its copy), then the rest.
func (t ifaceTable) freeDirect(ifindex uint32) error {
	var cur contivbpfCbIface
	err := t.direct.Lookup(ifindex, &cur)
	if err == nil && cur.Ip != 0 {
		cur.Ip = 0
		err = t.direct.Put(ifindex, &cur)
	}
	if err == nil && cur != (contivbpfCbIface{}) {
		err = t.direct.Put(ifindex, &contivbpfCbIface{})
	}
	if err != nil {
		return fmt.Errorf("clear %s entry %d: %w", contivbpfMapCbIfaceDirect, ifindex, err)
	}
	return nil
}

// del removes ifindex's entry from both maps (absent is fine); an array entry is freed
// in two writes (freeDirect).
func (t ifaceTable) del(ifindex uint32) error {
	var errs []error
	if t.isDirect(ifindex) {
		if err := t.freeDirect(ifindex); err != nil {
			errs = append(errs, err)
		}
	}
	if err := mapDel(t.hashed, ifindex); err != nil {
		errs = append(errs, fmt.Errorf("delete %s entry %d: %w", contivbpfMapCbIfaces, ifindex, err))
	}
	return errors.Join(errs...)
}

// each calls fn for every entry as the datapath sees it: the array's entries in use, then
// the hash's entries the array does not shadow.
func (t ifaceTable) each(fn func(ifindex uint32, v contivbpfCbIface)) error {
	inArray := map[uint32]bool{}
	if t.direct != nil {
		keys := make([]uint32, 4096)
		vals := make([]contivbpfCbIface, len(keys))
		var cursor ebpf.MapBatchCursor
		for {
			n, err := t.direct.BatchLookup(&cursor, keys, vals, nil)
			for i := 0; i < n; i++ {
				if vals[i].Ip != 0 {
					inArray[keys[i]] = true
					fn(keys[i], vals[i])
				}
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if err != nil {
				return fmt.Errorf("dump %s: %w", contivbpfMapCbIfaceDirect, err)
			}
		}
	}
	var k uint32
	var v contivbpfCbIface
	it := t.hashed.Iterate()
	for it.Next(&k, &v) {
		if !inArray[k] {
			fn(k, v)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("dump %s: %w", contivbpfMapCbIfaces, err)
	}
	return nil
}

// promote copies hash entries whose ifindex has a place in the array there (an earlier
// build kept every interface in the hash). This build writes such an entry to the hash
// only with QoS (put; those stay), so one without found there is an earlier build's and the newer one (after a rollback and
// a new upgrade, the array may hold what this build wrote before the rollback). The hash
// copies stay until dropShadowed: a program of that build, still attached somewhere
// during an upgrade, reads only them.
func (t ifaceTable) promote() (int, error) {
	moved := 0
	var k uint32
	var v contivbpfCbIface
	it := t.hashed.Iterate()
	var errs []error
	for it.Next(&k, &v) {
		if !t.isDirect(k) || v.Ip == 0 || v.Qos != 0 {
			continue
		}
		if err := t.direct.Put(k, &v); err != nil {
			errs = append(errs, fmt.Errorf("copy ifindex %d into %s: %w", k, contivbpfMapCbIfaceDirect, err))
			continue
		}
		moved++
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("dump %s: %w", contivbpfMapCbIfaces, err))
	}
	return moved, errors.Join(errs...)
}

// dropShadowed deletes hash entries the array shadows (copies promote left for the
// programs of an earlier build); run once every link runs this build's programs.
func (t ifaceTable) dropShadowed() error {
	var shadowed []uint32
	var k uint32
	var v contivbpfCbIface
	it := t.hashed.Iterate()
	for it.Next(&k, &v) {
		if t.isDirect(k) {
			shadowed = append(shadowed, k)
		}
	}
	errs := []error{}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("dump %s: %w", contivbpfMapCbIfaces, err))
	}
	for _, k := range shadowed {
		var cur contivbpfCbIface
		if err := t.direct.Lookup(k, &cur); err != nil || cur.Ip == 0 {
			continue // not shadowed: the hash entry is the only one
		}
		if err := mapDel(t.hashed, k); err != nil {
			errs = append(errs, fmt.Errorf("delete %s entry %d: %w", contivbpfMapCbIfaces, k, err))
		}
	}
	return errors.Join(errs...)
}
