package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// AttachRequest asks for a container interface on a Contiv network.
type AttachRequest struct {
	Tenant  string // required
	Network string // required
	Group   string // endpoint group ("" = none)
	// EndpointID is the runtime's id for the interface: the Docker endpoint id or the k8s
	// infra container id. The Contiv endpoint id is "<network>.<tenant>-<EndpointID>".
	EndpointID string
	Name       string // container/pod name (epCommonName)
	// K8sPod is "<namespace>/<name>" when the pod was found in the Kubernetes API.
	K8sPod string
	// NetNS is the container's network namespace path. Empty: the container end of the
	// veth stays in the host namespace, named IfName, for the runtime to move (Docker).
	NetNS  string
	IfName string // container-side interface name, default eth0
	// IPAddress is an address already allocated for the endpoint (Docker's IPAM driver
	// got it from /plugin/allocAddress); netmaster records it instead of allocating one.
	// Empty: netmaster allocates.
	IPAddress string
	// PodQoS: the pod's bandwidth annotations (combined with the group's netprofile).
	PodQoS dataplane.QoS
}

// AttachResult describes the attached interface.
type AttachResult struct {
	ID         string       `json:"id"` // Contiv endpoint id
	IP         netip.Prefix `json:"ip"` // address/subnet length
	IPv6       netip.Addr   `json:"ipv6,omitzero"`
	MAC        string       `json:"mac"`
	Gateway    netip.Addr   `json:"gateway,omitzero"`
	MTU        int          `json:"mtu"`
	HostIfName string       `json:"hostIfName"`
	IfName     string       `json:"ifName"`
}

// HostIfName is the host-side veth name of an endpoint: "cbv" + 12 hex digits of a hash
// of its id, unique per host and within the kernel's 15-byte limit.
func HostIfName(endpointID string) string {
	h := sha256.Sum256([]byte(endpointID))
	return "cbv" + hex.EncodeToString(h[:6])
}

func (r AttachRequest) validate() error {
	switch {
	case r.Tenant == "":
		return errors.New("attach: tenant is empty")
	case r.Network == "":
		return errors.New("attach: network is empty")
	case r.EndpointID == "":
		return errors.New("attach: endpoint id is empty")
	case len(r.IfName) > 15:
		return fmt.Errorf("attach: ifName %q longer than 15 bytes", r.IfName)
	}
	return nil
}

// AttachEndpoint creates the endpoint on netmaster (which allocates its address), records
// it in /contiv.io/oper/eps/<id> and programs it into the driver (those two concurrently). If any step fails,
// everything done so far is undone (driver endpoint and veth, oper record, netmaster
// endpoint) and the error says which step failed. Attaching an endpoint that is already
// attached with the same namespace returns it again.
// masterTimeout bounds the netmaster call of an attach (CNI ADD, Docker CreateEndpoint).
const masterTimeout = 5 * time.Second

