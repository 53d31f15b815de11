// Package dockerplugin is netplugin's Docker front-end: a libnetwork remote NetworkDriver
// and IpamDriver served together under one plugin name (default `netplugin`) on
// <dir>/<name>.sock, and the network sync that makes every Contiv network (and endpoint
// group) a Docker network on the local dockerd.
//
// Docker 20.10 without swarm refuses global-scope remote networks, so the driver reports
// scope local with global connectivity; networks are not shared between daemons, which is
// why each host's agent creates them on its own dockerd (Syncer). Pool ids are
// self-describing ("<net>.<tenant>|<cidr>") and network identities are re-read from etcd
// and the Docker API, so a restarted plugin needs nothing replayed by Docker.
//
// It talks to netmaster (addresses), the agent (endpoint attach/detach) and dockerd through
// interfaces declared here; it knows nothing about dataplanes or netlink.
package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	dnetwork "github.com/docker/docker/api/types/network"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"

	"github.com/contivbpf/contivbpf/pkg/unixsock"
)

// Defaults.
const (
	DefaultName = "netplugin"
	DefaultDir  = "/run/docker/plugins"
	// GatewayRequest is the RequestAddressType Docker sets when asking for the gateway.
	GatewayRequest = "com.docker.network.gateway"
	// Driver option keys written by the Syncer (they reach CreateNetwork under
	// com.docker.network.generic).
	OptTenant   = "tenant"
	OptNetwork  = "network"
	OptGroup    = "group"
	OptEncap    = "encap"
	OptPktTag   = "pkt-tag"
	OptContivID = "contiv-id" // central id: "<net>.<tenant>" or "<group>:<tenant>"
	genericOpts = "com.docker.network.generic"
)

// Master is the part of netmaster's /plugin API the IPAM driver uses
// (*masterclient.Client satisfies it).
type Master interface {
	AllocAddress(ctx context.Context, req model.AllocAddressRequest) (model.AllocAddressResponse, error)
	ReleaseAddress(ctx context.Context, req model.ReleaseAddressRequest) error
}

// EndpointRequest asks the agent to attach (or detach) a Docker endpoint.
type EndpointRequest struct {
	Ref        NetRef
	EndpointID string     // Docker endpoint id (Contiv's endpoint id in docker mode)
	IPv4       netip.Addr // the address Docker got from the IPAM driver
	IPv6       netip.Addr // optional
}

// EndpointInfo is what the agent created for an endpoint.
type EndpointInfo struct {
	// IfName is the container end of the veth, left in the daemon's network namespace for
	// Docker to move into the container.
	IfName string
	MAC    net.HardwareAddr
}

// Endpoints is the agent's endpoint API: Attach registers the endpoint with netmaster
// (/plugin/createEndpoint) and plumbs the dataplane with an empty NetNS; Detach undoes
// both (netmaster's deleteEndpoint also frees the address) and is idempotent.
type Endpoints interface {
	AttachEndpoint(ctx context.Context, req EndpointRequest) (EndpointInfo, error)
	DetachEndpoint(ctx context.Context, req EndpointRequest) error
}

// NetworkInspector looks up a Docker network (*client.Client satisfies it). Used to
// rebuild a network's identity after a plugin restart.
type NetworkInspector interface {
	NetworkInspect(ctx context.Context, networkID string, options dnetwork.InspectOptions) (dnetwork.Inspect, error)
}

// Config of a Plugin.
type Config struct {
	Name      string // plugin name (driver and IPAM driver), default "netplugin"
	Dir       string // plugin socket directory, default /run/docker/plugins
	Store     *state.Store
	Master    Master
	Endpoints Endpoints
	Docker    NetworkInspector // optional
	// Containers and Updater (optional, both or neither): after a Join the plugin finds
	// the container in the Docker API and reports its name and labels to netmaster.
	Containers ContainerLister
	Updater    EndpointUpdater
	// NetworksChanged is called (without blocking) after Docker created or deleted a
	// network, so a Syncer can adopt docker-created networks promptly. Optional.
	NetworksChanged func()
	// Timeout bounds each remote call made while serving one Docker request (default 60 s).
	Timeout time.Duration
	// SocketGroup may also use the plugin socket (mode 0660); empty: 0600.
	SocketGroup string
}

// Plugin serves the remote drivers.
type Plugin struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	nets     map[string]dockerNet // docker network id → identity
	eps      map[string]endpoint  // docker endpoint id
	released map[string]bool      // "<pool id>/<ip>" freed by endpoint deletion
	gateways map[string]bool      // "<pool id>/<ip>" answered locally
	// life ends when ServeListener stops; announcing lists the container lookups in
	// progress by Docker endpoint id (containers.go), cancelled when the endpoint goes.
	life       context.Context
	announcing map[string]context.CancelFunc
}

type dockerNet struct {
	Ref     NetRef // Network empty for docker-created networks not yet adopted
	Subnet  netip.Prefix
	Gateway netip.Addr
}

type endpoint struct {
	NetworkID string // docker network id
	Ref       NetRef
	Pool      string
	IP        netip.Addr
	IfName    string
}

