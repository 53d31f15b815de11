// Command netmaster is the Contiv-compatible control plane: the REST API on :9999, IPAM and
// tag allocation (pkg/master), leader election and service registration on etcd
// (pkg/cluster). Without --etcd-endpoints it runs an embedded single-node etcd.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/klog/v2"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/buildinfo"
	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/etcdrbac"
	"github.com/contivbpf/contivbpf/pkg/filewatch"
	"github.com/contivbpf/contivbpf/pkg/httpserve"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/k8ssync"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

func env(names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "CONTIV_NETMASTER_" + n
	}
	return out
}

func main() {
	// SIGHUP reloads the token, client CA and CRL files, once their reloaders run (after
	// etcd and the API are up); until then it must not kill netmaster.
	filewatch.HoldSIGHUP()
	app := &cli.App{
		Name:    "netmaster",
		Usage:   "Contiv-compatible network control plane (REST API, IPAM, leader election)",
		Version: buildinfo.Get().String(),
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen-url", Aliases: []string{"external-address"}, Value: "0.0.0.0:9999", EnvVars: env("LISTEN_URL", "EXTERNAL_ADDRESS"), Usage: "`ADDR` to serve the REST API on"},
			&cli.StringFlag{Name: "control-url", Aliases: []string{"internal-address"}, EnvVars: env("CONTROL_URL", "INTERNAL_ADDRESS"), Usage: "`IP:PORT` other nodes reach this netmaster at (leader lock value, registration); default <host IP>:<listen port>"},
			&cli.StringFlag{Name: "etcd-endpoints", Aliases: []string{"etcd"}, EnvVars: env("ETCD_ENDPOINTS"), Usage: "comma-separated etcd client URLs; empty runs an embedded etcd"},
			&cli.StringFlag{Name: "etcd-data-dir", Value: "/var/lib/contiv/etcd", EnvVars: env("ETCD_DATA_DIR"), Usage: "embedded etcd data `DIR`"},
			&cli.StringFlag{Name: "etcd-listen-client-url", Value: "http://127.0.0.1:2379", EnvVars: env("ETCD_LISTEN_CLIENT_URL"), Usage: "embedded etcd client `URL`"},
			&cli.StringFlag{Name: "etcd-cacert", EnvVars: env("ETCD_CACERT"), Usage: "CA `FILE` etcd's certificate is checked against (etcd over TLS)"},
			&cli.StringFlag{Name: "etcd-cert", EnvVars: env("ETCD_CERT"), Usage: "client certificate `FILE` for etcd (with --etcd-key)"},
			&cli.StringFlag{Name: "etcd-key", EnvVars: env("ETCD_KEY"), Usage: "private key `FILE` of --etcd-cert"},
			&cli.StringFlag{Name: "etcd-server-cert", EnvVars: env("ETCD_SERVER_CERT"), Usage: "embedded etcd serves TLS with this certificate `FILE` (https:// client URL; with --etcd-server-key)"},
			&cli.StringFlag{Name: "etcd-server-key", EnvVars: env("ETCD_SERVER_KEY"), Usage: "private key `FILE` of --etcd-server-cert"},
			&cli.StringFlag{Name: "etcd-client-ca", EnvVars: env("ETCD_CLIENT_CA"), Usage: "embedded etcd accepts only client certificates signed by this CA `FILE`"},
			&cli.StringFlag{Name: "etcd-client-crl", EnvVars: env("ETCD_CLIENT_CRL"), Usage: "embedded etcd refuses the client certificates this revocation list `FILE` names (one PEM or DER X.509 CRL signed by --etcd-client-ca; reloaded on change and SIGHUP, the last good list stays in force if it breaks)"},
			&cli.BoolFlag{Name: "etcd-rbac", Value: true, EnvVars: env("ETCD_RBAC"), Usage: "with the embedded etcd's --etcd-client-ca: turn etcd's auth on (--etcd-cert's CN and root are root) and give each agent bound to its host a user host:<host> that writes only that host's keys (agents' etcd certificates need CN host:<host>); with --etcd-endpoints and --etcd-cert: never turns auth on, but once it is on (and --etcd-cert's CN is root) manages the agents' users too; false: netmaster manages no etcd users and leaves etcd's auth as it is (off unless an earlier start turned it on: then every client certificate reads and writes every key)"},
			&cli.StringFlag{Name: "etcd-listen-peer-url", EnvVars: env("ETCD_LISTEN_PEER_URL"), Usage: "embedded etcd peer `URL` (default: client port + 1)"},
			&cli.StringFlag{Name: "mode", Aliases: []string{"plugin-mode", "cluster-mode"}, Value: "docker", EnvVars: env("MODE"), Usage: "docker | kubernetes | swarm-mode"},
			&cli.StringFlag{Name: "k8s-config", EnvVars: env("K8S_CONFIG"), Value: k8s.DefaultConfigPath, Usage: "Contiv's Kubernetes client config `FILE` (K8S_API_SERVER, K8S_CA, K8S_CERT/K8S_KEY, K8S_TOKEN); in kubernetes mode the leader syncs Services/EndpointSlices through it (else, in a pod, the service account)"},
			&cli.StringFlag{Name: "netmode", Aliases: []string{"network-mode"}, Value: "vxlan", EnvVars: env("NET_MODE"), Usage: "vlan | vxlan"},
			&cli.StringFlag{Name: "fwdmode", Aliases: []string{"forward-mode"}, Value: "routing", EnvVars: env("FORWARD_MODE"), Usage: "bridge | routing (vxlan needs routing)"},
			&cli.StringFlag{Name: "infra", Aliases: []string{"infra-type"}, Value: "default", EnvVars: env("INFRA"), Usage: "default | aci | aci-opflex"},
			&cli.StringFlag{Name: "plugin-name", Aliases: []string{"name"}, Value: "netplugin", EnvVars: env("PLUGIN_NAME"), Usage: "docker network/IPAM driver name"},
			&cli.DurationFlag{Name: "leader-ttl", Value: cluster.DefaultLeaderTTL, EnvVars: env("LEADER_TTL"), Usage: "lease TTL of the leader lock: a dead leader is replaced within this time"},
			&cli.DurationFlag{Name: "service-ttl", Value: cluster.DefaultServiceTTL, EnvVars: env("SERVICE_TTL"), Usage: "lease TTL of service registrations"},
			&cli.IntFlag{Name: "rpc-port", Value: 9001, EnvVars: env("RPC_PORT"), Usage: "port registered as netmaster.rpc (0: do not register)"},
			&cli.StringFlag{Name: "tls-cert", EnvVars: env("TLS_CERT"), Usage: "serve HTTPS with this certificate `FILE` (with --tls-key)"},
			&cli.StringFlag{Name: "tls-key", EnvVars: env("TLS_KEY"), Usage: "private key `FILE` of --tls-cert"},
			&cli.StringFlag{Name: "tls-client-ca", EnvVars: env("TLS_CLIENT_CA"), Usage: "accept client certificates signed by this CA `FILE` (role = certificate O, name = CN; reloaded on change and SIGHUP)"},
			&cli.StringFlag{Name: "tls-crl", EnvVars: env("TLS_CRL"), Usage: "refuse the client certificates this revocation list `FILE` names (PEM or DER X.509 CRL signed by --tls-client-ca; reloaded on change and SIGHUP, the last good list stays in force if it breaks)"},
			&cli.StringFlag{Name: "tls-peer-ca", EnvVars: env("TLS_PEER_CA"), Usage: "CA `FILE` followers trust when proxying to the leader over HTTPS (default: system roots)"},
			&cli.StringFlag{Name: "auth-tokens", EnvVars: env("AUTH_TOKENS"), Usage: "bearer tokens `FILE`: lines \"<token> <role> [<name>]\" (roles admin, read-only, agent, netmaster, tenant-admin:<tenant>); mode 0600"},
			&cli.BoolFlag{Name: "insecure", EnvVars: env("INSECURE"), Usage: "serve plain HTTP (without --auth-tokens: no authentication at all); only for a trusted network"},
			&cli.Int64Flag{Name: "etcd-quota-bytes", Value: 2 << 30, EnvVars: env("ETCD_QUOTA_BYTES"), Usage: "etcd backend quota: the embedded etcd's, and what /healthz and /metrics measure an external cluster against"},
			&cli.DurationFlag{Name: "etcd-defrag-interval", Value: 10 * time.Minute, EnvVars: env("ETCD_DEFRAG_INTERVAL"), Usage: "how often the embedded etcd is checked for wasted space and, after a NOSPACE alarm, for room to lift it (0: never)"},
			&cli.Int64Flag{Name: "etcd-defrag-min-bytes", Value: 64 << 20, EnvVars: env("ETCD_DEFRAG_MIN_BYTES"), Usage: "defragment the embedded etcd when at least this many bytes of its file are unused"},
			&cli.IntFlag{Name: "max-conns", EnvVars: env("MAX_CONNS"), Usage: "cap on open API connections; at the cap the oldest connection that sent no request is closed (0: RLIMIT_NOFILE - 1024)"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: env("LOG_LEVEL"), Usage: "debug | info | warn | error"},
			&cli.BoolFlag{Name: "use-json-log", Aliases: []string{"json-log"}, EnvVars: env("USE_JSON_LOG"), Usage: "log JSON lines"},
			&cli.BoolFlag{Name: "check-config", Usage: "validate the flags and environment, print \"configuration ok\" and exit (0, or 22 naming the problem)"},
		}, quotaCLIFlags()...),
		Action: func(c *cli.Context) error {
			cfg, err := configFrom(c)
			if err != nil {
				return cli.Exit(fmt.Sprintf("netmaster: %v", err), 22)
			}
			if c.Bool("check-config") {
				fmt.Println("configuration ok")
				return nil
			}
			if n, err := httpserve.RaiseFDLimit(); err != nil {
				slog.Warn("raise the open-file limit", "err", err)
			} else {
				slog.Info("open-file limit", "nofile", n)
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := run(ctx, cfg); err != nil {
				// Never exit without saying why.
				slog.Error("netmaster exiting", "err", err)
				return cli.Exit("", 1)
			}
			slog.Info("netmaster stopped")
			return nil
		},
	}
	if err := app.Run(os.Args); err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, msg)
		}
		os.Exit(1)
	}
}

