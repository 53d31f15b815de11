package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/policy"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// LocalEndpoint is this agent's record of an endpoint it attached, stored at
// /contiv.io/oper/eps/<id>. Contiv's OperEndpointState fields keep their meaning
// (intfName = container interface, portName = host-side veth); the rest is this
// project's extension so a restarted agent can find the container again.
type LocalEndpoint struct {
	model.OperEndpointState
	NetNS   string `json:"netNS,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	Network string `json:"network,omitempty"`
	Group   string `json:"group,omitempty"`
}

// records is everything the agent watches, decoded, keyed by record id.
type records struct {
	nets  map[string]model.CfgNetworkState
	eps   map[string]model.CfgEndpointState
	epgs  map[string]model.EndpointGroupState
	rules map[string]model.CfgPolicyRule
	svcs  map[string]model.CfgServiceLBState
	bgp   map[string]model.CfgBgpState // by host
	// podPols: the NetworkPolicy layer, by endpoint id.
	podPols map[string]model.K8sPodPolicy
	vteps   vxlan.Table
	// lastVTEP remembers each host's VTEP after its registration expired (a restarting
	// netplugin), so traffic to its endpoints keeps flowing while they still exist.
	lastVTEP map[string]netip.Addr
	// hostVTEPs are the durable per-host VTEP records (vxlan.HostVTEPPrefix) each agent
	// writes for itself: they survive both the owner's and this agent's restarts.
	hostVTEPs map[string]netip.Addr
	local     map[string]LocalEndpoint
	glob      model.GlobConfig
	// undecodable are watched records that do not decode, keyed like the error map
	// ("endpoint-group/<id>"); they are reported until fixed or deleted.
	undecodable map[string]error
}

func newRecords() *records {
	return &records{
		nets:        map[string]model.CfgNetworkState{},
		eps:         map[string]model.CfgEndpointState{},
		epgs:        map[string]model.EndpointGroupState{},
		rules:       map[string]model.CfgPolicyRule{},
		svcs:        map[string]model.CfgServiceLBState{},
		bgp:         map[string]model.CfgBgpState{},
		podPols:     map[string]model.K8sPodPolicy{},
		vteps:       vxlan.Table{},
		lastVTEP:    map[string]netip.Addr{},
		hostVTEPs:   map[string]netip.Addr{},
		local:       map[string]LocalEndpoint{},
		undecodable: map[string]error{},
	}
}

// hostView is what the computation needs to know about this host.
type hostView struct {
	host      string
	vtep      netip.Addr
	uplinkMTU int
	vlanIf    string
}

// networkOf converts a network state record.
func networkOf(n model.CfgNetworkState, uplinkMTU int) (dataplane.Network, error) {
	out := dataplane.Network{ID: n.ID, Encap: dataplane.Encap(n.PktTagType), NoSNAT: n.NatDisabled}
	switch out.Encap {
	case dataplane.EncapVXLAN:
		out.Tag = uint32(n.ExtPktTag)
		out.MTU = uplinkMTU - 50
	case dataplane.EncapVLAN:
		out.Tag = uint32(n.PktTag)
		out.MTU = uplinkMTU
	}
	ip, err := netip.ParseAddr(n.SubnetIP)
	if err != nil {
		return out, fmt.Errorf("network %s: subnetIP %q: %w", n.ID, n.SubnetIP, err)
	}
	pfx, err := ip.Prefix(int(n.SubnetLen))
	if err != nil {
		return out, fmt.Errorf("network %s: subnetLen %d: %w", n.ID, n.SubnetLen, err)
	}
	out.Subnet = pfx
	if n.Gateway != "" {
		gw, err := netip.ParseAddr(n.Gateway)
		if err != nil {
			return out, fmt.Errorf("network %s: gateway %q: %w", n.ID, n.Gateway, err)
		}
		out.Gateway = gw
	}
	return out, out.Validate()
}

func epAddrs(e model.CfgEndpointState) (netip.Addr, netip.Addr, net.HardwareAddr, error) {
	ip, err := netip.ParseAddr(e.IPAddress)
	if err != nil || !ip.Is4() {
		return ip, netip.Addr{}, nil, fmt.Errorf("endpoint %s: ipAddress %q is not IPv4", e.ID, e.IPAddress)
	}
	var ip6 netip.Addr
	if e.IPv6Address != "" {
		if ip6, err = netip.ParseAddr(e.IPv6Address); err != nil {
			return ip, ip6, nil, fmt.Errorf("endpoint %s: ipv6Address %q: %w", e.ID, e.IPv6Address, err)
		}
	}
	mac := dataplane.ContivMAC(ip)
	if e.MacAddress != "" {
		if mac, err = net.ParseMAC(e.MacAddress); err != nil || len(mac) != 6 {
			return ip, ip6, nil, fmt.Errorf("endpoint %s: macAddress %q is not a 6-byte MAC", e.ID, e.MacAddress)
		}
	}
	return ip, ip6, mac, nil
}

func epgID(e model.CfgEndpointState) uint16 {
	if e.EndpointGroupID <= 0 || e.EndpointGroupID > 0xffff {
		return 0
	}
	return uint16(e.EndpointGroupID)
}

// compute builds the desired state of this host. Records that cannot be used are left
// out and reported, keyed like the reconciler keys objects ("endpoint/<id>").
func compute(h hostView, r *records) (dataplane.State, map[string]error) {
	var s dataplane.State
	bad := map[string]error{}
	for k, err := range r.undecodable {
		bad[k] = err
	}
	nets := map[string]dataplane.Network{}
	for id, n := range r.nets {
		dn, err := networkOf(n, h.uplinkMTU)
		if err == nil && dn.Encap == dataplane.EncapVLAN && h.vlanIf == "" {
			err = fmt.Errorf("network %s: vlan network (tag %d) needs a VLAN uplink: start netplugin with --vlan-if", id, dn.Tag)
		}
		if err != nil {
			bad["network/"+id] = err
			continue
		}
		nets[id] = dn
		s.Networks = append(s.Networks, dn)
	}
	for id, e := range r.eps {
		n, ok := nets[e.NetID]
		if !ok {
			continue // network not (yet) known: the endpoint follows when it is
		}
		ip, ip6, mac, err := epAddrs(e)
		if err != nil {
			bad["endpoint/"+id] = err
			continue
		}
		if e.HomingHost == h.host {
			l, ok := r.local[id]
			if !ok {
				continue // attached elsewhere or not yet recorded by AttachEndpoint
			}
			de := dataplane.Endpoint{
				ID: id, NetworkID: e.NetID, IP: ip, IPv6: ip6, MAC: mac, EPGID: epgID(e),
				HostIfName: l.PortName, NetNS: l.NetNS, IfName: l.IntfName,
			}
			if err := de.Validate(); err != nil {
				bad["endpoint/"+id] = err
				continue
			}
			s.Endpoints = append(s.Endpoints, de)
			continue
		}
		re := dataplane.RemoteEndpoint{ID: id, NetworkID: e.NetID, IP: ip, MAC: mac, EPGID: epgID(e), Host: e.HomingHost}
		if e.VtepIP != "" {
			v, err := netip.ParseAddr(e.VtepIP)
			if err != nil {
				bad["remote-endpoint/"+id] = fmt.Errorf("endpoint %s: vtepIP %q: %w", id, e.VtepIP, err)
				continue
			}
			re.VTEP = v
		} else if v, ok := r.vteps.VTEPOf(e.HomingHost); ok {
			re.VTEP = v
		} else if v, ok := r.hostVTEPs[e.HomingHost]; ok {
			re.VTEP = v
		} else if v, ok := r.lastVTEP[e.HomingHost]; ok {
			re.VTEP = v
		} else if n.Encap == dataplane.EncapVXLAN {
			continue // the owning host has not registered its VTEP yet
		}
		// Checked here so one bad record is reported on its own instead of making the
		// driver refuse a whole Sync.
		if err := re.Validate(n.Encap); err != nil {
			bad["remote-endpoint/"+id] = err
			continue
		}
		s.RemoteEndpoints = append(s.RemoteEndpoints, re)
	}
	s.Peers = peers(h, r)
	s.Policies = compilePolicies(r.rules, bad)
	for id, rec := range r.podPols {
		e, ok := r.eps[id]
		if !ok {
			continue // the endpoint is gone (or not yet known): nothing to isolate
		}
		if _, ok := nets[e.NetID]; !ok {
			continue
		}
		pp, err := podPolicyOf(rec, e)
		if err != nil {
			// Refused records fail closed: the pod isolated both ways, no rules.
			bad["pod-policy/"+id] = err
		}
		s.PodPolicies = append(s.PodPolicies, pp)
	}
	for id, svc := range r.svcs {
		ds, err := serviceOf(svc)
		if err != nil {
			bad["service/"+id] = err
			continue
		}
		s.Services = append(s.Services, ds)
	}
	sortState(&s)
	return s, bad
}

// peers are the live netplugin.vtep registrations of other hosts plus, for hosts whose
// registration is gone (agent down or restarting) but which still own endpoints, their
// durable VTEP record: a peer goes away with its endpoints, not with its agent.
func peers(h hostView, r *records) []dataplane.Peer {
	out := r.vteps.Peers(h.host, h.vtep)
	have := map[string]bool{}
	for _, p := range out {
		have[p.Host] = true
	}
	owners := map[string]bool{}
	for _, e := range r.eps {
		owners[e.HomingHost] = true
	}
	added := false
	for host, v := range r.hostVTEPs {
		if host == h.host || have[host] || !owners[host] || (h.vtep.IsValid() && v == h.vtep) {
			continue
		}
		out = append(out, dataplane.Peer{Host: host, VTEP: v})
		added = true
	}
	if added {
		sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	}
	return out
}

// compilePolicies compiles the state/policyRule records with pkg/policy (range addresses,
// evaluation order, field validation; see docs/policy.md). Every record it refuses is
// reported under "policy-rule/<rule id>"; the valid rules are still installed, as Compile
// allows.
func compilePolicies(rules map[string]model.CfgPolicyRule, bad map[string]error) []dataplane.PolicySet {
	st := policy.State{Rules: make([]model.CfgPolicyRule, 0, len(rules))}
	for id, r := range rules {
		if r.ID == "" {
			r.ID = id // the key names the record when its body does not
		}
		st.Rules = append(st.Rules, r)
	}
	sets, err := policy.Compile(st)
	if err == nil {
		return sets
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var re *policy.RuleError
		if errors.As(e, &re) {
			bad["policy-rule/"+re.RuleID] = e
		} else {
			bad["policy"] = e
		}
	}
	return sets
}

// portTriple reads "port:port:proto" (proto TCP or UDP, any case).
func portTriple(v string) (a, b uint16, proto uint8, err error) {
	f := strings.Split(v, ":")
	if len(f) != 3 {
		return 0, 0, 0, errors.New("want three fields")
	}
	x, err1 := strconv.ParseUint(f[0], 10, 16)
	y, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil {
		return 0, 0, 0, errors.New("ports must be 0-65535")
	}
	switch strings.ToLower(f[2]) {
	case "tcp":
		proto = 6
	case "udp":
		proto = 17
	default:
		return 0, 0, 0, errors.New("protocol must be TCP or UDP")
	}
	return uint16(x), uint16(y), proto, nil
}

func serviceOf(s model.CfgServiceLBState) (dataplane.Service, error) {
	out := dataplane.Service{ID: s.ID}
	vip, err := netip.ParseAddr(s.IPAddress)
	if err != nil {
		return out, fmt.Errorf("service %s: ipaddress %q: %w", s.ID, s.IPAddress, err)
	}
	out.VIP = vip
	for _, p := range s.Ports {
		sp, tp, proto, err := portTriple(p)
		if err != nil {
			return out, fmt.Errorf("service %s: port %q (svcPort:provPort:proto): %w", s.ID, p, err)
		}
		out.Ports = append(out.Ports, dataplane.ServicePort{Proto: proto, Port: sp, TargetPort: tp})
	}
	for _, np := range s.NodePorts {
		port, sp, proto, err := portTriple(np)
		if err == nil && port == 0 {
			err = errors.New("node port 0")
		}
		if err != nil {
			return out, fmt.Errorf("service %s: node port %q (nodePort:svcPort:proto): %w", s.ID, np, err)
		}
		found := false
		for i := range out.Ports {
			if out.Ports[i].Port == sp && out.Ports[i].Proto == proto {
				out.Ports[i].NodePort, found = port, true
			}
		}
		if !found {
			return out, fmt.Errorf("service %s: node port %q names no port of the service", s.ID, np)
		}
	}
	for _, p := range s.Providers {
		if p == nil {
			continue
		}
		a, err := netip.ParseAddr(p.IPAddress)
		if err != nil {
			return out, fmt.Errorf("service %s: provider address %q: %w", s.ID, p.IPAddress, err)
		}
		if p.Draining {
			out.Draining = append(out.Draining, a)
		} else {
			out.Backends = append(out.Backends, a)
		}
	}
	sort.Slice(out.Backends, func(i, j int) bool { return out.Backends[i].Less(out.Backends[j]) })
	sort.Slice(out.Draining, func(i, j int) bool { return out.Draining[i].Less(out.Draining[j]) })
	switch s.SessionAffinity {
	case "":
	case "ClientIP":
		out.AffinityClientIP = true
	default:
		return out, fmt.Errorf("service %s: sessionAffinity %q must be ClientIP or empty", s.ID, s.SessionAffinity)
	}
	return out, nil
}

func sortState(s *dataplane.State) {
	sort.Slice(s.Networks, func(i, j int) bool { return s.Networks[i].ID < s.Networks[j].ID })
	sort.Slice(s.Endpoints, func(i, j int) bool { return s.Endpoints[i].ID < s.Endpoints[j].ID })
	sort.Slice(s.RemoteEndpoints, func(i, j int) bool { return s.RemoteEndpoints[i].ID < s.RemoteEndpoints[j].ID })
	sort.Slice(s.Policies, func(i, j int) bool { return s.Policies[i].EPGID < s.Policies[j].EPGID })
	sort.Slice(s.Services, func(i, j int) bool { return s.Services[i].ID < s.Services[j].ID })
	sort.Slice(s.PodPolicies, func(i, j int) bool { return s.PodPolicies[i].ID < s.PodPolicies[j].ID })
}

// podPolicyOf converts a pod's NetworkPolicy record for its endpoint e (whose address
// and network are used, not the record's). A record that cannot be used returns an
// error and a policy that isolates the pod both ways with no rules: never wider.
func podPolicyOf(rec model.K8sPodPolicy, e model.CfgEndpointState) (dataplane.PodPolicy, error) {
	ip, _, _, err := epAddrs(e)
	pp := dataplane.PodPolicy{ID: e.ID, NetworkID: e.NetID, IP: ip, IngressIsolated: true, EgressIsolated: true}
	if err != nil {
		return pp, fmt.Errorf("pod policy %s: %w", e.ID, err)
	}
	conv := func(dir string, rs []model.K8sPodRule) ([]dataplane.PodRule, error) {
		out := make([]dataplane.PodRule, 0, len(rs))
		for i, r := range rs {
			pfx, err := netip.ParsePrefix(r.Remote)
			if err != nil {
				return nil, fmt.Errorf("pod policy %s: %s rule %d: remote %q: %w", e.ID, dir, i, r.Remote, err)
			}
			out = append(out, dataplane.PodRule{Remote: pfx.Masked(), Proto: r.Proto, PortMin: r.PortMin, PortMax: r.PortMax})
		}
		return out, nil
	}
	in, err := conv("ingress", rec.Ingress)
	if err != nil {
		return pp, err
	}
	eg, err := conv("egress", rec.Egress)
	if err != nil {
		return pp, err
	}
	good := dataplane.PodPolicy{ID: e.ID, NetworkID: e.NetID, IP: ip,
		IngressIsolated: rec.IngressIsolated, EgressIsolated: rec.EgressIsolated, Ingress: in, Egress: eg}
	if err := good.Validate(); err != nil {
		return pp, err
	}
	return good, nil
}
