package ebpf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/testroot"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

const (
	tcActShot     = 2
	tcActRedirect = 7
	testNet       = 100
	testZone      = 0x5a5a // routing domain (tenant) of the fixture's networks
	testVTEP      = "192.168.0.2"
	loIfindex     = 1 // BPF_PROG_TEST_RUN runs on the loopback device of the caller's netns
	peerIfindex   = 7
	vxIfindex     = 9
)

var (
	srcIP    = netip.MustParseAddr("10.1.0.2")
	localIP  = netip.MustParseAddr("10.1.0.3")
	remoteIP = netip.MustParseAddr("10.1.0.4")
	orphanIP = netip.MustParseAddr("10.1.0.5") // remote endpoint behind a VTEP that is no peer
	gwIP     = netip.MustParseAddr("10.1.0.1")
)

// testSlot is the counter slot the fixtures give a local endpoint: its last octet.
func testSlot(ip netip.Addr) uint32 { return uint32(ip.As4()[3]) }

// loadTestObjects loads the real programs with private, unpinned maps and the fixture:
// lo (ifindex 1) is the sending endpoint 10.1.0.2 of VXLAN network 100; 10.1.0.3 is local
// (ifindex 7, with its interface entry), 10.1.0.4 remote behind peer 192.168.0.2, 10.1.0.5 remote behind a non-peer.
// Programs: cb_from_container, cb_test_overlay and cb_clock_probe, and those named in
// progs (the others are nil): verifying every program costs each load seconds.
func loadTestObjects(t testing.TB, progs ...string) *contivbpfObjects {
	t.Helper()
	return loadTestObjectsSpec(t, nil, progs...)
}

// loadTestObjectsSpec is loadTestObjects with the spec adjusted by mutate first (e.g. map
// sizes).
func loadTestObjectsSpec(t testing.TB, mutate func(*ebpf.CollectionSpec), progs ...string) *contivbpfObjects {
	t.Helper()
	testroot.Need(t)
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	if mutate != nil {
		mutate(spec)
	}
	keep := append(append([]string{contivbpfProgCbFromContainer, contivbpfProgCbTestOverlay, contivbpfProgCbClockProbe}, stagePrograms()...), progs...)
	for name := range spec.Programs {
		if !slices.Contains(keep, name) {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	var objs contivbpfObjects
	assignByTag(t, &objs.contivbpfPrograms, func(n string) any { return coll.Programs[n] })
	assignByTag(t, &objs.contivbpfMaps, func(n string) any { return coll.Maps[n] })
	assignByTag(t, &objs.contivbpfVariables, func(n string) any { return coll.Variables[n] })
	t.Cleanup(func() { coll.Close() })
	// The clock the agent gives the programs (clock.go), not the helper's fallback.
	clk, err := calibrateClock(context.Background(), objs.CbClockProbe)
	if err != nil {
		t.Fatal(err)
	}
	if err := clk.set(objs.CbClockBase, objs.CbTickNs); err != nil {
		t.Fatal(err)
	}

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	cfg := contivbpfCbConfig{VxlanIfindex: vxIfindex, Vtep: ip4(netip.MustParseAddr("192.168.0.1"))}
	copy(cfg.GwMac[:], dataplane.RouterMAC)
	must(objs.CbCfg.Put(uint32(0), &cfg))
	must(objs.CbNetworks.Put(uint32(testNet), &contivbpfCbNetwork{
		Subnet: ip4(netip.MustParseAddr("10.1.0.0")), Mask: ip4(netip.MustParseAddr("255.255.255.0")),
		Gateway: ip4(gwIP), Tag: testNet, Mtu: 1450, Encap: uint8(contivbpfCbEncapCB_ENCAP_VXLAN), Vrf: testZone}))
	must(objs.CbNetworks.Put(uint32(1<<24|10), &contivbpfCbNetwork{
		Subnet: ip4(netip.MustParseAddr("10.2.0.0")), Mask: ip4(netip.MustParseAddr("255.255.255.0")),
		Tag: 10, Mtu: 1500, Encap: uint8(contivbpfCbEncapCB_ENCAP_VLAN), Vrf: testZone}))
	ifc := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: testSlot(srcIP), Vrf: testZone}
	copy(ifc.Mac[:], dataplane.ContivMAC(srcIP))
	must(objs.ifaceTable().put(uint32(loIfindex), &ifc, nil))
	put := func(ip netip.Addr, v contivbpfCbEndpoint) {
		copy(v.Mac[:], dataplane.ContivMAC(ip))
		k := contivbpfCbEpKey{Net: testNet, Ip: ip4(ip)}
		if v.Flags == uint32(contivbpfCbEpFlagsCB_EP_LOCAL) {
			v.Slot = testSlot(ip)
		}
		must(objs.CbEndpoints.Put(&k, &v))
	}
	put(srcIP, contivbpfCbEndpoint{Ifindex: loIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL)})
	put(localIP, contivbpfCbEndpoint{Ifindex: peerIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL)})
	// A local endpoint's interface entry, as the agent writes one for each (the sender's
	// is lo's, above).
	dst := contivbpfCbIface{Net: testNet, Ip: ip4(localIP), Slot: testSlot(localIP), Vrf: testZone}
	copy(dst.Mac[:], dataplane.ContivMAC(localIP))
	must(objs.ifaceTable().put(uint32(peerIfindex), &dst, nil))
	put(remoteIP, contivbpfCbEndpoint{Vtep: ip4(netip.MustParseAddr(testVTEP)), Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)})
	put(orphanIP, contivbpfCbEndpoint{Vtep: ip4(netip.MustParseAddr("192.168.0.99")), Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)})
	must(objs.CbPeers.Put(ip4(netip.MustParseAddr(testVTEP)), &contivbpfCbPeer{}))
	return &objs
}

// assignByTag sets each field of the struct dst points to from get(its ebpf tag), when
// get has it: what LoadAndAssign does, for a collection without some programs.
func assignByTag(t testing.TB, dst any, get func(name string) any) {
	t.Helper()
	v := reflect.ValueOf(dst).Elem()
	for i := range v.NumField() {
		name := v.Type().Field(i).Tag.Get("ebpf")
		got := reflect.ValueOf(get(name))
		if !got.IsValid() || got.IsNil() {
			continue
		}
		if !got.Type().AssignableTo(v.Field(i).Type()) {
			t.Fatalf("assign %s: %v is not %v", name, got.Type(), v.Field(i).Type())
		}
		v.Field(i).Set(got)
	}
}