type config struct {
	listen, control        string
	etcdEndpoints          []string
	etcdDir, etcdClient    string
	etcdPeer               string
	mode, netMode, fwdMode string
	infra, pluginName      string
	leaderTTL, serviceTTL  time.Duration
	rpcPort                int
	maxConns               int
	tlsFiles               tlsconf.Files
	peerCA, tokensFile     string
	insecure               bool
	etcdQuota              int64
	defragEvery            time.Duration
	defragMin              int64
	etcdTLS                tlsconf.Files // netmaster's own etcd client
	etcdServer             tlsconf.Files // the embedded etcd's listener (CA = client CA)
	etcdRBAC               bool          // manage the embedded etcd's users (--etcd-rbac with a client CA)
	joinRBAC               bool          // --etcd-endpoints: manage users too if auth is on and our CN is root
	k8sConfig              string
	k8sConfigSet           bool
	quota                  map[string]int64 // default per-tenant limits by kind
}

func configFrom(c *cli.Context) (config, error) {
	cfg := config{
		listen: c.String("listen-url"), control: c.String("control-url"),
		etcdDir: c.String("etcd-data-dir"), etcdClient: c.String("etcd-listen-client-url"), etcdPeer: c.String("etcd-listen-peer-url"),
		mode: c.String("mode"), netMode: c.String("netmode"), fwdMode: c.String("fwdmode"),
		k8sConfig: c.String("k8s-config"), k8sConfigSet: c.IsSet("k8s-config"),
		infra: c.String("infra"), pluginName: c.String("plugin-name"),
		leaderTTL: c.Duration("leader-ttl"), serviceTTL: c.Duration("service-ttl"), rpcPort: c.Int("rpc-port"),
		maxConns: c.Int("max-conns"),
		tlsFiles: tlsconf.Files{Cert: c.String("tls-cert"), Key: c.String("tls-key"), CA: c.String("tls-client-ca"), CRL: c.String("tls-crl")},
		peerCA:   c.String("tls-peer-ca"), tokensFile: c.String("auth-tokens"), insecure: c.Bool("insecure"),
		etcdQuota:   c.Int64("etcd-quota-bytes"),
		defragEvery: c.Duration("etcd-defrag-interval"), defragMin: c.Int64("etcd-defrag-min-bytes"),
		etcdTLS:    tlsconf.Files{CA: c.String("etcd-cacert"), Cert: c.String("etcd-cert"), Key: c.String("etcd-key")},
		etcdServer: tlsconf.Files{Cert: c.String("etcd-server-cert"), Key: c.String("etcd-server-key"), CA: c.String("etcd-client-ca"), CRL: c.String("etcd-client-crl")},
	}
	level := new(slog.LevelVar)
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return cfg, fmt.Errorf("--log-level %q: %w", c.String("log-level"), err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Bool("use-json-log") {
		slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, opts)))
	} else {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, opts)))
	}
	for _, e := range strings.Split(c.String("etcd-endpoints"), ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.etcdEndpoints = append(cfg.etcdEndpoints, e)
		}
	}
	cfg.listen = strings.TrimPrefix(cfg.listen, "http://")
	lh, lp, err := net.SplitHostPort(cfg.listen)
	if err != nil {
		return cfg, fmt.Errorf("--listen-url %q: want HOST:PORT: %w", cfg.listen, err)
	}
	if cfg.control == "" {
		host := lh
		if ip := net.ParseIP(lh); lh == "" || (ip != nil && ip.IsUnspecified()) {
			host = hostIP()
		}
		cfg.control = net.JoinHostPort(host, lp)
	}
	cfg.control = strings.TrimPrefix(cfg.control, "http://")
	if h, p, err := net.SplitHostPort(cfg.control); err != nil || h == "" {
		return cfg, fmt.Errorf("--control-url %q: want IP:PORT", cfg.control)
	} else if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
		return cfg, fmt.Errorf("--control-url %q: bad port", cfg.control)
	}
	switch cfg.mode {
	case "docker", "kubernetes", "swarm-mode", "test":
	default:
		return cfg, fmt.Errorf("--mode %q: want docker, kubernetes or swarm-mode", cfg.mode)
	}
	switch {
	case cfg.netMode != "vlan" && cfg.netMode != "vxlan":
		return cfg, fmt.Errorf("--netmode %q: want vlan or vxlan", cfg.netMode)
	case cfg.fwdMode != "bridge" && cfg.fwdMode != "routing":
		return cfg, fmt.Errorf("--fwdmode %q: want bridge or routing", cfg.fwdMode)
	case cfg.netMode == "vxlan" && cfg.fwdMode == "bridge":
		return cfg, errors.New("--netmode vxlan needs --fwdmode routing")
	}
	switch cfg.infra {
	case "default", "aci", "aci-opflex":
	default:
		return cfg, fmt.Errorf("--infra %q: want default, aci or aci-opflex", cfg.infra)
	}
	if cfg.etcdQuota < 16<<20 {
		return cfg, fmt.Errorf("--etcd-quota-bytes %d: at least 16 MiB", cfg.etcdQuota)
	}
	if cfg.quota, err = quotaFrom(c, cfg.etcdQuota); err != nil {
		return cfg, err
	}
	if cfg.leaderTTL < 2*time.Second {
		return cfg, fmt.Errorf("--leader-ttl %s: at least 2s", cfg.leaderTTL)
	}
	if cfg.serviceTTL < 2*time.Second {
		return cfg, fmt.Errorf("--service-ttl %s: at least 2s", cfg.serviceTTL)
	}
	tlsOn := cfg.tlsFiles.Cert != "" || cfg.tlsFiles.Key != ""
	switch {
	case (cfg.tlsFiles.Cert == "") != (cfg.tlsFiles.Key == ""):
		return cfg, errors.New("--tls-cert and --tls-key must be given together")
	case !tlsOn && !cfg.insecure:
		return cfg, errors.New("refusing to serve the API as plain HTTP: give --tls-cert/--tls-key (with --auth-tokens and/or --tls-client-ca), or --insecure for a trusted network")
	case tlsOn && cfg.insecure:
		return cfg, errors.New("--insecure and --tls-cert/--tls-key: choose one")
	case tlsOn && cfg.tokensFile == "" && cfg.tlsFiles.CA == "":
		return cfg, errors.New("--tls-cert without --auth-tokens or --tls-client-ca would let anyone write: give one (or both)")
	case !tlsOn && cfg.tlsFiles.CA != "":
		return cfg, errors.New("--tls-client-ca needs --tls-cert/--tls-key")
	}
	if len(cfg.etcdEndpoints) == 0 {
		u, err := url.Parse(cfg.etcdClient)
		if err != nil || u.Host == "" {
			return cfg, fmt.Errorf("--etcd-listen-client-url %q: want http://IP:PORT or https://IP:PORT", cfg.etcdClient)
		}
		switch {
		case (u.Scheme == "https") != (cfg.etcdServer.Cert != ""):
			return cfg, errors.New("embedded etcd: an https:// --etcd-listen-client-url and --etcd-server-cert/--etcd-server-key go together")
		case cfg.etcdServer.Cert != "" && cfg.etcdTLS.Empty():
			return cfg, errors.New("embedded etcd serves TLS: give netmaster's own client --etcd-cacert (and --etcd-cert/--etcd-key when --etcd-client-ca is set)")
		}
		if cfg.etcdRBAC = c.Bool("etcd-rbac") && cfg.etcdServer.CA != ""; cfg.etcdRBAC && cfg.etcdTLS.Cert == "" {
			return cfg, errors.New("--etcd-rbac with --etcd-client-ca: give netmaster's own --etcd-cert/--etcd-key (its CN becomes etcd's root user), or --etcd-rbac=false")
		}
	} else if given := embeddedEtcdFlags(cfg.etcdServer); given != "" {
		return cfg, fmt.Errorf("%s: only for the embedded etcd, ignored with --etcd-endpoints: configure that cluster itself (etcd --client-crl-file for a revocation list)", given)
	} else {
		cfg.joinRBAC = c.Bool("etcd-rbac") && cfg.etcdTLS.Cert != ""
	}
	return cfg, nil
}

