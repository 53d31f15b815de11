// Package agent is netplugin's host agent: it watches Contiv's state in etcd, computes
// the desired datapath state of its host (networks, local and remote endpoints, peers,
// policies, services), converges a dataplane.Driver to it (a full Sync at start, then
// incremental upserts/deletes, failed calls retried with backoff), and attaches and
// detaches local endpoints for the runtime front-ends (CNI socket, Docker plugin).
//
// It knows etcd keys and Contiv's state JSON (pkg/model) and talks to netmaster through
// a MasterClient; it never touches the kernel except through the Driver.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// MasterClient is the part of netmaster the agent calls (pkg/masterclient implements it).
type MasterClient interface {
	CreateEndpoint(ctx context.Context, req model.CreateEndpointRequest) (model.CfgEndpointState, error)
	DeleteEndpoint(ctx context.Context, req model.DeleteEndpointRequest) error
	// RecordEndpoint and ForgetEndpoint write and remove this host's record of an endpoint
	// (/contiv.io/oper/eps/<id>): agents do not write keys other hosts' records share a
	// prefix with (etcd RBAC confines their credentials to their own host's keys).
	RecordEndpoint(ctx context.Context, rec model.LocalEndpointRecord) error
	ForgetEndpoint(ctx context.Context, id string) error
}

// Config is what an agent needs.
type Config struct {
	Store  *state.Store
	Master MasterClient
	Driver dataplane.Driver
	Host   string // host label (homingHost of local endpoints)
	VTEP   netip.Addr
	// FwdMode must equal the global fwd-mode netmaster publishes.
	FwdMode dataplane.FwdMode
	// VLANIf is the uplink of VLAN networks (netplugin --vlan-if); without one, VLAN
	// networks are refused and reported (nothing could carry their traffic off the host).
	VLANIf string
	// UplinkMTU is the host's underlay MTU; containers get UplinkMTU-50 on VXLAN networks
	// and UplinkMTU on VLAN networks. 0 = 1500.
	UplinkMTU int
	// Pods, if set, is the Kubernetes API the CNI backend reads pod labels from (tenant,
	// network, group); nil = take them from the CNI request.
	Pods PodLabeler
	// GlobalPoll is how often the agent re-reads the global config while waiting for it
	// (default 1s, as Contiv).
	GlobalPoll time.Duration
	// InspectAuth names the callers of the inspect API (everything but /healthz and
	// /metrics): admin and read-only identities may read it. nil, without InspectOpen:
	// those routes answer 401.
	InspectAuth InspectAuthenticator
	// InspectOpen serves the inspect API to anyone who reaches its address (netplugin
	// --inspect-insecure).
	InspectOpen bool
	// Pprof also serves Go's profiler under /debug/pprof/, behind the same gate (admin).
	Pprof bool
	// DebugToken enables the mutating /debug routes of the local API for callers that
	// send it as a bearer token; empty keeps them off.
	DebugToken string
	// VerifyEvery is how often the agent compares the datapath with its state on its own
	// (0: DefaultVerifyEvery, negative: never; GET /inspect/verify always works).
	VerifyEvery time.Duration
	// DNS says the host's DNS responder runs (pkg/dnsresp, with this agent as its
	// directory): CNI results name the gateway as the endpoint's nameserver.
	DNS bool
	// BGPHoldTime is the hold time of the host's BGP session (default 9s), when a bgp
	// record names the host (bgp.go).
	BGPHoldTime time.Duration
	// BGPRestartTime is the graceful-restart time the speaker announces (0 = off): how
	// long the neighbour keeps this host's routes while its netplugin restarts.
	BGPRestartTime time.Duration
	// BGPPrefixes, if set, limits what the speaker advertises to endpoint addresses inside
	// them (a tenant chooses its subnets; without a limit its /32s are announced to the
	// fabric whatever they are).
	BGPPrefixes []netip.Prefix
	// Encryption, if set, is the host's WireGuard steering (netplugin --encryption): what
	// it reports degraded, /healthz says.
	Encryption EncryptionHealth
	Logger     *slog.Logger
}

// EncryptionHealth reports the encryption between hosts (pkg/wgsteer): "" while every
// peer host is keyed, else what is degraded (no tenant's names in it).
type EncryptionHealth interface {
	Degraded() string
}

