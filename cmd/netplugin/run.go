package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/agent"
	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/clusterenc"
	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ovs"
	"github.com/contivbpf/contivbpf/pkg/dnsresp"
	"github.com/contivbpf/contivbpf/pkg/dockerplugin"
	"github.com/contivbpf/contivbpf/pkg/httpserve"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
	"github.com/contivbpf/contivbpf/pkg/wgsteer"
	"github.com/contivbpf/contivbpf/pkg/wgtunnel"
	"k8s.io/klog/v2"
)

func run(parent context.Context, cfg config) error {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.With("host", cfg.host)

	if cfg.uplinkMTU == 0 {
		cfg.uplinkMTU = uplinkMTU(log)
	}
	sopts, err := state.TLSOptions(cfg.etcdTLS)
	if err != nil {
		return err
	}
	store, err := state.Open(ctx, cfg.etcd, sopts...)
	if err != nil {
		return err
	}
	defer store.Close()
	// The inspect API listens from here on: netplugin may wait long below (for netmaster's
	// global config without --encryption, for etcd, for the datapath), and /livez answers
	// meanwhile (a liveness probe's restart ends no wait); the rest answers 503 until the
	// agent exists. Nothing of the datapath is decided by it.
	inspect := &lateInspect{}
	srv := httpserve.New(httpserve.Limits{MaxConns: 256, Logger: log, CallerOf: auth.CallerOf},
		func(bodyFirst func(http.Handler) http.Handler) http.Handler {
			inspect.bodyFirst = bodyFirst
			return inspect
		})
	ln, err := net.Listen("tcp", cfg.inspectListen)
	if err != nil {
		return fmt.Errorf("listen for inspect API on %s: %w", cfg.inspectListen, err)
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("inspect API stopped", "err", err)
		}
	}()
	defer srv.HTTP.Close()
	log.Info("inspect API listening", "addr", ln.Addr().String())
	if err := followedEncryption(ctx, &cfg, store, log); err != nil {
		return err
	}

	// The DNS responder's socket first: the datapath is told its address only if it is
	// bound. Its directory (the agent) is set once the agent exists.
	dir := &lateDirectory{}
	var dnsSrv *dnsresp.Server
	if cfg.dnsListen.IsValid() {
		dnsSrv, err = dnsresp.Listen(ctx, dnsresp.Config{Listen: cfg.dnsListen, Upstreams: cfg.dnsUpstreams,
			Rate: cfg.dnsRate, Burst: max(1, int(2*cfg.dnsRate)), UpstreamDevice: upstreamDevice(cfg.dnsUpstreams, log), Logger: log}, dir)
		if err != nil {
			// The rest of the agent does not depend on it: run without (endpoints' queries
			// to their gateway are then dropped as drop_to_gateway), and say so loudly.
			log.Error("DNS responder not running: endpoints get no DNS at their gateway; free the address or pass --dns-listen ADDR:PORT (or off)",
				"addr", cfg.dnsListen, "err", err)
			dnsSrv = nil
			cfg.dnsListen = netip.AddrPort{}
		} else {
			defer dnsSrv.Close()
			log.Info("DNS responder listening", "addr", cfg.dnsListen, "upstreams", cfg.dnsUpstreams)
		}
	}
	// The eBPF driver times each step of an endpoint's setup (veth, container end, maps,
	// tcx): contiv_datapath_endpoint_step_seconds{step}.
	stepHist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "contiv_datapath_endpoint_step_seconds",
		Help:    "Duration of each step of programming a local endpoint in the eBPF datapath (veth, container, host-link, maps, tcx).",
		Buckets: []float64{0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1}}, []string{"step"})
	drv, err := newDriver(ctx, cfg, func(step string, d time.Duration) { stepHist.WithLabelValues(step).Observe(d.Seconds()) })
	if err != nil {
		return err
	}
	// SIGTERM leaves the datapath forwarding: Close, never Teardown.
	defer func() {
		if err := drv.Close(); err != nil {
			log.Warn("close driver", "err", err)
		}
	}()

	var mopts []masterclient.Option
	if cfg.netmasterTLS {
		tc, err := tlsconf.Client(cfg.netmasterFiles, "--netmaster-cacert/--netmaster-cert/--netmaster-key")
		if err != nil {
			return err
		}
		mopts = append(mopts, masterclient.WithTLS(tc))
	}
	if cfg.netmasterToken != "" {
		mopts = append(mopts, masterclient.WithToken(cfg.netmasterToken))
	}
	mc := masterclient.New(store, mopts...)
	steer, closeSteer, err := encryption(ctx, cfg, mc, dir, log)
	if err != nil {
		return err
	}
	if steer != nil {
		defer closeSteer()
		// Containers' MTU leaves room for WireGuard's overhead as well as VXLAN's.
		cfg.uplinkMTU -= wgOverhead
	}
	acfg := agent.Config{
		Store: store, Master: mc, Driver: drv, Host: cfg.host,
		VTEP: cfg.vtep, FwdMode: cfg.fwdMode, UplinkMTU: cfg.uplinkMTU, VLANIf: cfg.vlanIf,
		DebugToken: cfg.debugToken, InspectOpen: cfg.inspectInsecure, Pprof: cfg.pprof, DNS: dnsSrv != nil, BGPHoldTime: cfg.bgpHold, BGPRestartTime: cfg.bgpRestart, BGPPrefixes: cfg.bgpPrefixes,
	}
	block, unblock := overlayBlock(cfg, "")
	follower := clusterenc.New(clusterenc.Config{Running: cfg.encryption, Follows: !cfg.encryptionSet, Log: log,
		Block: block, Unblock: unblock})
	go func() {
		if err := follower.Run(ctx, store); err != nil && ctx.Err() == nil {
			log.Error("cluster encryption setting not followed", "err", err)
		}
	}()
	acfg.Encryption = healths{follower}
	if steer != nil {
		acfg.Encryption = healths{follower, steer}
	}
	if cfg.inspectTokens != "" {
		toks, err := auth.LoadTokens(cfg.inspectTokens)
		if err != nil {
			return fmt.Errorf("--inspect-token-file: %w", err)
		}
		go toks.Follow(ctx, log)
		acfg.InspectAuth = auth.Config{Tokens: toks}
	} else {
		if cfg.inspectInsecure {
			log.Warn("--inspect-insecure: whoever reaches the inspect API reads every tenant's endpoints, flows and rules", "addr", cfg.inspectListen)
		} else {
			log.Warn("the inspect API answers 401 but for /healthz and /metrics: start netplugin with --inspect-token-file to use netctl bpf, monitor, trace and verify")
		}
	}
	if cfg.mode == "kubernetes" {
		pods, err := podLabeler(cfg, log)
		if err != nil {
			return err
		}
		if pods != nil {
			klog.SetSlogLogger(log.With("component", "client-go")) // client-go logs through klog
			pods.Run(ctx)
			acfg.Pods = pods
		}
	}
	ag, err := agent.New(acfg)
	if err != nil {
		return err
	}

	dir.a.Store(ag)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cfg.dataplane == "ebpf" {
		reg.MustRegister(stepHist)
	}
	if dnsSrv != nil {
		reg.MustRegister(dnsSrv.Collectors()...)
		go func() {
			if err := dnsSrv.Serve(ctx); err != nil {
				log.Error("DNS responder stopped", "err", err)
			}
		}()
	}
	// A dataplane that exports its own counters (the eBPF driver's per-reason verdicts and
	// full-map inserts) is scraped on the same /metrics.
	if c, ok := drv.(dataplane.MetricsCollector); ok {
		reg.MustRegister(c.Collector())
	}
	reg.MustRegister(follower.Collector())
	if steer != nil {
		reg.MustRegister(steer.Collector())
	}
	inspect.serve(ag.Handler(reg, inspect.bodyFirst))

	// Registrations are not revoked on exit: peers keep this host's VTEP until the TTL
	// runs out, and a restarted netplugin takes the keys over with a new lease.
	regCtx, cancelReg := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReg()
	regs := []cluster.ServiceInfo{
		{ServiceName: "netplugin", HostAddr: cfg.ctrl.String(), Port: 9002, Hostname: cfg.host},
		{ServiceName: "netplugin", HostAddr: cfg.ctrl.String(), Port: 9003, Hostname: cfg.host},
		{ServiceName: vxlan.VTEPService, HostAddr: cfg.vtep.String(), Port: cfg.vxlanPort, Hostname: cfg.host},
	}
	if si, ok := inspectService(ln.Addr(), cfg.ctrl, cfg.host); ok {
		regs = append(regs, si)
	}
	// Only an etcd with auth on needs the registrations enrolled: without, netplugin still
	// starts while netmaster is away. Auth turned on later (netmaster upgraded or restarted
	// with --etcd-rbac after this netplugin started) enrolls them then: else their keepalive
	// and re-registration are refused until netplugin restarts.
	authOn := func(ctx context.Context) (bool, error) {
		st, err := store.Client().AuthStatus(ctx)
		if err != nil {
			return false, fmt.Errorf("etcd auth status: %w", err)
		}
		return st.Enabled, nil
	}
	if on, err := authOn(ctx); err != nil || on {
		if err := enrollEtcd(ctx, mc, regs, log); err != nil {
			return err
		}
	} else {
		go enrollWhenAuthOn(ctx, authOn, mc, regs, authPollEvery, log)
	}
	for _, si := range regs {
		// The registration outlives a signal (its context does not end with ctx), but
		// waiting for an unreachable etcd must not: SIGTERM is honoured here too.
		done := make(chan error, 1)
		go func() {
			_, err := cluster.Register(regCtx, store, si, cfg.serviceTTL)
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			log.Info("netplugin stopping during start-up (registration with etcd not done)")
			return nil
		}
	}

	errc := make(chan error, 2)
	go func() { errc <- ag.Run(ctx) }()
	if steer != nil {
		go func() { _ = steer.Run(ctx) }()
	}
	go func() {
		select {
		case <-ag.Ready():
		case <-ctx.Done():
			return
		}
		var err error
		if cfg.mode == "kubernetes" {
			err = cniapi.Serve(ctx, cfg.cniSocket, cfg.socketGroup, ag.CNIBackend())
		} else {
			err = dockerplugin.FrontEnd{
				Store: store, Agent: ag, Master: mc, PluginDir: cfg.dockerPluginDir,
				PluginName: cfg.pluginName, DockerHost: cfg.dockerHost, SocketGroup: cfg.socketGroup,
			}.Run(ctx)
		}
		if err != nil {
			errc <- err
		}
	}()
	log.Info("netplugin started", "dataplane", cfg.dataplane, "netmode", cfg.netMode, "fwdmode", cfg.fwdMode,
		"vtep", cfg.vtep, "uplink-mtu", cfg.uplinkMTU, "etcd", cfg.etcd)
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = nil
	}
	// Read whether a signal ended the run before stop(): stop cancels ctx too, and an
	// error checked after it would be swallowed (exit 0 on a fatal configuration error).
	signaled := ctx.Err() != nil
	stop()
	if err != nil && !(signaled && errors.Is(err, context.Canceled)) {
		return err
	}
	log.Info("netplugin stopping; datapath left forwarding")
	return nil
}

