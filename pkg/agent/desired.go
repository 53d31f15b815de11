package agent

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/netprofile"
	"github.com/contivbpf/contivbpf/pkg/policy"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// LocalEndpoint is this agent's record of an endpoint it attached (model.LocalEndpointRecord,
// at /contiv.io/oper/eps/<id>, written through netmaster's /plugin/recordEndpoint).
type LocalEndpoint = model.LocalEndpointRecord

// records is everything the agent watches, decoded, keyed by record id.
type records struct {
	nets  map[string]model.CfgNetworkState
	eps   map[string]model.CfgEndpointState
	epgs  map[string]model.EndpointGroupState
	rules map[string]model.CfgPolicyRule
	// ruleGroup is the group each rule record compiles into (policy.RuleGroup); a rule
	// without one makes the next pass compile every group.
	ruleGroup map[string]uint16
	// oddRules are rule records whose body names another id than their key (netmaster
	// never writes one): while any exists, every rule change compiles every group.
	oddRules map[string]struct{}
	svcs     map[string]model.CfgServiceLBState
	bgp      map[string]model.CfgBgpState // by host
	// podPols: the NetworkPolicy layer, by endpoint id.
	podPols map[string]model.K8sPodPolicy
	// prefilters: the deny list (every host's entries and this host's), by name.
	prefilters map[string]model.Prefilter
	vteps      vxlan.Table
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
	// podQoSErr are this host's endpoints whose pod's bandwidth annotations changed to
	// values that do not parse (podqos.go), by endpoint id: failed like a group record
	// whose netprofile cannot be read, until the annotations are fixed.
	podQoSErr map[string]error

	// dirty is what changed since the last reconcile pass took its view: most events
	// touch one endpoint or service, and a pass recomputes and re-plans only those.
	dirty scope
	// owners counts endpoints by homing host (peers only ask whether a host owns any).
	owners map[string]int
	// netsOK are the networks the last full computation accepted; a scoped pass converts
	// endpoints against them (every change that could alter them makes the pass full).
	netsOK map[string]dataplane.Network
	// namesStale / askersStale: the DNS indexes no longer match the records.
	namesStale, askersStale bool
}

// netShape is a network record without its address bookkeeping (allocation maps and
// counts), which netmaster rewrites for every address it hands out and nothing here reads.
// A field added to model.CfgNetworkState belongs here unless it is bookkeeping
// (TestNetShapeCoversNetworkRecord fails until it is placed).
type netShape struct {
	ID, Tenant, NetworkName, NwType, PktTagType string
	PktTag, ExtPktTag                           int
	SubnetIP                                    string
	SubnetLen                                   uint
	Gateway, IPAddrRange, IPAllocStore          string
	IPv6Subnet                                  string
	IPv6SubnetLen                               uint
	IPv6Gateway, NetworkTag                     string
	NatDisabled                                 bool
}

func shapeOf(n model.CfgNetworkState) netShape {
	return netShape{ID: n.ID, Tenant: n.Tenant, NetworkName: n.NetworkName, NwType: n.NwType, PktTagType: n.PktTagType,
		PktTag: n.PktTag, ExtPktTag: n.ExtPktTag, SubnetIP: n.SubnetIP, SubnetLen: n.SubnetLen, Gateway: n.Gateway,
		IPAddrRange: n.IPAddrRange, IPAllocStore: n.IPAllocStore, IPv6Subnet: n.IPv6Subnet, IPv6SubnetLen: n.IPv6SubnetLen,
		IPv6Gateway: n.IPv6Gateway, NetworkTag: n.NetworkTag, NatDisabled: n.NatDisabled}
}

// scope names what a reconcile pass recomputes: everything, or the endpoints (their
// local, remote and pod-policy objects) and services by id, and the rule sets.
type scope struct {
	all  bool
	eps  map[string]struct{}
	svcs map[string]struct{}
	// pols: every group's rule set is compiled again; groups: these groups' sets, whose
	// rule records rules changed.
	pols   bool
	groups map[uint16]struct{}
	rules  map[string]struct{}
}

// touchGroup makes the next pass compile group g's rule set again.
func (s *scope) touchGroup(g uint16) {
	if s.groups == nil {
		s.groups = map[uint16]struct{}{}
	}
	s.groups[g] = struct{}{}
}