func (a *Agent) AttachEndpoint(ctx context.Context, req AttachRequest) (AttachResult, error) {
	if req.IfName == "" {
		req.IfName = "eth0"
	}
	if err := req.validate(); err != nil {
		return AttachResult{}, err
	}
	select {
	case <-a.ready:
	case <-ctx.Done():
		return AttachResult{}, fmt.Errorf("attach: agent not synced yet: %w", ctx.Err())
	}
	a.attachMu.Lock()
	defer a.attachMu.Unlock()

	id := model.EndpointStateID(req.Network, req.Tenant, req.EndpointID)
	// What exists before this call is not ours to roll back: netmaster's createEndpoint is
	// idempotent, so a retried attach of a live endpoint gets the same record back.
	var prev *LocalEndpoint
	a.mu.Lock()
	if l, ok := a.rec.local[id]; ok {
		prev = &l
	}
	_, hadMaster := a.rec.eps[id]
	a.mu.Unlock()
	var steps attachSteps
	start := time.Now()
	// An unreachable netmaster (or etcd, where its address is found) fails the attach
	// within masterTimeout with a clear message, not at the container runtime's timeout.
	mctx, cancel := context.WithTimeout(ctx, masterTimeout)
	cfg, err := a.cfg.Master.CreateEndpoint(mctx, model.CreateEndpointRequest{
		TenantName: req.Tenant, NetworkName: req.Network, ServiceName: req.Group,
		EndpointID: req.EndpointID, EPCommonName: req.Name, K8sPod: req.K8sPod,
		ConfigEP: model.ConfigEP{Container: req.EndpointID, Host: a.cfg.Host, ServiceName: req.Group, IPAddress: req.IPAddress},
	})
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return AttachResult{}, fmt.Errorf("attach %s: netmaster (or etcd) did not answer within %s: %w", id, masterTimeout, err)
		}
		return AttachResult{}, fmt.Errorf("attach %s: create endpoint on netmaster: %w", id, err)
	}
	steps.netmaster = time.Since(start)
	if cfg.ID != "" && cfg.ID != id {
		id = cfg.ID
	}
	cfg.ID = id
	l := LocalEndpoint{
		OperEndpointState: model.OperEndpointState{
			ID: id, NetID: cfg.NetID, EndpointID: req.EndpointID, ServiceName: req.Group,
			ContUUID: req.EndpointID, IPAddress: cfg.IPAddress, IPv6Address: cfg.IPv6Address,
			MacAddress: cfg.MacAddress, HomingHost: a.cfg.Host, IntfName: req.IfName,
			PortName: HostIfName(id),
		},
		NetNS: req.NetNS, Tenant: req.Tenant, Network: req.Network, Group: req.Group, PodQoS: req.PodQoS,
	}
	res, err := a.attach(ctx, cfg, l, &steps)
	if err != nil {
		if rerr := a.rollback(id, req, cfg, prev, hadMaster); rerr != nil {
			return AttachResult{}, fmt.Errorf("attach %s: %w (rollback: %v)", id, err, rerr)
		}
		return AttachResult{}, fmt.Errorf("attach %s: %w", id, err)
	}
	a.metrics.attachStep.WithLabelValues("netmaster").Observe(steps.netmaster.Seconds())
	a.metrics.attachStep.WithLabelValues("record").Observe(steps.record.Seconds())
	a.metrics.attachStep.WithLabelValues("program").Observe(steps.program.Seconds())
	a.log.Info("endpoint attached", "id", id, "ip", res.IP, "hostIf", res.HostIfName, "netns", req.NetNS,
		"took", time.Since(start).Round(time.Microsecond), "netmaster", steps.netmaster.Round(time.Microsecond),
		"record", steps.record.Round(time.Microsecond), "program", steps.program.Round(time.Microsecond))
	return res, nil
}

// attachSteps times an attach (contiv_netplugin_attach_step_seconds).
type attachSteps struct {
	netmaster, record, program time.Duration
}

