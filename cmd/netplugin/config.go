package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

const envPrefix = "CONTIV_NETPLUGIN_"

func env(name string) []string { return []string{envPrefix + name} }

func flags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "mode", Aliases: []string{"plugin-mode", "cluster-mode"}, EnvVars: env("MODE"), Value: "kubernetes", Usage: "docker | kubernetes (which runtime front-end to serve)"},
		&cli.StringFlag{Name: "netmode", Aliases: []string{"network-mode"}, EnvVars: env("NET_MODE"), Value: "vxlan", Usage: "vlan | vxlan"},
		&cli.StringFlag{Name: "fwdmode", Aliases: []string{"forward-mode"}, EnvVars: env("FORWARD_MODE"), Value: "routing", Usage: "bridge | routing; must equal netmaster's global fwd-mode (both default to routing)"},
		&cli.StringFlag{Name: "etcd-endpoints", Aliases: []string{"etcd"}, EnvVars: env("ETCD_ENDPOINTS"), Value: "http://127.0.0.1:2379", Usage: "comma-separated etcd client URLs"},
		&cli.StringFlag{Name: "host", Aliases: []string{"host-label"}, EnvVars: env("HOST"), Usage: "host label (default: hostname)"},
		&cli.StringFlag{Name: "vtep-ip", EnvVars: env("VTEP_IP"), Usage: "underlay address for VXLAN (default: first IPv4 address of a non-loopback link)"},
		&cli.StringFlag{Name: "ctrl-ip", EnvVars: env("CONTROL_IP"), Usage: "control address registered as service netplugin (default: vtep-ip)"},
		&cli.StringFlag{Name: "vlan-if", Aliases: []string{"vlan-uplinks"}, EnvVars: env("VLAN_UPLINKS"), Usage: "uplink interface for VLAN networks (required with --netmode vlan)"},
		&cli.StringFlag{Name: "snat-ip", EnvVars: env("SNAT_IP"), Usage: "ebpf: address endpoints' traffic to the outside is source-NATed to (default: vtep-ip; egress is off when no device holds it)"},
		&cli.StringFlag{Name: "egress-if", EnvVars: env("EGRESS_IF"), Usage: "ebpf: device egress traffic leaves by and its replies arrive on (default: the device holding --snat-ip)"},
		&cli.StringFlag{Name: "egress-ports", EnvVars: env("EGRESS_PORTS"), Value: "61000-65535", Usage: "ebpf: `MIN-MAX` source ports (and ICMP echo ids) of egress NAT; keep them outside net.ipv4.ip_local_port_range (a range holding --vxlan-port is refused)"},
		&cli.BoolFlag{Name: "egress-allow-metadata", EnvVars: env("EGRESS_ALLOW_METADATA"), Usage: "ebpf: let endpoints reach the cloud instance metadata address 169.254.169.254 through egress NAT (as the node, with the node's identity); off: refused like every link-local address (drop_egress_link_local)"},
		&cli.StringFlag{Name: "dns-listen", EnvVars: env("DNS_LISTEN"), Usage: "ebpf: `ADDR:PORT` of the DNS responder endpoints reach at their gateway's port 53 (default <vtep-ip>:53; \"off\" disables it)"},
		&cli.StringFlag{Name: "dns-upstream", EnvVars: env("DNS_UPSTREAM"), Usage: "comma-separated `IP[:PORT]` servers the DNS responder forwards other names to (default: the nameservers of /etc/resolv.conf; \"none\": answer SERVFAIL)"},
		&cli.Float64Flag{Name: "dns-rate", EnvVars: env("DNS_RATE"), Value: 200, Usage: "queries per second each endpoint may send the DNS responder (burst: twice that); more are dropped and counted"},
		&cli.DurationFlag{Name: "bgp-hold-time", EnvVars: env("BGP_HOLD_TIME"), Value: 9 * time.Second, Usage: "hold time of the host's BGP session (when a bgp object names this host; keepalives every third of it); its neighbour withdraws the host's routes after that long without word"},
		&cli.DurationFlag{Name: "bgp-restart-time", EnvVars: env("BGP_RESTART_TIME"), Value: 120 * time.Second, Usage: "graceful-restart time of the BGP session: how long the neighbour keeps this host's routes while netplugin restarts (the datapath keeps forwarding); 0 turns graceful restart off"},
		&cli.StringFlag{Name: "bgp-prefixes", EnvVars: env("BGP_PREFIXES"), Usage: "comma-separated `CIDR`s: the BGP speaker advertises only endpoint addresses inside them (default: every endpoint of a VLAN network; a tenant chooses its subnets, so set this or filter at the router)"},
		&cli.StringFlag{Name: "encryption", EnvVars: env("ENCRYPTION"), Value: "none", Usage: "none | wireguard (not given: the cluster's setting, netctl global set --encryption, read at start): wireguard sends this host's VXLAN overlay traffic to other hosts through a WireGuard device (ebpf dataplane only), its public key published through netmaster; a peer host without a published key gets no overlay traffic (docs/encryption.md)"},
		&cli.StringFlag{Name: "xdp", EnvVars: env("XDP"), Value: "off", Usage: "off | native | generic: the uplink's XDP prefilter on the device holding the VTEP (ebpf dataplane only): drops before the kernel builds an skb what the tc programs drop anyway (overlay packets from a host that is not a peer, to an unknown VNI or with a spoofed inner source; with --encryption, clear overlay packets); native where the driver has XDP (veth does), generic on any device (docs/ebpf.md)"},
		&cli.IntFlag{Name: "wireguard-port", EnvVars: env("WIREGUARD_PORT"), Value: 51820, Usage: "UDP port of the WireGuard device (--encryption wireguard); not --vxlan-port"},
		&cli.StringFlag{Name: "wireguard-dir", EnvVars: env("WIREGUARD_DIR"), Usage: "absolute `DIR` (root's, mode 0700) holding the host's WireGuard private key, made once (default /var/lib/contivbpf/<host>)"},
		&cli.StringFlag{Name: "wireguard-device", EnvVars: env("WIREGUARD_DEVICE"), Usage: "name of the WireGuard device (default cvwg + 8 hex digits of the host label: a userspace device's control socket is named after it machine-wide)"},
		&cli.IntFlag{Name: "vxlan-port", EnvVars: env("VXLAN_PORT"), Value: 4789, Usage: "VXLAN UDP port"},
		&cli.IntFlag{Name: "ct-quota-per-endpoint", EnvVars: env("CT_QUOTA_PER_ENDPOINT"), Value: ebpf.DefaultCTQuota, Usage: "conntrack entries of the flows one local endpoint opens, and again of the flows others open to it (ebpf; default: a sixteenth of the table each); past it such new flows are dropped (drop_ct_quota); ovs: each tenant's two conntrack zones, for the flows its endpoints on the host open and for those other hosts open toward them, are limited to this times those endpoints; 0 = no quota"},
		&cli.StringFlag{Name: "dataplane", EnvVars: env("DATAPLANE"), Value: "ebpf", Usage: "ebpf | ovs"},
		&cli.StringFlag{Name: "bpffs-root", EnvVars: env("BPFFS_ROOT"), Value: "/sys/fs/bpf/contivbpf", Usage: "bpffs directory; pins go to <root>/<host>"},
		&cli.StringFlag{Name: "ovs-dir", EnvVars: env("OVS_DIR"), Usage: "ovs: directory of a private ovsdb-server/ovs-vswitchd (default /run/contivbpf/ovs/<host>)"},
		&cli.StringFlag{Name: "ovs-db", EnvVars: env("OVS_DB"), Usage: "ovs: use an existing OVSDB socket instead of a private instance (e.g. unix:/var/run/openvswitch/db.sock)"},
		&cli.StringFlag{Name: "cni-socket", EnvVars: env("CNI_SOCKET"), Value: cniapi.DefaultSocket, Usage: "unix socket for the contivk8s CNI binary (kubernetes mode)"},
		&cli.StringFlag{Name: "docker-plugin-dir", EnvVars: env("DOCKER_PLUGIN_DIR"), Value: "/run/docker/plugins", Usage: "where the Docker plugin socket goes (docker mode)"},
		&cli.StringFlag{Name: "plugin-name", Aliases: []string{"name"}, EnvVars: env("PLUGIN_NAME"), Value: "netplugin", Usage: "Docker network/IPAM driver name (docker mode)"},
		&cli.StringFlag{Name: "docker-host", EnvVars: env("DOCKER_HOST"), Usage: "Docker API address (docker mode; default DOCKER_HOST or the standard socket)"},
		&cli.StringFlag{Name: "inspect-listen", EnvVars: env("INSPECT_LISTEN"), Value: "127.0.0.1:9090", Usage: "address of the inspect API and /metrics (loopback by default; everything but /healthz and /metrics needs --inspect-token-file's tokens)"},
		&cli.StringFlag{Name: "inspect-token-file", EnvVars: env("INSPECT_TOKEN_FILE"), Usage: "`FILE` of tokens (netmaster's token file format, mode 0600, reloaded on change and SIGHUP) for the inspect API: role admin or read-only reads it, admin also runs traces and the profiler"},
		&cli.BoolFlag{Name: "inspect-insecure", EnvVars: env("INSPECT_INSECURE"), Usage: "serve the inspect API without authentication: whoever reaches --inspect-listen (any local process on loopback) reads every tenant's endpoints, flows and rules"},
		&cli.BoolFlag{Name: "pprof", EnvVars: env("PPROF"), Usage: "also serve Go's profiler under /debug/pprof/ on the inspect address (for diagnosing CPU or memory use)"},
		&cli.StringFlag{Name: "etcd-cacert", EnvVars: env("ETCD_CACERT"), Usage: "CA `FILE` etcd's certificate is checked against (etcd over TLS)"},
		&cli.StringFlag{Name: "etcd-cert", EnvVars: env("ETCD_CERT"), Usage: "client certificate `FILE` for etcd (with --etcd-key); with netmaster's etcd RBAC its CN must be host:<--host>"},
		&cli.StringFlag{Name: "etcd-key", EnvVars: env("ETCD_KEY"), Usage: "private key `FILE` of --etcd-cert"},
		&cli.StringFlag{Name: "debug-token-file", EnvVars: env("DEBUG_TOKEN_FILE"), Usage: "enables the mutating /debug routes of the inspect API for callers sending this `FILE`'s token (mode 0600)"},
		&cli.StringFlag{Name: "socket-group", EnvVars: env("SOCKET_GROUP"), Usage: "`GROUP` that may also use the CNI and Docker plugin sockets (mode 0660; default 0600, root only)"},
		&cli.BoolFlag{Name: "netmaster-tls", EnvVars: env("NETMASTER_TLS"), Usage: "reach netmaster over HTTPS (implied by --netmaster-cacert/--netmaster-cert)"},
		&cli.StringFlag{Name: "netmaster-cacert", EnvVars: env("NETMASTER_CACERT"), Usage: "CA `FILE` netmaster's certificate is checked against"},
		&cli.StringFlag{Name: "netmaster-cert", EnvVars: env("NETMASTER_CERT"), Usage: "client certificate `FILE` for netmaster (O=agent)"},
		&cli.StringFlag{Name: "netmaster-key", EnvVars: env("NETMASTER_KEY"), Usage: "private key `FILE` of --netmaster-cert"},
		&cli.StringFlag{Name: "netmaster-token-file", EnvVars: env("NETMASTER_TOKEN_FILE"), Usage: "`FILE` holding this agent's bearer token (role agent) for netmaster; named host:<this host> in netmaster's token file it may touch only this host's endpoints"},
		&cli.IntFlag{Name: "uplink-mtu", EnvVars: env("UPLINK_MTU"), Usage: "underlay MTU (default: lowest MTU of the host's physical links, else 1500)"},
		&cli.DurationFlag{Name: "service-ttl", EnvVars: env("SERVICE_TTL"), Value: 10 * time.Second, Usage: "lease of this host's netplugin and netplugin.vtep registrations (at least 2s)"},
		&cli.StringFlag{Name: "k8s-config", EnvVars: env("K8S_CONFIG"), Value: k8s.DefaultConfigPath, Usage: "Contiv's Kubernetes client config (K8S_API_SERVER, K8S_CA, K8S_KEY, K8S_CERT, K8S_TOKEN); kubernetes mode reads pod labels through it when it names an API server (else, in a pod, the service account)"},
		&cli.BoolFlag{Name: "check-config", Usage: "validate the flags and environment, print \"configuration ok\" and exit (0, or 22 naming the problem)"},
		&cli.DurationFlag{Name: "k8s-pod-wait", EnvVars: env("K8S_POD_WAIT"), Value: k8s.DefaultPodWait, Usage: "how long a CNI ADD waits for a pod its node's cache has not seen yet (kubernetes mode)"},
		&cli.StringFlag{Name: "log-level", EnvVars: env("LOG_LEVEL"), Value: "info", Usage: "debug | info | warn | error"},
		&cli.BoolFlag{Name: "use-json-log", Aliases: []string{"json-log"}, EnvVars: env("USE_JSON_LOG"), Usage: "log as JSON"},
	}
}

