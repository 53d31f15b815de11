package ebpf

import (
	"encoding/binary"
	"errors"
	"slices"

	"fmt"
	"net"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Trace runs a packet the local endpoint req.From would send through this host's live
// datapath without sending it and without changing any state: the programs are loaded a
// second time with the live state maps (endpoints, networks, peers, policies, services,
// routes, config) and scratch copies of everything a packet writes (conntrack with the
// flow's current entries copied in, fragment records, counters, events), and run once
// with BPF_PROG_TEST_RUN. The result says which stages decided what.
func (d *Driver) Trace(req dataplane.TraceRequest) (dataplane.TraceResult, error) {
	defer d.lock(0, cEps|cPols)()
	d.traceMu.Lock()
	defer d.traceMu.Unlock()
	if err := d.check(); err != nil {
		return dataplane.TraceResult{}, err
	}
	var res dataplane.TraceResult
	err := nsexec.Run(d.cfg.NetNS, func() error {
		var err error
		res, err = d.trace(req)
		return err
	})
	return res, err
}

// traceScratch are the maps a packet writes: a trace gets private copies (emptied before
// each run: traceReset), so nothing it does reaches the live state (TestTrace,
// TestHostPathAndEgress/trace-changes-nothing).
var traceScratch = map[string]bool{contivbpfMapCbCt: true, contivbpfMapCbFrags: true, contivbpfMapCbNatFrags: true,
	contivbpfMapCbReasons: true, contivbpfMapCbEpCounters: true, contivbpfMapCbVerdicts: true, contivbpfMapCbEvents: true,
	contivbpfMapCbIfaces: true, contivbpfMapCbIfaceDirect: true,
	// Egress NAT (a traced flow would take a NAT port), node port flows peers balanced
	// here, fragment and ICMP budgets, conntrack quota counts and the service memo clock.
	contivbpfMapCbSnat: true, contivbpfMapCbSnatRev: true, contivbpfMapCbPeerFlows: true,
	contivbpfMapCbFragBudgets: true, contivbpfMapCbFragSrcBudgets: true, contivbpfMapCbIcmpBudget: true,
	contivbpfMapCbCtOwned: true, contivbpfMapCbCtOwnedIn: true, contivbpfMapCbCtGens: true,
	contivbpfMapCbCalls: true, // its own stages, which run on the trace's maps
	// and its own per-CPU scratch (a softirq during a trace must not spoil the trace's
	// state, nor the trace the live packet's)
	contivbpfMapCbIfaceScratch: true, contivbpfMapCbHandoffScratch: true, contivbpfMapCbPolScratch: true,
	contivbpfMapCbTcpScratch: true}

// traceSmall are scratch maps a trace needs only a few entries of.
var traceSmall = map[string]uint32{contivbpfMapCbCt: 4096, contivbpfMapCbSnat: 4096, contivbpfMapCbSnatRev: 4096,
	contivbpfMapCbPeerFlows: 4096, contivbpfMapCbIfaces: 64, contivbpfMapCbIfaceDirect: 64, contivbpfMapCbEpCounters: 64,
	contivbpfMapCbCtOwned: 64, contivbpfMapCbCtOwnedIn: 64}

// liveMaps names the driver's maps by their ELF names.
func (d *Driver) liveMaps() map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(&d.objs.contivbpfMaps).Elem()
	for i := 0; i < v.NumField(); i++ {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
			out[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return out
}

func (d *Driver) trace(req dataplane.TraceRequest) (dataplane.TraceResult, error) {
	res := dataplane.TraceResult{Host: d.cfg.Host}
	src, ok := d.eps.endpoints[indexKey(req.From)]
	if !ok {
		return res, fmt.Errorf("trace: %q is not a local endpoint of this host", req.From)
	}
	var srcNet netRec
	for _, n := range d.eps.networks {
		if n.key == src.key.Net {
			srcNet = n
		}
	}
	if err := req.Validate(); err != nil {
		return res, err
	}
	ifc, err := d.readIface(uint32(src.ifindex))
	if err != nil {
		return res, fmt.Errorf("trace: interface of %s: %w", req.From, err)
	}
	srcIP := addrFrom(src.key.Ip)
	var srcMAC net.HardwareAddr = ifc.Mac[:]
	dstMAC := dataplane.RouterMAC
	if srcNet.net.Subnet.Contains(req.Dst) && req.Dst != srcNet.net.Gateway {
		dstMAC = dataplane.ContivMAC(req.Dst)
	}
	sport := req.SrcPort
	if sport == 0 {
		sport = 40000 + uint16(time.Now().UnixNano()%20000)
	}
	res.Packet = fmt.Sprintf("%s %v:%d > %v:%d (from %s, %s)", protoName(req.Proto), srcIP, sport, req.Dst, req.DstPort, req.From, src.hostIf)
	if req.Proto == 1 {
		res.Packet = fmt.Sprintf("icmp echo %v > %v (from %s, %s)", srcIP, req.Dst, req.From, src.hostIf)
	}
	pkt := dataplane.TraceFrame(srcMAC, dstMAC, srcIP, req.Dst, req.Proto, sport, req.DstPort)

	run, err := d.traceRun(contivbpfProgCbFromContainer, pkt, nil, &ifc, []uint32{src.key.Ip, ip4(req.Dst)})
	if err != nil {
		return res, err
	}
	d.traceVerdict(&res, run)
	res.Stages = append(res.Stages, dataplane.TraceStage{Name: "source", Detail: fmt.Sprintf("%s on %s, network %s, group %d", req.From, src.hostIf, srcNet.net.ID, ifc.Epg)})
	d.traceConntrack(&res, run.ct, run.before)
	d.traceOutput(&res, run.ret, run.out)
	sort.SliceStable(res.Stages, func(i, j int) bool { return stageOrder(res.Stages[i].Name) < stageOrder(res.Stages[j].Name) })
	return res, nil
}

// traceCollection returns the trace programs, loaded on first use and kept (a load costs
// a verifier run, ~200 ms) with their scratch maps emptied for the next run.
func (d *Driver) traceCollection() (*ebpf.Collection, error) {
	if d.traceColl == nil {
		spec, err := loadContivbpf()
		if err != nil {
			return nil, fmt.Errorf("trace: load spec: %w", err)
		}
		// Only the container program and the overlay receive path with the tunnel key
		// taken from the context are run: loading (and verifying) the others costs time.
		keep := append([]string{contivbpfProgCbFromContainer, contivbpfProgCbTestOverlay}, stagePrograms()...)
		for name := range spec.Programs {
			if !slices.Contains(keep, name) {
				delete(spec.Programs, name)
			}
		}
		live := d.liveMaps()
		repl := map[string]*ebpf.Map{}
		for name, ms := range spec.Maps {
			ms.Pinning = ebpf.PinNone
			m, ok := live[name]
			if !ok || traceScratch[name] {
				if n, small := traceSmall[name]; small && ms.MaxEntries > n {
					ms.MaxEntries = n
				}
				continue
			}
			if info, err := m.Info(); err == nil {
				ms.MaxEntries = info.MaxEntries
				ms.Flags = info.Flags
			}
			repl[name] = m
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
		if err != nil {
			return nil, fmt.Errorf("trace: load programs: %w", err)
		}
		d.traceColl = coll
		return coll, nil
	}
	if err := traceReset(d.traceColl); err != nil {
		return nil, err
	}
	return d.traceColl, nil
}

// traceReset empties the scratch maps a previous run wrote: hash maps lose their entries,
// arrays are zeroed (the trace's interface entries are written again by each run).
func traceReset(coll *ebpf.Collection) error {
	for name := range traceScratch {
		m := coll.Maps[name]
		if m == nil || name == contivbpfMapCbCalls || name == contivbpfMapCbIfaceDirect {
			continue
		}
		switch m.Type() {
		case ebpf.Hash, ebpf.LRUHash, ebpf.LRUCPUHash, ebpf.PerCPUHash:
			if err := emptyMap(m); err != nil {
				return fmt.Errorf("trace: reset %s: %w", name, err)
			}
		case ebpf.Array, ebpf.PerCPUArray:
			var zero any = make([]byte, m.ValueSize())
			if m.Type() == ebpf.PerCPUArray {
				vs := make([][]byte, ebpf.MustPossibleCPU())
				for i := range vs {
					vs[i] = make([]byte, m.ValueSize())
				}
				zero = vs
			}
			for k := uint32(0); k < m.MaxEntries(); k++ {
				if err := m.Put(k, zero); err != nil {
					return fmt.Errorf("trace: reset %s: %w", name, err)
				}
			}
		}
	}
	return nil
}

// traceRunResult is what one run left: the tc verdict, the packet, the scratch conntrack
// (and the entries copied in before), the reasons counted and a drop event, if any.
type traceRunResult struct {
	ret    uint32
	out    []byte
	ct     *ebpf.Map
	before map[contivbpfCbCtKey]contivbpfCbCtEntry
	reason string
	event  DropEvent
}

// traceRun runs prog of the trace collection once on pkt (with ctx, an skb context, if
// not nil). ifc, if not nil, is the interface the packet arrives on; conntrack entries
// involving any of addrs are copied in from the live table first.
func (d *Driver) traceRun(prog string, pkt []byte, ctx any, ifc *contivbpfCbIface, addrs []uint32) (traceRunResult, error) {
	var r traceRunResult
	coll, err := d.traceCollection()
	if err != nil {
		return r, err
	}
	// Program globals: the live features (events on, to learn the deciding rule), epoch and
	// service hash seed.
	var cfg contivbpfCbConfig
	if err := d.objs.CbCfg.Lookup(uint32(0), &cfg); err != nil {
		return r, fmt.Errorf("trace: read config: %w", err)
	}
	d.cfgMu.Lock()
	carried, epoch := d.carried, d.pubEpoch
	d.cfgMu.Unlock()
	if v := coll.Variables["cb_features"]; v != nil {
		if err := v.Set((cfg.Features | carried) | uint32(contivbpfCbFeaturesCB_FEAT_EVENTS|contivbpfCbFeaturesCB_FEAT_ALLOW_EVENTS)); err != nil {
			return r, fmt.Errorf("trace: set features: %w", err)
		}
	}
	if v := coll.Variables["cb_policy_epoch"]; v != nil {
		if err := v.Set(epoch); err != nil {
			return r, fmt.Errorf("trace: set epoch: %w", err)
		}
	}
	// The service flow hash's seed: the backend the datapath would pick, not another.
	if v := coll.Variables["cb_lb_seed"]; v != nil {
		if err := v.Set(d.lbSeed); err != nil {
			return r, fmt.Errorf("trace: set the service hash seed: %w", err)
		}
	}
	// The conntrack clock the datapath reads (trace programs see its entries' deadlines).
	if err := d.clock.set(coll.Variables["cb_clock_base"], coll.Variables["cb_tick_ns"]); err != nil {
		return r, fmt.Errorf("trace: %w", err)
	}
	// The test run receives on the caller's loopback: the source interface is found there.
	if ifc != nil {
		scratch := ifaceTable{direct: coll.Maps[contivbpfMapCbIfaceDirect], hashed: coll.Maps[contivbpfMapCbIfaces]}
		if err := scratch.put(uint32(loopbackIfindex), ifc, d.mapPut); err != nil {
			return r, fmt.Errorf("trace: scratch interface: %w", err)
		}
	}
	// Conntrack: the flow's live entries, so an established flow traces as established.
	r.ct = coll.Maps[contivbpfMapCbCt]
	r.before = map[contivbpfCbCtKey]contivbpfCbCtEntry{}
	want := map[uint32]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	var ck contivbpfCbCtKey
	var cv contivbpfCbCtEntry
	it := d.objs.CbCt.Iterate()
	for it.Next(&ck, &cv) && len(r.before) < 4000 {
		if want[ck.Saddr] || want[ck.Daddr] {
			if err := r.ct.Put(&ck, &cv); err != nil {
				return r, fmt.Errorf("trace: copy conntrack: %w", err)
			}
			r.before[ck] = cv
		}
	}
	rd, err := ringbuf.NewReader(coll.Maps[contivbpfMapCbEvents])
	if err != nil {
		return r, fmt.Errorf("trace: events: %w", err)
	}
	defer rd.Close()
	for { // events a previous run left unread
		if _, ok := readTraceEvent(rd); !ok {
			break
		}
	}
	r.out = make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: r.out, Repeat: 1}
	if ctx != nil {
		opts.Context = ctx
	}
	if r.ret, err = coll.Programs[prog].Run(opts); err != nil {
		return r, fmt.Errorf("trace: run: %w", err)
	}
	r.out = opts.DataOut
	reasons, err := readReasons(coll.Maps[contivbpfMapCbReasons])
	if err != nil {
		return r, err
	}
	for reason := range reasons {
		r.reason = reason.String()
	}
	r.event, _ = readTraceEvent(rd)
	return r, nil
}

// traceVerdict records the reason and, for a policy drop, the deciding rule.
func (d *Driver) traceVerdict(res *dataplane.TraceResult, run traceRunResult) {
	res.Reason = run.reason
	if ev := run.event; ev.RuleEPG != 0 {
		rule := d.ruleIDLocked(ev.RuleEPG, ev.RuleDir, ev.RuleIndex)
		what := "denied"
		if ev.Reason == PolicyAllow {
			what = "allowed"
		} else {
			res.Rule = rule
		}
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "policy", Detail: fmt.Sprintf("%s by rule %s (group %d %s, #%d)", what, rule, ev.RuleEPG, ev.RuleDir, ev.RuleIndex+1)})
	}
}

