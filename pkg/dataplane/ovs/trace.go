package ovs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Trace runs the packet local endpoint req.From would send through the switch's flow
// tables with `ofproto/trace` (on vswitchd's control socket): nothing is sent and nothing
// is committed to conntrack; the packet is judged as a new connection (ct_state new, as
// ofproto/trace resumes after ct()). The destination MAC is what this pipeline's ARP
// responder would answer. Each table the packet passes becomes a stage; a policy flow is
// named by the rule it implements (as netmaster names it).
func (d *Driver) Trace(req dataplane.TraceRequest) (dataplane.TraceResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	res := dataplane.TraceResult{Host: d.host.Host}
	ep, ok := d.state.Endpoints[req.From]
	port := d.ports.endpoints[req.From]
	if !ok || port == 0 {
		return res, fmt.Errorf("trace: %q is not a local endpoint of this host", req.From)
	}
	if err := req.Validate(); err != nil {
		return res, err
	}
	n := d.state.Networks[ep.NetworkID]
	sport := req.SrcPort
	if sport == 0 {
		sport = 40000 + uint16(time.Now().UnixNano()%20000)
	}
	res.Packet = fmt.Sprintf("%s %v:%d > %v:%d (from %s, %s)", protoName(req.Proto), ep.IP, sport, req.Dst, req.DstPort, req.From, ep.HostIfName)
	if req.Proto == 1 {
		res.Packet = fmt.Sprintf("icmp echo %v > %v (from %s, %s)", ep.IP, req.Dst, req.From, ep.HostIfName)
	}
	res.Stages = append(res.Stages, dataplane.TraceStage{Name: "source", Detail: fmt.Sprintf("%s on %s (port %d), network %s, group %d", req.From, ep.HostIfName, port, n.ID, ep.EPGID)})
	dstMAC, ok := d.arpAnswer(n, req.Dst)
	if !ok {
		res.Reason = "drop_unknown_dst"
		res.Verdict = fmt.Sprintf("dropped: nothing in network %s answers ARP for %v", n.ID, req.Dst)
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "verdict", Detail: res.Verdict})
		return res, nil
	}
	flow := fmt.Sprintf("in_port=%d,%s,dl_src=%s,dl_dst=%s,nw_src=%s,nw_dst=%s,nw_ttl=64", port, protoName(req.Proto), ep.MAC, dstMAC, ep.IP, req.Dst)
	switch req.Proto {
	case 6:
		flow += fmt.Sprintf(",tp_src=%d,tp_dst=%d,tcp_flags=syn", sport, req.DstPort)
	case 17:
		flow += fmt.Sprintf(",tp_src=%d,tp_dst=%d", sport, req.DstPort)
	default:
		flow += ",icmp_type=8,icmp_code=0"
	}
	return d.runTrace(ctx, res, flow)
}

// TraceReceive runs a packet another host's trace would tunnel here (TraceTunnel: the
// inner frame, VNI and VTEPs) through this switch from its VXLAN port.
func (d *Driver) TraceReceive(t dataplane.TraceTunnel) (dataplane.TraceResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	res := dataplane.TraceResult{Host: d.host.Host}
	srcMAC, dstMAC, src, dst, proto, ttl, sport, dport, ok := dataplane.TraceFrameFields(t.Inner)
	if !ok || !t.Source.Is4() {
		return res, fmt.Errorf("trace receive: need the sending VTEP (IPv4) and an IPv4 frame")
	}
	if d.ports.tunnel == 0 || !d.host.VTEP.Is4() {
		return res, fmt.Errorf("trace receive: host %s has no VXLAN tunnel port", d.host.Host)
	}
	res.Packet = fmt.Sprintf("VXLAN VNI %d from %v: %v > %v", t.VNI, t.Source, src, dst)
	flow := fmt.Sprintf("in_port=%d,tun_id=%#x,tun_src=%s,tun_dst=%s,%s,dl_src=%s,dl_dst=%s,nw_src=%s,nw_dst=%s,nw_ttl=%d",
		d.ports.tunnel, t.VNI, t.Source, d.host.VTEP, protoName(proto), srcMAC, dstMAC, src, dst, ttl)
	switch proto {
	case 6:
		flow += fmt.Sprintf(",tp_src=%d,tp_dst=%d,tcp_flags=syn", sport, dport)
	case 17:
		flow += fmt.Sprintf(",tp_src=%d,tp_dst=%d", sport, dport)
	case 1:
		flow += ",icmp_type=8,icmp_code=0"
	default:
		return res, fmt.Errorf("trace receive: protocol %d: want tcp, udp or icmp", proto)
	}
	return d.runTrace(ctx, res, flow)
}