// watched prefixes and what they feed.
var watchPrefixes = []string{
	model.NetStatePrefix,
	model.EpStatePrefix,
	model.EPGStatePrefix,
	model.RuleStatePrefix,
	model.SvcLBStatePrefix,
	model.BgpStatePrefix,
	model.K8sPodPolicyPrefix,
	model.PrefilterPrefix,
	"/contiv.io/master/config/",
	state.ServicePrefix + vxlan.VTEPService + "/",
	vxlan.HostVTEPPrefix,
}

// recordKind names a watched prefix's records in the error map ("network/<id>").
var recordKind = map[string]string{
	model.NetStatePrefix:   "network",
	model.EpStatePrefix:    "endpoint",
	model.EPGStatePrefix:   "endpoint-group",
	model.RuleStatePrefix:  "policy-rule",
	model.SvcLBStatePrefix: "service",
	model.BgpStatePrefix:   "bgp",
	vxlan.HostVTEPPrefix:   "host-vtep",

	model.K8sPodPolicyPrefix: "pod-policy",
	model.PrefilterPrefix:    "prefilter",
}

// Agent is one host's netplugin core.
type Agent struct {
	cfg     Config
	store   *state.Store
	driver  dataplane.Driver
	log     *slog.Logger
	metrics *metrics

	mu       sync.Mutex // guards rec, errs, ready, lastSync
	rec      *records
	errs     map[string]error
	ready    chan struct{}
	lastSync time.Time

	applyMu sync.Mutex // serialises driver calls; guards applied, synced, bad, retry
	applied *dataplane.Index
	// bad are the records that cannot be used, as of the last pass (a scoped pass
	// replaces only its objects' entries).
	bad map[string]error
	// retry is what the last pass's failed driver calls make the next one redo.
	retry  scope
	synced bool
	// denyApplied is the deny list the driver holds (SetDenySources), nil before the
	// first call.
	denyApplied []netip.Prefix

	attachMu sync.Mutex // one attach/detach at a time
	// podQoSRetry are the endpoints whose local record retryPodQoSRecords writes again
	// (guarded by attachMu); podQoSKick wakes it.
	podQoSRetry map[string]bool
	podQoSKick  chan struct{}
	kick        chan struct{}

	monOnce sync.Once
	mon     *monitorHub // drop event fan-out (monitor.go), made on first /monitor

	lastDrift  int       // drift entries found by the last Verify (guarded by mu)
	lastVerify time.Time // when (zero: never)

	names   atomic.Pointer[nameIndex]  // DNS names of every tenant (dns.go), rebuilt with the desired state
	askers  atomic.Pointer[askerIndex] // host veth name → DNS asker (dns.go), rebuilt with it
	ifNames sync.Map                   // ifindex → ifNameEntry (dns.go)

	bgpKick      chan struct{} // wakes bgpLoop after a reconcile (bgp.go)
	bgpStatus    BGPStatus     // guarded by mu
	bgpPublished bool          // bgpStatus is in etcd (guarded by mu)
}

// New validates cfg and returns an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("agent config: Store is nil")
	case cfg.Driver == nil:
		return nil, errors.New("agent config: Driver is nil")
	case cfg.Master == nil:
		return nil, errors.New("agent config: Master is nil")
	case cfg.Host == "":
		return nil, errors.New("agent config: Host is empty")
	case cfg.FwdMode != dataplane.FwdBridge && cfg.FwdMode != dataplane.FwdRouting:
		return nil, fmt.Errorf("agent config: FwdMode %q must be bridge or routing", cfg.FwdMode)
	}
	if cfg.UplinkMTU == 0 {
		cfg.UplinkMTU = 1500
	}
	if cfg.UplinkMTU < 626 || cfg.UplinkMTU > 9050 {
		return nil, fmt.Errorf("agent config: UplinkMTU %d out of 626-9050", cfg.UplinkMTU)
	}
	if cfg.BGPHoldTime == 0 {
		cfg.BGPHoldTime = 9 * time.Second
	}
	if cfg.GlobalPoll == 0 {
		cfg.GlobalPoll = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Agent{
		cfg: cfg, store: cfg.Store, driver: cfg.Driver,
		log:     cfg.Logger.With("host", cfg.Host),
		metrics: newMetrics(),
		rec:     newRecords(),
		errs:    map[string]error{},
		ready:   make(chan struct{}),
		applied: dataplane.NewIndex(),
		bad:     map[string]error{},
		kick:    make(chan struct{}, 1),
		bgpKick: make(chan struct{}, 1),

		podQoSRetry: map[string]bool{},
		podQoSKick:  make(chan struct{}, 1),
	}, nil
}

