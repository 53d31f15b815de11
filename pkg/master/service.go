package master

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func itoa(i int) string      { return strconv.Itoa(i) }
func sortStrings(s []string) { sort.Strings(s) }

func validateServiceLB(s *model.ServiceLB) error {
	if err := checkName("tenantName", s.TenantName, 64); err != nil {
		return err
	}
	if err := checkName("networkName", s.NetworkName, 64); err != nil {
		return err
	}
	if err := checkName("serviceName", s.ServiceName, 256); err != nil {
		return err
	}
	if s.IpAddress != "" {
		if err := checkRegex("ipAddress", s.IpAddress, reIP4, "an IPv4 address", 15); err != nil {
			return err
		}
	}
	if len(s.Selectors) == 0 {
		return badReq("selectors: at least one key=value selector is required")
	}
	// An endpoint keeps at most maxLabels labels within the label bounds
	// (usableLabels): a selector beyond them could never match.
	if err := checkListLen("selectors", len(s.Selectors), maxLabels); err != nil {
		return err
	}
	for _, sel := range s.Selectors {
		if strings.Count(sel, "=") != 1 || strings.HasPrefix(sel, "=") {
			return badReq("selectors: %q must be key=value", sel)
		}
		k, v, _ := strings.Cut(sel, "=")
		if p := labelProblem(k, v); p != "" {
			return badReq("selectors: %.64q: %s (a key of 1-%d bytes without ',' or control characters, a value of at most %d bytes)", sel, p, maxLabelKeyBytes, maxLabelValBytes)
		}
	}
	if err := validatePorts(s.Ports); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, np := range s.NodePorts {
		port, svcPort, proto, err := parseNodePort(np)
		if err != nil {
			return badReq("nodePorts: %v", err)
		}
		if port < model.NodePortMin || port > model.NodePortMax {
			return badReq("nodePorts: %q: node port %d outside %d-%d", np, port, model.NodePortMin, model.NodePortMax)
		}
		found := false
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			found = found || (parts[0] == strconv.Itoa(svcPort) && strings.EqualFold(parts[2], proto))
		}
		if !found {
			return badReq("nodePorts: %q: the service has no port %d/%s", np, svcPort, strings.ToUpper(proto))
		}
		if k := strconv.Itoa(port) + "/" + proto; seen[k] {
			return badReq("nodePorts: node port %d/%s listed twice", port, strings.ToUpper(proto))
		} else {
			seen[k] = true
		}
		// One node port per service port: more would only hold ports of the cluster-wide
		// range that nothing serves.
		if k := "svc " + strconv.Itoa(svcPort) + "/" + proto; seen[k] {
			return badReq("nodePorts: service port %d/%s already has a node port", svcPort, strings.ToUpper(proto))
		} else {
			seen[k] = true
		}
	}
	return nil
}

// validatePorts checks a service's "svcPort:provPort:protocol" entries (Contiv serviceLBs and
// the records of Kubernetes Services alike).
func validatePorts(ports []string) error {
	if len(ports) == 0 {
		return badReq("ports: at least one svcPort:provPort:protocol entry is required")
	}
	if err := checkListLen("ports", len(ports), maxListEntries); err != nil {
		return err
	}
	for _, p := range ports {
		parts := strings.Split(p, ":")
		if len(parts) != 3 {
			return badReq("ports: %q must be svcPort:provPort:protocol", p)
		}
		for _, n := range parts[:2] {
			v, err := strconv.Atoi(n)
			if err != nil || v < 1 || v > 65535 {
				return badReq("ports: %q has port %q outside 1..65535", p, n)
			}
		}
		if pr := strings.ToUpper(parts[2]); pr != "TCP" && pr != "UDP" {
			return badReq("ports: %q protocol must be TCP or UDP", p)
		}
	}
	return nil
}

// parseNodePort reads "nodePort:svcPort:protocol" (protocol returned lower case).
func parseNodePort(np string) (port, svcPort int, proto string, err error) {
	parts := strings.Split(np, ":")
	if len(parts) != 3 {
		return 0, 0, "", fmt.Errorf("%q must be nodePort:svcPort:protocol", np)
	}
	port, err1 := strconv.Atoi(parts[0])
	svcPort, err2 := strconv.Atoi(parts[1])
	proto = strings.ToLower(parts[2])
	if err1 != nil || err2 != nil || svcPort < 1 || svcPort > 65535 {
		return 0, 0, "", fmt.Errorf("%q: ports must be numbers, svcPort 1..65535", np)
	}
	if proto != "tcp" && proto != "udp" {
		return 0, 0, "", fmt.Errorf("%q: protocol must be TCP or UDP", np)
	}
	return port, svcPort, proto, nil
}

