package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/filters"
	dnetwork "github.com/docker/docker/api/types/network"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// DockerAPI is the part of the Docker client the Syncer uses (*client.Client satisfies it).
type DockerAPI interface {
	NetworkList(ctx context.Context, options dnetwork.ListOptions) ([]dnetwork.Summary, error)
	NetworkCreate(ctx context.Context, name string, options dnetwork.CreateOptions) (dnetwork.CreateResponse, error)
	NetworkRemove(ctx context.Context, networkID string) error
}

// NetworkAPI creates and deletes Contiv networks in netmaster (REST /api/v1/networks/).
// Used to adopt networks made with `docker network create -d netplugin`.
type NetworkAPI interface {
	CreateNetwork(ctx context.Context, n model.Network) error
	DeleteNetwork(ctx context.Context, tenant, name string) error
}

// SyncConfig configures a Syncer.
type SyncConfig struct {
	Store  *state.Store
	Docker DockerAPI
	// Master adopts docker-created networks into netmaster; nil disables adoption.
	Master NetworkAPI
	Name   string        // plugin name used as driver and IPAM driver, default "netplugin"
	Resync time.Duration // periodic full reconcile, default 10 s
}

// Syncer keeps the local dockerd's netplugin networks equal to Contiv's networks and
// endpoint groups in etcd: it creates the missing ones (named as Contiv does, the central
// id in the driver options) and removes the ones it made whose Contiv object is gone. A
// network created directly with `docker network create -d netplugin --ipam-driver netplugin
// --subnet ...` is created in netmaster too (tenant default, the Docker name), and deleted
// there when it is removed from Docker.
type Syncer struct {
	cfg  SyncConfig
	log  *slog.Logger
	kick chan struct{}

	mu      sync.Mutex
	adopted map[string]NetRef // docker network id → contiv network it created in netmaster
}

// NewSyncer checks cfg and returns a Syncer; Run starts it.
func NewSyncer(cfg SyncConfig) (*Syncer, error) {
	if cfg.Store == nil || cfg.Docker == nil {
		return nil, errors.New("dockerplugin: SyncConfig needs Store and Docker")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Second
	}
	return &Syncer{cfg: cfg, log: slog.With("component", "docknet-sync"), kick: make(chan struct{}, 1), adopted: map[string]NetRef{}}, nil
}

// Trigger asks for a reconcile soon (non-blocking).
func (s *Syncer) Trigger() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run watches etcd and reconciles until ctx ends.
func (s *Syncer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, prefix := range []string{model.NetStatePrefix, model.EPGStatePrefix} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.cfg.Store.ListWatch(ctx, prefix, state.WatchHandler{
				Snapshot: func([]state.KV, int64) { s.Trigger() },
				Event:    func(state.Event) { s.Trigger() },
			})
		}()
	}
	defer wg.Wait()
	t := time.NewTicker(s.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
			// Let a burst of events (and a CreateNetwork still in flight) settle.
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return nil
			}
		case <-t.C:
		}
		if err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("docker network sync failed; will retry", "err", err)
		}
	}
}

// wantNet is one Docker network the store asks for.
type wantNet struct {
	ref      NetRef
	contivID string
	subnet   netip.Prefix
	gateway  string
	encap    string
	tag      int
}

func (s *Syncer) desired(ctx context.Context) (map[string]wantNet, error) {
	nets, err := state.ListJSON[model.CfgNetworkState](ctx, s.cfg.Store, model.NetStatePrefix)
	if err != nil {
		return nil, fmt.Errorf("list networks: %w", err)
	}
	epgs, err := state.ListJSON[model.EndpointGroupState](ctx, s.cfg.Store, model.EPGStatePrefix)
	if err != nil {
		return nil, fmt.Errorf("list endpoint groups: %w", err)
	}
	out := map[string]wantNet{}
	byID := map[string]wantNet{}
	for _, ns := range nets {
		if ns.NwType == "infra" {
			continue
		}
		a, err := netip.ParseAddr(ns.SubnetIP)
		if err != nil {
			s.log.Warn("network without a valid subnet skipped", "id", ns.ID, "subnet", ns.SubnetIP)
			continue
		}
		w := wantNet{
			ref:      NetRef{Tenant: ns.Tenant, Network: ns.NetworkName},
			contivID: ns.ID,
			subnet:   netip.PrefixFrom(a, int(ns.SubnetLen)).Masked(),
			gateway:  ns.Gateway,
			encap:    ns.PktTagType,
			tag:      ns.PktTag,
		}
		if ns.PktTagType == "vxlan" {
			w.tag = ns.ExtPktTag
		}
		out[w.ref.DockerNetworkName()] = w
		byID[ns.ID] = w
	}
	for _, g := range epgs {
		base, ok := byID[model.NetworkID(g.NetworkName, g.TenantName)]
		if !ok {
			continue
		}
		w := base
		w.ref.Group = g.GroupName
		w.contivID = g.ID
		out[w.ref.DockerNetworkName()] = w
	}
	return out, nil
}

