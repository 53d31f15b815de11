package ovs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	of "github.com/contiv/libOpenflow/openflow13"
)

// flow is one OpenFlow entry built alongside its ovs-ofctl-like text, which serves as
// the identity for diffing (match part) and for Status and docs.
type flow struct {
	table     tableID
	prio      uint16
	match     []of.MatchField
	matchText []string
	actions   []of.Action
	actText   []string
	gotoTable int    // -1: none
	meter     uint32 // 0: none; else the meter every packet of the flow passes first

	fields *nxFields // headers for load/move/ct zone and masked matches
	err    error     // first build error (a field the pipeline did not resolve)

	// Texts cached by key and actionsText: a flow is not changed once it is compiled.
	keyCache, actCache string

	// The policy rule a flow of the policy table implements and its group and direction
	// ("group 7 ingress"), for trace.
	rule, ruleOf string
}

func newFlow(fields *nxFields, t tableID, prio int) *flow {
	return &flow{table: t, prio: uint16(prio), gotoTable: -1, fields: fields}
}

// nxFields holds the NXM field headers the pipeline loads, moves and matches with a
// mask, resolved from libOpenflow once when the pipeline is built (newPipeline).
type nxFields struct {
	byName map[string]of.MatchField // masked variants under name+"/mask"
}

// pipelineFields are the NXM fields flows refer to by name.
func pipelineFields() (plain, masked []string) {
	for i := range 10 {
		plain = append(plain, fmt.Sprintf("NXM_NX_REG%d", i))
	}
	plain = append(plain, "NXM_OF_ETH_SRC", "NXM_OF_ETH_DST", "NXM_OF_ARP_OP",
		"NXM_NX_ARP_SHA", "NXM_NX_ARP_THA", "NXM_OF_ARP_SPA", "NXM_OF_ARP_TPA", "NXM_NX_CT_MARK",
		"NXM_OF_IP_SRC", "NXM_OF_IP_DST", "NXM_OF_ICMP_TYPE", "NXM_OF_ETH_TYPE", "NXM_OF_IP_PROTO", "NXM_NX_IP_TTL")
	return plain, []string{"NXM_NX_TCP_FLAGS", "NXM_NX_CT_MARK", "NXM_NX_IP_FRAG"}
}

// resolveFields looks the named fields up in libOpenflow.
func resolveFields(plain, masked []string) (*nxFields, error) {
	x := &nxFields{byName: map[string]of.MatchField{}}
	for _, name := range plain {
		h, err := of.FindFieldHeaderByName(name, false)
		if err != nil {
			return nil, fmt.Errorf("openflow field %s: %w", name, err)
		}
		x.byName[name] = *h
	}
	for _, name := range masked {
		h, err := of.FindFieldHeaderByName(name, true)
		if err != nil {
			return nil, fmt.Errorf("openflow field %s (masked): %w", name, err)
		}
		x.byName[name+"/mask"] = *h
	}
	return x, nil
}

// header returns a fresh copy of a resolved field header.
func (x *nxFields) header(name string) (*of.MatchField, error) {
	if x != nil {
		if h, ok := x.byName[name]; ok {
			return &h, nil
		}
	}
	return nil, fmt.Errorf("openflow field %s was not resolved by the pipeline", name)
}

// hdr returns the named header, or records the failure in f.err (the flow is then
// refused by compile) and returns nil.
func (f *flow) hdr(name string) *of.MatchField {
	h, err := f.fields.header(name)
	if err != nil && f.err == nil {
		f.err = fmt.Errorf("flow %s: %w", f.keyText(), err)
	}
	return h
}

// key identifies the flow in its table (what a strict delete matches on). Call it only
// once the flow is built: it is cached.
func (f *flow) key() string {
	if f.keyCache == "" {
		f.keyCache = f.keyText()
	}
	return f.keyCache
}

// keyText is the key: table, priority and the match's fields sorted, so two flows that
// match the same (fields added in another order, e.g. mirrored ingress and egress rules)
// have one key, as they are one flow on the switch.
func (f *flow) keyText() string {
	m := slices.Clone(f.matchText)
	slices.Sort(m)
	return fmt.Sprintf("table=%s,priority=%d,%s", f.table, f.prio, strings.Join(m, ","))
}

