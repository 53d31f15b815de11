// Package dataplane declares the contract between the netplugin agent and a forwarding
// backend (eBPF or OVS): the desired-state objects, the Driver interface, and (in
// conformance/) the scenario suite every backend must pass.
//
// The agent computes desired state from etcd and hands it to a Driver; the driver
// converges the kernel (or OVS) to it. Every call is idempotent, applies fully or leaves
// the previous state, and reports why it failed. Sync replaces the whole state: entries
// not in it are swept, and nothing that is in it is ever removed, so a restarted agent
// can resync without disturbing live traffic.
//
// This package must not know about etcd, REST or Contiv's JSON.
package dataplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Encap is how a network's packets are carried between hosts.
type Encap string

// Encapsulations.
const (
	EncapVLAN  Encap = "vlan"
	EncapVXLAN Encap = "vxlan"
)

// FwdMode is Contiv's forwarding mode.
type FwdMode string

// Forwarding modes.
const (
	FwdBridge  FwdMode = "bridge"
	FwdRouting FwdMode = "routing"
)

// RouterMAC is the MAC Contiv's routing mode answers ARP with for the gateway and remote IPs.
var RouterMAC = net.HardwareAddr{0x00, 0x00, 0x11, 0x11, 0x11, 0x11}

// Network is one tenant network as the dataplane needs it.
type Network struct {
	ID      string       `json:"id"` // "<net>.<tenant>"
	Encap   Encap        `json:"encap"`
	Tag     uint32       `json:"tag"` // VLAN id for vlan networks, VNI for vxlan networks
	Subnet  netip.Prefix `json:"subnet"`
	Gateway netip.Addr   `json:"gateway,omitzero"` // may be invalid (no gateway)
	MTU     int          `json:"mtu"`              // container MTU (1450 on VXLAN over a 1500 underlay, 1500 on VLAN)
	// NoSNAT turns egress NAT off: endpoints reach only the host and the tenant's networks
	// (routing mode with BGP advertises endpoint routes instead).
	NoSNAT bool `json:"noSNAT,omitempty"`
}

// Endpoint is a container interface on this host.
type Endpoint struct {
	ID        string           `json:"id"` // Contiv endpoint id "<net>.<tenant>-<container>"
	NetworkID string           `json:"networkID"`
	IP        netip.Addr       `json:"ip"`
	IPv6      netip.Addr       `json:"ipv6,omitzero"` // optional
	MAC       net.HardwareAddr `json:"mac"`
	EPGID     uint16           `json:"epgID,omitempty"` // endpoint group id, 0 = none

	// HostIfName is the host-side veth name (at most 15 bytes), chosen by the agent.
	HostIfName string `json:"hostIfName"`
	// NetNS is the path of the container's network namespace (e.g. /var/run/netns/x or
	// /proc/PID/ns/net). When set, the driver moves the container end there, names it
	// IfName and configures address, MAC, MTU and routes. When empty (Docker), the container
	// end stays in the host namespace named IfName for the runtime to move; the driver sets
	// its MAC and MTU only.
	NetNS  string `json:"netNS,omitempty"`
	IfName string `json:"ifName"`
	// QoS is what the endpoint's traffic is held to (its group's netprofile, or a pod's
	// bandwidth annotations, the stricter of the two); zero: nothing.
	QoS QoS `json:"qos,omitzero"`
}

// QoS limits an endpoint's traffic and marks its packets. A rate is in bits per second
// (0: unlimited) and its burst in bytes (what may pass at once beyond the rate; 0 with a
// rate: the backend's default, tuned to what its policer needs for TCP to reach the rate). Egress is what the
// endpoint sends, Ingress what it receives. DSCP is the code point (0-63) the endpoint's
// IPv4 packets leave with when SetDSCP, as Contiv's netprofile marks them.
type QoS struct {
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	DSCP         uint8  `json:"dscp,omitempty"`
	SetDSCP      bool   `json:"setDSCP,omitempty"`
}

// IsZero says whether q limits and marks nothing.
func (q QoS) IsZero() bool { return q == QoS{} }