// ---- packet builders ----

// malformedIPv4 are IPv4 headers the stages drop as drop_malformed_ip, by name.
func malformedIPv4() map[string]ipOpts {
	return map[string]ipOpts{
		"ihl-4":             {ihl: 4},
		"ihl-15-short":      {ihl: 15, truncate: 30},
		"version-6":         {version: 6},
		"totlen-too-big":    {totLen: 1000},
		"totlen-below-ihl":  {totLen: 12},
		"totlen-zero":       {totLen: 0xffff + 1}, // wraps to 0 in 16 bits; no GSO in test runs
		"truncated-payload": {truncate: 10},
	}
}

func ethHdr(dst, src net.HardwareAddr, typ uint16) []byte {
	b := append(append([]byte{}, dst...), src...)
	return binary.BigEndian.AppendUint16(b, typ)
}

type ipOpts struct {
	ihl      int // header length in 32-bit words (default 5)
	version  int // default 4
	totLen   int // default: header + payload
	fragOff  uint16
	ttl      uint8
	options  []byte
	truncate int // bytes to cut off the finished packet
}

func ipv4Pkt(src, dst netip.Addr, payload []byte, o ipOpts) []byte {
	if o.version == 0 {
		o.version = 4
	}
	if o.ihl == 0 {
		o.ihl = 5 + len(o.options)/4
	}
	if o.ttl == 0 {
		o.ttl = 64
	}
	h := make([]byte, 20)
	h[0] = byte(o.version<<4 | o.ihl&0xf)
	tot := 20 + len(o.options) + len(payload)
	if o.totLen != 0 {
		tot = o.totLen
	}
	binary.BigEndian.PutUint16(h[2:], uint16(tot))
	binary.BigEndian.PutUint16(h[6:], o.fragOff)
	h[8] = o.ttl
	h[9] = 6 // TCP
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	h = append(h, o.options...)
	return append(h, payload...)
}

func ipFrame(src, dst netip.Addr, o ipOpts) []byte {
	p := append(ethHdr(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), 0x0800),
		ipv4Pkt(src, dst, bytes.Repeat([]byte{0xab}, 40), o)...)
	return p[:len(p)-o.truncate]
}

func arpFrame(op uint16, sha net.HardwareAddr, sip, tip netip.Addr) []byte {
	b := ethHdr(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, sha, 0x0806)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	b = append(b, 6, 4)
	b = binary.BigEndian.AppendUint16(b, op)
	s, tt := sip.As4(), tip.As4()
	b = append(b, sha...)
	b = append(b, s[:]...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	return append(b, tt[:]...)
}

// skbCtx is the prefix of struct __sk_buff that BPF_PROG_TEST_RUN lets a test set.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
}

type runResult struct {
	ret  uint32
	out  []byte
	diff map[Reason]uint64
}

func run(t *testing.T, objs *contivbpfObjects, prog *ebpf.Program, pkt []byte, ctx any) runResult {
	t.Helper()
	before, err := readReasons(objs.CbReasons)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Repeat: 1}
	if ctx != nil {
		opts.Context = ctx
	}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	after, err := readReasons(objs.CbReasons)
	if err != nil {
		t.Fatal(err)
	}
	diff := map[Reason]uint64{}
	for r, c := range after {
		if d := c.Packets - before[r].Packets; d > 0 {
			diff[r] = d
		}
	}
	return runResult{ret: ret, out: opts.DataOut, diff: diff}
}

// expect checks the verdict and that exactly one reason counter moved, by one.
func (r runResult) expect(t *testing.T, ret uint32, reason Reason) {
	t.Helper()
	if r.ret != ret {
		t.Errorf("verdict %d, want %d (reasons %v)", r.ret, ret, r.diff)
	}
	if len(r.diff) != 1 || r.diff[reason] != 1 {
		t.Errorf("reason counters moved %v, want exactly %v+1", r.diff, reason)
	}
}