// podLabeler returns the node's pod cache (not yet running) for the Kubernetes API of
// --k8s-config, or of the pod's service account when that file is missing and netplugin
// runs in a pod; nil when neither is configured (the default file missing, or naming no API
// server). A file named explicitly must exist; a file that does not parse is an error
// either way. The node is --host (Contiv's host label is the node name).
func podLabeler(cfg config, log *slog.Logger) (*k8s.PodCache, error) {
	kc, ok, err := k8s.ResolveConfig(cfg.k8sConfig, cfg.k8sConfigSet)
	if err != nil {
		return nil, fmt.Errorf("--k8s-config: %w", err)
	}
	if !ok {
		log.Info("no Kubernetes API configured: tenant/network/group from CNI args", "config", cfg.k8sConfig)
		return nil, nil
	}
	log.Info("pod labels from the Kubernetes API", "api", cmp.Or(kc.APIServer, "in-cluster service account"), "node", cfg.host)
	cs, _, err := k8s.Clientset(kc)
	if err != nil {
		return nil, fmt.Errorf("--k8s-config %s: %w", cfg.k8sConfig, err)
	}
	pc, err := k8s.NewPodCache(cs, cfg.host, cfg.k8sPodWait, log)
	if err != nil {
		return nil, fmt.Errorf("--k8s-config %s: %w", cfg.k8sConfig, err)
	}
	return pc, nil
}