// actionsText is the flow's actions as ovs-ofctl prints them (cached, as key).
func (f *flow) actionsText() string {
	if f.actCache == "" {
		f.actCache = f.actionsTextNow()
	}
	return f.actCache
}

func (f *flow) actionsTextNow() string {
	var a []string
	if f.meter != 0 {
		a = append(a, fmt.Sprintf("meter:%d", f.meter))
	}
	a = append(a, f.actText...)
	if f.gotoTable >= 0 {
		a = append(a, "goto_table:"+tableID(f.gotoTable).String())
	}
	if len(a) == 0 {
		return "drop"
	}
	return strings.Join(a, ",")
}

// String is the flow as built (match fields in the order they were added).
func (f *flow) String() string {
	return fmt.Sprintf("table=%s,priority=%d,%s actions=%s", f.table, f.prio, strings.Join(f.matchText, ","), f.actionsText())
}

func (f *flow) m(field *of.MatchField, text string) *flow {
	f.match = append(f.match, *field)
	f.matchText = append(f.matchText, text)
	return f
}

func (f *flow) a(act of.Action, text string) *flow {
	f.actions = append(f.actions, act)
	f.actText = append(f.actText, text)
	return f
}

func ip4(a netip.Addr) net.IP { b := a.As4(); return net.IP(b[:]) }

func prefixMask(p netip.Prefix) *net.IP {
	m := net.IP(net.CIDRMask(p.Bits(), 32))
	return &m
}

// --- matches ---

func (f *flow) inPort(p uint32) *flow { return f.m(of.NewInPortField(p), fmt.Sprintf("in_port=%d", p)) }
func (f *flow) ethType(t uint16) *flow {
	return f.m(of.NewEthTypeField(t), fmt.Sprintf("dl_type=0x%04x", t))
}
func (f *flow) ethSrc(mac net.HardwareAddr) *flow {
	return f.m(of.NewEthSrcField(mac, nil), "dl_src="+mac.String())
}
func (f *flow) ethDst(mac net.HardwareAddr) *flow {
	return f.m(of.NewEthDstField(mac, nil), "dl_dst="+mac.String())
}
func (f *flow) reg(i int, v uint32) *flow {
	return f.m(of.NewRegMatchField(i, v, nil), fmt.Sprintf("reg%d=%d", i, v))
}
func (f *flow) regBits(i int, start, end int, v uint32) *flow {
	// NXRange.ToUint32Mask treats end 0 as 31: compute the mask here.
	field := of.NewRegMatchField(i, v<<start, of.NewNXRange(start, end))
	field.Mask = &of.Uint32Message{Data: (^uint32(0) >> (31 - (end - start))) << start}
	return f.m(field, fmt.Sprintf("reg%d[%d..%d]=%d", i, start, end, v))
}
func (f *flow) arpOp(op uint16) *flow {
	return f.ethType(0x0806).m(of.NewArpOperField(op), fmt.Sprintf("arp_op=%d", op))
}
func (f *flow) arpTPA(a netip.Addr) *flow {
	return f.m(of.NewArpTpaField(ip4(a)), "arp_tpa="+a.String())
}
func (f *flow) arpSPA(a netip.Addr) *flow {
	return f.m(of.NewArpSpaField(ip4(a)), "arp_spa="+a.String())
}
func (f *flow) arpSHA(mac net.HardwareAddr) *flow {
	return f.m(of.NewArpShaField(mac), "arp_sha="+mac.String())
}
func (f *flow) ip() *flow { return f.ethType(0x0800) }

// ipDst matches a destination prefix; a /0 matches anything and adds no field (OVS keeps
// none, so a flow with it and one without are the same switch flow: one key).
func (f *flow) ipDst(p netip.Prefix) *flow {
	if p.Bits() == 0 {
		return f
	}
	if p.Bits() == 32 {
		return f.m(of.NewIpv4DstField(ip4(p.Addr()), nil), "nw_dst="+p.Addr().String())
	}
	return f.m(of.NewIpv4DstField(ip4(p.Masked().Addr()), prefixMask(p)), "nw_dst="+p.Masked().String())
}