// embeddedEtcdFlags names the flags of f (the embedded etcd's listener) that are set, ""
// when none is.
func embeddedEtcdFlags(f tlsconf.Files) string {
	var given []string
	for _, fl := range []struct{ name, value string }{{"--etcd-server-cert", f.Cert}, {"--etcd-server-key", f.Key},
		{"--etcd-client-ca", f.CA}, {"--etcd-client-crl", f.CRL}} {
		if fl.value != "" {
			given = append(given, fl.name)
		}
	}
	return strings.Join(given, ", ")
}

// hostIP is the first global-unicast IPv4 address of an up interface, else 127.0.0.1.
func hostIP() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return "127.0.0.1"
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

func run(ctx context.Context, cfg config) (err error) {
	endpoints := cfg.etcdEndpoints
	var health []func() string // more /healthz warnings
	if len(endpoints) == 0 {
		etcdCRL, err := etcdCRLCopy(cfg)
		if err != nil {
			return err
		}
		ecfg := etcdembed.Config{DataDir: cfg.etcdDir, ClientURL: cfg.etcdClient, PeerURL: cfg.etcdPeer,
			QuotaBytes: cfg.etcdQuota, CertFile: cfg.etcdServer.Cert, KeyFile: cfg.etcdServer.Key, ClientCAFile: cfg.etcdServer.CA}
		if etcdCRL != nil {
			ecfg.ClientCRLFile = etcdCRL.Path()
			go etcdCRL.Follow(ctx, slog.Default())
			health = append(health, etcdCRL.Warning)
		}
		srv, err := etcdembed.Start(ctx, ecfg)
		if err != nil {
			return err
		}
		defer srv.Close()
		endpoints = []string{srv.ClientURL()}
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		go func() {
			select {
			case err := <-srv.Err():
				cancel(fmt.Errorf("embedded etcd failed: %w", err))
			case <-ctx.Done():
			}
		}()
		defer func() {
			if cause := context.Cause(ctx); cause != nil && cause != context.Canceled && err == nil {
				err = cause
			}
		}()
	}
	sopts, err := state.TLSOptions(cfg.etcdTLS)
	if err != nil {
		return err
	}
	store, err := state.Open(ctx, endpoints, sopts...)
	if err != nil {
		return err
	}
	defer store.Close()
	if len(cfg.etcdEndpoints) == 0 && cfg.defragEvery > 0 {
		go reclaimLoop(ctx, store, cfg.defragEvery, cfg.etcdQuota, cfg.defragMin)
	}

	var rbac *etcdrbac.Manager
	switch {
	case cfg.etcdRBAC:
		if rbac, err = enableRBAC(ctx, store, cfg.etcdTLS.Cert, false); err != nil {
			return err
		}
	case cfg.joinRBAC:
		if rbac, err = enableRBAC(ctx, store, cfg.etcdTLS.Cert, true); err != nil {
			return err
		}
	}
	m, err := newMaster(ctx, store, cfg, rbac)
	if err != nil {
		return err
	}
	hostname, _ := os.Hostname()
	nc := cluster.NodeConfig{
		Store: store, ListenAddr: cfg.listen, ControlAddr: cfg.control, RPCPort: cfg.rpcPort,
		API: m.Handler(), LeaderTTL: cfg.leaderTTL, ServiceTTL: cfg.serviceTTL,
		Version: buildinfo.Get().Version, Hostname: hostname, MaxConns: cfg.maxConns, EtcdQuota: cfg.etcdQuota,
		Collectors: m.Collectors(), HealthWarnings: health,
	}
	stls, err := securityConfig(cfg, &nc)
	if err != nil {
		return err
	}
	if stls != nil {
		go stls.Follow(ctx, slog.Default())
	}
	if nc.Auth != nil && nc.Auth.Tokens != nil {
		go nc.Auth.Tokens.Follow(ctx, slog.Default())
		if rbac != nil {
			// Agents find netmaster through etcd: their users exist before their first read.
			go rbac.Follow(ctx, auth.FollowEvery, nc.Auth.Tokens.BoundHosts)
		}
	}
	if cfg.mode == "kubernetes" {
		svcs, pols, err := k8sSyncers(cfg, m)
		if err != nil {
			return err
		}
		if svcs != nil {
			nc.WhileLeader = func(ctx context.Context) {
				var wg sync.WaitGroup
				wg.Go(func() { svcs.Run(ctx) })
				wg.Go(func() { pols.Run(ctx) })
				wg.Wait()
			}
			nc.Collectors = append(nc.Collectors, svcs.Collectors()...)
			nc.Collectors = append(nc.Collectors, pols.Collectors()...)
		}
	}
	return cluster.Serve(ctx, nc)
}

