package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/httpserve"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Service names netmaster registers and reads (Contiv's names).
const (
	ServiceNetmaster    = "netmaster"
	ServiceNetmasterRPC = "netmaster.rpc"
	ServiceNetplugin    = "netplugin"
	ServiceVTEP         = "netplugin.vtep"
	// ServiceInspect is a netplugin's inspect API, registered when it listens beyond
	// loopback (GET /agents lists them for netctl --all).
	ServiceInspect = "netplugin.inspect"
)

// NodeConfig configures one netmaster node of an HA group.
type NodeConfig struct {
	Store *state.Store
	// ListenAddr is where the API is served ("0.0.0.0:9999").
	ListenAddr string
	// ControlAddr is "<controlIP>:<port>": the leader lock value, the address followers
	// proxy to and the "netmaster" registration. Required.
	ControlAddr string
	// RPCPort is registered as "netmaster.rpc" (Contiv: 9001). 0 skips that registration.
	RPCPort int
	// API serves everything but /info while this node leads (master.Handler()).
	API http.Handler
	// LeaderTTL and ServiceTTL default to DefaultLeaderTTL and DefaultServiceTTL.
	LeaderTTL  time.Duration
	ServiceTTL time.Duration
	// Version goes into the registrations' Version field.
	Version string
	// Hostname goes into the registrations' Hostname field.
	Hostname string
	// Ready, if set, is called once the listener is bound (with its actual address).
	Ready func(addr net.Addr)
	// MaxConns caps open client connections (0: derived from RLIMIT_NOFILE); see
	// pkg/httpserve for how slow clients are shed.
	MaxConns int
	// TLS, when set, makes the listener HTTPS (its ClientCAs, if any, verify client
	// certificates). PeerTLS is the client side used to proxy to the leader over HTTPS.
	TLS, PeerTLS *tls.Config
	// Auth, when set, authenticates and authorizes every request but /info's transport
	// (see pkg/auth); followers forward the caller to the leader.
	Auth *auth.Config
	// WhileLeader, if set, runs while this node leads, with a context that ends when it
	// steps down (or shuts down); it is started again at the next term. Leader-only
	// watchers (Kubernetes Services, NetworkPolicies) run here.
	WhileLeader func(ctx context.Context)
	// Collectors are served on /metrics beside the node's own.
	Collectors []prometheus.Collector
	// EtcdQuota is the etcd backend quota /healthz and /metrics measure against (0: no
	// space check).
	EtcdQuota int64
	// HealthWarnings are asked on every /healthz; a non-empty answer is a warning
	// (e.g. a revocation list that could not be reloaded).
	HealthWarnings []func() string
	Logger         *slog.Logger
}

// Agents is GET /agents: the inspect APIs of the netplugins registered (those listening
// beyond loopback), by host name, sorted. A registration whose address is not its key's is
// left out: netctl --all sends a token to each URL, and a host may write only the keys of
// addresses it enrolled (etcd RBAC).
func Agents(ctx context.Context, store *state.Store) ([]model.AgentInfo, error) {
	regs, err := listServices(ctx, store, ServiceInspect, true)
	if err != nil {
		return nil, err
	}
	out := make([]model.AgentInfo, 0, len(regs))
	for _, r := range regs {
		if _, err := netip.ParseAddr(r.HostAddr); err != nil || r.Port < 1 || r.Port > 65535 {
			continue // netctl is sent only to an address and port, never to a name or path
		}
		out = append(out, model.AgentInfo{Host: r.Hostname, URL: "http://" + r.Addr()})
	}
	slices.SortFunc(out, func(a, b model.AgentInfo) int { return strings.Compare(a.Host+a.URL, b.Host+b.URL) })
	return out, nil
}

// Info is GET /info, Contiv's shape.
type Info struct {
	LocalIP        string   `json:"local-ip"`
	LeaderIP       string   `json:"leader-ip"`
	CurrentState   string   `json:"current-state"`
	NetpluginNodes []string `json:"netplugin-nodes"`
	NetmasterNodes []string `json:"netmaster-nodes"`
}

