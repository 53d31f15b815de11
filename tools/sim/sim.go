// Package sim builds a simulated cluster on one machine: N hosts as network namespaces
// joined by an underlay (one veth wire for two hosts; a Linux bridge in an "underlay"
// namespace for more), netmaster with its embedded etcd inside the first host, one
// netplugin per host (started with nsenter so bpffs stays visible), and containers as
// network namespaces attached through each host's CNI socket. Close removes everything it
// created: processes, namespaces, bpffs pins and its work directory.
//
// It drives the real binaries (bin/netmaster, bin/netplugin, bin/netctl) and knows nothing
// about their internals beyond flags and documented APIs.
package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/contivbpf/contivbpf/internal/testkit/k8stest"
	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ovs"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// Config describes a simulated cluster.
type Config struct {
	// Prefix names every namespace, pin directory and work directory ("" = "cbs" + 4
	// random hex digits, unique per run). At most 8 bytes.
	Prefix string
	// Hosts is the number of hosts (at least 1).
	Hosts int
	// BinDir holds netmaster, netplugin and netctl.
	BinDir string
	// Dataplane is passed to netplugin --dataplane (default ebpf).
	Dataplane string
	// Underlay is the subnet host addresses come from (default 192.168.100.0/24; host i
	// gets the i-th address).
	Underlay netip.Prefix
	// WorkDir is where logs, sockets and etcd data go ("" = a new temp dir, removed on
	// Close; a given dir is kept).
	WorkDir string
	// FwdMode is Contiv's forwarding mode for netmaster and every netplugin (default
	// routing: Contiv's netmaster refuses vxlan with bridge).
	FwdMode string
	// NetmasterArgs, if set, replaces the netmaster command line (after the binary).
	NetmasterArgs func(c *Cluster) []string
	// Logger receives progress lines (default slog.Default()).
	Logger *slog.Logger
	// Secure runs netmaster with HTTPS and bearer tokens (certificates made in the work
	// dir with pkg/pki): netplugins use an agent token, the cluster's own calls and
	// Netctl an admin token. Default: --insecure (plain HTTP, no authentication).
	Secure bool
	// PluginArgs, if set, returns extra netplugin arguments for h, appended to the
	// default command line (a repeated flag overrides, e.g. "--mode docker").
	PluginArgs func(c *Cluster, h *Host) []string
	// VLANUplink passes `--vlan-if uplink` to every netplugin: the underlay wire is also
	// the 802.1Q uplink of VLAN networks (eBPF dataplane; OVS would take the wire over).
	VLANUplink bool
	// ReadySocket, if set, is the socket whose existence tells WaitReady that h's runtime
	// front-end is up (default: h.CNISocket; docker mode serves the Docker plugin socket).
	ReadySocket func(h *Host) string
	// External adds the namespace "<prefix>-ext" on the underlay (the hosts then share a
	// bridge even when there are two): it stands in for the router and the Internet, with
	// the underlay's last usable address and ExternalWorld on its loopback. Every host
	// gets a default route via it; it forwards nothing.
	External bool
	// BGPRouter adds the top-of-rack router namespace "<prefix>-tor" (router.go) with a
	// link to every host ("bgp", passed as --vlan-if): VLAN networks in routing mode are
	// then routed natively through it once bgp objects name the hosts and StartFRR ran.
	BGPRouter bool
	// KubeAPI runs a real kube-apiserver (internal/testkit/k8stest, with Debian's etcd) inside the
	// first host's namespace before netmaster starts: netmaster gets --mode kubernetes
	// --k8s-config (its leader syncs Services), every netplugin for which KubeAPIPlugin
	// says so (nil: all) gets --k8s-config (pod labels). Cluster.KubeAPI is the server.
	KubeAPI       bool
	KubeAPIPlugin func(c *Cluster, h *Host) bool
	// EtcdMembers, when not 0, runs an external etcd cluster of that many members
	// (Debian's etcd, in the first host's namespace, etcd.go) instead of netmaster's
	// embedded one; netmaster and every netplugin get all members as --etcd-endpoints.
	// Not with Secure.
	EtcdMembers int
}

// ExternalWorld is the address the external namespace holds for "the Internet"
// (TEST-NET-3: it exists only inside the simulation).
var ExternalWorld = netip.MustParseAddr("203.0.113.1")

// ExternalName is the one name the external namespace's DNS server (ExternalWorld:53, every
// netplugin's --dns-upstream) knows: it resolves to ExternalWorld; everything else is
// NXDOMAIN.
const ExternalName = "outside.example."

// External is the simulation's stand-in for everything outside the cluster.
type External struct {
	NS    string     // namespace name
	IP    netip.Addr // its underlay address (the hosts' default gateway)
	World netip.Addr // ExternalWorld
	dns   *dns.Server
}

// Host is one simulated host.
type Host struct {
	Name      string // host label and namespace name
	IP        netip.Addr
	CNISocket string
	Inspect   string // inspect API address inside the host namespace
	Plugin    *Process
	c         *Cluster
	// agentTokenFile holds its netplugin's netmaster token (Config.Secure), bound to it.
	agentTokenFile string
	// etcdCert is its netplugin's etcd client certificate and key (Config.Secure), CN
	// host:<Name>: netmaster's etcd RBAC user of this host.
	etcdCert [2]string
}