// Validate checks q's ranges.
func (q QoS) Validate() error {
	switch {
	case q.DSCP > 63:
		return fmt.Errorf("qos: dscp %d outside 0-63", q.DSCP)
	case !q.SetDSCP && q.DSCP != 0:
		return fmt.Errorf("qos: dscp %d without setDSCP", q.DSCP)
	case q.EgressBurst != 0 && q.EgressRate == 0:
		return fmt.Errorf("qos: egressBurst without egressRate")
	case q.IngressBurst != 0 && q.IngressRate == 0:
		return fmt.Errorf("qos: ingressBurst without ingressRate")
	}
	return nil
}

// RemoteEndpoint is a container on another host.
type RemoteEndpoint struct {
	ID        string           `json:"id"`
	NetworkID string           `json:"networkID"`
	IP        netip.Addr       `json:"ip"`
	MAC       net.HardwareAddr `json:"mac"`
	EPGID     uint16           `json:"epgID,omitempty"`
	VTEP      netip.Addr       `json:"vtep,omitzero"` // underlay address of the owning host (VXLAN)
	Host      string           `json:"host"`
}

// Peer is another host's VXLAN tunnel endpoint.
type Peer struct {
	Host string     `json:"host"`
	VTEP netip.Addr `json:"vtep"`
}

// PolicyAction is what a rule does with matching traffic.
type PolicyAction string

// Policy actions.
const (
	ActionAllow PolicyAction = "allow"
	ActionDeny  PolicyAction = "deny"
)

// PolicyRule is one compiled rule, already expanded to a direction relative to EPGID.
type PolicyRule struct {
	ID        string       `json:"id"`
	Priority  int          `json:"priority"`            // 1..100, higher wins
	Ingress   bool         `json:"ingress"`             // true: traffic into EPGID; false: traffic out of it
	RemoteEPG uint16       `json:"remoteEPG,omitempty"` // 0 = any group
	Remote    netip.Prefix `json:"remote,omitzero"`     // invalid = any address
	Proto     uint8        `json:"proto,omitempty"`     // 0 = any
	Port      uint16       `json:"port,omitempty"`      // destination port, 0 = any
	SynOnly   bool         `json:"synOnly,omitempty"`   // TCP with port 0 matches connection setup only (syn,!ack)
	Action    PolicyAction `json:"action"`
}

// PolicySet is the complete rule set of one endpoint group.
type PolicySet struct {
	EPGID uint16       `json:"epgID"`
	Rules []PolicyRule `json:"rules"`
}

// PodRule is one allow rule of a Kubernetes NetworkPolicy, compiled for one pod and one
// direction: traffic to (egress) or from (ingress) Remote, with protocol Proto and a
// destination port in PortMin..PortMax. Proto 0 = any protocol (ports must then be 0);
// PortMin 0 = any port.
type PodRule struct {
	Remote  netip.Prefix `json:"remote"` // 0.0.0.0/0 = anywhere
	Proto   uint8        `json:"proto,omitempty"`
	PortMin uint16       `json:"portMin,omitempty"`
	PortMax uint16       `json:"portMax,omitempty"`
}

// PodPolicy is the Kubernetes NetworkPolicy layer of one pod address (docs/kubernetes.md
// "NetworkPolicy"). It is evaluated beside the endpoint-group rules, and both must allow a
// new flow: a pod isolated for a direction accepts only flows one of that direction's
// rules allows, and a flow between two pods needs the sender's egress and the receiver's
// ingress. A pod without a PodPolicy is isolated in neither direction.
type PodPolicy struct {
	ID        string     `json:"id"` // the pod's Contiv endpoint id
	NetworkID string     `json:"networkID"`
	IP        netip.Addr `json:"ip"`
	// IngressIsolated: some NetworkPolicy selects the pod for ingress (then only Ingress
	// rules admit new flows to it); EgressIsolated likewise for flows from it.
	IngressIsolated bool      `json:"ingressIsolated,omitempty"`
	EgressIsolated  bool      `json:"egressIsolated,omitempty"`
	Ingress         []PodRule `json:"ingress,omitempty"`
	Egress          []PodRule `json:"egress,omitempty"`
}

// MaxPodRules is how many rules one pod may have per direction; a PodPolicy with more is
// refused (and the pod fails closed in that direction: nothing is widened).
const MaxPodRules = 1024

