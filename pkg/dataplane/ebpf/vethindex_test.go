package ebpf

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// A host veth gets an ifindex inside the interface array, so its entry lands there and the
// fast stage reads it (issue 33), even once the kernel's own choice would be past the
// array: createVeth on a driver whose array has 8 places, in a namespace whose next
// ifindex is past 8 (the kernel's counter only rises: links made and deleted, as on a
// host that has seen ~65,000 veths; a link made with an explicit index does not move it).
// The first veth is made again below the limit, the next asks directly, a third finds no
// free place below it and keeps the kernel's index (the hash, counted as a full
// cb_iface_direct). Then what it retries on.
func TestVethIfindexInsideArray(t *testing.T) {
	testroot.Need(t)
	p := conformance.Prefix()
	host := conformance.NewNetNS(t, p+"-h")
	cns := conformance.NewNetNS(t, p+"-c")
	nl := netlinkIn(t, host)
	defer nl.Close()
	const limit = 8
	direct, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(binary.Size(contivbpfCbIface{})), MaxEntries: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	hashed, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: uint32(binary.Size(contivbpfCbIface{})), MaxEntries: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer hashed.Close()
	d := &Driver{log: slog.Default(), nl: nl, mapFull: map[string]uint64{}}
	d.objs.CbIfaceDirect, d.objs.CbIfaces = direct, hashed

	// Push the namespace's counter past the array: four pairs made (ifindexes 2-9) and
	// deleted.
	for i := range 4 {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p + "f" + string(rune('a'+i))}, PeerName: p + "g" + string(rune('a'+i))}
		if err := nl.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkDel(v); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(name string) int {
		t.Helper()
		a := netip.MustParseAddr("10.50.0.2")
		ep := dataplane.Endpoint{ID: "red.t-" + name, IP: a, MAC: dataplane.ContivMAC(a), HostIfName: p + name, IfName: "eth" + name, NetNS: cns}
		l, err := d.createVeth(ep, 1450, aliasPrefix+name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := nl.LinkByName(ep.HostIfName)
		if err != nil || got.Attrs().Index != l.Attrs().Index || got.Attrs().Alias != aliasPrefix+name {
			t.Fatalf("veth %s: created %d, found %+v, %v", name, l.Attrs().Index, got, err)
		}
		ifc := contivbpfCbIface{Net: 1, Ip: ip4(a)}
		if err := d.ifaces().put(uint32(l.Attrs().Index), &ifc, nil); err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	inArray := func(ifx int) bool {
		var v contivbpfCbIface
		return ifx < limit && direct.Lookup(uint32(ifx), &v) == nil && v.Ip != 0
	}
	a := mk("a")
	if a >= limit || !inArray(a) || d.eps.nextIfindex == 0 {
		t.Fatalf("first veth past the kernel's counter: ifindex %d (limit %d), in the array %v, next %d", a, limit, inArray(a), d.eps.nextIfindex)
	}
	// The next free index holds a stale entry (an endpoint whose veth went while the agent
	// was away, not yet swept: its endpoint entry still sends its address there): the
	// second veth must not take it.
	stale := uint32(0)
	for i := d.eps.nextIfindex; i < limit && stale == 0; i++ {
		if _, err := nl.LinkByIndex(int(i)); err != nil {
			stale = i
		}
	}
	dead := contivbpfCbIface{Net: 2, Ip: ip4(netip.MustParseAddr("10.60.0.9"))}
	if stale == 0 {
		t.Fatalf("no free index from %d below %d", d.eps.nextIfindex, limit)
	}
	if err := d.ifaces().put(stale, &dead, nil); err != nil {
		t.Fatal(err)
	}
	b := mk("b")
	if b >= limit || b == a || b == int(stale) || !inArray(b) {
		t.Fatalf("second veth: ifindex %d (first %d, stale entry's %d, limit %d), in the array %v", b, a, stale, limit, inArray(b))
	}
	if err := d.ifaces().del(stale); err != nil {
		t.Fatal(err)
	}
	// Fill every place below the limit (explicit indexes), then one more veth.
	cfd, err := netns.GetFromPath(cns)
	if err != nil {
		t.Fatal(err)
	}
	defer cfd.Close()
	for i := 1; i < limit; i++ {
		if _, err := nl.LinkByIndex(i); err == nil {
			continue
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p + "x" + string(rune('a'+i)), Index: i}, PeerName: p + "y" + string(rune('a'+i)), PeerNamespace: netlink.NsFd(int(cfd))}
		if err := nl.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
	}
	c := mk("c")
	if c < limit || d.MapFullCount()[contivbpfMapCbIfaceDirect] != 1 {
		t.Errorf("no place below the limit: ifindex %d, map_full %v (want past %d, counted once)", c, d.MapFullCount(), limit)
	}
	if v, err := d.ifaces().lookup(uint32(c)); err != nil || v.Ip == 0 {
		t.Errorf("its entry (in the hash): %+v, %v", v, err)
	}
	// What addVeth retries on: an index another link took (another one is asked), never a
	// name taken (another index would not help).
	_, err = d.linkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p + "d", Index: a}, PeerName: p + "e"})
	if err == nil || !d.ifindexTaken(err, uint32(a)) {
		t.Errorf("veth asking for taken ifindex %d: %v, taken %v", a, err, err != nil && d.ifindexTaken(err, uint32(a)))
	}
	_, err = d.linkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p + "a", Index: 500}, PeerName: p + "e"})
	if err == nil || d.ifindexTaken(err, 500) {
		t.Errorf("veth with a taken name at free ifindex 500: %v, taken %v", err, err != nil && d.ifindexTaken(err, 500))
	}
}