// Container is a network namespace attached to a host through its CNI socket.
type Container struct {
	Name       string // namespace name
	Host       *Host
	ID         string // infra container id sent to the agent
	EndpointID string // Contiv endpoint id
	IP         netip.Prefix
	MAC        string
	Network    string
	Tenant     string
	Group      string // endpoint group ("" = none)
}

// Cluster is a running simulation.
type Cluster struct {
	cfg      Config
	Prefix   string
	WorkDir  string
	PinRoot  string
	Hosts    []*Host
	External *External          // with Config.External
	KubeAPI  *k8stest.APIServer // with Config.KubeAPI
	kubeConf map[string]string  // contiv.json per identity, with Config.KubeAPI
	Router   *Router            // with Config.BGPRouter
	Master   *Process
	MasterIP netip.Addr
	log      *slog.Logger

	// CACert and AdminToken are set with Config.Secure: what a client needs to talk to
	// netmaster (CACert verifies its certificate).
	CACert, AdminToken string
	// InspectToken is an admin token of every netplugin's inspect API.
	InspectToken      string
	inspectTokensFile string
	tokensFile        string
	serverCert        [2]string
	// etcd over TLS with client certificates (Secure): the embedded etcd's certificate and
	// netmaster's client certificate (each host's is Host.etcdCert).
	etcdServer, etcdMaster [2]string
	etcd                   []*Process // Config.EtcdMembers' members

	mu         sync.Mutex
	namespaces []string // created, in creation order
	containers []*Container
	listeners  []net.Listener // ServeName's, closed by Close
	ownWorkDir bool
}

// Ports inside host namespaces.
const (
	MasterPort  = 9999
	EtcdPort    = 2379
	InspectPort = 9090
)

