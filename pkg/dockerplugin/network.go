package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/docker/go-plugins-helpers/network"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// createNetwork records the network's identity. Networks made by the Syncer carry the
// Contiv names in their driver options; others (docker network create) are known by subnet
// until the Syncer has created them in netmaster.
func (p *Plugin) createNetwork(ctx context.Context, req *network.CreateNetworkRequest) (any, error) {
	if req.NetworkID == "" {
		return nil, errors.New("CreateNetwork: NetworkID is empty")
	}
	if len(req.IPv4Data) == 0 || req.IPv4Data[0] == nil || req.IPv4Data[0].Pool == "" {
		return nil, errors.New("CreateNetwork: no IPv4 pool: create the network with --ipam-driver netplugin --subnet <cidr>")
	}
	pfx, err := netip.ParsePrefix(req.IPv4Data[0].Pool)
	if err != nil || !pfx.Addr().Is4() {
		return nil, fmt.Errorf("CreateNetwork: pool %q is not an IPv4 subnet", req.IPv4Data[0].Pool)
	}
	n := dockerNet{Subnet: pfx.Masked()}
	if gw := req.IPv4Data[0].Gateway; gw != "" {
		if g, err := netip.ParsePrefix(gw); err == nil {
			n.Gateway = g.Addr()
		} else if a, err := netip.ParseAddr(gw); err == nil {
			n.Gateway = a
		}
	}
	if opts, ok := req.Options[genericOpts].(map[string]any); ok {
		str := func(k string) string { s, _ := opts[k].(string); return s }
		if str(OptNetwork) != "" {
			n.Ref = NetRef{Tenant: str(OptTenant), Network: str(OptNetwork), Group: str(OptGroup)}
			if n.Ref.Tenant == "" {
				n.Ref.Tenant = "default"
			}
			if _, err := p.netState(ctx, n.Ref); err != nil {
				return nil, fmt.Errorf("CreateNetwork: %w", err)
			}
		}
	}
	p.mu.Lock()
	p.nets[req.NetworkID] = n
	p.mu.Unlock()
	p.notify()
	return struct{}{}, nil
}

func (p *Plugin) deleteNetwork(_ context.Context, req *network.DeleteNetworkRequest) (any, error) {
	p.mu.Lock()
	delete(p.nets, req.NetworkID)
	p.mu.Unlock()
	p.notify()
	return struct{}{}, nil
}

func (p *Plugin) notify() {
	if p.cfg.NetworksChanged != nil {
		p.cfg.NetworksChanged()
	}
}

// createEndpoint registers the endpoint with netmaster and plumbs it through the agent.
// Docker sets the address itself; the driver answers the Contiv MAC unless Docker chose one.
func (p *Plugin) createEndpoint(ctx context.Context, req *network.CreateEndpointRequest) (any, error) {
	if req.EndpointID == "" {
		return nil, errors.New("CreateEndpoint: EndpointID is empty")
	}
	if req.Interface == nil || req.Interface.Address == "" {
		return nil, errors.New("CreateEndpoint: no IPv4 address from IPAM (use --ipam-driver netplugin)")
	}
	n, err := p.network(ctx, req.NetworkID)
	if err != nil {
		return nil, fmt.Errorf("CreateEndpoint: %w", err)
	}
	addr, err := netip.ParsePrefix(req.Interface.Address)
	if err != nil {
		return nil, fmt.Errorf("CreateEndpoint: address %q: %w", req.Interface.Address, err)
	}
	ereq := EndpointRequest{Ref: n.Ref, EndpointID: req.EndpointID, IPv4: addr.Addr()}
	if req.Interface.AddressIPv6 != "" {
		if a6, err := netip.ParsePrefix(req.Interface.AddressIPv6); err == nil {
			ereq.IPv6 = a6.Addr()
		}
	}
	info, err := p.cfg.Endpoints.AttachEndpoint(ctx, ereq)
	if err != nil {
		return nil, fmt.Errorf("CreateEndpoint %s on %s: %w", short(req.EndpointID), n.Ref.NetworkID(), err)
	}
	p.mu.Lock()
	p.eps[req.EndpointID] = endpoint{NetworkID: req.NetworkID, Ref: n.Ref, IP: addr.Addr(), IfName: info.IfName}
	p.mu.Unlock()
	resp := &network.CreateEndpointResponse{}
	if req.Interface.MacAddress == "" {
		mac := info.MAC.String()
		if len(info.MAC) == 0 {
			mac, _ = model.MACFromIPv4(addr.Addr().String())
		}
		resp.Interface = &network.EndpointInterface{MacAddress: mac}
	}
	return resp, nil
}