// TraceReceive runs a frame that arrived over VXLAN from t.Source with t.VNI (a
// TraceResult's Tunnel from the sending host) through this host's receive path, like Trace: live state
// maps, scratch copies of what a packet writes, nothing delivered or changed.
func (d *Driver) TraceReceive(t dataplane.TraceTunnel) (dataplane.TraceResult, error) {
	from := t.Source
	defer d.lock(0, cEps|cPols)()
	d.traceMu.Lock()
	defer d.traceMu.Unlock()
	res := dataplane.TraceResult{Host: d.cfg.Host}
	if err := d.check(); err != nil {
		return res, err
	}
	if !from.Is4() || len(t.Inner) < 34 || binary.BigEndian.Uint16(t.Inner[12:]) != 0x0800 {
		return res, fmt.Errorf("trace receive: need the sending VTEP (IPv4) and an IPv4 frame")
	}
	src, dst := netip.AddrFrom4([4]byte(t.Inner[26:30])), netip.AddrFrom4([4]byte(t.Inner[30:34]))
	res.Packet = fmt.Sprintf("VXLAN VNI %d from %v: %v > %v", t.VNI, from, src, dst)
	ctx := &traceSkbCtx{}
	ctx.CB[0], ctx.CB[1] = ip4(from), t.VNI
	err := nsexec.Run(d.cfg.NetNS, func() error {
		run, err := d.traceRun(contivbpfProgCbTestOverlay, append([]byte(nil), t.Inner...), ctx, nil, []uint32{ip4(src), ip4(dst)})
		if err != nil {
			return err
		}
		d.traceVerdict(&res, run)
		d.traceConntrack(&res, run.ct, run.before)
		d.traceOutput(&res, run.ret, run.out)
		return nil
	})
	sort.SliceStable(res.Stages, func(i, j int) bool { return stageOrder(res.Stages[i].Name) < stageOrder(res.Stages[j].Name) })
	return res, err
}

