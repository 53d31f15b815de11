package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Defaults applied to an unset HostConfig or Options field.
const (
	DefaultPinBase    = "/sys/fs/bpf/contivbpf"
	DefaultVXLANIf    = "cbvx0"
	DefaultVXLANPort  = 4789
	DefaultMapEntries = 65536
	linksDir          = "links"
	aliasPrefix       = "contivbpf:"
)

// DefaultCTQuota is netplugin's per-endpoint conntrack quota, for the flows an endpoint
// opens and again for the flows others open to it: a sixteenth of the conntrack table of
// DefaultMapEntries (4 × MapEntries) each, so no fewer than eight endpoints can fill it.
// (HostConfig.CTQuota 0 is no quota.)
const DefaultCTQuota = DefaultMapEntries / 4

// ctInLimit is how many conntrack entries flows opened from outside (other hosts, the
// wire, node ports) may hold together, with a quota on: half the table (4 × MapEntries),
// so peers and wire clients never fill what the local endpoints' own flows need.
func ctInLimit(mapEntries int) int { return 2 * mapEntries }

// ErrMapFull is wrapped by every error caused by a full BPF map.
var ErrMapFull = errors.New("bpf map full")

// Driver is the eBPF dataplane of one host. Methods are safe for concurrent use.
//
// Locks (concerns.go), always taken in this order, never the other way round:
//
//  1. life (shared by every operation; Close and Teardown take it alone): closed, the
//     map and program handles, hostNS.
//  2. the concern locks, taken by d.lock in the order eps, pols, np, svc: an apply holds
//     its own concern's lock for writing and reads another's under its read lock (a
//     service reads the endpoints' addresses: svc written, eps read). nl and the
//     host-side state (links' creation, host routes) belong to eps.
//  3. clockMu, the policy clock (stamps.go): held from a change's announce to its publish,
//     so no change publishes a clock newer than another's unwritten state. epgMu, inside
//     it: cb_epgs' read-modify-writes (a stamp keeps the flags, putEPGState keeps the
//     stamp), which a policy apply changing no verdict makes outside the clock.
//  4. traceMu (trace.go): the trace programs and their scratch maps; pols.ruleMu, the
//     rule id cache (events.go), which readers of pols fill.
//  5. cfgMu: cb_config and its globals (writeConfig) and the settings only they read.
//  6. linkMu: the links map (the attachments' records, not their creation).
//  7. statMu: the map-full counters.
//
// gen is written holding every concern lock and cfgMu (Sync) and read holding any one.
// Readers (listings, metrics, status, counters, the conntrack collector, which has its
// own lock) take only what they read, each briefly, so no reader waits for an apply of
// another concern; applies of different concerns run side by side, meeting only at the
// short leaf locks 3-7.
type Driver struct {
	cfg    config
	log    *slog.Logger
	hostNS netns.NsHandle // -1: the caller's namespace

	life     sync.RWMutex
	clockMu  sync.Mutex
	epgMu    sync.Mutex
	traceMu  sync.Mutex
	cfgMu    sync.Mutex
	linkMu   sync.Mutex
	statMu   sync.Mutex
	objs     contivbpfObjects
	nl       *netlink.Handle
	vxIndex  int
	upIndex  int           // VLAN uplink, 0 = none
	egress   egress        // egress NAT (hostpath.go), zero = off; set by New only
	underlay underlay      // the VTEP's device when not the egress device (resolveUnderlay), zero = none; set by New only
	xdp      underlay      // the XDP prefilter's device (Options.XDP, xdp.go), zero = off; set by New only
	denyFeat atomic.Uint32 // CB_FEAT_DENY while cb_deny_src holds a prefix (prefilter.go)
	addrStop chan struct{} // stops the host address watch
	// The socket LB (hostpath.go): the cgroup its connect4 program is attached to ("" =
	// none) and the host namespace cookie it acts for.
	sockLB      string
	netnsCookie uint64
	links       map[string]*attachment // by interface name
	gen         uint32
	closed      bool
	pinLock     *os.File // flock on the pin root (lock.go), held until Close/Teardown

	// The driver's indexes, by concern: what it wrote for endpoints and networks, group
	// policy, services and node ports, and the NetworkPolicy layer. Each under its own
	// lock (the lock order above).
	eps  endpointIndex
	pols policyIndex
	svc  serviceIndex
	np   netpolIndex

	traceColl *ebpf.Collection // trace programs and scratch maps (trace.go), loaded on first use; traceMu
	lbSeed    uint32           // cb_lb_seed (lb.h): keys the service flow hash; random per run
	clock     ctClock          // cb_now's calibration (clock.go); zero: the helper clock
	ctgc      *ctGC
	ctgcEvery time.Duration
	// Under cfgMu. carried holds feature bits found in the pinned config at start-up:
	// policy and LB stay on for live traffic until the first Sync rebuilds the indexes
	// they derive from. pubEpoch is the policy clock as published (stamps.go).
	carried  uint32
	pubEpoch uint32
	epoch    uint32 // the policy clock's last announced stamp (stamps.go); clockMu
	eventsOn bool   // a DropEvents stream is open
	// bgpOn: the host speaks BGP (SetNativeRouting with a router-ip): VLAN networks are
	// routed natively. Taken from the pinned config at start-up, so a restarted agent keeps
	// routing natively until its speaker says otherwise.
	bgpOn bool
	// allowEvents: the stream also wants new flows a rule allowed (policy_allow events).
	allowEvents bool
	mapFull     map[string]uint64 // map name → failed inserts; statMu
	// legacyMetrics is the per-endpoint counter map of builds before counter slots
	// (cb_ep_metrics, keyed by {net, ip}), open only while New adopts endpoints.
	legacyMetrics *ebpf.Map
}

