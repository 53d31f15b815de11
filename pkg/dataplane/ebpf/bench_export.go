//go:build cbbench

// Benchmark fixtures for tools/bench (`make bench`, which builds with -tags cbbench): they
// time the committed programs on crafted packets and the conntrack collector on a full
// table. The build tag keeps them, and the reference forwarder they load, out of every
// other build of this package (the agent binaries).

package ebpf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ebpf/reffwd"
)

// PathCost is the kernel-measured cost of one datapath program path
// (BPF_PROG_TEST_RUN through Program.Benchmark), for `make bench`.
type PathCost struct {
	Name    string  // e.g. "local", "arp-reply", "tunnel-encap"
	Program string  // the BPF program's name
	Reason  Reason  // the verdict/drop reason the path ends with (checked before timing)
	NsPerPk float64 // nanoseconds per packet
	// Single is true when the path rewrites its packet (ARP reply, VLAN push/pop): the
	// kernel re-runs a repeated test on the rewritten skb, so such paths are timed as
	// single runs (median); those include the test harness' per-run timer cost, which
	// the "noop-single" row shows.
	Single bool
	// SingleRef is, for Single paths, the median single-run time of the local-forward
	// packet measured interleaved with this path's runs: Single − SingleRef + the local
	// path's repeated-run figure estimates the path's cost without the harness.
	SingleRef float64
	// RefNs is the reference forwarder's repeated-run time on the local path's packet,
	// measured right before and right after this path's timing (their mean): a path's
	// ratio to it compares two figures of the same moment (0 for the reference itself).
	RefNs float64
	// RestoredDiff, for a path that rewrites its packet and is timed hot through restoring
	// copies of its program (restoring), is its copy's time less the copy's on an
	// established direct flow's packet (same setup); NsPerPk is that plus BaseNs, the
	// direct flow's own repeated-run time.
	RestoredDiff, BaseNs float64
	// Before, for the paired figure rejudge-other-tenant: the median single-run time of the
	// same packet without the change (NsPerPk: right after one), runs interleaved.
	Before float64
}