// Ready is closed once the first full Sync has been attempted after every watch delivered
// its snapshot.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// WaitGlobal blocks until netmaster published the global config with fwd-mode and
// pvt-subnet (polling, as Contiv) and checks fwd-mode against the agent's.
func (a *Agent) WaitGlobal(ctx context.Context) (model.GlobConfig, error) {
	g, err := WaitGlobalConfig(ctx, a.store, a.cfg.GlobalPoll, a.log)
	if err == nil && g.FwdMode != string(a.cfg.FwdMode) {
		return g, fmt.Errorf("fwd-mode mismatch: netmaster's global config says %q, netplugin runs with --fwdmode %s", g.FwdMode, a.cfg.FwdMode)
	}
	return g, err
}

// WaitGlobalConfig blocks until netmaster published the global config with fwd-mode and
// pvt-subnet, reading it every poll (as Contiv), and returns it.
func WaitGlobalConfig(ctx context.Context, store *state.Store, poll time.Duration, log *slog.Logger) (model.GlobConfig, error) {
	logged := false
	for {
		var g model.GlobConfig
		err := store.Get(ctx, state.GlobalConfigKey, &g)
		switch {
		case err == nil && g.FwdMode != "" && g.PvtSubnet != "":
			return g, nil
		case err != nil && !errors.Is(err, state.ErrNotFound):
			log.Warn("read global config", "err", err)
		}
		if !logged {
			log.Info("waiting for netmaster's global config (fwd-mode, pvt-subnet)", "key", state.GlobalConfigKey)
			logged = true
		}
		select {
		case <-ctx.Done():
			return g, fmt.Errorf("wait for global config: %w", ctx.Err())
		case <-time.After(poll):
		}
	}
}

// Run waits for the global config, restores this host's endpoint records, watches the
// state, syncs the driver and keeps it converged until ctx ends. It does not close the
// driver.
func (a *Agent) Run(ctx context.Context) error {
	g, err := a.WaitGlobal(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.rec.glob = g
	a.mu.Unlock()
	if a.cfg.VTEP.IsValid() {
		// Durable (no lease): peers keep this host's VTEP while its agent is down, even
		// if they restart meanwhile.
		if err := a.store.Put(ctx, vxlan.HostVTEPKey(a.cfg.Host), vxlan.HostVTEP{Host: a.cfg.Host, VTEP: a.cfg.VTEP.String()}); err != nil {
			return fmt.Errorf("record this host's vtep: %w", err)
		}
	}
	locals, err := state.ListJSON[LocalEndpoint](ctx, a.store, model.EpOperPrefix)
	if err != nil {
		return fmt.Errorf("restore local endpoints: %w", err)
	}
	a.mu.Lock()
	for _, l := range locals {
		if l.HomingHost == a.cfg.Host && l.ID != "" {
			a.rec.setLocal(l.ID, &l)
		}
	}
	n := len(a.rec.local)
	a.mu.Unlock()
	a.log.Info("restored local endpoint records", "count", n)

	var wg sync.WaitGroup
	snapshots := make(chan string, len(watchPrefixes))
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	for _, p := range watchPrefixes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			_ = a.store.ListWatch(wctx, p, state.WatchHandler{
				Snapshot: func(kvs []state.KV, _ int64) {
					a.applySnapshot(p, kvs)
					if first {
						first = false
						snapshots <- p
					}
					a.trigger()
				},
				Event: func(ev state.Event) {
					a.applyEvent(p, ev)
					a.trigger()
				},
			})
		}()
	}
	for range watchPrefixes {
		select {
		case <-snapshots:
		case <-ctx.Done():
			return fmt.Errorf("initial watch snapshots: %w", ctx.Err())
		}
	}
	a.watchPodBandwidth(wctx)
	wg.Add(1)
	go func() { defer wg.Done(); a.bgpLoop(wctx) }()
	if every := a.cfg.VerifyEvery; every >= 0 {
		if every == 0 {
			every = DefaultVerifyEvery
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.verifyLoop(wctx, every) }()
	}
	a.loop(ctx)
	return nil
}

