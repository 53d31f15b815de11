package agent

import (
	"net"
	"net/netip"
	"regexp"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dnsresp"
)

// The agent is the DNS responder's directory (pkg/dnsresp): which endpoint sits behind a
// host interface, and which names each tenant has. Names come from the watched state, the
// same on every host: endpoint names (container or pod name) and ids, endpoint group names
// (every member) and service names (the VIP).

// nameIndex holds the names of every tenant: tenant → name → addresses.
type nameIndex map[string]map[string][]netip.Addr

// dnsLabel is what a name must look like to be served (one DNS label, lower case).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)

func (n nameIndex) add(tenant, name string, a netip.Addr) {
	name = strings.ToLower(name)
	if !a.Is4() || tenant == "" || !dnsLabel.MatchString(name) {
		return
	}
	m := n[tenant]
	if m == nil {
		m = map[string][]netip.Addr{}
		n[tenant] = m
	}
	for _, have := range m[name] {
		if have == a {
			return
		}
	}
	m[name] = append(m[name], a)
}

// buildNames indexes the names of r (caller holds the agent's lock).
func buildNames(r *records) *nameIndex {
	n := nameIndex{}
	for _, ep := range r.eps {
		a, err := netip.ParseAddr(strings.Split(ep.IPAddress, "/")[0])
		if err != nil {
			continue
		}
		tenant := ""
		if nr, ok := r.nets[ep.NetID]; ok {
			tenant = nr.Tenant
		} else if _, t, ok := strings.Cut(ep.NetID, "."); ok {
			tenant = t
		}
		n.add(tenant, ep.EPCommonName, a)
		n.add(tenant, ep.EndpointID, a)
		if g, t, ok := strings.Cut(ep.EndpointGroupKey, ":"); ok && t == tenant {
			n.add(tenant, g, a)
		}
	}
	for _, s := range r.svcs {
		if a, err := netip.ParseAddr(s.IPAddress); err == nil {
			n.add(s.Tenant, s.ServiceName, a)
		}
	}
	return &n
}

// Lookup returns the addresses of name in tenant (dnsresp.Directory).
func (a *Agent) Lookup(tenant, name string) ([]netip.Addr, bool) {
	idx := a.names.Load()
	if idx == nil {
		return nil, false
	}
	addrs, ok := (*idx)[tenant][name]
	return addrs, ok
}

// Asker returns the local endpoint behind host interface ifindex (dnsresp.Directory): its
// tenant and its network's gateway, the address it asked.
func (a *Agent) Asker(ifindex int) (dnsresp.Asker, bool) {
	name, ok := a.ifNames.Load(ifindex)
	for attempt := 0; attempt < 2; attempt++ {
		if !ok {
			ifc, err := net.InterfaceByIndex(ifindex)
			if err != nil {
				return dnsresp.Asker{}, false
			}
			name, ok = ifc.Name, true
			a.ifNames.Store(ifindex, name)
		}
		if asker, found := a.askerOn(name.(string)); found {
			return asker, true
		}
		// The index may have been reused by another interface since it was cached.
		a.ifNames.Delete(ifindex)
		ok = false
	}
	return dnsresp.Asker{}, false
}

func (a *Agent) askerOn(ifname string) (dnsresp.Asker, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.rec.local {
		if l.PortName != ifname {
			continue
		}
		nr, ok := a.rec.nets[l.NetID]
		if !ok {
			return dnsresp.Asker{}, false
		}
		gw, err := netip.ParseAddr(nr.Gateway)
		if err != nil {
			return dnsresp.Asker{}, false
		}
		return dnsresp.Asker{Tenant: nr.Tenant, Gateway: gw}, true
	}
	return dnsresp.Asker{}, false
}