// placeIface makes v loIfindex's interface entry, in the array or the hash alone (where).
func placeIface(t *testing.T, objs *contivbpfObjects, where string, v *contivbpfCbIface) {
	t.Helper()
	err := objs.ifaceTable().del(uint32(loIfindex))
	if err == nil && where == "array" {
		err = objs.CbIfaceDirect.Put(uint32(loIfindex), v)
	}
	if err == nil && where == "hash" {
		err = objs.CbIfaces.Put(uint32(loIfindex), v)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestFromContainer(t *testing.T) {
	objs := loadTestObjects(t)
	prog := objs.CbFromContainer
	srcMAC := dataplane.ContivMAC(srcIP)
	bc := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

	arpReply := func(t *testing.T, r runResult, target netip.Addr, mac net.HardwareAddr) {
		t.Helper()
		r.expect(t, tcActRedirect, ARPReply)
		want := arpFrame(2, mac, target, srcIP)
		copy(want[0:6], srcMAC)   // eth dst = asker
		copy(want[32:38], srcMAC) // tha = asker
		binary.BigEndian.PutUint16(want[20:], 2)
		if !bytes.Equal(r.out[:42], want) {
			t.Errorf("reply\n got %x\nwant %x", r.out[:42], want)
		}
	}
	t.Run("arp/local", func(t *testing.T) {
		arpReply(t, run(t, objs, prog, arpFrame(1, srcMAC, srcIP, localIP), nil), localIP, dataplane.ContivMAC(localIP))
	})
	t.Run("arp/remote", func(t *testing.T) {
		arpReply(t, run(t, objs, prog, arpFrame(1, srcMAC, srcIP, remoteIP), nil), remoteIP, dataplane.ContivMAC(remoteIP))
	})
	t.Run("arp/gateway", func(t *testing.T) {
		arpReply(t, run(t, objs, prog, arpFrame(1, srcMAC, srcIP, gwIP), nil), gwIP, dataplane.RouterMAC)
	})
	t.Run("arp/unknown", func(t *testing.T) {
		run(t, objs, prog, arpFrame(1, srcMAC, srcIP, netip.MustParseAddr("10.1.0.77")), nil).expect(t, tcActShot, DropARPUnknownTarget)
	})
	t.Run("arp/reply-op", func(t *testing.T) {
		run(t, objs, prog, arpFrame(2, srcMAC, srcIP, localIP), nil).expect(t, tcActShot, DropARPNotRequest)
	})
	t.Run("arp/dad-probe", func(t *testing.T) {
		run(t, objs, prog, arpFrame(1, srcMAC, netip.IPv4Unspecified(), srcIP), nil).expect(t, tcActShot, DropARPSelf)
	})
	t.Run("arp/gratuitous", func(t *testing.T) {
		run(t, objs, prog, arpFrame(1, srcMAC, localIP, localIP), nil).expect(t, tcActShot, DropARPSelf)
	})
	t.Run("arp/truncated", func(t *testing.T) {
		run(t, objs, prog, arpFrame(1, srcMAC, srcIP, localIP)[:30], nil).expect(t, tcActShot, DropMalformedARP)
	})
	t.Run("arp/not-ipv4", func(t *testing.T) {
		p := arpFrame(1, srcMAC, srcIP, localIP)
		binary.BigEndian.PutUint16(p[16:], 0x86dd)
		run(t, objs, prog, p, nil).expect(t, tcActShot, DropMalformedARP)
	})

	t.Run("ipv4/local", func(t *testing.T) {
		p := ipFrame(srcIP, localIP, ipOpts{})
		copy(p[0:6], bc) // whatever the sender used, the program sets the endpoint's MAC
		r := run(t, objs, prog, p, nil)
		r.expect(t, tcActRedirect, FwdLocal)
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(localIP)) || !bytes.Equal(r.out[6:12], srcMAC) {
			t.Errorf("macs dst %x src %x", r.out[0:6], r.out[6:12])
		}
		if !bytes.Equal(r.out[14:len(p)], p[14:]) {
			t.Errorf("IP packet changed")
		}
	})
	t.Run("ipv4/local/ttl1-unchanged", func(t *testing.T) {
		r := run(t, objs, prog, ipFrame(srcIP, localIP, ipOpts{ttl: 1}), nil)
		r.expect(t, tcActRedirect, FwdLocal)
		if r.out[14+8] != 1 {
			t.Errorf("ttl %d, want 1 (bridged, not routed)", r.out[22])
		}
	})
	t.Run("ipv4/local/options", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, localIP, ipOpts{options: []byte{1, 1, 1, 0}}), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("ipv4/local/max-options", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, localIP, ipOpts{options: make([]byte, 40)}), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("ipv4/fragment-first", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, localIP, ipOpts{fragOff: 0x2000}), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("ipv4/fragment-later-no-l4", func(t *testing.T) {
		// 3 payload bytes: shorter than any L4 header; must be forwarded, not parsed.
		p := append(ethHdr(dataplane.ContivMAC(localIP), srcMAC, 0x0800), ipv4Pkt(srcIP, localIP, []byte{1, 2, 3}, ipOpts{fragOff: 185})...)
		run(t, objs, prog, p, nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("ipv4/remote", func(t *testing.T) {
		r := run(t, objs, prog, ipFrame(srcIP, remoteIP, ipOpts{}), nil)
		r.expect(t, tcActRedirect, FwdTunnel)
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(remoteIP)) {
			t.Errorf("dst mac %x", r.out[0:6])
		}
	})
	t.Run("ipv4/remote-not-peer", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, orphanIP, ipOpts{}), nil).expect(t, tcActShot, DropUnknownPeer)
	})
	t.Run("ipv4/unknown-dst", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, netip.MustParseAddr("10.1.0.99"), ipOpts{}), nil).expect(t, tcActShot, DropUnknownDst)
	})
	t.Run("ipv4/broadcast", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, netip.MustParseAddr("10.1.0.255"), ipOpts{}), nil).expect(t, tcActShot, DropUnknownDst)
	})
	t.Run("ipv4/outside-subnet", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, netip.MustParseAddr("8.8.8.8"), ipOpts{}), nil).expect(t, tcActShot, DropToGateway)
	})
	t.Run("ipv4/to-gateway", func(t *testing.T) {
		run(t, objs, prog, ipFrame(srcIP, gwIP, ipOpts{}), nil).expect(t, tcActShot, DropToGateway)
	})
	t.Run("ipv4/spoofed", func(t *testing.T) {
		run(t, objs, prog, ipFrame(localIP, remoteIP, ipOpts{}), nil).expect(t, tcActShot, DropSpoofedSrc)
	})
	t.Run("ipv4/spoofed-mac", func(t *testing.T) {
		for _, mac := range []net.HardwareAddr{dataplane.ContivMAC(localIP), {0x02, 0xde, 0xad, 0xbe, 0xef, 0x01}} {
			p := ipFrame(srcIP, localIP, ipOpts{})
			copy(p[6:12], mac)
			run(t, objs, prog, p, nil).expect(t, tcActShot, DropSpoofedSrc)
		}
	})
	t.Run("arp/forged-sender", func(t *testing.T) {
		run(t, objs, prog, arpFrame(1, srcMAC, remoteIP, localIP), nil).expect(t, tcActShot, DropSpoofedSrc)
		p := arpFrame(1, srcMAC, srcIP, localIP)
		copy(p[22:28], dataplane.ContivMAC(remoteIP)) // sender hardware address
		run(t, objs, prog, p, nil).expect(t, tcActShot, DropSpoofedSrc)
	})
	for name, o := range malformedIPv4() {
		t.Run("malformed/"+name, func(t *testing.T) {
			run(t, objs, prog, ipFrame(srcIP, localIP, o), nil).expect(t, tcActShot, DropMalformedIP)
		})
	}
	t.Run("malformed/shorter-than-ip-header", func(t *testing.T) {
		// BPF_PROG_TEST_RUN refuses an IPv4-typed frame shorter than Ethernet + 20 bytes
		// and any frame shorter than 14 bytes, so those bounds checks are only reachable
		// on a live device; the truncated-payload and IHL cases above cover the rest.
		for _, n := range []int{13, 14, 14 + 19} {
			if _, err := prog.Run(&ebpf.RunOptions{Data: ipFrame(srcIP, localIP, ipOpts{})[:n]}); err == nil {
				t.Errorf("%d-byte IPv4 frame accepted by BPF_PROG_TEST_RUN; add it to the malformed cases", n)
			}
		}
	})
	for name, typ := range map[string]uint16{"ipv6": 0x86dd, "lldp": 0x88cc} {
		t.Run("ethertype/"+name, func(t *testing.T) {
			p := ipFrame(srcIP, localIP, ipOpts{})
			binary.BigEndian.PutUint16(p[12:], typ)
			run(t, objs, prog, p, nil).expect(t, tcActShot, DropNotIPv4)
		})
	}
	// VLAN hopping: a tagged frame (802.1Q or QinQ, to a local or remote endpoint) never
	// leaves a container.
	for name, typ := range map[string]uint16{"8021q": 0x8100, "8021ad": 0x88a8} {
		t.Run("vlan-tagged/"+name, func(t *testing.T) {
			for _, dst := range []netip.Addr{localIP, remoteIP} {
				p := ipFrame(srcIP, dst, ipOpts{})
				p = append(p[:12:12], append([]byte{byte(typ >> 8), byte(typ), 0x00, 0x64}, p[12:]...)...)
				run(t, objs, prog, p, nil).expect(t, tcActShot, DropVLANTagged)
			}
		})
	}
	t.Run("unknown-iface", func(t *testing.T) {
		if err := objs.ifaceTable().del(uint32(loIfindex)); err != nil {
			t.Fatal(err)
		}
		defer func() {
			ifc := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: testSlot(srcIP), Vrf: testZone}
			copy(ifc.Mac[:], srcMAC)
			_ = objs.ifaceTable().put(uint32(loIfindex), &ifc, nil)
		}()
		run(t, objs, prog, ipFrame(srcIP, localIP, ipOpts{}), nil).expect(t, tcActShot, DropUnknownIface)
	})
	// The interface table (ifaces.go): the array's entry, else the hash's; an array entry
	// without an IP is a free place, never a match; the array shadows the hash.
	t.Run("iface-table", func(t *testing.T) {
		good := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: testSlot(srcIP), Vrf: testZone}
		copy(good.Mac[:], srcMAC)
		other := good
		other.Mac = [6]byte{0x02, 0xee, 0, 0, 0, 1}                                  // the packet's MAC is not this entry's
		free := contivbpfCbIface{Net: testNet, Slot: testSlot(srcIP), Mac: good.Mac} // no IP
		defer func() {
			_ = objs.ifaceTable().del(uint32(loIfindex))
			_ = objs.ifaceTable().put(uint32(loIfindex), &good, nil)
		}()
		for _, c := range []struct {
			name         string
			direct, hash *contivbpfCbIface
			ret          uint32
			reason       Reason
		}{
			{"array", &good, nil, tcActRedirect, FwdLocal},
			{"hash-only (an earlier build's entry)", nil, &good, tcActRedirect, FwdLocal},
			{"free array place falls back to the hash", &free, &good, tcActRedirect, FwdLocal},
			{"free array place and no hash entry", &free, nil, tcActShot, DropUnknownIface},
			{"array shadows the hash", &other, &good, tcActShot, DropSpoofedSrc},
			{"array shadows the hash (the other way)", &good, &other, tcActRedirect, FwdLocal},
		} {
			t.Run(c.name, func(t *testing.T) {
				err := objs.ifaceTable().del(uint32(loIfindex))
				if err == nil && c.direct != nil {
					err = objs.CbIfaceDirect.Put(uint32(loIfindex), c.direct)
				}
				if err == nil && c.hash != nil {
					err = objs.CbIfaces.Put(uint32(loIfindex), c.hash)
				}
				if err != nil {
					t.Fatal(err)
				}
				run(t, objs, prog, ipFrame(srcIP, localIP, ipOpts{}), nil).expect(t, c.ret, c.reason)
			})
		}
		// The fast stage reads only the array: a packet whose entry lies in the hash (past
		// the array, or an earlier build's not yet moved) goes to the container stage,
		// which copies the entry, and meets the same verdict and leaves as the same frame.
		// With the container stage out of cb_calls, the array's packet is still the fast
		// stage's and the hash's is dropped for want of its stage.
		t.Run("hash entry takes the container stage", func(t *testing.T) {
			const stageContainer = uint32(0) // CB_CALL_CONTAINER
			p := ipFrame(srcIP, localIP, ipOpts{})
			out := map[string][]byte{}
			for _, where := range []string{"array", "hash"} {
				placeIface(t, objs, where, &good)
				r := run(t, objs, prog, append([]byte(nil), p...), nil)
				r.expect(t, tcActRedirect, FwdLocal)
				out[where] = r.out
			}
			if !bytes.Equal(out["array"], out["hash"]) {
				t.Errorf("frames differ\narray %x\nhash  %x", out["array"], out["hash"])
			}
			if err := objs.CbCalls.Delete(stageContainer); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := objs.CbCalls.Put(stageContainer, objs.CbStageContainer); err != nil {
					t.Fatal(err)
				}
			}()
			placeIface(t, objs, "array", &good)
			run(t, objs, prog, append([]byte(nil), p...), nil).expect(t, tcActRedirect, FwdLocal)
			placeIface(t, objs, "hash", &good)
			run(t, objs, prog, append([]byte(nil), p...), nil).expect(t, tcActShot, DropNoStage)
		})
		// Between del's two writes a place keeps its MAC and network: a packet from 0.0.0.0
		// matches its (zero) address, and must still find no interface.
		t.Run("free array place, a packet from its zero address", func(t *testing.T) {
			err := objs.ifaceTable().del(uint32(loIfindex))
			if err == nil {
				err = objs.CbIfaceDirect.Put(uint32(loIfindex), &free)
			}
			if err != nil {
				t.Fatal(err)
			}
			p := ipFrame(netip.IPv4Unspecified(), localIP, ipOpts{})
			copy(p[6:12], free.Mac[:])
			run(t, objs, prog, p, nil).expect(t, tcActShot, DropUnknownIface)
		})
		// At start the hash's entries in the array's range are an earlier build's, and the
		// newer ones (after a rollback the array may hold a stale one): promote copies them
		// over, dropShadowed removes the hash copies; del frees both.
		t.Run("promote", func(t *testing.T) {
			const ifx = 5
			stale, cur := good, good
			stale.Epg, cur.Epg = 1, 2
			tbl := objs.ifaceTable()
			if err := errors.Join(objs.CbIfaceDirect.Put(uint32(ifx), &stale), objs.CbIfaces.Put(uint32(ifx), &cur)); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tbl.del(ifx) }()
			if n, err := tbl.promote(); err != nil || n < 1 {
				t.Fatalf("promote: %d moved, %v", n, err)
			}
			if err := tbl.dropShadowed(); err != nil {
				t.Fatal(err)
			}
			var v contivbpfCbIface
			if got, err := tbl.lookup(ifx); err != nil || got.Epg != 2 {
				t.Errorf("after promote: %+v, %v (want the hash's entry, group 2)", got, err)
			}
			if err := objs.CbIfaces.Lookup(uint32(ifx), &v); err == nil {
				t.Errorf("hash copy left after dropShadowed: %+v", v)
			}
			if err := tbl.del(ifx); err != nil {
				t.Fatal(err)
			}
			if got, err := tbl.lookup(ifx); err == nil {
				t.Errorf("after del: %+v", got)
			}
		})
	})
	// The way in (cb_fast_stage, the interface entry read in place from the array; an
	// entry in the hash goes to the container stage) with and without the stages with state
	// (then cb_ipv4_fast; an outside destination goes on to the container stage, which
	// checks it from the start): a UDP packet meets the same verdict in every mode and from
	// either place of the interface entry. The sender's group denies UDP to port 5353:
	// judged whenever policy is on. Each flow sends twice: with policy on, the second packet
	// of an allowed flow is the fast stage's (its entry holds the tuple) when the interface
	// entry is in the array, the container stage's when it is in the hash.
	t.Run("modes", func(t *testing.T) {
		good := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: testSlot(srcIP), Vrf: testZone}
		copy(good.Mac[:], srcMAC)
		grouped := good
		grouped.Epg = 77
		putPolicy(t, objs, dataplane.PolicySet{EPGID: 77, Rules: []dataplane.PolicyRule{
			{ID: "no-5353", Priority: 5, Proto: 17, Port: 5353, Action: dataplane.ActionDeny}}})
		defer func() {
			putPolicy(t, objs, dataplane.PolicySet{EPGID: 77})
			setFeatures(t, objs, 0)
			_ = objs.ifaceTable().del(uint32(loIfindex))
			_ = objs.ifaceTable().put(uint32(loIfindex), &good, nil)
		}()
		cases := []struct {
			name   string
			src    netip.Addr
			dst    netip.Addr
			dport  uint16
			ret    uint32
			reason Reason
		}{
			{"local", srcIP, localIP, 53, tcActRedirect, FwdLocal},
			{"remote", srcIP, remoteIP, 53, tcActRedirect, FwdTunnel},
			{"unknown-dst", srcIP, netip.MustParseAddr("10.1.0.99"), 53, tcActShot, DropUnknownDst},
			{"outside-subnet", srcIP, netip.MustParseAddr("8.8.8.8"), 53, tcActShot, DropToGateway},
			{"to-gateway", srcIP, gwIP, 53, tcActShot, DropToGateway},
			{"spoofed", localIP, remoteIP, 53, tcActShot, DropSpoofedSrc},
			{"denied-local", srcIP, localIP, 5353, tcActShot, DropPolicy},
			{"denied-remote", srcIP, remoteIP, 5353, tcActShot, DropPolicy},
		}
		sport := uint16(40000)
		for _, mode := range []struct {
			name     string
			features uint32
		}{
			{"plain", 0},
			{"policy", uint32(contivbpfCbFeaturesCB_FEAT_POLICY)},
			{"policy+services", uint32(contivbpfCbFeaturesCB_FEAT_POLICY | contivbpfCbFeaturesCB_FEAT_LB)},
		} {
			setFeatures(t, objs, mode.features)
			for _, where := range []string{"array", "hash"} {
				placeIface(t, objs, where, &grouped)
				for _, c := range cases {
					sport++
					t.Run(mode.name+"/"+where+"/"+c.name, func(t *testing.T) {
						p := l4Frame(17, c.src, c.dst, sport, c.dport, 0, 0)
						copy(p[6:12], srcMAC)
						ret, reason := c.ret, c.reason
						if mode.features == 0 && reason == DropPolicy { // no policy stage
							ret, reason = tcActRedirect, FwdLocal
							if c.dst == remoteIP {
								reason = FwdTunnel
							}
						}
						for range 2 {
							run(t, objs, prog, append([]byte(nil), p...), nil).expect(t, ret, reason)
						}
						if mode.features == 0 || reason != FwdLocal {
							return
						}
						// From the array the second packet was the fast path's: only it notes
						// the destination's host veth in the flow's entry (cb_dst_note). From
						// the hash both were the container stage's: no note.
						var dep contivbpfCbEndpoint
						if err := objs.CbEndpoints.Lookup(&contivbpfCbEpKey{Net: testNet, Ip: ip4(c.dst)}, &dep); err != nil {
							t.Fatal(err)
						}
						want := dep.Ifindex
						if where == "hash" {
							want = 0
						}
						e, ok := ctEntry(t, objs, testZone, 17, c.src, c.dst, sport, c.dport)
						if !ok || uint32(e.Nodeport) != want {
							t.Fatalf("the flow's entry (found %v) notes ifindex %d, want %d", ok, e.Nodeport, want)
						}
					})
				}
			}
		}
	})
	t.Run("vlan-remote-no-uplink", func(t *testing.T) {
		vsrc, vdst := netip.MustParseAddr("10.2.0.2"), netip.MustParseAddr("10.2.0.9")
		ifc := contivbpfCbIface{Net: 1<<24 | 10, Ip: ip4(vsrc), Vrf: testZone}
		copy(ifc.Mac[:], dataplane.ContivMAC(vsrc))
		if err := objs.ifaceTable().put(uint32(loIfindex), &ifc, nil); err != nil {
			t.Fatal(err)
		}
		k := contivbpfCbEpKey{Net: 1<<24 | 10, Ip: ip4(vdst)}
		if err := objs.CbEndpoints.Put(&k, &contivbpfCbEndpoint{Vtep: 1, Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			ifc := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: testSlot(srcIP), Vrf: testZone}
			copy(ifc.Mac[:], srcMAC)
			_ = objs.ifaceTable().put(uint32(loIfindex), &ifc, nil)
		}()
		run(t, objs, prog, ipFrame(vsrc, vdst, ipOpts{}), nil).expect(t, tcActShot, DropNoUplink)
	})
	t.Run("endpoint-counters", func(t *testing.T) {
		read := func(ip netip.Addr) (c EndpointCounters) {
			var vals []contivbpfCbEpStats
			if err := objs.CbEpCounters.Lookup(testSlot(ip), &vals); err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				c.RxPackets += v.RxPackets
				c.TxPackets += v.TxPackets
				c.TxBytes += v.TxBytes
				c.RxBytes += v.RxBytes
			}
			return c
		}
		s0, d0 := read(srcIP), read(localIP)
		p := ipFrame(srcIP, localIP, ipOpts{})
		run(t, objs, prog, p, nil).expect(t, tcActRedirect, FwdLocal)
		s1, d1 := read(srcIP), read(localIP)
		if s1.TxPackets != s0.TxPackets+1 || d1.RxPackets != d0.RxPackets+1 || d1.RxBytes != d0.RxBytes+uint64(len(p)) {
			t.Errorf("counters src %+v→%+v dst %+v→%+v", s0, s1, d0, d1)
		}
		// To a remote endpoint: the sender's slot counts it once it is sent, not when
		// its network is gone (a drop).
		run(t, objs, prog, ipFrame(srcIP, remoteIP, ipOpts{}), nil).expect(t, tcActRedirect, FwdTunnel)
		rp := ipFrame(srcIP, remoteIP, ipOpts{})
		if s2 := read(srcIP); s2.TxPackets != s1.TxPackets+1 || s2.TxBytes != s1.TxBytes+uint64(len(rp)) {
			t.Errorf("sent to a remote endpoint: sender's counters %+v→%+v", s1, s2)
		}
		var netw contivbpfCbNetwork
		if err := objs.CbNetworks.Lookup(uint32(testNet), &netw); err != nil {
			t.Fatal(err)
		}
		if err := objs.CbNetworks.Delete(uint32(testNet)); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = objs.CbNetworks.Put(uint32(testNet), &netw) }()
		s2 := read(srcIP)
		run(t, objs, prog, ipFrame(srcIP, remoteIP, ipOpts{}), nil).expect(t, tcActShot, DropUnknownNetwork)
		if s3 := read(srcIP); s3.TxPackets != s2.TxPackets {
			t.Errorf("dropped (no network): sender's counters %+v→%+v", s2, s3)
		}
	})
}