// etcdCRLCopy is the embedded etcd's copy of --etcd-client-crl (nil without one): etcd
// reads one DER list at every connection and checks nothing, so it reads netmaster's copy
// in its data directory, which holds the last list that passed (tlsconf.CRLCopy).
func etcdCRLCopy(cfg config) (*tlsconf.CRLCopy, error) {
	if cfg.etcdServer.CRL == "" {
		return nil, nil
	}
	if err := os.MkdirAll(cfg.etcdDir, 0o700); err != nil {
		return nil, fmt.Errorf("--etcd-data-dir: %w", err)
	}
	return tlsconf.NewCRLCopy(cfg.etcdServer.CA, cfg.etcdServer.CRL, filepath.Join(cfg.etcdDir, "client-crl.der"), "--etcd-client-crl")
}

// k8sSyncers are the Kubernetes Services and NetworkPolicy syncers of --k8s-config (or of
// the pod's service account when the default file is missing and netmaster runs in a
// pod), nil when neither is configured. A file named explicitly must exist and parse.
func k8sSyncers(cfg config, m *master.Master) (*k8ssync.Services, *k8ssync.Policies, error) {
	kc, ok, err := k8s.ResolveConfig(cfg.k8sConfig, cfg.k8sConfigSet)
	if err != nil {
		return nil, nil, fmt.Errorf("--k8s-config: %w", err)
	}
	if !ok {
		slog.Info("kubernetes mode without an API server configured: Services and NetworkPolicies are not synced", "config", cfg.k8sConfig)
		return nil, nil, nil
	}
	cs, _, err := k8s.Clientset(kc)
	if err != nil {
		return nil, nil, fmt.Errorf("--k8s-config %s: %w", cfg.k8sConfig, err)
	}
	klog.SetSlogLogger(slog.Default().With("component", "client-go")) // client-go logs through klog
	slog.Info("kubernetes mode: the leader syncs Services, EndpointSlices and NetworkPolicies into Contiv state", "api", kc.APIServer)
	return k8ssync.NewServices(cs, m, slog.Default()), k8ssync.NewPolicies(cs, m, slog.Default()), nil
}