// traceSkbCtx is the __sk_buff prefix BPF_PROG_TEST_RUN takes as context (cb carries the
// tunnel source and VNI to cb_test_overlay).
type traceSkbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
}

// loopbackIfindex is where BPF_PROG_TEST_RUN delivers a packet: the caller's lo.
const loopbackIfindex = 1

func stageOrder(name string) int {
	for i, n := range []string{"source", "service", "policy", "conntrack", "forward", "verdict"} {
		if n == name {
			return i
		}
	}
	return 99
}

func readTraceEvent(rd *ringbuf.Reader) (DropEvent, bool) {
	rd.SetDeadline(time.Now().Add(time.Millisecond))
	rec, err := rd.Read()
	if err != nil {
		return DropEvent{}, false
	}
	ev, ok := decodeEvent(rec.RawSample)
	return ev, ok || len(rec.RawSample) > 0
}

// traceConntrack reports the entries the run created or changed.
func (d *Driver) traceConntrack(res *dataplane.TraceResult, ct *ebpf.Map, before map[contivbpfCbCtKey]contivbpfCbCtEntry) {
	var k contivbpfCbCtKey
	var v contivbpfCbCtEntry
	it := ct.Iterate()
	state := map[uint8]string{1: "new", 2: "established", 3: "closing"}
	for it.Next(&k, &v) {
		old, had := before[k]
		if had && ctStateOf(old) == ctStateOf(v) && old.Flags == v.Flags {
			continue
		}
		what := "would create"
		if had {
			what = "would update"
		}
		detail := fmt.Sprintf("%s %s %v:%d > %v:%d %s", what, protoName(k.Proto), addrFrom(k.Saddr), hport(k.Sport), addrFrom(k.Daddr), hport(k.Dport), state[ctStateOf(v)])
		if v.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) != 0 {
			res.Stages = append(res.Stages, dataplane.TraceStage{Name: "service", Detail: fmt.Sprintf("%v:%d is a service VIP: backend %v:%d chosen", addrFrom(k.Daddr), hport(k.Dport), addrFrom(v.NatIp), hport(v.NatPort))})
			continue
		}
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "conntrack", Detail: detail})
	}
	if len(before) > 0 {
		for k, v := range before {
			if v.Flags&uint8(contivbpfCbCtFlagsCB_CT_ALLOWED) != 0 && k.Proto != 0 {
				res.Stages = append(res.Stages, dataplane.TraceStage{Name: "conntrack", Detail: fmt.Sprintf("live entry %s %v:%d > %v:%d %s", protoName(k.Proto), addrFrom(k.Saddr), hport(k.Sport), addrFrom(k.Daddr), hport(k.Dport), state[ctStateOf(v)])})
				break
			}
		}
	}
}