func TestFromOverlay(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbFromOverlay)
	peer := ip4(netip.MustParseAddr(testVTEP))
	ctx := func(remote, vni uint32) *skbCtx { return &skbCtx{CB: [5]uint32{remote, vni}} }

	t.Run("no-tunnel-key", func(t *testing.T) {
		run(t, objs, objs.CbFromOverlay, ipFrame(remoteIP, localIP, ipOpts{}), nil).expect(t, tcActShot, DropNoTunnelKey)
	})
	t.Run("to-local", func(t *testing.T) {
		p := ipFrame(remoteIP, localIP, ipOpts{})
		r := run(t, objs, objs.CbTestOverlay, p, ctx(peer, testNet))
		r.expect(t, tcActRedirect, FwdLocal)
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(localIP)) {
			t.Errorf("dst mac %x", r.out[0:6])
		}
	})
	t.Run("fragment-later", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(remoteIP, localIP, ipOpts{fragOff: 100}), ctx(peer, testNet)).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("unknown-peer", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(remoteIP, localIP, ipOpts{}), ctx(peer+1, testNet)).expect(t, tcActShot, DropUnknownPeer)
	})
	t.Run("unknown-vni", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(remoteIP, localIP, ipOpts{}), ctx(peer, 4242)).expect(t, tcActShot, DropUnknownNetwork)
	})
	t.Run("vni-of-vlan-key", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(remoteIP, localIP, ipOpts{}), ctx(peer, 1<<24|10)).expect(t, tcActShot, DropUnknownNetwork)
	})
	t.Run("to-remote", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(remoteIP, orphanIP, ipOpts{}), ctx(peer, testNet)).expect(t, tcActShot, DropUnknownDst)
	})
	// The inner source must be an endpoint the sending VTEP owns.
	t.Run("inner-src-behind-other-vtep", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(orphanIP, localIP, ipOpts{}), ctx(peer, testNet)).expect(t, tcActShot, DropOverlaySpoof)
	})
	t.Run("inner-src-unknown", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(netip.MustParseAddr("10.1.0.77"), localIP, ipOpts{}), ctx(peer, testNet)).expect(t, tcActShot, DropOverlaySpoof)
	})
	t.Run("inner-src-outside-subnet", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(netip.MustParseAddr("8.8.8.8"), localIP, ipOpts{}), ctx(peer, testNet)).expect(t, tcActShot, DropOverlaySpoof)
	})
	t.Run("short-inner-frame", func(t *testing.T) {
		// The inner IPv4 header claims more bytes than the frame holds.
		p := ipFrame(remoteIP, localIP, ipOpts{})[:14+20]
		binary.BigEndian.PutUint16(p[16:], 60)
		run(t, objs, objs.CbTestOverlay, p, ctx(peer, testNet)).expect(t, tcActShot, DropMalformedIP)
	})
	t.Run("spoofed-local-src", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(srcIP, localIP, ipOpts{}), ctx(peer, testNet)).expect(t, tcActShot, DropRemoteSrc)
	})
	t.Run("arp", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, arpFrame(1, dataplane.ContivMAC(remoteIP), remoteIP, localIP), ctx(peer, testNet)).expect(t, tcActShot, DropARPFromOverlay)
	})
	t.Run("ipv6", func(t *testing.T) {
		p := ipFrame(remoteIP, localIP, ipOpts{})
		binary.BigEndian.PutUint16(p[12:], 0x86dd)
		run(t, objs, objs.CbTestOverlay, p, ctx(peer, testNet)).expect(t, tcActShot, DropNotIPv4)
	})
	t.Run("malformed-ip", func(t *testing.T) {
		run(t, objs, objs.CbTestOverlay, ipFrame(remoteIP, localIP, ipOpts{ihl: 3}), ctx(peer, testNet)).expect(t, tcActShot, DropMalformedIP)
	})
}