// upstreamDevice is the device the host reaches the first DNS upstream by now (before any
// endpoint's host route exists): forwarded queries are bound to it, so no endpoint whose
// address is an upstream's can receive them. "" when it cannot be told.
func upstreamDevice(ups []string, log *slog.Logger) string {
	if len(ups) == 0 {
		return ""
	}
	ap, err := netip.ParseAddrPort(ups[0])
	if err != nil {
		return ""
	}
	routes, err := netlink.RouteGet(ap.Addr().AsSlice())
	if err != nil || len(routes) == 0 {
		log.Warn("DNS upstream: no route now; forwarded queries are not bound to a device", "upstream", ups[0], "err", err)
		return ""
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

// lateInspect is the inspect API's handler: the agent's once it exists (serve), before
// that /livez 200 and 503 for everything else.
type lateInspect struct {
	h         atomic.Pointer[http.Handler]
	bodyFirst func(http.Handler) http.Handler // httpserve's, for the agent's handler
}

func (l *lateInspect) serve(h http.Handler) { l.h.Store(&h) }

func (l *lateInspect) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := l.h.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/livez" && r.Method == http.MethodGet {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
		return
	}
	http.Error(w, "netplugin is starting: waiting for etcd, netmaster's global config or the datapath (its log says which)", http.StatusServiceUnavailable)
}

