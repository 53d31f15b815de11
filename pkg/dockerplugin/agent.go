package dockerplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"

	"github.com/contivbpf/contivbpf/pkg/agent"
)

// AgentEndpoints adapts the netplugin agent to Endpoints: Docker endpoints are attached
// with an empty NetNS, the container end of the veth staying in the daemon's namespace
// under a name derived from the Docker endpoint id until Docker moves it.
type AgentEndpoints struct{ Agent *agent.Agent }

// ContainerIfName is the temporary host-namespace name of a Docker endpoint's container
// end: "cbc" + 12 hex digits of a hash of the Docker endpoint id.
func ContainerIfName(endpointID string) string {
	h := sha256.Sum256([]byte(endpointID))
	return "cbc" + hex.EncodeToString(h[:6])
}

// AttachEndpoint implements Endpoints.
func (e AgentEndpoints) AttachEndpoint(ctx context.Context, req EndpointRequest) (EndpointInfo, error) {
	ar := agent.AttachRequest{
		Tenant: req.Ref.Tenant, Network: req.Ref.Network, Group: req.Ref.Group,
		EndpointID: req.EndpointID, Name: short(req.EndpointID),
		IfName: ContainerIfName(req.EndpointID),
	}
	if req.IPv4.IsValid() {
		ar.IPAddress = req.IPv4.String()
	}
	res, err := e.Agent.AttachEndpoint(ctx, ar)
	if err != nil {
		return EndpointInfo{}, err
	}
	mac, err := net.ParseMAC(res.MAC)
	if err != nil {
		return EndpointInfo{}, fmt.Errorf("attach %s: agent returned MAC %q: %w", res.ID, res.MAC, err)
	}
	if req.IPv4.IsValid() && res.IP.Addr() != req.IPv4 {
		_ = e.Agent.DetachEndpoint(context.WithoutCancel(ctx), agent.DetachRequest{Tenant: req.Ref.Tenant, Network: req.Ref.Network, Group: req.Ref.Group, EndpointID: req.EndpointID})
		return EndpointInfo{}, fmt.Errorf("attach %s: netmaster recorded %s, docker allocated %s", res.ID, res.IP.Addr(), req.IPv4)
	}
	return EndpointInfo{IfName: res.IfName, MAC: mac}, nil
}

// DetachEndpoint implements Endpoints.
func (e AgentEndpoints) DetachEndpoint(ctx context.Context, req EndpointRequest) error {
	return e.Agent.DetachEndpoint(ctx, agent.DetachRequest{Tenant: req.Ref.Tenant, Network: req.Ref.Network, Group: req.Ref.Group, EndpointID: req.EndpointID})
}