// MeasurePaths loads the committed datapath programs with private, unpinned maps, fills
// them with a small fixture (one VXLAN and one VLAN network, local and remote endpoints,
// one peer), checks that each crafted packet takes the intended path, and times it with
// Program.Benchmark over repeat runs. A no-op tc program is timed the same way as the
// floor (the test harness' own cost), and the reference forwarder (package reffwd: one
// lookup, MAC rewrite, redirect_peer) on the local path's packet right after the local
// path, as the yardstick for ratios. Needs root (map and program creation).
func MeasurePaths(repeat int) ([]PathCost, error) {
	if repeat <= 0 {
		repeat = 200000
	}
	spec, err := loadContivbpf()
	if err != nil {
		return nil, fmt.Errorf("bench: load spec: %w", err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	a := netip.MustParseAddr
	src, local, remote, gw, vtep := a("10.1.0.2"), a("10.1.0.3"), a("10.1.0.4"), a("10.1.0.1"), a("192.168.0.2")
	vip := a("10.1.0.100")
	// The service path rewrites its packet: it is timed hot through copies of the entry
	// program that put their packet back before returning (restoring), against the
	// established direct flow's packet through the same kind of copy.
	svcPkt, directPkt := benchTCPFrame(src, vip, 40001, 80, 0x10), benchTCPFrame(src, local, 40000, 80, 0x10)
	for name, pkt := range map[string][]byte{benchRestoreSvc: svcPkt, benchRestoreDirect: directPkt} {
		ps, err := restoring(spec.Programs[contivbpfProgCbFromContainer], pkt[:54])
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		spec.Programs[name] = ps
	}
	var objs struct {
		contivbpfObjects
		SvcRestoring    *ebpf.Program `ebpf:"cb_bench_rst_svc"`
		DirectRestoring *ebpf.Program `ebpf:"cb_bench_rst_direct"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("bench: load programs: %w", err)
	}
	defer func() {
		objs.Close()
		objs.SvcRestoring.Close()
		objs.DirectRestoring.Close()
	}()
	// The clock the agent gives the programs (clock.go).
	clk, err := calibrateClock(context.Background(), objs.CbClockProbe)
	if err == nil {
		err = clk.set(objs.CbClockBase, objs.CbTickNs)
	}
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	noop, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "cb_bench_noop", Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("bench: load no-op program: %w", err)
	}
	defer noop.Close()
	rf, err := reffwd.Load()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer rf.Close()

	const (
		loIf, peerIf, vxIf, uplinkIf = 1, 7, 9, 5 // test runs happen on lo (ifindex 1)
		vxNet                        = 100
		vlanNet                      = 1<<24 | 10
	)
	vsrc, vloc, vrem := a("10.2.0.2"), a("10.2.0.3"), a("10.2.0.9")

	slotOf := func(ip netip.Addr) uint32 { return uint32(ip.As4()[3]) } // counter slot: last octet
	var errs []error
	put := func(m *ebpf.Map, k, v any) { errs = append(errs, m.Put(k, v)) }
	self := a("192.168.0.1") // this host's VTEP, also its egress NAT address
	cfg := contivbpfCbConfig{VxlanIfindex: vxIf, UplinkIfindex: uplinkIf, Vtep: ip4(self), SnatIp: ip4(self), VxlanPort: nport(benchVXLANPort)}
	copy(cfg.GwMac[:], dataplane.RouterMAC)
	put(objs.CbCfg, uint32(0), &cfg)
	put(objs.CbNetworks, uint32(vxNet), &contivbpfCbNetwork{Subnet: ip4(a("10.1.0.0")), Mask: ip4(a("255.255.255.0")),
		Gateway: ip4(gw), Tag: vxNet, Mtu: 1450, Encap: uint8(contivbpfCbEncapCB_ENCAP_VXLAN)})
	put(objs.CbNetworks, uint32(vlanNet), &contivbpfCbNetwork{Subnet: ip4(a("10.2.0.0")), Mask: ip4(a("255.255.255.0")),
		Gateway: ip4(a("10.2.0.1")), Tag: 10, Mtu: 1500, Encap: uint8(contivbpfCbEncapCB_ENCAP_VLAN)})
	ep := func(nw uint32, ip netip.Addr, v contivbpfCbEndpoint) {
		copy(v.Mac[:], dataplane.ContivMAC(ip))
		k := contivbpfCbEpKey{Net: nw, Ip: ip4(ip)}
		if v.Flags == uint32(contivbpfCbEpFlagsCB_EP_LOCAL) {
			v.Slot = slotOf(ip)
		}
		put(objs.CbEndpoints, &k, &v)
	}
	localFlag, remoteFlag := uint32(contivbpfCbEpFlagsCB_EP_LOCAL), uint32(contivbpfCbEpFlagsCB_EP_REMOTE)
	ep(vxNet, src, contivbpfCbEndpoint{Ifindex: loIf, Flags: localFlag})
	ep(vxNet, local, contivbpfCbEndpoint{Ifindex: peerIf, Flags: localFlag})
	ep(vxNet, remote, contivbpfCbEndpoint{Vtep: ip4(vtep), Flags: remoteFlag})
	ep(vlanNet, vsrc, contivbpfCbEndpoint{Ifindex: loIf, Flags: localFlag})
	ep(vlanNet, vloc, contivbpfCbEndpoint{Ifindex: peerIf, Flags: localFlag})
	ep(vlanNet, vrem, contivbpfCbEndpoint{Flags: remoteFlag})
	put(objs.CbPeers, ip4(vtep), &contivbpfCbPeer{})
	setIface := func(nw uint32, ip netip.Addr) {
		ifc := contivbpfCbIface{Net: nw, Ip: ip4(ip), Slot: slotOf(ip)}
		copy(ifc.Mac[:], dataplane.ContivMAC(ip))
		errs = append(errs, objs.ifaceTable().put(uint32(loIf), &ifc, nil))
	}
	setIface(vxNet, src)
	// The destination's interface entry, as the agent writes one for every local endpoint
	// (the fast path finds a flow's destination through it: cb_dst_noted).
	dstIfc := contivbpfCbIface{Net: vxNet, Ip: ip4(local), Slot: slotOf(local)}
	copy(dstIfc.Mac[:], dataplane.ContivMAC(local))
	errs = append(errs, objs.ifaceTable().put(uint32(peerIf), &dstIfc, nil))
	errs = append(errs, rf.SetDest(local, peerIf, dataplane.ContivMAC(local)))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench: fill maps: %w", err)
	}

	overlayCtx := &benchSkb{CB: [5]uint32{ip4(vtep), vxNet}}
	// Stateful paths: src in group 10, local in group 20 (rules on both sides), a service
	// VIP balanced to local, and group 30 with 1,024 rules none of which matches (a new
	// flow is judged against all of them).
	pt, err := objsPolTables(&objs.contivbpfObjects)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	setPolicy := func(epg uint16, rules []dataplane.PolicyRule) error {
		eg, in, err := compileRules(dataplane.PolicySet{EPGID: epg, Rules: rules})
		if err != nil {
			return err
		}
		for dir, rs := range [][]contivbpfCbRule{eg, in} {
			if len(rs) == 0 {
				continue
			}
			k := policiesKey(epg, uint8(dir))
			v := contivbpfCbPolicy{Count: uint32(len(rs))}
			copy(v.Rules[:], rs)
			if err := objs.CbPolicies.Put(&k, &v); err != nil {
				return err
			}
			if err := pt.install(k, rs, 0); err != nil {
				return err
			}
		}
		return objs.CbEpgs.Put(uint32(epg), &contivbpfCbEpgState{Flags: uint32(contivbpfCbEpgFlagsCB_EPG_RULES)})
	}
	setGroups := func(srcEPG, dstEPG uint16, features contivbpfCbFeatures) error {
		var errs []error
		for ip, g := range map[netip.Addr]uint16{src: srcEPG, local: dstEPG} {
			k := contivbpfCbEpKey{Net: vxNet, Ip: ip4(ip)}
			var v contivbpfCbEndpoint
			errs = append(errs, objs.CbEndpoints.Lookup(&k, &v))
			v.Epg = g
			errs = append(errs, objs.CbEndpoints.Put(&k, &v))
		}
		for ifindex, g := range map[uint32]uint16{loIf: srcEPG, peerIf: dstEPG} {
			if ifc, err := objs.ifaceTable().lookup(ifindex); err == nil { // the sender's is absent in the unknown-iface case
				ifc.Epg = g
				errs = append(errs, objs.ifaceTable().put(ifindex, &ifc, nil))
			}
		}
		errs = append(errs, objs.CbFeatures.Set(uint32(features)))
		return errors.Join(errs...)
	}
	var many []dataplane.PolicyRule
	for i := 0; i < MaxRules; i++ {
		many = append(many, dataplane.PolicyRule{ID: fmt.Sprintf("r%04d", i), Priority: 1, Ingress: true, Proto: 6, Port: uint16(2000 + i), Action: dataplane.ActionDeny})
	}
	// Groups 40 and 50 deny every TCP opening from any peer (the last rule by priority);
	// group 40 has 1,023 other rules before it, none of which matches a SYN to port 80:
	// ports, source groups and prefixes mixed (prog.policy_deny_1024_vs_1).
	denyTCP := dataplane.PolicyRule{ID: "zz-deny-tcp", Priority: 1, Ingress: true, Proto: 6, Action: dataplane.ActionDeny}
	var deny1024 []dataplane.PolicyRule
	for i := 0; i < MaxRules-1; i++ {
		r := dataplane.PolicyRule{ID: fmt.Sprintf("r%04d", i), Priority: 2 + i%7, Ingress: true, Proto: 6, Port: uint16(2000 + i), Action: dataplane.ActionAllow}
		switch i % 3 {
		case 1:
			r.RemoteEPG = uint16(100 + i%50)
		case 2:
			r.Remote = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i%100), byte(i), 0}), 16+i%9).Masked()
		}
		deny1024 = append(deny1024, r)
	}
	deny1024 = append(deny1024, denyTCP)
	errs = append(errs,
		setPolicy(40, deny1024),
		setPolicy(50, []dataplane.PolicyRule{denyTCP}),
		setPolicy(10, []dataplane.PolicyRule{{ID: "out", Priority: 1, Proto: 17, Action: dataplane.ActionDeny}}),
		setPolicy(20, []dataplane.PolicyRule{
			{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
			{ID: "allow-80", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 80, Action: dataplane.ActionAllow}}),
		setPolicy(30, many),
		objs.CbServices.Put(&contivbpfCbSvcKey{Vip: ip4(vip), Port: benchPort(80), Proto: 6}, &contivbpfCbSvc{Id: 1, Count: 1, TargetPort: benchPort(80)}),
		objs.CbBackends.Put(&contivbpfCbBackendKey{SvcId: 1}, &contivbpfCbBackend{Ip: ip4(local), Net: vxNet}),
		objs.CbMembers.Put(&contivbpfCbMemberKey{SvcId: 1, Ip: ip4(local)}, &contivbpfCbMember{Net: vxNet}),
		svcRevBump(objs.CbSvcRevs, 1),
		objs.CbVips.Put(&contivbpfCbVipKey{Vip: ip4(vip)}, &contivbpfCbVip{}))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench: fill stateful maps: %w", err)
	}
	// NetworkPolicy: local isolated for ingress with set 1 (1,024 rules of the usual
	// shapes, none admitting src's SYN to port 80: TCP and UDP single ports from mixed
	// prefixes, any port from prefixes that do not hold src), set 2 (one rule that does
	// not either: prog.netpol_deny_1024_vs_1) or set 3 (1,024 port ranges of every
	// alignment, UDP and TCP: the most lookups a set can take, 2 x 17).
	var kusual, kranges []dataplane.PodRule
	for i := 0; i < dataplane.MaxPodRules; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(2 + i%4), byte(i), 0}), 8+i%17).Masked()
		r := dataplane.PodRule{Remote: p, Proto: 6, PortMin: uint16(2000 + i), PortMax: uint16(2000 + i)}
		switch i % 3 {
		case 1:
			r.Proto = 17
		case 2:
			r.Remote = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16, byte(i), 0}), 24)
			r.PortMin, r.PortMax = 0, 0
		}
		kusual = append(kusual, r)
		lo := uint16(1 + i*61)
		kranges = append(kranges, dataplane.PodRule{Remote: p, Proto: []uint8{6, 17}[i%2], PortMin: lo, PortMax: lo + uint16(i%1000)})
	}
	kusual[0].Remote = netip.MustParsePrefix("10.9.0.0/16")
	kone, _ := compileKRules(kusual[:1])
	kall, _ := compileKRules(kusual)
	kwide, _ := compileKRules(kranges)
	errs = append(errs, writeKSet(plainPut, &objs.contivbpfObjects, 1, kall, 0), writeKSet(plainPut, &objs.contivbpfObjects, 2, kone, 0),
		writeKSet(plainPut, &objs.contivbpfObjects, 3, kwide, 0))
	isolate := func(set uint32) func() error {
		return func() error {
			k := contivbpfCbKpodKey{Addr: ip4(local)}
			if err := objs.CbKpods.Put(&k, &contivbpfCbKpod{Flags: kpodInIsolated, InSet: set}); err != nil {
				return err
			}
			return setGroups(0, 0, contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_NETPOL)
		}
	}
	plain := func() error {
		if err := objs.CbKpods.Delete(&contivbpfCbKpodKey{Addr: ip4(local)}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		return setGroups(0, 0, 0)
	}
	policyFeat := contivbpfCbFeaturesCB_FEAT_POLICY
	cases := []benchCase{
		{name: "local", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchIPFrame(src, local), reason: FwdLocal},
		{name: "ref-forward", prog: rf.Program(), pname: "rf_forward", pkt: benchIPFrame(src, local),
			check: func(ret uint32, out []byte) error {
				if want := dataplane.ContivMAC(local); ret != benchTCActRedirect || !bytes.Equal(out[:6], want) {
					return fmt.Errorf("returned %d with destination MAC %v, want TC_ACT_REDIRECT (%d) and %v",
						ret, net.HardwareAddr(out[:6]), benchTCActRedirect, want)
				}
				return nil
			}},
		{name: "arp-reply", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchARPRequest(src, local), reason: ARPReply, single: true},
		{name: "tunnel-encap", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchIPFrame(src, remote), reason: FwdTunnel},
		{name: "tunnel-decap", prog: objs.CbTestOverlay, pname: "cb_test_overlay", pkt: benchIPFrame(remote, local), ctx: overlayCtx, reason: FwdLocal},
		// What the egress device's program costs a packet that is not its own: a tunnel
		// packet (cb_overlay_in lets it through first) and the host's own UDP (the egress
		// reply lookup misses).
		{name: "uplink-overlay", prog: objs.CbFromUplink, pname: "cb_from_uplink", pkt: benchUDPFrame(vtep, self, 40000, benchVXLANPort), check: benchTCXNext},
		{name: "uplink-host", prog: objs.CbFromUplink, pname: "cb_from_uplink", pkt: benchUDPFrame(vtep, self, 40000, 53), check: benchTCXNext},
		{name: "drop-unknown-dst", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchIPFrame(src, a("10.1.0.99")), reason: DropUnknownDst},
		{name: "vlan-push", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchIPFrame(vsrc, vrem), reason: FwdUplink, single: true, vlan: true},
		{name: "vlan-pop", prog: objs.CbFromWire, pname: "cb_from_wire", pkt: benchVLANTag(benchIPFrame(vrem, vloc), 10), reason: FwdLocal, single: true, vlan: true},
		// Stage ladder for profiling the local path: each row adds work to the one above.
		{name: "stage-unknown-iface", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchIPFrame(src, local), reason: DropUnknownIface, noIf: true},
		{name: "stage-not-ipv4", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchEtherType(benchIPFrame(src, local), 0x86dd), reason: DropNotIPv4},
		{name: "local-single", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchIPFrame(src, local), reason: FwdLocal, single: true},
		// An established, allowed flow between two groups with rules: one conntrack hit.
		{name: "ct-established", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40000, 80, 0x10), reason: FwdLocal,
			setup: func() error { return setGroups(10, 20, policyFeat) }},
		// A service flow: client→VIP entry hit, backend re-validated, DNAT, flow entry hit.
		// DNAT rewrites the packet, so it is timed hot through a copy of the program that
		// puts its packet back before returning (restoring), less the same kind of copy on
		// an established direct flow's packet under the same setup (services on), plus that
		// packet's own repeated time.
		{name: "service", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: svcPkt, reason: FwdLocal,
			ref: directPkt, restoring: objs.SvcRestoring, restoringRef: objs.DirectRestoring,
			setup: func() error { return setGroups(10, 20, policyFeat|contivbpfCbFeaturesCB_FEAT_LB) }},
		// A new flow judged against 1,024 rules (a RST: judged, never recorded, so every
		// run scans them all).
		{name: "policy-1024-rules", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40002, 80, 0x04), reason: FwdLocal,
			setup: func() error { return setGroups(10, 30, policyFeat) }},
		{name: "policy-2-rules", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40003, 80, 0x04), reason: FwdLocal,
			setup: func() error { return setGroups(10, 20, policyFeat) }},
		// A SYN denied by the last of 1,024 rules and by a group's only rule (a denied
		// opening keeps no state: every run is judged): prog.policy_deny_1024_vs_1.
		{name: "policy-deny-1024", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40004, 80, 0x02), reason: DropPolicy,
			setup: func() error { return setGroups(10, 40, policyFeat) }},
		{name: "policy-deny-1", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40004, 80, 0x02), reason: DropPolicy,
			setup: func() error { return setGroups(10, 50, policyFeat) }},
		// A SYN denied by a pod's NetworkPolicy set of 1,024 rules and of 1 (denied: no
		// state, every run judged): prog.netpol_deny_1024_vs_1.
		{name: "netpol-deny-1024", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40005, 80, 0x02), reason: DropNetpol,
			setup: isolate(1)},
		{name: "netpol-deny-1", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40005, 80, 0x02), reason: DropNetpol,
			setup: isolate(2)},
		{name: "netpol-deny-ranges", prog: objs.CbFromContainer, pname: "cb_from_container", pkt: benchTCPFrame(src, local, 40005, 80, 0x02), reason: DropNetpol,
			setup: isolate(3)},
	}
	var out []PathCost
	floor := func(name string, single bool) error {
		d, err := benchTime(noop, benchIPFrame(src, local), nil, repeat, single)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", name, err)
		}
		out = append(out, PathCost{Name: name, Program: "cb_bench_noop", NsPerPk: d, Single: single})
		return nil
	}
	if err := floor("noop", false); err != nil {
		return nil, err
	}
	if err := floor("noop-single", true); err != nil {
		return nil, err
	}
	for _, c := range cases {
		switch {
		case c.noIf:
			errs = append(errs, objs.ifaceTable().del(uint32(loIf)))
		case c.vlan:
			setIface(vlanNet, vsrc)
		default:
			setIface(vxNet, src)
		}
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("bench: set sending interface: %w", err)
		}
		setup := c.setup
		if setup == nil {
			setup = plain
		}
		if err := setup(); err != nil {
			return nil, fmt.Errorf("bench: %s: setup: %w", c.name, err)
		}
		if c.check != nil {
			// The destination MAC is zeroed for this run so that its rewrite shows.
			probe := append([]byte(nil), c.pkt...)
			clear(probe[:6])
			res := make([]byte, len(probe))
			ret, err := c.prog.Run(&ebpf.RunOptions{Data: probe, DataOut: res, Repeat: 1})
			if err == nil {
				err = c.check(ret, res)
			}
			if err != nil {
				return nil, fmt.Errorf("bench: %s: %w", c.name, err)
			}
		} else {
			// Check the path first: one run must move exactly the expected reason counter.
			before, err := readReasons(objs.CbReasons)
			if err != nil {
				return nil, err
			}
			ropts := &ebpf.RunOptions{Data: append([]byte(nil), c.pkt...), Repeat: 1, Context: c.ctx}
			if _, err := c.prog.Run(ropts); err != nil {
				return nil, fmt.Errorf("bench: %s: run: %w", c.name, err)
			}
			after, err := readReasons(objs.CbReasons)
			if err != nil {
				return nil, err
			}
			if after[c.reason].Packets != before[c.reason].Packets+1 {
				return nil, fmt.Errorf("bench: %s: packet did not take the %v path (reasons before %v after %v)", c.name, c.reason, before, after)
			}
		}
		var d, ref, base, refBefore, refAfter, restored float64
		var err error
		if c.name != "ref-forward" {
			if refBefore, err = benchTime(rf.Program(), benchIPFrame(src, local), nil, repeat, false); err != nil {
				return nil, fmt.Errorf("bench: reference before %s: %w", c.name, err)
			}
		}
		switch {
		case c.single && c.name != "local-single":
			d, ref, err = benchSingle(c.prog, c.pkt, objs.CbFromContainer, benchIPFrame(src, local), repeat/100, func() {
				if c.vlan {
					setIface(vlanNet, vsrc)
				} else {
					setIface(vxNet, src)
				}
				errs = append(errs, setup())
			}, func() { setIface(vxNet, src); errs = append(errs, plain()) })
		case c.restoring != nil:
			var hot []float64
			hot, err = benchRestored(c, rf.Program(), benchIPFrame(src, local), repeat)
			if err == nil {
				d, restored, base, refBefore = hot[0], hot[1], hot[2], hot[3]
				refAfter = refBefore
			}
		case c.ctx == nil && !c.single && c.name != "ref-forward":
			d, refBefore, err = benchPaired(c.prog, c.pkt, rf.Program(), benchIPFrame(src, local), repeat)
			refAfter = refBefore
		default:
			d, err = benchTime(c.prog, c.pkt, c.ctx, repeat, c.single)
		}
		if err == nil {
			err = errors.Join(errs...)
		}
		if err == nil && c.name != "ref-forward" && refAfter == 0 {
			refAfter, err = benchTime(rf.Program(), benchIPFrame(src, local), nil, repeat, false)
		}
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", c.name, err)
		}
		out = append(out, PathCost{Name: c.name, Program: c.pname, Reason: c.reason, NsPerPk: d, Single: c.single, SingleRef: ref,
			RefNs: (refBefore + refAfter) / 2, RestoredDiff: restored, BaseNs: base})
	}
	// prog.rejudge_other_tenant: ct-established's flow (tracked, established, allowed),
	// right after another tenant's group (60) changed its rules, against the same packet
	// without a change.
	setIface(vxNet, src)
	errs = append(errs, setPolicy(60, []dataplane.PolicyRule{{ID: "other", Priority: 1, Proto: 17, Action: dataplane.ActionDeny}}),
		setGroups(10, 20, policyFeat))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench: rejudge-other-tenant: setup: %w", err)
	}
	rc, err := benchRejudge(objs.CbFromContainer, objs.CbReasons, benchTCPFrame(src, local, 40000, 80, 0x10), repeat/100,
		func(n int, epoch bool) error { return benchOtherTenantChange(&objs.contivbpfObjects, pt, 60, n, epoch) })
	if err != nil {
		return nil, fmt.Errorf("bench: rejudge-other-tenant: %w", err)
	}
	return append(out, rc), nil
}

// benchTime returns ns per packet: the kernel-measured time of one Benchmark call of
// repeat runs, or (single) the median of repeat/100 single runs on a fresh copy of the
// packet. Program.Benchmark cannot pass a context (cb[] for cb_test_overlay): such
// repeated runs are timed by the wall clock around one run of repeat iterations (the one
// syscall is negligible against repeat runs), best of five.
func benchTime(p *ebpf.Program, pkt []byte, ctx any, repeat int, single bool) (float64, error) {
	if single {
		n := repeat / 100
		if n < 100 {
			n = 100
		}
		var runs []float64
		for i := 0; i < n; i++ {
			_, d, err := p.Benchmark(append([]byte(nil), pkt...), 1, nil)
			if err != nil {
				return 0, err
			}
			runs = append(runs, float64(d.Nanoseconds()))
		}
		return benchMedian(runs), nil
	}
	if ctx == nil {
		_, d, err := p.Benchmark(pkt, repeat, nil)
		if err != nil {
			return 0, err
		}
		return float64(d.Nanoseconds()), nil
	}
	best := time.Duration(0)
	for i := 0; i < 5; i++ {
		start := time.Now()
		if _, err := p.Run(&ebpf.RunOptions{Data: pkt, Repeat: uint32(repeat), Context: ctx}); err != nil {
			return 0, err
		}
		if el := time.Since(start); best == 0 || el < best {
			best = el
		}
	}
	return float64(best.Nanoseconds()) / float64(repeat), nil
}

// benchCase is one path MeasurePaths times.
type benchCase struct {
	name   string
	prog   *ebpf.Program
	pname  string
	pkt    []byte
	ctx    any
	reason Reason
	single bool
	// ref, restoring, restoringRef: for a path that rewrites its packet timed hot, the
	// established direct flow's packet it is measured against and the copies of prog
	// that put pkt and ref back before returning (restoring).
	ref                     []byte
	restoring, restoringRef *ebpf.Program
	vlan                    bool // the sending interface belongs to the VLAN network
	noIf                    bool // the sending interface is unknown
	// setup prepares the maps for this case (run before its check and timing).
	setup func() error
	// check replaces the reason-counter check (programs without cb_reasons): it gets
	// the return code and the packet out of one run on pkt with its destination MAC
	// zeroed.
	check func(ret uint32, out []byte) error
}

// benchPaired times prog on pkt and the reference forwarder on refPkt in alternating
// chunks (benchChunks of repeat/benchChunks runs each) and returns the medians of both:
// a moment of noise then moves one chunk of each, not one side of the ratio.
func benchPaired(prog *ebpf.Program, pkt []byte, ref *ebpf.Program, refPkt []byte, repeat int) (float64, float64, error) {
	n := max(repeat/benchChunks, 1000)
	var path, refs []float64
	for range benchChunks {
		for _, r := range []struct {
			p   *ebpf.Program
			pkt []byte
			out *[]float64
		}{{prog, pkt, &path}, {ref, refPkt, &refs}} {
			d, err := benchTime(r.p, r.pkt, nil, n, false)
			if err != nil {
				return 0, 0, err
			}
			*r.out = append(*r.out, d)
		}
	}
	return benchMedian(path), benchMedian(refs), nil
}

// benchRestored times case c hot (its restoring copies: c.restoring on c.pkt against
// c.restoringRef on c.ref, with c.prog on c.ref and the reference forwarder ref on refPkt)
// in benchChunks alternating chunks, after checking that the copy leaves the packet as it
// found it and counts the path's verdict. It returns the medians of the path's estimate
// (c.prog on c.ref + copy on c.pkt − copy on c.ref), of the copies' difference, of c.prog
// on c.ref and of the reference.
func benchRestored(c benchCase, ref *ebpf.Program, refPkt []byte, repeat int) ([]float64, error) {
	out := make([]byte, len(c.pkt))
	if _, err := c.restoring.Run(&ebpf.RunOptions{Data: c.pkt, DataOut: out, Repeat: 1}); err != nil {
		return nil, fmt.Errorf("restoring copy: %w", err)
	}
	if !bytes.Equal(out, c.pkt) {
		return nil, fmt.Errorf("restoring copy left the packet as % x, want % x", out[:54], c.pkt[:54])
	}
	n := max(repeat/benchChunks, 1000)
	var est, diff, base, refs []float64
	for range benchChunks {
		var t [4]float64
		for i, r := range []struct {
			p   *ebpf.Program
			pkt []byte
		}{{c.restoring, c.pkt}, {c.restoringRef, c.ref}, {c.prog, c.ref}, {ref, refPkt}} {
			d, err := benchTime(r.p, r.pkt, nil, n, false)
			if err != nil {
				return nil, err
			}
			t[i] = d
		}
		est, diff, base, refs = append(est, t[2]+t[0]-t[1]), append(diff, t[0]-t[1]), append(base, t[2]), append(refs, t[3])
	}
	return []float64{benchMedian(est), benchMedian(diff), benchMedian(base), benchMedian(refs)}, nil
}

// benchChunks is how many alternating chunks benchPaired splits a path's runs into.
const benchChunks = 9

// benchSingle times n single runs of prog on fresh copies of pkt, each right after a
// single run of the reference program/packet, and returns both medians (ns). before and
// between set up the maps for the path and for the reference.
func benchSingle(prog *ebpf.Program, pkt []byte, refProg *ebpf.Program, refPkt []byte, n int, setPath, setRef func()) (float64, float64, error) {
	if n < 200 {
		n = 200
	}
	var path, ref []float64
	for i := 0; i < n; i++ {
		setRef()
		_, d, err := refProg.Benchmark(append([]byte(nil), refPkt...), 1, nil)
		if err != nil {
			return 0, 0, err
		}
		ref = append(ref, float64(d.Nanoseconds()))
		setPath()
		_, d, err = prog.Benchmark(append([]byte(nil), pkt...), 1, nil)
		if err != nil {
			return 0, 0, err
		}
		path = append(path, float64(d.Nanoseconds()))
	}
	return benchMedian(path), benchMedian(ref), nil
}

// benchTCActRedirect is TC_ACT_REDIRECT, what bpf_redirect_peer returns.
const benchTCActRedirect = 7

// benchVXLANPort is the overlay's UDP port in the bench's configuration.
const benchVXLANPort = 4789

// benchTCXNext checks a run handed its packet on untouched (CB_TCX_NEXT); the probe's
// zeroed destination MAC must stay zero.
func benchTCXNext(ret uint32, out []byte) error {
	if ret != 0xffffffff || !bytes.Equal(out[:6], make([]byte, 6)) {
		return fmt.Errorf("returned %#x with destination MAC %v, want TCX_NEXT and the packet untouched", ret, net.HardwareAddr(out[:6]))
	}
	return nil
}

func benchMedian(v []float64) float64 {
	sort.Float64s(v)
	return v[len(v)/2]
}

// benchSkb is the settable prefix of struct __sk_buff (cb[] carries the tunnel source and
// VNI for cb_test_overlay).
type benchSkb struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
}

func benchEth(dst, src net.HardwareAddr, typ uint16) []byte {
	b := append(append([]byte{}, dst...), src...)
	return binary.BigEndian.AppendUint16(b, typ)
}

// benchPort is a port as stored in the maps (network order in memory).
func benchPort(p uint16) uint16 { return nport(p) }

// benchTCPFrame is an Ethernet + IPv4 + TCP frame from sport to dport with flags.
func benchTCPFrame(src, dst netip.Addr, sport, dport uint16, flags byte) []byte {
	f := benchIPFrame(src, dst)
	tcp := f[14+20:]
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	tcp[12] = 5 << 4
	tcp[13] = flags
	return f
}

// benchIPFrame is an Ethernet + IPv4 + 40-byte payload frame (protocol TCP).
func benchIPFrame(src, dst netip.Addr) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], 60)
	h[8], h[9] = 64, 6
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	p := append(benchEth(dataplane.ContivMAC(dst), dataplane.ContivMAC(src), 0x0800), h...)
	return append(p, make([]byte, 40)...)
}

// benchUDPFrame is benchIPFrame carrying UDP from sport to dport.
func benchUDPFrame(src, dst netip.Addr, sport, dport uint16) []byte {
	p := benchIPFrame(src, dst)
	p[14+9] = 17
	binary.BigEndian.PutUint16(p[34:], sport)
	binary.BigEndian.PutUint16(p[36:], dport)
	binary.BigEndian.PutUint16(p[38:], 40)
	return p
}

func benchARPRequest(sip, tip netip.Addr) []byte {
	sha := dataplane.ContivMAC(sip)
	b := benchEth(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, sha, 0x0806)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	b = append(b, 6, 4)
	b = binary.BigEndian.AppendUint16(b, 1)
	s, t := sip.As4(), tip.As4()
	b = append(b, sha...)
	b = append(b, s[:]...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	return append(b, t[:]...)
}

func benchEtherType(frame []byte, typ uint16) []byte {
	out := append([]byte(nil), frame...)
	binary.BigEndian.PutUint16(out[12:], typ)
	return out
}

func benchVLANTag(frame []byte, vid uint16) []byte {
	out := append([]byte{}, frame[:12]...)
	out = binary.BigEndian.AppendUint16(out, 0x8100)
	out = binary.BigEndian.AppendUint16(out, vid)
	return append(out, frame[12:]...)
}

// MeasureCTGC fills a conntrack table of the datapath's layout with n entries, half of them
// expired, and times one collector pass over it (for `make bench`). It returns the pass
// duration and how many entries it deleted. Needs root.
func MeasureCTGC(n int) (time.Duration, int, error) {
	spec, err := loadContivbpf()
	if err != nil {
		return 0, 0, fmt.Errorf("ct gc bench: load spec: %w", err)
	}
	ms := spec.Maps[contivbpfMapCbCt].Copy()
	ms.Pinning = ebpf.PinNone
	ms.MaxEntries = uint32(n)
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return 0, 0, fmt.Errorf("ct gc bench: create map: %w", err)
	}
	defer m.Close()
	now, err := monotonicNow()
	if err != nil {
		return 0, 0, err
	}
	const batch = 4096
	keys := make([]contivbpfCbCtKey, 0, batch)
	vals := make([]contivbpfCbCtEntry, 0, batch)
	flush := func() error {
		if len(keys) == 0 {
			return nil
		}
		if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("ct gc bench: fill: %w", err)
		}
		keys, vals = keys[:0], vals[:0]
		return nil
	}
	for i := 0; i < n; i++ {
		k := contivbpfCbCtKey{Zone: 1, Saddr: uint32(i), Daddr: uint32(i >> 16), Sport: uint16(i), Dport: 80, Proto: 6}
		v := contivbpfCbCtEntry{Flags: uint8(contivbpfCbCtFlagsCB_CT_ALLOWED), State: uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED), Expires: now + uint64(time.Hour)}
		if i%2 == 1 {
			v.Expires = 1
		}
		keys, vals = append(keys, k), append(vals, v)
		if len(keys) == batch {
			if err := flush(); err != nil {
				return 0, 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, 0, err
	}
	g := newCTGC(m, time.Hour)
	start := time.Now()
	deleted, err := g.pass()
	return time.Since(start), deleted, err
}
