package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/docker/go-plugins-helpers/ipam"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// requestPool answers with a self-describing pool id: "<net>.<tenant>|<cidr>" (or with the
// group) when the IPAM options name the Contiv network, else the bare CIDR (a network made
// with `docker network create`, adopted into netmaster by the Syncer).
func (p *Plugin) requestPool(ctx context.Context, req *ipam.RequestPoolRequest) (any, error) {
	if req.V6 {
		return nil, errors.New("RequestPool: IPv6 pools are not supported by netplugin IPAM")
	}
	if req.Pool == "" {
		return nil, errors.New("RequestPool: netplugin IPAM needs a subnet (docker network create --subnet)")
	}
	pfx, err := netip.ParsePrefix(req.Pool)
	if err != nil || !pfx.Addr().Is4() {
		return nil, fmt.Errorf("RequestPool: pool %q is not an IPv4 subnet", req.Pool)
	}
	if pfx.Bits() < 8 || pfx.Bits() > 30 {
		return nil, fmt.Errorf("RequestPool: subnet %s: prefix length must be 8..30", pfx)
	}
	pid := poolID{Subnet: pfx.Masked()}
	if name := req.Options[OptNetwork]; name != "" {
		pid.Ref = NetRef{Tenant: req.Options[OptTenant], Network: name, Group: req.Options[OptGroup]}
		if pid.Ref.Tenant == "" {
			pid.Ref.Tenant = "default"
		}
		ns, err := p.netState(ctx, pid.Ref)
		if err != nil {
			return nil, fmt.Errorf("RequestPool: %w", err)
		}
		if sub, err := netip.ParseAddr(ns.SubnetIP); err != nil || netip.PrefixFrom(sub, int(ns.SubnetLen)).Masked() != pid.Subnet {
			return nil, fmt.Errorf("RequestPool: pool %s differs from contiv network %s subnet %s/%d", pfx, pid.Ref.NetworkID(), ns.SubnetIP, ns.SubnetLen)
		}
	}
	return &ipam.RequestPoolResponse{PoolID: pid.String(), Pool: pid.Subnet.String(), Data: map[string]string{}}, nil
}

// allocTarget is the netmaster network id addresses of pool pid come from.
func (p *Plugin) allocTarget(ctx context.Context, pid poolID) (string, model.CfgNetworkState, error) {
	if pid.Ref.Network != "" {
		ns, err := p.netState(ctx, pid.Ref)
		return pid.Ref.allocNetworkID(), ns, err
	}
	ns, err := p.netBySubnet(ctx, pid.Subnet)
	if err != nil {
		return "", ns, err
	}
	return model.NetworkID(ns.NetworkName, ns.Tenant), ns, nil
}

// requestAddress answers gateway requests locally (netmaster reserved the gateway when the
// network was created) and asks netmaster for every other address.
func (p *Plugin) requestAddress(ctx context.Context, req *ipam.RequestAddressRequest) (any, error) {
	pid, err := parsePoolID(req.PoolID)
	if err != nil {
		return nil, fmt.Errorf("RequestAddress: %w", err)
	}
	var pref netip.Addr
	if req.Address != "" {
		if pref, err = netip.ParseAddr(req.Address); err != nil || !pid.Subnet.Contains(pref) {
			return nil, fmt.Errorf("RequestAddress: address %q is not in pool %s", req.Address, pid.Subnet)
		}
	}
	if req.Options["RequestAddressType"] == GatewayRequest {
		gw := pref
		if !gw.IsValid() {
			// The Contiv network's gateway; a network created without one gets its first
			// host address reserved as its gateway (so containers start at .2, and the
			// datapath answers the gateway for ARP, the outside and DNS).
			if netID, ns, err := p.allocTarget(ctx, pid); err == nil && ns.Gateway != "" {
				gw, _ = netip.ParseAddr(ns.Gateway)
			} else if err == nil {
				resp, aerr := p.cfg.Master.AllocAddress(ctx, model.AllocAddressRequest{NetworkID: netID, AddressPool: pid.Subnet.String(), Gateway: true})
				if got, perr := netip.ParsePrefix(resp.IPv4Address); aerr == nil && perr == nil {
					gw = got.Addr()
				} else {
					p.log.Warn("reserve a gateway for the network", "network", netID, "err", errors.Join(aerr, perr))
				}
			}
			if !gw.IsValid() {
				gw = pid.Subnet.Addr().Next()
			}
		}
		p.mu.Lock()
		p.gateways[pid.String()+"/"+gw.String()] = true
		p.mu.Unlock()
		return &ipam.RequestAddressResponse{Address: netip.PrefixFrom(gw, pid.Subnet.Bits()).String(), Data: map[string]string{}}, nil
	}
	netID, _, err := p.allocTarget(ctx, pid)
	if err != nil {
		return nil, fmt.Errorf("RequestAddress: %w", err)
	}
	areq := model.AllocAddressRequest{NetworkID: netID, AddressPool: pid.Subnet.String()}
	if pref.IsValid() {
		areq.PreferredIPv4Address = pref.String()
	}
	resp, err := p.cfg.Master.AllocAddress(ctx, areq)
	if err != nil {
		return nil, fmt.Errorf("RequestAddress: allocate in %s: %w", netID, err)
	}
	got, err := netip.ParsePrefix(resp.IPv4Address)
	if err != nil {
		if a, err2 := netip.ParseAddr(resp.IPv4Address); err2 == nil {
			got = netip.PrefixFrom(a, pid.Subnet.Bits())
		} else {
			return nil, fmt.Errorf("RequestAddress: netmaster returned %q: %w", resp.IPv4Address, err)
		}
	}
	return &ipam.RequestAddressResponse{Address: got.String(), Data: map[string]string{}}, nil
}

// releaseAddress frees an address that never reached an endpoint. Addresses of deleted
// endpoints were already freed by netmaster's deleteEndpoint and are not released twice
// (the address might already belong to a new container); gateways were never allocated.
func (p *Plugin) releaseAddress(ctx context.Context, req *ipam.ReleaseAddressRequest) (any, error) {
	pid, err := parsePoolID(req.PoolID)
	if err != nil {
		return nil, fmt.Errorf("ReleaseAddress: %w", err)
	}
	addr, err := netip.ParseAddr(req.Address)
	if err != nil {
		if pfx, err2 := netip.ParsePrefix(req.Address); err2 == nil {
			addr = pfx.Addr()
		} else {
			return nil, fmt.Errorf("ReleaseAddress: address %q: %w", req.Address, err)
		}
	}
	key := pid.String() + "/" + addr.String()
	p.mu.Lock()
	skip := p.released[key] || p.gateways[key]
	delete(p.released, key)
	delete(p.gateways, key)
	p.mu.Unlock()
	if skip {
		return struct{}{}, nil
	}
	netID, ns, err := p.allocTarget(ctx, pid)
	if err != nil {
		// The network is gone and its addresses with it.
		p.log.Info("release address: network gone, nothing to free", "pool", req.PoolID, "addr", addr, "err", err)
		return struct{}{}, nil
	}
	if ns.Gateway == addr.String() {
		return struct{}{}, nil
	}
	if err := p.cfg.Master.ReleaseAddress(ctx, model.ReleaseAddressRequest{NetworkID: netID, AddressPool: pid.Subnet.String(), IPv4Address: addr.String()}); err != nil {
		return nil, fmt.Errorf("ReleaseAddress: %s in %s: %w", addr, netID, err)
	}
	return struct{}{}, nil
}