func (a *Agent) attach(ctx context.Context, cfg model.CfgEndpointState, l LocalEndpoint, steps *attachSteps) (AttachResult, error) {
	if cfg.HomingHost != "" && cfg.HomingHost != a.cfg.Host {
		return AttachResult{}, fmt.Errorf("endpoint is homed on host %q, not %q", cfg.HomingHost, a.cfg.Host)
	}
	cfg.HomingHost = a.cfg.Host
	netRec, err := a.network(ctx, cfg.NetID)
	if err != nil {
		return AttachResult{}, err
	}
	n, err := networkOf(netRec, a.cfg.UplinkMTU)
	if err != nil {
		return AttachResult{}, err
	}
	ip, ip6, mac, err := epAddrs(cfg)
	if err != nil {
		return AttachResult{}, err
	}
	l.MacAddress = mac.String()
	// The oper record is written while the driver programs the endpoint (they do not
	// depend on each other; ~1.5 ms off every attach). An attach only succeeds with both
	// done; a crash in between leaves a veth no record names, which the restarted agent's
	// Sync sweeps (and the runtime retries the ADD).
	type putResult struct {
		err  error
		took time.Duration
	}
	recorded := make(chan putResult, 1)
	go func(start time.Time) {
		err := a.cfg.Master.RecordEndpoint(ctx, l)
		recorded <- putResult{err, time.Since(start)}
	}(time.Now())
	a.mu.Lock()
	a.rec.setEp(l.ID, &cfg)
	if _, ok := a.rec.nets[cfg.NetID]; !ok {
		a.rec.nets[cfg.NetID] = netRec
		a.rec.touchAll()
	}
	a.rec.setLocal(l.ID, &l)
	a.mu.Unlock()
	t := time.Now()
	errs := a.reconcile(ctx)
	steps.program = time.Since(t)
	rec := <-recorded
	steps.record = rec.took
	if rec.err != nil {
		return AttachResult{}, fmt.Errorf("record local endpoint: %w", rec.err)
	}
	if err := errs["endpoint/"+l.ID]; err != nil {
		return AttachResult{}, fmt.Errorf("program endpoint into %s driver: %w", a.driver.Name(), err)
	}
	if err := errs["network/"+cfg.NetID]; err != nil {
		return AttachResult{}, fmt.Errorf("program network %s: %w", cfg.NetID, err)
	}
	a.applyMu.Lock()
	_, ok := a.applied.Endpoints[l.ID]
	a.applyMu.Unlock()
	if !ok {
		// Other objects failing (even a whole Sync the agent is retrying) do not matter
		// as long as this endpoint is programmed.
		if err := errs["sync"]; err != nil {
			return AttachResult{}, fmt.Errorf("endpoint not programmed: %w", err)
		}
		if err := a.Errors()["endpoint/"+l.ID]; err != "" {
			return AttachResult{}, fmt.Errorf("endpoint not programmed: %s", err)
		}
		return AttachResult{}, errors.New("endpoint not programmed (network or endpoint record unusable)")
	}
	return AttachResult{
		ID: l.ID, IP: netip.PrefixFrom(ip, n.Subnet.Bits()), IPv6: ip6, MAC: net.HardwareAddr(mac).String(),
		Gateway: n.Gateway, MTU: n.MTU, HostIfName: l.PortName, IfName: l.IntfName,
	}, nil
}

// network returns the network record from the watch cache, or from the store when the
// watch has not delivered it yet.
func (a *Agent) network(ctx context.Context, netID string) (model.CfgNetworkState, error) {
	a.mu.Lock()
	n, ok := a.rec.nets[netID]
	a.mu.Unlock()
	if ok {
		return n, nil
	}
	if err := a.store.Get(ctx, model.NetStateKey(netID), &n); err != nil {
		return n, fmt.Errorf("network %s: %w", netID, err)
	}
	return n, nil
}

// rollback undoes what a failed attach created; it runs on a fresh context so a
// cancelled request still cleans up. An endpoint that was attached before this call
// (prev) gets its previous record back instead of being removed, and a netmaster record
// that existed before (hadMaster) is left alone. Failures are logged and returned.
func (a *Agent) rollback(id string, req AttachRequest, cfg model.CfgEndpointState, prev *LocalEndpoint, hadMaster bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.log.Warn("rolling back failed attach", "id", id, "existedBefore", prev != nil, "netmasterRecordBefore", hadMaster)
	var errs []error
	if prev != nil {
		if err := a.cfg.Master.RecordEndpoint(ctx, *prev); err != nil {
			errs = append(errs, fmt.Errorf("restore local endpoint record: %w", err))
		}
		a.mu.Lock()
		a.rec.setLocal(id, prev)
		a.mu.Unlock()
		a.trigger()
	} else if err := a.forget(ctx, id); err != nil {
		a.log.Error("rollback: forget local endpoint", "id", id, "err", err)
		errs = append(errs, err)
	}
	if !hadMaster {
		if err := a.cfg.Master.DeleteEndpoint(ctx, model.DeleteEndpointRequest{
			TenantName: req.Tenant, NetworkName: req.Network, ServiceName: req.Group,
			EndpointID: req.EndpointID, IPv4Address: cfg.IPAddress,
		}); err != nil {
			a.log.Error("rollback: delete endpoint on netmaster", "id", id, "err", err)
			errs = append(errs, fmt.Errorf("delete endpoint on netmaster: %w", err))
		}
	}
	return errors.Join(errs...)
}