// endpointIndex is what the driver wrote for networks, endpoints (local and remote) and
// peers.
type endpointIndex struct {
	mu        sync.RWMutex
	networks  map[string]netRec
	endpoints map[string]epRec     // by indexKey(endpoint id); written by setEndpoint/dropEndpoint
	remotes   map[string]remoteRec // written by setRemote/dropRemote
	// addrNets indexes the endpoint addresses (local and remote) to the network keys
	// holding them (a count each), so a service backend resolves without a scan.
	addrNets map[uint32]map[uint32]int
	peers    map[string]netip.Addr // host → VTEP
	slots    map[uint32]string     // cb_ep_counters slot → endpoint indexKey
	// hostRoutes: endpoint address → the local endpoint (indexKey) the host routes it to.
	hostRoutes map[netip.Addr]string
	// nextIfindex: 0 while the kernel gives new links ifindexes inside cb_iface_direct,
	// else the next index addVeth asks for (vethindex.go).
	nextIfindex uint32
	// netNames is a copy of the networks' map keys → ids, replaced whole whenever networks
	// change, for readers that must not wait for an endpoint apply (the metrics scrape).
	netNames atomic.Pointer[map[uint32]string]
}

// publishNetNames replaces netNames from networks; the caller holds mu for writing.
func (x *endpointIndex) publishNetNames() {
	m := make(map[uint32]string, len(x.networks))
	for _, n := range x.networks {
		m[n.key] = n.net.ID
	}
	x.netNames.Store(&m)
}

// netName is network key k's id ("" when unknown), without the lock.
func (x *endpointIndex) netName(k uint32) string {
	if m := x.netNames.Load(); m != nil {
		return (*m)[k]
	}
	return ""
}

// policyIndex is what the driver wrote for group policy (policy.go, poltables.go,
// stamps.go).
type policyIndex struct {
	mu       sync.RWMutex
	policies map[uint16]dataplane.PolicySet
	ruleMu   sync.Mutex         // ruleIDs, a cache filled by readers of pols too
	ruleIDs  map[uint16]ruleIDs // rule ids by map position, for drop events (events.go)
	failed   map[uint16]error   // groups whose rule set could not be installed: deny-all
	pol      *polTables         // the compiled rule lists the programs look up (poltables.go)
	rev      uint32             // counts changes of policies, for the ruleIDs cache
	inChange bool               // within upsertPolicy's change: its group stamped already
	feat     atomic.Uint32      // the feature bits policies and failed ask of writeConfig
	// failedNow is failed as of the last change, for readers that take no lock (/metrics).
	failedNow atomic.Pointer[map[uint16]string]
}

// serviceIndex is what the driver wrote for services and node ports (service.go,
// hostpath.go).
type serviceIndex struct {
	mu        sync.RWMutex
	feat      atomic.Uint32     // the feature bits services and node ports ask of writeConfig
	services  map[string]svcRec // written by setService/dropService
	nextSvcID uint32
	// hostSvcIdx counts, per VIP:port/proto, the service ports of each zone holding it
	// (the host path serves the ones one zone holds); svcKeyOwner and npOwner name the
	// service using each port and node port entry. Kept by setService/dropService.
	hostSvcIdx  map[contivbpfCbHostSvcKey]map[uint32]int
	svcKeyOwner map[contivbpfCbSvcKey]string
	npOwner     map[contivbpfCbNpKey]string
	// hostSvcsStale: a service change could not settle its cb_host_svcs entries; the
	// next one rewrites the whole table (settleHostSvcs).
	hostSvcsStale bool
}

// netpolIndex is what the driver wrote for the NetworkPolicy layer (netpol.go,
// kcompile.go): its pods by PodPolicy id, its shared rule sets by content, and the last
// set id handed out.
type netpolIndex struct {
	mu         sync.RWMutex
	feat       atomic.Uint32 // the feature bits pod policies ask of writeConfig
	podPols    map[string]*podPolRec
	ksets      map[string]*kset
	ksetIDs    map[uint32]string             // set id → content key (ids in use)
	kpodOwner  map[contivbpfCbKpodKey]string // cb_kpods key → the pod policy that wrote it
	nextKSetID uint32
}