// touchRule records that rule record id of group g changed.
func (s *scope) touchRule(id string, g uint16) {
	s.touchGroup(g)
	if s.rules == nil {
		s.rules = map[string]struct{}{}
	}
	s.rules[id] = struct{}{}
}

func (s *scope) touchEp(id string) {
	if s.eps == nil {
		s.eps = map[string]struct{}{}
	}
	s.eps[id] = struct{}{}
}

func (s *scope) touchSvc(id string) {
	if s.svcs == nil {
		s.svcs = map[string]struct{}{}
	}
	s.svcs[id] = struct{}{}
}

func (s scope) empty() bool {
	return !s.all && !s.pols && len(s.eps) == 0 && len(s.svcs) == 0 && len(s.groups) == 0
}

// setRule records rule record id (nil: removes it). The groups it compiled into before
// and after are recomputed by the next pass; every group when either is unknown, and
// while any record is odd (oddRules).
func (r *records) setRule(id string, v *model.CfgPolicyRule) {
	if g, ok := r.ruleGroup[id]; ok {
		r.dirty.touchRule(id, g)
	} else if _, had := r.rules[id]; had {
		r.dirty.pols = true
	}
	_, wasOdd := r.oddRules[id]
	delete(r.ruleGroup, id)
	delete(r.oddRules, id)
	if v == nil {
		delete(r.rules, id)
	} else {
		r.rules[id] = *v
		// Compile knows a rule by its body's id (the key's when the body has none, the
		// RuleId's when neither has one): a record named otherwise than by its key can
		// conflict with another record of any group, which only a compilation of every
		// group sees (and its errors are keyed by that name).
		if name := cmp.Or(v.ID, id, v.RuleId); name != id {
			r.oddRules[id] = struct{}{}
		}
		rec := v.OfnetPolicyRule
		if rec.RuleId == "" {
			rec.RuleId = cmp.Or(v.ID, id)
		}
		if g, ok := policy.RuleGroup(rec); ok {
			r.ruleGroup[id] = g
			r.dirty.touchRule(id, g)
		} else {
			r.dirty.pols = true
		}
	}
	if wasOdd || len(r.oddRules) > 0 {
		r.dirty.pols = true
	}
}

// touchAll makes the next pass recompute everything.
func (r *records) touchAll() {
	r.dirty = scope{all: true}
	r.namesStale, r.askersStale = true, true
}

// setEp records endpoint id (nil: removes it), keeping the owner counts and the dirty
// scope. A record whose body names another id than its key (netmaster never writes one)
// makes the next pass full, to be safe.
func (r *records) setEp(id string, v *model.CfgEndpointState) {
	if old, ok := r.eps[id]; ok {
		if r.owners[old.HomingHost]--; r.owners[old.HomingHost] <= 0 {
			delete(r.owners, old.HomingHost)
		}
		if old.ID != id {
			r.touchAll()
		}
		delete(r.eps, id)
	}
	if v != nil {
		r.eps[id] = *v
		r.owners[v.HomingHost]++
		if v.ID != id {
			r.touchAll()
		}
	}
	r.dirty.touchEp(id)
	r.namesStale = true
}

// clearEps forgets every endpoint record (a relist follows).
func (r *records) clearEps() {
	clear(r.eps)
	clear(r.owners)
	r.touchAll()
}

// setSvc records service id (nil: removes it); like setEp for the key/body rule.
func (r *records) setSvc(id string, v *model.CfgServiceLBState) {
	if old, ok := r.svcs[id]; ok && old.ID != id {
		r.touchAll()
	}
	delete(r.svcs, id)
	if v != nil {
		r.svcs[id] = *v
		if v.ID != id {
			r.touchAll()
		}
	}
	r.dirty.touchSvc(id)
	r.namesStale = true
}

// setLocal records this host's own endpoint id (nil: forgets it).
func (r *records) setLocal(id string, l *LocalEndpoint) {
	if l == nil {
		delete(r.local, id)
		delete(r.podQoSErr, id)
	} else {
		r.local[id] = *l
	}
	r.dirty.touchEp(id)
	r.askersStale = true
}

