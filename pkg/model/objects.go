package model

// Link points at another model object ("type" = objType, "key" = its model key).
type Link struct {
	ObjType string `json:"type,omitempty"`
	ObjKey  string `json:"key,omitempty"`
}

// Collection names (the path segment after /api/v1/) and objType names (the modeldb segment).
const (
	TypeTenant            = "tenant"
	TypeNetwork           = "network"
	TypeEndpointGroup     = "endpointGroup"
	TypePolicy            = "policy"
	TypeRule              = "rule"
	TypeAppProfile        = "appProfile"
	TypeServiceLB         = "serviceLB"
	TypeGlobal            = "global"
	TypeNetprofile        = "netprofile"
	TypeBgp               = "Bgp"
	TypeExtContractsGroup = "extContractsGroup"
	TypeAciGw             = "aciGw"
	TypeEndpoint          = "endpoint"

	CollTenants            = "tenants"
	CollNetworks           = "networks"
	CollEndpointGroups     = "endpointGroups"
	CollPolicies           = "policys"
	CollRules              = "rules"
	CollAppProfiles        = "appProfiles"
	CollServiceLBs         = "serviceLBs"
	CollGlobals            = "globals"
	CollNetprofiles        = "netprofiles"
	CollBgps               = "Bgps"
	CollExtContractsGroups = "extContractsGroups"
	CollAciGws             = "aciGws"
	CollEndpoints          = "endpoints"
)

// Tenant is /api/v1/tenants/<tenantName>/.
type Tenant struct {
	Key            string         `json:"key,omitempty"`
	DefaultNetwork string         `json:"defaultNetwork,omitempty"`
	TenantName     string         `json:"tenantName,omitempty"`
	LinkSets       TenantLinkSets `json:"link-sets,omitempty"`
}

// TenantLinkSets lists the objects a tenant owns, keyed by their model keys. netmaster
// stores it empty and fills it when the tenant is read (pkg/master/links.go).
type TenantLinkSets struct {
	AppProfiles    map[string]Link `json:"AppProfiles,omitempty"`
	EndpointGroups map[string]Link `json:"EndpointGroups,omitempty"`
	NetProfiles    map[string]Link `json:"NetProfiles,omitempty"`
	Networks       map[string]Link `json:"Networks,omitempty"`
	Policies       map[string]Link `json:"Policies,omitempty"`
	Servicelbs     map[string]Link `json:"Servicelbs,omitempty"`
	VolumeProfiles map[string]Link `json:"VolumeProfiles,omitempty"`
	Volumes        map[string]Link `json:"Volumes,omitempty"`
}

// Network is /api/v1/networks/<tenant>:<network>/.
type Network struct {
	Key         string `json:"key,omitempty"`
	CfgdTag     string `json:"cfgdTag,omitempty"`
	Encap       string `json:"encap,omitempty"`
	Gateway     string `json:"gateway,omitempty"`
	Ipv6Gateway string `json:"ipv6Gateway,omitempty"`
	Ipv6Subnet  string `json:"ipv6Subnet,omitempty"`
	NetworkName string `json:"networkName,omitempty"`
	NwType      string `json:"nwType,omitempty"`
	PktTag      int    `json:"pktTag,omitempty"`
	Subnet      string `json:"subnet,omitempty"`
	TenantName  string `json:"tenantName,omitempty"`
	// NatDisabled (this project's extension, fixed at creation) turns egress NAT off: the
	// network's endpoints reach only their host and their tenant's networks.
	NatDisabled bool            `json:"natDisabled,omitempty"`
	LinkSets    NetworkLinkSets `json:"link-sets,omitempty"`
	Links       NetworkLinks    `json:"links,omitempty"`
}

// NetworkLinkSets lists the objects attached to a network. EndpointGroups and Servicelbs
// are stored empty and filled when the network is read (pkg/master/links.go).
type NetworkLinkSets struct {
	EndpointGroups map[string]Link `json:"EndpointGroups,omitempty"`
	Servicelbs     map[string]Link `json:"Servicelbs,omitempty"`
	Services       map[string]Link `json:"Services,omitempty"`
}

// NetworkLinks holds the network's owner.
type NetworkLinks struct {
	Tenant Link `json:"Tenant,omitempty"`
}

// EndpointGroup is /api/v1/endpointGroups/<tenant>:<group>/.
type EndpointGroup struct {
	Key              string                `json:"key,omitempty"`
	CfgdTag          string                `json:"cfgdTag,omitempty"`
	ExtContractsGrps []string              `json:"extContractsGrps,omitempty"`
	GroupName        string                `json:"groupName,omitempty"`
	IpPool           string                `json:"ipPool,omitempty"`
	NetProfile       string                `json:"netProfile,omitempty"`
	NetworkName      string                `json:"networkName,omitempty"`
	Policies         []string              `json:"policies,omitempty"`
	TenantName       string                `json:"tenantName,omitempty"`
	LinkSets         EndpointGroupLinkSets `json:"link-sets,omitempty"`
	Links            EndpointGroupLinks    `json:"links,omitempty"`
}