// lateDirectory is the DNS responder's directory until (and after) the agent exists.
type lateDirectory struct{ a atomic.Pointer[agent.Agent] }

func (l *lateDirectory) Asker(ifindex int) (dnsresp.Asker, bool) {
	if a := l.a.Load(); a != nil {
		return a.Asker(ifindex)
	}
	return dnsresp.Asker{}, false
}

func (l *lateDirectory) Lookup(tenant, name string) ([]netip.Addr, bool) {
	if a := l.a.Load(); a != nil {
		return a.Lookup(tenant, name)
	}
	return nil, false
}

func newDriver(ctx context.Context, cfg config, steps ebpf.StepObserver) (dataplane.Driver, error) {
	hc := dataplane.HostConfig{
		Host: cfg.host, VTEP: cfg.vtep, VXLANPort: cfg.vxlanPort, VLANIf: cfg.vlanIf,
		FwdMode: cfg.fwdMode, CTQuota: cfg.ctQuota,
	}
	switch cfg.dataplane {
	case "ebpf":
		if err := ensureBPFFS(cfg.bpffsRoot); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(cfg.bpffsRoot, 0o700); err != nil {
			return nil, fmt.Errorf("create --bpffs-root %s: %w", cfg.bpffsRoot, err)
		}
		d, err := ebpf.New(ctx, hc, ebpf.Options{
			PinRoot:             filepath.Join(cfg.bpffsRoot, cfg.host),
			SNATIP:              cfg.snatIP,
			EgressIf:            cfg.egressIf,
			EgressPortMin:       cfg.egressPorts[0],
			EgressPortMax:       cfg.egressPorts[1],
			EgressAllowMetadata: cfg.allowMetadata,
			Encrypted:           cfg.encryption == "wireguard",
			XDP:                 cfg.xdp,
			DNSIP:               cfg.dnsListen.Addr(),
			StepObserver:        steps,
		})
		if err != nil {
			return nil, fmt.Errorf("start ebpf dataplane: %w", err)
		}
		return d, nil
	case "ovs":
		dir := cfg.ovsDir
		if dir == "" && cfg.ovsDB == "" {
			dir = filepath.Join("/run/contivbpf/ovs", cfg.host)
		}
		d, err := ovs.New(ctx, hc, ovs.Options{Dir: dir, DBSocket: cfg.ovsDB})
		if err != nil {
			return nil, fmt.Errorf("start ovs dataplane: %w", err)
		}
		return d, nil
	default:
		return nil, fmt.Errorf("--dataplane %q: not available", cfg.dataplane)
	}
}