// arpAnswer is the MAC a container of network n learns for dst: the ARP responder's
// answer for an address of the subnet (none: the packet is never sent), the router's
// MAC for anything beyond it (the default route via the gateway).
func (d *Driver) arpAnswer(n dataplane.Network, dst netip.Addr) (net.HardwareAddr, bool) {
	if !n.Subnet.Contains(dst) || dst == n.Gateway {
		return dataplane.RouterMAC, true
	}
	mac := func(m net.HardwareAddr) net.HardwareAddr {
		if d.host.FwdMode == dataplane.FwdRouting {
			return dataplane.RouterMAC
		}
		return m
	}
	for _, e := range d.state.Endpoints {
		if e.NetworkID == n.ID && e.IP == dst {
			return mac(e.MAC), true
		}
	}
	for _, e := range d.state.RemoteEndpoints {
		if e.NetworkID == n.ID && e.IP == dst {
			return mac(e.MAC), true
		}
	}
	tenant := tenantOf(n.ID)
	for id, s := range d.state.Services {
		if t, err := dataplane.ServiceTenant(id); err == nil && t == tenant && s.VIP == dst {
			return dataplane.ContivMAC(dst), true
		}
	}
	return nil, false
}

// traceStep is one table a traced packet matched: the flow (as OVS prints it) and the
// actions it ran.
type traceStep struct {
	table   tableID
	match   string // without priority
	prio    int
	actions []string
}

var (
	traceTableLine = regexp.MustCompile(`^\s*(\d+)\. (?:(.*), )?priority (\d+)(?:, cookie 0x[0-9a-f]+)?$`)
	traceDatapath  = regexp.MustCompile(`^Datapath actions: (.*)$`)
	traceFinal     = regexp.MustCompile(`^Final flow: (.*)$`)
	traceBridge    = regexp.MustCompile(`^\s*bridge\("([^"]+)"\)`)
	traceNoMatch   = regexp.MustCompile(`^\s*(\d+)\. No match`)
)

// parseTrace reads ofproto/trace output: the tables of bridge matched (over every
// recirculation; a tunneled packet's trip through the underlay bridge is left out), the
// last datapath actions and the packet's fields at the end ("Final flow").
func parseTrace(out, bridge string) (steps []traceStep, datapath string, final map[string]string) {
	in := true
	for _, line := range strings.Split(out, "\n") {
		if m := traceBridge.FindStringSubmatch(line); m != nil {
			in = m[1] == bridge
			continue
		}
		isTable := traceTableLine.MatchString(line) || traceNoMatch.MatchString(line)
		if !in && (strings.HasPrefix(line, " ") || isTable) {
			continue // another bridge's tables (table numbers from 10 up start at column 0)
		}
		if m := traceTableLine.FindStringSubmatch(line); m != nil {
			t, _ := strconv.Atoi(m[1])
			p, _ := strconv.Atoi(m[3])
			steps = append(steps, traceStep{table: tableID(t), match: m[2], prio: p})
			continue
		}
		if m := traceNoMatch.FindStringSubmatch(line); m != nil { // a table miss: dropped there
			t, _ := strconv.Atoi(m[1])
			steps = append(steps, traceStep{table: tableID(t), prio: -1})
			continue
		}
		if m := traceDatapath.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			datapath = m[1]
			continue
		}
		if m := traceFinal.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			final = matchFields(m[1])
			continue
		}
		trimmed := strings.TrimSpace(line)
		if len(steps) > 0 && strings.HasPrefix(line, "    ") && trimmed != "" && !strings.HasPrefix(trimmed, "->") &&
			!strings.HasPrefix(trimmed, "thaw") && !strings.HasPrefix(trimmed, "Resuming") {
			st := &steps[len(steps)-1]
			st.actions = append(st.actions, trimmed)
		}
	}
	return steps, datapath, final
}