// EtcdURL is the cluster etcd's client URL (the embedded etcd's, or the first external
// member's), reachable from every host over the underlay.
func (c *Cluster) EtcdURL() string {
	scheme := "http"
	if c.cfg.Secure {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s:%d", scheme, c.MasterIP, EtcdPort)
}

// MasterURL is netmaster's REST URL.
func (c *Cluster) MasterURL() string {
	scheme := "http"
	if c.cfg.Secure {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s:%d", scheme, c.MasterIP, MasterPort)
}

// setupPKI writes a CA, netmaster's certificate and the token files into the work dir.
func (c *Cluster) setupPKI() error {
	dir := filepath.Join(c.WorkDir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sim: pki dir: %w", err)
	}
	ca, err := pki.NewCA(c.Prefix + "-ca")
	if err != nil {
		return err
	}
	if c.CACert, err = ca.WriteCA(dir, "ca.crt"); err != nil {
		return err
	}
	srv, err := ca.Issue(pki.Options{CommonName: "netmaster", Hosts: []string{c.MasterIP.String()}, Server: true})
	if err != nil {
		return err
	}
	if c.serverCert[0], c.serverCert[1], err = srv.Write(dir, "netmaster"); err != nil {
		return err
	}
	for _, x := range []struct {
		out  *[2]string
		o    pki.Options
		base string
	}{
		{&c.etcdServer, pki.Options{CommonName: "etcd", Hosts: []string{c.MasterIP.String(), "127.0.0.1"}, Server: true, Client: true}, "etcd-server"},
		{&c.etcdMaster, pki.Options{CommonName: "netmaster", Client: true}, "etcd-netmaster"},
	} {
		p, err := ca.Issue(x.o)
		if err != nil {
			return err
		}
		if x.out[0], x.out[1], err = p.Write(dir, x.base); err != nil {
			return err
		}
	}
	tok := func() string {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	c.AdminToken = tok()
	c.tokensFile = filepath.Join(dir, "tokens")
	lines := fmt.Sprintf("%s admin sim-admin\n%s netmaster sim-peers\n", c.AdminToken, tok())
	// Each netplugin's token is bound to its host (auth.HostPrefix): it may touch that
	// host's endpoints only.
	for _, h := range c.Hosts {
		agent := tok()
		lines += fmt.Sprintf("%s agent %s%s\n", agent, auth.HostPrefix, h.Name)
		// Its etcd certificate names its host: netmaster's etcd RBAC user host:<host>.
		p, err := ca.Issue(pki.Options{CommonName: auth.HostPrefix + h.Name, Client: true})
		if err != nil {
			return err
		}
		if h.etcdCert[0], h.etcdCert[1], err = p.Write(dir, "etcd-"+h.Name); err != nil {
			return err
		}
		h.agentTokenFile = filepath.Join(dir, h.Name+".agent.token")
		if err := os.WriteFile(h.agentTokenFile, []byte(agent+"\n"), 0o600); err != nil {
			return fmt.Errorf("sim: agent token of %s: %w", h.Name, err)
		}
	}
	if err := os.WriteFile(c.tokensFile, []byte(lines), 0o600); err != nil {
		return fmt.Errorf("sim: tokens: %w", err)
	}
	return nil
}

// writeInspectTokens writes the token file every netplugin's inspect API takes
// (--inspect-token-file): one admin token, InspectToken, which InspectGet, Netctl and
// NetctlIn send.
func (c *Cluster) writeInspectTokens() error {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	c.InspectToken = hex.EncodeToString(b)
	c.inspectTokensFile = filepath.Join(c.WorkDir, "inspect.tokens")
	if err := os.WriteFile(c.inspectTokensFile, []byte(c.InspectToken+" admin sim-inspect\n"), 0o600); err != nil {
		return fmt.Errorf("sim: inspect tokens: %w", err)
	}
	return nil
}

// Start builds the cluster. On error everything created so far is removed.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("sim: needs root (network namespaces, bpffs)")
	}
	if cfg.Hosts < 1 {
		return nil, fmt.Errorf("sim: hosts %d must be at least 1", cfg.Hosts)
	}
	if cfg.Prefix == "" {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		cfg.Prefix = "cbs" + hex.EncodeToString(b)
	}
	if len(cfg.Prefix) > 8 || strings.ContainsAny(cfg.Prefix, "/ .") {
		return nil, fmt.Errorf("sim: prefix %q must be at most 8 bytes without '/', ' ' or '.'", cfg.Prefix)
	}
	if cfg.Dataplane == "" {
		cfg.Dataplane = "ebpf"
	}
	if cfg.FwdMode == "" {
		cfg.FwdMode = "routing"
	}
	if !cfg.Underlay.IsValid() {
		cfg.Underlay = netip.MustParsePrefix("192.168.100.0/24")
	}
	if cfg.EtcdMembers < 0 || cfg.EtcdMembers > 7 || (cfg.EtcdMembers > 0 && cfg.Secure) {
		return nil, fmt.Errorf("sim: etcd members %d: want 0 (embedded) to 7, and not with Secure", cfg.EtcdMembers)
	}
	if cfg.Hosts > (1<<(32-cfg.Underlay.Bits()))-4 {
		return nil, fmt.Errorf("sim: underlay %v too small for %d hosts", cfg.Underlay, cfg.Hosts)
	}
	for _, b := range []string{"netmaster", "netplugin"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("sim: binary %s: %w (run make build)", b, err)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Cluster{cfg: cfg, Prefix: cfg.Prefix, log: cfg.Logger, PinRoot: "/sys/fs/bpf/" + cfg.Prefix}
	defer func() {
		if err != nil {
			c.dumpLogs()
			c.Close()
		}
	}()
	if cfg.WorkDir == "" {
		if c.WorkDir, err = os.MkdirTemp("", cfg.Prefix+"-"); err != nil {
			return nil, fmt.Errorf("sim: work dir: %w", err)
		}
		c.ownWorkDir = true
	} else {
		c.WorkDir = cfg.WorkDir
		if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
			return nil, fmt.Errorf("sim: work dir: %w", err)
		}
	}
	if err := c.writeInspectTokens(); err != nil {
		return nil, err
	}
	if err := c.buildUnderlay(ctx); err != nil {
		return nil, err
	}
	if cfg.BGPRouter {
		if err := c.buildRouter(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.Secure {
		if err := c.setupPKI(); err != nil {
			return nil, err
		}
	}
	if cfg.KubeAPI {
		if err := c.startKubeAPI(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.EtcdMembers > 0 {
		if err := c.startEtcd(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.startMaster(ctx); err != nil {
		return nil, err
	}
	for _, h := range c.Hosts {
		if err := c.StartPlugin(ctx, h); err != nil {
			return nil, err
		}
	}
	for _, h := range c.Hosts {
		if err := h.WaitReady(ctx, 60*time.Second); err != nil {
			return nil, err
		}
	}
	c.log.Info("sim: cluster up", "prefix", c.Prefix, "hosts", len(c.Hosts), "master", c.MasterURL())
	return c, nil
}

func (c *Cluster) addNS(ctx context.Context, name string) error {
	if _, err := run(ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	c.mu.Lock()
	c.namespaces = append(c.namespaces, name)
	c.mu.Unlock()
	_, err := Exec(ctx, name, "ip", "link", "set", "lo", "up")
	return err
}

func (c *Cluster) buildUnderlay(ctx context.Context) error {
	n := c.cfg.Hosts
	bits := c.cfg.Underlay.Bits()
	addr := c.cfg.Underlay.Masked().Addr()
	for i := 1; i <= n; i++ {
		addr = addr.Next()
		h := &Host{Name: fmt.Sprintf("%s-h%d", c.Prefix, i), IP: addr, c: c}
		h.CNISocket = filepath.Join(c.WorkDir, h.Name, "contiv-cni.sock")
		// On the underlay address (not loopback): netctl on any host reaches every host's
		// netplugin, and netmaster lists them (GET /agents, netctl --all).
		h.Inspect = netip.AddrPortFrom(addr, InspectPort).String()
		if err := os.MkdirAll(filepath.Dir(h.CNISocket), 0o755); err != nil {
			return fmt.Errorf("sim: host dir: %w", err)
		}
		if err := c.addNS(ctx, h.Name); err != nil {
			return err
		}
		c.Hosts = append(c.Hosts, h)
	}
	c.MasterIP = c.Hosts[0].IP
	bridged := n > 2 || c.cfg.External
	switch {
	case n == 2 && !bridged:
		a, b := c.Hosts[0], c.Hosts[1]
		if _, err := run(ctx, "ip", "link", "add", "uplink", "netns", a.Name, "type", "veth", "peer", "name", "uplink", "netns", b.Name); err != nil {
			return err
		}
	case bridged:
		ul := c.Prefix + "-ul"
		if err := c.addNS(ctx, ul); err != nil {
			return err
		}
		if _, err := Exec(ctx, ul, "ip", "link", "add", "br0", "type", "bridge"); err != nil {
			return err
		}
		if _, err := Exec(ctx, ul, "ip", "link", "set", "br0", "up"); err != nil {
			return err
		}
		for i, h := range c.Hosts {
			port := fmt.Sprintf("h%d", i+1)
			if _, err := run(ctx, "ip", "link", "add", "uplink", "netns", h.Name, "type", "veth", "peer", "name", port, "netns", ul); err != nil {
				return err
			}
			if _, err := Exec(ctx, ul, "ip", "link", "set", port, "master", "br0", "up"); err != nil {
				return err
			}
		}
	}
	for _, h := range c.Hosts {
		if n == 1 && !bridged {
			// A lone host still needs an underlay address: use a veth whose peer stays
			// in the same namespace.
			if _, err := Exec(ctx, h.Name, "ip", "link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer"); err != nil {
				return err
			}
			if _, err := Exec(ctx, h.Name, "ip", "link", "set", "uplink-peer", "up"); err != nil {
				return err
			}
		}
		if _, err := Exec(ctx, h.Name, "ip", "addr", "add", fmt.Sprintf("%s/%d", h.IP, bits), "dev", "uplink"); err != nil {
			return err
		}
		if _, err := Exec(ctx, h.Name, "ip", "link", "set", "uplink", "up"); err != nil {
			return err
		}
	}
	if c.cfg.External {
		if err := c.buildExternal(ctx); err != nil {
			return err
		}
	}
	c.log.Info("sim: underlay built", "hosts", n, "subnet", c.cfg.Underlay)
	return nil
}

// buildExternal adds the external namespace to the underlay bridge and points every host's
// default route at it.
func (c *Cluster) buildExternal(ctx context.Context) error {
	bits := c.cfg.Underlay.Bits()
	last := c.cfg.Underlay.Masked().Addr()
	for i := 0; i < (1<<(32-bits))-2; i++ {
		last = last.Next()
	}
	e := &External{NS: c.Prefix + "-ext", IP: last, World: ExternalWorld}
	if err := c.addNS(ctx, e.NS); err != nil {
		return err
	}
	ul := c.Prefix + "-ul"
	if _, err := run(ctx, "ip", "link", "add", "uplink", "netns", e.NS, "type", "veth", "peer", "name", "ext", "netns", ul); err != nil {
		return err
	}
	for _, argv := range [][]string{
		{ul, "ip", "link", "set", "ext", "master", "br0", "up"},
		{e.NS, "ip", "addr", "add", fmt.Sprintf("%s/%d", e.IP, bits), "dev", "uplink"},
		{e.NS, "ip", "link", "set", "uplink", "up"},
		{e.NS, "ip", "addr", "add", e.World.String() + "/32", "dev", "lo"},
	} {
		if _, err := Exec(ctx, argv[0], argv[1:]...); err != nil {
			return err
		}
	}
	for _, h := range c.Hosts {
		if _, err := Exec(ctx, h.Name, "ip", "route", "add", "default", "via", e.IP.String()); err != nil {
			return err
		}
	}
	pc, err := ListenPacket(e.NS, "udp4", netip.AddrPortFrom(e.World, 53).String())
	if err != nil {
		return fmt.Errorf("sim: external DNS server: %w", err)
	}
	e.dns = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) == 1 && strings.EqualFold(r.Question[0].Name, ExternalName) && r.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: e.World.AsSlice()})
		} else if !strings.EqualFold(r.Question[0].Name, ExternalName) {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = e.dns.ActivateAndServe() }()
	c.External = e
	return nil
}

// startKubeAPI runs the API server in the first host's namespace and writes the
// contiv.json files netmaster and netplugins use (Config.KubeAPI).
func (c *Cluster) startKubeAPI(ctx context.Context) error {
	ns := c.Hosts[0].Name
	api, err := k8stest.Launch(ctx, k8stest.Options{NetNS: ns, IP: c.Hosts[0].IP.String(),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialContext(ctx, ns, network, addr)
		}})
	if err != nil {
		return fmt.Errorf("sim: kube-apiserver: %w", err)
	}
	c.KubeAPI = api
	c.kubeConf = map[string]string{}
	for _, user := range []string{k8stest.UserNetmaster, k8stest.UserNetplugin} {
		p, _, err := api.WriteContivConfig(c.WorkDir, user)
		if err != nil {
			return fmt.Errorf("sim: kube-apiserver config: %w", err)
		}
		c.kubeConf[user] = p
	}
	c.log.Info("sim: kube-apiserver up", "url", api.URL)
	return nil
}

// DefaultMasterArgs is netmaster's command line when Config.NetmasterArgs is not set (a
// NetmasterArgs function may extend it).
func (c *Cluster) DefaultMasterArgs() []string {
	args := []string{
		"--etcd-data-dir", filepath.Join(c.WorkDir, "etcd"),
		"--etcd-listen-client-url", c.EtcdURL(),
	}
	if c.cfg.EtcdMembers > 0 {
		args = []string{"--etcd-endpoints", strings.Join(c.EtcdEndpoints(), ",")}
	}
	args = append(args,
		"--listen-url", fmt.Sprintf("%s:%d", c.MasterIP, MasterPort),
		"--control-url", fmt.Sprintf("%s:%d", c.MasterIP, MasterPort),
		"--fwdmode", c.cfg.FwdMode, "--netmode", "vxlan", "--mode", "kubernetes",
	)
	if c.KubeAPI != nil {
		args = append(args, "--k8s-config", c.kubeConf[k8stest.UserNetmaster])
	}
	if c.cfg.Secure {
		return append(args, "--tls-cert", c.serverCert[0], "--tls-key", c.serverCert[1], "--auth-tokens", c.tokensFile,
			"--tls-peer-ca", c.CACert,
			"--etcd-server-cert", c.etcdServer[0], "--etcd-server-key", c.etcdServer[1], "--etcd-client-ca", c.CACert,
			"--etcd-cacert", c.CACert, "--etcd-cert", c.etcdMaster[0], "--etcd-key", c.etcdMaster[1])
	}
	return append(args, "--insecure") // the simulated underlay is private to this process
}

func (c *Cluster) startMaster(ctx context.Context) error {
	args := c.DefaultMasterArgs()
	if c.cfg.NetmasterArgs != nil {
		args = c.cfg.NetmasterArgs(c)
	}
	p, err := startProcess("netmaster", c.Hosts[0].Name, filepath.Join(c.WorkDir, "netmaster.log"),
		append([]string{filepath.Join(c.cfg.BinDir, "netmaster")}, args...))
	if err != nil {
		return err
	}
	c.Master = p
	// Ready when the REST API answers.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var out []any
		err := c.MasterDo(ctx, http.MethodGet, "/api/v1/tenants/", nil, &out)
		if err == nil {
			break
		}
		if ok, perr := p.Exited(); ok {
			return fmt.Errorf("sim: netmaster exited: %v\n%s", perr, p.LogTail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: netmaster not ready after 60s: %w\n%s", err, p.LogTail(20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.log.Info("sim: netmaster up", "url", c.MasterURL(), "etcd", c.EtcdURL(), "pid", p.PID())
	return nil
}

// PluginArgs is the netplugin command line of h.
func (c *Cluster) PluginArgs(h *Host) []string {
	args := []string{
		"--mode", "kubernetes", "--netmode", "vxlan", "--fwdmode", c.cfg.FwdMode,
		"--etcd-endpoints", strings.Join(c.EtcdEndpoints(), ","),
		"--host", h.Name, "--vtep-ip", h.IP.String(), "--ctrl-ip", h.IP.String(),
		"--dataplane", c.cfg.Dataplane,
		"--bpffs-root", c.PinRoot,
		"--cni-socket", h.CNISocket,
		"--inspect-listen", h.Inspect, "--inspect-token-file", c.inspectTokensFile,
	}
	if c.cfg.VLANUplink {
		args = append(args, "--vlan-if", "uplink")
	}
	if c.cfg.BGPRouter {
		args = append(args, "--vlan-if", HostIf)
	}
	// The DNS responder forwards to the simulation's outside, never to the machine's own
	// resolvers.
	if c.External != nil {
		args = append(args, "--dns-upstream", netip.AddrPortFrom(c.External.World, 53).String())
	} else {
		args = append(args, "--dns-upstream", "none")
	}
	if c.cfg.Secure {
		args = append(args, "--netmaster-cacert", c.CACert, "--netmaster-token-file", h.agentTokenFile,
			"--etcd-cacert", c.CACert, "--etcd-cert", h.etcdCert[0], "--etcd-key", h.etcdCert[1])
	}
	if c.cfg.Dataplane == "ovs" {
		// A private ovsdb-server/ovs-vswitchd per host, files under the work dir.
		args = append(args, "--ovs-dir", filepath.Join(c.WorkDir, h.Name, "ovs"))
	}
	if c.KubeAPI != nil && (c.cfg.KubeAPIPlugin == nil || c.cfg.KubeAPIPlugin(c, h)) {
		args = append(args, "--k8s-config", c.kubeConf[k8stest.UserNetplugin])
	}
	if c.cfg.PluginArgs != nil {
		args = append(args, c.cfg.PluginArgs(c, h)...)
	}
	return args
}

// StartPlugin starts h's netplugin (again, after StopPlugin or KillPlugin).
func (c *Cluster) StartPlugin(ctx context.Context, h *Host) error {
	if h.Plugin != nil {
		if ok, _ := h.Plugin.Exited(); !ok {
			return fmt.Errorf("sim: netplugin of %s already running", h.Name)
		}
	}
	p, err := startProcess("netplugin-"+h.Name, h.Name, filepath.Join(c.WorkDir, h.Name, "netplugin.log"),
		append([]string{filepath.Join(c.cfg.BinDir, "netplugin")}, c.PluginArgs(h)...))
	if err != nil {
		return err
	}
	h.Plugin = p
	c.log.Info("sim: netplugin started", "host", h.Name, "pid", p.PID())
	return nil
}

// StopPlugin stops h's netplugin with SIGTERM (the datapath keeps forwarding).
func (c *Cluster) StopPlugin(h *Host) error {
	if h.Plugin == nil {
		return nil
	}
	return h.Plugin.Stop(10 * time.Second)
}

// KillPlugin SIGKILLs h's netplugin, like a crash.
func (c *Cluster) KillPlugin(h *Host) {
	if h.Plugin != nil {
		h.Plugin.Kill()
	}
}

// WaitReady waits until h's agent reports healthy and its CNI socket exists.
func (h *Host) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ok, err := h.Plugin.Exited(); ok {
			return fmt.Errorf("sim: netplugin of %s exited: %v\n%s", h.Name, err, h.Plugin.LogTail(20))
		}
		last = h.InspectGet(ctx, "/healthz", nil)
		if last == nil {
			sock := h.CNISocket
			if h.c.cfg.ReadySocket != nil {
				sock = h.c.cfg.ReadySocket(h)
			}
			if _, err := os.Stat(sock); err == nil {
				return nil
			}
			last = fmt.Errorf("socket %s not there yet", sock)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("sim: netplugin of %s not ready after %s: %v\n%s", h.Name, timeout, last, h.Plugin.LogTail(20))
}

func (c *Cluster) httpClient(ns string) *http.Client {
	tr := &http.Transport{
		DisableKeepAlives: true,
		// Benchmarks poll /metrics every 100 ms: compressing it would cost the agents
		// more CPU than what is measured.
		DisableCompression: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialContext(ctx, ns, network, addr)
		},
	}
	if c.CACert != "" {
		if tc, err := tlsconf.Client(tlsconf.Files{CA: c.CACert}, "sim"); err == nil {
			tr.TLSClientConfig = tc
		}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

func (c *Cluster) do(ctx context.Context, ns, method, url string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req)
	resp, err := c.httpClient(ns).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, url, err)
		}
	}
	return nil
}

// MasterDo calls netmaster's REST API (from inside the first host).
func (c *Cluster) MasterDo(ctx context.Context, method, path string, body, out any) error {
	return c.do(ctx, c.Hosts[0].Name, method, c.MasterURL()+path, body, out)
}

// CreateNetwork creates a network through netmaster's REST API (like `netctl net create`).
func (c *Cluster) CreateNetwork(ctx context.Context, tenant, name, encap, subnet, gateway string) error {
	return c.CreateTaggedNetwork(ctx, tenant, name, encap, 0, subnet, gateway)
}

// CreateTaggedNetwork creates a network with a requested packet tag (`netctl net create
// --pkt-tag`: the VLAN id of a vlan network, the VNI of a vxlan one; 0 = netmaster picks).
func (c *Cluster) CreateTaggedNetwork(ctx context.Context, tenant, name, encap string, tag int, subnet, gateway string) error {
	body := map[string]any{"tenantName": tenant, "networkName": name, "nwType": "data", "encap": encap, "subnet": subnet, "gateway": gateway}
	if tag != 0 {
		body["pktTag"] = tag
	}
	return c.MasterDo(ctx, http.MethodPost, fmt.Sprintf("/api/v1/networks/%s:%s/", tenant, name), body, nil)
}

// CreatePolicy creates an (empty) policy through the REST API (`netctl policy create`).
func (c *Cluster) CreatePolicy(ctx context.Context, tenant, name string) error {
	body := map[string]any{"tenantName": tenant, "policyName": name}
	return c.MasterDo(ctx, http.MethodPost, fmt.Sprintf("/api/v1/policys/%s:%s/", tenant, name), body, nil)
}

// AddRule adds a rule to a policy through the REST API (`netctl policy rule-add`); the
// rule names its tenant, policy and id.
func (c *Cluster) AddRule(ctx context.Context, r model.Rule) error {
	return c.MasterDo(ctx, http.MethodPost, fmt.Sprintf("/api/v1/rules/%s:%s:%s/", r.TenantName, r.PolicyName, r.RuleID), r, nil)
}

// CreateEndpointGroup creates (or updates) an endpoint group of network with the given
// policies attached (`netctl group create -p`).
func (c *Cluster) CreateEndpointGroup(ctx context.Context, tenant, network, group string, policies ...string) error {
	body := map[string]any{"tenantName": tenant, "groupName": group, "networkName": network}
	if len(policies) > 0 {
		body["policies"] = policies
	}
	return c.MasterDo(ctx, http.MethodPost, fmt.Sprintf("/api/v1/endpointGroups/%s:%s/", tenant, group), body, nil)
}

// Authorize adds to req the token of the address it goes to (h's inspect API, or
// netmaster), for requests built outside the helpers here.
func (h *Host) Authorize(req *http.Request) { h.c.authorize(req) }

// InspectGet reads h's netplugin inspect API.
func (h *Host) InspectGet(ctx context.Context, path string, out any) error {
	return h.c.do(ctx, h.Name, http.MethodGet, "http://"+h.Inspect+path, nil, out)
}

// Metrics returns h's netplugin Prometheus metrics (inspect API /metrics) as text.
func (h *Host) Metrics(ctx context.Context) (string, error) { return h.getText(ctx, "/metrics") }

// HealthBody returns the text of h's netplugin /healthz (an error unless it is 200).
func (h *Host) HealthBody(ctx context.Context) (string, error) { return h.getText(ctx, "/healthz") }

// InspectText GETs path from h's inspect address and returns the body as is (an error
// unless 200): /metrics, /healthz, /debug/pprof/profile?seconds=N with --pprof.
func (h *Host) InspectText(ctx context.Context, path string) (string, error) {
	return h.getText(ctx, path)
}

func (h *Host) getText(ctx context.Context, path string) (string, error) {
	return h.c.getText(ctx, h.Name, "http://"+h.Inspect+path)
}

// EtcdMetrics returns the text of the cluster etcd's /metrics (etcd_mvcc_db_total_size_in_bytes, ...).
func (c *Cluster) EtcdMetrics(ctx context.Context) (string, error) {
	return c.getText(ctx, c.Hosts[0].Name, c.EtcdURL()+"/metrics")
}

// getText GETs url from inside namespace ns and returns the body (an error unless 200).
func (c *Cluster) getText(ctx context.Context, ns, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	c.authorize(req)
	resp, err := c.httpClient(ns).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s from %s: HTTP %d", url, ns, resp.StatusCode)
	}
	return string(b), nil
}

// authorize adds to req the token its address takes: netmaster's admin token, or the
// inspect APIs' (InspectToken).
func (c *Cluster) authorize(req *http.Request) {
	if c.AdminToken != "" && strings.HasPrefix(req.URL.String(), c.MasterURL()) {
		req.Header.Set("Authorization", "Bearer "+c.AdminToken)
		return
	}
	for _, h := range c.Hosts {
		if req.URL.Host == h.Inspect {
			req.Header.Set("Authorization", "Bearer "+c.InspectToken)
			return
		}
	}
}

// Netctl runs bin/netctl inside the first host against netmaster.
func (c *Cluster) Netctl(ctx context.Context, args ...string) (string, error) {
	return c.NetctlIn(ctx, c.Hosts[0], args...)
}

// NetctlIn runs bin/netctl inside h against netmaster, with the inspect APIs' token.
func (c *Cluster) NetctlIn(ctx context.Context, h *Host, args ...string) (string, error) {
	argv := []string{filepath.Join(c.cfg.BinDir, "netctl"), "--netmaster", c.MasterURL(), "--agent-token", c.InspectToken}
	if c.cfg.Secure {
		argv = append(argv, "--cacert", c.CACert, "--token", c.AdminToken)
	}
	argv = append(argv, args...)
	return Exec(ctx, h.Name, argv...)
}

// AddContainer creates a namespace "<host>-<name>" and attaches it to tenant/network
// through the host's CNI socket (ContivCNI.AddPod).
func (c *Cluster) AddContainer(ctx context.Context, h *Host, name, tenant, network string) (*Container, error) {
	return c.AddContainerInGroup(ctx, h, name, tenant, network, "")
}

// AddContainerInGroup is AddContainer with an endpoint group: the CNI request carries it
// (CONTIV_GROUP, the io.contiv.net-group label of a pod), the agent registers the endpoint
// in that group with netmaster, and the group's policies apply to it. The group must exist
// (CreateEndpointGroup).
func (c *Cluster) AddContainerInGroup(ctx context.Context, h *Host, name, tenant, network, group string) (*Container, error) {
	return c.attach(ctx, h, "default", name, tenant, network, group)
}

// ServeName answers every TCP connection to the container's address on port with the
// container's pod name (its name after the host's), until the cluster closes.
func (c *Cluster) ServeName(ct *Container, port int) error {
	ln, err := Listen(ct.Name, "tcp4", net.JoinHostPort(ct.IP.Addr().String(), fmt.Sprint(port)))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.listeners = append(c.listeners, ln)
	c.mu.Unlock()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte(strings.TrimPrefix(ct.Name, ct.Host.Name+"-")))
			conn.Close()
		}
	}()
	return nil
}

