// Package wgsteer steers a host's VXLAN overlay traffic into its WireGuard device
// (pkg/wgtunnel) and keeps the device's peers following the cluster's published keys.
//
// Addressing (docs/encryption.md): the overlay keeps its VTEP addresses. Two policy rules
// in the host's namespace, before the main table, send every locally originated UDP
// packet to the VXLAN port through a table of its own, where each keyed peer host's VTEP
// /32 goes into the WireGuard device and everything else hits a blackhole default: a peer
// host whose key is not known yet (or any VTEP the datapath learns before this package
// does) gets no overlay traffic at all, never traffic in clear. The device's own UDP
// packets carry its firewall mark and a rule ahead of the steering one sends them to the
// main table, so they leave by the underlay even when a peer's endpoint is its VTEP. A
// peer's only allowed IP is its VTEP /32: a decrypted packet from another source is
// dropped by WireGuard.
package wgsteer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/filewatch"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/wgtunnel"
)

// Defaults of the policy routing this package installs.
const (
	// DefaultTable is the routing table of steered traffic.
	DefaultTable = 0xc0b1
	// DefaultMark is the WireGuard device's firewall mark (its own UDP packets).
	DefaultMark = 0xc0b1
	// DefaultPriority is the marked packets' rule (to the main table); the steering rule
	// is the next priority. Both come before the main table's (32766).
	DefaultPriority = 10000
	// DefaultEvery is how often the datapath's peers (in memory) are compared with the
	// last pass's, and the first retry of a failed pass. The published keys are not
	// polled: they come by an etcd watch (Directory.WatchWireGuardHosts).
	DefaultEvery = time.Second
	// DefaultKeyEvery is how often the key file is looked at for a change (Config.Key).
	DefaultKeyEvery = 2 * time.Second
	// Keepalive is every peer's persistent keepalive (wgtunnel.Peer.Keepalive): a
	// restarted agent's new device, which has no sessions, handshakes with each peer as
	// soon as it adds it, so the peers' traffic to it is not dropped until they notice.
	Keepalive = 25 * time.Second
)

// Device is the host's WireGuard device (wgtunnel.Tunnel).
type Device interface {
	Name() string
	PublicKey() wgtypes.Key
	ListenPort() int
	SyncPeers(ctx context.Context, peers []wgtunnel.Peer) (wgtunnel.Changes, error)
}

// KeyFollower is the device's key file (wgtunnel.Tunnel): ReloadKey reads it again and
// reports whether the device took another key.
type KeyFollower interface {
	KeyFile() string
	ReloadKey() (changed bool, err error)
}

// Directory publishes this host's key and reads every host's (masterclient.Client).
type Directory interface {
	PublishWireGuard(ctx context.Context, rec model.WireGuardHost) error
	WireGuardHosts(ctx context.Context) ([]model.WireGuardHost, int, error)
	// WatchWireGuardHosts calls fn with every host's records now and after each change
	// until ctx ends, resuming (or listing again) after a broken watch; health hears an
	// error while the watch does not deliver (etcd out of reach) and nil once it does.
	WatchWireGuardHosts(ctx context.Context, fn func(hosts []model.WireGuardHost, skipped int), health func(err error)) error
}

// Routing names the policy routing of one host; the zero values take the defaults.
type Routing struct {
	Table    int
	Mark     int
	Priority int
	// VXLANPort is the overlay's UDP destination port (required).
	VXLANPort int
}

func (r Routing) withDefaults() Routing {
	if r.Table == 0 {
		r.Table = DefaultTable
	}
	if r.Mark == 0 {
		r.Mark = DefaultMark
	}
	if r.Priority == 0 {
		r.Priority = DefaultPriority
	}
	return r
}