// runTrace runs flow through ofproto/trace and turns the tables it passed into stages
// and a verdict. Call with d.mu held.
func (d *Driver) runTrace(ctx context.Context, res dataplane.TraceResult, flow string) (dataplane.TraceResult, error) {
	out, err := d.appctl(ctx, "ofproto/trace", d.opts.Bridge, flow)
	if err != nil {
		return res, fmt.Errorf("trace: %w", err)
	}
	steps, datapath, final := parseTrace(out, d.opts.Bridge)
	if len(steps) == 0 {
		return res, fmt.Errorf("trace: ofproto/trace matched no table:\n%s", out)
	}
	vip := ""
	for i, st := range steps {
		switch {
		case st.table == tServiceLB && st.prio > 0:
			m := matchFields(st.match)
			vip = m["nw_dst"] + ":" + m["tp_dst"]
			if st.prio == 100 && !anyAction(st.actions, "multipath") {
				res.Stages = append(res.Stages, dataplane.TraceStage{Name: "service", Detail: vip + " is a service VIP without a backend"})
			}
		case st.table == tServiceDNAT && st.prio > 0:
			if be, ok := traceBackend(st.match); ok {
				res.Stages = append(res.Stages, dataplane.TraceStage{Name: "service", Detail: vip + " is a service VIP: backend " + be + " chosen"})
			}
		case st.table == tPolicy:
			res.Stages = append(res.Stages, d.tracePolicy(ctx, st, &res))
		case (st.table == tNetpolEgress || st.table == tNetpolIngress) && st.prio > 0:
			what := "allowed by a NetworkPolicy rule"
			if st.prio == 10 {
				what = "denied: the pod is isolated and no NetworkPolicy rule allows it"
				res.Reason = "drop_netpol"
			}
			res.Stages = append(res.Stages, dataplane.TraceStage{Name: "policy", Detail: fmt.Sprintf("%s (%s)", what, st.table)})
		case st.table == tCommit && anyAction(st.actions, "ct(commit"):
			res.Stages = append(res.Stages, dataplane.TraceStage{Name: "conntrack", Detail: "a new connection: committed in the tenant's zone of its opener's side (its own for this host's endpoints, its inbound zone for other hosts)"})
		}
		if i == len(steps)-1 {
			d.traceEnd(&res, st, final)
		}
	}
	if datapath != "" {
		res.Stages = append(res.Stages, dataplane.TraceStage{Name: "datapath", Detail: "actions " + datapath})
	}
	res.Stages = append(res.Stages, dataplane.TraceStage{Name: "verdict", Detail: res.Verdict})
	return res, nil
}

// tracePolicy describes what the policy table did with the packet.
func (d *Driver) tracePolicy(ctx context.Context, st traceStep, res *dataplane.TraceResult) dataplane.TraceStage {
	allowed := anyAction(st.actions, "goto_table")
	switch {
	case st.prio == 0:
		return dataplane.TraceStage{Name: "policy", Detail: "no rule matched: allowed (default)"}
	case st.prio >= 65000:
		return dataplane.TraceStage{Name: "policy", Detail: "established or related connection: not judged again"}
	case st.prio == 64000 || st.prio == 64001:
		return dataplane.TraceStage{Name: "policy", Detail: "a client balanced to itself (hairpin): not judged"}
	}
	rule, group := d.policyRule(ctx, st)
	what := "denied"
	if allowed {
		what = "allowed"
	} else {
		res.Reason, res.Rule = "drop_policy", rule
	}
	if rule == "" {
		return dataplane.TraceStage{Name: "policy", Detail: fmt.Sprintf("%s by the flow %s, priority %d", what, st.match, st.prio)}
	}
	return dataplane.TraceStage{Name: "policy", Detail: fmt.Sprintf("%s by rule %s (%s)", what, rule, group)}
}