// claimNodePorts takes the node ports of service id (one service per node port, across
// tenants: 409 when another holds one) and releases those of old it no longer lists.
func claimNodePorts(tx *state.Tx, id string, ports, old []string) error {
	keep := map[string]bool{}
	for _, np := range ports {
		port, _, proto, err := parseNodePort(np)
		if err != nil {
			return badReq("nodePorts: %v", err)
		}
		k := model.NodePortKey(port, proto)
		keep[k] = true
		var owner string
		found, err := tx.Get(k, &owner)
		if err != nil {
			return err
		}
		if found && owner != id {
			if tenantOfID(owner) != tenantOfID(id) {
				// (Another tenant's service is not named: found by review.)
				return conflict("nodePorts: node port %d/%s is already used by a service of another tenant", port, strings.ToUpper(proto))
			}
			return conflict("nodePorts: node port %d/%s is already used by service %s", port, strings.ToUpper(proto), owner)
		}
		if err := tx.Put(k, id); err != nil {
			return err
		}
	}
	for _, np := range old {
		port, _, proto, err := parseNodePort(np)
		if err != nil || keep[model.NodePortKey(port, proto)] {
			continue
		}
		var owner string
		if found, err := tx.Get(model.NodePortKey(port, proto), &owner); err != nil {
			return err
		} else if found && owner == id {
			tx.Delete(model.NodePortKey(port, proto))
		}
	}
	return nil
}

func selectorMap(sel []string) map[string]string {
	out := map[string]string{}
	for _, s := range sel {
		k, v, _ := strings.Cut(s, "=")
		out[k] = v
	}
	return out
}

func serviceLBOps() objOps[model.ServiceLB] {
	return objOps[model.ServiceLB]{
		coll: model.CollServiceLBs, objType: model.TypeServiceLB,
		key:      func(s *model.ServiceLB) string { return model.ScopedKey(s.TenantName, s.ServiceName) },
		setKey:   func(s *model.ServiceLB, k string) { s.Key = k },
		validate: validateServiceLB,
		save:     saveServiceLB,
		remove: func(m *Master, tx *state.Tx, s *model.ServiceLB) error {
			if err := releaseVIP(tx, s); err != nil {
				return err
			}
			id := model.ServiceID(s.ServiceName, s.TenantName)
			if err := claimNodePorts(tx, id, nil, s.NodePorts); err != nil {
				return err
			}
			tx.Delete(model.SvcLBStateKey(id))
			tx.Delete(model.ProviderKey(id))
			tx.Delete(model.ModelKey(model.TypeServiceLB, s.Key))
			return nil
		},
		inspect: func(m *Master, tx *state.Tx, s *model.ServiceLB) (any, error) {
			out := model.ServiceLBInspect{Config: *s}
			st, found, err := getT[model.CfgServiceLBState](tx, model.SvcLBStateKey(model.ServiceID(s.ServiceName, s.TenantName)))
			if err != nil || !found {
				return out, err
			}
			out.Oper.ServiceVip = st.IPAddress
			keys := make([]string, 0, len(st.Providers))
			for k := range st.Providers {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				p := st.Providers[k]
				eo := model.EndpointOper{IpAddress: []string{p.IPAddress, ""}, ContainerID: p.ContainerID, Network: p.Network}
				if p.EpIDKey != "" {
					if ep, ok, err := getT[model.CfgEndpointState](tx, model.EpStateKey(p.EpIDKey)); err == nil && ok {
						eo = endpointOper(ep, "")
					}
				}
				out.Oper.Providers = append(out.Oper.Providers, eo)
			}
			out.Oper.NumProviders = len(out.Oper.Providers)
			return out, nil
		},
	}
}

func releaseVIP(tx *state.Tx, s *model.ServiceLB) error {
	st, found, err := getT[model.CfgServiceLBState](tx, model.SvcLBStateKey(model.ServiceID(s.ServiceName, s.TenantName)))
	if err != nil || !found || st.IPAddress == "" {
		return err
	}
	ns, found, err := tenantNetwork(tx, st.Network, st.Tenant)
	if err != nil || !found {
		return err
	}
	epgs, err := networkEPGs(tx, ns)
	if err != nil {
		return err
	}
	g, err := releaseIPv4(tx, ns, epgs, st.IPAddress)
	if err != nil {
		return err
	}
	if g != nil {
		if err := tx.Put(model.EPGStateKey(g.ID), g); err != nil {
			return err
		}
	}
	return tx.Put(model.NetStateKey(ns.ID), ns)
}