// Config is what a Steer needs.
type Config struct {
	// NetNS is the path of the network namespace holding the device and the VTEP ("":
	// the caller's).
	NetNS     string
	Device    Device
	Directory Directory
	Host      string
	// VTEP is this host's underlay address: the published endpoint's address and the
	// source of steered packets.
	VTEP    netip.Addr
	Routing Routing
	// Peers returns the VXLAN peers the datapath sends to (the agent's applied peers).
	Peers func() []dataplane.Peer
	// Every is how often Peers is compared with the last pass's, and the first retry of
	// a failed pass (0: DefaultEvery). Published keys come by the directory's watch.
	Every time.Duration
	// Key, if set, is reloaded while Run runs when its file changes (looked at every
	// KeyEvery; 0: DefaultKeyEvery) and on SIGHUP; a new key is published at once.
	Key      KeyFollower
	KeyEvery time.Duration
	Log      *slog.Logger
}

// Status is the state of the last sync.
type Status struct {
	// Keyed are the peer hosts whose VTEP goes into the device; Waiting those without a
	// usable published key (their overlay traffic is dropped).
	Keyed   []string `json:"keyed"`
	Waiting []string `json:"waiting"`
	// Published says this host's own record was accepted by netmaster.
	Published bool `json:"published"`
	// Err is the last sync's error ("" if none).
	Err string `json:"error,omitempty"`
	// Publish is the last publication's error ("" if none).
	Publish string `json:"publishError,omitempty"`
	// Watch is why the published keys are not followed now ("" while the watch
	// delivers): a record deleted or changed meanwhile is not applied.
	Watch string `json:"watch,omitempty"`
	// Key is why the key file was refused at its last change ("" if taken): the
	// device keeps its current key, which may be known to others (a file they could
	// read) or was meant to be rotated.
	Key string `json:"key,omitempty"`
}

// Steer is one host's steering. Install it, then Run it.
type Steer struct {
	cfg  Config
	nl   *netlink.Handle // in cfg.NetNS
	link int             // the device's ifindex

	kick chan struct{} // (Kick)
	pub  chan struct{} // (publisher)

	mu     sync.Mutex
	status Status
}

