package model

// EndpointOper is one endpoint as shown by inspect commands.
type EndpointOper struct {
	Key              string   `json:"key,omitempty"`
	ContainerID      string   `json:"containerID,omitempty"`
	ContainerName    string   `json:"containerName,omitempty"`
	EndpointGroupId  int      `json:"endpointGroupId,omitempty"`
	EndpointGroupKey string   `json:"endpointGroupKey,omitempty"`
	EndpointID       string   `json:"endpointID,omitempty"`
	HomingHost       string   `json:"homingHost,omitempty"`
	IntfName         string   `json:"intfName,omitempty"`
	IpAddress        []string `json:"ipAddress,omitempty"`
	Labels           string   `json:"labels,omitempty"`
	MacAddress       string   `json:"macAddress,omitempty"`
	Network          string   `json:"network,omitempty"`
	ServiceName      string   `json:"serviceName,omitempty"`
	VirtualPort      string   `json:"virtualPort,omitempty"`
	VtepIP           string   `json:"vtepIP,omitempty"`
}

// NetworkOper is the Oper part of GET /api/v1/inspect/networks/<key>/.
type NetworkOper struct {
	AllocatedAddressesCount int            `json:"allocatedAddressesCount,omitempty"`
	AllocatedIPAddresses    string         `json:"allocatedIPAddresses,omitempty"`
	AvailableIPAddresses    string         `json:"availableIPAddresses,omitempty"`
	Endpoints               []EndpointOper `json:"endpoints,omitempty"`
	ExternalPktTag          int            `json:"externalPktTag,omitempty"`
	NetworkTag              string         `json:"networkTag,omitempty"`
	NumEndpoints            int            `json:"numEndpoints,omitempty"`
	PktTag                  int            `json:"pktTag,omitempty"`
}

// EndpointGroupOper is the Oper part of an EPG inspect.
type EndpointGroupOper struct {
	AllocatedIPAddresses string         `json:"allocatedIPAddresses,omitempty"`
	AvailableIPAddresses string         `json:"availableIPAddresses,omitempty"`
	Endpoints            []EndpointOper `json:"endpoints,omitempty"`
	ExternalPktTag       int            `json:"externalPktTag,omitempty"`
	GroupTag             string         `json:"groupTag,omitempty"`
	NumEndpoints         int            `json:"numEndpoints,omitempty"`
	PktTag               int            `json:"pktTag,omitempty"`
}

// TenantOper is the Oper part of a tenant inspect.
type TenantOper struct {
	EndpointGroups   []EndpointGroupOper `json:"endpointGroups,omitempty"`
	Endpoints        []EndpointOper      `json:"endpoints,omitempty"`
	Networks         []NetworkOper       `json:"networks,omitempty"`
	Policies         []PolicyOper        `json:"policies,omitempty"`
	Servicelbs       []ServiceLBOper     `json:"servicelbs,omitempty"`
	TotalAppProfiles int                 `json:"totalAppProfiles,omitempty"`
	TotalEPGs        int                 `json:"totalEPGs,omitempty"`
	TotalEndpoints   int                 `json:"totalEndpoints,omitempty"`
	TotalNetprofiles int                 `json:"totalNetprofiles,omitempty"`
	TotalNetworks    int                 `json:"totalNetworks,omitempty"`
	TotalPolicies    int                 `json:"totalPolicies,omitempty"`
	TotalServicelbs  int                 `json:"totalServicelbs,omitempty"`
}

// PolicyOper is the Oper part of a policy inspect.
type PolicyOper struct {
	Endpoints        []EndpointOper `json:"endpoints,omitempty"`
	NumEndpoints     int            `json:"numEndpoints,omitempty"`
	PolicyViolations int            `json:"policyViolations,omitempty"`
}

// GlobalOper is the Oper part of the global inspect.
type GlobalOper struct {
	ClusterMode     string `json:"clusterMode,omitempty"`
	DefaultNetwork  string `json:"defaultNetwork,omitempty"`
	FreeVXLANsStart int    `json:"freeVXLANsStart,omitempty"`
	NumNetworks     int    `json:"numNetworks,omitempty"`
	VlansInUse      string `json:"vlansInUse,omitempty"`
	VxlansInUse     string `json:"vxlansInUse,omitempty"`
}

// ServiceLBOper is the Oper part of a serviceLB inspect.
type ServiceLBOper struct {
	NumProviders int            `json:"numProviders,omitempty"`
	Providers    []EndpointOper `json:"providers,omitempty"`
	ServiceVip   string         `json:"serviceVip,omitempty"`
}

// BgpOper is the Oper part of a Bgp inspect.
type BgpOper struct {
	AdminStatus    string   `json:"adminStatus,omitempty"`
	NeighborStatus string   `json:"neighborStatus,omitempty"`
	NumRoutes      int      `json:"numRoutes,omitempty"`
	Routes         []string `json:"routes,omitempty"`
	// This project's extensions: the /32s the host advertises, and why the session is
	// not running (a bad record, a bridge-mode host, a dataplane without native routing).
	AdvertisedRoutes []string `json:"advertisedRoutes,omitempty"`
	Error            string   `json:"error,omitempty"`
}

// AciGwOper is the Oper part of the aciGw inspect.
type AciGwOper struct {
	NumAppProfiles int `json:"numAppProfiles,omitempty"`
}

// Inspect bodies: {"Config": <obj>, "Oper": <oper>} (no json tags, as Contiv).
type (
	TenantInspect struct {
		Config Tenant
		Oper   TenantOper
	}
	NetworkInspect struct {
		Config Network
		Oper   NetworkOper
	}
	EndpointGroupInspect struct {
		Config EndpointGroup
		Oper   EndpointGroupOper
	}
	PolicyInspect struct {
		Config Policy
		Oper   PolicyOper
	}
	GlobalInspect struct {
		Config Global
		Oper   GlobalOper
	}
	ServiceLBInspect struct {
		Config ServiceLB
		Oper   ServiceLBOper
	}
	BgpInspect struct {
		Config Bgp
		Oper   BgpOper
	}
	AciGwInspect struct {
		Config AciGw
		Oper   AciGwOper
	}
	RuleInspect              struct{ Config Rule }
	AppProfileInspect        struct{ Config AppProfile }
	NetprofileInspect        struct{ Config Netprofile }
	ExtContractsGroupInspect struct{ Config ExtContractsGroup }
	EndpointInspect          struct {
		Config Endpoint
		Oper   EndpointOper
	}
)