// Validate checks what every backend relies on.
func (p PodPolicy) Validate() error {
	switch {
	case p.ID == "":
		return fmt.Errorf("pod policy: id is empty")
	case p.NetworkID == "":
		return fmt.Errorf("pod policy %s: networkID is empty", p.ID)
	case !p.IP.Is4():
		return fmt.Errorf("pod policy %s: ip %v is not IPv4", p.ID, p.IP)
	}
	for dir, rs := range map[string][]PodRule{"ingress": p.Ingress, "egress": p.Egress} {
		if len(rs) > MaxPodRules {
			return fmt.Errorf("pod policy %s: %d %s rules, at most %d", p.ID, len(rs), dir, MaxPodRules)
		}
		for i, r := range rs {
			switch {
			case !r.Remote.IsValid() || !r.Remote.Addr().Is4() || r.Remote.Masked() != r.Remote:
				return fmt.Errorf("pod policy %s %s rule %d: remote %v is not a masked IPv4 prefix", p.ID, dir, i, r.Remote)
			case r.Proto == 0 && (r.PortMin != 0 || r.PortMax != 0):
				return fmt.Errorf("pod policy %s %s rule %d: ports without a protocol", p.ID, dir, i)
			case r.PortMin == 0 && r.PortMax != 0, r.PortMax < r.PortMin:
				return fmt.Errorf("pod policy %s %s rule %d: port range %d-%d", p.ID, dir, i, r.PortMin, r.PortMax)
			}
		}
	}
	return nil
}

// ServicePort maps a service port to the port on the providers.
type ServicePort struct {
	Proto      uint8  `json:"proto"` // 6 or 17
	Port       uint16 `json:"port"`
	TargetPort uint16 `json:"targetPort"`
	// NodePort, if set, makes the port reachable on the host's address at NodePort too.
	NodePort uint16 `json:"nodePort,omitempty"`
}

// Service is a load-balanced VIP and its providers.
type Service struct {
	ID       string        `json:"id"` // "<svc>:<tenant>"
	VIP      netip.Addr    `json:"vip"`
	Ports    []ServicePort `json:"ports"`
	Backends []netip.Addr  `json:"backends"`
	// Draining backends take no new flows but keep the ones they have (Kubernetes'
	// terminating endpoints that still serve).
	Draining []netip.Addr `json:"draining,omitempty"`
	// AffinityClientIP: a client's new flows go to the backend its address hashes to
	// (Kubernetes sessionAffinity ClientIP; stable while the backends are).
	AffinityClientIP bool `json:"affinityClientIP,omitempty"`
}

// Route is a route the host's BGP speaker learned: natively routed packets (routing mode,
// VLAN networks) to Prefix leave the VLAN uplink towards NextHop, an on-link neighbour.
type Route struct {
	Prefix  netip.Prefix `json:"prefix"`
	NextHop netip.Addr   `json:"nextHop"`
}

// NativeRouting is the BGP side of a host's datapath (docs/bgp.md). RouterIP is Contiv's
// router-ip, the address (and on-link prefix) the host holds on its VLAN uplink for its
// BGP session; invalid = BGP off (VLAN networks are 802.1Q-tagged again).
type NativeRouting struct {
	RouterIP netip.Prefix `json:"routerIP,omitzero"`
	Routes   []Route      `json:"routes,omitempty"`
}

// Validate checks that every route is IPv4, masked, and reached through a next hop on
// RouterIP's prefix; routes without a RouterIP are refused.
func (n NativeRouting) Validate() error {
	if !n.RouterIP.IsValid() {
		if len(n.Routes) > 0 {
			return fmt.Errorf("native routing: %d routes without a router-ip", len(n.Routes))
		}
		return nil
	}
	if !n.RouterIP.Addr().Is4() || n.RouterIP.Bits() < 8 || n.RouterIP.Bits() > 30 {
		return fmt.Errorf("native routing: router-ip %v must be IPv4 with a /8../30 prefix", n.RouterIP)
	}
	if n.RouterIP.Masked().Addr() == n.RouterIP.Addr() {
		return fmt.Errorf("native routing: router-ip %v is its network's address", n.RouterIP)
	}
	for _, r := range n.Routes {
		switch {
		case !r.Prefix.IsValid() || !r.Prefix.Addr().Is4() || r.Prefix.Masked() != r.Prefix:
			return fmt.Errorf("native routing: route prefix %v is not a masked IPv4 prefix", r.Prefix)
		case !r.NextHop.Is4() || !n.RouterIP.Contains(r.NextHop) || r.NextHop == n.RouterIP.Addr() ||
			r.NextHop == n.RouterIP.Masked().Addr() || r.NextHop == lastAddr(n.RouterIP):
			return fmt.Errorf("native routing: route %v: next hop %v is not a neighbour on %v", r.Prefix, r.NextHop, n.RouterIP.Masked())
		}
	}
	return nil
}