type attachment struct {
	ifname  string
	ifindex int
	program string
	link    link.Link
	hook    string // "" = tcx ingress; "cgroup-connect4" for the socket LB (hostpath.go)
}

type netRec struct {
	net dataplane.Network
	key uint32
	vrf uint32
}

type epRec struct {
	id      string
	hostIf  string
	ifindex int
	key     contivbpfCbEpKey
	slot    uint32 // cb_ep_counters index, 0 = none
}

type remoteRec struct {
	ep  dataplane.RemoteEndpoint
	key contivbpfCbEpKey
}

// New loads the programs against the maps pinned under opts.PinRoot (creating them on first
// start), creates or reuses the VXLAN device and swaps the programs of every pinned tcx link
// to the freshly loaded ones. Endpoints found from a previous run keep forwarding; call
// Sync next to converge to the desired state.
func New(ctx context.Context, host dataplane.HostConfig, opts Options) (*Driver, error) {
	cfg := config{HostConfig: host, Options: opts}
	if cfg.Host == "" {
		cfg.Host = "default"
	}
	if cfg.PinRoot == "" {
		cfg.PinRoot = filepath.Join(DefaultPinBase, cfg.Host)
	}
	if cfg.VXLANIf == "" {
		cfg.VXLANIf = DefaultVXLANIf
	}
	if cfg.VXLANPort == 0 {
		cfg.VXLANPort = DefaultVXLANPort
	}
	if cfg.MapEntries == 0 {
		cfg.MapEntries = DefaultMapEntries
	}
	switch {
	case cfg.MapEntries < 0:
		return nil, fmt.Errorf("ebpf: mapEntries %d must be positive", cfg.MapEntries)
	case uint64(cfg.MapEntries)*uint64(maxMapScale()) > math.MaxUint32:
		return nil, fmt.Errorf("ebpf: mapEntries %d out of range: the largest map holds %d × it, at most %d entries",
			cfg.MapEntries, maxMapScale(), uint32(math.MaxUint32))
	case cfg.CTQuota < 0 || cfg.CTQuota > math.MaxUint32:
		return nil, fmt.Errorf("ebpf: ctQuota %d out of range (0 = no quota)", cfg.CTQuota)
	case cfg.VXLANPort < 0 || cfg.VXLANPort > 65535:
		return nil, fmt.Errorf("ebpf: vxlanPort %d out of range", cfg.VXLANPort)
	case cfg.VTEP.IsValid() && !cfg.VTEP.Is4():
		return nil, fmt.Errorf("ebpf: vtep %v is not IPv4", cfg.VTEP)
	case len(cfg.VXLANIf) > 15:
		return nil, fmt.Errorf("ebpf: vxlanIf %q longer than 15 bytes", cfg.VXLANIf)
	case cfg.DNSIP.IsValid() && !cfg.DNSIP.Is4():
		return nil, fmt.Errorf("ebpf: dns ip %v is not IPv4", cfg.DNSIP)
	case cfg.FwdMode != "" && cfg.FwdMode != dataplane.FwdBridge && cfg.FwdMode != dataplane.FwdRouting:
		return nil, fmt.Errorf("ebpf: fwdMode %q must be bridge or routing", cfg.FwdMode)
	}
	if err := checkXDPMode(cfg.XDP); err != nil {
		return nil, err
	}
	d := &Driver{
		cfg:    cfg,
		log:    slog.Default(),
		hostNS: -1,
		links:  map[string]*attachment{},
		eps: endpointIndex{
			networks:   map[string]netRec{},
			endpoints:  map[string]epRec{},
			hostRoutes: map[netip.Addr]string{},
			remotes:    map[string]remoteRec{},
			addrNets:   map[uint32]map[uint32]int{},
			peers:      map[string]netip.Addr{},
			slots:      map[uint32]string{},
		},
		pols: policyIndex{
			policies: map[uint16]dataplane.PolicySet{},
			ruleIDs:  map[uint16]ruleIDs{},
			failed:   map[uint16]error{},
		},
		svc: serviceIndex{
			services:    map[string]svcRec{},
			hostSvcIdx:  map[contivbpfCbHostSvcKey]map[uint32]int{},
			svcKeyOwner: map[contivbpfCbSvcKey]string{},
			npOwner:     map[contivbpfCbNpKey]string{},
		},
		np: netpolIndex{
			podPols:   map[string]*podPolRec{},
			ksets:     map[string]*kset{},
			ksetIDs:   map[uint32]string{},
			kpodOwner: map[contivbpfCbKpodKey]string{},
		},
		mapFull: map[string]uint64{},
		lbSeed:  newLBSeed(),
	}
	d.log = d.log.With("dataplane", "ebpf", "host", cfg.Host)
	if err := d.open(ctx); err != nil {
		d.release()
		return nil, err
	}
	return d, nil
}