// AskName connects from ct to addr (2 s) and returns what the other side wrote first.
func AskName(ctx context.Context, ct *Container, addr string) (string, error) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := DialContext(dctx, ct.Name, "tcp4", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if n > 0 {
		return string(buf[:n]), nil
	}
	return "", err
}

// AddPod attaches Kubernetes pod namespace/name as a runtime would: the CNI request names
// only the pod; its node's agent takes tenant, network and group from the pod's labels (the
// agent must have a Kubernetes API: PluginArgs with --k8s-config).
func (c *Cluster) AddPod(ctx context.Context, h *Host, namespace, name string) (*Container, error) {
	return c.attach(ctx, h, namespace, name, "", "", "")
}

func (c *Cluster) attach(ctx context.Context, h *Host, podNS, name, tenant, network, group string) (*Container, error) {
	ns := h.Name + "-" + name
	if err := c.addNS(ctx, ns); err != nil {
		return nil, err
	}
	ct := &Container{Name: ns, Host: h, ID: ns, Network: network, Tenant: tenant, Group: group}
	resp, err := cniapi.NewClient(h.CNISocket).AddPod(ctx, cniapi.PodRequest{
		Name: name, Namespace: podNS, InfraContainerID: ct.ID, NetNS: NetNSPath(ns), IfName: "eth0",
		Tenant: tenant, Network: network, Group: group,
	})
	if err != nil {
		// As a runtime does after a failed ADD: the sandbox goes, so the pod can be tried
		// again (a retry found the namespace still there once, etcd_test.go).
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("sim: attach %s on %s: %w", name, h.Name, err), c.delNS(dctx, ns))
	}
	if ct.IP, err = netip.ParsePrefix(resp.IPAddress); err != nil {
		return nil, fmt.Errorf("sim: attach %s: agent returned address %q: %w", name, resp.IPAddress, err)
	}
	ct.EndpointID, ct.MAC = resp.EndpointID, resp.MAC
	c.mu.Lock()
	c.containers = append(c.containers, ct)
	c.mu.Unlock()
	c.log.Info("sim: container attached", "container", ns, "ip", ct.IP, "endpoint", ct.EndpointID)
	return ct, nil
}

