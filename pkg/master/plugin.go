package master

import (
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func (m *Master) allocAddress(w http.ResponseWriter, r *http.Request) {
	var req model.AllocAddressRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.NetworkID == "" && req.AddressPool == "" {
		writeErr(w, badReq("NetworkID or AddressPool: one is required"))
		return
	}
	if err := checkPluginFields(map[string]string{"NetworkID": req.NetworkID}); err != nil {
		writeErr(w, err)
		return
	}
	caller := boundName(r)
	var resp model.AllocAddressResponse
	err := m.update(r.Context(), func(tx *state.Tx) error {
		var ns *model.CfgNetworkState
		var epg *model.EndpointGroupState
		var err error
		if req.NetworkID != "" {
			ns, epg, err = resolveNetworkID(tx, req.NetworkID)
		} else {
			ns, err = networkByPool(tx, req.AddressPool)
		}
		if err != nil {
			return err
		}
		if err := inScope(tx, boundHost(r), "NetworkID", ns.Tenant, ns.NetworkName); err != nil {
			return err
		}
		if req.Gateway && ns.Gateway != "" {
			resp = model.AllocAddressResponse{NetworkID: req.NetworkID, IPv4Address: ns.Gateway + "/" + itoa(int(ns.SubnetLen))}
			return nil
		}
		if req.Gateway && caller != "" {
			// A network's gateway is answered on every host: a bound agent sets it on a
			// network another agent created never, and on one an admin made without a
			// gateway only to the subnet's first address, what Docker asks for (found by
			// review: it set another tenant's to any address).
			var creator string
			had, err := tx.Get(model.NetCreatorKey(model.ScopedKey(ns.Tenant, ns.NetworkName)), &creator)
			if err != nil {
				return err
			}
			base, err := parseIP4("subnetIP", ns.SubnetIP)
			if err != nil {
				return err
			}
			first := addr4(base + 1).String()
			if creator != caller && (had || (req.PreferredIPv4Address != "" && strings.SplitN(req.PreferredIPv4Address, "/", 2)[0] != first)) {
				return errf(http.StatusForbidden, "Gateway: the agent %q may set only the first address as the gateway, and only of a network it created or an admin's", caller)
			}
		}
		pref := req.PreferredIPv4Address
		if req.Gateway && pref == "" {
			base, err := parseIP4("subnetIP", ns.SubnetIP)
			if err != nil {
				return err
			}
			pref = addr4(base + 1).String()
		}
		if pref != "" {
			if err := checkPreferred(tx, ns, "PreferredIPv4Address", pref, false); err != nil {
				return err
			}
		}
		if req.Gateway {
			epg = nil // the gateway is the network's, never from a group's pool
		}
		ip, err := allocIPv4(tx, ns, epg, pref)
		if err != nil {
			return err
		}
		if req.Gateway {
			// Docker asked for the gateway of a network created without one: the address is
			// reserved and becomes the gateway the datapath answers (ARP, egress, DNS).
			ns.Gateway = ip
		} else if caller != "" {
			if err := tx.Put(model.PendingKey(ns.ID, ip), caller); err != nil {
				return err
			}
		} else {
			tx.Delete(model.PendingKey(ns.ID, ip)) // (a stale record is not this allocation's)
		}
		if err := tx.Put(model.NetStateKey(ns.ID), ns); err != nil {
			return err
		}
		if epg != nil {
			if err := tx.Put(model.EPGStateKey(epg.ID), epg); err != nil {
				return err
			}
		}
		resp = model.AllocAddressResponse{NetworkID: req.NetworkID, IPv4Address: ip + "/" + itoa(int(ns.SubnetLen))}
		return nil
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, resp)
}

func (m *Master) releaseAddress(w http.ResponseWriter, r *http.Request) {
	var req model.ReleaseAddressRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.IPv4Address == "" {
		writeErr(w, badReq("IPv4Address: required"))
		return
	}
	if err := checkPluginFields(map[string]string{"NetworkID": req.NetworkID}); err != nil {
		writeErr(w, err)
		return
	}
	err := m.update(withoutQuota(r.Context()), func(tx *state.Tx) error { // (a release is never refused for quota)
		var ns *model.CfgNetworkState
		var err error
		if req.NetworkID != "" {
			ns, _, err = resolveNetworkID(tx, req.NetworkID)
		} else {
			ns, err = networkByPool(tx, req.AddressPool)
		}
		if err != nil {
			return err
		}
		ip := strings.SplitN(req.IPv4Address, "/", 2)[0]
		eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix+ns.ID+"-")
		if err != nil {
			return err
		}
		for _, ep := range eps {
			if ep.NetID == ns.ID && ep.IPAddress == ip {
				return conflict("IPv4Address: %s is still used by endpoint %s", ip, ep.ID)
			}
		}
		if holder, err := addressHolder(tx, ns, ip, true); err != nil {
			return err
		} else if holder != "" {
			return conflict("IPv4Address: %s is still used by %s", ip, holder)
		}
		if err := takePending(tx, ns, "IPv4Address", ip, boundName(r)); err != nil {
			return err
		}
		epgs, err := networkEPGs(tx, ns)
		if err != nil {
			return err
		}
		g, err := releaseIPv4(tx, ns, epgs, ip)
		if err != nil {
			return err
		}
		if g != nil {
			if err := tx.Put(model.EPGStateKey(g.ID), g); err != nil {
				return err
			}
		}
		return tx.Put(model.NetStateKey(ns.ID), ns)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, "success")
}

// hostEndpointSuffix ends a host endpoint's id (endpointStateID); no container id may.
const hostEndpointSuffix = "native-intf"

// endpointStateID is Contiv's endpoint id rule: "<net>.<tenant>-<container>", or
// "<host>-native-intf" when no container is given.
func endpointStateID(netID, container, host string) string {
	if container == "" {
		return host + "-" + hostEndpointSuffix
	}
	return netID + "-" + container
}

func (m *Master) createEndpoint(w http.ResponseWriter, r *http.Request) {
	var req model.CreateEndpointRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.TenantName == "" {
		req.TenantName = "default"
	}
	if req.NetworkName == "" {
		writeErr(w, badReq("NetworkName: required"))
		return
	}
	if req.ConfigEP.Container == "" && req.ConfigEP.Host == "" {
		writeErr(w, badReq("ConfigEP.Container or ConfigEP.Host: one is required"))
		return
	}
	if strings.HasSuffix(req.ConfigEP.Container, hostEndpointSuffix) {
		// "<net>.<tenant>-<container>" would spell "<host>-native-intf", a host endpoint's
		// id, for a host named "<net>.<tenant>[-prefix]" (found by review).
		writeErr(w, badReq("ConfigEP.Container: %q ends in %q, which names host endpoints", req.ConfigEP.Container, hostEndpointSuffix))
		return
	}
	if err := checkPluginFields(map[string]string{"TenantName": req.TenantName, "NetworkName": req.NetworkName,
		"ServiceName": req.ServiceName, "EndpointID": req.EndpointID, "EPCommonName": req.EPCommonName,
		"ConfigEP.Container": req.ConfigEP.Container, "ConfigEP.Host": req.ConfigEP.Host,
		"ConfigEP.ServiceName": req.ConfigEP.ServiceName}); err != nil {
		writeErr(w, err)
		return
	}
	if req.K8sPod != "" && !reK8sPod.MatchString(req.K8sPod) {
		writeErr(w, badReq("K8sPod: %q is not <namespace>/<pod name>", req.K8sPod))
		return
	}
	host := boundHost(r)
	if host != "" && req.ConfigEP.Host != host {
		writeErr(w, errf(http.StatusForbidden, "ConfigEP.Host: the agent of host %q may not create endpoints of host %q", host, req.ConfigEP.Host))
		return
	}
	group := req.ServiceName
	if group == "" {
		group = req.ConfigEP.ServiceName
	}
	netID := model.NetworkID(req.NetworkName, req.TenantName)
	id := endpointStateID(netID, req.ConfigEP.Container, req.ConfigEP.Host)
	var resp model.CreateEndpointResponse
	err := m.update(r.Context(), func(tx *state.Tx) error {
		if err := inScope(tx, host, "TenantName", req.TenantName, req.NetworkName); err != nil {
			return err
		}
		if old, found, err := getT[model.CfgEndpointState](tx, model.EpStateKey(id)); err != nil {
			return err
		} else if found {
			if err := onHost(host, old); err != nil {
				return err
			}
			// The same request again is answered with the same endpoint; another
			// network's (or host's) endpoint whose id spells the same is never reused.
			if old.NetID != netID || old.ContainerID != req.ConfigEP.Container ||
				(req.ConfigEP.Container == "" && old.HomingHost != req.ConfigEP.Host) {
				return conflict("endpoint id %q of container %q in network %q of tenant %q belongs to endpoint of container %q in network %s (host %q)",
					id, req.ConfigEP.Container, req.NetworkName, req.TenantName, old.ContainerID, old.NetID, old.HomingHost)
			}
			resp.EndpointConfig = *old
			return nil
		}
		ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(netID))
		if err != nil {
			return err
		}
		if !found || !ns.Owns(req.NetworkName, req.TenantName) {
			return unproc("NetworkName: network %q does not exist in tenant %q", req.NetworkName, req.TenantName)
		}
		ep := model.CfgEndpointState{ID: id, NetID: netID, EndpointID: req.EndpointID, ServiceName: group,
			HomingHost: req.ConfigEP.Host, ContainerID: req.ConfigEP.Container, EPCommonName: req.EPCommonName, K8sPod: req.K8sPod}
		if ep.EndpointID == "" {
			ep.EndpointID = req.ConfigEP.Container
		}
		var epg *model.EndpointGroupState
		if group != "" {
			g, found, err := getT[model.EndpointGroupState](tx, model.EPGStateKey(model.EPGStateID(group, req.TenantName)))
			if err != nil {
				return err
			}
			if !found {
				return unproc("ServiceName: endpoint group %q does not exist in tenant %q", group, req.TenantName)
			}
			if g.NetworkName != req.NetworkName {
				return unproc("ServiceName: endpoint group %q belongs to network %q, not %q", group, g.NetworkName, req.NetworkName)
			}
			epg = g
			ep.EndpointGroupID = g.EndpointGroupID
			ep.EndpointGroupKey = g.ID
		}
		if req.ConfigEP.IPAddress != "" {
			if err := checkPreferred(tx, ns, "ConfigEP.IPAddress", req.ConfigEP.IPAddress, true); err != nil {
				return err
			}
			if err := takePending(tx, ns, "ConfigEP.IPAddress", req.ConfigEP.IPAddress, boundName(r)); err != nil {
				return err
			}
		}
		if ep.IPAddress, err = allocIPv4(tx, ns, epg, req.ConfigEP.IPAddress); err != nil {
			return err
		}
		if ep.MacAddress, err = model.MACFromIPv4(ep.IPAddress); err != nil {
			return err
		}
		if ns.IPv6Subnet != "" {
			if req.ConfigEP.IPv6Address != "" {
				v6 := strings.SplitN(req.ConfigEP.IPv6Address, "/", 2)[0]
				if err := reserveIPv6(ns, v6); err != nil {
					return err
				}
				ep.IPv6Address = v6
			} else if ep.IPv6Address, err = allocIPv6(ns); err != nil {
				return err
			}
		}
		ns.EpCount++
		if epg != nil {
			epg.EpCount++
			if err := tx.Put(model.EPGStateKey(epg.ID), epg); err != nil {
				return err
			}
		}
		if err := tx.Put(model.NetStateKey(netID), ns); err != nil {
			return err
		}
		resp.EndpointConfig = ep
		return tx.Put(model.EpStateKey(id), &ep)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, resp)
}

func (m *Master) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	var req model.DeleteEndpointRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.TenantName == "" {
		req.TenantName = "default"
	}
	if req.NetworkName == "" || req.EndpointID == "" {
		writeErr(w, badReq("NetworkName and EndpointID: required"))
		return
	}
	if err := checkPluginFields(map[string]string{"TenantName": req.TenantName, "NetworkName": req.NetworkName,
		"ServiceName": req.ServiceName, "EndpointID": req.EndpointID}); err != nil {
		writeErr(w, err)
		return
	}
	netID := model.NetworkID(req.NetworkName, req.TenantName)
	id := endpointStateID(netID, req.EndpointID, "")
	host := boundHost(r)
	var resp model.DeleteEndpointResponse
	err := m.update(withoutQuota(r.Context()), func(tx *state.Tx) error { // (never refused for quota)
		ep, found, err := getT[model.CfgEndpointState](tx, model.EpStateKey(id))
		if err != nil {
			return err
		}
		if !found || ep.NetID != netID || ep.ContainerID != req.EndpointID {
			// An id that spells the same in another network is not this endpoint.
			return notFound("endpoint %s not found", id)
		}
		if err := onHost(host, ep); err != nil {
			return err
		}
		if ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(netID)); err != nil {
			return err
		} else if found && !ns.Owns(req.NetworkName, req.TenantName) {
			return notFound("endpoint %s not found: network %q of tenant %q does not exist", id, req.NetworkName, req.TenantName)
		}
		if err := m.removeEndpoint(tx, ep); err != nil {
			return err
		}
		resp.EndpointConfig = *ep
		return nil
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, resp)
}

// removeEndpoint releases an endpoint's addresses, counts and provider entries and deletes it
// with its NetworkPolicy layer and its agent's record (/contiv.io/oper/eps/<id>).
func (m *Master) removeEndpoint(tx *state.Tx, ep *model.CfgEndpointState) error {
	ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(ep.NetID))
	if err != nil {
		return err
	}
	if found {
		epgs, err := networkEPGs(tx, ns)
		if err != nil {
			return err
		}
		if ep.IPAddress != "" {
			g, err := releaseIPv4(tx, ns, epgs, ep.IPAddress)
			if err != nil {
				return err
			}
			if g != nil && g.ID != ep.EndpointGroupKey {
				if err := tx.Put(model.EPGStateKey(g.ID), g); err != nil {
					return err
				}
			}
		}
		releaseIPv6(ns, ep.IPv6Address)
		if ns.EpCount > 0 {
			ns.EpCount--
		}
		for _, g := range epgs {
			if g.ID == ep.EndpointGroupKey {
				if g.EpCount > 0 {
					g.EpCount--
				}
				if err := tx.Put(model.EPGStateKey(g.ID), g); err != nil {
					return err
				}
			}
		}
		if err := tx.Put(model.NetStateKey(ns.ID), ns); err != nil {
			return err
		}
	}
	tenant := ""
	if ns != nil {
		tenant = ns.Tenant
	}
	if ep.IPAddress != "" && tenant != "" {
		if err := removeProvider(tx, ep.IPAddress, tenant, ""); err != nil {
			return err
		}
	}
	tx.Delete(model.EpStateKey(ep.ID))
	tx.Delete(model.K8sPodPolicyPrefix + ep.ID) // its NetworkPolicy layer goes with it
	// and its agent's record: recordEndpoint writes one only for a live endpoint, so
	// records stay bounded by the endpoints (the tenant's quota)
	tx.Delete(model.EpOperKey(ep.ID))
	return nil
}

