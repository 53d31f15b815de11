package dockerplugin

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// NetRef names a Contiv network, optionally narrowed to an endpoint group.
type NetRef struct {
	Tenant  string
	Network string
	Group   string // endpoint group, "" = none
}

// NetworkID is Contiv's "<net>.<tenant>".
func (r NetRef) NetworkID() string { return model.NetworkID(r.Network, r.Tenant) }

// allocNetworkID is the NetworkID netmaster's allocAddress expects: "<net>.<tenant>" or
// "<net>:<group>.<tenant>" when the address comes from an endpoint group's pool.
func (r NetRef) allocNetworkID() string {
	if r.Group != "" {
		return r.Network + ":" + r.Group + "." + r.Tenant
	}
	return r.NetworkID()
}

// DockerNetworkName is Contiv's Docker network name: the group name when the network is for
// an endpoint group, else the network name, with "/<tenant>" appended unless the tenant is
// "default" (contiv-net, web, contiv-net/blue, web/blue).
func (r NetRef) DockerNetworkName() string {
	name := r.Network
	if r.Group != "" {
		name = r.Group
	}
	if r.Tenant != "" && r.Tenant != "default" {
		name += "/" + r.Tenant
	}
	return name
}

// ParseDockerNetworkName reads Contiv's "[<group>.]<net>[/<tenant>]" form (tenant defaults
// to "default").
func ParseDockerNetworkName(name string) (NetRef, error) {
	if name == "" {
		return NetRef{}, fmt.Errorf("docker network name is empty")
	}
	r := NetRef{Tenant: "default"}
	if i := strings.LastIndex(name, "/"); i >= 0 {
		r.Tenant = name[i+1:]
		name = name[:i]
	}
	if i := strings.Index(name, "."); i >= 0 {
		r.Group, name = name[:i], name[i+1:]
	}
	r.Network = name
	if r.Network == "" || r.Tenant == "" {
		return NetRef{}, fmt.Errorf("docker network name %q: want [<group>.]<network>[/<tenant>]", name)
	}
	return r, nil
}

// Pool ids are self-describing so a restarted plugin needs no replay from Docker:
//
//	<net>.<tenant>|<cidr>            network pool
//	<net>:<group>.<tenant>|<cidr>    endpoint group pool
//	<cidr>                           network known only by its subnet (docker-created)
type poolID struct {
	Ref    NetRef // zero when the pool is known only by subnet
	Subnet netip.Prefix
}

func (p poolID) String() string {
	if p.Ref.Network == "" {
		return p.Subnet.String()
	}
	return p.Ref.allocNetworkID() + "|" + p.Subnet.String()
}

func parsePoolID(s string) (poolID, error) {
	var p poolID
	cidr := s
	if i := strings.LastIndex(s, "|"); i >= 0 {
		id := s[:i]
		cidr = s[i+1:]
		dot := strings.LastIndex(id, ".")
		if dot <= 0 || dot == len(id)-1 {
			return p, fmt.Errorf("pool id %q: network part %q is not <net>[:<group>].<tenant>", s, id)
		}
		p.Ref.Tenant = id[dot+1:]
		p.Ref.Network = id[:dot]
		if c := strings.Index(p.Ref.Network, ":"); c >= 0 {
			p.Ref.Group = p.Ref.Network[c+1:]
			p.Ref.Network = p.Ref.Network[:c]
			if p.Ref.Group == "" || p.Ref.Network == "" {
				return p, fmt.Errorf("pool id %q: empty network or group", s)
			}
		}
	}
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil || !pfx.Addr().Is4() {
		return p, fmt.Errorf("pool id %q: %q is not an IPv4 subnet", s, cidr)
	}
	p.Subnet = pfx.Masked()
	return p, nil
}