// lastAddr is the broadcast address of p's network.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(b)
}

// State is the complete desired state of one host, as handed to Sync.
type State struct {
	Networks        []Network
	Endpoints       []Endpoint
	RemoteEndpoints []RemoteEndpoint
	Peers           []Peer
	Policies        []PolicySet
	Services        []Service
	PodPolicies     []PodPolicy
}

// HostConfig is what a driver needs to know about its host at start-up, the same for every
// backend; what only one backend needs is in its own options (ebpf.Options, ovs.Options).
type HostConfig struct {
	Host string // host label
	// NetNS is the path of the network namespace the driver programs ("" = the caller's).
	// Tests and the simulator run several hosts in one process this way; the driver must
	// do every netlink and attach call on a thread inside it.
	NetNS     string
	VTEP      netip.Addr // this host's underlay address (VXLAN source)
	VXLANPort int        // UDP port, default 4789
	VLANIf    string     // uplink for VLAN networks ("" = none)
	FwdMode   FwdMode
	// CTQuota is how many conntrack entries one local endpoint may hold, for the flows it
	// opens and again for those opened toward it; past it such new flows are refused
	// (eBPF: drop_ct_quota; OVS: each tenant's conntrack zone for what its local endpoints
	// open, and its zone for what other hosts open toward them, are each limited to
	// CTQuota times its endpoints on the host). 0 = no quota.
	CTQuota int
}

// Driver converges one host's datapath to the desired state.
type Driver interface {
	// Name is "ebpf" or "ovs".
	Name() string
	// Sync makes the datapath equal to s: upserts everything in it, then sweeps what is
	// not in it. Live entries that are in s are never interrupted.
	Sync(ctx context.Context, s State) error

	UpsertNetwork(ctx context.Context, n Network) error
	DeleteNetwork(ctx context.Context, id string) error
	UpsertEndpoint(ctx context.Context, ep Endpoint) error
	DeleteEndpoint(ctx context.Context, id string) error
	UpsertRemoteEndpoint(ctx context.Context, ep RemoteEndpoint) error
	DeleteRemoteEndpoint(ctx context.Context, id string) error
	UpsertPeer(ctx context.Context, p Peer) error
	DeletePeer(ctx context.Context, host string) error
	UpsertPolicy(ctx context.Context, p PolicySet) error
	DeletePolicy(ctx context.Context, epgID uint16) error
	UpsertService(ctx context.Context, s Service) error
	DeleteService(ctx context.Context, id string) error
	// UpsertPodPolicy replaces the NetworkPolicy layer of one pod; a policy that fails
	// Validate or cannot be installed fails closed (the pod isolated in both directions
	// with no rules) and the error says so.
	UpsertPodPolicy(ctx context.Context, p PodPolicy) error
	DeletePodPolicy(ctx context.Context, id string) error

	// Status reports what is programmed, for the inspect API.
	Status(ctx context.Context) (Status, error)
	// Close releases the driver's handles but leaves the datapath forwarding.
	Close() error
	// Teardown removes everything the driver created on this host.
	Teardown(ctx context.Context) error
}

// Status is a driver's self-report for the inspect API and metrics.
type Status struct {
	Dataplane   string         `json:"dataplane"`
	Attachments []Attachment   `json:"attachments"`
	Tables      map[string]any `json:"tables,omitempty"` // map or flow-table contents, by name
	Counters    map[string]any `json:"counters,omitempty"`
}

// Listing is one datapath table decoded for operators (netplugin's /inspect/bpf/<kind>,
// `netctl bpf <kind>`): addresses, ports, protocols, actions and names instead of raw map
// bytes. Truncated counts rows left out by a limit.
type Listing struct {
	Kind      string     `json:"kind"`
	Columns   []string   `json:"columns"`
	Rows      [][]string `json:"rows"`
	Truncated int        `json:"truncated,omitempty"`
}

// QoSColumns are the columns of both backends' "qos" listing (`netctl bpf qos`): per
// limited endpoint and direction its meter (OVS) or bucket slot (eBPF), rate, burst and
// DSCP as enforced, what passed (OVS only) and what was dropped beyond the rate, in
// packets and bytes.
func QoSColumns() []string {
	return []string{"ENDPOINT", "DIRECTION", "METER", "RATE", "BURST", "DSCP", "PACKETS", "DROPPED", "DROPPED BYTES"}
}