// New checks cfg and returns a Plugin.
func New(cfg Config) (*Plugin, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	switch {
	case cfg.Store == nil:
		return nil, errors.New("dockerplugin: Config.Store is nil")
	case cfg.Master == nil:
		return nil, errors.New("dockerplugin: Config.Master is nil")
	case cfg.Endpoints == nil:
		return nil, errors.New("dockerplugin: Config.Endpoints is nil")
	}
	return &Plugin{
		cfg:        cfg,
		log:        slog.With("component", "dockerplugin"),
		nets:       map[string]dockerNet{},
		eps:        map[string]endpoint{},
		released:   map[string]bool{},
		gateways:   map[string]bool{},
		life:       context.Background(),
		announcing: map[string]context.CancelFunc{},
	}, nil
}

// SocketPath is where the plugin listens.
func (p *Plugin) SocketPath() string { return filepath.Join(p.cfg.Dir, p.cfg.Name+".sock") }

// Listen creates the plugin socket (replacing a stale one).
func (p *Plugin) Listen() (net.Listener, error) {
	l, err := unixsock.Listen(p.SocketPath(), p.cfg.SocketGroup)
	if err != nil {
		return nil, fmt.Errorf("dockerplugin: %w", err)
	}
	return l, nil
}

// ServeListener serves on l until ctx ends.
func (p *Plugin) ServeListener(ctx context.Context, l net.Listener) error {
	p.mu.Lock()
	p.life = ctx
	p.mu.Unlock()
	srv := &http.Server{Handler: p.Handler(), BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	p.log.Info("docker plugin listening", "socket", l.Addr().String(), "name", p.cfg.Name)
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if ua, ok := l.Addr().(*net.UnixAddr); ok {
			_ = os.Remove(ua.Name)
		}
		return nil
	case err := <-errc:
		return fmt.Errorf("dockerplugin: serve: %w", err)
	}
}

// network resolves a docker network id to its identity: memory first, then the Docker API
// (after a restart Docker does not replay CreateNetwork).
func (p *Plugin) network(ctx context.Context, id string) (dockerNet, error) {
	p.mu.Lock()
	n, ok := p.nets[id]
	p.mu.Unlock()
	if ok && n.Ref.Network != "" {
		return n, nil
	}
	if !ok {
		if p.cfg.Docker == nil {
			return n, fmt.Errorf("unknown docker network %s", id)
		}
		insp, err := p.cfg.Docker.NetworkInspect(ctx, id, dnetwork.InspectOptions{})
		if err != nil {
			return n, fmt.Errorf("unknown docker network %s: %w", id, err)
		}
		n, err = netFromInspect(insp)
		if err != nil {
			return n, err
		}
	}
	if n.Ref.Network == "" {
		// Docker-created network: find the Contiv network holding its subnet.
		ns, err := p.netBySubnet(ctx, n.Subnet)
		if err != nil {
			return n, fmt.Errorf("docker network %s: %w", id, err)
		}
		n.Ref = NetRef{Tenant: ns.Tenant, Network: ns.NetworkName}
	}
	p.mu.Lock()
	p.nets[id] = n
	p.mu.Unlock()
	return n, nil
}

func netFromInspect(insp dnetwork.Inspect) (dockerNet, error) {
	var n dockerNet
	if len(insp.IPAM.Config) == 0 {
		return n, fmt.Errorf("docker network %s (%s) has no IPv4 subnet", insp.Name, insp.ID)
	}
	pfx, err := netip.ParsePrefix(insp.IPAM.Config[0].Subnet)
	if err != nil {
		return n, fmt.Errorf("docker network %s: subnet %q: %w", insp.Name, insp.IPAM.Config[0].Subnet, err)
	}
	n.Subnet = pfx.Masked()
	n.Gateway, _ = netip.ParseAddr(insp.IPAM.Config[0].Gateway)
	if insp.Options[OptNetwork] != "" {
		n.Ref = NetRef{Tenant: insp.Options[OptTenant], Network: insp.Options[OptNetwork], Group: insp.Options[OptGroup]}
		if n.Ref.Tenant == "" {
			n.Ref.Tenant = "default"
		}
	}
	return n, nil
}

// netState reads a Contiv network's state (/contiv.io/state/nets/<net>.<tenant>).
func (p *Plugin) netState(ctx context.Context, ref NetRef) (model.CfgNetworkState, error) {
	var ns model.CfgNetworkState
	if err := p.cfg.Store.Get(ctx, model.NetStateKey(ref.NetworkID()), &ns); err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return ns, fmt.Errorf("contiv network %q of tenant %q not found", ref.Network, ref.Tenant)
		}
		return ns, fmt.Errorf("read network %s: %w", ref.NetworkID(), err)
	}
	return ns, nil
}

// netBySubnet finds the Contiv network whose subnet is pfx.
func (p *Plugin) netBySubnet(ctx context.Context, pfx netip.Prefix) (model.CfgNetworkState, error) {
	all, err := state.ListJSON[model.CfgNetworkState](ctx, p.cfg.Store, model.NetStatePrefix)
	if err != nil {
		return model.CfgNetworkState{}, fmt.Errorf("list networks: %w", err)
	}
	for _, ns := range all {
		a, err := netip.ParseAddr(ns.SubnetIP)
		if err != nil {
			continue
		}
		if netip.PrefixFrom(a, int(ns.SubnetLen)).Masked() == pfx.Masked() {
			return ns, nil
		}
	}
	return model.CfgNetworkState{}, fmt.Errorf("no contiv network has subnet %s", pfx)
}