// config is the validated command line.
type config struct {
	pprof bool // /debug/pprof/ on the inspect listener
	// inspectTokens is the inspect API's token file; inspectInsecure serves it to anyone.
	inspectTokens   string
	inspectInsecure bool
	mode            string
	netMode         string
	fwdMode         dataplane.FwdMode
	etcd            []string
	host            string
	vtep            netip.Addr
	ctrl            netip.Addr
	vlanIf          string
	snatIP          netip.Addr
	egressIf        string
	egressPorts     [2]uint16
	allowMetadata   bool
	dnsListen       netip.AddrPort // invalid: no DNS responder
	dnsUpstreams    []string
	dnsRate         float64
	vxlanPort       int
	// xdp is the uplink prefilter's mode (ebpf.XDPOff, XDPNative, XDPGeneric).
	xdp string
	// encryption is "none" or "wireguard"; encryptionSet says it was given (else the
	// cluster's setting decides at start: clusterenc.Decide); wg* configure the device.
	encryption    string
	encryptionSet bool
	wgPort        int
	wgDir         string
	wgDevice      string
	ctQuota       int // conntrack entries per local endpoint, 0 = no quota
	dataplane     string
	bpffsRoot     string
	cniSocket     string
	inspectListen string
	uplinkMTU     int
	serviceTTL    time.Duration
	bgpHold       time.Duration
	bgpRestart    time.Duration
	bgpPrefixes   []netip.Prefix
	k8sConfig     string
	k8sConfigSet  bool
	k8sPodWait    time.Duration

	ovsDir          string
	ovsDB           string
	dockerPluginDir string
	pluginName      string
	dockerHost      string

	socketGroup    string
	debugToken     string
	netmasterTLS   bool
	netmasterFiles tlsconf.Files
	netmasterToken string
	etcdTLS        tlsconf.Files
}