func (a *Agent) trigger() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// loop reconciles on every change and retries failed driver calls with backoff.
func (a *Agent) loop(ctx context.Context) {
	wait := retry.New(200*time.Millisecond, 30*time.Second)
	var again <-chan time.Time
	first := true
	for {
		errs := a.reconcile(ctx)
		if first {
			first = false
			close(a.ready)
		}
		if len(errs) > 0 {
			again = time.After(wait.Next())
		} else {
			again = nil
			wait.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-again:
		}
	}
}

// view is one reconcile pass's desired objects: the whole state (sc.all, full set) or
// the objects sc names.
type view struct {
	sc   scope
	full dataplane.State
	want *dataplane.Index
	bad  map[string]error
	// deny is this host's deny list (full passes only; prefilter.go).
	deny []netip.Prefix
}

// desired takes what changed since the last pass plus retry (everything when full) and
// computes it.
func (a *Agent) desired(full bool, retry scope) view {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rec
	sc := r.dirty
	r.dirty = scope{}
	if full || retry.all {
		sc = scope{all: true}
	}
	if !sc.all {
		for id := range retry.eps {
			sc.touchEp(id)
		}
		for id := range retry.svcs {
			sc.touchSvc(id)
		}
		sc.pols = sc.pols || retry.pols
		for g := range retry.groups {
			sc.touchGroup(g)
		}
	}
	if r.namesStale {
		a.names.Store(nil) // rebuilt by the next lookup (Lookup)
		r.namesStale = false
	}
	if r.askersStale {
		a.askers.Store(buildAskers(r))
		r.askersStale = false
	}
	if sc.empty() {
		return view{sc: sc} // nothing changed (e.g. a group record): no pass
	}
	h := hostView{host: a.cfg.Host, vtep: a.cfg.VTEP, uplinkMTU: a.cfg.UplinkMTU, vlanIf: a.cfg.VLANIf}
	if sc.all {
		s, bad := compute(h, r)
		return view{sc: sc, full: s, want: dataplane.IndexOf(s), bad: bad, deny: a.denyList(bad)}
	}
	want, bad := computeScoped(h, r, sc)
	return view{sc: sc, want: want, bad: bad}
}

func (a *Agent) setErrors(errs map[string]error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = errs
	if len(errs) == 0 {
		a.lastSync = time.Now()
	}
}

// Errors returns the current per-object errors (driver calls that are being retried and
// records that cannot be used), as "object: message" strings sorted by object.
func (a *Agent) Errors() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]string, len(a.errs)+1)
	for k, e := range a.errs {
		out[k] = e.Error()
	}
	if a.bgpStatus.Error != "" {
		out["bgp/"+a.cfg.Host] = a.bgpStatus.Error
	}
	return out
}

// applySnapshot replaces the records of one prefix.
func (a *Agent) applySnapshot(prefix string, kvs []state.KV) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rec.touchAll()
	switch prefix {
	case model.NetStatePrefix:
		clear(a.rec.nets)
	case model.EpStatePrefix:
		a.rec.clearEps()
	case model.EPGStatePrefix:
		clear(a.rec.epgs)
	case model.RuleStatePrefix:
		clear(a.rec.rules)
		clear(a.rec.ruleGroup)
		clear(a.rec.oddRules)
	case model.SvcLBStatePrefix:
		clear(a.rec.svcs)
	case model.BgpStatePrefix:
		clear(a.rec.bgp)
	case model.PrefilterPrefix:
		clear(a.rec.prefilters)
	case model.K8sPodPolicyPrefix:
		clear(a.rec.podPols)
	case vxlan.HostVTEPPrefix:
		clear(a.rec.hostVTEPs)
	default:
		if strings.HasPrefix(prefix, state.ServicePrefix) {
			clear(a.rec.vteps)
		}
	}
	if kind, ok := recordKind[prefix]; ok {
		for k := range a.rec.undecodable {
			if strings.HasPrefix(k, kind+"/") {
				delete(a.rec.undecodable, k)
			}
		}
	}
	for _, kv := range kvs {
		a.put(prefix, kv.Key, kv.Value)
	}
}