// ipSrc matches a source prefix (a /0 adds no field, as ipDst).
func (f *flow) ipSrc(p netip.Prefix) *flow {
	if p.Bits() == 0 {
		return f
	}
	if p.Bits() == 32 {
		return f.m(of.NewIpv4SrcField(ip4(p.Addr()), nil), "nw_src="+p.Addr().String())
	}
	return f.m(of.NewIpv4SrcField(ip4(p.Masked().Addr()), prefixMask(p)), "nw_src="+p.Masked().String())
}
func (f *flow) proto(p uint8) *flow { return f.m(of.NewIpProtoField(p), fmt.Sprintf("nw_proto=%d", p)) }
func (f *flow) tpDst(proto uint8, port uint16) *flow {
	if proto == 17 {
		return f.m(of.NewUdpDstField(port), fmt.Sprintf("tp_dst=%d", port))
	}
	return f.m(of.NewTcpDstField(port), fmt.Sprintf("tp_dst=%d", port))
}
func (f *flow) tpSrc(proto uint8, port uint16) *flow {
	if proto == 17 {
		return f.m(of.NewUdpSrcField(port), fmt.Sprintf("tp_src=%d", port))
	}
	return f.m(of.NewTcpSrcField(port), fmt.Sprintf("tp_src=%d", port))
}
func (f *flow) tcpFlags(v, mask uint16, text string) *flow {
	h := f.hdr("NXM_NX_TCP_FLAGS/mask")
	if h == nil {
		return f
	}
	h.Value = &of.Uint16Message{Data: v}
	h.Mask = &of.Uint16Message{Data: mask}
	return f.m(h, "tcp_flags="+text)
}

// ctState matches conntrack state flags: set and unset are NX_CT_STATE bit offsets.
func (f *flow) ctState(text string, set, unset []int) *flow {
	s := of.NewCTStates()
	for _, b := range set {
		ctSet(s, b, true)
	}
	for _, b := range unset {
		ctSet(s, b, false)
	}
	return f.m(of.NewCTStateMatchField(s), "ct_state="+text)
}

// IP fragment matches (nw_frag): bit 0 set for any fragment, bit 1 for a later one.
const (
	fragNone  = "no"
	fragAny   = "yes"
	fragFirst = "first"
	fragLater = "later"
)

// nwFrag matches fragments: fragAny (first or later), fragFirst or fragLater; or, with
// fragNone, a packet that is no fragment.
func (f *flow) nwFrag(which string) *flow {
	h := f.hdr("NXM_NX_IP_FRAG/mask")
	if h == nil {
		return f
	}
	v, mask := byte(1), byte(1)
	switch which {
	case fragNone:
		v = 0
	case fragFirst:
		v, mask = 1, 3
	case fragLater:
		v, mask = 3, 3
	}
	h.Value = &of.ByteArrayField{Data: []byte{v}, Length: 1}
	h.Mask = &of.ByteArrayField{Data: []byte{mask}, Length: 1}
	return f.m(h, "nw_frag="+which)
}

// icmpType matches the ICMP type (the flow must match ICMP).
func (f *flow) icmpType(typ uint8) *flow { return f.byteField("NXM_OF_ICMP_TYPE", "icmp_type", typ) }

// ipTTL matches the IPv4 TTL (the flow must match IP).
func (f *flow) ipTTL(ttl uint8) *flow { return f.byteField("NXM_NX_IP_TTL", "nw_ttl", ttl) }

// byteField matches the one-byte field name (shown as text) exactly.
func (f *flow) byteField(name, text string, v uint8) *flow {
	h := f.hdr(name)
	if h == nil {
		return f
	}
	h.Value = &of.ByteArrayField{Data: []byte{v}, Length: 1}
	return f.m(h, fmt.Sprintf("%s=%d", text, v))
}