// Serve runs a netmaster node until ctx ends: it campaigns for leadership, registers the
// "netmaster" and "netmaster.rpc" services, serves /info locally and everything else through
// a Front (API when leading, proxy to the leader otherwise). On ctx end it resigns first
// (so a follower takes over at once), unregisters, then drains HTTP for up to 5 s.
func Serve(ctx context.Context, cfg NodeConfig) error {
	if cfg.Store == nil || cfg.API == nil {
		return errors.New("netmaster node: Store and API are required")
	}
	host, portStr, err := net.SplitHostPort(cfg.ControlAddr)
	if err != nil {
		return fmt.Errorf("control address %q: %w", cfg.ControlAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 || host == "" || net.ParseIP(host).IsUnspecified() {
		return fmt.Errorf("control address %q: want <reachable IP>:<port>", cfg.ControlAddr)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.ListenAddr, err)
	}

	var regMu sync.Mutex
	var nmReg *Registration
	el, err := NewElection(cfg.Store, ElectionConfig{
		ID: cfg.ControlAddr, TTL: cfg.LeaderTTL, Logger: log,
		OnChange: func(leader bool) {
			regMu.Lock()
			r := nmReg
			regMu.Unlock()
			if r != nil {
				sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				_ = r.SetRole(sctx, roleName(leader))
				c()
			}
		},
	})
	if err != nil {
		ln.Close()
		return err
	}
	elCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	var leaderWG sync.WaitGroup
	if cfg.WhileLeader != nil {
		changes := el.Changes()
		leaderWG.Add(1)
		go func() {
			defer leaderWG.Done()
			runWhileLeader(elCtx, changes, cfg.WhileLeader)
		}()
	}
	elDone := make(chan struct{})
	go func() { _ = el.Run(elCtx); close(elDone) }()

	regCtx, stopRegs := context.WithCancel(context.WithoutCancel(ctx))
	var regs []*Registration
	var regsWG sync.WaitGroup
	register := func(si ServiceInfo) {
		regsWG.Add(1)
		go func() {
			defer regsWG.Done()
			wait := retry.New(200*time.Millisecond, 5*time.Second)
			for {
				r, err := Register(regCtx, cfg.Store, si, cfg.ServiceTTL)
				if err == nil {
					regMu.Lock()
					regs = append(regs, r)
					if si.ServiceName == ServiceNetmaster {
						nmReg = r
					}
					regMu.Unlock()
					if si.ServiceName == ServiceNetmaster && el.IsLeader() {
						_ = r.SetRole(regCtx, roleName(true))
					}
					return
				}
				log.Warn("service registration failed, retrying", "service", si.ServiceName, "err", err)
				if !wait.Wait(regCtx) {
					return
				}
			}
		}()
	}
	base := ServiceInfo{Role: roleName(false), Version: cfg.Version, HostAddr: host, Hostname: cfg.Hostname}
	nm := base
	nm.ServiceName, nm.Port = ServiceNetmaster, port
	register(nm)
	if cfg.RPCPort > 0 {
		rpc := base
		rpc.ServiceName, rpc.Port = ServiceNetmasterRPC, cfg.RPCPort
		register(rpc)
	}

	api := newAPIMetrics()
	mux, outer := http.NewServeMux(), http.NewServeMux()
	deps := nodeDeps{cfg: cfg, host: host, el: el, api: api}
	for _, rt := range nodeRoutes() {
		if rt.open {
			outer.Handle(rt.pattern, rt.handler(deps))
		} else {
			mux.Handle(rt.pattern, rt.handler(deps))
		}
	}
	front := NewFront(el, cfg.API, nil)
	if cfg.TLS != nil {
		front.UseTLS(cfg.PeerTLS)
	}
	if cfg.Auth != nil {
		front.forward = forwardIdentity(cfg.Auth.Tokens)
	}
	mux.Handle("/", front)
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS)
	}
	// A request's body is read only once its caller is known (after authentication), and
	// within that caller's budget of bytes in memory: an unauthenticated flood of large
	// bodies costs nothing, one caller cannot take every other's (httpserve.Limits).
	srv := httpserve.New(httpserve.Limits{MaxConns: cfg.MaxConns, Logger: log, CallerOf: auth.CallerOf},
		func(bodyFirst func(http.Handler) http.Handler) http.Handler {
			var top http.Handler = bodyFirst(mux)
			if cfg.Auth != nil {
				top = auth.Middleware(*cfg.Auth, log, top)
			}
			outer.Handle("/", top)
			return api.wrap(outer)
		})
	api.bodies = srv.BodyBytesHeld
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	log.Info("netmaster node serving", "listen", ln.Addr().String(), "control", cfg.ControlAddr)
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}

	var result error
	select {
	case <-ctx.Done():
	case err := <-srvErr:
		result = fmt.Errorf("serve %s: %w", cfg.ListenAddr, err)
	}
	log.Info("shutting down: resigning leadership")
	stopElection()
	<-elDone
	leaderWG.Wait()
	stopRegs()
	regsWG.Wait()
	regMu.Lock()
	for _, r := range regs {
		cctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		if err := r.Close(cctx); err != nil {
			log.Warn("unregister", "err", err)
		}
		c()
	}
	regMu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.HTTP.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	return result
}

// nodeRoute is a route every node serves itself, not through the leader.
type nodeRoute struct {
	pattern string // an http.ServeMux pattern
	// open routes are served without credentials; the others pass auth.Middleware, whose
	// auth.Authorize decides who may read them.
	open    bool
	handler func(nodeDeps) http.Handler
}