func (a *Agent) applyEvent(prefix string, ev state.Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ev.Type == state.EventPut {
		a.put(prefix, ev.Key, ev.Value)
		return
	}
	id := strings.TrimPrefix(ev.Key, prefix)
	if kind, ok := recordKind[prefix]; ok {
		_, was := a.rec.undecodable[kind+"/"+id]
		delete(a.rec.undecodable, kind+"/"+id)
		a.undecodableChanged(kind, was)
	}
	switch prefix {
	case model.EpStatePrefix:
		a.rec.setEp(id, nil)
		return
	case model.SvcLBStatePrefix:
		a.rec.setSvc(id, nil)
		return
	case model.K8sPodPolicyPrefix:
		delete(a.rec.podPols, id)
		a.rec.dirty.touchEp(id)
		return
	case model.RuleStatePrefix:
		a.rec.setRule(id, nil)
		return
	case model.EPGStatePrefix:
		a.rec.setEPG(id, nil)
		return
	case model.BgpStatePrefix:
		delete(a.rec.bgp, id)
		return
	}
	a.rec.touchAll()
	switch prefix {
	case model.PrefilterPrefix:
		delete(a.rec.prefilters, id)
	case vxlan.HostVTEPPrefix:
		delete(a.rec.hostVTEPs, id)
	case model.NetStatePrefix:
		delete(a.rec.nets, id)
	default:
		if strings.HasPrefix(prefix, state.ServicePrefix) {
			delete(a.rec.vteps, ev.Key)
		}
	}
}

// put decodes one record; a record that does not decode is logged, reported under
// errors ("<kind>/<id>") and dropped (the previous version, if any, is forgotten too: it
// no longer describes the store).
func (a *Agent) put(prefix, key string, val []byte) {
	id := strings.TrimPrefix(key, prefix)
	kv := state.KV{Key: key, Value: val}
	var err error
	switch prefix {
	case model.EpStatePrefix, model.SvcLBStatePrefix, model.K8sPodPolicyPrefix, model.NetStatePrefix:
		// scoped to the one object (the setters below); a network only when it changed
		// more than its address bookkeeping
	case model.RuleStatePrefix:
		// scoped to the groups the rule compiles into (setRule)
	case model.EPGStatePrefix:
		// scoped to this host's endpoints of the group when its netprofile changed (setEPG)
	case model.BgpStatePrefix, "/contiv.io/master/config/":
		// nothing the datapath state is computed from (the BGP loop reads its records
		// after every pass)
	default:
		a.rec.touchAll()
	}
	switch prefix {
	case model.NetStatePrefix:
		var v model.CfgNetworkState
		old, had := a.rec.nets[id]
		if err = kv.Decode(&v); err == nil {
			a.rec.nets[id] = v
			// netmaster rewrites the record for every address it hands out: only a
			// change of what the datapath, DNS or BGP read makes the next pass full.
			if !had || shapeOf(old) != shapeOf(v) {
				a.rec.touchAll()
			}
		} else {
			delete(a.rec.nets, id)
			a.rec.touchAll()
		}
	case model.EpStatePrefix:
		var v model.CfgEndpointState
		if err = kv.Decode(&v); err == nil {
			a.rec.setEp(id, &v)
		} else {
			a.rec.setEp(id, nil)
		}
	case model.EPGStatePrefix:
		var v model.EndpointGroupState
		if err = kv.Decode(&v); err == nil {
			a.rec.setEPG(id, &v)
		} else {
			a.rec.setEPG(id, nil)
		}
	case model.RuleStatePrefix:
		var v model.CfgPolicyRule
		if err = kv.Decode(&v); err == nil {
			a.rec.setRule(id, &v)
		} else {
			a.rec.setRule(id, nil)
		}
	case model.SvcLBStatePrefix:
		var v model.CfgServiceLBState
		if err = kv.Decode(&v); err == nil {
			a.rec.setSvc(id, &v)
		} else {
			a.rec.setSvc(id, nil)
		}
	case model.BgpStatePrefix:
		var v model.CfgBgpState
		if err = kv.Decode(&v); err == nil {
			a.rec.bgp[id] = v
		} else {
			delete(a.rec.bgp, id)
		}
	case model.PrefilterPrefix:
		var v model.Prefilter
		if err = kv.Decode(&v); err == nil {
			err = checkPrefilter(&v)
		}
		if err == nil {
			a.rec.prefilters[id] = v
		}
		// Unreadable: the entry it replaced stays in force (a denied source never passes
		// because its record was garbled around netmaster), and the record is reported.
	case model.K8sPodPolicyPrefix:
		var v model.K8sPodPolicy
		if err = kv.Decode(&v); err != nil {
			// Unreadable: the pod stays isolated both ways with no rules (never opened
			// by a record it cannot read), and the record is reported.
			v = model.K8sPodPolicy{ID: id, IngressIsolated: true, EgressIsolated: true}
		}
		a.rec.podPols[id] = v
		a.rec.dirty.touchEp(id)
	case "/contiv.io/master/config/":
		if key != state.GlobalConfigKey {
			return
		}
		var g model.GlobConfig
		if err = kv.Decode(&g); err == nil {
			a.rec.glob = g
			if g.FwdMode != "" && g.FwdMode != string(a.cfg.FwdMode) {
				a.log.Error("global fwd-mode changed; restart netplugin with the matching --fwdmode", "global", g.FwdMode, "netplugin", a.cfg.FwdMode)
			}
		}
	case vxlan.HostVTEPPrefix:
		var v netip.Addr
		if _, v, err = vxlan.DecodeHostVTEP(val); err == nil {
			a.rec.hostVTEPs[id] = v
		} else {
			delete(a.rec.hostVTEPs, id)
		}
	default:
		var r vxlan.Registration
		if r, err = vxlan.Decode(val); err == nil {
			a.rec.vteps[key] = r
			if v, perr := netip.ParseAddr(r.HostAddr); perr == nil && r.Hostname != "" {
				a.rec.lastVTEP[r.Hostname] = v
			}
		} else {
			delete(a.rec.vteps, key)
		}
	}
	kind, tracked := recordKind[prefix]
	if !tracked {
		if err != nil {
			a.log.Warn("ignoring undecodable record", "key", key, "err", err)
		}
		return
	}
	_, was := a.rec.undecodable[kind+"/"+id]
	if err != nil {
		a.log.Warn("ignoring undecodable record", "key", key, "err", err)
		a.rec.undecodable[kind+"/"+id] = fmt.Errorf("record %s does not decode: %w", key, err)
	} else {
		delete(a.rec.undecodable, kind+"/"+id)
	}
	a.undecodableChanged(kind, was != (err != nil))
}