// ListQuery selects what a Listing decodes.
type ListQuery struct {
	Kind  string // the table: one of the backend's listing kinds
	Limit int    // cap on the rows of the conntrack listings (0: 1,000)
	// EPG, when not 0, restricts the policy listing to that endpoint group's rules (the
	// backend then reads only that group's entries).
	EPG uint16
}

// TraceRequest is a packet a local endpoint would send, for a trace through the live
// datapath (nothing is sent, no state changes).
type TraceRequest struct {
	From    string     `json:"from"`  // local endpoint id
	Dst     netip.Addr `json:"dst"`   // destination address (an endpoint, a VIP, anything)
	Proto   uint8      `json:"proto"` // 6, 17 or 1
	DstPort uint16     `json:"dstPort,omitempty"`
	SrcPort uint16     `json:"srcPort,omitempty"` // 0: an ephemeral port
}

// TraceStage is what one part of the datapath decided for a traced packet.
type TraceStage struct {
	Name   string `json:"name"` // source, service, policy, conntrack, forward, verdict
	Detail string `json:"detail"`
}

// TraceTunnel is where a traced packet would leave encapsulated, with the inner frame the
// destination host would receive.
type TraceTunnel struct {
	Source netip.Addr `json:"source"` // the sending host's VTEP
	VTEP   netip.Addr `json:"vtep"`   // the receiving host's
	VNI    uint32     `json:"vni"`
	Inner  []byte     `json:"inner"`
}

// TraceResult is a trace's outcome: the verdict (dropped with a reason, delivered
// locally, tunneled), the deciding rule of a policy drop, and the stages in order.
type TraceResult struct {
	Host    string       `json:"host"`
	Packet  string       `json:"packet"`
	Verdict string       `json:"verdict"`
	Reason  string       `json:"reason"`
	Rule    string       `json:"rule,omitempty"`
	Stages  []TraceStage `json:"stages"`
	Tunnel  *TraceTunnel `json:"tunnel,omitempty"`
}

// Drift is one difference between what the agent applied and what the datapath holds:
// Kind is "missing" (should be there, is not), "extra" (is there, nothing implies it) or
// "different" (both, with other content). Table is the map or flow table.
type Drift struct {
	Table  string `json:"table"`
	Object string `json:"object"`
	Kind   string `json:"kind"`
	Detail string `json:"detail,omitempty"`
}

// MonitorEvent is one packet the datapath dropped, as a driver reports it to a monitor
// (netplugin's /monitor, `netctl monitor`). Rule* are set for a policy drop decided by a
// rule: the group whose rules held it, the direction and the rule id as installed.
type MonitorEvent struct {
	Time      time.Time  `json:"time"`
	Reason    string     `json:"reason"`
	Ifindex   uint32     `json:"ifindex"`
	Len       uint32     `json:"len"`
	EtherType uint16     `json:"etherType"`
	Proto     uint8      `json:"proto,omitempty"`
	Src       netip.Addr `json:"src,omitzero"`
	Dst       netip.Addr `json:"dst,omitzero"`
	SrcPort   uint16     `json:"srcPort,omitempty"`
	DstPort   uint16     `json:"dstPort,omitempty"`
	RuleEPG   uint16     `json:"ruleEPG,omitempty"`
	RuleDir   string     `json:"ruleDir,omitempty"`
	Rule      string     `json:"rule,omitempty"`
	// Network is the network of the local endpoint whose interface the packet came in
	// on ("" for the tunnel or an uplink).
	Network string `json:"network,omitempty"`
	// Count, when set, says the event stands for Count packets of Bytes bytes in all,
	// dropped since the previous such event, known from a counter rather than a copy of
	// a packet (OVS meters: drop_rate_egress / drop_rate_ingress, the endpoint's address
	// as Src or Dst, nothing else of the packets known). 0: one packet of Len bytes.
	Count uint64 `json:"count,omitempty"`
	Bytes uint64 `json:"bytes,omitempty"`
}

// Attachment is one program or port the driver owns.
type Attachment struct {
	Interface string `json:"interface"`
	Hook      string `json:"hook"` // e.g. "tcx-ingress", "ovs-port"
	Program   string `json:"program,omitempty"`
	ID        uint32 `json:"id,omitempty"`
}