// EndpointGroupLinkSets lists the objects attached to an EPG. MatchRules is stored empty and
// filled when the group is read (pkg/master/links.go).
type EndpointGroupLinkSets struct {
	ExtContractsGrps map[string]Link `json:"ExtContractsGrps,omitempty"`
	MatchRules       map[string]Link `json:"MatchRules,omitempty"`
	Policies         map[string]Link `json:"Policies,omitempty"`
	Services         map[string]Link `json:"Services,omitempty"`
}

// EndpointGroupLinks holds the EPG's single-valued links.
type EndpointGroupLinks struct {
	AppProfile Link `json:"AppProfile,omitempty"`
	NetProfile Link `json:"NetProfile,omitempty"`
	Network    Link `json:"Network,omitempty"`
	Tenant     Link `json:"Tenant,omitempty"`
}

// Policy is /api/v1/policys/<tenant>:<policy>/.
type Policy struct {
	Key        string         `json:"key,omitempty"`
	PolicyName string         `json:"policyName,omitempty"`
	TenantName string         `json:"tenantName,omitempty"`
	LinkSets   PolicyLinkSets `json:"link-sets,omitempty"`
	Links      PolicyLinks    `json:"links,omitempty"`
}

// PolicyLinkSets lists the EPGs using a policy and its rules, stored empty and filled when
// the policy is read (pkg/master/links.go).
type PolicyLinkSets struct {
	EndpointGroups map[string]Link `json:"EndpointGroups,omitempty"`
	Rules          map[string]Link `json:"Rules,omitempty"`
}

// PolicyLinks holds the policy's owner.
type PolicyLinks struct {
	Tenant Link `json:"Tenant,omitempty"`
}

// Rule is /api/v1/rules/<tenant>:<policy>:<ruleId>/.
type Rule struct {
	Key               string       `json:"key,omitempty"`
	Action            string       `json:"action,omitempty"`
	Direction         string       `json:"direction,omitempty"`
	FromEndpointGroup string       `json:"fromEndpointGroup,omitempty"`
	FromIpAddress     string       `json:"fromIpAddress,omitempty"`
	FromNetwork       string       `json:"fromNetwork,omitempty"`
	PolicyName        string       `json:"policyName,omitempty"`
	Port              int          `json:"port,omitempty"`
	Priority          int          `json:"priority,omitempty"`
	Protocol          string       `json:"protocol,omitempty"`
	RuleID            string       `json:"ruleId,omitempty"`
	TenantName        string       `json:"tenantName,omitempty"`
	ToEndpointGroup   string       `json:"toEndpointGroup,omitempty"`
	ToIpAddress       string       `json:"toIpAddress,omitempty"`
	ToNetwork         string       `json:"toNetwork,omitempty"`
	LinkSets          RuleLinkSets `json:"link-sets,omitempty"`
	Links             RuleLinks    `json:"links,omitempty"`
}

// RuleLinkSets lists the policies a rule belongs to.
type RuleLinkSets struct {
	Policies map[string]Link `json:"Policies,omitempty"`
}

// RuleLinks holds the EPG a rule matches.
type RuleLinks struct {
	MatchEndpointGroup Link `json:"MatchEndpointGroup,omitempty"`
}

// AppProfile is /api/v1/appProfiles/<tenant>:<appProfile>/.
type AppProfile struct {
	Key            string             `json:"key,omitempty"`
	AppProfileName string             `json:"appProfileName,omitempty"`
	EndpointGroups []string           `json:"endpointGroups,omitempty"`
	TenantName     string             `json:"tenantName,omitempty"`
	LinkSets       AppProfileLinkSets `json:"link-sets,omitempty"`
	Links          AppProfileLinks    `json:"links,omitempty"`
}

// AppProfileLinkSets lists the EPGs of an app profile.
type AppProfileLinkSets struct {
	EndpointGroups map[string]Link `json:"EndpointGroups,omitempty"`
}

// AppProfileLinks holds the app profile's owner.
type AppProfileLinks struct {
	Tenant Link `json:"Tenant,omitempty"`
}

// ServiceLB is /api/v1/serviceLBs/<tenant>:<service>/.
type ServiceLB struct {
	Key         string   `json:"key,omitempty"`
	IpAddress   string   `json:"ipAddress,omitempty"`
	NetworkName string   `json:"networkName,omitempty"`
	Ports       []string `json:"ports,omitempty"`
	Selectors   []string `json:"selectors,omitempty"`
	ServiceName string   `json:"serviceName,omitempty"`
	TenantName  string   `json:"tenantName,omitempty"`
	// NodePorts (this project's extension): "nodePort:svcPort:protocol" entries; the
	// service's port svcPort/protocol is also reachable on every host's address at
	// nodePort (30000-32767, one service per node port).
	NodePorts []string       `json:"nodePorts,omitempty"`
	Links     ServiceLBLinks `json:"links,omitempty"`
}