// ctMark matches the conntrack mark's bits in mask.
func (f *flow) ctMark(v, mask uint32) *flow {
	h := f.hdr("NXM_NX_CT_MARK/mask")
	if h == nil {
		return f
	}
	h.Value = &of.Uint32Message{Data: v}
	h.Mask = &of.Uint32Message{Data: mask}
	return f.m(h, fmt.Sprintf("ct_mark=%#x/%#x", v, mask))
}

func ctSet(s *of.CTStates, bit int, on bool) {
	switch bit {
	case of.NX_CT_STATE_NEW_OFS:
		if on {
			s.SetNew()
		} else {
			s.UnsetNew()
		}
	case of.NX_CT_STATE_EST_OFS:
		if on {
			s.SetEst()
		} else {
			s.UnsetEst()
		}
	case of.NX_CT_STATE_REL_OFS:
		if on {
			s.SetRel()
		} else {
			s.UnsetRel()
		}
	case of.NX_CT_STATE_INV_OFS:
		if on {
			s.SetInv()
		} else {
			s.UnsetInv()
		}
	case of.NX_CT_STATE_TRK_OFS:
		if on {
			s.SetTrk()
		} else {
			s.UnsetTrk()
		}
	case of.NX_CT_STATE_SNAT_OFS:
		if on {
			s.SetSNAT()
		} else {
			s.UnsetSNAT()
		}
	case of.NX_CT_STATE_DNAT_OFS:
		if on {
			s.SetDNAT()
		} else {
			s.UnsetDNAT()
		}
	}
}

func (f *flow) tunID(vni uint32) *flow {
	return f.m(of.NewTunnelIdField(uint64(vni)), fmt.Sprintf("tun_id=%d", vni))
}
func (f *flow) tunSrc(a netip.Addr) *flow {
	return f.m(of.NewTunnelIpv4SrcField(ip4(a), nil), "tun_src="+a.String())
}
func (f *flow) vlanVID(vid uint16) *flow {
	return f.m(of.NewVlanIdField(vid, nil), fmt.Sprintf("dl_vlan=%d", vid))
}

// noVLAN matches frames without an 802.1Q/802.1ad tag (OXM vlan_vid = OFPVID_NONE).
func (f *flow) noVLAN() *flow {
	field := of.NewVlanIdField(0, nil)
	field.Value = &of.VlanIdField{VlanId: of.OFPVID_NONE}
	return f.m(field, "vlan_tci=0x0000/0x1fff")
}

// anyVLAN matches frames with a tag, whatever its id (priority-tagged VID 0 included).
func (f *flow) anyVLAN() *flow {
	mask := uint16(of.OFPVID_PRESENT)
	return f.m(of.NewVlanIdField(0, &mask), "vlan_tci=0x1000/0x1000")
}

// --- actions ---

func (f *flow) load(i int, v uint32) *flow {
	h := f.hdr(fmt.Sprintf("NXM_NX_REG%d", i))
	if h == nil {
		return f
	}
	return f.a(of.NewNXActionRegLoad(of.NewNXRange(0, 31).ToOfsBits(), h, uint64(v)),
		fmt.Sprintf("load:%d->reg%d", v, i))
}
func (f *flow) loadBits(i int, start, end int, v uint32) *flow {
	h := f.hdr(fmt.Sprintf("NXM_NX_REG%d", i))
	if h == nil {
		return f
	}
	return f.a(of.NewNXActionRegLoad(of.NewNXRange(start, end).ToOfsBits(), h, uint64(v)),
		fmt.Sprintf("load:%d->reg%d[%d..%d]", v, i, start, end))
}
func (f *flow) loadField(name string, bits int, v uint64, text string) *flow {
	h := f.hdr(name)
	if h == nil {
		return f
	}
	return f.a(of.NewNXActionRegLoad(of.NewNXRange(0, bits-1).ToOfsBits(), h, v), text)
}
func (f *flow) move(src, dst string, bits int) *flow {
	hs, hd := f.hdr(src), f.hdr(dst)
	if hs == nil || hd == nil {
		return f
	}
	return f.a(of.NewNXActionRegMove(uint16(bits), 0, 0, hs, hd),
		fmt.Sprintf("move:%s[]->%s[]", src, dst))
}
func (f *flow) setEthSrc(mac net.HardwareAddr) *flow {
	return f.a(of.NewActionSetField(*of.NewEthSrcField(mac, nil)), "mod_dl_src:"+mac.String())
}
func (f *flow) setEthDst(mac net.HardwareAddr) *flow {
	return f.a(of.NewActionSetField(*of.NewEthDstField(mac, nil)), "mod_dl_dst:"+mac.String())
}

