package model

// Bodies of netmaster's /plugin/* endpoints and /version. Like Contiv they carry no json
// tags: the JSON keys are the Go field names.

import "github.com/contivbpf/contivbpf/pkg/dataplane"

// AllocAddressRequest is POST /plugin/allocAddress.
type AllocAddressRequest struct {
	AddressPool          string
	NetworkID            string
	PreferredIPv4Address string
	// Gateway (this project's extension, for Docker's gateway request): the network's
	// gateway is returned; a network without one gets the address (preferred, else its
	// first host address) reserved and recorded as its gateway in the network state.
	Gateway bool `json:"Gateway,omitempty"`
}

// AllocAddressResponse answers allocAddress; IPv4Address is "a.b.c.d/len".
type AllocAddressResponse struct {
	NetworkID   string
	IPv4Address string
}

// ReleaseAddressRequest is POST /plugin/releaseAddress.
type ReleaseAddressRequest struct {
	AddressPool string
	NetworkID   string
	IPv4Address string
}

// ConfigEP is the endpoint part of CreateEndpointRequest.
type ConfigEP struct {
	Container   string
	Host        string
	IPAddress   string
	IPv6Address string
	ServiceName string
}

// CreateEndpointRequest is POST /plugin/createEndpoint.
type CreateEndpointRequest struct {
	TenantName   string
	NetworkName  string
	ServiceName  string
	EndpointID   string
	EPCommonName string
	ConfigEP     ConfigEP
	// K8sPod is "<namespace>/<name>" of the Kubernetes pod this endpoint serves, set by an
	// agent that found the pod in the API (this project's extension): Kubernetes Services
	// accept an endpoint as a backend only for that pod, in the Service's namespace.
	K8sPod string `json:",omitempty"`
}

// CreateEndpointResponse answers createEndpoint.
type CreateEndpointResponse struct {
	EndpointConfig CfgEndpointState
}

// DeleteEndpointRequest is POST /plugin/deleteEndpoint.
type DeleteEndpointRequest struct {
	TenantName  string
	NetworkName string
	ServiceName string
	EndpointID  string
	IPv4Address string
}

// LocalEndpointRecord is an agent's record of an endpoint it attached, stored at
// /contiv.io/oper/eps/<id> (POST /plugin/recordEndpoint). Contiv's OperEndpointState fields
// keep their meaning (intfName = container interface, portName = host-side veth); the rest
// is this project's extension so a restarted agent can find the container again.
type LocalEndpointRecord struct {
	OperEndpointState
	NetNS   string `json:"netNS,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	Network string `json:"network,omitempty"`
	Group   string `json:"group,omitempty"`
	// PodQoS is what the pod's kubernetes.io/{ingress,egress}-bandwidth annotations
	// asked for when it was attached; the endpoint gets the stricter of it and its
	// group's netprofile (the agent's endpointQoS).
	PodQoS dataplane.QoS `json:"podQoS,omitzero"`
}

// ForgetEndpointRequest is POST /plugin/forgetEndpoint: remove the record of endpoint ID
// (/contiv.io/oper/eps/<ID>).
type ForgetEndpointRequest struct {
	ID string
}

// EtcdRegistration names a service registration key an agent writes
// (/contiv.io/service/<ServiceName>/<HostAddr>:<Port>).
type EtcdRegistration struct {
	ServiceName string
	HostAddr    string
	Port        int
}

// EtcdAccessRequest is POST /plugin/etcdAccess: an agent bound to its host asks for
// write access to its registration keys (with etcd RBAC on).
type EtcdAccessRequest struct {
	Registrations []EtcdRegistration
}

// EtcdAccessResponse answers etcdAccess: Managed is false when netmaster does not manage
// etcd's users (RBAC off or an external etcd); User is the agent's etcd user otherwise.
type EtcdAccessResponse struct {
	Managed bool
	User    string `json:",omitempty"`
}

// DeleteEndpointResponse answers deleteEndpoint with the removed endpoint.
type DeleteEndpointResponse struct {
	EndpointConfig CfgEndpointState
}

// UpdateEndpointRequest is POST /plugin/updateEndpoint (container start/die → service providers).
type UpdateEndpointRequest struct {
	IPAddress    string
	ContainerID  string
	Labels       map[string]string
	Tenant       string
	Network      string
	Event        string
	EndpointID   string
	EPCommonName string
}

// UpdateEndpointResponse answers updateEndpoint.
type UpdateEndpointResponse struct {
	IPAddress string
}

// AgentInfo is one entry of netmaster's GET /agents: a host's netplugin inspect API.
type AgentInfo struct {
	Host string `json:"host"`
	URL  string `json:"url"`
}

// VersionInfo is GET /version.
type VersionInfo struct {
	GitCommit string
	Version   string
	BuildTime string
}