func (d *Driver) open(ctx context.Context) error {
	var err error
	if d.pinLock, err = lockPinRoot(d.cfg.PinRoot); err != nil {
		return err
	}
	if d.cfg.NetNS != "" {
		if d.hostNS, err = netns.GetFromPath(d.cfg.NetNS); err != nil {
			return fmt.Errorf("ebpf: open host netns %s: %w", d.cfg.NetNS, err)
		}
		d.nl, err = netlink.NewHandleAt(d.hostNS)
	} else {
		d.nl, err = netlink.NewHandle()
	}
	if err != nil {
		return fmt.Errorf("ebpf: netlink handle: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(d.cfg.PinRoot, linksDir), 0o700); err != nil {
		return fmt.Errorf("ebpf: create pin root: %w", err)
	}
	spec, err := loadContivbpf()
	if err != nil {
		return fmt.Errorf("ebpf: load spec: %w", err)
	}
	sizeMaps(spec, d.cfg.MapEntries)
	// Pinned maps of another layout (an upgrade, or a MapEntries change) are copied into
	// new maps first; they replace the pins once every link runs the new programs.
	migrations, err := d.planMigrations(spec)
	if err != nil {
		return err
	}
	defer closeMigrations(migrations)
	repl := map[string]*ebpf.Map{}
	upgraded := false // from a build without policy epochs per group (stamps.go)
	for _, mg := range migrations {
		repl[mg.name] = mg.new
		upgraded = upgraded || mg.name == contivbpfMapCbEpgs
	}
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.cfg.PinRoot}, MapReplacements: repl})
	if err != nil {
		return fmt.Errorf("ebpf: load programs and maps: %w", err)
	}
	// The stages' program array: pinned before any link takes this load's programs.
	calls, err := d.pinCalls()
	if err != nil {
		return err
	}

	// The conntrack clock: calibrated before writeConfig gives the programs their globals
	// (the entries' deadlines agree with the collector's clock either way).
	if d.clock, err = calibrateClock(ctx, d.objs.CbClockProbe); err != nil {
		d.log.Warn("conntrack clock not calibrated: the datapath reads the coarse clock by a helper call", "err", err)
	}
	var c contivbpfCbConfig
	if err := d.objs.CbCfg.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("ebpf: read config map: %w", err)
	}
	d.gen = c.Generation
	if d.gen == 0 {
		d.gen = 1
	}
	if err := d.resumeClock(c.PolicyEpoch, upgraded); err != nil {
		return err
	}
	// Only the bits an index stands for are carried; encryption is configuration
	// (Options.Encrypted), written from it by the first writeConfig.
	d.carried = c.Features &^ uint32(contivbpfCbFeaturesCB_FEAT_EVENTS|contivbpfCbFeaturesCB_FEAT_ALLOW_EVENTS|
		contivbpfCbFeaturesCB_FEAT_BGP|contivbpfCbFeaturesCB_FEAT_ENCRYPT)
	d.bgpOn = c.Features&uint32(contivbpfCbFeaturesCB_FEAT_BGP) != 0
	var sk contivbpfCbSvcKey
	var sv contivbpfCbSvc
	it := d.objs.CbServices.Iterate()
	for it.Next(&sk, &sv) {
		d.svc.nextSvcID = max(d.svc.nextSvcID, sv.Id)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("ebpf: read services map: %w", err)
	}
	// The programs look policy up in its compiled form: compiled from cb_policies before
	// any link takes them (an earlier build scanned cb_policies itself).
	if err := d.compilePinnedPolicies(); err != nil {
		return err
	}
	// Likewise NetworkPolicy rule sets; set ids continue above every pinned one.
	if err := d.compilePinnedKSets(); err != nil {
		return err
	}
	if err := d.ensureVXLAN(); err != nil {
		return err
	}
	if d.cfg.VLANIf != "" {
		up, err := d.nl.LinkByName(d.cfg.VLANIf)
		if err != nil {
			return fmt.Errorf("ebpf: vlan uplink %s: %w", d.cfg.VLANIf, err)
		}
		d.upIndex = up.Attrs().Index
	}
	if d.egress, err = d.resolveEgress(); err != nil {
		return err
	}
	if d.underlay, err = d.resolveUnderlay(); err != nil {
		return err
	}
	if d.xdp, err = d.xdpDevice(); err != nil {
		return err
	}
	d.pubEpoch = d.epoch // stamps of compilePinnedPolicies, published by the config
	if err := d.adoptDenySources(); err != nil {
		return err
	}
	if err := d.writeConfig(); err != nil {
		return err
	}
	if err := d.syncHostIPs(); err != nil {
		return err
	}
	d.addrStop = make(chan struct{})
	if err := d.watchHostIPs(d.addrStop); err != nil {
		return err
	}
	if err := d.ensureTCX(d.cfg.VXLANIf, d.vxIndex, d.objs.CbFromOverlay, contivbpfProgCbFromOverlay); err != nil {
		return err
	}
	if d.upIndex != 0 {
		if err := d.ensureTCX(d.cfg.VLANIf, d.upIndex, d.objs.CbFromWire, contivbpfProgCbFromWire); err != nil {
			return err
		}
	}
	// After cb_from_wire: on a shared uplink VLAN frames are taken off first.
	if err := d.attachEgress(); err != nil {
		return err
	}
	if err := d.attachXDP(); err != nil {
		return err
	}
	if err := d.attachSockLB(); err != nil {
		return err
	}
	if m, err := ebpf.LoadPinnedMap(filepath.Join(d.cfg.PinRoot, legacyMetricsMap), nil); err == nil {
		d.legacyMetrics = m
		defer func() { m.Close(); d.legacyMetrics = nil }()
	}
	// An earlier build kept every interface in the hash: entries with a place in the array
	// are copied there before the endpoints' links get this build's programs, and the
	// hash copies go once they all have them.
	if n, err := d.ifaces().promote(); err != nil {
		return fmt.Errorf("ebpf: %w", err)
	} else if n > 0 {
		d.log.Info("interface entries moved to the direct table", "entries", n)
	}
	if err := d.adoptEndpoints(ctx); err != nil {
		return err
	}
	// This build's programs are attached: mark what an earlier build left unmarked.
	if n, err := markShadowed(d.objs.CbCt); err != nil {
		d.log.Warn("conntrack entries left unmarked: a tuple clash made before this start may keep its packets on the fast path until it expires", "err", err)
	} else if n > 0 {
		d.log.Info("conntrack entries marked shadowed", "entries", n)
	}
	// And give the entries an earlier build wrote for flows opened to an endpoint their
	// owner's mark (markInbound).
	if owners, err := d.ifaces().owners(); err != nil {
		d.log.Warn("conntrack owners not read: entries of an earlier build may count against their receivers' own quota until they go", "err", err)
	} else if n, err := markInbound(d.objs.CbCt, owners); err != nil {
		d.log.Warn("conntrack entries of an earlier build left as their receivers' own", "err", err)
	} else if n > 0 {
		d.log.Info("conntrack entries marked opened to their endpoint", "entries", n)
	}
	if err := d.ifaces().dropShadowed(); err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	if err := d.finishMigrations(migrations); err != nil {
		return err
	}
	// (A migrated map was reopened from its pin: the compiled policy's writer follows.)
	d.pols.pol.heads, d.pols.pol.rules, d.pols.pol.cidrs = d.objs.CbPolHeads, d.objs.CbPolRules, d.objs.CbPolCidrs
	// The agent changed entries itself (marks, the migration's catch-up copy): no service
	// flow's memo taken before stays current.
	if err := memoGenJump(d.objs.CbCtGens); err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	d.removeForeignPins(spec)
	// Every link runs this load's programs: earlier loads' stages may go.
	if err := d.unpinOldCalls(calls); err != nil {
		d.log.Warn("stage arrays of earlier loads left pinned", "err", err)
	}
	d.ctgc = newCTGC(d.objs.CbCt, d.ctgcEvery)
	d.ctgc.gens = d.objs.CbCtGens
	d.ctgc.nat = natGC{flows: d.objs.CbSnat, replies: d.objs.CbSnatRev}
	d.ctgc.owned = d.objs.CbCtOwned
	d.ctgc.ownedIn = d.objs.CbCtOwnedIn
	go d.ctgc.run()
	return nil
}