// Install checks cfg and puts the policy routing in place (idempotently: a restarted agent
// finds its own rules and table): the marked packets' rule, the steering rule, the
// table's blackhole default, and loose reverse-path filtering on the device.
func Install(cfg Config) (*Steer, error) {
	cfg.Routing = cfg.Routing.withDefaults()
	switch {
	case cfg.Device == nil || cfg.Directory == nil || cfg.Peers == nil:
		return nil, errors.New("wireguard steering: device, directory and peers are required")
	case cfg.Host == "":
		return nil, errors.New("wireguard steering: host is required")
	case !cfg.VTEP.Is4():
		return nil, fmt.Errorf("wireguard steering: vtep %s is not an IPv4 address", cfg.VTEP)
	case cfg.Routing.VXLANPort <= 0 || cfg.Routing.VXLANPort > 65535:
		return nil, fmt.Errorf("wireguard steering: vxlan port %d out of 1-65535", cfg.Routing.VXLANPort)
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.KeyEvery <= 0 {
		cfg.KeyEvery = DefaultKeyEvery
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Steer{cfg: cfg, kick: make(chan struct{}, 1), pub: make(chan struct{}, 1)}
	err := nsexec.Run(cfg.NetNS, func() error {
		var err error
		if s.nl, err = netlink.NewHandle(); err != nil {
			return fmt.Errorf("wireguard steering: netlink handle: %w", err)
		}
		l, err := s.nl.LinkByName(cfg.Device.Name())
		if err != nil {
			return fmt.Errorf("wireguard steering: device %s: %w", cfg.Device.Name(), err)
		}
		s.link = l.Attrs().Index
		if err := looseRPFilter(cfg.Device.Name()); err != nil {
			return err
		}
		return installRules(s.nl, cfg.Routing)
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the netlink handle. The rules and the table stay: traffic to peers stays
// blackholed rather than clear while no agent runs (Uninstall removes them).
func (s *Steer) Close() {
	if s.nl != nil {
		s.nl.Close()
	}
}

// rules are the two policy rules of r.
func rules(r Routing) []*netlink.Rule {
	mark := netlink.NewRule()
	mark.Family, mark.Priority, mark.Table = unix.AF_INET, r.Priority, unix.RT_TABLE_MAIN
	mark.Mark = uint32(r.Mark)
	mask := ^uint32(0)
	mark.Mask = &mask
	steer := netlink.NewRule()
	steer.Family, steer.Priority, steer.Table = unix.AF_INET, r.Priority+1, r.Table
	steer.IifName = "lo" // locally originated (the VXLAN device's output lookups)
	steer.IPProto = unix.IPPROTO_UDP
	steer.Dport = netlink.NewRulePortRange(uint16(r.VXLANPort), uint16(r.VXLANPort))
	return []*netlink.Rule{mark, steer}
}

// blackhole is the steering table's default route.
func blackhole(r Routing) *netlink.Route {
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	return &netlink.Route{Dst: all, Table: r.Table, Type: unix.RTN_BLACKHOLE, Family: unix.AF_INET}
}

// installRules puts r's rules and blackhole in place; rules already there are kept.
func installRules(nl *netlink.Handle, r Routing) error {
	// The blackhole first: the steering rule never points at an empty table (which would
	// fall through to the main table, in clear).
	if err := nl.RouteReplace(blackhole(r)); err != nil {
		return fmt.Errorf("wireguard steering: blackhole default in table %d: %w", r.Table, err)
	}
	for _, rule := range rules(r) {
		if err := nl.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("wireguard steering: policy rule priority %d: %w", rule.Priority, err)
		}
	}
	return nil
}

// DeviceAddress is the address the device must hold (wgtunnel.Config.Address): a
// decrypted packet comes from a peer's VTEP, which the main table routes by the
// underlay, so only a loose reverse-path check passes it, and the kernel's check refuses
// every packet arriving on a device without an address before looking further (rules
// on ports do not help: the check looks up without them). Every host uses the same
// link-local address; it never leaves the device.
const DeviceAddress = "169.254.201.1/32"

// looseRPFilter sets dev's rp_filter to 2 (loose): the effective value is the larger of
// "all" and the device's, so this holds whatever "all" says (strict would drop every
// decrypted packet).
func looseRPFilter(dev string) error {
	p := filepath.Join("/proc/sys/net/ipv4/conf", dev, "rp_filter")
	if err := os.WriteFile(p, []byte("2"), 0o644); err != nil {
		return fmt.Errorf("wireguard steering: loose reverse-path filter on %s: %w", dev, err)
	}
	return nil
}

// Block puts r's rules and the steering table's blackhole in place without a device, in
// the namespace at ns ("": the caller's): every locally sent packet to the VXLAN port is
// dropped, none leaves in clear. A netplugin running without encryption does it when the
// cluster's setting turns to wireguard (pkg/clusterenc), until it restarts with
// encryption (Install keeps them, idempotently) or the setting turns back (Uninstall).
func Block(ns string, r Routing) error {
	r = r.withDefaults()
	return nsexec.Run(ns, func() error {
		nl, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("wireguard steering: netlink handle: %w", err)
		}
		defer nl.Close()
		return installRules(nl, r)
	})
}

// Uninstall removes r's rules and table (netplugin without --encryption after a run with
// it: else the overlay stays blackholed), in the namespace at ns ("": the caller's).
// Missing pieces are not an error.
func Uninstall(ns string, r Routing) error {
	return nsexec.Run(ns, func() error { return uninstall(r.withDefaults()) })
}

func uninstall(r Routing) error {
	var errs []error
	// Rules are found by priority and table, not by r's VXLAN port: the run that
	// installed them may have had another --vxlan-port.
	all, err := netlink.RuleList(unix.AF_INET)
	if err != nil {
		errs = append(errs, fmt.Errorf("list policy rules: %w", err))
	}
	for i := range all {
		rule := &all[i]
		mark := rule.Priority == r.Priority && rule.Table == unix.RT_TABLE_MAIN && rule.Mark == uint32(r.Mark)
		steer := rule.Priority == r.Priority+1 && rule.Table == r.Table
		if !mark && !steer {
			continue
		}
		if err := netlink.RuleDel(rule); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete policy rule priority %d: %w", rule.Priority, err))
		}
	}
	routes, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: r.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		errs = append(errs, fmt.Errorf("list table %d: %w", r.Table, err))
	}
	for _, rt := range routes {
		if err := netlink.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s in table %d: %w", rt.Dst, r.Table, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("wireguard steering: uninstall: %w", err)
	}
	return nil
}

// Run follows the published records by the directory's watch and syncs peers and routes
// on every change of them, and whenever the datapath's peers (read every cfg.Every, in
// memory) differ from the last pass's, until ctx ends; an idle host reads nothing from
// etcd. A failed pass is tried again, backing off up to 30 s, or at the next change.
// Each pass also has this host's record (re)published when the directory does not hold
// it as it should be, apart from the pass (publisher: a netmaster slow to answer holds
// up no peer change). Nothing is synced before the watch's first snapshot: peers stay
// blackholed, as they are at Install. While the watch does not deliver (etcd out of
// reach: the client resumes it silently), Status.Watch and Degraded say so. With
// cfg.Key, the key file is followed too (followKey), and a rotation an admin requested
// in this host's record makes a new key (rotateIfAsked).
func (s *Steer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu      sync.Mutex
		recs    []model.WireGuardHost
		skipped int
		have    bool
		wg      sync.WaitGroup
	)
	wg.Go(func() {
		err := s.cfg.Directory.WatchWireGuardHosts(ctx, func(h []model.WireGuardHost, n int) {
			mu.Lock()
			recs, skipped, have = h, n, true
			mu.Unlock()
			s.Kick()
		}, s.setWatch)
		if ctx.Err() == nil {
			s.setWatch(fmt.Errorf("watch ended: %w", err))
		}
	})
	wg.Go(func() { s.publisher(ctx) })
	if s.cfg.Key != nil {
		wg.Go(func() { s.followKey(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()

	tick := time.NewTicker(s.cfg.Every)
	defer tick.Stop()
	wait := retry.New(s.cfg.Every, 30*time.Second)
	var (
		retryC  <-chan time.Time
		applied []dataplane.Peer
		rotated rotation // (rotateIfAsked)
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-retryC:
		case <-tick.C:
			if retryC != nil || slices.Equal(s.cfg.Peers(), applied) {
				continue
			}
		}
		mu.Lock()
		r, n, ok := recs, skipped, have
		mu.Unlock()
		if !ok {
			continue
		}
		rotated = s.rotateIfAsked(r, rotated)
		peers := s.cfg.Peers()
		if !s.listed(r) {
			select { // (publisher)
			case s.pub <- struct{}{}:
			default:
			}
		}
		err := s.apply(ctx, r, n, peers)
		s.setErr(err)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			s.cfg.Log.Warn("wireguard steering", "err", err)
			retryC = time.After(wait.Next())
			continue
		}
		wait.Reset()
		retryC, applied = nil, peers
	}
}

// Kick starts a pass of Run now.
func (s *Steer) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// followKey reloads cfg.Key when its file changes and on SIGHUP (pkg/filewatch) until
// ctx ends; a new key starts a pass at once, which publishes the new public key (the
// record no longer matches the device). Peers answer the device's handshakes again once
// their watch brings them the new key (docs/encryption.md, "Key rotation"). A refused
// file is said in Status.Key and Degraded until the file is taken.
func (s *Steer) followKey(ctx context.Context) {
	filewatch.Reloader{What: "wireguard key file", Paths: []string{s.cfg.Key.KeyFile()},
		Failed: "the device keeps its current key", Log: s.cfg.Log,
		Reload: s.reloadKey}.Follow(ctx, s.cfg.KeyEvery)
}

// reloadKey has the device read its key file again (cfg.Key); a new key starts a pass. A
// refused file is said in Status.Key until a file is taken.
func (s *Steer) reloadKey() error {
	changed, err := s.cfg.Key.ReloadKey()
	if changed {
		s.Kick()
	}
	s.mu.Lock()
	s.status.Key = ""
	if err != nil {
		s.status.Key = err.Error()
	}
	s.mu.Unlock()
	return err
}

// rotateIfAsked makes a new key when recs hold this host's record with a rotation an
// admin requested (model.WireGuardHost.RotationPending) and the device still holds the
// key that record has: the key file is removed and read again, exactly as an operator's
// rotation (followKey), and the pass publishes the new key, which answers the request.
// A request is acted on once per process (done: its generation and the key it was to
// replace): one already answered (an agent restarted after its rotation) or a record
// whose key the device no longer holds (rotated, not yet published: a crash in between,
// or the record delivered again before the publication) rotates nothing, nor does a
// request whose rotation failed, until the next. A generation is not compared with
// done's by order: a record deleted (DELETE /wireguard/hosts/<host>, a revoked token)
// and published again starts from 0, and its next request is generation 1 again. It
// returns the request now done.
func (s *Steer) rotateIfAsked(recs []model.WireGuardHost, done rotation) rotation {
	i := slices.IndexFunc(recs, func(r model.WireGuardHost) bool { return strings.EqualFold(r.Host, s.cfg.Host) })
	if i < 0 || !recs[i].RotationPending() || recs[i].PublicKey != s.cfg.Device.PublicKey().String() {
		return done
	}
	req := rotation{gen: recs[i].Rotate, key: recs[i].PublicKey}
	if req == done {
		return done
	}
	gen := req.gen
	if s.cfg.Key == nil {
		s.cfg.Log.Warn("wireguard key rotation requested, but the key file is not followed: nothing rotated", "generation", gen)
		return req
	}
	s.cfg.Log.Info("wireguard key rotation requested: making a new key", "generation", gen)
	if err := os.Remove(s.cfg.Key.KeyFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.cfg.Log.Error("wireguard key rotation: remove the key file", "generation", gen, "err", err)
		return req
	}
	if err := s.reloadKey(); err != nil {
		s.cfg.Log.Error("wireguard key rotation: the device keeps its current key", "generation", gen, "err", err)
	}
	return req
}

// rotation is a rotation request acted on: its generation and the key it replaced.
type rotation struct {
	gen uint64
	key string
}

// own is this host's record as it must be published.
func (s *Steer) own() model.WireGuardHost {
	return model.WireGuardHost{Host: s.cfg.Host, PublicKey: s.cfg.Device.PublicKey().String(),
		Endpoint: netip.AddrPortFrom(s.cfg.VTEP, uint16(s.cfg.Device.ListenPort())).String()}
}

// listed reports (and records in Status.Published) whether this host's record is among
// recs (what every peer reads) as this device's key and endpoint. When it is not (a
// record an admin deleted, one left out as a duplicate, a rotated key), the caller
// publishes it; a record a previous run published counts without netmaster having to
// answer.
func (s *Steer) listed(recs []model.WireGuardHost) bool {
	want := s.own()
	ok := slices.ContainsFunc(recs, func(r model.WireGuardHost) bool {
		return strings.EqualFold(r.Host, want.Host) && r.PublicKey == want.PublicKey && r.Endpoint == want.Endpoint
	})
	s.mu.Lock()
	s.status.Published = ok
	s.mu.Unlock()
	return ok
}

// publish sends this host's record to netmaster; Status.Publish holds its error.
func (s *Steer) publish(ctx context.Context) error {
	rec := s.own()
	err := s.cfg.Directory.PublishWireGuard(ctx, rec)
	if err != nil {
		err = fmt.Errorf("publish this host's wireguard key: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.Publish = ""
	if err != nil {
		s.status.Publish = err.Error()
		return err
	}
	s.status.Published = true
	s.cfg.Log.Info("wireguard key published", "publicKey", rec.PublicKey, "endpoint", rec.Endpoint)
	return nil
}

// publisher publishes this host's record whenever a pass of Run found it missing
// (s.pub), apart from the passes: a netmaster that does not answer (the client waits up
// to 30 s, again on every try) holds up no change of the peers. A failed publication is
// tried again, backing off up to 30 s, until it succeeds or a pass finds the record.
func (s *Steer) publisher(ctx context.Context) {
	wait := retry.New(s.cfg.Every, 30*time.Second)
	var retryC <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.pub:
		case <-retryC:
			if s.Status().Published {
				retryC = nil
				wait.Reset()
				continue
			}
		}
		if err := s.publish(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.cfg.Log.Warn("wireguard steering", "err", err)
			retryC = time.After(wait.Next())
			continue
		}
		retryC = nil
		wait.Reset()
	}
}

// setWatch records whether the watch of published keys delivers (err nil) or not, and
// logs each change of that.
func (s *Steer) setWatch(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.mu.Lock()
	was := s.status.Watch
	s.status.Watch = msg
	s.mu.Unlock()
	switch {
	case err != nil && was == "":
		s.cfg.Log.Error("wireguard steering: published keys not followed: a host removed meanwhile stays keyed", "err", err)
	case err == nil && was != "":
		s.cfg.Log.Info("wireguard steering: published keys followed again")
	}
}

func (s *Steer) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.Err = ""
	if err != nil {
		s.status.Err = err.Error()
	}
}

// plan splits the datapath's peers into the device's peers (those with a usable published
// record) and the waiting hosts. A VTEP two peers claim is nobody's: both wait.
func plan(peers []dataplane.Peer, recs []model.WireGuardHost, log *slog.Logger) (keyed []wgtunnel.Peer, keyedHosts, waiting []string) {
	byHost := map[string]model.WireGuardHost{}
	for _, r := range recs {
		byHost[strings.ToLower(r.Host)] = r
	}
	claims := map[netip.Addr]int{}
	for _, p := range peers {
		claims[p.VTEP]++
	}
	for _, p := range peers {
		rec, ok := byHost[strings.ToLower(p.Host)]
		if !ok || !p.VTEP.Is4() || claims[p.VTEP] > 1 {
			waiting = append(waiting, p.Host)
			continue
		}
		wp, err := wgtunnel.PeerOf(rec, []netip.Prefix{netip.PrefixFrom(p.VTEP, 32)})
		if err != nil {
			log.Warn("wireguard record not usable: host waits", "host", p.Host, "err", err)
			waiting = append(waiting, p.Host)
			continue
		}
		wp.Keepalive = Keepalive
		keyed = append(keyed, wp)
		keyedHosts = append(keyedHosts, p.Host)
	}
	return keyed, keyedHosts, waiting
}

// Sync brings the device's peers and the steering table to the published keys and the
// datapath's peers once.
func (s *Steer) Sync(ctx context.Context) error {
	err := s.sync(ctx)
	s.setErr(err)
	return err
}

func (s *Steer) sync(ctx context.Context) error {
	recs, skipped, err := s.cfg.Directory.WireGuardHosts(ctx)
	if err != nil {
		return err
	}
	// A publication that fails does not hold up the peers: they are synced first and
	// its failure returned with theirs.
	listed := s.listed(recs)
	err = s.apply(ctx, recs, skipped, s.cfg.Peers())
	if !listed {
		err = errors.Join(err, s.publish(ctx))
	}
	return err
}

// apply brings the device's peers and the steering table to recs (the published records,
// skipped of them left out) and peers (the datapath's).
func (s *Steer) apply(ctx context.Context, recs []model.WireGuardHost, skipped int, peers []dataplane.Peer) error {
	if skipped > 0 {
		s.cfg.Log.Warn("wireguard records left out (malformed, misplaced or sharing a key)", "skipped", skipped)
	}
	keyed, keyedHosts, waiting := plan(peers, recs, s.cfg.Log)
	// Routes of hosts no longer keyed go first (their traffic falls to the blackhole), the
	// device's peers next, the new hosts' routes last.
	want := map[netip.Addr]bool{}
	for _, p := range keyed {
		want[p.AllowedIPs[0].Addr()] = true
	}
	have, err := s.routes()
	if err != nil {
		return err
	}
	for a, rt := range have {
		if !want[a] {
			if err := s.nl.RouteDel(rt); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("wireguard steering: delete route to %s: %w", a, err)
			}
		}
	}
	if _, err := s.cfg.Device.SyncPeers(ctx, keyed); err != nil {
		return err
	}
	r := s.cfg.Routing
	if err := s.nl.RouteReplace(blackhole(r)); err != nil {
		return fmt.Errorf("wireguard steering: blackhole default in table %d: %w", r.Table, err)
	}
	for a := range want {
		rt := &netlink.Route{LinkIndex: s.link, Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)},
			Src: s.cfg.VTEP.AsSlice(), Table: r.Table, Scope: netlink.SCOPE_LINK, Family: unix.AF_INET}
		if err := s.nl.RouteReplace(rt); err != nil {
			return fmt.Errorf("wireguard steering: route %s into %s: %w", a, s.cfg.Device.Name(), err)
		}
	}
	s.mu.Lock()
	changed := !slices.Equal(s.status.Keyed, keyedHosts) || !slices.Equal(s.status.Waiting, waiting)
	s.status.Keyed, s.status.Waiting = keyedHosts, waiting
	s.mu.Unlock()
	if changed {
		s.cfg.Log.Info("wireguard peers", "keyed", keyedHosts, "waiting", waiting)
	}
	return nil
}