// forget removes a local endpoint from the agent, the driver and the oper record.
func (a *Agent) forget(ctx context.Context, id string) error {
	a.mu.Lock()
	a.rec.setLocal(id, nil)
	a.mu.Unlock()
	var errs []error
	a.applyMu.Lock()
	if err := a.driver.DeleteEndpoint(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("delete endpoint from driver: %w", err))
	} else {
		delete(a.applied.Endpoints, id)
	}
	a.applyMu.Unlock()
	if err := a.cfg.Master.ForgetEndpoint(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("delete local endpoint record: %w", err))
	}
	a.trigger()
	return errors.Join(errs...)
}

// DetachRequest names an endpoint to remove. With Tenant and Network set the endpoint
// is "<Network>.<Tenant>-<EndpointID>"; otherwise every local endpoint whose runtime id
// is EndpointID is removed (a CNI DEL carries only the container id).
type DetachRequest struct {
	Tenant     string
	Network    string
	Group      string
	EndpointID string
}

// DetachEndpoint removes the endpoint from the driver (deleting its veth), from the oper
// records and from netmaster. It is idempotent: detaching an unknown endpoint succeeds.
func (a *Agent) DetachEndpoint(ctx context.Context, req DetachRequest) error {
	if req.EndpointID == "" {
		return errors.New("detach: endpoint id is empty")
	}
	a.attachMu.Lock()
	defer a.attachMu.Unlock()
	type target struct {
		id, tenant, network, group string
	}
	var targets []target
	a.mu.Lock()
	if req.Tenant != "" && req.Network != "" {
		targets = append(targets, target{model.EndpointStateID(req.Network, req.Tenant, req.EndpointID), req.Tenant, req.Network, req.Group})
	} else {
		for id, l := range a.rec.local {
			if l.EndpointID == req.EndpointID {
				targets = append(targets, target{id, l.Tenant, l.Network, l.Group})
			}
		}
	}
	a.mu.Unlock()
	if len(targets) == 0 && (req.Tenant == "" || req.Network == "") {
		// Not attached here (or already detached): look for records of this host that a
		// crash may have left behind.
		locals, err := state.ListJSON[LocalEndpoint](ctx, a.store, model.EpOperPrefix)
		if err != nil {
			return fmt.Errorf("detach %s: %w", req.EndpointID, err)
		}
		for _, l := range locals {
			if l.HomingHost == a.cfg.Host && l.EndpointID == req.EndpointID {
				targets = append(targets, target{l.ID, l.Tenant, l.Network, l.Group})
			}
		}
	}
	var errs []error
	for _, t := range targets {
		if err := a.forget(ctx, t.id); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", t.id, err))
			continue
		}
		var cfg model.CfgEndpointState
		err := a.store.Get(ctx, model.EpStateKey(t.id), &cfg)
		if errors.Is(err, state.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", t.id, err))
			continue
		}
		if t.tenant == "" || t.network == "" {
			errs = append(errs, fmt.Errorf("detach %s: tenant/network unknown; pass them explicitly", t.id))
			continue
		}
		if err := a.cfg.Master.DeleteEndpoint(ctx, model.DeleteEndpointRequest{
			TenantName: t.tenant, NetworkName: t.network, ServiceName: t.group,
			EndpointID: req.EndpointID, IPv4Address: cfg.IPAddress,
		}); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: delete endpoint on netmaster: %w", t.id, err))
			continue
		}
		a.log.Info("endpoint detached", "id", t.id)
	}
	return errors.Join(errs...)
}

// LocalEndpoints returns this host's endpoint records.
func (a *Agent) LocalEndpoints() []LocalEndpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]LocalEndpoint, 0, len(a.rec.local))
	for _, l := range a.rec.local {
		out = append(out, l)
	}
	return out
}

// EndpointFor is a helper for front-ends: the dataplane endpoint currently applied.
func (a *Agent) EndpointFor(id string) (dataplane.Endpoint, bool) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	e, ok := a.applied.Endpoints[id]
	return e, ok
}