// RemoveContainer detaches the container (ContivCNI.DelPod) and deletes its namespace.
func (c *Cluster) RemoveContainer(ctx context.Context, ct *Container) error {
	_, err := cniapi.NewClient(ct.Host.CNISocket).DelPod(ctx, cniapi.PodRequest{
		Name: ct.Name, InfraContainerID: ct.ID, Tenant: ct.Tenant, Network: ct.Network, Group: ct.Group,
	})
	if err != nil {
		return fmt.Errorf("sim: detach %s: %w", ct.Name, err)
	}
	c.mu.Lock()
	for i, x := range c.containers {
		if x == ct {
			c.containers = append(c.containers[:i], c.containers[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	return c.delNS(ctx, ct.Name)
}

func (c *Cluster) delNS(ctx context.Context, name string) error {
	_, err := run(ctx, "ip", "netns", "del", name)
	c.mu.Lock()
	for i, n := range c.namespaces {
		if n == name {
			c.namespaces = append(c.namespaces[:i], c.namespaces[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	return err
}

// Exec runs a command inside the container's namespace.
func (ct *Container) Exec(ctx context.Context, argv ...string) (string, error) {
	return Exec(ctx, ct.Name, argv...)
}

// Ping pings ip count times from the container and returns ping's output.
func (ct *Container) Ping(ctx context.Context, ip netip.Addr, count int) (string, error) {
	return ct.Exec(ctx, "ping", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "2", ip.String())
}

// TCPCheck listens on port in dst, connects from ct, sends a payload and checks the echo.
func (ct *Container) TCPCheck(ctx context.Context, dst *Container, port int) error {
	l, err := Listen(dst.Name, "tcp", fmt.Sprintf("%s:%d", dst.IP.Addr(), port))
	if err != nil {
		return err
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(conn, conn)
	}()
	conn, err := DialContext(ctx, ct.Name, "tcp", fmt.Sprintf("%s:%d", dst.IP.Addr(), port))
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	msg := bytes.Repeat([]byte("contivbpf-"), 2000) // 20 kB: several full-size segments
	go func() { _, _ = conn.Write(msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("tcp %s -> %s:%d: read echo: %w", ct.Name, dst.IP.Addr(), port, err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("tcp %s -> %s:%d: echo differs", ct.Name, dst.IP.Addr(), port)
	}
	return nil
}

func (c *Cluster) dumpLogs() {
	if c.Master != nil {
		c.log.Error("sim: netmaster log tail", "log", c.Master.LogTail(15))
	}
	for _, h := range c.Hosts {
		if h.Plugin != nil {
			c.log.Error("sim: netplugin log tail", "host", h.Name, "log", h.Plugin.LogTail(15))
		}
	}
}

// Close stops every process the simulator started and removes its namespaces, bpffs
// pins and (if it created it) its work directory. It is safe to call more than once.
func (c *Cluster) Close() error {
	var errs []error
	if c.External != nil && c.External.dns != nil {
		_ = c.External.dns.Shutdown()
	}
	if c.Router != nil {
		if err := c.Router.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range c.Hosts {
		if h.Plugin != nil {
			if err := h.Plugin.Stop(10 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.Master != nil {
		if err := c.Master.Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if c.KubeAPI != nil {
		c.KubeAPI.Close()
	}
	for _, p := range c.etcd {
		if err := p.Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	for _, ln := range c.listeners {
		ln.Close()
	}
	c.listeners = nil
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if c.cfg.Dataplane == "ovs" {
		// netplugin leaves its private OVS running on exit (the datapath keeps forwarding);
		// the simulation started those daemons, so it stops them.
		for _, h := range c.Hosts {
			if err := (ovs.Private{Dir: filepath.Join(c.WorkDir, h.Name, "ovs")}).Stop(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	c.mu.Lock()
	nss := append([]string(nil), c.namespaces...)
	c.mu.Unlock()
	// Containers first (their veths go with them), then hosts, then the underlay.
	for i := len(nss) - 1; i >= 0; i-- {
		if err := c.delNS(ctx, nss[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if c.PinRoot != "" && strings.HasPrefix(c.PinRoot, "/sys/fs/bpf/"+c.Prefix) {
		if err := os.RemoveAll(c.PinRoot); err != nil {
			errs = append(errs, fmt.Errorf("remove pins %s: %w", c.PinRoot, err))
		}
	}
	if c.ownWorkDir && c.WorkDir != "" {
		if err := os.RemoveAll(c.WorkDir); err != nil {
			errs = append(errs, fmt.Errorf("remove work dir: %w", err))
		}
	}
	return errors.Join(errs...)
}

// FirstHost returns the first host address of a subnet ("10.1.1.0/24" → "10.1.1.1").
func FirstHost(subnet string) (string, error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return "", fmt.Errorf("subnet %q: %w", subnet, err)
	}
	return p.Masked().Addr().Next().String(), nil
}