// release closes handles without touching the datapath.
func (d *Driver) release() {
	d.stopGC()
	if d.addrStop != nil {
		close(d.addrStop)
		d.addrStop = nil
	}
	if d.traceColl != nil {
		d.traceColl.Close()
		d.traceColl = nil
	}
	for _, a := range d.links {
		a.link.Close()
	}
	d.links = map[string]*attachment{}
	d.objs.Close()
	if d.nl != nil {
		d.nl.Close()
		d.nl = nil
	}
	if d.hostNS >= 0 {
		d.hostNS.Close()
		d.hostNS = -1
	}
	if d.pinLock != nil {
		d.pinLock.Close() // drops the flock
		d.pinLock = nil
	}
}

// writeConfig writes cb_config and the programs' globals from the driver's settings and
// the feature bits each concern published (noteFeatures). It takes cfgMu.
func (d *Driver) writeConfig() error {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	return d.writeConfigLocked()
}

// writeConfigLocked is writeConfig for callers holding cfgMu.
func (d *Driver) writeConfigLocked() error {
	c := contivbpfCbConfig{VxlanIfindex: uint32(d.vxIndex), UplinkIfindex: uint32(d.upIndex), Generation: d.gen, Features: d.carried, PolicyEpoch: d.pubEpoch}
	c.Features |= d.pols.feat.Load() | d.np.feat.Load() | d.svc.feat.Load() | d.denyFeat.Load()
	if d.routing() {
		c.Features |= uint32(contivbpfCbFeaturesCB_FEAT_ROUTING)
		if d.bgpOn {
			c.Features |= uint32(contivbpfCbFeaturesCB_FEAT_BGP)
		}
	}
	if d.eventsOn {
		c.Features |= uint32(contivbpfCbFeaturesCB_FEAT_EVENTS)
		if d.allowEvents {
			c.Features |= uint32(contivbpfCbFeaturesCB_FEAT_ALLOW_EVENTS)
		}
	}
	if d.cfg.VTEP.IsValid() {
		c.Vtep = ip4(d.cfg.VTEP)
	}
	if d.cfg.Encrypted {
		c.Features |= uint32(contivbpfCbFeaturesCB_FEAT_ENCRYPT)
	}
	if d.egress.ifindex != 0 {
		c.SnatIp = ip4(d.egress.ip)
		c.EgressIfindex = uint32(d.egress.ifindex)
		c.SnatPortMin, c.SnatPortMax = d.egress.portMin, d.egress.portMax
	}
	if d.cfg.DNSIP.Is4() {
		c.DnsIp = ip4(d.cfg.DNSIP)
	}
	c.VxlanPort = nport(uint16(d.cfg.VXLANPort))
	if d.cfg.EgressAllowMetadata {
		c.EgressFlags |= uint8(contivbpfCbEgressFlagsCB_EGRESS_METADATA)
	}
	c.CtQuota = uint32(d.cfg.CTQuota)
	if c.CtQuota != 0 {
		c.CtInLimit = uint32(ctInLimit(d.cfg.MapEntries))
	}
	if d.sockLB != "" {
		c.NetnsCookie = d.netnsCookie
	}
	copy(c.GwMac[:], dataplane.RouterMAC)
	var was contivbpfCbConfig
	_ = d.objs.CbCfg.Lookup(uint32(0), &was)
	if err := d.objs.CbCfg.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("ebpf: write config map: %w", err)
	}
	// The programs read the feature bits from their own global (no map lookup).
	if d.objs.CbFeatures != nil {
		if err := d.objs.CbFeatures.Set(c.Features); err != nil {
			return fmt.Errorf("ebpf: set feature bits: %w", err)
		}
	}
	// NetworkPolicy off: the flows' stamps no longer count their zones', so the service
	// memo's stamp (revision + stamps + generation) could come back to an earlier value
	// while the revision moved: no memo taken before stays current (memoGenJump).
	netpol := uint32(contivbpfCbFeaturesCB_FEAT_NETPOL)
	if was.Features&netpol != 0 && c.Features&netpol == 0 && d.objs.CbCtGens != nil {
		if err := memoGenJump(d.objs.CbCtGens); err != nil {
			return fmt.Errorf("ebpf: %w", err)
		}
	}
	if d.objs.CbPolicyEpoch != nil {
		if err := d.objs.CbPolicyEpoch.Set(c.PolicyEpoch); err != nil {
			return fmt.Errorf("ebpf: set policy epoch: %w", err)
		}
	}
	// The service fast path's memo relies on loads not passing loads: x86 only.
	if d.objs.CbSvcMemoOff != nil {
		off := uint32(0)
		if runtime.GOARCH != "amd64" {
			off = 1
		}
		if err := d.objs.CbSvcMemoOff.Set(off); err != nil {
			return fmt.Errorf("ebpf: set the service memo switch: %w", err)
		}
	}
	if d.objs.CbLbSeed != nil {
		if err := d.objs.CbLbSeed.Set(d.lbSeed); err != nil {
			return fmt.Errorf("ebpf: set the service hash seed: %w", err)
		}
	}
	if err := d.clock.set(d.objs.CbClockBase, d.objs.CbTickNs); err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	return nil
}