// policyRule finds the rule behind the policy flow st: the installed rule flows of its
// priority as OVS prints them, by match.
func (d *Driver) policyRule(ctx context.Context, st traceStep) (rule, group string) {
	var flows []*flow
	for _, f := range d.comp.flows {
		if f.table == tPolicy && int(f.prio) == st.prio && f.rule != "" {
			flows = append(flows, f)
		}
	}
	if len(flows) == 0 {
		return "", ""
	}
	canon, err := canonicalFlows(ctx, flows, func(f *flow) *of.FlowMod { return f.flowMod(of.FC_ADD, cookieOwner) })
	if err != nil {
		d.log.Debug("trace: policy flows as OVS prints them", "err", err)
		return "", ""
	}
	want := fmt.Sprintf("priority=%d", st.prio)
	if st.match != "" {
		want += "," + st.match
	}
	if c, ok := canon[tableKey(strconv.Itoa(int(tPolicy)), want)]; ok {
		if f := d.comp.flows[c.key]; f != nil {
			return f.rule, f.ruleOf
		}
	}
	return "", ""
}

// traceEnd sets the verdict from the last table the packet reached.
func (d *Driver) traceEnd(res *dataplane.TraceResult, st traceStep, final map[string]string) {
	if st.table == tOutput {
		if anyAction(st.actions, "IN_PORT") {
			res.Reason, res.Verdict = "fwd_local", "delivered back to the sender (a client balanced to itself)"
			return
		}
		if p := actionArg(st.actions, "output:"); p != "" {
			port, _ := strconv.ParseUint(p, 10, 32)
			switch uint32(port) {
			case d.ports.tunnel:
				vtep, vni := actionArg(st.actions, "set_field:", "->tun_dst"), actionArg(st.actions, "set_field:", "->tun_id")
				v, _ := strconv.ParseUint(strings.TrimPrefix(vni, "0x"), 16, 32)
				res.Reason = "fwd_tunnel"
				host := ""
				for _, p := range d.state.Peers {
					if p.VTEP.String() == vtep {
						host = " (" + p.Host + ")"
					}
				}
				res.Verdict = fmt.Sprintf("tunneled to VTEP %s%s, VNI %d", vtep, host, v)
				res.Stages = append(res.Stages, dataplane.TraceStage{Name: "forward", Detail: "encapsulated in VXLAN to " + vtep})
				d.traceTunnel(res, vtep, vni, final)
				return
			case d.ports.uplink:
				res.Reason, res.Verdict = "fwd_vlan", "sent to the VLAN uplink"
				res.Stages = append(res.Stages, dataplane.TraceStage{Name: "forward", Detail: "VLAN uplink, " + strings.Join(st.actions, ",")})
				return
			}
			for id, ep := range d.state.Endpoints {
				if d.ports.endpoints[id] == uint32(port) {
					res.Reason, res.Verdict = "fwd_local", fmt.Sprintf("delivered to %v (%s)", ep.IP, id)
					res.Stages = append(res.Stages, dataplane.TraceStage{Name: "forward", Detail: "local: " + id})
					return
				}
			}
			res.Reason, res.Verdict = "fwd_local", "output to port "+p
			return
		}
	}
	if st.table == tAnswerShared && anyAction(st.actions, "IN_PORT") {
		res.Reason, res.Verdict = "icmp_vip_reply", "answered: an echo reply from the VIP, back to the sender"
		return
	}
	if st.table == tAnswer && anyAction(st.actions, "controller") {
		res.Reason, res.Verdict = "reject_no_backend", "refused: the service has no backend; the agent answers with ICMP port unreachable from the VIP"
		return
	}
	if res.Reason == "" {
		res.Reason = dropReason(st.table, 0x0800)
	}
	res.Verdict = "dropped: " + res.Reason + " (table " + st.table.String() + ")"
}