// uplinkMTU is Contiv's rule: the lowest MTU among the host's links, ignoring loopback,
// container veths and virtual devices; 1500 if there is none.
func uplinkMTU(log *slog.Logger) int {
	links, err := netlink.LinkList()
	if err != nil {
		log.Warn("list links for uplink MTU, assuming 1500", "err", err)
		return 1500
	}
	best := 0
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.MTU == 0 {
			continue
		}
		skip := false
		for _, p := range []string{"docker", "veth", "vport", "cbv", "lo"} {
			if strings.HasPrefix(a.Name, p) {
				skip = true
			}
		}
		switch l.Type() {
		case "vxlan", "bridge", "tun", "dummy", "openvswitch":
			skip = true
		}
		if skip {
			continue
		}
		if best == 0 || a.MTU < best {
			best = a.MTU
		}
	}
	if best == 0 {
		return 1500
	}
	return best
}

// inspectService is the registration of the inspect API listening on addr, for netctl
// --all (netmaster's GET /agents): none when it listens on loopback only (nobody else
// could reach it); the control address stands for an unspecified one.
func inspectService(addr net.Addr, ctrl netip.Addr, host string) (cluster.ServiceInfo, bool) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta.IP.IsLoopback() {
		return cluster.ServiceInfo{}, false
	}
	ip := ta.IP.String()
	if ta.IP.IsUnspecified() {
		if !ctrl.IsValid() {
			return cluster.ServiceInfo{}, false
		}
		ip = ctrl.String()
	}
	return cluster.ServiceInfo{ServiceName: cluster.ServiceInspect, HostAddr: ip, Port: ta.Port, Hostname: host}, true
}

// etcdAccess is the netmaster call enrollEtcd makes.
type etcdAccess interface {
	EtcdAccess(ctx context.Context, req model.EtcdAccessRequest) (model.EtcdAccessResponse, error)
}

// enrollEtcd asks netmaster for write access to this host's registration keys (etcd RBAC,
// docs/security.md): retried for up to 30 s while netmaster cannot be reached, then the
// registrations are tried anyway (they fail if RBAC is on). A refusal (an identity not
// bound to this host, a key another host holds) stops netplugin with netmaster's reason.
func enrollEtcd(ctx context.Context, mc etcdAccess, regs []cluster.ServiceInfo, log *slog.Logger) error {
	req := model.EtcdAccessRequest{}
	for _, si := range regs {
		req.Registrations = append(req.Registrations, model.EtcdRegistration{ServiceName: si.ServiceName, HostAddr: si.HostAddr, Port: si.Port})
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wait := retry.New(250*time.Millisecond, 3*time.Second)
	for {
		resp, err := mc.EtcdAccess(ctx, req)
		var he *masterclient.HTTPError
		switch {
		case err == nil:
			if resp.Managed {
				log.Info("etcd registrations enrolled with netmaster (etcd RBAC)", "user", resp.User)
			}
			return nil
		case errors.As(err, &he) && he.Status == http.StatusNotFound:
			return nil // a netmaster without the route manages no etcd users
		case errors.As(err, &he) && he.Status >= 400 && he.Status < 500:
			return fmt.Errorf("netmaster refused this host's etcd registrations (etcd RBAC): %w", err)
		}
		if !wait.Wait(ctx) {
			log.Warn("etcd registrations not enrolled with netmaster (unreachable): registering anyway", "err", err)
			return nil
		}
	}
}

// authPollEvery is how often a netplugin started on an etcd without auth checks whether
// auth came on.
const authPollEvery = 5 * time.Second

// enrollWhenAuthOn waits (checking every `every`) until authOn reports etcd's auth on, then
// enrolls regs with netmaster (enrollEtcd) once; a refusal is logged, as netplugin runs.
func enrollWhenAuthOn(ctx context.Context, authOn func(context.Context) (bool, error), mc etcdAccess,
	regs []cluster.ServiceInfo, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if on, err := authOn(ctx); err != nil || !on {
			continue
		}
		log.Info("etcd auth came on: enrolling this host's registrations with netmaster")
		if err := enrollEtcd(ctx, mc, regs, log); err != nil {
			log.Error("etcd registrations not enrolled: they stay refused until netplugin restarts", "err", err)
		}
		return
	}
}

// wgOverhead is what WireGuard adds to a packet (IPv6 outer header: the larger).
const wgOverhead = 80