// ContivMAC returns Contiv's endpoint MAC for an IPv4 address: 02:02:<ip bytes>.
func ContivMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x02, 0x02, b[0], b[1], b[2], b[3]}
}

// Validate checks the fields every backend relies on.
func (ep Endpoint) Validate() error {
	switch {
	case ep.ID == "":
		return fmt.Errorf("endpoint: id is empty")
	case ep.NetworkID == "":
		return fmt.Errorf("endpoint %s: networkID is empty", ep.ID)
	case !ep.IP.Is4():
		return fmt.Errorf("endpoint %s: ip %v is not IPv4", ep.ID, ep.IP)
	case len(ep.MAC) != 6:
		return fmt.Errorf("endpoint %s: mac %v is not 6 bytes", ep.ID, ep.MAC)
	case ep.HostIfName == "" || len(ep.HostIfName) > 15:
		return fmt.Errorf("endpoint %s: hostIfName %q must be 1-15 bytes", ep.ID, ep.HostIfName)
	case ep.IfName == "" || len(ep.IfName) > 15:
		return fmt.Errorf("endpoint %s: ifName %q must be 1-15 bytes", ep.ID, ep.IfName)
	}
	if err := ep.QoS.Validate(); err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	return nil
}

// Validate checks a remote endpoint for a network with the given encapsulation. A VXLAN
// remote needs its owning host's VTEP (an IPv4 unicast address); a VLAN remote may have
// none (a VTEP it does have must be IPv4).
func (ep RemoteEndpoint) Validate(encap Encap) error {
	switch {
	case ep.ID == "":
		return fmt.Errorf("remote endpoint: id is empty")
	case ep.NetworkID == "":
		return fmt.Errorf("remote endpoint %s: networkID is empty", ep.ID)
	case !ep.IP.Is4():
		return fmt.Errorf("remote endpoint %s: ip %v is not IPv4", ep.ID, ep.IP)
	case len(ep.MAC) != 6:
		return fmt.Errorf("remote endpoint %s: mac %v is not 6 bytes", ep.ID, ep.MAC)
	case encap == EncapVXLAN && !ep.VTEP.IsValid():
		return fmt.Errorf("remote endpoint %s: vtep is missing (required on vxlan network %s)", ep.ID, ep.NetworkID)
	case ep.VTEP.IsValid() && (!ep.VTEP.Is4() || ep.VTEP.IsUnspecified() || ep.VTEP.IsMulticast()):
		return fmt.Errorf("remote endpoint %s: vtep %v is not an IPv4 unicast address", ep.ID, ep.VTEP)
	}
	return nil
}

// Validate checks a group's rule set. Both backends refuse a set that fails it as a whole
// (nothing of it installed, the group's earlier set stays), so a bad rule never widens
// access. Capacity is the backend's own check.
func (p PolicySet) Validate() error {
	if p.EPGID == 0 {
		return fmt.Errorf("policy: epgID is 0")
	}
	for _, r := range p.Rules {
		switch {
		case r.Priority < 1 || r.Priority > 100:
			return fmt.Errorf("policy %d rule %s: priority %d out of 1-100", p.EPGID, r.ID, r.Priority)
		case r.Action != ActionAllow && r.Action != ActionDeny:
			return fmt.Errorf("policy %d rule %s: action %q must be allow or deny", p.EPGID, r.ID, r.Action)
		case r.Remote.IsValid() && !r.Remote.Addr().Is4():
			return fmt.Errorf("policy %d rule %s: remote %v is not IPv4", p.EPGID, r.ID, r.Remote)
		}
	}
	return nil
}

// ServiceTenant is the tenant of a service id "<name>:<tenant>".
func ServiceTenant(id string) (string, error) {
	i := strings.LastIndexByte(id, ':')
	if i <= 0 || i == len(id)-1 {
		return "", fmt.Errorf("service %q: id must be <name>:<tenant>", id)
	}
	return id[i+1:], nil
}