func configFrom(c *cli.Context) (config, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return config{}, fmt.Errorf("--log-level %q: %w", c.String("log-level"), err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Bool("use-json-log") {
		slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, opts)))
	} else {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, opts)))
	}
	cfg := config{
		mode: c.String("mode"), netMode: c.String("netmode"), fwdMode: dataplane.FwdMode(c.String("fwdmode")),
		host: c.String("host"), vlanIf: c.String("vlan-if"), vxlanPort: c.Int("vxlan-port"), ctQuota: c.Int("ct-quota-per-endpoint"), egressIf: c.String("egress-if"),
		dnsRate: c.Float64("dns-rate"), allowMetadata: c.Bool("egress-allow-metadata"),
		xdp: c.String("xdp"), encryption: c.String("encryption"), encryptionSet: c.IsSet("encryption"), wgPort: c.Int("wireguard-port"), wgDir: c.String("wireguard-dir"), wgDevice: c.String("wireguard-device"),
		dataplane: c.String("dataplane"), bpffsRoot: c.String("bpffs-root"), cniSocket: c.String("cni-socket"),
		inspectListen: c.String("inspect-listen"), pprof: c.Bool("pprof"),
		inspectTokens: c.String("inspect-token-file"), inspectInsecure: c.Bool("inspect-insecure"), uplinkMTU: c.Int("uplink-mtu"),
		serviceTTL: c.Duration("service-ttl"),
		bgpHold:    c.Duration("bgp-hold-time"),
		bgpRestart: c.Duration("bgp-restart-time"),
		k8sConfig:  c.String("k8s-config"), k8sConfigSet: c.IsSet("k8s-config"), k8sPodWait: c.Duration("k8s-pod-wait"),
		ovsDir: c.String("ovs-dir"), ovsDB: c.String("ovs-db"),
		dockerPluginDir: c.String("docker-plugin-dir"), pluginName: c.String("plugin-name"), dockerHost: c.String("docker-host"),
		socketGroup:    c.String("socket-group"),
		etcdTLS:        tlsconf.Files{CA: c.String("etcd-cacert"), Cert: c.String("etcd-cert"), Key: c.String("etcd-key")},
		netmasterFiles: tlsconf.Files{CA: c.String("netmaster-cacert"), Cert: c.String("netmaster-cert"), Key: c.String("netmaster-key")},
	}
	cfg.netmasterTLS = c.Bool("netmaster-tls") || !cfg.netmasterFiles.Empty()
	var err error
	if cfg.debugToken, err = readSecret(c.String("debug-token-file"), "--debug-token-file"); err != nil {
		return cfg, err
	}
	if cfg.inspectTokens != "" {
		if _, err := auth.LoadTokens(cfg.inspectTokens); err != nil {
			return cfg, fmt.Errorf("--inspect-token-file: %w", err)
		}
	}
	if cfg.netmasterToken, err = readSecret(c.String("netmaster-token-file"), "--netmaster-token-file"); err != nil {
		return cfg, err
	}
	for _, e := range strings.Split(c.String("etcd-endpoints"), ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.etcd = append(cfg.etcd, e)
		}
	}
	switch {
	case cfg.inspectTokens != "" && cfg.inspectInsecure:
		return cfg, fmt.Errorf("--inspect-token-file and --inspect-insecure exclude each other")
	case cfg.mode != "docker" && cfg.mode != "kubernetes":
		return cfg, fmt.Errorf("--mode %q must be docker or kubernetes", cfg.mode)
	case cfg.netMode != "vlan" && cfg.netMode != "vxlan":
		return cfg, fmt.Errorf("--netmode %q must be vlan or vxlan", cfg.netMode)
	case cfg.fwdMode != dataplane.FwdBridge && cfg.fwdMode != dataplane.FwdRouting:
		return cfg, fmt.Errorf("--fwdmode %q must be bridge or routing", cfg.fwdMode)
	case cfg.netMode == "vlan" && cfg.vlanIf == "":
		return cfg, errors.New("--vlan-if is required with --netmode vlan")
	case len(cfg.etcd) == 0:
		return cfg, errors.New("--etcd-endpoints is empty")
	case cfg.vxlanPort <= 0 || cfg.vxlanPort > 65535:
		return cfg, fmt.Errorf("--vxlan-port %d out of 1-65535", cfg.vxlanPort)
	case cfg.vxlanPort >= model.NodePortMin && cfg.vxlanPort <= model.NodePortMax:
		// The overlay's socket holds the port on every host: a node port on it would never
		// be reached.
		return cfg, fmt.Errorf("--vxlan-port %d is in the node port range %d-%d", cfg.vxlanPort, model.NodePortMin, model.NodePortMax)
	case cfg.xdp != "off" && cfg.xdp != "native" && cfg.xdp != "generic":
		return cfg, fmt.Errorf("--xdp %q must be off, native or generic", cfg.xdp)
	case cfg.xdp != "off" && cfg.dataplane != "ebpf":
		return cfg, fmt.Errorf("--xdp %s needs --dataplane ebpf (the ovs dataplane has no XDP prefilter)", cfg.xdp)
	case cfg.encryption != "none" && cfg.encryption != "wireguard":
		return cfg, fmt.Errorf("--encryption %q must be none or wireguard", cfg.encryption)
	case cfg.wgPort <= 0 || cfg.wgPort > 65535:
		return cfg, fmt.Errorf("--wireguard-port %d out of 1-65535", cfg.wgPort)
	case cfg.checkEncryption("--encryption wireguard") != nil:
		return cfg, cfg.checkEncryption("--encryption wireguard")
	case cfg.ctQuota < 0 || cfg.ctQuota > math.MaxUint32:
		return cfg, fmt.Errorf("--ct-quota-per-endpoint %d out of range (0 = no quota)", cfg.ctQuota)
	case cfg.dataplane != "ebpf" && cfg.dataplane != "ovs":
		return cfg, fmt.Errorf("--dataplane %q must be ebpf or ovs", cfg.dataplane)
	case cfg.uplinkMTU < 0:
		return cfg, fmt.Errorf("--uplink-mtu %d must not be negative", cfg.uplinkMTU)
	case cfg.dnsRate <= 0:
		return cfg, fmt.Errorf("--dns-rate %v must be positive", cfg.dnsRate)
	case cfg.bgpHold < 3*time.Second || cfg.bgpHold > 65535*time.Second:
		return cfg, fmt.Errorf("--bgp-hold-time %s must be 3s..65535s (BGP)", cfg.bgpHold)
	case cfg.bgpRestart < 0 || cfg.bgpRestart > 4095*time.Second:
		return cfg, fmt.Errorf("--bgp-restart-time %s must be 0..4095s (BGP graceful restart)", cfg.bgpRestart)
	case cfg.serviceTTL < 2*time.Second:
		return cfg, fmt.Errorf("--service-ttl %s must be at least 2s (etcd leases)", cfg.serviceTTL)
	case strings.Contains(cfg.vlanIf, ","):
		return cfg, fmt.Errorf("--vlan-if %q: only one uplink is supported", cfg.vlanIf)
	}
	if cfg.host == "" {
		h, err := os.Hostname()
		if err != nil {
			return cfg, fmt.Errorf("--host not given and hostname unknown: %w", err)
		}
		cfg.host = h
	}
	if cfg.wgDir == "" {
		cfg.wgDir = filepath.Join("/var/lib/contivbpf", cfg.host)
	}
	if !filepath.IsAbs(cfg.wgDir) {
		return cfg, fmt.Errorf("--wireguard-dir %q: want an absolute path", cfg.wgDir)
	}
	if cfg.wgDevice == "" {
		sum := sha256.Sum256([]byte(cfg.host))
		cfg.wgDevice = "cvwg" + hex.EncodeToString(sum[:4])
	}
	if len(cfg.wgDevice) > 15 || strings.ContainsAny(cfg.wgDevice, "/ ") {
		return cfg, fmt.Errorf("--wireguard-device %q: want 1-15 bytes, no '/' or space", cfg.wgDevice)
	}
	if s := c.String("vtep-ip"); s != "" {
		if cfg.vtep, err = netip.ParseAddr(s); err != nil || !cfg.vtep.Is4() {
			return cfg, fmt.Errorf("--vtep-ip %q is not an IPv4 address", s)
		}
	} else if cfg.vtep, err = firstHostIPv4(); err != nil {
		return cfg, fmt.Errorf("--vtep-ip not given: %w", err)
	}
	if s := c.String("snat-ip"); s != "" {
		if cfg.snatIP, err = netip.ParseAddr(s); err != nil || !cfg.snatIP.Is4() {
			return cfg, fmt.Errorf("--snat-ip %q is not an IPv4 address", s)
		}
	}
	if cfg.egressPorts, err = parsePortRange(c.String("egress-ports")); err != nil {
		return cfg, fmt.Errorf("--egress-ports: %w", err)
	}
	if cfg.dataplane == "ebpf" && cfg.vxlanPort >= int(cfg.egressPorts[0]) && cfg.vxlanPort <= int(cfg.egressPorts[1]) {
		return cfg, fmt.Errorf("--egress-ports %d-%d include --vxlan-port %d (the overlay's socket holds it)", cfg.egressPorts[0], cfg.egressPorts[1], cfg.vxlanPort)
	}
	if cfg.dnsListen, cfg.dnsUpstreams, err = dnsConfig(c.String("dns-listen"), c.String("dns-upstream"), cfg.vtep, cfg.dataplane); err != nil {
		return cfg, err
	}
	for _, f := range strings.FieldsFunc(c.String("bgp-prefixes"), func(r rune) bool { return r == ',' || r == ' ' }) {
		p, err := netip.ParsePrefix(f)
		if err != nil || !p.Addr().Is4() || p.Masked() != p {
			return cfg, fmt.Errorf("--bgp-prefixes: %q is not an IPv4 network like 10.66.0.0/16", f)
		}
		cfg.bgpPrefixes = append(cfg.bgpPrefixes, p)
	}
	cfg.ctrl = cfg.vtep
	if s := c.String("ctrl-ip"); s != "" {
		if cfg.ctrl, err = netip.ParseAddr(s); err != nil {
			return cfg, fmt.Errorf("--ctrl-ip %q is not an IP address", s)
		}
	}
	return cfg, nil
}