// securityConfig fills the API's TLS and authentication from the flags. It returns the
// server TLS (nil: plain HTTP), whose client CA and CRL the caller keeps following.
func securityConfig(cfg config, nc *cluster.NodeConfig) (*tlsconf.ServerTLS, error) {
	ac := &auth.Config{}
	if cfg.tokensFile != "" {
		t, err := auth.LoadTokens(cfg.tokensFile)
		if err != nil {
			return nil, fmt.Errorf("--auth-tokens: %w", err)
		}
		ac.Tokens = t
	}
	var stls *tlsconf.ServerTLS
	if cfg.tlsFiles.Cert != "" || cfg.tlsFiles.Key != "" {
		var err error
		if stls, err = tlsconf.NewServer(cfg.tlsFiles, "--tls-cert/--tls-key/--tls-client-ca/--tls-crl"); err != nil {
			return nil, err
		}
		tc := stls.Config
		if cfg.tlsFiles.CA != "" {
			ac.Certificates = true
			// A certificate revoked after its connection was opened stops working on it too.
			ac.CheckCertificate = stls.CheckChain
			if ac.Tokens != nil {
				tc.ClientAuth = tls.VerifyClientCertIfGiven // token callers need no certificate
			}
		}
		nc.TLS = tc
		nc.HealthWarnings = append(nc.HealthWarnings, stls.Warning)
		if w := stls.Warning(); w != "" {
			slog.Warn("client certificates", "warning", w)
		}
		if nc.PeerTLS, err = tlsconf.Client(tlsconf.Files{CA: cfg.peerCA}, "--tls-peer-ca"); err != nil {
			return nil, err
		}
		slog.Info("API serves HTTPS", "client-certificates", ac.Certificates, "crl", cfg.tlsFiles.CRL, "tokens", ac.Tokens != nil)
	} else if cfg.tlsFiles.CA != "" || cfg.tlsFiles.CRL != "" {
		return nil, fmt.Errorf("--tls-client-ca/--tls-crl need --tls-cert and --tls-key")
	} else if ac.Tokens != nil {
		slog.Warn("--insecure: API serves plain HTTP; bearer tokens cross the network in clear text")
	} else {
		ac.Open = true
		slog.Warn("--insecure without --auth-tokens: API serves plain HTTP with NO authentication; anyone who reaches it may change everything")
	}
	nc.Auth = ac
	return stls, nil
}

