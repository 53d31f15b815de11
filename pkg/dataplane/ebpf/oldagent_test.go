package ebpf

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/containerend"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// oldBuildObject is the production object committed at f2427fc (`git show
// f2427fc:pkg/dataplane/ebpf/contivbpf_bpfel.o`), the last build that counted per endpoint
// in the per-CPU hash cb_ep_metrics (by {net, ip}) before the counters moved to slots of
// cb_ep_counters. Against today's layout its cb_endpoint and cb_iface lack the counter slot
// (cb_iface also the conntrack zone), cb_network has a pad byte where the flags are,
// cb_config is 28 bytes, cb_ct is an LRU hash with 16-byte keys, cb_policies, cb_services,
// cb_vips and cb_reasons differ, and the maps added since do not exist.
const oldBuildObject = "testdata/contivbpf_f2427fc_bpfel.o"

// Map keys and values of the old build, as its agent wrote them (checkOldLayout compares
// them with the object's BTF).
type (
	oldEpKey struct{ Net, Ip uint32 }
	// oldEndpoint is its cb_endpoint: no counter slot.
	oldEndpoint struct {
		Ifindex, Vtep uint32
		Mac           [6]uint8
		Epg           uint16
		Flags         uint32
		Generation    uint32
	}
	// oldIface is its cb_iface: no counter slot, no zone.
	oldIface struct {
		Net, Ip    uint32
		Mac        [6]uint8
		Epg        uint16
		Generation uint32
	}
	oldNetwork struct {
		Subnet, Mask, Gateway, Tag uint32
		Mtu                        uint16
		Encap, Pad                 uint8
		Generation, Vrf            uint32
	}
	oldConfig struct {
		VxlanIfindex, UplinkIfindex, Vtep uint32
		GwMac                             [6]uint8
		Pad                               uint16
		Generation, Features              uint32
	}
	oldPeer    struct{ Generation, Flags uint32 }
	oldEpStats struct{ RxPackets, RxBytes, TxPackets, TxBytes uint64 }
)

// oldHost is what an agent of the old build left running on a host: the ids of its pinned
// tcx links by interface name and the cb_endpoints values it wrote by endpoint address.
type oldHost struct {
	links map[string]uint32
	eps   map[netip.Addr]oldEndpoint
}

// runOldAgent does on h's host (clean: no pins, no VXLAN device) what an agent of the old
// build did for h's network, endpoints eps (each with a namespace) and one peer VTEP, then
// exits, leaving its programs forwarding: it creates the collect_md VXLAN device and the
// endpoints' veths (alias "contivbpf:<endpoint id>", the format of that build), loads the
// object with its maps pinned by name under the pin root (sized by MapEntries as that
// agent did), writes the config, network, peer, iface, endpoint and cb_ep_metrics entries
// in its layouts, and attaches cb_from_overlay and cb_from_container with tcx links pinned
// at <pin root>/links/<ifname>, where New finds them and swaps its programs in.
func runOldAgent(t *testing.T, h *oneHost, eps []dataplane.Endpoint, peer netip.Addr) oldHost {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(oldBuildObject)
	if err != nil {
		t.Fatalf("load %s: %v", oldBuildObject, err)
	}
	for name, v := range map[string]any{"cb_ep_key": oldEpKey{}, "cb_endpoint": oldEndpoint{}, "cb_iface": oldIface{},
		"cb_network": oldNetwork{}, "cb_config": oldConfig{}, "cb_peer": oldPeer{}, "cb_ep_stats": oldEpStats{}} {
		checkOldLayout(t, spec.Types, name, v)
	}
	for _, m := range []string{"cb_endpoints", "cb_ifaces", legacyMetricsMap, "cb_backends", "cb_routes"} {
		spec.Maps[m].MaxEntries = uint32(h.cfg.MapEntries)
	}
	spec.Maps["cb_ct"].MaxEntries = uint32(4 * h.cfg.MapEntries)
	if err := os.MkdirAll(filepath.Join(h.cfg.PinRoot, linksDir), 0o700); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: h.cfg.PinRoot}})
	if err != nil {
		t.Fatalf("load the old build: %v", err)
	}
	defer coll.Close()
	put := func(m string, k, v any) {
		t.Helper()
		if err := coll.Maps[m].Put(k, v); err != nil {
			t.Fatalf("old build: write %s: %v", m, err)
		}
	}

	nl := netlinkIn(t, h.cfg.NetNS)
	defer nl.Close()
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: h.cfg.VXLANIf, Flags: net.FlagUp}, FlowBased: true, Port: DefaultVXLANPort}
	if err := nl.LinkAdd(vx); err != nil {
		t.Fatalf("old build: create %s: %v", h.cfg.VXLANIf, err)
	}
	vxl, err := nl.LinkByName(h.cfg.VXLANIf)
	if err != nil {
		t.Fatal(err)
	}

	const gen = 1
	cfg := oldConfig{VxlanIfindex: uint32(vxl.Attrs().Index), Vtep: ip4(h.cfg.VTEP), Generation: gen}
	copy(cfg.GwMac[:], dataplane.RouterMAC)
	put("cb_cfg", uint32(0), cfg)
	nv := networkValue(h.net, vrfOf(h.net.ID))
	put("cb_networks", netKey(h.net), oldNetwork{Subnet: nv.Subnet, Mask: nv.Mask, Gateway: nv.Gateway, Tag: nv.Tag,
		Mtu: nv.Mtu, Encap: uint8(oldEnum(t, spec.Types, "CB_ENCAP_VXLAN")), Generation: gen, Vrf: nv.Vrf})
	put("cb_peers", ip4(peer), oldPeer{Generation: gen})

	out := oldHost{links: map[string]uint32{}, eps: map[netip.Addr]oldEndpoint{}}
	attach := func(ifname string, ifindex int, prog string) {
		t.Helper()
		var l link.Link
		if err := nsexec.Run(h.cfg.NetNS, func() (err error) {
			l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: coll.Programs[prog], Attach: ebpf.AttachTCXIngress})
			return err
		}); err != nil {
			t.Fatalf("old build: attach %s to %s: %v", prog, ifname, err)
		}
		defer l.Close()
		if err := l.Pin(filepath.Join(h.cfg.PinRoot, linksDir, ifname)); err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		if err != nil {
			t.Fatal(err)
		}
		out.links[ifname] = uint32(info.ID)
	}
	attach(h.cfg.VXLANIf, vxl.Attrs().Index, "cb_from_overlay")
	for _, ep := range eps {
		ifindex := oldVeth(t, nl, ep, h.net)
		key := oldEpKey{Net: netKey(h.net), Ip: ip4(ep.IP)}
		ifc := oldIface{Net: key.Net, Ip: key.Ip, Mac: [6]uint8(ep.MAC), Epg: ep.EPGID, Generation: gen}
		v := oldEndpoint{Ifindex: uint32(ifindex), Mac: ifc.Mac, Epg: ep.EPGID, Flags: uint32(oldEnum(t, spec.Types, "CB_EP_LOCAL")), Generation: gen}
		put("cb_ifaces", uint32(ifindex), ifc)
		put("cb_endpoints", key, v)
		put(legacyMetricsMap, key, make([]oldEpStats, ebpf.MustPossibleCPU()))
		out.eps[ep.IP] = v
		attach(ep.HostIfName, ifindex, "cb_from_container")
	}
	return out
}

