package ovs

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/policy"
)

// Established connections under a changed policy (the eBPF datapath's policy epoch, here):
// conntrack entries bypass the policy tables, so after a change of group rules, endpoint
// groups or NetworkPolicy layers the driver dumps the tenants' conntrack zones, judges each
// connection again as its opening (pkg/policy: Decide and NetpolAllows, as the eBPF
// datapath does) and flushes the ones the new policy denies: their next packet is new and
// the policy tables drop it.

// ctConn is one conntrack entry as dpctl/dump-conntrack prints it.
type ctConn struct {
	proto        uint8
	zone         uint16
	src, dst     netip.Addr
	sport, dport uint16
	replySrc     netip.Addr // the backend, for a DNATed connection
	replySport   uint16
}

// parseConntrack reads `ovs-appctl dpctl/dump-conntrack` lines, e.g.
// tcp,orig=(src=10.1.0.2,dst=10.1.0.3,sport=40000,dport=80),reply=(src=10.1.0.3,dst=10.1.0.2,sport=80,dport=40000),zone=1,protoinfo=(state=ESTABLISHED)
// Lines it cannot read are skipped (IPv6, unknown protocols).
func parseConntrack(out string) []ctConn {
	var conns []ctConn
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		proto, rest, ok := strings.Cut(line, ",")
		if !ok {
			continue
		}
		var c ctConn
		switch proto {
		case "tcp":
			c.proto = 6
		case "udp":
			c.proto = 17
		case "icmp":
			c.proto = 1
		default:
			continue
		}
		fields := func(section string) map[string]string {
			i := strings.Index(rest, section+"=(")
			if i < 0 {
				return nil
			}
			body := rest[i+len(section)+2:]
			if j := strings.IndexByte(body, ')'); j >= 0 {
				body = body[:j]
			}
			m := map[string]string{}
			for _, kv := range strings.Split(body, ",") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					m[k] = v
				}
			}
			return m
		}
		orig, reply := fields("orig"), fields("reply")
		if orig == nil || reply == nil {
			continue
		}
		var err error
		if c.src, err = netip.ParseAddr(orig["src"]); err != nil || !c.src.Is4() {
			continue
		}
		if c.dst, err = netip.ParseAddr(orig["dst"]); err != nil {
			continue
		}
		if c.replySrc, err = netip.ParseAddr(reply["src"]); err != nil {
			continue
		}
		port := func(m map[string]string, k string) uint16 {
			v, _ := strconv.ParseUint(m[k], 10, 16)
			return uint16(v)
		}
		c.sport, c.dport, c.replySport = port(orig, "sport"), port(orig, "dport"), port(reply, "sport")
		if c.proto == 1 {
			c.sport, c.dport = port(orig, "id"), port(orig, "id")
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "zone="); ok {
				z, _ := strconv.ParseUint(v, 10, 16)
				c.zone = uint16(z)
			}
		}
		conns = append(conns, c)
	}
	return conns
}

// verdictInputs is what judging needs from a desired state, per VRF.
type verdictInputs struct {
	sets  []dataplane.PolicySet
	group map[vrfAddr]uint16
	pods  map[vrfAddr]*dataplane.PodPolicy
}

type vrfAddr struct {
	vrf uint32
	ip  netip.Addr
}

func inputsOf(st *dataplane.Index, vrf map[string]uint32) verdictInputs {
	in := verdictInputs{group: map[vrfAddr]uint16{}, pods: map[vrfAddr]*dataplane.PodPolicy{}}
	for _, p := range sortedValues(st.Policies, func(p dataplane.PolicySet) string { return fmt.Sprintf("%05d", p.EPGID) }) {
		in.sets = append(in.sets, p)
	}
	for _, e := range st.Endpoints {
		if v, ok := vrf[tenantOf(e.NetworkID)]; ok && e.EPGID != 0 {
			in.group[vrfAddr{v, e.IP}] = e.EPGID
		}
	}
	for _, e := range st.RemoteEndpoints {
		if v, ok := vrf[tenantOf(e.NetworkID)]; ok && e.EPGID != 0 {
			in.group[vrfAddr{v, e.IP}] = e.EPGID
		}
	}
	for _, p := range st.PodPolicies {
		if v, ok := vrf[tenantOf(p.NetworkID)]; ok {
			pp := p
			if pp.Validate() != nil { // installed failed closed: isolated both ways, no rules
				pp = dataplane.PodPolicy{ID: p.ID, NetworkID: p.NetworkID, IP: p.IP, IngressIsolated: true, EgressIsolated: true}
			}
			in.pods[vrfAddr{v, p.IP}] = &pp
		}
	}
	return in
}

