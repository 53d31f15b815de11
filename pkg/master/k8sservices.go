package master

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// K8sServiceResult is what ApplyK8sServices did with one record.
type K8sServiceResult struct {
	ID string
	// Err: the record was not written (unknown tenant, node port held by another service);
	// what was there before stays.
	Err error
	// Dropped are provider addresses that are no endpoint of the service's tenant (pods on
	// networks netmaster does not know): they are left out, never sent to the datapaths.
	Dropped []string
	Written bool
}

// PutK8sService writes the serviceLB state record of one Kubernetes Service (service name
// starting with prefix; netmaster's leader in kubernetes mode), checked in one transaction
// with the rules of a Contiv serviceLB: the tenant exists, providers are endpoints of that
// tenant (others are dropped and reported), node ports are free across all services. An
// unchanged record is not rewritten; on error what was there stays. Agents program these
// records like any serviceLB, on both datapaths.
func (m *Master) PutK8sService(ctx context.Context, prefix string, rec model.CfgServiceLBState) K8sServiceResult {
	res := K8sServiceResult{ID: rec.ID}
	if !strings.HasPrefix(rec.ServiceName, prefix) || prefix == "" || rec.ID != model.ServiceID(rec.ServiceName, rec.Tenant) {
		res.Err = fmt.Errorf("service %s: name must start with %q and id be <name>:<tenant>", rec.ID, prefix)
		return res
	}
	res.Err = m.update(ctx, func(tx *state.Tx) error {
		res.Dropped, res.Written = nil, false
		return m.putK8sService(tx, rec, &res)
	})
	return res
}

// PruneK8sServices deletes the serviceLB state records whose service name starts with
// prefix and whose id keep does not hold (Services deleted, made headless or moved to
// another tenant), releasing their node ports. It returns the ids deleted.
func (m *Master) PruneK8sServices(ctx context.Context, prefix string, keep map[string]bool) ([]string, error) {
	if prefix == "" {
		return nil, fmt.Errorf("prune kubernetes services: empty prefix")
	}
	var gone []string
	err := m.update(ctx, func(tx *state.Tx) error {
		gone = nil
		all, err := listT[model.CfgServiceLBState](tx, model.SvcLBStatePrefix)
		if err != nil {
			return err
		}
		for _, st := range all {
			if !strings.HasPrefix(st.ServiceName, prefix) || keep[st.ID] {
				continue
			}
			if err := claimNodePorts(tx, st.ID, nil, st.NodePorts); err != nil {
				return err
			}
			tx.Delete(model.SvcLBStateKey(st.ID))
			tx.Delete(model.ProviderKey(st.ID))
			gone = append(gone, st.ID)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("prune kubernetes services: %w", err)
	}
	return gone, nil
}

func (m *Master) putK8sService(tx *state.Tx, rec model.CfgServiceLBState, res *K8sServiceResult) error {
	if err := requireTenant(tx, rec.Tenant); err != nil {
		return err
	}
	for _, p := range rec.Ports {
		if err := checkPortTriple(p); err != nil {
			return err
		}
	}
	// Only endpoints of the tenant become backends (as addProvider): any other address
	// would reach every agent's datapath.
	tenantOf := map[string]string{}
	eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix)
	if err != nil {
		return err
	}
	byIP := map[string]*model.CfgEndpointState{}
	for _, ep := range eps {
		t, ok := tenantOf[ep.NetID]
		if !ok {
			ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(ep.NetID))
			if err != nil {
				return err
			}
			if found {
				t = ns.Tenant
			}
			tenantOf[ep.NetID] = t
		}
		if t == rec.Tenant && byIP[ep.IPAddress] == nil {
			byIP[ep.IPAddress] = ep
		}
	}
	st := rec
	st.Selectors = nil // never matched by Contiv label updates: the EndpointSlices decide
	st.Providers = map[string]*model.Provider{}
	for _, ip := range slices.Sorted(maps.Keys(rec.Providers)) {
		p := rec.Providers[ip]
		ep := byIP[p.IPAddress]
		if ep == nil {
			res.Dropped = append(res.Dropped, p.IPAddress)
			continue
		}
		st.Providers[p.IPAddress+":"+rec.Tenant] = &model.Provider{IPAddress: p.IPAddress, ContainerID: ep.ContainerID,
			Tenant: rec.Tenant, Network: ep.NetID, Services: []string{rec.ID}, Container: p.Container, EpIDKey: ep.ID}
	}
	old, found, err := getT[model.CfgServiceLBState](tx, model.SvcLBStateKey(rec.ID))
	if err != nil {
		return err
	}
	var oldNodePorts []string
	if found {
		a, _ := json.Marshal(old)
		b, _ := json.Marshal(&st)
		if bytes.Equal(a, b) {
			return nil
		}
		oldNodePorts = old.NodePorts
	}
	if err := claimNodePorts(tx, rec.ID, st.NodePorts, oldNodePorts); err != nil {
		return err
	}
	res.Written = true
	return putServiceState(tx, &st)
}

// checkPortTriple checks "svcPort:provPort:PROTO" as validateServiceLB does.
func checkPortTriple(p string) error {
	return validateServiceLB(&model.ServiceLB{TenantName: "t", NetworkName: "n", ServiceName: "s", Selectors: []string{"k=v"}, Ports: []string{p}})
}