// dropReason names, in the eBPF datapath's words, why a packet of etherType that ended
// in table t was dropped.
func dropReason(t tableID, etherType uint16) string {
	switch {
	case etherType == 0x8100 || etherType == 0x88a8:
		return "drop_vlan_tagged"
	case t == tClassifier:
		return "drop_spoofed_src"
	case t == tOverlaySrc:
		return "drop_overlay_spoof"
	case t == tARP && etherType == 0x0806:
		return "drop_arp_unknown_target"
	case t == tARP || t == tConntrack:
		return "drop_not_ipv4"
	case t == tServiceLB || t == tServiceBackend:
		return "drop_no_backend"
	case t == tCTCheck:
		return "drop_ct_quota" // conntrack refused the commit: the zone's limit, or a full table
	case t == tPolicy:
		return "drop_policy"
	case t == tNetpolEgress || t == tNetpolIngress:
		return "drop_netpol"
	case t == tL3 || t == tOutput:
		return "drop_unknown_dst"
	}
	return "drop"
}

// traceTunnel attaches what the receiving host needs to trace the packet on: the inner
// frame as it leaves (the trace's final flow: rewrites and NAT applied).
func (d *Driver) traceTunnel(res *dataplane.TraceResult, vtep, vni string, final map[string]string) {
	to, err := netip.ParseAddr(vtep)
	if err != nil {
		return
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(vni, "0x"), 16, 32)
	if err != nil {
		return
	}
	srcMAC, err1 := net.ParseMAC(final["dl_src"])
	dstMAC, err2 := net.ParseMAC(final["dl_dst"])
	src, err3 := netip.ParseAddr(final["nw_src"])
	dst, err4 := netip.ParseAddr(final["nw_dst"])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return
	}
	var proto uint8
	var sport, dport uint64
	switch {
	case hasKey(final, "tcp"):
		proto = 6
	case hasKey(final, "udp"):
		proto = 17
	case hasKey(final, "icmp"):
		proto = 1
	default:
		return
	}
	sport, _ = strconv.ParseUint(final["tp_src"], 10, 16)
	dport, _ = strconv.ParseUint(final["tp_dst"], 10, 16)
	res.Tunnel = &dataplane.TraceTunnel{Source: d.host.VTEP, VTEP: to, VNI: uint32(v),
		Inner: dataplane.TraceFrame(srcMAC, dstMAC, src, dst, proto, uint16(sport), uint16(dport))}
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

// matchFields splits a match as OVS prints it ("tcp,reg3=0x1,nw_dst=10.96.0.10") into
// fields; a field without a value (e.g. "tcp") maps to "".
// traceBackend reads the backend a service_dnat flow rewrites to from its match (reg5 =
// address, reg6 = port, as ofproto/trace prints them).
func traceBackend(match string) (string, bool) {
	m := matchFields(match)
	ip, err1 := strconv.ParseUint(m[fmt.Sprintf("reg%d", regSvcIP)], 0, 32)
	port, err2 := strconv.ParseUint(m[fmt.Sprintf("reg%d", regSvcPort)], 0, 16)
	if err1 != nil || err2 != nil {
		return "", false
	}
	a := netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)})
	return netip.AddrPortFrom(a, uint16(port)).String(), true
}

func matchFields(match string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Split(match, ",") {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// actionArg returns what follows prefix (and precedes suffix, if given) in the first
// action that has both.
func actionArg(actions []string, prefix string, suffix ...string) string {
	for _, a := range actions {
		i := strings.Index(a, prefix)
		if i < 0 {
			continue
		}
		rest := a[i+len(prefix):]
		if len(suffix) > 0 {
			j := strings.Index(rest, suffix[0])
			if j < 0 {
				continue
			}
			return rest[:j]
		}
		if j := strings.IndexAny(rest, ",)"); j >= 0 {
			rest = rest[:j]
		}
		return rest
	}
	return ""
}

// anyAction says whether any action contains s.
func anyAction(actions []string, s string) bool {
	for _, a := range actions {
		if strings.Contains(a, s) {
			return true
		}
	}
	return false
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1:
		return "icmp"
	}
	return fmt.Sprintf("proto %d", p)
}