// versionInfo is this build in /version's form.
func versionInfo() model.VersionInfo {
	b := buildinfo.Get()
	return model.VersionInfo{Version: b.Version, GitCommit: b.GitCommit, BuildTime: b.BuildTime}
}

// newMaster bootstraps the API, retrying for a minute while etcd is unreachable (e.g. a
// cluster still forming).
func newMaster(ctx context.Context, store *state.Store, cfg config, rbac *etcdrbac.Manager) (*master.Master, error) {
	mc := master.Config{
		Store: store, FwdMode: cfg.fwdMode, Infra: cfg.infra, NetMode: cfg.netMode,
		ClusterMode: cfg.mode, PluginName: cfg.pluginName,
		Version: versionInfo(), Quota: cfg.quota,
	}
	if rbac != nil {
		mc.EtcdAccess = rbac
	}
	deadline := time.Now().Add(time.Minute)
	wait := retry.New(250*time.Millisecond, 5*time.Second)
	for {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := master.New(tctx, mc)
		cancel()
		if err == nil {
			return m, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, fmt.Errorf("start master API: %w", err)
		}
		slog.Warn("master bootstrap failed, retrying", "err", err)
		if !wait.Wait(ctx) {
			return nil, ctx.Err()
		}
	}
}

// enableRBAC turns the embedded etcd's auth on with netmaster's own etcd certificate
// (certFile) as root (docs/security.md, "etcd RBAC"). join (an etcd this netmaster does
// not run): never turn auth on, manage users while it is on (etcdrbac.Manager.Join).
func enableRBAC(ctx context.Context, store *state.Store, certFile string, join bool) (*etcdrbac.Manager, error) {
	cn, err := tlsconf.CommonName(certFile)
	if err != nil {
		return nil, fmt.Errorf("--etcd-rbac: %w", err)
	}
	rbac := etcdrbac.New(store.Client(), slog.Default())
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if join {
		on, err := rbac.Join(tctx, cn)
		if err != nil {
			return nil, fmt.Errorf("--etcd-rbac: %w", err)
		}
		if !on {
			slog.Warn("--etcd-rbac: etcd's auth is off: netmaster manages no agent users until it is on (/plugin/etcdAccess answers Managed false); every client certificate reads and writes every key")
		} else {
			slog.Info("etcd RBAC: etcd's auth is on and this netmaster's certificate is root: it manages agents' users too", "root", cn)
		}
		return rbac, nil
	}
	if err := rbac.Enable(tctx, cn); err != nil {
		return nil, fmt.Errorf("--etcd-rbac: %w", err)
	}
	return rbac, nil
}