// followedEncryption sets cfg.encryption to the cluster's setting (netctl global set
// --encryption) when --encryption was not given, waiting for netmaster's global config
// as the agent does, and refuses a setting this host cannot run (wireguard on the ovs
// dataplane: its traffic would go in clear). A later change of the setting is followed
// by clusterenc.
func followedEncryption(ctx context.Context, cfg *config, store *state.Store, log *slog.Logger) error {
	if cfg.encryptionSet {
		return nil
	}
	g, err := agent.WaitGlobalConfig(ctx, store, time.Second, log)
	if err != nil {
		return err
	}
	cfg.encryption = clusterenc.Decide(cfg.encryption, false, g)
	if cfg.encryption != model.EncryptionNone && cfg.encryption != model.EncryptionWireGuard {
		// (A newer netmaster's mode: running it as none would send in clear.)
		return fmt.Errorf("the cluster's encryption setting %q is not one this netplugin runs (none, wireguard); start with --encryption none to run this host in clear", cfg.encryption)
	}
	log.Info("encryption between hosts from the cluster's setting (no --encryption)", "encryption", cfg.encryption)
	return cfg.checkEncryption("the cluster's encryption setting wireguard (netctl global set --encryption; start with --encryption none to run this host in clear)")
}

// overlayBlock is how this host stops and lets go its overlay traffic to other hosts in
// the network namespace at ns ("": netplugin's) when the cluster's setting turns to
// wireguard while it runs without (clusterenc.Config.Block, Unblock): wgsteer's policy
// rules. The ovs dataplane's userspace VXLAN is routed by OVS's own table, which those
// rules never see: there the block is refused, so /healthz says the traffic goes in
// clear instead of claiming it dropped (and a restart refuses the setting on ovs).
func overlayBlock(cfg config, ns string) (block, unblock func() error) {
	r := wgsteer.Routing{VXLANPort: cfg.vxlanPort}
	unblock = func() error { return wgsteer.Uninstall(ns, r) }
	if cfg.dataplane != "ebpf" {
		return func() error {
			return fmt.Errorf("the %s dataplane's VXLAN is not routed by the kernel's rules: it cannot be blocked and goes in clear; stop this netplugin or move the host to --dataplane ebpf", cfg.dataplane)
		}, unblock
	}
	return func() error { return wgsteer.Block(ns, r) }, unblock
}

// healths is what /healthz says of encryption: the first of them degraded.
type healths []agent.EncryptionHealth

func (h healths) Degraded() string {
	for _, e := range h {
		if d := e.Degraded(); d != "" {
			return d
		}
	}
	return ""
}

// encryption opens the WireGuard device and installs the steering of VXLAN traffic into
// it (--encryption wireguard), or, without, removes steering a previous run left (else
// the overlay would stay blackholed). The device dies with the process; the steering
// rules stay, so traffic to peers is dropped rather than sent in clear while netplugin is
// down. While the steering runs, the key file is followed (changed, or SIGHUP): a new
// key is taken and published at once (key rotation, docs/encryption.md).
func encryption(ctx context.Context, cfg config, mc *masterclient.Client, dir *lateDirectory, log *slog.Logger) (*wgsteer.Steer, func(), error) {
	routing := wgsteer.Routing{VXLANPort: cfg.vxlanPort}
	if cfg.encryption != "wireguard" {
		if err := wgsteer.Uninstall("", routing); err != nil {
			log.Warn("remove WireGuard steering of a previous run", "err", err)
		}
		return nil, nil, nil
	}
	tun, err := wgtunnel.Open(ctx, wgtunnel.Config{Name: cfg.wgDevice, StateDir: cfg.wgDir, ListenPort: cfg.wgPort,
		Address: netip.MustParsePrefix(wgsteer.DeviceAddress), MTU: cfg.uplinkMTU - wgOverhead,
		FirewallMark: wgsteer.DefaultMark, Log: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--encryption wireguard: %w", err)
	}
	steer, err := wgsteer.Install(wgsteer.Config{Device: tun, Key: tun, Directory: mc, Host: cfg.host, VTEP: cfg.vtep, Routing: routing,
		Peers: func() []dataplane.Peer {
			if a := dir.a.Load(); a != nil {
				return a.Peers()
			}
			return nil
		}, Log: log})
	if err != nil {
		tun.Close()
		return nil, nil, fmt.Errorf("--encryption wireguard: %w", err)
	}
	return steer, func() {
		steer.Close()
		if err := tun.Close(); err != nil {
			log.Warn("close WireGuard device", "err", err)
		}
	}, nil
}