func saveServiceLB(m *Master, tx *state.Tx, s, old *model.ServiceLB) error {
	if err := requireTenant(tx, s.TenantName); err != nil {
		return err
	}
	netID := model.NetworkID(s.NetworkName, s.TenantName)
	if _, ok, err := tenantNetwork(tx, s.NetworkName, s.TenantName); err != nil {
		return err
	} else if !ok {
		return unproc("networkName: network %q does not exist in tenant %q", s.NetworkName, s.TenantName)
	}
	id := model.ServiceID(s.ServiceName, s.TenantName)
	keepVIP := ""
	if old != nil {
		if old.NetworkName == s.NetworkName && slices.Equal(old.Ports, s.Ports) && slices.Equal(old.Selectors, s.Selectors) &&
			slices.Equal(old.NodePorts, s.NodePorts) && (s.IpAddress == "" || s.IpAddress == old.IpAddress) {
			return nil // identical re-post: no-op
		}
		st, found, err := getT[model.CfgServiceLBState](tx, model.SvcLBStateKey(id))
		if err != nil {
			return err
		}
		if found && old.NetworkName == s.NetworkName && (s.IpAddress == "" || s.IpAddress == st.IPAddress) {
			keepVIP = st.IPAddress
		} else if err := releaseVIP(tx, old); err != nil {
			return err
		}
	}
	var oldNodePorts []string
	if old != nil {
		oldNodePorts = old.NodePorts
	}
	if err := claimNodePorts(tx, id, s.NodePorts, oldNodePorts); err != nil {
		return err
	}
	ns, _, err := tenantNetwork(tx, s.NetworkName, s.TenantName)
	if err != nil {
		return err
	}
	vip := keepVIP
	if vip == "" {
		if s.IpAddress != "" {
			if err := checkPreferred(tx, ns, "ipAddress", s.IpAddress, false); err != nil {
				return err
			}
		}
		if vip, err = allocIPv4(tx, ns, nil, s.IpAddress); err != nil {
			return err
		}
		if err := tx.Put(model.NetStateKey(netID), ns); err != nil {
			return err
		}
	}
	// As Contiv: the allocated VIP lives in the service state (inspect: Oper.serviceVip);
	// the object keeps what the user asked for (empty = any).
	st := model.CfgServiceLBState{ID: id, ServiceName: s.ServiceName, Tenant: s.TenantName, Network: s.NetworkName,
		Ports: s.Ports, Selectors: selectorMap(s.Selectors), IPAddress: vip, Providers: map[string]*model.Provider{}, NodePorts: s.NodePorts}
	// The endpoints of the service's tenant, exactly (by their networks' records: "<net>.
	// <tenant>" suffixes are ambiguous when names contain dots, and tenant "b" must not
	// take endpoints of tenant "a.b").
	eps, err := tenantEndpoints(tx, s.TenantName)
	if err != nil {
		return err
	}
	for _, ep := range eps {
		if len(ep.Labels) == 0 || !labelsMatch(st.Selectors, ep.Labels) {
			continue
		}
		st.Providers[ep.IPAddress+":"+s.TenantName] = &model.Provider{IPAddress: ep.IPAddress, ContainerID: ep.ContainerID,
			Labels: ep.Labels, Tenant: s.TenantName, Network: ep.NetID, Services: []string{id}, Container: ep.EndpointID, EpIDKey: ep.ID}
	}
	if err := putServiceState(tx, &st); err != nil {
		return err
	}
	s.Links = model.ServiceLBLinks{
		Network: model.Link{ObjType: model.TypeNetwork, ObjKey: model.ScopedKey(s.TenantName, s.NetworkName)},
		Tenant:  model.Link{ObjType: model.TypeTenant, ObjKey: s.TenantName},
	}
	return tx.Put(model.ModelKey(model.TypeServiceLB, s.Key), s)
}