func (m *Master) updateEndpoint(w http.ResponseWriter, r *http.Request) {
	var req model.UpdateEndpointRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Tenant == "" {
		req.Tenant = "default"
	}
	if req.IPAddress == "" {
		writeErr(w, badReq("IPAddress: required"))
		return
	}
	ip := strings.SplitN(req.IPAddress, "/", 2)[0]
	if _, err := parseIP4("IPAddress", ip); err != nil {
		writeErr(w, err)
		return
	}
	if err := checkPluginFields(map[string]string{"Tenant": req.Tenant, "Network": req.Network,
		"ContainerID": req.ContainerID, "EndpointID": req.EndpointID, "EPCommonName": req.EPCommonName}); err != nil {
		writeErr(w, err)
		return
	}
	labels, note := usableLabels(req.Labels)
	if note != "" {
		m.log.Warn("updateEndpoint: labels left out", "ip", ip, "tenant", req.Tenant, "why", note)
	}
	req.Labels = labels
	ctx := r.Context()
	if req.Event == "die" {
		ctx = withoutQuota(ctx) // (a provider going is never refused for quota)
	}
	err := m.update(ctx, func(tx *state.Tx) error {
		switch req.Event {
		case "start":
			return addProvider(tx, ip, &req, boundHost(r))
		case "die":
			return removeProvider(tx, ip, req.Tenant, boundHost(r))
		default:
			return badReq("Event: %q must be \"start\" or \"die\"", req.Event)
		}
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, model.UpdateEndpointResponse{IPAddress: req.IPAddress})
}

func (m *Master) inspectEndpoint(w http.ResponseWriter, r *http.Request) {
	key := mux.Vars(r)["key"]
	eps, err := state.ListJSON[model.CfgEndpointState](r.Context(), m.store, model.EpStatePrefix)
	if err != nil {
		writeErr(w, err)
		return
	}
	keys := make([]string, 0, len(eps))
	for k := range eps {
		keys = append(keys, k)
	}
	sortStrings(keys)
	for _, k := range keys {
		ep := eps[k]
		if strings.Contains(ep.EndpointID, key) || strings.Contains(ep.ContainerID, key) || strings.Contains(ep.EPCommonName, key) {
			var oper model.OperEndpointState
			_ = m.store.Get(r.Context(), model.EpOperKey(ep.ID), &oper)
			writeJSON(w, model.EndpointInspect{Config: model.Endpoint{Key: ep.ID}, Oper: endpointOper(&ep, oper.PortName)})
			return
		}
	}
	writeErr(w, notFound("endpoint %q not found", key))
}

// boundHost is the host the caller of r is confined to (an agent identity bound to a host,
// auth.HostPrefix), "" for callers that are not.
func boundHost(r *http.Request) string {
	id, _ := auth.FromContext(r.Context())
	h, _ := id.BoundHost()
	return h
}

// onHost refuses a caller bound to host (boundHost; "" : anyone) an endpoint of another host.
func onHost(host string, ep *model.CfgEndpointState) error {
	if host != "" && ep.HomingHost != host {
		return errf(http.StatusForbidden, "endpoint %s is on host %q: the agent of host %q may not change it", ep.ID, ep.HomingHost, host)
	}
	return nil
}

// boundName is the identity name of a caller bound to a host ("host:<host>"), "" for
// callers that are not.
func boundName(r *http.Request) string {
	if h := boundHost(r); h != "" {
		return auth.HostPrefix + h
	}
	return ""
}

// takePending lets caller (boundName; "" : anyone) adopt or release address ip of ns, which
// no endpoint holds: a bound agent only an address it allocated itself, or one nobody
// allocated (found by review: an agent of h2 adopted, or released, the address h1's IPAM
// step had just allocated). The pending record goes.
func takePending(tx *state.Tx, ns *model.CfgNetworkState, field, ip, caller string) error {
	ip = strings.SplitN(ip, "/", 2)[0]
	key := model.PendingKey(ns.ID, ip)
	var owner string
	had, err := tx.Get(key, &owner)
	if err != nil {
		return err
	}
	// A record of an address the network's map shows free is stale (a deleted pool or
	// network): it neither blocks nor authorizes anyone.
	allocated, err := allocatedIn(tx, ns, field, ip)
	if err != nil {
		return err
	}
	if caller != "" && allocated && owner != caller {
		return errf(http.StatusForbidden, "%s: %s was allocated by another caller; the agent %q may take only addresses it allocated", field, ip, caller)
	}
	if had {
		tx.Delete(key)
	}
	return nil
}