// traceOutput decodes the verdict and the packet as the program left it.
func (d *Driver) traceOutput(res *dataplane.TraceResult, ret uint32, out []byte) {
	const (
		tcActOK       = 0
		tcActShot     = 2
		tcActRedirect = 7
	)
	switch ret {
	case tcActShot:
		res.Verdict = "dropped: " + res.Reason
	case tcActRedirect:
		res.Verdict = "forwarded"
	case tcActOK:
		res.Verdict = "passed to the host stack"
	default:
		res.Verdict = fmt.Sprintf("tc action %d", ret)
	}
	if ret != tcActRedirect || len(out) < 34 || binary.BigEndian.Uint16(out[12:]) != 0x0800 {
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "verdict", Detail: res.Verdict})
		return
	}
	ipDst := netip.AddrFrom4([4]byte(out[30:34]))
	if res.Reason == FwdTunnel.String() {
		// The program sets the tunnel key and redirects to the collect_md VXLAN device,
		// which encapsulates: the frame out is the inner one; the VTEP and VNI are those
		// of the remote endpoint it is addressed to.
		var vtep netip.Addr
		var vni uint32
		target := ""
		for _, r := range d.eps.remotes {
			if r.ep.IP == ipDst {
				vtep, target = r.ep.VTEP, r.ep.ID
				if n, ok := d.eps.networks[r.ep.NetworkID]; ok {
					vni = n.net.Tag
				}
			}
		}
		host := ""
		for h, v := range d.eps.peers {
			if v == vtep {
				host = " (" + h + ")"
			}
		}
		res.Tunnel = &dataplane.TraceTunnel{Source: d.cfg.VTEP, VTEP: vtep, VNI: vni, Inner: append([]byte(nil), out...)}
		res.Verdict = fmt.Sprintf("tunneled to VTEP %v%s, VNI %d, for %v %s", vtep, host, vni, ipDst, target)
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "forward", Detail: fmt.Sprintf("encapsulated in VXLAN to %v%s, VNI %d (remote endpoint %s)", vtep, host, vni, target)})
	} else {
		target := ""
		for _, r := range d.eps.endpoints {
			if addrFrom(r.key.Ip) == ipDst {
				target = " " + r.id + " (" + r.hostIf + ")"
			}
		}
		res.Verdict = fmt.Sprintf("delivered to %v%s", ipDst, target)
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "forward", Detail: "local: " + strings.TrimSpace(fmt.Sprintf("%v%s", ipDst, target))})
	}
	res.Stages = append(res.Stages, dataplane.TraceStage{Name: "verdict", Detail: res.Verdict + " (" + res.Reason + ")"})
}

// emptyMap deletes every entry of a hash map.
func emptyMap(m *ebpf.Map) error {
	var keys [][]byte
	k := make([]byte, m.KeySize())
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read map: %w", err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete entry: %w", err)
		}
	}
	return nil
}