// Validate checks a service: id with its tenant, an IPv4 VIP, TCP or UDP ports (each node
// port once), IPv4 backends. Whether its backends are known and its VIP:port and node
// ports free are the backend's checks.
func (s Service) Validate() error {
	if _, err := ServiceTenant(s.ID); err != nil {
		return err
	}
	switch {
	case !s.VIP.Is4():
		return fmt.Errorf("service %s: vip %v is not IPv4", s.ID, s.VIP)
	case len(s.Ports) == 0:
		return fmt.Errorf("service %s: no ports", s.ID)
	}
	nodePorts := map[[2]uint16]bool{}
	for _, p := range s.Ports {
		switch {
		case p.Proto != 6 && p.Proto != 17:
			return fmt.Errorf("service %s: port %d proto %d must be 6 (tcp) or 17 (udp)", s.ID, p.Port, p.Proto)
		case p.Port == 0:
			return fmt.Errorf("service %s: port is 0", s.ID)
		case p.NodePort != 0 && nodePorts[[2]uint16{p.NodePort, uint16(p.Proto)}]:
			return fmt.Errorf("service %s: node port %d/%d listed twice", s.ID, p.NodePort, p.Proto)
		}
		if p.NodePort != 0 {
			nodePorts[[2]uint16{p.NodePort, uint16(p.Proto)}] = true
		}
	}
	for _, b := range append(slices.Clone(s.Backends), s.Draining...) {
		if !b.Is4() {
			return fmt.Errorf("service %s: backend %v is not IPv4", s.ID, b)
		}
	}
	return nil
}

// Validate checks a network definition.
func (n Network) Validate() error {
	switch {
	case n.ID == "":
		return fmt.Errorf("network: id is empty")
	case n.Encap != EncapVLAN && n.Encap != EncapVXLAN:
		return fmt.Errorf("network %s: encap %q must be vlan or vxlan", n.ID, n.Encap)
	case n.Encap == EncapVLAN && (n.Tag == 0 || n.Tag > 4094):
		return fmt.Errorf("network %s: vlan tag %d out of 1-4094", n.ID, n.Tag)
	case n.Encap == EncapVXLAN && (n.Tag == 0 || n.Tag > 1<<24-1):
		return fmt.Errorf("network %s: vni %d out of 1-16777215", n.ID, n.Tag)
	case !n.Subnet.IsValid():
		return fmt.Errorf("network %s: subnet is invalid", n.ID)
	case n.Gateway.IsValid() && !n.Subnet.Contains(n.Gateway):
		return fmt.Errorf("network %s: gateway %v outside subnet %v", n.ID, n.Gateway, n.Subnet)
	case n.MTU != 0 && (n.MTU < 576 || n.MTU > 9000):
		return fmt.Errorf("network %s: mtu %d out of 576-9000", n.ID, n.MTU)
	}
	return nil
}

// macJSON is a MAC in JSON: "02:02:0a:01:01:02" (net.HardwareAddr alone would be base64),
// "" for none.
type macJSON string

func (m macJSON) hw() (net.HardwareAddr, error) {
	if m == "" {
		return nil, nil
	}
	return net.ParseMAC(string(m))
}

func macText(hw net.HardwareAddr) macJSON {
	if len(hw) == 0 {
		return ""
	}
	return macJSON(hw.String())
}

// MarshalJSON writes the endpoint with lowerCamel names and its MAC as text.
func (ep Endpoint) MarshalJSON() ([]byte, error) {
	type plain Endpoint
	return json.Marshal(struct {
		plain
		MAC macJSON `json:"mac"`
	}{plain(ep), macText(ep.MAC)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (ep *Endpoint) UnmarshalJSON(b []byte) error {
	type plain Endpoint
	var v struct {
		plain
		MAC macJSON `json:"mac"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	mac, err := v.MAC.hw()
	if err != nil {
		return fmt.Errorf("endpoint %s: mac: %w", v.ID, err)
	}
	*ep = Endpoint(v.plain)
	ep.MAC = mac
	return nil
}

// MarshalJSON writes the remote endpoint with lowerCamel names and its MAC as text.
func (ep RemoteEndpoint) MarshalJSON() ([]byte, error) {
	type plain RemoteEndpoint
	return json.Marshal(struct {
		plain
		MAC macJSON `json:"mac"`
	}{plain(ep), macText(ep.MAC)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (ep *RemoteEndpoint) UnmarshalJSON(b []byte) error {
	type plain RemoteEndpoint
	var v struct {
		plain
		MAC macJSON `json:"mac"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	mac, err := v.MAC.hw()
	if err != nil {
		return fmt.Errorf("remote endpoint %s: mac: %w", v.ID, err)
	}
	*ep = RemoteEndpoint(v.plain)
	ep.MAC = mac
	return nil
}