// TestMapFull checks that a full map is a clear, counted error, never a silent drop.
func TestMapFull(t *testing.T) {
	testroot.Need(t)
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	spec.Maps[contivbpfMapCbEndpoints].MaxEntries = 2
	d := &Driver{log: slog.Default(), gen: 1, eps: endpointIndex{networks: map[string]netRec{}, remotes: map[string]remoteRec{},
		endpoints: map[string]epRec{}, peers: map[string]netip.Addr{}, addrNets: map[uint32]map[uint32]int{}}, mapFull: map[string]uint64{}}
	if err := spec.LoadAndAssign(&d.objs, nil); err != nil {
		t.Fatal(err)
	}
	defer d.objs.Close()
	n := dataplane.Network{ID: "n.t", Encap: dataplane.EncapVXLAN, Tag: 5, Subnet: netip.MustParsePrefix("10.9.0.0/24")}
	if err := d.upsertNetwork(n); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for i := 0; i < 3; i++ {
		ip := netip.AddrFrom4([4]byte{10, 9, 0, byte(10 + i)})
		lastErr = d.upsertRemote(dataplane.RemoteEndpoint{ID: ip.String(), NetworkID: n.ID, IP: ip,
			MAC: dataplane.ContivMAC(ip), VTEP: netip.MustParseAddr("192.168.1.1")})
		if i < 2 && lastErr != nil {
			t.Fatalf("insert %d: %v", i, lastErr)
		}
	}
	if !errors.Is(lastErr, ErrMapFull) {
		t.Fatalf("third insert: %v, want ErrMapFull", lastErr)
	}
	t.Logf("error: %v", lastErr)
	if d.mapFull[contivbpfMapCbEndpoints] != 1 {
		t.Errorf("mapFull counter %v", d.mapFull)
	}
	if _, ok := d.eps.remotes["10.9.0.12"]; ok {
		t.Error("failed insert recorded in the index")
	}
	// Updating an existing entry still works on a full map.
	ip := netip.MustParseAddr("10.9.0.10")
	if err := d.upsertRemote(dataplane.RemoteEndpoint{ID: ip.String(), NetworkID: n.ID, IP: ip,
		MAC: dataplane.ContivMAC(ip), VTEP: netip.MustParseAddr("192.168.1.2")}); err != nil {
		t.Errorf("update on full map: %v", err)
	}

	// Operators see both the full map and every drop reason on /metrics.
	run(t, &d.objs, d.objs.CbFromContainer, ipFrame(srcIP, localIP, ipOpts{}), nil).expect(t, tcActShot, DropUnknownIface)
	want := `
# HELP contiv_datapath_map_full_total Map inserts the driver could not make because the map was full, by map (cb_iface_direct: a host veth that got no ifindex inside the interface array, whose packets take the full stage).
# TYPE contiv_datapath_map_full_total counter
contiv_datapath_map_full_total{map="cb_endpoints"} 1
`
	if err := promtest.CollectAndCompare(d.Collector(), strings.NewReader(want), "contiv_datapath_map_full_total"); err != nil {
		t.Error(err)
	}
	got := promtest.ToFloat64(metricWithLabels(t, d.Collector(), "contiv_datapath_packets_total", DropUnknownIface.String()))
	if got != 1 {
		t.Errorf("contiv_datapath_packets_total{reason=%q} = %v, want 1", DropUnknownIface, got)
	}
	if n := promtest.CollectAndCount(d.Collector(), "contiv_datapath_packets_total"); n != len(Reasons()) {
		t.Errorf("%d reason series, want one per reason (%d)", n, len(Reasons()))
	}
}

