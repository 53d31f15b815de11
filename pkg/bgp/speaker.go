// Package bgp owns a host's BGP speaker (GoBGP as a library): one eBGP (or iBGP) session
// to the neighbour named by the host's Contiv bgp object, the prefixes it advertises (the
// host's endpoint routes) and the best routes it learns, which it reports through a
// change signal. It knows nothing of etcd or of the datapath.
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Config is one speaker's session.
type Config struct {
	// RouterIP is the host's address (and on-link prefix) the session runs from: Contiv's
	// router-ip; its address is also the router id and the advertised next hop.
	RouterIP   netip.Prefix
	ASN        uint32
	Neighbor   netip.Addr
	NeighborAS uint32
	// HoldTime of the session (default 9s; keepalives every third of it). The neighbour
	// withdraws this host's routes when it hears nothing for that long.
	HoldTime time.Duration
	// ListenPort is where the speaker also accepts the neighbour's connection (0 = 179,
	// -1 = connect only); NeighborPort is where it connects to (0 = 179).
	ListenPort   int32
	NeighborPort uint16
	// RestartTime turns on graceful restart (RFC 4724, 0 = off): when this speaker's
	// session ends without a notification (netplugin crashed or restarts), the neighbour
	// keeps this host's routes that long, since the datapath keeps forwarding meanwhile.
	// Restarting says this speaker is that restart (its host's datapath kept routes).
	RestartTime time.Duration
	Restarting  bool
	Logger      *slog.Logger
}

// Validate checks the fields a session needs.
func (c Config) Validate() error {
	switch {
	case !c.RouterIP.IsValid() || !c.RouterIP.Addr().Is4():
		return fmt.Errorf("bgp: router-ip %v is not an IPv4 prefix", c.RouterIP)
	case c.ASN == 0:
		return errors.New("bgp: as is 0")
	case c.NeighborAS == 0:
		return errors.New("bgp: neighbor-as is 0")
	case !c.Neighbor.Is4():
		return fmt.Errorf("bgp: neighbor %v is not IPv4", c.Neighbor)
	case c.Neighbor == c.RouterIP.Addr():
		return fmt.Errorf("bgp: neighbor %v is the router-ip itself", c.Neighbor)
	}
	return nil
}

// MaxRoutes is the most routes a neighbour may send (the datapath's cb_bgp_routes holds
// 65,536).
const MaxRoutes = 60000

// Speaker is a running BGP speaker.
type Speaker struct {
	cfg     Config
	s       *server.BgpServer
	log     *slog.Logger
	changed chan struct{}
	cancel  context.CancelFunc

	mu         sync.Mutex
	advertised map[netip.Prefix][]byte // prefix → uuid of its path
}

var ipv4Unicast = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}

// Start runs a speaker and opens its session; Changed fires on every session or best-path
// change. Stop ends it.
func Start(ctx context.Context, cfg Config) (*Speaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.HoldTime <= 0 {
		cfg.HoldTime = 9 * time.Second
	}
	if cfg.HoldTime < 3*time.Second {
		return nil, fmt.Errorf("bgp: hold time %v is under 3s", cfg.HoldTime)
	}
	if cfg.ListenPort == 0 {
		cfg.ListenPort = 179
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "bgp", "neighbor", cfg.Neighbor)
	s := server.NewBgpServer(server.LoggerOption(&logAdapter{log: log}))
	go s.Serve()
	sp := &Speaker{cfg: cfg, s: s, log: log, changed: make(chan struct{}, 1), advertised: map[netip.Prefix][]byte{}}
	global := &api.Global{Asn: cfg.ASN, RouterId: cfg.RouterIP.Addr().String(), ListenPort: cfg.ListenPort}
	if cfg.ListenPort > 0 {
		global.ListenAddresses = []string{cfg.RouterIP.Addr().String()}
	}
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("bgp: start speaker (as %d, router-id %v): %w", cfg.ASN, cfg.RouterIP.Addr(), err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	sp.cancel = cancel
	if err := s.WatchEvent(wctx, &api.WatchEventRequest{
		Peer:  &api.WatchEventRequest_Peer{},
		Table: &api.WatchEventRequest_Table{Filters: []*api.WatchEventRequest_Table_Filter{{Type: api.WatchEventRequest_Table_Filter_BEST, Init: true}}},
	}, func(*api.WatchEventResponse) { sp.signal() }); err != nil {
		sp.Stop(ctx)
		return nil, fmt.Errorf("bgp: watch events: %w", err)
	}
	hold := uint64(cfg.HoldTime / time.Second)
	peer := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: cfg.Neighbor.String(), PeerAsn: cfg.NeighborAS,
			// Contiv's examples give every host the same AS: routes of the other hosts come
			// back with it in their path.
			AllowOwnAsn: 1},
		Timers:    &api.Timers{Config: &api.TimersConfig{HoldTime: hold, KeepaliveInterval: max(1, hold/3), ConnectRetry: 2}},
		Transport: &api.Transport{LocalAddress: cfg.RouterIP.Addr().String(), RemotePort: uint32(cfg.NeighborPort)},
		AfiSafis: []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: ipv4Unicast, Enabled: true},
			// More than the datapath's route table holds ends the session (Cease, visible
			// in bgp inspect) instead of programming a part.
			PrefixLimits: &api.PrefixLimit{Family: ipv4Unicast, MaxPrefixes: MaxRoutes}}},
	}
	if cfg.RestartTime > 0 {
		peer.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(min(cfg.RestartTime/time.Second, 4095)),
			LocalRestarting: cfg.Restarting}
		peer.AfiSafis[0].MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
	if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
		sp.Stop(ctx)
		return nil, fmt.Errorf("bgp: add neighbor %v (as %d): %w", cfg.Neighbor, cfg.NeighborAS, err)
	}
	log.Info("bgp speaker started", "as", cfg.ASN, "router_ip", cfg.RouterIP, "neighbor_as", cfg.NeighborAS, "hold", cfg.HoldTime)
	return sp, nil
}

