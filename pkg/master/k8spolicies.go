package master

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// K8sPodEndpoint is the Contiv endpoint of a Kubernetes pod (recorded as k8sPod by the
// agent that attached it through the API).
type K8sPodEndpoint struct {
	ID     string
	IP     netip.Addr
	Tenant string
	// Host is the endpoint's host (homingHost): the node the pod runs on, for a true one.
	Host string
}

// K8sPodEndpoints returns the endpoints that belong to Kubernetes pods, by
// "namespace/name" (a pod may have more than one: e.g. a stale one of a node that is down).
func (m *Master) K8sPodEndpoints(ctx context.Context) (map[string][]K8sPodEndpoint, error) {
	out := map[string][]K8sPodEndpoint{}
	err := m.read(ctx, func(tx *state.Tx) error {
		clear(out)
		eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix)
		if err != nil {
			return err
		}
		tenantOf := map[string]string{}
		for _, ep := range eps {
			if ep.K8sPod == "" {
				continue
			}
			ip, err := netip.ParseAddr(ep.IPAddress)
			if err != nil || !ip.Is4() {
				continue
			}
			t, err := netTenant(tx, tenantOf, ep.NetID)
			if err != nil {
				return err
			}
			out[ep.K8sPod] = append(out[ep.K8sPod], K8sPodEndpoint{ID: ep.ID, IP: ip, Tenant: t, Host: ep.HomingHost})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list kubernetes pod endpoints: %w", err)
	}
	return out, nil
}

// PutK8sPodPolicy writes the NetworkPolicy record of one pod endpoint (netmaster's leader
// in kubernetes mode), checked in one transaction: the endpoint exists and is that pod's,
// with that address. An unchanged record is not rewritten; written says whether it was.
func (m *Master) PutK8sPodPolicy(ctx context.Context, rec model.K8sPodPolicy) (written bool, err error) {
	if !reK8sPod.MatchString(rec.Pod) {
		return false, badReq("pod policy %s: pod %q is not <namespace>/<name>", rec.ID, rec.Pod)
	}
	key := model.K8sPodPolicyPrefix + rec.ID
	err = m.update(ctx, func(tx *state.Tx) error {
		written = false
		ep, ok, err := getT[model.CfgEndpointState](tx, model.EpStateKey(rec.ID))
		if err != nil {
			return err
		}
		if !ok || ep.K8sPod != rec.Pod || ep.IPAddress != rec.IPAddress {
			return notFound("pod policy %s: no endpoint of pod %s with address %s", rec.ID, rec.Pod, rec.IPAddress)
		}
		cur, ok, err := getT[model.K8sPodPolicy](tx, key)
		if err != nil {
			return err
		}
		if ok && reflect.DeepEqual(*cur, rec) {
			return nil
		}
		written = true
		return tx.Put(key, rec)
	})
	return written, err
}

// DeleteK8sPodPolicy removes the NetworkPolicy record of an endpoint (no policy selects
// the pod any more, or it is gone).
func (m *Master) DeleteK8sPodPolicy(ctx context.Context, id string) error {
	return m.update(ctx, func(tx *state.Tx) error {
		tx.Delete(model.K8sPodPolicyPrefix + id)
		return nil
	})
}

// K8sPodPolicyIDs lists the endpoint ids that have a NetworkPolicy record.
func (m *Master) K8sPodPolicyIDs(ctx context.Context) ([]string, error) {
	kvs, _, err := m.store.List(ctx, model.K8sPodPolicyPrefix)
	if err != nil {
		return nil, fmt.Errorf("list pod policies: %w", err)
	}
	out := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, kv.Key[len(model.K8sPodPolicyPrefix):])
	}
	return out, nil
}

// WatchEndpoints calls changed after every change of endpoint state (pods attached or
// detached: their addresses are what NetworkPolicy peers resolve to) until ctx ends.
func (m *Master) WatchEndpoints(ctx context.Context, changed func()) error {
	return m.store.ListWatch(ctx, model.EpStatePrefix, state.WatchHandler{
		Snapshot: func([]state.KV, int64) { changed() },
		Event:    func(state.Event) { changed() },
	})
}

// netTenant is the tenant of network state netID ("" when it is gone), cached in seen.
func netTenant(tx *state.Tx, seen map[string]string, netID string) (string, error) {
	if t, ok := seen[netID]; ok {
		return t, nil
	}
	ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(netID))
	if err != nil {
		return "", err
	}
	t := ""
	if found {
		t = ns.Tenant
	}
	seen[netID] = t
	return t, nil
}
