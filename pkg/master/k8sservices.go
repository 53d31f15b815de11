package master

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// reK8sPod is a Kubernetes "<namespace>/<pod>" (DNS-1123 label / subdomain).
var reK8sPod = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$`)

// K8sServiceResult is what PutK8sService did with one record.
type K8sServiceResult struct {
	ID string
	// Err: the record was not written (unknown tenant, node port held by another service);
	// what was there before stays.
	Err error
	// Dropped are provider addresses that are not the Contiv endpoint of the pod the
	// EndpointSlice names in the Service's namespace (pods on networks netmaster does not
	// know, host-network or external addresses, other namespaces' pods): left out, never
	// sent to the datapaths.
	Dropped []string
	// NodePortsDropped are node ports left out (outside the range, or another service's).
	NodePortsDropped []string
	// Skipped: no endpoint is a Contiv pod endpoint, so no VIP is programmed (and an
	// earlier record is removed): it would only blackhole the Service.
	Skipped bool
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
		res.Dropped, res.NodePortsDropped, res.Skipped, res.Written = nil, nil, false, false
		return m.putK8sService(ctx, tx, prefix, rec, &res)
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
	err := m.update(withoutQuota(ctx), func(tx *state.Tx) error {
		gone = nil
		all, err := listT[model.CfgServiceLBState](tx, model.SvcLBStatePrefix)
		if err != nil {
			return err
		}
		for _, st := range all {
			if !strings.HasPrefix(st.ServiceName, prefix) {
				continue
			}
			if keep[st.ID] { // kept unless its tenant was deleted since
				if ok, err := tx.Get(model.ModelKey(model.TypeTenant, st.Tenant), &model.Tenant{}); err != nil {
					return err
				} else if ok {
					continue
				}
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

func (m *Master) putK8sService(ctx context.Context, tx *state.Tx, prefix string, rec model.CfgServiceLBState, res *K8sServiceResult) error {
	if err := requireTenant(tx, rec.Tenant); err != nil {
		return err
	}
	if err := validatePorts(rec.Ports); err != nil {
		return err
	}
	if rec.SessionAffinity != "" && rec.SessionAffinity != "ClientIP" {
		return badReq("sessionAffinity: %q must be ClientIP or empty", rec.SessionAffinity)
	}
	vip, err := netip.ParseAddr(rec.IPAddress)
	if err != nil || !vip.Is4() {
		return badReq("ipaddress: %q is not an IPv4 address", rec.IPAddress)
	}
	// "<prefix><namespace>_<name>": backends must be pods of that namespace.
	namespace, _, _ := strings.Cut(strings.TrimPrefix(rec.ServiceName, prefix), "_")
	tenantOf := map[string]string{}
	eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix)
	if err != nil {
		return err
	}
	byIP := map[string]*model.CfgEndpointState{}
	for _, ep := range eps {
		t, err := netTenant(tx, tenantOf, ep.NetID)
		if err != nil {
			return err
		}
		if t == rec.Tenant && byIP[ep.IPAddress] == nil {
			byIP[ep.IPAddress] = ep
		}
	}
	// The VIP must not shadow an address of the tenant: another service's VIP or an
	// endpoint (agents would refuse one of two equal VIPs, each host possibly another).
	if ep := byIP[vip.String()]; ep != nil {
		return conflict("ipaddress: %s is endpoint %s of tenant %q", vip, ep.ID, rec.Tenant)
	}
	all, err := listT[model.CfgServiceLBState](tx, model.SvcLBStatePrefix)
	if err != nil {
		return err
	}
	for _, o := range all {
		if o.ID != rec.ID && o.Tenant == rec.Tenant && o.IPAddress == vip.String() {
			return conflict("ipaddress: %s is already the VIP of service %s", vip, o.ID)
		}
	}
	st := rec
	st.Selectors = nil // never matched by Contiv label updates: the EndpointSlices decide
	st.Providers = map[string]*model.Provider{}
	for _, ip := range slices.Sorted(maps.Keys(rec.Providers)) {
		p := rec.Providers[ip]
		ep := byIP[p.IPAddress]
		// Only the endpoint of the very pod the EndpointSlice names, in the Service's own
		// namespace: a hand-written slice cannot forward to another namespace's pods, to
		// endpoints attached without the API, or to addresses Contiv does not hold.
		if ep == nil || ep.K8sPod == "" || ep.K8sPod != p.Container || !strings.HasPrefix(p.Container, namespace+"/") {
			res.Dropped = append(res.Dropped, p.IPAddress)
			continue
		}
		st.Providers[p.IPAddress+":"+rec.Tenant] = &model.Provider{IPAddress: p.IPAddress, ContainerID: ep.ContainerID,
			Tenant: rec.Tenant, Network: ep.NetID, Services: []string{rec.ID}, Container: p.Container, EpIDKey: ep.ID, Draining: p.Draining}
	}
	old, found, err := getT[model.CfgServiceLBState](tx, model.SvcLBStateKey(rec.ID))
	if err != nil {
		return err
	}
	var oldNodePorts []string
	if found {
		oldNodePorts = old.NodePorts
	}
	if st.NodePorts, err = m.k8sNodePorts(ctx, tx, rec, oldNodePorts, res); err != nil {
		return err
	}
	if len(rec.Providers) > 0 && len(st.Providers) == 0 {
		// Every endpoint is outside Contiv (host network, external, another namespace): a
		// VIP here would only blackhole what something else might serve.
		res.Skipped = true
		if found {
			if err := claimNodePorts(tx, rec.ID, nil, oldNodePorts); err != nil {
				return err
			}
			tx.Delete(model.SvcLBStateKey(rec.ID))
			tx.Delete(model.ProviderKey(rec.ID))
		}
		return nil
	}
	if found {
		a, _ := json.Marshal(old)
		b, _ := json.Marshal(&st)
		if bytes.Equal(a, b) {
			return nil
		}
	}
	if err := claimNodePorts(tx, rec.ID, st.NodePorts, oldNodePorts); err != nil {
		return err
	}
	res.Written = true
	return putServiceState(tx, &st)
}

// k8sNodePorts returns the node ports of rec the Service may take and adds the others to
// res.NodePortsDropped with the reason: outside the range, held by another service (one of
// another tenant is not named), or past the tenant's node port quota (those of old the
// Service gives up make room). The ports the Service holds already come first, so a
// lowered quota never moves its ports; the quota is checked again by account, in the same
// transaction, and the sync loop never fails for it.
func (m *Master) k8sNodePorts(ctx context.Context, tx *state.Tx, rec model.CfgServiceLBState, old []string, res *K8sServiceResult) ([]string, error) {
	type candidate struct {
		np, key string
		held    bool
	}
	var cands []candidate
	for _, np := range rec.NodePorts {
		port, _, proto, err := parseNodePort(np)
		if err != nil {
			return nil, badReq("nodePorts: %v", err)
		}
		if port < model.NodePortMin || port > model.NodePortMax {
			res.NodePortsDropped = append(res.NodePortsDropped, fmt.Sprintf("%s (outside %d-%d)", np, model.NodePortMin, model.NodePortMax))
			continue
		}
		var owner string
		found, err := tx.Get(model.NodePortKey(port, proto), &owner)
		switch {
		case err != nil:
			return nil, err
		case found && owner != rec.ID && tenantOfID(owner) != rec.Tenant:
			res.NodePortsDropped = append(res.NodePortsDropped, np+" (used by a service of another tenant)")
			continue
		case found && owner != rec.ID:
			res.NodePortsDropped = append(res.NodePortsDropped, fmt.Sprintf("%s (used by service %s)", np, owner))
			continue
		}
		cands = append(cands, candidate{np, model.NodePortKey(port, proto), found})
	}
	room, limit, err := m.nodePortRoom(ctx, tx, rec.Tenant)
	if err != nil {
		return nil, err
	}
	for _, np := range old { // (what it holds and gives up)
		port, _, proto, err := parseNodePort(np)
		if err != nil {
			continue
		}
		key := model.NodePortKey(port, proto)
		if slices.ContainsFunc(cands, func(c candidate) bool { return c.held && c.key == key }) {
			continue
		}
		var owner string
		if found, err := tx.Get(key, &owner); err != nil {
			return nil, err
		} else if found && owner == rec.ID {
			room++
		}
	}
	var out []string
	for _, held := range []bool{true, false} {
		for _, c := range cands {
			if c.held != held {
				continue
			}
			if !held && room <= 0 {
				res.NodePortsDropped = append(res.NodePortsDropped, fmt.Sprintf("%s (past tenant %q's %s quota of %d)", c.np, rec.Tenant, model.QuotaNodePorts, limit))
				continue
			}
			if !held {
				room--
			}
			out = append(out, c.np)
		}
	}
	return out, nil
}

// nodePortRoom is how many more node ports tenant may take (a large number when ctx is
// exempt or the kind has no limit), and the limit.
func (m *Master) nodePortRoom(ctx context.Context, tx *state.Tx, tenant string) (room, limit int64, err error) {
	if quotaExempt(ctx) {
		return math.MaxInt64, 0, nil
	}
	limits, _, err := m.limitsOf(tx, tenant)
	if err != nil {
		return 0, 0, err
	}
	limit, ok := limits[model.QuotaNodePorts]
	if !ok {
		return math.MaxInt64, 0, nil
	}
	u, found, err := getT[model.TenantUsage](tx, model.QuotaUsageKey(tenant))
	if err != nil {
		return 0, 0, err
	}
	if !found || u.Version != model.UsageVersion {
		if u, err = recountTenant(tx, tenant); err != nil {
			return 0, 0, err
		}
	}
	return limit - u.Usage[model.QuotaNodePorts], limit, nil
}