// ensureVXLAN creates (or adopts) the collect_md VXLAN device.
func (d *Driver) ensureVXLAN() error {
	name := d.cfg.VXLANIf
	l, err := d.nl.LinkByName(name)
	if err == nil {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || !vx.FlowBased {
			return fmt.Errorf("ebpf: interface %s exists and is not a collect_md vxlan device", name)
		}
		if vx.Port != d.cfg.VXLANPort {
			return fmt.Errorf("ebpf: vxlan device %s uses port %d, want %d", name, vx.Port, d.cfg.VXLANPort)
		}
	} else {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("ebpf: look up %s: %w", name, err)
		}
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, FlowBased: true, Learning: false, Port: d.cfg.VXLANPort}
		if err := d.nl.LinkAdd(vx); err != nil {
			return fmt.Errorf("ebpf: create vxlan device %s: %w", name, err)
		}
		if l, err = d.nl.LinkByName(name); err != nil {
			return fmt.Errorf("ebpf: look up %s: %w", name, err)
		}
	}
	if err := d.nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("ebpf: set %s up: %w", name, err)
	}
	d.vxIndex = l.Attrs().Index
	return nil
}

// ensureTCX makes prog the tcx ingress program of ifname through a link pinned under
// PinRoot/links: an existing pinned link for the same device is updated in place (atomic
// program swap, no packet sees an empty hook); a stale one is replaced.
func (d *Driver) ensureTCX(ifname string, ifindex int, prog *ebpf.Program, progName string) error {
	if a, ok := d.links[ifname]; ok && a.ifindex == ifindex {
		if a.program == progName {
			return nil
		}
		if err := a.link.Update(prog); err != nil {
			return fmt.Errorf("ebpf: update tcx program on %s: %w", ifname, err)
		}
		d.linkMu.Lock()
		a.program = progName
		d.linkMu.Unlock()
		return nil
	}
	path := filepath.Join(d.cfg.PinRoot, linksDir, ifname)
	// Pinned for a device that is gone or was recreated: dropped.
	l, err := updatePinnedLink(path, prog, func(info *link.Info) bool {
		return info.TCX() != nil && int(info.TCX().Ifindex) == ifindex
	})
	if err != nil || l != nil {
		if l != nil {
			d.setLink(&attachment{ifname: ifname, ifindex: ifindex, program: progName, link: l})
		}
		return err
	}
	// The kernel attaches a device's first tcx program holding RTNL across an RCU grace
	// period (milliseconds at HZ=250): most of a new endpoint's time, and other rtnetlink
	// requests wait meanwhile, so nothing else can overlap it.
	err = nsexec.Run(d.cfg.NetNS, func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		return fmt.Errorf("ebpf: attach tcx ingress to %s: %w", ifname, err)
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return fmt.Errorf("ebpf: pin tcx link of %s: %w", ifname, err)
	}
	d.setLink(&attachment{ifname: ifname, ifindex: ifindex, program: progName, link: l})
	return nil
}

