package master

import (
	"maps"
	"slices"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// The endpoint name index (model.EpNamePrefix): the DNS responders answer, in a tenant,
// every endpoint's EPCommonName and EndpointID (pkg/agent dns.go, as model.DNSName serves
// them), with the addresses of every endpoint that has the name. One record per tenant and
// name names the endpoint that holds it, written and deleted with the endpoint in the same
// transaction; an endpoint whose name another live endpoint of its tenant holds is refused
// (409 naming the field), on any host (issue 34: an agent created an endpoint with a
// deleted endpoint's name and address and took its traffic and name over). A create reads
// one record per name, and the endpoint and network it names to see that it is not stale
// (its endpoint gone, or renamed): no scan of the endpoints.

// endpointNames are the DNS names ep answers to, by request field.
func endpointNames(ep *model.CfgEndpointState) map[string]string {
	out := map[string]string{}
	for _, f := range [...]struct{ field, name string }{{"EndpointID", ep.EndpointID}, {"EPCommonName", ep.EPCommonName}} {
		if n, ok := model.DNSName(f.name); ok {
			out[f.field] = n
		}
	}
	return out
}

// nameHolder is the state id of the live endpoint of tenant holding DNS name n ("" none).
func nameHolder(tx *state.Tx, built map[string]string, tenant, n string) (string, error) {
	if built != nil {
		return built[model.EpNameKey(tenant, n)], nil
	}
	var id string
	if found, err := tx.Get(model.EpNameKey(tenant, n), &id); err != nil || !found {
		return "", err
	}
	ep, found, err := getT[model.CfgEndpointState](tx, model.EpStateKey(id))
	if err != nil || !found {
		return "", err
	}
	if ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(ep.NetID)); err != nil || !found || ns.Tenant != tenant {
		return "", err
	}
	for _, held := range endpointNames(ep) {
		if held == n {
			return id, nil
		}
	}
	return "", nil // (a stale record: the create overwrites it)
}

// claimNames records ep's names in tenant, refusing (409 naming the field) a name another
// endpoint holds. A new endpoint (create) whose EPCommonName another endpoint holds is
// created without it instead: container names repeat across hosts (Docker's are unique
// per host only) and pod names across the namespaces one tenant serves; the name stays
// answered by the endpoint that held it first, never taken over. dropped says so. A
// rename (updateEndpoint) to a held name is refused.
func claimNames(tx *state.Tx, ep *model.CfgEndpointState, tenant string, create bool) (dropped bool, err error) {
	built, err := nameIndex(tx)
	if err != nil {
		return false, err
	}
	names := endpointNames(ep)
	for _, field := range slices.Sorted(maps.Keys(names)) {
		holder, err := nameHolder(tx, built, tenant, names[field])
		if err != nil {
			return false, err
		}
		if holder == "" || holder == ep.ID {
			continue
		}
		if field == "EPCommonName" && create {
			ep.EPCommonName, dropped = "", true
			delete(names, field)
			continue
		}
		return false, conflict("%s: name %q is held by another endpoint of tenant %q", field, names[field], tenant)
	}
	for _, n := range names {
		if err := tx.Put(model.EpNameKey(tenant, n), ep.ID); err != nil {
			return false, err
		}
	}
	return dropped, nil
}

// releaseNames deletes the records of ep's names in tenant that name it.
func releaseNames(tx *state.Tx, ep *model.CfgEndpointState, tenant string) error {
	for _, n := range endpointNames(ep) {
		var id string
		if found, err := tx.Get(model.EpNameKey(tenant, n), &id); err != nil {
			return err
		} else if found && id == ep.ID {
			tx.Delete(model.EpNameKey(tenant, n))
		}
	}
	return nil
}

// nameIndex is nil once the index holds every endpoint's names (model.EpNameIndexBuiltKey).
// Before (endpoints created by a build without the index), it returns the holders built
// from the endpoint and network states, by record key, and writes up to nameRepairBatch
// missing records in tx; the transaction that finds none missing marks the index built.
// The first holder by endpoint id keeps a name two endpoints shared.
func nameIndex(tx *state.Tx) (map[string]string, error) {
	if ok, err := tx.Get(model.EpNameIndexBuiltKey, new(bool)); err != nil || ok {
		return nil, err
	}
	eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix)
	if err != nil {
		return nil, err
	}
	tenants := map[string]string{}
	built := map[string]string{}
	for _, ep := range eps { // (listed in key order)
		tenant, seen := tenants[ep.NetID]
		if !seen {
			if ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(ep.NetID)); err != nil {
				return nil, err
			} else if found {
				tenant = ns.Tenant
			}
			tenants[ep.NetID] = tenant
		}
		if tenant == "" {
			continue
		}
		for _, n := range endpointNames(ep) {
			if k := model.EpNameKey(tenant, n); built[k] == "" {
				built[k] = ep.ID
			}
		}
	}
	// The records are read in one listing: a read of each would add a commit guard per
	// name, past an external etcd's 128 operations per transaction once an old build's
	// endpoints hold some 120 names (found by review: every create then failed 413).
	recs, err := tx.List(model.EpNamePrefix)
	if err != nil {
		return nil, err
	}
	have := make(map[string]string, len(recs))
	for _, kv := range recs {
		var id string
		if kv.Decode(&id) == nil { // (an undecodable record is repaired)
			have[kv.Key] = id
		}
	}
	repairs := 0
	for _, k := range slices.Sorted(maps.Keys(built)) {
		if id, ok := have[k]; ok && id == built[k] {
			continue
		}
		if repairs == nameRepairBatch {
			return built, nil
		}
		if err := tx.Put(k, built[k]); err != nil {
			return nil, err
		}
		repairs++
	}
	return built, tx.Put(model.EpNameIndexBuiltKey, true)
}

// nameRepairBatch is how many name records one transaction writes at most while the index
// is built (an external etcd takes 128 operations per transaction by default).
const nameRepairBatch = 50
