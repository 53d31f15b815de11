package ebpf

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// lowIfindexTries bounds how many free ifindexes below the interface array's end addVeth
// asks for before it takes the kernel's choice: each one refused was taken meanwhile by
// another creator.
const lowIfindexTries = 8

// addVeth creates veth (createVeth's request) so that its host end's ifindex lies below
// the size of cb_iface_direct, where the entry program's fast stage reads the interface
// entry (bpf/contivbpf.c cb_from_container: an entry in the cb_ifaces hash sends every
// packet to the container stage). It returns the host end.
//
// The kernel gives a namespace's new links rising ifindexes, cyclic far past the array:
// while its choice is below the limit it stands. Once it is not (the namespace has seen
// ~65,000 interfaces come and go) the veth is made again with a free index below the
// limit, and later veths ask for one directly (eps.nextIfindex, the next index to try,
// rising and cyclic as the kernel's own, so a freed index is not reused at once). An index
// taken meanwhile is refused (EEXIST, or EBUSY in a race with another creator): the next
// free one is tried. With none free, or lowIfindexTries refused, the kernel's choice
// stands, counted as a failed insert into cb_iface_direct (map_full): that veth's entry
// lives in the hash and its packets take the full stage. The caller holds eps for writing.
func (d *Driver) addVeth(veth *netlink.Veth) (netlink.Link, error) {
	tbl := d.ifaces()
	if d.eps.nextIfindex == 0 {
		host, err := d.linkAdd(veth)
		if err != nil || tbl.isDirect(uint32(host.Attrs().Index)) {
			return host, err
		}
		if err := d.nl.LinkDel(host); err != nil {
			return nil, fmt.Errorf("delete veth %s (ifindex %d, past %s) to make it again below: %w",
				veth.Name, host.Attrs().Index, contivbpfMapCbIfaceDirect, err)
		}
		d.eps.nextIfindex = 1
	}
	for range lowIfindexTries {
		idx, err := d.freeIfindex(tbl, d.eps.nextIfindex, tbl.direct.MaxEntries())
		if err != nil {
			return nil, err
		}
		if idx == 0 {
			break
		}
		d.eps.nextIfindex = idx + 1
		veth.Index = int(idx)
		host, err := d.linkAdd(veth)
		if err == nil {
			return host, nil
		}
		if !d.ifindexTaken(err, idx) {
			return nil, err
		}
	}
	veth.Index = 0
	host, err := d.linkAdd(veth)
	if err == nil {
		d.countFull(contivbpfMapCbIfaceDirect)
		d.log.Warn("host veth has an ifindex past the interface array: its packets take the full stage",
			"veth", veth.Name, "ifindex", host.Attrs().Index, "limit", tbl.direct.MaxEntries())
	}
	return host, err
}

// linkAdd creates veth and returns its host end (with its ifindex).
func (d *Driver) linkAdd(veth *netlink.Veth) (netlink.Link, error) {
	if err := d.nl.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("create veth %s/%s (ifindex %d asked, 0: any): %w", veth.Name, veth.PeerName, veth.Index, err)
	}
	if veth.Index != 0 {
		return veth, nil // LinkAdd looked the new link up by name for its index
	}
	host, err := d.nl.LinkByName(veth.Name)
	if err != nil {
		return nil, fmt.Errorf("look up new veth %s: %w", veth.Name, err)
	}
	return host, nil
}

// ifindexTaken reports whether creating a link with ifindex idx failed because another
// link holds idx: EBUSY, or EEXIST while a link with idx exists (EEXIST alone may be
// the name's).
func (d *Driver) ifindexTaken(err error, idx uint32) bool {
	if errors.Is(err, syscall.EBUSY) {
		return true
	}
	if !errors.Is(err, syscall.EEXIST) {
		return false
	}
	_, lerr := d.nl.LinkByIndex(int(idx))
	return lerr == nil
}

// freeIfindex returns the first ifindex in [1, limit), from "from" on and cyclic, that no
// link of the driver's namespace holds and no entry of the interface table tbl names (0:
// none). An entry without its link is an endpoint's whose veth went while the agent was
// away (or whose delete failed half-way), not yet swept: its endpoint entry still sends
// that address's packets to the ifindex, and a new veth there would receive them
// (the kernel's own counter reuses an ifindex only after 2^31 links; eps.nextIfindex
// starts again at 1 on every start).
func (d *Driver) freeIfindex(tbl ifaceTable, from, limit uint32) (uint32, error) {
	links, err := d.nl.LinkList()
	if err != nil {
		return 0, fmt.Errorf("list links for a free ifindex: %w", err)
	}
	used := make(map[uint32]bool, len(links))
	for _, l := range links {
		used[uint32(l.Attrs().Index)] = true
	}
	if from == 0 || from >= limit {
		from = 1
	}
	for n, i := uint32(1), from; n < limit; n, i = n+1, i+1 {
		if i >= limit {
			i = 1
		}
		if used[i] {
			continue
		}
		if _, err := tbl.lookup(i); err == nil {
			continue // a stale entry's
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, fmt.Errorf("free ifindex: %w", err)
		}
		return i, nil
	}
	return 0, nil
}