// updatePinnedLink takes the link pinned at path, when there is one that keep accepts,
// and puts prog in it (an atomic swap: no packet sees an empty hook); a link keep refuses
// is unpinned and closed (detached), and nil returned, as when there is none.
func updatePinnedLink(path string, prog *ebpf.Program, keep func(*link.Info) bool) (link.Link, error) {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ebpf: load pinned link %s: %w", path, err)
	}
	if info, err := l.Info(); err == nil && keep(info) {
		if err := l.Update(prog); err != nil {
			l.Close()
			return nil, fmt.Errorf("ebpf: update pinned link %s: %w", path, err)
		}
		return l, nil
	}
	_ = l.Unpin()
	l.Close()
	return nil, nil
}

// detachTCX unpins and closes ifname's link (detaching the program).
func (d *Driver) detachTCX(ifname string) {
	if d.cfg.detached != nil {
		defer d.cfg.detached(ifname)
	}
	if a, ok := d.links[ifname]; ok {
		_ = a.link.Unpin()
		a.link.Close()
		d.linkMu.Lock()
		delete(d.links, ifname)
		d.linkMu.Unlock()
		return
	}
	path := filepath.Join(d.cfg.PinRoot, linksDir, ifname)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		_ = l.Unpin()
		l.Close()
	}
}

// adoptEndpoints rebuilds the local endpoint index from the veths a previous run created
// (their alias carries the endpoint id) and swaps in the new program on each.
func (d *Driver) adoptEndpoints(ctx context.Context) error {
	links, err := d.nl.LinkList()
	if err != nil {
		return fmt.Errorf("ebpf: list links: %w", err)
	}
	for _, l := range links {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		id, ok := d.ownedEndpointLink(l) // not another agent's veth (owner.go)
		if !ok {
			continue
		}
		ifc, err := d.readIface(uint32(l.Attrs().Index))
		if err != nil {
			// Sync deletes it (or recreates it: its record has no key). No program of this
			// build judges it meanwhile, and with its pins lost none at all: it goes down
			// so the container sends nothing into the host's stack (upsertEndpoint).
			d.log.Warn("endpoint veth without iface entry; down until Sync sweeps it", "ifname", l.Attrs().Name, "err", err)
			if err := d.nl.LinkSetDown(l); err != nil && !errors.Is(err, syscall.ENODEV) {
				return fmt.Errorf("ebpf: set %s down: %w", l.Attrs().Name, err)
			}
			d.setEndpoint(id, epRec{id: id, hostIf: l.Attrs().Name, ifindex: l.Attrs().Index})
			continue
		}
		r := epRec{id: id, hostIf: l.Attrs().Name, ifindex: l.Attrs().Index,
			key: contivbpfCbEpKey{Net: ifc.Net, Ip: ifc.Ip}}
		if err := d.adoptSlot(&r, uint32(l.Attrs().Index), ifc); err != nil {
			return err
		}
		d.setEndpoint(id, r)
		if err := d.ensureTCX(l.Attrs().Name, l.Attrs().Index, d.objs.CbFromContainer, contivbpfProgCbFromContainer); err != nil {
			return err
		}
	}
	return nil
}