// Changed is signalled (coalesced) when the session or a best path changes.
func (sp *Speaker) Changed() <-chan struct{} { return sp.changed }

func (sp *Speaker) signal() {
	select {
	case sp.changed <- struct{}{}:
	default:
	}
}

// Advertise makes the advertised prefixes exactly want (next hop: the router-ip).
func (sp *Speaker) Advertise(ctx context.Context, want []netip.Prefix) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	keep := map[netip.Prefix]bool{}
	var errs []error
	for _, p := range want {
		keep[p] = true
		if _, ok := sp.advertised[p]; ok {
			continue
		}
		path, err := sp.path(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r, err := sp.s.AddPath(ctx, &api.AddPathRequest{Path: path})
		if err != nil {
			errs = append(errs, fmt.Errorf("bgp: advertise %v: %w", p, err))
			continue
		}
		sp.advertised[p] = r.Uuid
	}
	for p, uuid := range sp.advertised {
		if keep[p] {
			continue
		}
		if err := sp.s.DeletePath(ctx, &api.DeletePathRequest{Family: ipv4Unicast, Uuid: uuid}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: withdraw %v: %w", p, err))
			continue
		}
		delete(sp.advertised, p)
	}
	return errors.Join(errs...)
}

func (sp *Speaker) path(p netip.Prefix) (*api.Path, error) {
	if !p.Addr().Is4() {
		return nil, fmt.Errorf("bgp: advertise %v: not IPv4", p)
	}
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: p.Addr().String(), PrefixLen: uint32(p.Bits())})
	if err != nil {
		return nil, err
	}
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0})
	if err != nil {
		return nil, err
	}
	nh, err := anypb.New(&api.NextHopAttribute{NextHop: sp.cfg.RouterIP.Addr().String()})
	if err != nil {
		return nil, err
	}
	return &api.Path{Family: ipv4Unicast, Nlri: nlri, Pattrs: []*anypb.Any{origin, nh}}, nil
}

// Status is the session as `netctl bgp inspect` shows it.
type Status struct {
	AdminStatus    string // "up" or "down"
	NeighborStatus string // BGP session state: idle, connect, active, opensent, openconfirm, established
	Established    bool
	// TableReceived: the neighbour has sent its whole table on this session (its
	// End-of-RIB; sent when graceful restart was negotiated).
	TableReceived bool
	Learned       []dataplane.Route
	Advertised    []netip.Prefix
}

// Status reads the session state and the best learned routes (IPv4 unicast, from the
// neighbour, with a usable next hop).
func (sp *Speaker) Status(ctx context.Context) (Status, error) {
	st := Status{AdminStatus: "down", NeighborStatus: "idle"}
	err := sp.s.ListPeer(ctx, &api.ListPeerRequest{Address: sp.cfg.Neighbor.String()}, func(p *api.Peer) {
		if p.State == nil {
			return
		}
		if p.State.AdminState == api.PeerState_UP {
			st.AdminStatus = "up"
		}
		st.NeighborStatus = strings.ToLower(p.State.SessionState.String())
		st.Established = p.State.SessionState == api.PeerState_ESTABLISHED
		for _, af := range p.AfiSafis {
			if gr := af.GetMpGracefulRestart().GetState(); gr != nil && gr.Enabled && gr.Received {
				st.TableReceived = st.Established && gr.EndOfRibReceived
			}
		}
	})
	if err != nil {
		return st, fmt.Errorf("bgp: list neighbor: %w", err)
	}
	var bad []string
	err = sp.s.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: ipv4Unicast}, func(d *api.Destination) {
		for _, p := range d.Paths {
			if !p.Best || p.IsWithdraw || len(p.Uuid) > 0 || p.NeighborIp == "" || p.NeighborIp == "<nil>" {
				continue
			}
			r, err := routeOf(p)
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			st.Learned = append(st.Learned, r)
		}
	})
	if err != nil {
		return st, fmt.Errorf("bgp: list routes: %w", err)
	}
	if len(bad) > 0 {
		sp.log.Debug("learned routes skipped", "why", bad)
	}
	sort.Slice(st.Learned, func(i, j int) bool { return st.Learned[i].Prefix.String() < st.Learned[j].Prefix.String() })
	sp.mu.Lock()
	for p := range sp.advertised {
		st.Advertised = append(st.Advertised, p)
	}
	sp.mu.Unlock()
	sort.Slice(st.Advertised, func(i, j int) bool { return st.Advertised[i].String() < st.Advertised[j].String() })
	return st, nil
}

