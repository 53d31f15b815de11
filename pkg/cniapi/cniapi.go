// Package cniapi owns the unix-socket protocol between the contivk8s CNI binary and the
// netplugin agent: Contiv's request/response JSON for POST /ContivCNI.AddPod and
// /ContivCNI.DelPod, a server that dispatches them to a Backend, and a client.
//
// It knows nothing about etcd, netmaster or dataplanes; the agent plugs in as Backend.
package cniapi

// DefaultSocket is where netplugin listens and contivk8s connects (Contiv's path).
const DefaultSocket = "/run/contiv/contiv-cni.sock"

// Request paths (Contiv's names).
const (
	PathAddPod = "/ContivCNI.AddPod"
	PathDelPod = "/ContivCNI.DelPod"
)

// Defaults used when a request carries no tenant/network (Contiv's k8s label defaults).
const (
	DefaultTenant  = "default"
	DefaultNetwork = "default-net"
)

// PodRequest is the body of AddPod and DelPod. The first five fields are Contiv's; the
// CONTIV_* fields are this project's extension: without a Kubernetes API server the pod's
// tenant, network and endpoint group (Contiv's pod labels io.contiv.tenant,
// io.contiv.network, io.contiv.net-group) travel in the request itself. A CNI binary
// takes them from CNI_ARGS ("CONTIV_TENANT=t;CONTIV_NETWORK=n;CONTIV_GROUP=g").
type PodRequest struct {
	Name             string `json:"K8S_POD_NAME,omitempty"`
	Namespace        string `json:"K8S_POD_NAMESPACE,omitempty"`
	InfraContainerID string `json:"K8S_POD_INFRA_CONTAINER_ID,omitempty"`
	NetNS            string `json:"CNI_NETNS,omitempty"`
	IfName           string `json:"CNI_IFNAME,omitempty"`

	Tenant  string `json:"CONTIV_TENANT,omitempty"`  // default "default"
	Network string `json:"CONTIV_NETWORK,omitempty"` // default "default-net"
	Group   string `json:"CONTIV_GROUP,omitempty"`   // endpoint group, "" = none
}

// PodResponse is the reply to both requests (Contiv's field names). Result is 0 on
// success and 1 on failure; failures are sent with HTTP 500 and ErrMsg/ErrInfo set.
// Gateway, MAC and MTU are this project's extension so a CNI binary can report them.
type PodResponse struct {
	Result      uint   `json:"result,omitempty"`
	EndpointID  string `json:"endpointid,omitempty"`
	IPAddress   string `json:"ipaddress,omitempty"`   // "10.1.1.2/24"
	IPv6Address string `json:"ipv6address,omitempty"` // "2001::2/100"
	ErrMsg      string `json:"errmsg,omitempty"`
	ErrInfo     string `json:"errinfo,omitempty"`

	Gateway string `json:"gateway,omitempty"`
	MAC     string `json:"mac,omitempty"`
	MTU     int    `json:"mtu,omitempty"`
	// DNS is the nameserver the endpoint should use (the gateway, when the host's DNS
	// responder runs), "" = none.
	DNS string `json:"dns,omitempty"`
	// HostIfName and HostMAC name the host side of the pod's veth, listed in the CNI result
	// (without a sandbox) so chained plugins such as bandwidth find it.
	HostIfName string `json:"hostifname,omitempty"`
	HostMAC    string `json:"hostmac,omitempty"`
}

// WithDefaults fills tenant, network and interface name when the request left them empty.
func (r PodRequest) WithDefaults() PodRequest {
	if r.Tenant == "" {
		r.Tenant = DefaultTenant
	}
	if r.Network == "" {
		r.Network = DefaultNetwork
	}
	if r.IfName == "" {
		r.IfName = "eth0"
	}
	return r
}