// metricWithLabels returns the collector's metric of the given name whose reason label matches.
func metricWithLabels(t *testing.T, c prometheus.Collector, name, reason string) prometheus.Collector {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name}, func() float64 { return m.GetCounter().GetValue() })
				}
			}
		}
	}
	t.Fatalf("no %s{reason=%q}", name, reason)
	return nil
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Reasons() {
		n := r.String()
		if seen[n] {
			t.Errorf("duplicate reason name %s", n)
		}
		seen[n] = true
		if (r >= firstDrop) != r.IsDrop() {
			t.Errorf("%s: IsDrop %v", n, r.IsDrop())
		}
	}
	// Every value of drop.h's enum (CB_DROP_MIN and CB_REASON_MAX are markers) has a name.
	spec, err := loadContivbpf()
	if err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("cb_reason", &enum); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, v := range enum.Values {
		if v.Name != "CB_DROP_MIN" && v.Name != "CB_REASON_MAX" {
			want++
			if Reason(v.Value).String() != strings.ToLower(strings.TrimPrefix(v.Name, "CB_")) && v.Name != "CB_REASON_UNSPEC" {
				t.Errorf("%s is named %q", v.Name, Reason(v.Value).String())
			}
		}
	}
	if len(seen) != want {
		t.Errorf("%d named reasons, drop.h has %d (update reasons.go with drop.h)", len(seen), want)
	}
}

