package agent

import (
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dnsresp"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// The agent is the DNS responder's directory (pkg/dnsresp): which endpoint sits behind a
// host interface, and which names each tenant has. Names come from the watched state, the
// same on every host: endpoint names (container or pod name) and ids, endpoint group names
// (every member) and service names (the VIP).

// nameIndex holds the names of every tenant: tenant → name → addresses.
type nameIndex map[string]map[string][]netip.Addr

func (n nameIndex) add(tenant, name string, a netip.Addr) {
	name, ok := model.DNSName(name)
	if !a.Is4() || tenant == "" || !ok {
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

// buildNames indexes the names of r (caller holds the agent's lock). A tenant's endpoint
// group and service names are answered only with the group's members and the service's
// VIP: an endpoint named like one (its EPCommonName or EndpointID, any case) is not
// answered under it, so no agent draws a group's or service's clients to its container by
// naming it so (netmaster's name index holds endpoint names only).
func buildNames(r *records) *nameIndex {
	reserved := map[string]bool{} // by model.ScopedKey(tenant, DNS name)
	for _, g := range r.epgs {
		if name, ok := model.DNSName(g.GroupName); ok {
			reserved[model.ScopedKey(g.TenantName, name)] = true
		}
	}
	for _, s := range r.svcs {
		if name, ok := model.DNSName(s.ServiceName); ok {
			reserved[model.ScopedKey(s.Tenant, name)] = true
		}
	}
	n := nameIndex{}
	own := func(tenant, name string, a netip.Addr) {
		if folded, _ := model.DNSName(name); !reserved[model.ScopedKey(tenant, folded)] {
			n.add(tenant, name, a)
		}
	}
	for _, ep := range r.eps {
		a, err := netip.ParseAddr(strings.Split(ep.IPAddress, "/")[0])
		if err != nil {
			continue
		}
		// The tenant comes from the network record only: ids are ambiguous when names
		// contain dots, and a guessed tenant could get another tenant's names.
		nr, ok := r.nets[ep.NetID]
		if !ok {
			continue
		}
		tenant := nr.Tenant
		own(tenant, ep.EPCommonName, a)
		own(tenant, ep.EndpointID, a)
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
		// Dropped by a change since the last lookup: rebuilt once, here, so a burst of
		// endpoint events does not rebuild it per event.
		a.mu.Lock()
		if idx = a.names.Load(); idx == nil {
			idx = buildNames(a.rec)
			a.names.Store(idx)
		}
		a.mu.Unlock()
	}
	addrs, ok := (*idx)[tenant][name]
	return addrs, ok
}

// askerIndex maps host veth names to their endpoint's asker (rebuilt with the names).
type askerIndex map[string]dnsresp.Asker

func buildAskers(r *records) *askerIndex {
	idx := askerIndex{}
	for _, l := range r.local {
		nr, ok := r.nets[l.NetID]
		if !ok || l.PortName == "" {
			continue
		}
		gw, err := netip.ParseAddr(nr.Gateway)
		if err != nil {
			continue
		}
		idx[l.PortName] = dnsresp.Asker{Tenant: nr.Tenant, Gateway: gw}
	}
	return &idx
}

// ifNameTTL bounds how long an ifindex → name answer (also "no such interface") is reused:
// indexes are recycled when veths come and go.
const ifNameTTL = 5 * time.Second

type ifNameEntry struct {
	name string // "" = no interface
	at   time.Time
}

// Asker returns the local endpoint behind host interface ifindex (dnsresp.Directory): its
// tenant and its network's gateway, the address it asked. No lock and, within ifNameTTL,
// no netlink request: queries from anywhere else (the underlay, the host) cost a map lookup.
func (a *Agent) Asker(ifindex int) (dnsresp.Asker, bool) {
	var name string
	if v, ok := a.ifNames.Load(ifindex); ok && time.Since(v.(ifNameEntry).at) < ifNameTTL {
		name = v.(ifNameEntry).name
	} else {
		if ifc, err := net.InterfaceByIndex(ifindex); err == nil {
			name = ifc.Name
		}
		a.ifNames.Store(ifindex, ifNameEntry{name: name, at: time.Now()})
	}
	idx := a.askers.Load()
	if name == "" || idx == nil {
		return dnsresp.Asker{}, false
	}
	asker, ok := (*idx)[name]
	return asker, ok
}