// verdictChanged says whether judging could differ between two states.
func verdictChanged(a, b verdictInputs) bool {
	return !reflect.DeepEqual(a.sets, b.sets) || !reflect.DeepEqual(a.group, b.group) || !reflect.DeepEqual(a.pods, b.pods)
}

// allows judges connection c, of the tenant with VRF v (in one of its zones), as its
// opening under in: the group rules (a flow's TCP packets judged as its SYN) and the
// NetworkPolicy layer, against the backend for a DNATed connection.
func (in verdictInputs) allows(c ctConn, v uint32) bool {
	dst, dport := c.dst, c.dport
	if c.replySrc != c.dst { // DNAT: judged against the backend
		dst, dport = c.replySrc, c.replySport
	}
	if c.src == dst {
		return true // a client balanced to itself (hairpin) is not judged
	}
	p := policy.Packet{SrcEPG: in.group[vrfAddr{v, c.src}], DstEPG: in.group[vrfAddr{v, dst}], SrcIP: c.src, DstIP: dst, Proto: c.proto, SYN: c.proto == 6}
	if c.proto == 6 || c.proto == 17 {
		p.DstPort = dport
	} else {
		dport = 0
	}
	if !policy.Decide(in.sets, p).Allowed() {
		return false
	}
	return policy.NetpolAllows(in.pods[vrfAddr{v, c.src}], in.pods[vrfAddr{v, dst}], c.src, dst, c.proto, dport)
}

// appctl runs an ovs-appctl command against this driver's vswitchd, through its control
// socket (unixctl.go).
func (d *Driver) appctl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sock, err := d.vswitchdCtl()
	if err != nil {
		return "", err
	}
	out, err := unixctl(ctx, sock, args[0], args[1:]...)
	if err != nil {
		return out, fmt.Errorf("ovs-appctl %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// vswitchdCtl is the path of vswitchd's control socket: in the private instance's
// directory, or <RunDir>/ovs-vswitchd.<pid>.ctl of a shared one.
func (d *Driver) vswitchdCtl() (string, error) {
	if d.priv != nil {
		return filepath.Join(d.priv.Dir, "ovs-vswitchd.ctl"), nil
	}
	b, err := os.ReadFile(filepath.Join(d.opts.RunDir, "ovs-vswitchd.pid"))
	if err != nil {
		return "", fmt.Errorf("ovs-vswitchd control socket: %w", err)
	}
	return filepath.Join(d.opts.RunDir, "ovs-vswitchd."+strings.TrimSpace(string(b))+".ctl"), nil
}

// rejudge flushes the tenants' connections the policy of st denies.
func (d *Driver) rejudge(ctx context.Context, st *dataplane.Index, vrf map[string]uint32) error {
	d.ct.runs.Add(1)
	out, err := d.appctl(ctx, "dpctl/dump-conntrack")
	if err != nil {
		d.ct.errors.Add(1)
		return fmt.Errorf("re-judge established connections: %w", err)
	}
	zones := tenantZones(vrf) // own and inbound zones, not the hairpin ones
	in := inputsOf(st, vrf)
	var errs []error
	cut := 0
	for _, c := range parseConntrack(out) {
		if v, ok := zones[c.zone]; !ok || in.allows(c, v) {
			continue
		}
		m := ctMatch{zone: c.zone, proto: c.proto, orig: ctTuple{src: c.src, dst: c.dst, sport: c.sport, dport: c.dport}}
		if c.proto == 1 {
			m.orig.sport, m.orig.dport = 0, 0 // ICMP: the id is not a port property
		}
		if err := d.conn.ctFlush(ctx, m); err != nil {
			errs = append(errs, err)
			continue
		}
		cut++
	}
	d.ct.cut.Add(int64(cut))
	if cut > 0 {
		d.log.Info("policy change: established connections it denies were cut", "connections", cut)
	}
	if len(errs) > 0 {
		d.ct.errors.Add(1)
		return fmt.Errorf("re-judge established connections: %d flushes failed: %w", len(errs), errs[0])
	}
	return nil
}