// undecodableChanged makes sure a pass reports (or stops reporting) an undecodable record
// of kind: scoped passes report those of the objects they recompute, a full pass the rest.
func (a *Agent) undecodableChanged(kind string, changed bool) {
	switch {
	case !changed, kind == "endpoint", kind == "service", kind == "pod-policy":
	case kind == "policy-rule":
		a.rec.dirty.pols = true
	default:
		a.rec.touchAll()
	}
}

// Snapshot is the agent's view for the inspect API.
type Snapshot struct {
	Host            string                     `json:"host"`
	Synced          bool                       `json:"synced"`
	LastSync        time.Time                  `json:"lastSync"`
	Global          model.GlobConfig           `json:"global"`
	Networks        []dataplane.Network        `json:"networks"`
	Endpoints       []dataplane.Endpoint       `json:"endpoints"`
	RemoteEndpoints []dataplane.RemoteEndpoint `json:"remoteEndpoints"`
	Peers           []dataplane.Peer           `json:"peers"`
	Policies        []dataplane.PolicySet      `json:"policies"`
	Services        []dataplane.Service        `json:"services"`
	Errors          map[string]string          `json:"errors"`
}

// Inspect returns what is applied to the driver right now (not what is merely desired)
// and the current errors.
func (a *Agent) Inspect() Snapshot {
	a.applyMu.Lock()
	s := Snapshot{Host: a.cfg.Host, Synced: a.synced}
	applied := a.applied.State() // sorted
	s.Networks, s.Endpoints, s.RemoteEndpoints, s.Peers, s.Policies, s.Services =
		applied.Networks, applied.Endpoints, applied.RemoteEndpoints, applied.Peers, applied.Policies, applied.Services
	a.applyMu.Unlock()
	a.mu.Lock()
	s.LastSync = a.lastSync
	s.Global = a.rec.glob
	a.mu.Unlock()
	s.Errors = a.Errors()
	return s
}

// Peers are the VXLAN peers applied to the driver right now, sorted by host.
func (a *Agent) Peers() []dataplane.Peer {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	out := make([]dataplane.Peer, 0, len(a.applied.Peers))
	for _, p := range a.applied.Peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y dataplane.Peer) int { return strings.Compare(x.Host, y.Host) })
	return out
}

// DriverStatus asks the driver what it has programmed.
func (a *Agent) DriverStatus(ctx context.Context) (dataplane.Status, error) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	return a.driver.Status(ctx)
}