// alarmCheckEvery is how often reclaimLoop looks for a NOSPACE alarm (at most).
const alarmCheckEvery = 5 * time.Second

// reclaimLoop keeps the embedded etcd's space: auto-compaction (by revision) frees pages
// inside the database file, defragmentation shrinks the file so the quota measures live
// data, and after a NOSPACE alarm (a caller filled the quota) the history is compacted and
// the alarm lifted once deletes made room (state.Reclaim): the API takes writes again
// without an operator. An external cluster is its operators' to look after.
func reclaimLoop(ctx context.Context, store *state.Store, every time.Duration, quota, minWaste int64) {
	t := time.NewTicker(every)
	defer t.Stop()
	// An alarm (or history past its share of the quota) is looked at more often than the
	// file's waste: writes fail while it lasts.
	alarm := time.NewTicker(min(every, alarmCheckEvery))
	defer alarm.Stop()
	full := false // NOSPACE stayed at the last look (logged once)
	for {
		waste := minWaste
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-alarm.C:
			waste = math.MaxInt64 // (defragment only under NOSPACE)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		r, err := store.Reclaim(rctx, quota, waste)
		cancel()
		switch {
		case err != nil:
			slog.Warn("embedded etcd space", "err", err)
		case r.Disarmed:
			slog.Info("embedded etcd had room again: NOSPACE alarm lifted", "compacted-to", r.Compacted, "defragmented", r.Defragmented)
		case r.StillFull && !full:
			slog.Error("embedded etcd is full of live data (NOSPACE): writes fail until objects are deleted or --etcd-quota-bytes is raised", "quota", quota)
		case len(r.Defragmented) > 0:
			slog.Info("embedded etcd defragmented", "endpoints", r.Defragmented)
		}
		full = err == nil && r.StillFull
	}
}