func labelsMatch(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// putServiceState writes the service record and its provider IP list.
func putServiceState(tx *state.Tx, st *model.CfgServiceLBState) error {
	if err := tx.Put(model.SvcLBStateKey(st.ID), st); err != nil {
		return err
	}
	ips := make([]string, 0, len(st.Providers))
	for _, p := range st.Providers {
		ips = append(ips, p.IPAddress)
	}
	sort.Strings(ips)
	return tx.Put(model.ProviderKey(st.ID), model.SvcProvider{ID: st.ID, ServiceName: st.ID, Providers: ips})
}

// addProvider makes the endpoint holding ip a provider of the tenant's services its
// labels select; a caller bound to host (boundHost) may name only an endpoint of it.
func addProvider(tx *state.Tx, ip string, req *model.UpdateEndpointRequest, host string) error {
	// Only a real endpoint of the tenant (and of the named network or group, when given)
	// can become a service backend: any other string would reach every agent's datapath.
	eps, err := tenantEndpoints(tx, req.Tenant)
	if err != nil {
		return err
	}
	var ep *model.CfgEndpointState
	var network string
	for _, e := range eps {
		if e.IPAddress != ip {
			continue
		}
		ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(e.NetID))
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		if req.Network != "" && req.Network != ns.NetworkName && req.Network != e.ServiceName {
			continue
		}
		ep, network = e, ns.NetworkName
		break
	}
	if ep == nil {
		return unproc("IPAddress: %s is not an endpoint of tenant %q (network or group %q)", ip, req.Tenant, req.Network)
	}
	if err := onHost(host, ep); err != nil {
		return err
	}
	// A host's scope confines what its agent serves: an endpoint it still holds in a
	// tenant the scope left out joins no service and takes no name (found by review).
	if err := inScope(tx, host, "Tenant", req.Tenant, network); err != nil {
		return err
	}
	p := &model.Provider{IPAddress: ip, ContainerID: req.ContainerID, Labels: req.Labels, Tenant: req.Tenant,
		Network: req.Network, Container: req.EndpointID}
	ep.Labels = req.Labels
	if req.EPCommonName != "" {
		// The runtime's name of the container (Docker's, learnt after the container
		// started): the DNS responders answer it. Only for the endpoint the caller names
		// (its id), never for whatever endpoint holds the address now.
		if req.EndpointID == "" || (req.EndpointID != ep.EndpointID && req.EndpointID != ep.ContainerID) {
			return unproc("EPCommonName: EndpointID %q is not the endpoint holding %s", req.EndpointID, ip)
		}
		ep.EPCommonName = req.EPCommonName
	}
	if err := tx.Put(model.EpStateKey(ep.ID), ep); err != nil {
		return err
	}
	p.EpIDKey = ep.ID
	svcs, err := listT[model.CfgServiceLBState](tx, model.SvcLBStatePrefix)
	if err != nil {
		return err
	}
	for _, st := range svcs {
		if st.Tenant != req.Tenant {
			continue
		}
		if len(st.Selectors) == 0 {
			continue // (Kubernetes Services: their backends come from EndpointSlices)
		}
		if !labelsMatch(st.Selectors, req.Labels) {
			// Relabelled away from the service's selector: no longer its backend.
			if _, was := st.Providers[ip+":"+req.Tenant]; was {
				delete(st.Providers, ip+":"+req.Tenant)
				if err := putServiceState(tx, st); err != nil {
					return err
				}
			}
			continue
		}
		pc := *p
		pc.Services = []string{st.ID}
		if st.Providers == nil {
			st.Providers = map[string]*model.Provider{}
		}
		st.Providers[ip+":"+req.Tenant] = &pc
		if err := putServiceState(tx, st); err != nil {
			return err
		}
	}
	return nil
}

// removeProvider takes ip out of the tenant's services; a caller bound to host
// (boundHost) may not while an endpoint of another host holds ip.
func removeProvider(tx *state.Tx, ip, tenant, host string) error {
	if host != "" {
		eps, err := tenantEndpoints(tx, tenant)
		if err != nil {
			return err
		}
		for _, e := range eps {
			if e.IPAddress == ip {
				if err := onHost(host, e); err != nil {
					return err
				}
			}
		}
	}
	svcs, err := listT[model.CfgServiceLBState](tx, model.SvcLBStatePrefix)
	if err != nil {
		return err
	}
	for _, st := range svcs {
		k := ip + ":" + tenant
		if _, ok := st.Providers[k]; !ok {
			continue
		}
		delete(st.Providers, k)
		if err := putServiceState(tx, st); err != nil {
			return err
		}
	}
	return nil
}

// listServices is GET /services: every service state, sorted by id; a tenant-admin's
// only its tenant's.
func (m *Master) listServices(w http.ResponseWriter, r *http.Request) {
	svcs, err := state.ListJSON[model.CfgServiceLBState](r.Context(), m.store, model.SvcLBStatePrefix)
	if err != nil {
		writeErr(w, fmt.Errorf("list services: %w", err))
		return
	}
	tenant, scoped := auth.TenantScope(r.Context())
	keys := make([]string, 0, len(svcs))
	for k, st := range svcs {
		if !scoped || st.Tenant == tenant {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]model.CfgServiceLBState, 0, len(keys))
	for _, k := range keys {
		out = append(out, svcs[k])
	}
	writeJSON(w, out)
}

func (m *Master) getService(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	var st model.CfgServiceLBState
	if err := m.store.Get(r.Context(), model.SvcLBStateKey(id), &st); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			writeErr(w, notFound("service %q not found", id))
			return
		}
		writeErr(w, fmt.Errorf("read service %q: %w", id, err))
		return
	}
	// The middleware refused another tenant's id; a record whose tenant differs from its
	// id is not shown either (as if absent).
	if tenant, scoped := auth.TenantScope(r.Context()); scoped && st.Tenant != tenant {
		writeErr(w, notFound("service %q not found", id))
		return
	}
	writeJSON(w, st)
}

// tenantOfID is the tenant of a service id "<name>:<tenant>" (model.ServiceID).
func tenantOfID(id string) string {
	if i := strings.LastIndexByte(id, ':'); i >= 0 {
		return id[i+1:]
	}
	return ""
}