// join hands Docker the container end of the veth and the network gateway, and tells it
// not to add docker_gwbridge: the datapath gives the container the host and the outside
// through its gateway (docs/host-routing.md), as Contiv did with networks without one.
func (p *Plugin) join(ctx context.Context, req *network.JoinRequest) (any, error) {
	p.mu.Lock()
	ep, ok := p.eps[req.EndpointID]
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("Join: unknown endpoint %s", short(req.EndpointID))
	}
	resp := &network.JoinResponse{InterfaceName: network.InterfaceName{SrcName: ep.IfName, DstPrefix: "eth"}}
	ns, err := p.netState(ctx, NetRef{Tenant: ep.Ref.Tenant, Network: ep.Ref.Network})
	if err != nil {
		return nil, fmt.Errorf("Join: %w", err)
	}
	resp.Gateway = ns.Gateway
	resp.GatewayIPv6 = ns.IPv6Gateway
	resp.DisableGatewayService = true
	go p.announceContainer(ep.NetworkID, req.EndpointID, ep)
	return resp, nil
}

// deleteEndpoint detaches the endpoint (netmaster frees its address with it).
func (p *Plugin) deleteEndpoint(ctx context.Context, req *network.DeleteEndpointRequest) (any, error) {
	p.stopAnnouncing(req.EndpointID)
	p.mu.Lock()
	ep, ok := p.eps[req.EndpointID]
	p.mu.Unlock()
	if !ok {
		// Restarted plugin: rebuild from the network identity and netmaster's endpoint state.
		n, err := p.network(ctx, req.NetworkID)
		if err != nil {
			return nil, fmt.Errorf("DeleteEndpoint: %w", err)
		}
		ep = endpoint{NetworkID: req.NetworkID, Ref: n.Ref}
		var es model.CfgEndpointState
		if err := p.cfg.Store.Get(ctx, model.EpStateKey(model.EndpointStateID(n.Ref.Network, n.Ref.Tenant, req.EndpointID)), &es); err == nil {
			ep.IP, _ = netip.ParseAddr(es.IPAddress)
		}
	}
	if err := p.cfg.Endpoints.DetachEndpoint(ctx, EndpointRequest{Ref: ep.Ref, EndpointID: req.EndpointID, IPv4: ep.IP}); err != nil {
		return nil, fmt.Errorf("DeleteEndpoint %s: %w", short(req.EndpointID), err)
	}
	p.mu.Lock()
	delete(p.eps, req.EndpointID)
	if ep.IP.IsValid() {
		if n, ok := p.nets[ep.NetworkID]; ok {
			for _, pid := range poolIDsOf(n) {
				p.released[pid+"/"+ep.IP.String()] = true
			}
		}
	}
	p.mu.Unlock()
	return struct{}{}, nil
}

// poolIDsOf lists the pool ids Docker may use for network n (by name and by subnet).
func poolIDsOf(n dockerNet) []string {
	out := []string{poolID{Subnet: n.Subnet}.String()}
	if n.Ref.Network != "" {
		out = append(out, poolID{Ref: n.Ref, Subnet: n.Subnet}.String())
	}
	return out
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