// setDst rewrites the IPv4 destination and the TCP or UDP destination port (the flow must
// match proto; OVS leaves the port of a later fragment, which has none, alone).
func (f *flow) setDst(proto uint8, a netip.Addr, port uint16) *flow {
	f.a(of.NewActionSetField(*of.NewIpv4DstField(ip4(a), nil)), "set_field:"+a.String()+"->ip_dst")
	if proto == 17 {
		return f.a(of.NewActionSetField(*of.NewUdpDstField(port)), fmt.Sprintf("set_field:%d->udp_dst", port))
	}
	return f.a(of.NewActionSetField(*of.NewTcpDstField(port)), fmt.Sprintf("set_field:%d->tcp_dst", port))
}

// learnFragChoice has vswitchd learn, for timeout seconds, a flow in service_frag that
// gives what comes later from this packet's source to its destination (UDP, same VRF)
// this packet's service choice (reg7): the later fragments of its datagram, which carry no
// ports. The learned flows carry cookieLearn.
func (f *flow) learnFragChoice(timeout uint16) *flow {
	vrf, src, dst := f.hdr(fmt.Sprintf("NXM_NX_REG%d", regVRF)), f.hdr("NXM_OF_IP_SRC"), f.hdr("NXM_OF_IP_DST")
	sel, ethType, proto := f.hdr(fmt.Sprintf("NXM_NX_REG%d", regSvcSel)), f.hdr("NXM_OF_ETH_TYPE"), f.hdr("NXM_OF_IP_PROTO")
	if vrf == nil || src == nil || dst == nil || sel == nil || ethType == nil || proto == nil {
		return f
	}
	value := func(h *of.MatchField, bits uint16, v ...byte) *of.NXLearnSpec {
		return &of.NXLearnSpec{Header: of.NewLearnHeaderMatchFromValue(bits), SrcValue: v, DstField: &of.NXLearnSpecField{Field: h}}
	}
	same := func(h *of.MatchField, bits uint16) *of.NXLearnSpec {
		return &of.NXLearnSpec{Header: of.NewLearnHeaderMatchFromField(bits), SrcField: &of.NXLearnSpecField{Field: h},
			DstField: &of.NXLearnSpecField{Field: h}}
	}
	a := of.NewNXActionLearn()
	a.TableID, a.Priority, a.HardTimeout, a.Cookie = uint8(tServiceFrag), 100, timeout, cookieLearn
	a.LearnSpecs = []*of.NXLearnSpec{
		value(ethType, 16, 0x08, 0x00), value(proto, 8, 0, 17), same(vrf, 32), same(src, 32), same(dst, 32),
		{Header: of.NewLearnHeaderLoadFromField(32), SrcField: &of.NXLearnSpecField{Field: sel}, DstField: &of.NXLearnSpecField{Field: sel}},
	}
	return f.a(a, fmt.Sprintf("learn(table=%s,hard_timeout=%d,priority=100,cookie=%#x,dl_type=0x0800,nw_proto=17,"+
		"NXM_NX_REG%d[],NXM_OF_IP_SRC[],NXM_OF_IP_DST[],load:NXM_NX_REG%d[]->NXM_NX_REG%d[])", tServiceFrag, timeout, cookieLearn,
		regVRF, regSvcSel, regSvcSel))
}

func (f *flow) output(p uint32) *flow {
	if p == of.P_IN_PORT {
		return f.a(of.NewActionOutput(p), "IN_PORT")
	}
	return f.a(of.NewActionOutput(p), fmt.Sprintf("output:%d", p))
}