// routeOf decodes an IPv4 unicast path.
func routeOf(p *api.Path) (dataplane.Route, error) {
	var pfx api.IPAddressPrefix
	if err := p.Nlri.UnmarshalTo(&pfx); err != nil {
		return dataplane.Route{}, fmt.Errorf("nlri: %w", err)
	}
	a, err := netip.ParseAddr(pfx.Prefix)
	if err != nil || !a.Is4() || pfx.PrefixLen > 32 {
		return dataplane.Route{}, fmt.Errorf("prefix %s/%d is not IPv4", pfx.Prefix, pfx.PrefixLen)
	}
	r := dataplane.Route{Prefix: netip.PrefixFrom(a, int(pfx.PrefixLen)).Masked()}
	for _, at := range p.Pattrs {
		var nh api.NextHopAttribute
		if at.MessageIs(&nh) {
			if err := at.UnmarshalTo(&nh); err != nil {
				return r, fmt.Errorf("%v: next hop: %w", r.Prefix, err)
			}
			if r.NextHop, err = netip.ParseAddr(nh.NextHop); err != nil {
				return r, fmt.Errorf("%v: next hop %q: %w", r.Prefix, nh.NextHop, err)
			}
		}
	}
	if !r.NextHop.Is4() {
		return r, fmt.Errorf("%v: no IPv4 next hop", r.Prefix)
	}
	return r, nil
}

// Stop withdraws what the speaker advertised, closes the session (a Cease notification:
// the neighbour withdraws this host's routes at once) and stops the speaker.
func (sp *Speaker) Stop(ctx context.Context) {
	_ = sp.Advertise(ctx, nil)
	if err := sp.s.StopBgp(ctx, &api.StopBgpRequest{}); err != nil {
		sp.log.Warn("bgp: stop", "err", err)
	}
	sp.cancel()
	sp.s.Stop()
	sp.log.Info("bgp speaker stopped")
}

// Abandon stops the speaker without a word to the neighbour (no withdrawal, no
// notification): the session ends when the process does, and with graceful restart the
// neighbour keeps this host's routes for the restart time. netplugin does this when it
// stops, because its datapath goes on forwarding.
func (sp *Speaker) Abandon() {
	// Not s.Stop(): it deconfigures the neighbour, which sends a Cease notification, and
	// a neighbour that gets one drops the routes (no graceful restart).
	sp.cancel()
	sp.log.Info("bgp speaker left (routes stay with the neighbour for the restart time)")
}

// logAdapter sends GoBGP's log lines to slog (its Info is chatty: Debug here).
type logAdapter struct {
	log   *slog.Logger
	level gobgplog.LogLevel
}

func (l *logAdapter) attrs(f gobgplog.Fields) []any {
	out := make([]any, 0, 2*len(f))
	for k, v := range f {
		out = append(out, k, v)
	}
	return out
}

func (l *logAdapter) Panic(msg string, f gobgplog.Fields) { l.log.Error(msg, l.attrs(f)...) }
func (l *logAdapter) Fatal(msg string, f gobgplog.Fields) { l.log.Error(msg, l.attrs(f)...) }
func (l *logAdapter) Error(msg string, f gobgplog.Fields) { l.log.Error(msg, l.attrs(f)...) }
func (l *logAdapter) Warn(msg string, f gobgplog.Fields)  { l.log.Warn(msg, l.attrs(f)...) }
func (l *logAdapter) Info(msg string, f gobgplog.Fields)  { l.log.Debug(msg, l.attrs(f)...) }
func (l *logAdapter) Debug(msg string, f gobgplog.Fields) {}
func (l *logAdapter) SetLevel(level gobgplog.LogLevel)    { l.level = level }
func (l *logAdapter) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }
