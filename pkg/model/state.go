package model

// Fixed keys and prefixes of the records netmaster derives from the model (contiv.md 1.1).
const (
	GlobConfigKey   = "/contiv.io/master/config/global"
	GStateCfgKey    = "/contiv.io/state/global/global"
	GStateOperKey   = "/contiv.io/oper/global/global"
	VlanResCfgKey   = "/contiv.io/state/auto-vlan/global"
	VlanResOperKey  = "/contiv.io/oper/auto-vlan/global"
	VxlanResCfgKey  = "/contiv.io/state/auto-vxlan/global"
	VxlanResOperKey = "/contiv.io/oper/auto-vxlan/global"
	NetStatePrefix  = "/contiv.io/state/nets/"
	EpStatePrefix   = "/contiv.io/state/eps/"
	EpOperPrefix    = "/contiv.io/oper/eps/"
	// BgpOperPrefix + <hostname>: that host's netplugin's BGP session (BgpOper JSON, plus
	// advertisedRoutes and error), written on change; `bgp inspect` shows it as Oper.
	BgpOperPrefix     = "/contiv.io/oper/bgp/"
	EPGStatePrefix    = "/contiv.io/state/endpointGroups/"
	PolicyStatePrefix = "/contiv.io/state/policy/"
	RuleStatePrefix   = "/contiv.io/state/policyRule/"
	SvcLBStatePrefix  = "/contiv.io/state/serviceLB/"
	ProviderPrefix    = "/contiv.io/state/provider/"
	BgpStatePrefix    = "/contiv.io/state/bgp/"
	// K8sPodPolicyPrefix + <endpoint id>: the Kubernetes NetworkPolicy layer of one pod
	// (this project's extension, written by netmaster's leader; docs/kubernetes.md).
	K8sPodPolicyPrefix = "/contiv.io/state/k8sPodPolicy/"
	ModelDBPrefix      = "/contiv.io/obj/modeldb/"
)

// GlobConfig is /contiv.io/master/config/global; agents wait for fwd-mode and pvt-subnet.
type GlobConfig struct {
	ID          string `json:"id"`
	NwInfraType string `json:"nw-infra-type"`
	FwdMode     string `json:"fwd-mode"`
	ArpMode     string `json:"arp-mode"`
	PvtSubnet   string `json:"pvt-subnet"`
	// Encryption is Global.Encryption, which netplugins started without --encryption
	// follow ("": none, as a netmaster before it wrote the record).
	Encryption string `json:"encryption,omitempty"`
}

// AutoRanges is the "auto" part of GStateCfg.
type AutoRanges struct {
	VLANs  string `json:"VLANs"`
	VXLANs string `json:"VXLANs"`
}

// GStateCfg is /contiv.io/state/global/global.
type GStateCfg struct {
	ID   string     `json:"id"`
	Auto AutoRanges `json:"auto"`
}

// GStateOper is /contiv.io/oper/global/global.
type GStateOper struct {
	ID              string `json:"id"`
	DefaultNetwork  string `json:"defaultNetwork"`
	FreeVXLANsStart uint   `json:"freeVXLANsStart"`
}

// VlanResourceCfg is /contiv.io/state/auto-vlan/global: the configured VLAN range as a bitset.
type VlanResourceCfg struct {
	ID    string `json:"id"`
	VLANs Bitset `json:"vlans"`
}

// VlanResourceOper is /contiv.io/oper/auto-vlan/global: bit v set = VLAN v free.
type VlanResourceOper struct {
	ID        string `json:"id"`
	FreeVLANs Bitset `json:"freeVLANs"`
}

// VxlanResourceCfg is /contiv.io/state/auto-vxlan/global. Bit i of VXLANs ↔ VNI FreeVXLANsStart+i.
type VxlanResourceCfg struct {
	ID              string `json:"id"`
	VXLANs          Bitset `json:"vxlans"`
	LocalVLANs      Bitset `json:"LocalVLANs"`
	FreeVXLANsStart uint   `json:"FreeVXLANsStart"`
}

// VxlanResourceOper is /contiv.io/oper/auto-vxlan/global: set bits are free VNIs (offset by
// FreeVXLANsStart) and free host-local VLANs.
type VxlanResourceOper struct {
	ID             string `json:"id"`
	FreeVXLANs     Bitset `json:"freeVXLANs"`
	FreeLocalVLANs Bitset `json:"freeLocalVLANs"`
}

// CfgNetworkState is /contiv.io/state/nets/<net>.<tenant>.
type CfgNetworkState struct {
	ID          string `json:"id"`
	Tenant      string `json:"tenant"`
	NetworkName string `json:"networkName"`
	NwType      string `json:"nwType"`
	PktTagType  string `json:"pktTagType"`
	PktTag      int    `json:"pktTag"`
	ExtPktTag   int    `json:"extPktTag"`
	SubnetIP    string `json:"subnetIP"`
	SubnetLen   uint   `json:"subnetLen"`
	Gateway     string `json:"gateway"`
	IPAddrRange string `json:"ipAddrRange"`
	EpAddrCount int    `json:"epAddrCount"`
	EpCount     int    `json:"epCount"`
	IPAllocMap  Bitset `json:"ipAllocMap"`
	// IPAllocStore is "" for Contiv's inline ipAllocMap, or "chunks/256" when the map is
	// kept under /contiv.io/state/ipalloc/<id>/net/ (netmaster's pkg/master/addrmap.go).
	IPAllocStore  string          `json:"ipAllocStore,omitempty"`
	IPv6Subnet    string          `json:"ipv6SubnetIP"`
	IPv6SubnetLen uint            `json:"ipv6SubnetLen"`
	IPv6Gateway   string          `json:"ipv6Gateway"`
	IPv6AllocMap  map[string]bool `json:"ipv6AllocMap"`
	IPv6LastHost  string          `json:"ipv6LastHost"`
	NetworkTag    string          `json:"networkTag"`
	// NatDisabled mirrors the network's natDisabled (egress NAT off).
	NatDisabled bool `json:"natDisabled,omitempty"`
}

// Owns reports whether this state record is network name of tenant tenant: ids are
// "<net>.<tenant>" and names may contain dots, so two networks could spell the same id
// (netmaster refuses the second; this check guards every lookup by id). Records without
// names (written by other tools) are taken at their id.
func (s *CfgNetworkState) Owns(name, tenant string) bool {
	if s.NetworkName == "" && s.Tenant == "" {
		return true
	}
	return s.NetworkName == name && s.Tenant == tenant
}

// CfgEndpointState is /contiv.io/state/eps/<net>.<tenant>-<endpointID>.
type CfgEndpointState struct {
	ID               string            `json:"id"`
	NetID            string            `json:"netID"`
	EndpointID       string            `json:"endpointID"`
	ServiceName      string            `json:"serviceName"`
	EndpointGroupID  int               `json:"endpointGroupId"`
	EndpointGroupKey string            `json:"endpointGroupKey"`
	IPAddress        string            `json:"ipAddress"`
	IPv6Address      string            `json:"ipv6Address"`
	MacAddress       string            `json:"macAddress"`
	HomingHost       string            `json:"homingHost"`
	IntfName         string            `json:"intfName"`
	VtepIP           string            `json:"vtepIP"`
	Labels           map[string]string `json:"labels"`
	ContainerID      string            `json:"containerId"`
	EPCommonName     string            `json:"epCommonName"`
	// K8sPod: see CreateEndpointRequest.K8sPod.
	K8sPod string `json:"k8sPod,omitempty"`
}

// OperEndpointState is /contiv.io/oper/eps/<id>, written by the owning netplugin.
type OperEndpointState struct {
	ID          string `json:"id"`
	NetID       string `json:"netID"`
	EndpointID  string `json:"endpointID"`
	ServiceName string `json:"serviceName"`
	ContUUID    string `json:"contUUID"`
	IPAddress   string `json:"ipAddress"`
	IPv6Address string `json:"ipv6Address"`
	MacAddress  string `json:"macAddress"`
	HomingHost  string `json:"homingHost"`
	IntfName    string `json:"intfName"`
	PortName    string `json:"portName"`
	VtepIP      string `json:"vtepIP"`
}

// EndpointGroupState is /contiv.io/state/endpointGroups/<group>:<tenant>.
type EndpointGroupState struct {
	ID              string `json:"id"`
	GroupName       string `json:"groupName"`
	TenantName      string `json:"tenantName"`
	NetworkName     string `json:"networkName"`
	EndpointGroupID int    `json:"endpointGroupId"`
	PktTagType      string `json:"pktTagType"`
	PktTag          int    `json:"pktTag"`
	ExtPktTag       int    `json:"extPktTag"`
	EpCount         int    `json:"epCount"`
	DSCP            int    `json:"DSCP"`
	Bandwidth       string `json:"Bandwidth"`
	Burst           int    `json:"Burst"`
	IPPool          string `json:"IPPool"`
	EPGIPAllocMap   Bitset `json:"epgIpAllocMap"`
	// EPGIPAllocStore is "" (inline epgIpAllocMap) or "chunks/256" (kept under
	// /contiv.io/state/ipalloc/<netID>/epg/<id>/).
	EPGIPAllocStore string `json:"epgIpAllocStore,omitempty"`
	GroupTag        string `json:"groupTag"`
}

// OfnetPolicyRule is one directional rule (Go field names in JSON, as ofnet).
type OfnetPolicyRule struct {
	RuleId           string
	Priority         int
	SrcEndpointGroup int
	DstEndpointGroup int
	SrcIpAddr        string
	DstIpAddr        string
	IpProtocol       uint8
	SrcPort          uint16
	DstPort          uint16
	TcpFlags         string
	Action           string
}

// RuleMap ties one model rule to the directional rules it expanded into.
type RuleMap struct {
	Rule       *Rule
	OfnetRules map[string]*OfnetPolicyRule
}

// EpgPolicy is /contiv.io/state/policy/<tenant>:<group>:<tenant>:<policy>.
type EpgPolicy struct {
	ID              string `json:"id"`
	EpgPolicyKey    string
	EndpointGroupID int
	RuleMaps        map[string]*RuleMap
}

// CfgPolicyRule is /contiv.io/state/policyRule/<ruleId>: id plus the ofnet rule fields.
type CfgPolicyRule struct {
	ID string `json:"id"`
	OfnetPolicyRule
}

// Provider is one backend of a service (Go field names in JSON).
type Provider struct {
	IPAddress   string
	ContainerID string
	Labels      map[string]string
	Tenant      string
	Network     string
	Services    []string
	Container   string
	EpIDKey     string
	// Draining (this project's, Kubernetes services): a terminating endpoint that still
	// serves: it keeps its connections and gets no new ones.
	Draining bool `json:"draining,omitempty"`
}

// CfgServiceLBState is /contiv.io/state/serviceLB/<service>:<tenant>.
type CfgServiceLBState struct {
	ID          string               `json:"id"`
	ServiceName string               `json:"servicename"`
	Tenant      string               `json:"tenantname"`
	Network     string               `json:"subnet"`
	Ports       []string             `json:"ports"`
	Selectors   map[string]string    `json:"selectors"`
	IPAddress   string               `json:"ipaddress"`
	Providers   map[string]*Provider `json:"providers"`
	// NodePorts mirrors the service's nodePorts ("nodePort:svcPort:protocol").
	NodePorts []string `json:"nodePorts,omitempty"`
	// SessionAffinity (this project's, Kubernetes services): "ClientIP" sends a client's
	// connections to one provider; "" balances connection by connection.
	SessionAffinity string `json:"sessionAffinity,omitempty"`
}

// SvcProvider is /contiv.io/state/provider/<service>:<tenant>.
type SvcProvider struct {
	ID          string `json:"id"`
	ServiceName string
	Providers   []string
}

// CfgBgpState is /contiv.io/state/bgp/<hostname>.
type CfgBgpState struct {
	ID         string `json:"id"`
	Hostname   string `json:"hostname"`
	RouterIP   string `json:"router-ip"`
	As         string `json:"as"`
	NeighborAs string `json:"neighbor-as"`
	Neighbor   string `json:"neighbor"`
}

// K8sPodPolicy is /contiv.io/state/k8sPodPolicy/<endpoint id>: the NetworkPolicies that
// select one pod, compiled to allow-lists per direction. A pod without a record is
// isolated in neither direction. Agents take the address and network from the endpoint's
// own state record (IPAddress here is for operators).
type K8sPodPolicy struct {
	ID              string       `json:"id"`  // the pod's endpoint id
	Pod             string       `json:"pod"` // <namespace>/<name>
	IPAddress       string       `json:"ipAddress"`
	IngressIsolated bool         `json:"ingressIsolated,omitempty"`
	EgressIsolated  bool         `json:"egressIsolated,omitempty"`
	Ingress         []K8sPodRule `json:"ingress,omitempty"`
	Egress          []K8sPodRule `json:"egress,omitempty"`
	// Policies are the NetworkPolicies (<namespace>/<name>) selecting the pod.
	Policies []string `json:"policies,omitempty"`
}

// K8sPodRule is one allow rule: the other end within Remote (a CIDR), protocol Proto
// (6, 17, 132; 0 = any) and destination ports PortMin..PortMax (0 = any).
type K8sPodRule struct {
	Remote  string `json:"remote"`
	Proto   uint8  `json:"proto,omitempty"`
	PortMin uint16 `json:"portMin,omitempty"`
	PortMax uint16 `json:"portMax,omitempty"`
}