// Node ports (ServiceLB.NodePorts) come from Kubernetes' default range. The hosts'
// VXLAN port may not lie in it (netplugin refuses it): the overlay's socket holds it.
const (
	NodePortMin = 30000
	NodePortMax = 32767
)

// ServiceLBLinks holds the service's network and owner.
type ServiceLBLinks struct {
	Network Link `json:"Network,omitempty"`
	Tenant  Link `json:"Tenant,omitempty"`
}

// Global is /api/v1/globals/global/.
type Global struct {
	Key              string `json:"key,omitempty"`
	ArpMode          string `json:"arpMode,omitempty"`
	FwdMode          string `json:"fwdMode,omitempty"`
	Name             string `json:"name,omitempty"`
	NetworkInfraType string `json:"networkInfraType,omitempty"`
	PvtSubnet        string `json:"pvtSubnet,omitempty"`
	Vlans            string `json:"vlans,omitempty"`
	Vxlans           string `json:"vxlans,omitempty"`
	// Encryption is the cluster's encryption between hosts (this project's, issue 38):
	// "none" or "wireguard" (docs/encryption.md). Absent in an update: unchanged (Contiv's
	// netctl reads the object into its own struct, which drops it, and posts it back).
	Encryption string `json:"encryption,omitempty"`
}

// Encryption modes of Global.Encryption and netplugin --encryption.
const (
	EncryptionNone      = "none"
	EncryptionWireGuard = "wireguard"
)

// Netprofile is /api/v1/netprofiles/<tenant>:<profile>/.
type Netprofile struct {
	Key         string             `json:"key,omitempty"`
	DSCP        int                `json:"DSCP,omitempty"`
	Bandwidth   string             `json:"bandwidth,omitempty"`
	Burst       int                `json:"burst,omitempty"`
	ProfileName string             `json:"profileName,omitempty"`
	TenantName  string             `json:"tenantName,omitempty"`
	LinkSets    NetprofileLinkSets `json:"link-sets,omitempty"`
	Links       NetprofileLinks    `json:"links,omitempty"`
}

// NetprofileLinkSets lists the EPGs using a netprofile, stored empty and filled when the
// netprofile is read (pkg/master/links.go).
type NetprofileLinkSets struct {
	EndpointGroups map[string]Link `json:"EndpointGroups,omitempty"`
}

// NetprofileLinks holds the netprofile's owner.
type NetprofileLinks struct {
	Tenant Link `json:"Tenant,omitempty"`
}

// Bgp is /api/v1/Bgps/<hostname>/.
type Bgp struct {
	Key        string `json:"key,omitempty"`
	As         string `json:"as,omitempty"`
	Hostname   string `json:"hostname,omitempty"`
	Neighbor   string `json:"neighbor,omitempty"`
	NeighborAs string `json:"neighbor-as,omitempty"`
	Routerip   string `json:"routerip,omitempty"`
}

// ExtContractsGroup is /api/v1/extContractsGroups/<tenant>:<name>/.
type ExtContractsGroup struct {
	Key                string                    `json:"key,omitempty"`
	Contracts          []string                  `json:"contracts,omitempty"`
	ContractsGroupName string                    `json:"contractsGroupName,omitempty"`
	ContractsType      string                    `json:"contractsType,omitempty"`
	TenantName         string                    `json:"tenantName,omitempty"`
	LinkSets           ExtContractsGroupLinkSets `json:"link-sets,omitempty"`
	Links              ExtContractsGroupLinks    `json:"links,omitempty"`
}

// ExtContractsGroupLinkSets lists the EPGs using the contracts group.
type ExtContractsGroupLinkSets struct {
	EndpointGroups map[string]Link `json:"EndpointGroups,omitempty"`
}

// ExtContractsGroupLinks holds the group's owner.
type ExtContractsGroupLinks struct {
	Tenant Link `json:"Tenant,omitempty"`
}

// AciGw is /api/v1/aciGws/aciGw/.
type AciGw struct {
	Key                 string `json:"key,omitempty"`
	EnforcePolicies     string `json:"enforcePolicies,omitempty"`
	IncludeCommonTenant string `json:"includeCommonTenant,omitempty"`
	Name                string `json:"name,omitempty"`
	NodeBindings        string `json:"nodeBindings,omitempty"`
	PathBindings        string `json:"pathBindings,omitempty"`
	PhysicalDomain      string `json:"physicalDomain,omitempty"`
}

// Endpoint is the (inspect-only) endpoint object.
type Endpoint struct {
	Key string `json:"key,omitempty"`
}