// nodeDeps is what the node's own routes read.
type nodeDeps struct {
	cfg  NodeConfig
	host string
	el   *Election
	api  *apiMetrics
}

func nodeRoutes() []nodeRoute {
	return []nodeRoute{
		// /healthz answers every prober without credentials (it reveals only etcd's health).
		{pattern: "GET /healthz", open: true, handler: func(d nodeDeps) http.Handler {
			return healthHandler(d.cfg.Store, d.cfg.EtcdQuota, d.cfg.HealthWarnings)
		}},
		{pattern: "GET /info", handler: infoHandler},
		{pattern: "GET /agents", handler: agentsHandler},
		{pattern: "GET /metrics", handler: func(d nodeDeps) http.Handler {
			return metricsHandler(d.cfg.Store, d.cfg.EtcdQuota, d.el.IsLeader, d.api, d.cfg.Collectors)
		}},
	}
}

// NodeRoutes lists the patterns ("GET /info") of the routes every node serves itself;
// everything else is the API (master.Routes), served by the leader. For tests that walk
// every route, so that a route added later is covered too.
func NodeRoutes() []string {
	rts := nodeRoutes()
	out := make([]string, len(rts))
	for i, rt := range rts {
		out[i] = rt.pattern
	}
	return out
}

func infoHandler(d nodeDeps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, err := nodeInfo(r.Context(), d.cfg.Store, d.host, d.el)
		if err != nil {
			http.Error(w, "info: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(info)
	})
}

func agentsHandler(d nodeDeps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		agents, err := Agents(r.Context(), d.cfg.Store)
		if err != nil {
			http.Error(w, "agents: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(agents)
	})
}

// runWhileLeader runs fn for each leadership term reported on changes, cancelling it when
// the term ends, until ctx ends.
func runWhileLeader(ctx context.Context, changes <-chan bool, fn func(context.Context)) {
	var stop context.CancelFunc
	done := make(chan struct{})
	close(done)
	for {
		select {
		case <-ctx.Done():
			if stop != nil {
				stop()
			}
			<-done
			return
		case leader := <-changes:
			if leader && stop == nil {
				<-done
				var tctx context.Context
				tctx, stop = context.WithCancel(ctx)
				done = make(chan struct{})
				go func(d chan struct{}) { defer close(d); fn(tctx) }(done)
			} else if !leader && stop != nil {
				stop()
				stop = nil
			}
		}
	}
}

func roleName(leader bool) string {
	if leader {
		return "leader"
	}
	return "follower"
}

func nodeInfo(ctx context.Context, store *state.Store, localIP string, el *Election) (Info, error) {
	info := Info{LocalIP: localIP, CurrentState: roleName(el.IsLeader()), NetpluginNodes: []string{}, NetmasterNodes: []string{}}
	leader, err := el.Leader(ctx)
	if err != nil {
		return info, err
	}
	if h, _, err := net.SplitHostPort(leader); err == nil {
		info.LeaderIP = h
	} else {
		info.LeaderIP = leader
	}
	plugins, err := ListServices(ctx, store, ServiceNetplugin)
	if err != nil {
		return info, err
	}
	seen := map[string]bool{}
	for _, p := range plugins { // two registrations per host (ports 9002, 9003)
		if !seen[p.HostAddr] {
			seen[p.HostAddr] = true
			info.NetpluginNodes = append(info.NetpluginNodes, p.HostAddr)
		}
	}
	masters, err := ListServices(ctx, store, ServiceNetmaster)
	if err != nil {
		return info, err
	}
	for _, m := range masters {
		info.NetmasterNodes = append(info.NetmasterNodes, m.HostAddr)
	}
	return info, nil
}

// forwardIdentity returns the proxy hook of an authenticating follower: with a peer token
// (role netmaster) the leader is called with that token and told who the caller is (so
// certificate-authenticated callers work through followers too); without one, the
// caller's own token travels unchanged and the leader checks it again.
func forwardIdentity(tokens *auth.Tokens) func(in, out *http.Request) {
	return func(in, out *http.Request) {
		out.Header.Del(auth.ForwardedIdentityHeader)
		peerToken := tokens.PeerToken() // (as the token file reads now)
		if peerToken == "" {
			return
		}
		id, ok := auth.FromContext(in.Context())
		if !ok {
			return
		}
		b, err := json.Marshal(id)
		if err != nil {
			return
		}
		out.Header.Set(auth.ForwardedIdentityHeader, string(b))
		out.Header.Del(auth.ContivTokenHeader)
		out.Header.Set("Authorization", "Bearer "+peerToken)
	}
}