// routes are the steering table's routes into the device, by destination.
func (s *Steer) routes() (map[netip.Addr]*netlink.Route, error) {
	rs, err := s.nl.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: s.cfg.Routing.Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("wireguard steering: list table %d: %w", s.cfg.Routing.Table, err)
	}
	out := map[netip.Addr]*netlink.Route{}
	for i := range rs {
		rt := &rs[i]
		if rt.Type != unix.RTN_UNICAST || rt.Dst == nil {
			continue
		}
		if ones, _ := rt.Dst.Mask.Size(); ones != 32 {
			continue
		}
		a, _ := netip.AddrFromSlice(rt.Dst.IP.To4())
		out[a] = rt
	}
	return out, nil
}

// Status is the last sync's outcome.
func (s *Steer) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Keyed, st.Waiting = slices.Clone(st.Keyed), slices.Clone(st.Waiting)
	return st
}

// Degraded is what /healthz says about encryption: "" while every peer host is keyed and
// this host's key is published.
func (s *Steer) Degraded() string {
	st := s.Status()
	switch {
	case !st.Published:
		return fmt.Sprintf("wireguard: this host's key is not published yet (%s): peers send it no overlay traffic", st.Publish)
	case st.Key != "":
		return fmt.Sprintf("wireguard: key file refused (%s): the device keeps its current key", st.Key)
	case st.Watch != "":
		return fmt.Sprintf("wireguard: published keys not followed (%s): a host removed or rekeyed meanwhile is not applied", st.Watch)
	case len(st.Waiting) > 0:
		// Named: the operator has to find the host that withholds its key.
		return fmt.Sprintf("wireguard: %d peer host(s) without a published key (%s): their overlay traffic is dropped until it is known (fail closed)",
			len(st.Waiting), strings.Join(st.Waiting, ", "))
	case st.Err != "":
		return "wireguard: last sync failed: " + st.Err
	}
	return ""
}

var descPeers = prometheus.NewDesc("contiv_wireguard_peers",
	"Peer hosts of the WireGuard device by state: keyed (their VTEP goes into the device) or waiting (no published key yet: their overlay traffic is dropped).",
	[]string{"state"}, nil)

// Collector exports contiv_wireguard_peers{state="keyed|waiting"}.
func (s *Steer) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Steer }

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- descPeers }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Status()
	ch <- prometheus.MustNewConstMetric(descPeers, prometheus.GaugeValue, float64(len(st.Keyed)), "keyed")
	ch <- prometheus.MustNewConstMetric(descPeers, prometheus.GaugeValue, float64(len(st.Waiting)), "waiting")
}