// firstHostIPv4 is the first global IPv4 address on a non-loopback interface.
func firstHostIPv4() (netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list interfaces: %w", err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && ip.IsGlobalUnicast() {
					return ip.Unmap(), nil
				}
			}
		}
	}
	return netip.Addr{}, errors.New("no IPv4 address on any up, non-loopback interface")
}

// readSecret returns the trimmed content of a token file ("" for no file); the file must
// be owned by this process's user or root and not be readable by group or others
// (auth.CheckSecretFile, as the token files are).
func readSecret(path, flag string) (string, error) {
	if path == "" {
		return "", nil
	}
	// (Checked as opened: no other file swapped in between the check and the read.)
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	if err := auth.CheckSecretFile(flag+" "+path, st); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 {
		return "", fmt.Errorf("%s %s: token shorter than 16 characters", flag, path)
	}
	return tok, nil
}

// parsePortRange reads "MIN-MAX" (1 <= MIN <= MAX <= 65535).
func parsePortRange(s string) ([2]uint16, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if !ok || err1 != nil || err2 != nil || a == 0 || b < a {
		return [2]uint16{}, fmt.Errorf("%q: want MIN-MAX with 1 <= MIN <= MAX <= 65535", s)
	}
	return [2]uint16{uint16(a), uint16(b)}, nil
}