// multipath stores a choice among nLinks by the hash of fields in reg i [start..end].
func (f *flow) multipath(nLinks int, i, start, end int, fields mpHash) *flow {
	h := f.hdr(fmt.Sprintf("NXM_NX_REG%d", i))
	if h == nil {
		return f
	}
	mp, err := newMultipath(nLinks, h, start, end, fields)
	if err != nil {
		if f.err == nil {
			f.err = fmt.Errorf("flow %s: %w", f.keyText(), err)
		}
		return f
	}
	return f.a(mp, fmt.Sprintf("multipath(%s,0,hrw,%d,0,reg%d[%d..%d])", fields, nLinks, i, start, end))
}
func (f *flow) resubmit(t tableID) *flow {
	return f.a(of.NewNXActionResubmitTableAction(of.OFPP_IN_PORT, uint8(t)), "resubmit(,"+t.String()+")")
}
func (f *flow) decTTL() *flow { return f.a(of.NewActionDecNwTtl(), "dec_ttl") }
func (f *flow) pushVLAN(vid uint16) *flow {
	f.a(of.NewActionPushVlan(0x8100), "push_vlan:0x8100")
	return f.a(of.NewActionSetField(*of.NewVlanIdField(vid, nil)), fmt.Sprintf("set_field:%d->vlan_vid", vid))
}
func (f *flow) popVLAN() *flow { return f.a(of.NewActionPopVlan(), "pop_vlan") }
func (f *flow) setTunnel(vni uint32, dst netip.Addr) *flow {
	f.a(of.NewActionSetField(*of.NewTunnelIdField(uint64(vni))), fmt.Sprintf("set_field:%d->tun_id", vni))
	return f.a(of.NewActionSetField(*of.NewTunnelIpv4DstField(ip4(dst), nil)), "set_field:"+dst.String()+"->tun_dst")
}

func (f *flow) goTo(t tableID) *flow { f.gotoTable = int(t); return f }

// metered has every packet of the flow pass meter id first (beyond its rate: dropped).
func (f *flow) metered(id uint32) *flow { f.meter = id; return f }

// meterInstr is OpenFlow 1.3's meter instruction (libOpenflow's InstrMeter encodes its
// header alone).
type meterInstr struct{ id uint32 }

func (m *meterInstr) Len() uint16 { return 8 }

func (m *meterInstr) MarshalBinary() ([]byte, error) {
	b := make([]byte, 8)
	binary.BigEndian.PutUint16(b[0:], of.InstrType_METER)
	binary.BigEndian.PutUint16(b[2:], 8)
	binary.BigEndian.PutUint32(b[4:], m.id)
	return b, nil
}

func (m *meterInstr) UnmarshalBinary(b []byte) error {
	if len(b) < 8 {
		return errors.New("meter instruction: short")
	}
	m.id = binary.BigEndian.Uint32(b[4:])
	return nil
}

func (m *meterInstr) AddAction(of.Action, bool) error {
	return errors.New("a meter instruction takes no actions")
}

// flowMod encodes the flow as an OFPFC_ADD (or a strict delete) with cookie.
func (f *flow) flowMod(command uint8, cookie uint64) *of.FlowMod {
	fm := of.NewFlowMod()
	fm.TableId = uint8(f.table)
	fm.Priority = f.prio
	fm.Command = command
	fm.Cookie = cookie
	for i := range f.match {
		fm.Match.AddField(f.match[i])
	}
	if command == of.FC_DELETE_STRICT {
		return fm
	}
	if f.meter != 0 {
		fm.AddInstruction(&meterInstr{id: f.meter})
	}
	if len(f.actions) > 0 {
		in := of.NewInstrApplyActions()
		for _, act := range f.actions {
			_ = in.AddAction(act, false)
		}
		fm.AddInstruction(in)
	}
	if f.gotoTable >= 0 {
		fm.AddInstruction(of.NewInstrGotoTable(uint8(f.gotoTable)))
	}
	return fm
}