// Reconcile makes one pass.
func (s *Syncer) Reconcile(ctx context.Context) error {
	want, err := s.desired(ctx)
	if err != nil {
		return err
	}
	have, err := s.cfg.Docker.NetworkList(ctx, dnetwork.ListOptions{Filters: filters.NewArgs(filters.Arg("driver", s.cfg.Name))})
	if err != nil {
		return fmt.Errorf("list docker networks: %w", err)
	}
	var errs []error
	present := map[string]bool{}
	seen := map[string]bool{}
	for _, n := range have {
		present[n.Name] = true
		seen[n.ID] = true
		cid := n.Options[OptContivID]
		if cid == "" {
			if err := s.adopt(ctx, n, want); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if w, ok := want[n.Name]; ok && w.contivID == cid {
			continue
		}
		if err := s.cfg.Docker.NetworkRemove(ctx, n.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove docker network %s: %w", n.Name, err))
			continue
		}
		delete(present, n.Name)
		s.log.Info("removed docker network", "name", n.Name, "contiv-id", cid)
	}
	// Docker-created networks that left Docker leave netmaster too.
	s.mu.Lock()
	var gone []NetRef
	for id, ref := range s.adopted {
		if !seen[id] {
			gone = append(gone, ref)
			delete(s.adopted, id)
		}
	}
	s.mu.Unlock()
	for _, ref := range gone {
		if s.cfg.Master == nil {
			continue
		}
		if err := s.cfg.Master.DeleteNetwork(ctx, ref.Tenant, ref.Network); err != nil {
			errs = append(errs, fmt.Errorf("delete netmaster network %s (removed from docker): %w", ref.NetworkID(), err))
		} else {
			s.log.Info("deleted netmaster network removed from docker", "network", ref.NetworkID())
		}
	}
	for name, w := range want {
		if present[name] {
			continue
		}
		if err := s.create(ctx, name, w); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Syncer) create(ctx context.Context, name string, w wantNet) error {
	ipamOpts := map[string]string{OptTenant: w.ref.Tenant, OptNetwork: w.ref.Network}
	drvOpts := map[string]string{OptTenant: w.ref.Tenant, OptNetwork: w.ref.Network, OptEncap: w.encap, OptPktTag: strconv.Itoa(w.tag), OptContivID: w.contivID}
	if w.ref.Group != "" {
		ipamOpts[OptGroup] = w.ref.Group
		drvOpts[OptGroup] = w.ref.Group
	}
	cfg := dnetwork.IPAMConfig{Subnet: w.subnet.String()}
	if w.gateway != "" {
		cfg.Gateway = w.gateway
	}
	_, err := s.cfg.Docker.NetworkCreate(ctx, name, dnetwork.CreateOptions{
		Driver:     s.cfg.Name,
		Attachable: true,
		IPAM:       &dnetwork.IPAM{Driver: s.cfg.Name, Config: []dnetwork.IPAMConfig{cfg}, Options: ipamOpts},
		Options:    drvOpts,
	})
	if err != nil {
		if strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return fmt.Errorf("create docker network %s: %w", name, err)
	}
	s.log.Info("created docker network", "name", name, "contiv-id", w.contivID, "subnet", w.subnet)
	return nil
}

// adopt creates a docker-created netplugin network in netmaster (tenant from the name,
// default "default"), unless Contiv already has it.
func (s *Syncer) adopt(ctx context.Context, n dnetwork.Summary, want map[string]wantNet) error {
	ref, err := ParseDockerNetworkName(n.Name)
	if err != nil || ref.Group != "" {
		s.log.Warn("docker network not adoptable", "name", n.Name, "err", err)
		return nil
	}
	if _, ok := want[n.Name]; ok {
		s.mu.Lock()
		_, mine := s.adopted[n.ID]
		s.mu.Unlock()
		if !mine {
			// Contiv has it already: only remember it was docker-made so its removal
			// propagates (after a restart this is how adoption is rediscovered).
			s.mu.Lock()
			s.adopted[n.ID] = ref
			s.mu.Unlock()
		}
		return nil
	}
	if s.cfg.Master == nil {
		return nil
	}
	if len(n.IPAM.Config) == 0 || n.IPAM.Config[0].Subnet == "" {
		return fmt.Errorf("adopt docker network %s: no subnet", n.Name)
	}
	mn := model.Network{
		Key:         model.ScopedKey(ref.Tenant, ref.Network),
		TenantName:  ref.Tenant,
		NetworkName: ref.Network,
		Subnet:      n.IPAM.Config[0].Subnet,
		Gateway:     n.IPAM.Config[0].Gateway,
		Encap:       "vxlan",
		NwType:      "data",
	}
	if e := n.Options[OptEncap]; e != "" {
		mn.Encap = e
	}
	if t, err := strconv.Atoi(n.Options[OptPktTag]); err == nil {
		mn.PktTag = t
	}
	if err := s.cfg.Master.CreateNetwork(ctx, mn); err != nil {
		return fmt.Errorf("create netmaster network for docker network %s: %w", n.Name, err)
	}
	s.mu.Lock()
	s.adopted[n.ID] = ref
	s.mu.Unlock()
	s.log.Info("created netmaster network for docker network", "name", n.Name, "subnet", mn.Subnet)
	return nil
}
