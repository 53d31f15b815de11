package agent

import (
	"context"

	"github.com/contivbpf/contivbpf/pkg/cniapi"
)

// CNIBackend adapts the agent to the CNI socket protocol (cniapi.Backend): AddPod attaches
// the pod's infra container to CONTIV_TENANT/CONTIV_NETWORK/CONTIV_GROUP (defaults
// default/default-net/none), DelPod detaches it.
func (a *Agent) CNIBackend() cniapi.Backend { return cniBackend{a} }

type cniBackend struct{ a *Agent }

func (b cniBackend) AddPod(ctx context.Context, req cniapi.PodRequest) (cniapi.PodResponse, error) {
	req = req.WithDefaults()
	res, err := b.a.AttachEndpoint(ctx, AttachRequest{
		Tenant: req.Tenant, Network: req.Network, Group: req.Group,
		EndpointID: req.InfraContainerID, Name: req.Name, NetNS: req.NetNS, IfName: req.IfName,
	})
	if err != nil {
		return cniapi.PodResponse{}, err
	}
	resp := cniapi.PodResponse{EndpointID: res.ID, IPAddress: res.IP.String(), MAC: res.MAC, MTU: res.MTU}
	if res.IPv6.IsValid() {
		resp.IPv6Address = res.IPv6.String()
	}
	if res.Gateway.IsValid() {
		resp.Gateway = res.Gateway.String()
	}
	return resp, nil
}

func (b cniBackend) DelPod(ctx context.Context, req cniapi.PodRequest) (cniapi.PodResponse, error) {
	dr := DetachRequest{Tenant: req.Tenant, Network: req.Network, Group: req.Group, EndpointID: req.InfraContainerID}
	if err := b.a.DetachEndpoint(ctx, dr); err != nil {
		return cniapi.PodResponse{}, err
	}
	return cniapi.PodResponse{}, nil
}