func BenchmarkPaths(b *testing.B) {
	objs := loadTestObjects(b)
	peer := ip4(netip.MustParseAddr(testVTEP))
	cases := []struct {
		name string
		prog *ebpf.Program
		pkt  []byte
		ctx  any
	}{
		{"local", objs.CbFromContainer, ipFrame(srcIP, localIP, ipOpts{}), nil},
		{"tunnel", objs.CbFromContainer, ipFrame(srcIP, remoteIP, ipOpts{}), nil},
		{"overlay-rx", objs.CbTestOverlay, ipFrame(remoteIP, localIP, ipOpts{}), &skbCtx{CB: [5]uint32{peer, testNet}}},
		{"drop-unknown-dst", objs.CbFromContainer, ipFrame(srcIP, netip.MustParseAddr("10.1.0.99"), ipOpts{}), nil},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			opts := &ebpf.RunOptions{Data: c.pkt, Repeat: uint32(b.N)}
			if c.ctx != nil {
				opts.Context = c.ctx
			}
			b.ResetTimer()
			if _, err := c.prog.Run(opts); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestProgramBenchmark logs Program.Benchmark ns/packet per path (never asserted).
func TestProgramBenchmark(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbFromOverlay)
	srcMAC := dataplane.ContivMAC(srcIP)
	for _, c := range []struct {
		name string
		prog *ebpf.Program
		pkt  []byte
	}{
		{"local", objs.CbFromContainer, ipFrame(srcIP, localIP, ipOpts{})},
		{"tunnel", objs.CbFromContainer, ipFrame(srcIP, remoteIP, ipOpts{})},
		{"drop-unknown-dst", objs.CbFromContainer, ipFrame(srcIP, netip.MustParseAddr("10.1.0.99"), ipOpts{})},
		{"overlay-no-key", objs.CbFromOverlay, ipFrame(remoteIP, localIP, ipOpts{})},
	} {
		ret, d, err := c.prog.Benchmark(c.pkt, 200000, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("Program.Benchmark %-18s %6.1f ns/packet (verdict %d)", c.name, float64(d.Nanoseconds()), ret)
	}
	// The ARP responder rewrites the request in place, so repeated runs would measure the
	// reply-drop path: time single runs instead (kernel-measured, averaged).
	var total time.Duration
	const n = 2000
	for i := 0; i < n; i++ {
		ret, d, err := objs.CbFromContainer.Benchmark(arpFrame(1, srcMAC, srcIP, localIP), 1, nil)
		if err != nil || ret != tcActRedirect {
			t.Fatalf("arp single run: verdict %d, %v", ret, err)
		}
		total += d
	}
	t.Logf("Program.Run single   %-18s %6.1f ns/packet", "arp-reply", float64(total.Nanoseconds())/n)
}

func vlanTag(frame []byte, vid uint16) []byte {
	out := append([]byte{}, frame[:12]...)
	out = binary.BigEndian.AppendUint16(out, 0x8100)
	out = binary.BigEndian.AppendUint16(out, vid)
	return append(out, frame[12:]...)
}

func TestVLAN(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbFromWire)
	const vnet = 1<<24 | 10
	vsrc, vloc, vrem := netip.MustParseAddr("10.2.0.2"), netip.MustParseAddr("10.2.0.3"), netip.MustParseAddr("10.2.0.9")
	put := func(ip netip.Addr, v contivbpfCbEndpoint) {
		copy(v.Mac[:], dataplane.ContivMAC(ip))
		k := contivbpfCbEpKey{Net: vnet, Ip: ip4(ip)}
		if err := objs.CbEndpoints.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	put(vloc, contivbpfCbEndpoint{Ifindex: peerIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL)})
	put(vrem, contivbpfCbEndpoint{Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)})
	ifc := contivbpfCbIface{Net: vnet, Ip: ip4(vsrc)}
	copy(ifc.Mac[:], dataplane.ContivMAC(vsrc))
	if err := objs.ifaceTable().put(uint32(loIfindex), &ifc, nil); err != nil {
		t.Fatal(err)
	}
	var cfg contivbpfCbConfig
	if err := objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.UplinkIfindex = 5
	if err := objs.CbCfg.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}

	t.Run("to-remote-tagged-uplink", func(t *testing.T) {
		r := run(t, objs, objs.CbFromContainer, ipFrame(vsrc, vrem, ipOpts{}), nil)
		r.expect(t, tcActRedirect, FwdUplink)
		if !bytes.Equal(r.out[0:6], dataplane.ContivMAC(vrem)) {
			t.Errorf("dst mac %x", r.out[0:6])
		}
	})
	t.Run("to-local-same-vlan", func(t *testing.T) {
		run(t, objs, objs.CbFromContainer, ipFrame(vsrc, vloc, ipOpts{}), nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("wire/tagged-to-local", func(t *testing.T) {
		r := run(t, objs, objs.CbFromWire, vlanTag(ipFrame(vrem, vloc, ipOpts{}), 10), nil)
		r.expect(t, tcActRedirect, FwdLocal)
		if binary.BigEndian.Uint16(r.out[12:]) != 0x0800 || !bytes.Equal(r.out[0:6], dataplane.ContivMAC(vloc)) {
			t.Errorf("tag not popped or mac not rewritten: %x", r.out[:18])
		}
	})
	t.Run("wire/tagged-to-unknown", func(t *testing.T) {
		run(t, objs, objs.CbFromWire, vlanTag(ipFrame(vrem, netip.MustParseAddr("10.2.0.77"), ipOpts{}), 10), nil).expect(t, tcActShot, DropUnknownDst)
	})
	t.Run("wire/tagged-arp", func(t *testing.T) {
		run(t, objs, objs.CbFromWire, vlanTag(arpFrame(1, dataplane.ContivMAC(vrem), vrem, vloc), 10), nil).expect(t, tcActShot, DropARPFromOverlay)
	})
	t.Run("wire/tagged-local-src", func(t *testing.T) {
		run(t, objs, objs.CbFromWire, vlanTag(ipFrame(vloc, vloc, ipOpts{}), 10), nil).expect(t, tcActShot, DropRemoteSrc)
	})
	for name, pkt := range map[string][]byte{
		"untagged":     ipFrame(vrem, vloc, ipOpts{}),
		"unknown-vlan": vlanTag(ipFrame(vrem, vloc, ipOpts{}), 11),
		"vni-not-vlan": vlanTag(ipFrame(vrem, vloc, ipOpts{}), 100), // VNI 100 exists, VLAN 100 does not
	} {
		t.Run("wire/pass-"+name, func(t *testing.T) {
			r := run(t, objs, objs.CbFromWire, pkt, nil)
			if int32(r.ret) != -1 || len(r.diff) != 0 {
				t.Errorf("verdict %d reasons %v, want TCX_NEXT and no counters", int32(r.ret), r.diff)
			}
		})
	}
}

// TestDropReasonsDoc keeps docs/drop-reasons.md in step with the enum.
func TestDropReasonsDoc(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/drop-reasons.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Reasons() {
		if r == ReasonUnspec {
			continue
		}
		row := "| " + strconv.Itoa(int(r)) + " | " + r.String() + " |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/drop-reasons.md lacks the row %q", row)
		}
	}
}