// oldVeth creates ep's veth pair as the old build did (container end in ep.NetNS, alias
// "contivbpf:<endpoint id>"), configures the container end and returns the host end's
// ifindex.
func oldVeth(t *testing.T, nl *netlink.Handle, ep dataplane.Endpoint, n dataplane.Network) int {
	t.Helper()
	cns, err := netns.GetFromPath(ep.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer cns.Close()
	mtu := containerend.MTU(n)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ep.HostIfName, MTU: mtu, Flags: net.FlagUp},
		PeerName: ep.IfName, PeerHardwareAddr: ep.MAC, PeerMTU: uint32(mtu), PeerNamespace: netlink.NsFd(int(cns))}); err != nil {
		t.Fatalf("old build: create veth %s: %v", ep.HostIfName, err)
	}
	host, err := nl.LinkByName(ep.HostIfName)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetAlias(host, aliasPrefix+ep.ID); err != nil {
		t.Fatal(err)
	}
	if err := containerend.Configure(nl, ep, n); err != nil {
		t.Fatalf("old build: %v", err)
	}
	return host.Attrs().Index
}

// checkOldLayout fails unless the fields of v are, in order, the members of struct name in
// types: the same names (CamelCase for snake_case), offsets and sizes, and the same total.
func checkOldLayout(t *testing.T, types *btf.Spec, name string, v any) {
	t.Helper()
	var st *btf.Struct
	if err := types.TypeByName(name, &st); err != nil {
		t.Fatalf("old build: struct %s: %v", name, err)
	}
	rt := reflect.TypeOf(v)
	if rt.Size() != uintptr(st.Size) || rt.NumField() != len(st.Members) {
		t.Fatalf("old build: struct %s has %d members in %d bytes; the test's %s has %d fields in %d", name, len(st.Members), st.Size, rt, rt.NumField(), rt.Size())
	}
	for i, m := range st.Members {
		f := rt.Field(i)
		if snakeCase(f.Name) != m.Name || f.Offset != uintptr(m.Offset.Bytes()) || int(f.Type.Size()) != sizeOf(m.Type) {
			t.Fatalf("old build: %s.%s at %d (%d bytes); the test's %s.%s at %d (%d bytes)", name, m.Name, m.Offset.Bytes(), sizeOf(m.Type), rt, f.Name, f.Offset, f.Type.Size())
		}
	}
}

// oldEnum is the value of enumerator name in types.
func oldEnum(t *testing.T, types *btf.Spec, name string) uint64 {
	t.Helper()
	for typ, err := range types.All() {
		if err != nil {
			t.Fatalf("old build: %v", err)
		}
		if e, ok := typ.(*btf.Enum); ok {
			for _, v := range e.Values {
				if v.Name == name {
					return v.Value
				}
			}
		}
	}
	t.Fatalf("old build: no enumerator %s", name)
	return 0
}

func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