func newRecords() *records {
	return &records{
		nets:        map[string]model.CfgNetworkState{},
		eps:         map[string]model.CfgEndpointState{},
		epgs:        map[string]model.EndpointGroupState{},
		rules:       map[string]model.CfgPolicyRule{},
		ruleGroup:   map[string]uint16{},
		oddRules:    map[string]struct{}{},
		svcs:        map[string]model.CfgServiceLBState{},
		bgp:         map[string]model.CfgBgpState{},
		podPols:     map[string]model.K8sPodPolicy{},
		prefilters:  map[string]model.Prefilter{},
		vteps:       vxlan.Table{},
		lastVTEP:    map[string]netip.Addr{},
		hostVTEPs:   map[string]netip.Addr{},
		local:       map[string]LocalEndpoint{},
		undecodable: map[string]error{},
		podQoSErr:   map[string]error{},
		dirty:       scope{all: true},
		owners:      map[string]int{},
		netsOK:      map[string]dataplane.Network{},
		namesStale:  true, askersStale: true,
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
// out and reported, keyed like the reconciler keys objects ("endpoint/<id>"). It also
// remembers the accepted networks for scoped passes (computeScoped).
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
	r.netsOK = nets
	clear(r.owners)
	for id, e := range r.eps {
		r.owners[e.HomingHost]++
		de, re, err := endpointOf(h, r, id)
		if err != nil {
			bad[err.key] = err.err
		}
		switch {
		case de != nil:
			s.Endpoints = append(s.Endpoints, *de)
		case re != nil:
			s.RemoteEndpoints = append(s.RemoteEndpoints, *re)
		}
	}
	s.Peers = peers(h, r)
	s.Policies = compilePolicies(r.rules, bad)
	for id := range r.podPols {
		if pp, ok, err := podPolicyFor(r, id); ok {
			if err != nil {
				bad["pod-policy/"+id] = err
			}
			s.PodPolicies = append(s.PodPolicies, pp)
		}
	}
	for id, svc := range r.svcs {
		ds, err := serviceOf(svc)
		if err != nil {
			bad["service/"+id] = err
			continue
		}
		s.Services = append(s.Services, ds)
	}
	s.Sort()
	return s, bad
}

// computeScoped builds only the objects sc names (sc.all must be false; the rule sets
// when sc.pols), plus the peers
// (a host may have gained or lost its last endpoint), against the networks of the last
// full computation. The result holds just those objects; bad holds their errors.
func computeScoped(h hostView, r *records, sc scope) (*dataplane.Index, map[string]error) {
	want := dataplane.IndexOf(dataplane.State{Peers: peers(h, r)})
	bad := map[string]error{}
	for id := range sc.eps {
		for _, kind := range []string{"endpoint/", "pod-policy/"} {
			if err, ok := r.undecodable[kind+id]; ok {
				bad[kind+id] = err
			}
		}
		if _, ok := r.eps[id]; ok {
			de, re, err := endpointOf(h, r, id)
			if err != nil {
				bad[err.key] = err.err
			}
			switch {
			case de != nil:
				want.Endpoints[id] = *de
			case re != nil:
				want.RemoteEndpoints[id] = *re
			}
		}
		if _, ok := r.podPols[id]; ok {
			if pp, ok, err := podPolicyFor(r, id); ok {
				if err != nil {
					bad["pod-policy/"+id] = err
				}
				want.PodPolicies[id] = pp
			}
		}
	}
	if sc.pols {
		for k, err := range r.undecodable {
			if strings.HasPrefix(k, "policy-rule/") {
				bad[k] = err
			}
		}
		for _, p := range compilePolicies(r.rules, bad) {
			want.Policies[p.EPGID] = p
		}
	} else if len(sc.groups) > 0 {
		// Only the groups whose rules changed: a set compiles from its own rules alone.
		rules := map[string]model.CfgPolicyRule{}
		for id, g := range r.ruleGroup {
			if _, ok := sc.groups[g]; ok {
				rules[id] = r.rules[id]
			}
		}
		for id := range sc.rules {
			if err, ok := r.undecodable["policy-rule/"+id]; ok {
				bad["policy-rule/"+id] = err
			}
		}
		for _, p := range compilePolicies(rules, bad) {
			want.Policies[p.EPGID] = p
		}
	}
	for id := range sc.svcs {
		if err, ok := r.undecodable["service/"+id]; ok {
			bad["service/"+id] = err
		}
		svc, ok := r.svcs[id]
		if !ok {
			continue
		}
		ds, err := serviceOf(svc)
		if err != nil {
			bad["service/"+id] = err
			continue
		}
		want.Services[ds.ID] = ds
	}
	return want, bad
}

// dropScoped removes from bad the errors a scoped pass for sc recomputes (its own
// replace them).
func dropScoped(bad map[string]error, sc scope) {
	for id := range sc.eps {
		delete(bad, "endpoint/"+id)
		delete(bad, "remote-endpoint/"+id)
		delete(bad, "pod-policy/"+id)
	}
	for id := range sc.svcs {
		delete(bad, "service/"+id)
	}
	if sc.pols {
		for k := range bad {
			if k == "policy" || strings.HasPrefix(k, "policy-rule/") {
				delete(bad, k)
			}
		}
	} else {
		for id := range sc.rules {
			delete(bad, "policy-rule/"+id)
		}
	}
}

// keyedErr is an error with the error-map key it is reported under.
type keyedErr struct {
	key string
	err error
}

// endpointOf converts endpoint record id for this host: a local endpoint (attached
// here), a remote one, neither (network or owner's VTEP not known yet, attached here
// but not recorded), or an error. A local endpoint whose pod's bandwidth annotations
// changed to values that do not parse comes with its error: it is reported and applied
// with the pod's last annotations that did parse (LocalEndpoint.PodQoS).
func endpointOf(h hostView, r *records, id string) (*dataplane.Endpoint, *dataplane.RemoteEndpoint, *keyedErr) {
	e := r.eps[id]
	n, ok := r.netsOK[e.NetID]
	if !ok {
		return nil, nil, nil // network not (yet) known: the endpoint follows when it is
	}
	ip, ip6, mac, err := epAddrs(e)
	if err != nil {
		return nil, nil, &keyedErr{"endpoint/" + id, err}
	}
	if e.HomingHost == h.host {
		l, ok := r.local[id]
		if !ok {
			return nil, nil, nil // attached elsewhere or not yet recorded by AttachEndpoint
		}
		qos, err := endpointQoS(r, e, l)
		if err != nil {
			return nil, nil, &keyedErr{"endpoint/" + id, err}
		}
		de := dataplane.Endpoint{
			ID: id, NetworkID: e.NetID, IP: ip, IPv6: ip6, MAC: mac, EPGID: epgID(e),
			HostIfName: l.PortName, NetNS: l.NetNS, IfName: l.IntfName, QoS: qos,
		}
		if err := de.Validate(); err != nil {
			return nil, nil, &keyedErr{"endpoint/" + id, err}
		}
		if err, ok := r.podQoSErr[id]; ok {
			// Kept running with the last valid annotations, never looser than before the
			// change: leaving it out would delete its veth, and a pod owner flipping the
			// value would make the host delete and create it again each time.
			return &de, nil, &keyedErr{"endpoint/" + id, fmt.Errorf("endpoint %s: %w (its last valid bandwidth stays applied)", id, err)}
		}
		return &de, nil, nil
	}
	re := dataplane.RemoteEndpoint{ID: id, NetworkID: e.NetID, IP: ip, MAC: mac, EPGID: epgID(e), Host: e.HomingHost}
	if e.VtepIP != "" {
		v, err := netip.ParseAddr(e.VtepIP)
		if err != nil {
			return nil, nil, &keyedErr{"remote-endpoint/" + id, fmt.Errorf("endpoint %s: vtepIP %q: %w", id, e.VtepIP, err)}
		}
		re.VTEP = v
	} else if v, ok := r.hostVTEPs[e.HomingHost]; ok { // the host's own record first (peers)
		re.VTEP = v
	} else if v, ok := r.vteps.VTEPOf(e.HomingHost); ok {
		re.VTEP = v
	} else if v, ok := r.lastVTEP[e.HomingHost]; ok {
		re.VTEP = v
	} else if n.Encap == dataplane.EncapVXLAN {
		return nil, nil, nil // the owning host has not registered its VTEP yet
	}
	// Checked here so one bad record is reported on its own instead of making the
	// driver refuse a whole Sync.
	if err := re.Validate(n.Encap); err != nil {
		return nil, nil, &keyedErr{"remote-endpoint/" + id, err}
	}
	return nil, &re, nil
}

// endpointQoS is what local endpoint e's traffic is held to: its group's netprofile
// (copied into the group's state record), the pod's last valid bandwidth annotations
// (l.PodQoS), per direction the stricter. A group record whose netprofile values cannot
// be read, or that does not decode at all, fail the endpoint (reported, left out: a limit
// fails closed, the endpoint is never taken for one of a group without a netprofile).
func endpointQoS(r *records, e model.CfgEndpointState, l LocalEndpoint) (dataplane.QoS, error) {
	if err, ok := r.undecodable["endpoint-group/"+e.EndpointGroupKey]; ok && e.EndpointGroupKey != "" {
		return dataplane.QoS{}, fmt.Errorf("endpoint %s: netprofile of group %s unknown: %w", e.ID, e.EndpointGroupKey, err)
	}
	var q dataplane.QoS
	if g, ok := r.epgs[e.EndpointGroupKey]; ok && e.EndpointGroupKey != "" {
		var err error
		if q, err = netprofile.OfGroup(g); err != nil {
			return dataplane.QoS{}, fmt.Errorf("endpoint %s: %w", e.ID, err)
		}
	}
	return netprofile.Stricter(q, l.PodQoS), nil
}

// qosOf is the part of a group record that endpointQoS reads.
type qosOf struct {
	bandwidth   string
	dscp, burst int
}

// setEPG records endpoint group state id (nil: removes it). netmaster rewrites the
// record for every endpoint it adds (epCount, address bitmap): only a change of its
// netprofile values makes the next pass recompute this host's endpoints of the group.
func (r *records) setEPG(id string, v *model.EndpointGroupState) {
	old, had := r.epgs[id]
	if v == nil {
		delete(r.epgs, id)
	} else {
		r.epgs[id] = *v
	}
	changed := had != (v != nil)
	if changed {
		r.namesStale = true // (group names are reserved in the name index: dns.go)
	}
	if had && v != nil {
		changed = qosOf{old.Bandwidth, old.DSCP, old.Burst} != qosOf{v.Bandwidth, v.DSCP, v.Burst}
	}
	if !changed {
		return
	}
	for lid := range r.local {
		if r.eps[lid].EndpointGroupKey == id {
			r.dirty.touchEp(lid)
		}
	}
}

// podPolicyFor converts the NetworkPolicy record of endpoint id; ok is false when the
// endpoint or its network is not known (nothing to isolate). A record that cannot be
// used comes with an error and fails closed (podPolicyOf).
func podPolicyFor(r *records, id string) (dataplane.PodPolicy, bool, error) {
	e, ok := r.eps[id]
	if !ok {
		return dataplane.PodPolicy{}, false, nil
	}
	if _, ok := r.netsOK[e.NetID]; !ok {
		return dataplane.PodPolicy{}, false, nil
	}
	pp, err := podPolicyOf(r.podPols[id], e)
	pp.ID = id // keyed by the record key, as every scoped pass plans it
	return pp, true, err
}

// peers are the live netplugin.vtep registrations of other hosts plus, for hosts whose
// registration is gone (agent down or restarting) but which still own endpoints, their
// durable VTEP record: a peer goes away with its endpoints, not with its agent. A host's
// address is its durable record's when it has one: a registration's value names its host
// and address as its writer likes (etcd RBAC binds a host to its keys, not to what they
// say), the record at HostVTEPKey(host) only that host's agent writes.
func peers(h hostView, r *records) []dataplane.Peer {
	reg := r.vteps.Peers(h.host, h.vtep)
	out := reg[:0]
	have := map[string]bool{}
	for _, p := range reg {
		if v, ok := r.hostVTEPs[p.Host]; ok {
			if h.vtep.IsValid() && v == h.vtep {
				continue
			}
			p.VTEP = v
		}
		out = append(out, p)
		have[p.Host] = true
	}
	added := false
	for host, v := range r.hostVTEPs {
		if host == h.host || have[host] || r.owners[host] == 0 || (h.vtep.IsValid() && v == h.vtep) {
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
	for _, id := range slices.Sorted(maps.Keys(rules)) { // errors name rules in one order
		r := rules[id]
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