// TestReadReasonsBatch: the batch read of the verdict counters gives what one lookup per
// reason gives.
func TestReadReasonsBatch(t *testing.T) {
	objs := loadTestObjects(t)
	for _, p := range [][]byte{ipFrame(srcIP, localIP, ipOpts{}), arpFrame(1, dataplane.ContivMAC(srcIP), srcIP, localIP)} {
		run(t, objs, objs.CbFromContainer, p, nil)
	}
	batch, err := readReasons(objs.CbReasons)
	if err != nil {
		t.Fatal(err)
	}
	one, err := readReasons(lookupOnly{objs.CbReasons})
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) == 0 || !maps.Equal(batch, one) {
		t.Fatalf("batch read %v, per-reason read %v", batch, one)
	}
	// This kernel has batch operations on per-CPU arrays: the batch path is the one taken.
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	var cursor ebpf.MapBatchCursor
	n, err := objs.CbReasons.BatchLookup(&cursor, make([]uint32, reasonMax), make([]contivbpfCbCounter, int(reasonMax)*ncpu), nil)
	if n != int(reasonMax) || (err != nil && !errors.Is(err, ebpf.ErrKeyNotExist)) {
		t.Fatalf("batch lookup of the reasons: %d of %d, %v", n, reasonMax, err)
	}
}

// lookupOnly hides the map's batch lookup (kernels without batch operations on arrays).
type lookupOnly struct{ m *ebpf.Map }

func (l lookupOnly) Lookup(k, v any) error { return l.m.Lookup(k, v) }
func (l lookupOnly) BatchLookup(*ebpf.MapBatchCursor, any, any, *ebpf.BatchOptions) (int, error) {
	return 0, ebpf.ErrNotSupported
}