// dnsConfig reads --dns-listen and --dns-upstream. The responder runs with the eBPF
// dataplane only (the datapath steers queries to it).
func dnsConfig(listen, upstream string, vtep netip.Addr, dp string) (netip.AddrPort, []string, error) {
	if listen == "off" || dp != "ebpf" {
		return netip.AddrPort{}, nil, nil
	}
	ap := netip.AddrPortFrom(vtep, 53)
	if listen != "" {
		var err error
		if ap, err = netip.ParseAddrPort(listen); err != nil || !ap.Addr().Is4() || ap.Port() == 0 {
			return netip.AddrPort{}, nil, fmt.Errorf("--dns-listen %q: want IPv4:PORT or off", listen)
		}
	}
	var ups []string
	switch upstream {
	case "none":
	case "":
		ups = resolvConfServers("/etc/resolv.conf")
	default:
		for _, u := range strings.Split(upstream, ",") {
			u = strings.TrimSpace(u)
			if a, err := netip.ParseAddr(u); err == nil && a.Is4() {
				u = netip.AddrPortFrom(a, 53).String()
			}
			if a, err := netip.ParseAddrPort(u); err != nil || !a.Addr().Is4() {
				return netip.AddrPort{}, nil, fmt.Errorf("--dns-upstream %q: want IPv4[:PORT] servers, comma-separated", upstream)
			}
			ups = append(ups, u)
		}
	}
	return ap, ups, nil
}

// resolvConfServers returns the IPv4 nameservers of a resolv.conf (loopback ones, such as
// systemd-resolved's stub, are of no use from another namespace and skipped).
func resolvConfServers(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !a.IsLoopback() {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

// checkEncryption refuses wireguard where it cannot run; what names where it came from
// (the flag, or the cluster's setting when the flag is not given).
func (cfg config) checkEncryption(what string) error {
	switch {
	case cfg.encryption != "wireguard":
		return nil
	case cfg.dataplane != "ebpf":
		// OVS's userspace VXLAN routes by its own table: nothing would steer it.
		return fmt.Errorf("%s needs --dataplane ebpf (the ovs dataplane's VXLAN is not steered into WireGuard yet)", what)
	case cfg.wgPort == cfg.vxlanPort:
		return fmt.Errorf("%s: --wireguard-port %d is --vxlan-port: WireGuard's own packets would be steered into it", what, cfg.wgPort)
	}
	return nil
}