// readIface reads the interface table's entry of a host-side veth.
func (d *Driver) readIface(ifindex uint32) (contivbpfCbIface, error) {
	return d.ifaces().lookup(ifindex)
}

// Name implements dataplane.Driver.
func (d *Driver) Name() string { return "ebpf" }

// Close releases the driver's handles; programs, links and maps stay pinned and forwarding.
func (d *Driver) Close() error {
	defer d.lockLife()()
	if d.closed {
		return nil
	}
	d.closed = true
	d.release()
	return nil
}

// stopGC stops the conntrack collector (before the maps are closed).
func (d *Driver) stopGC() {
	if d.ctgc != nil {
		d.ctgc.close()
		d.ctgc = nil
	}
}

// Teardown removes every link, veth, device and pin the driver created on this host.
func (d *Driver) Teardown(ctx context.Context) error {
	defer d.lockLife()()
	if d.closed {
		return errors.New("ebpf: teardown: driver is closed")
	}
	var errs []error
	// Which veths are this agent's is decided before the pinned links go (owner.go).
	// The veths go before the programs (unplug): no container sends through an open hook.
	links, lerr := d.nl.LinkList()
	if err := lerr; err == nil {
		for _, l := range links {
			if _, own := d.ownedEndpointLink(l); own || (l.Attrs().Name == d.cfg.VXLANIf && l.Type() == "vxlan") {
				// A veth may vanish with its peer (or its container) meanwhile.
				if err := d.nl.LinkDel(l); err != nil && !errors.Is(err, syscall.ENODEV) {
					errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
				}
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for name := range d.links {
		d.detachTCX(name)
	}
	if ents, err := os.ReadDir(filepath.Join(d.cfg.PinRoot, linksDir)); err == nil {
		for _, e := range ents {
			d.detachTCX(e.Name())
		}
	}
	if err := d.setRouterIP(netip.Prefix{}); err != nil {
		errs = append(errs, err)
	}
	for _, m := range d.allMaps() {
		if m.m == nil {
			continue
		}
		if err := m.m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", m.name, err))
		}
	}
	if err := os.RemoveAll(d.cfg.PinRoot); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", d.cfg.PinRoot, err))
	}
	d.closed = true
	d.release()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: teardown: %w", err)
	}
	return nil
}

type namedMap struct {
	name string
	m    *ebpf.Map
}

// mapField returns the driver's handle of map name (nil if this build has no such map):
// any map of the generated objects, found by its ebpf tag.
func (d *Driver) mapField(name string) **ebpf.Map {
	v := reflect.ValueOf(&d.objs.contivbpfMaps).Elem()
	for i := range v.NumField() {
		if v.Type().Field(i).Tag.Get("ebpf") == name {
			if p, ok := v.Field(i).Addr().Interface().(**ebpf.Map); ok {
				return p
			}
		}
	}
	return nil
}

// allMaps is every map of the generated objects, by name.
func (d *Driver) allMaps() []namedMap {
	v := reflect.ValueOf(&d.objs.contivbpfMaps).Elem()
	out := make([]namedMap, 0, v.NumField())
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok {
			out = append(out, namedMap{v.Type().Field(i).Tag.Get("ebpf"), m})
		}
	}
	return out
}

// ip4 returns an IPv4 address as the uint32 whose memory holds the address in network order.
func ip4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func addrFrom(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func macOf(b [6]uint8) string { return net.HardwareAddr(b[:]).String() }

func (d *Driver) routing() bool { return d.cfg.FwdMode == dataplane.FwdRouting }

// vrfOf is the routing domain id of a network: a hash of its tenant (the part of the id
// after the last "."), stable across restarts (zoneOfHash).
func vrfOf(networkID string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(tenantOf(networkID)))
	return zoneOfHash(h.Sum32())
}

// natFragNodePortIn is CB_NATFRAG_NODEPORT_IN (bpf/lib/nodeport.h): the zone of the
// records of fragmented datagrams to a node port, no tenant's.
const natFragNodePortIn = 0xffffffff

// zoneOfHash is the zone of a tenant whose name hashes to h: h, except that no tenant's
// zone is natFragNodePortIn (FNV-1a is easy to steer: a chosen tenant name could
// otherwise meet node port fragment records), nor was its node port twin in the builds
// that flipped a bit for it (legacyZoneNodePort: kept so that no tenant's zone changes).
func zoneOfHash(h uint32) uint32 {
	if h|legacyZoneNodePort == natFragNodePortIn {
		h ^= 1
	}
	return h
}

func netKey(n dataplane.Network) uint32 {
	if n.Encap == dataplane.EncapVLAN {
		return 1<<24 | n.Tag
	}
	return n.Tag
}

// nport returns a port as the uint16 whose memory holds it in network order.
func nport(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func hport(v uint16) uint16 { return nport(v) }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
