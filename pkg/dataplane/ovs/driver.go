// Package ovs is the Open vSwitch backend of dataplane.Driver: it runs (or connects to) an
// ovs-vswitchd with the userspace datapath, manages bridges and ports through OVSDB
// (libovsdb), and programs a pipeline of named OpenFlow 1.3 tables (with Nicira
// extensions: conntrack, NAT, register moves) over its own synchronous connection to the
// bridge's management socket. Every change is one atomic OpenFlow bundle; flows carry a
// cookie with a generation so a resync sweeps only stale flows, and a vswitchd restart
// (connection loss) is repaired by reinstalling everything. Flows are compiled per object
// (units.go), so a change costs its own flows only. The operator's tools have their OVS
// side here too: drift against the state (verify.go), packet traces through the tables
// (trace.go), drop events (monitor.go) and decoded tables (listing.go).
//
// This package must not know about etcd, REST or Contiv's JSON.
package ovs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/retry"
)

// Cookie layout: the top 16 bits mark our flows, the next 16 bits are the generation.
// Flows vswitchd learns (cookieLearn) and guard flows (cookieGuard) carry other top bits:
// resyncs neither count nor sweep them, they expire on their own.
const (
	cookieOwner     uint64 = 0xcb0b << 48
	cookieOwnerMask uint64 = 0xffff << 48
	cookieGenMask   uint64 = 0xffff << 32
	cookieLearn     uint64 = 0xcb0d << 48
)

func cookieFor(gen uint16) uint64 { return cookieOwner | uint64(gen)<<32 }

// Port numbers requested for the fixed ports; endpoints get numbers from 100 up.
const (
	ofportTunnel   = 1
	ofportUplink   = 2
	ofportWire     = 1
	ofportFirstEP  = 100
	tunnelPortName = "contivvxlan"
	patchInt       = "contivpatch-i" // integration bridge end of the uplink patch
	patchUL        = "contivpatch-u" // underlay bridge end
)

// Options chooses the OVS instance and bridge names.
type Options struct {
	// Dir: run a private ovsdb-server + ovs-vswitchd with every file in Dir (started if
	// not running, reused if it is). Ignored when DBSocket is set.
	Dir string
	// DBSocket connects to an existing OVSDB (e.g. "unix:/var/run/openvswitch/db.sock");
	// RunDir is then where that vswitchd keeps <bridge>.mgmt (default /var/run/openvswitch).
	DBSocket string
	RunDir   string
	// Bridge is the integration bridge (default "contivbr"), UnderlayBridge the bridge whose
	// LOCAL port carries the VTEP address (default "contivul"). At most 15 bytes each.
	Bridge         string
	UnderlayBridge string
	Logger         *slog.Logger
}

// Driver programs one host's OVS.
type Driver struct {
	host dataplane.HostConfig
	opts Options
	log  *slog.Logger
	priv *Private
	ct   ctCounters // conntrack re-judge counters (metrics.go)
	db   *ovsDB
	pl   *pipeline

	mu     sync.Mutex
	state  *dataplane.Index // the desired state the pipeline is compiled from
	ports  ports
	svcIDs map[string]uint32 // service LB key → stable id (selector register)
	vrfIDs map[string]uint32 // tenant → VRF id and conntrack zone (persisted, vrf.go)
	comp   *compiled         // the installed pipeline, per unit (units.go)
	// ctLimits are the conntrack zone limits vswitchd holds (ctlimit.go; nil: not read yet).
	ctLimits map[uint16]uint32
	gen      uint16
	conn     *ofConn
	// rejectConn is conn for the OpenFlow read loop, which sends the ICMP errors of
	// reject.go and must not take mu.
	rejectConn atomic.Pointer[ofConn]
	wire       *underlay
	// monitoring and allowEvents: a drop event stream is open (and wants allowed flows
	// too): dropping flows (and allowing rules) send their packets here (monitor.go).
	monitoring, allowEvents bool
	meter                   bool // the monitor's meter is installed (monitor.go)
	// portMeters are the endpoint ports whose meters are installed (portmeter.go).
	portMeters map[uint32]bool
	// qosMeters are the endpoints' QoS meters installed, by id (qos.go); nil: not read
	// from vswitchd yet.
	qosMeters map[uint32]qosBand

	stop chan struct{}
	done chan struct{}

	monMu   sync.Mutex
	monRaw  chan []byte // packet-ins for the open stream (nil: none)
	monLost atomic.Uint64

	limMu      sync.Mutex
	limTenants map[uint16]zoneOwner // limited zone → tenant and opener (metrics.go)

	rxBufs packetSockets // vswitchd's packet sockets already given larger buffers (rxbuf.go)
}

// New starts (or connects to) OVS, creates the bridges and ports the host needs, and
// connects to the integration bridge. Flows already installed by a previous agent stay
// until the first Sync replaces them atomically.
func New(ctx context.Context, host dataplane.HostConfig, opts Options) (*Driver, error) {
	if opts.Bridge == "" {
		opts.Bridge = "contivbr"
	}
	if opts.UnderlayBridge == "" {
		opts.UnderlayBridge = "contivul"
	}
	if len(opts.Bridge) > 15 || len(opts.UnderlayBridge) > 15 {
		return nil, fmt.Errorf("ovs: bridge names %q/%q must be at most 15 bytes", opts.Bridge, opts.UnderlayBridge)
	}
	if host.VXLANPort == 0 {
		host.VXLANPort = 4789
	}
	if host.FwdMode == "" {
		host.FwdMode = dataplane.FwdBridge
	}
	if host.CTQuota < 0 || host.CTQuota > math.MaxUint32 {
		return nil, fmt.Errorf("ovs: ctQuota %d out of range (0 = no limit)", host.CTQuota)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	pl, err := newPipeline()
	if err != nil {
		return nil, err
	}
	d := &Driver{host: host, opts: opts, pl: pl, log: opts.Logger.With("dataplane", "ovs", "host", host.Host),
		state: dataplane.NewIndex(), svcIDs: map[string]uint32{}, comp: newCompiled(nil),
		stop: make(chan struct{}), done: make(chan struct{})}
	endpoint := opts.DBSocket
	if endpoint == "" {
		if opts.Dir == "" {
			return nil, errors.New("ovs: options need Dir (private instance) or DBSocket")
		}
		d.priv = &Private{Dir: opts.Dir, NetNS: host.NetNS}
		if err := d.priv.Start(ctx); err != nil {
			return nil, err
		}
		endpoint = d.priv.DBSocket()
		d.opts.RunDir = opts.Dir
	} else if d.opts.RunDir == "" {
		d.opts.RunDir = "/var/run/openvswitch"
	}
	db, err := connectOVSDB(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	d.db = db
	if err := d.setupBridges(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if err := d.loadVRFs(); err != nil {
		db.Close()
		return nil, err
	}
	if err := d.connect(ctx); err != nil {
		db.Close()
		return nil, err
	}
	// Continue the generation of the flows already there, so the first Sync sweeps them.
	stats, err := d.conn.flowStats(ctx, cookieOwner, cookieOwnerMask)
	if err != nil {
		d.conn.Close()
		db.Close()
		return nil, err
	}
	for _, s := range stats {
		if g := uint16((s.Cookie & cookieGenMask) >> 32); g > d.gen {
			d.gen = g
		}
	}
	d.gen++
	d.growRxBufs()
	go d.watch()
	return d, nil
}

// vswitchdPid is the pid of the instance's ovs-vswitchd (0: unknown or not running). A
// stale pid file may name a reused pid: the process must be called ovs-vswitchd and run
// as the user who wrote the pid file (any user can name a process ovs-vswitchd).
func (d *Driver) vswitchdPid() int {
	pidFile := filepath.Join(d.opts.RunDir, "ovs-vswitchd.pid")
	pid := 0
	if d.priv != nil {
		pidFile, pid = d.priv.pidFile("ovs-vswitchd"), d.priv.pid("ovs-vswitchd")
	} else if b, err := os.ReadFile(pidFile); err == nil {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if pid <= 0 {
		return 0
	}
	if comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err != nil || strings.TrimSpace(string(comm)) != "ovs-vswitchd" {
		return 0
	}
	st, err := os.Stat(pidFile)
	if err != nil {
		return 0
	}
	owner, ok := st.Sys().(*syscall.Stat_t)
	if uid, err := processUID(pid); err != nil || !ok || uid != owner.Uid {
		return 0
	}
	return pid
}

// processUID is the effective uid of process pid (/proc/<pid>/status; the owner of
// /proc/<pid> is root for any process that made itself non-dumpable).
func processUID(pid int) (uint32, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("process uid: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "Uid:" {
			uid, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				return 0, fmt.Errorf("process uid of %d: %w", pid, err)
			}
			return uint32(uid), nil
		}
	}
	return 0, fmt.Errorf("process uid of %d: no Uid line", pid)
}

// growRxBufs gives the packet sockets vswitchd opened since the last call (one per new
// port) larger receive buffers (rxbuf.go). A failure costs throughput, not function: it
// is logged, a lasting one once.
func (d *Driver) growRxBufs() {
	n, err := d.rxBufs.grow(d.vswitchdPid(), func(pid int) bool { return d.vswitchdPid() == pid })
	if msg := fmt.Sprint(err); err != nil && d.rxBufs.logOnce(msg) {
		d.log.Warn("vswitchd packet socket receive buffers not raised: ports drop bursts", "err", err)
	} else if err == nil {
		d.rxBufs.logOnce("")
	}
	if n > 0 {
		d.log.Debug("vswitchd packet socket receive buffers raised", "sockets", n, "bytes", rxBufBytes)
	}
}

// Name implements dataplane.Driver.
func (d *Driver) Name() string { return "ovs" }

func (d *Driver) mgmtSocket() string { return filepath.Join(d.opts.RunDir, d.opts.Bridge+".mgmt") }

func (d *Driver) connect(ctx context.Context) error {
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		var c *ofConn
		if c, err = dialOF(ctx, d.mgmtSocket(), d.packetIn); err == nil {
			d.conn = c
			d.rejectConn.Store(c)
			d.setRejectMeter(ctx)
			d.setReassembly(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("ovs: connect to bridge %s: %w", d.opts.Bridge, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setupBridges creates the integration bridge, the VLAN uplink port, and (with a VTEP)
// the underlay bridge holding the wire plus the VXLAN tunnel port. Idempotent; also run
// after a vswitchd restart (its taps, and the VTEP address on them, are recreated).
func (d *Driver) setupBridges(ctx context.Context) error {
	if err := d.db.ensureBridge(ctx, d.opts.Bridge, true, nil); err != nil {
		return err
	}
	d.ports = ports{endpoints: map[string]uint32{}}
	if d.host.VTEP.IsValid() {
		if err := d.setupUnderlay(ctx); err != nil {
			return err
		}
		if err := d.db.ensurePort(ctx, d.opts.Bridge, portSpec{Name: tunnelPortName, Type: "vxlan", OfportRequest: ofportTunnel,
			Options: map[string]string{"remote_ip": "flow", "key": "flow", "local_ip": d.host.VTEP.String(),
				"dst_port": strconv.Itoa(d.host.VXLANPort)}}); err != nil {
			return err
		}
		n, err := d.db.ofport(ctx, tunnelPortName)
		if err != nil {
			return err
		}
		d.ports.tunnel = n
	}
	if d.host.VLANIf == "" {
		return nil
	}
	uplink := d.host.VLANIf
	if d.wire != nil && d.wire.wire == d.host.VLANIf {
		// The VLAN uplink is also the VXLAN wire, which sits on the underlay bridge: reach it
		// through a patch pair; the underlay bridge (standalone, NORMAL) switches tagged
		// frames between the patch and the wire.
		uplink = patchInt
		if err := d.db.ensurePort(ctx, d.opts.UnderlayBridge, portSpec{Name: patchUL, Type: "patch",
			Options: map[string]string{"peer": patchInt}}); err != nil {
			return err
		}
		if err := d.db.ensurePort(ctx, d.opts.Bridge, portSpec{Name: patchInt, Type: "patch", OfportRequest: ofportUplink,
			Options: map[string]string{"peer": patchUL}}); err != nil {
			return err
		}
	} else {
		if err := txOff(ctx, d.host.NetNS, uplink); err != nil {
			return fmt.Errorf("ovs: vlan uplink: %w", err)
		}
		if err := linkUp(d.host.NetNS, uplink); err != nil {
			return fmt.Errorf("ovs: vlan uplink: %w", err)
		}
		if err := d.db.ensurePort(ctx, d.opts.Bridge, portSpec{Name: uplink, OfportRequest: ofportUplink}); err != nil {
			return err
		}
	}
	n, err := d.db.ofport(ctx, uplink)
	if err != nil {
		return err
	}
	d.ports.uplink = n
	return nil
}

func (d *Driver) setupUnderlay(ctx context.Context) error {
	ul, onBridge, err := findUnderlay(d.host.NetNS, d.host.VTEP, d.opts.UnderlayBridge)
	if err != nil {
		return fmt.Errorf("ovs: underlay: %w", err)
	}
	br := d.db.bridge(d.opts.UnderlayBridge)
	switch {
	case ul == nil && br != nil && br.ExternalIDs["contivbpf-wire"] != "":
		// vswitchd restarted: its tap (and the address on it) is new.
		pfx, err := netip.ParsePrefix(br.ExternalIDs["contivbpf-addr"])
		if err != nil {
			return fmt.Errorf("ovs: underlay: bad recorded address: %w", err)
		}
		d.wire = &underlay{wire: br.ExternalIDs["contivbpf-wire"]}
		d.wire.addr.IPNet = prefixIPNet(pfx)
	case ul == nil:
		return fmt.Errorf("ovs: VTEP %v is not an address of any interface in the host namespace", d.host.VTEP)
	case onBridge:
		if br == nil || br.ExternalIDs["contivbpf-wire"] == "" {
			return fmt.Errorf("ovs: VTEP %v is on %s but the bridge has no wire recorded", d.host.VTEP, d.opts.UnderlayBridge)
		}
		ul.wire = br.ExternalIDs["contivbpf-wire"]
		d.wire = ul
	default:
		d.wire = ul
	}
	ones, _ := d.wire.addr.IPNet.Mask.Size()
	pfx := netip.PrefixFrom(d.host.VTEP, ones)
	if err := d.db.ensureBridge(ctx, d.opts.UnderlayBridge, false,
		map[string]string{"contivbpf-wire": d.wire.wire, "contivbpf-addr": pfx.String()}); err != nil {
		return err
	}
	if err := txOff(ctx, d.host.NetNS, d.wire.wire); err != nil {
		return fmt.Errorf("ovs: underlay: %w", err)
	}
	if err := wireARPQuiet(ctx, d.host.NetNS, d.wire.wire); err != nil {
		return fmt.Errorf("ovs: underlay: %w", err)
	}
	if err := d.db.ensurePort(ctx, d.opts.UnderlayBridge, portSpec{Name: d.wire.wire, OfportRequest: ofportWire}); err != nil {
		return err
	}
	if _, err := d.db.ofport(ctx, d.wire.wire); err != nil {
		return err
	}
	from := d.wire.wire
	if onBridge {
		from = ""
	}
	if err := moveAddr(ctx, d.host.NetNS, d.wire.addr, from, d.opts.UnderlayBridge); err != nil {
		return err
	}
	return txOff(ctx, d.host.NetNS, d.opts.UnderlayBridge)
}

// watch reconnects after a lost OpenFlow connection (vswitchd restart) and reinstalls
// bridges, ports, groups and flows. Every rxBufScan it raises the buffers of packet
// sockets vswitchd opened on its own (rxbuf.go).
func (d *Driver) watch() {
	defer close(d.done)
	scan := time.NewTicker(rxBufScan)
	defer scan.Stop()
	for {
		d.mu.Lock()
		c := d.conn
		d.mu.Unlock()
		select {
		case <-d.stop:
			return
		case <-scan.C:
			d.growRxBufs()
			continue
		case <-c.Done():
		}
		d.log.Warn("openflow connection lost; reinstalling when vswitchd is back")
		wait := retry.New(50*time.Millisecond, 2*time.Second)
		for {
			select {
			case <-d.stop:
				return
			case <-time.After(wait.Next()):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := d.repair(ctx)
			cancel()
			if err == nil {
				d.log.Info("flows reinstalled after reconnect")
				break
			}
			d.log.Debug("repair failed, retrying", "err", err)
		}
	}
}

func (d *Driver) repair(ctx context.Context) error {
	c, err := dialOF(ctx, d.mgmtSocket(), d.packetIn)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.conn
	d.conn = c
	d.rejectConn.Store(c)
	_ = old.Close()
	if err := d.setupBridges(ctx); err != nil {
		return err
	}
	for id, ep := range d.state.Endpoints {
		n, err := d.db.ofport(ctx, ep.HostIfName)
		if err != nil {
			return err
		}
		d.ports.endpoints[id] = n
	}
	if d.monitoring && d.meter {
		d.setMeter(ctx, true) // a new vswitchd has none; flows refer to it
	}
	d.setRejectMeter(ctx)
	d.setReassembly(ctx)
	d.portMeters, d.qosMeters = nil, nil // a new vswitchd has none
	if err := d.resync(ctx, d.state, false, idTables{svc: d.svcIDs, vrf: d.vrfIDs}); err != nil {
		return err
	}
	d.growRxBufs()
	d.ctLimits = nil // a new vswitchd has none either
	// Not a reason to reconnect (a vswitchd that cannot limit conntrack would loop): the
	// next Sync reports it.
	if err := d.applyCTLimits(ctx); err != nil {
		d.log.Error("conntrack zone limits not applied after reconnecting", "err", err)
	}
	return nil
}

// resync installs the full pipeline for st atomically: every flow is (re)added with the
// current generation's cookie, and flows of other generations (and any group, which
// older versions used for service LB) are deleted in the same bundle. bumpGen starts a
// new generation first.
func (d *Driver) resync(ctx context.Context, st *dataplane.Index, bumpGen bool, ids idTables) error {
	gen := d.gen
	if bumpGen {
		gen++
		if gen == 0 {
			gen = 1
		}
	}
	comp, err := d.pl.compile(st, d.host, d.ports, ids)
	if err != nil {
		return err
	}
	if err := d.saveVRFs(ctx, ids.vrf); err != nil {
		return err
	}
	stats, err := d.conn.flowStats(ctx, cookieOwner, cookieOwnerMask)
	if err != nil {
		return err
	}
	var msgs [][]byte
	del := of.NewGroupMod()
	del.Command = of.OFPGC_DELETE
	del.GroupId = of.OFPG_ALL
	m, err := d.conn.marshal(del)
	if err != nil {
		return err
	}
	msgs = append(msgs, m)
	for _, f := range comp.list() {
		if m, err = d.conn.marshal(d.install(f, cookieFor(gen))); err != nil {
			return fmt.Errorf("encode %s: %w", f, err)
		}
		msgs = append(msgs, m)
	}
	stale := map[uint64]bool{}
	for _, s := range stats {
		if s.Cookie != cookieFor(gen) {
			stale[s.Cookie] = true
		}
	}
	for ck := range stale {
		fm := of.NewFlowMod()
		fm.Command = of.FC_DELETE
		fm.TableId = of.OFPTT_ALL
		fm.Cookie, fm.CookieMask = ck, ^uint64(0)
		if m, err = d.conn.marshal(fm); err != nil {
			return err
		}
		msgs = append(msgs, m)
	}
	if err := d.ensurePortMeters(ctx, true); err != nil {
		return err
	}
	if err := d.ensureQoSMeters(ctx, st, true); err != nil {
		return err
	}
	if err := d.conn.bundle(ctx, msgs); err != nil {
		return fmt.Errorf("ovs: install pipeline: %w", err)
	}
	d.gen = gen
	d.comp = comp
	d.dropStalePortMeters(ctx)
	if err := d.dropQoSMeters(ctx, st); err != nil {
		d.log.Warn("stale qos meters not removed", "err", err)
	}
	d.purge(ctx)
	return nil
}

// program installs the difference between the installed pipeline and the one compiled
// from st, in one bundle: all of it compiled again when dirty is nil, otherwise only
// the units in dirty (units.go). narrowing (what policy judges by changed) empties the
// datapath cache whatever the flow changes were.
func (d *Driver) program(ctx context.Context, st *dataplane.Index, ids idTables, dirty []string, narrowing bool) error {
	var changes []flowChange
	undo := func() {}
	comp := d.comp
	if dirty == nil {
		var err error
		if comp, err = d.pl.compile(st, d.host, d.ports, ids); err != nil {
			return err
		}
		if err := d.saveVRFs(ctx, ids.vrf); err != nil {
			return err
		}
		for k, f := range d.comp.flows {
			if _, ok := comp.flows[k]; !ok {
				changes = append(changes, flowChange{old: f})
			}
		}
		for k, f := range comp.flows {
			changes = append(changes, flowChange{old: d.comp.flows[k], new: f})
		}
	} else {
		var err error
		if changes, undo, err = d.pl.recompile(d.comp, st, d.host, d.ports, ids.svc, dirty); err != nil {
			return err
		}
	}
	var msgs [][]byte
	cookie := cookieFor(d.gen)
	purge := dirty == nil || purgeNeeded(changes, narrowing)
	for _, ch := range changes {
		var fm *of.FlowMod
		switch {
		case ch.new == nil:
			fm = ch.old.flowMod(of.FC_DELETE_STRICT, 0)
		case ch.old != nil && ch.old.actionsText() == ch.new.actionsText():
			continue
		default:
			fm = d.install(ch.new, cookie) // replaces a flow with the same match
		}
		m, err := d.conn.marshal(fm)
		if err != nil {
			undo()
			return fmt.Errorf("encode %s: %w", ch.new, err)
		}
		msgs = append(msgs, m)
	}
	if err := d.ensurePortMeters(ctx, false); err != nil {
		undo()
		return err
	}
	if err := d.ensureQoSMeters(ctx, st, false); err != nil {
		undo()
		return err
	}
	if err := d.conn.bundle(ctx, msgs); err != nil {
		undo()
		return fmt.Errorf("ovs: program flows: %w", err)
	}
	d.comp = comp
	if err := d.dropQoSMeters(ctx, st); err != nil {
		d.log.Warn("qos meters not removed", "err", err)
	}
	if purge {
		d.purge(ctx)
	}
	return nil
}

// purgeNeeded says whether changes (and narrowing: what policy judges by changed) must
// empty the datapath cache; changes that leave a flow's actions as they were count for
// nothing.
func purgeNeeded(changes []flowChange, narrowing bool) bool {
	return narrowing || slices.ContainsFunc(changes, func(ch flowChange) bool {
		if ch.old != nil && ch.new != nil && ch.old.actionsText() == ch.new.actionsText() {
			return false
		}
		return needsPurge(ch)
	})
}

// needsPurge says whether a flow change must reach packets of flows the datapath has
// cached: a removed flow, a new or changed policy or NetworkPolicy flow (they narrow), a
// changed endpoint flow (e.g. its group), a changed service flow other than the balancing
// one (a backend replaced at an index). A flow added for a new endpoint or service only
// lets through what was dropped before, and a balancing flow changed for an added backend
// only moves new connections: the cache catches up by itself (OVS revalidates after every
// flow table change). Changes of group membership (an endpoint's group set or changed,
// which classification flows alone may not show as narrowing) are caught by the caller
// (program's narrowing).
func needsPurge(ch flowChange) bool {
	kind, _ := splitUnit(ch.unit)
	switch {
	case ch.new == nil:
		return true
	case kind == "pol" || kind == unitNetpol:
		return true
	case ch.old == nil:
		return false
	case kind == "svc":
		return ch.new.table != tServiceLB
	}
	return true
}

// purge empties vswitchd's datapath flow cache, so a change (e.g. a deleted deny rule)
// applies to the very next packet instead of after the next revalidation round (up to
// ~0.5 s; revalidator/wait costs that long too). Only possible when the unixctl socket
// is known (private instance).
func (d *Driver) purge(ctx context.Context) {
	if d.priv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := d.appctl(ctx, "revalidator/purge"); err != nil {
		d.log.Debug("revalidator/purge", "err", err)
	}
}

// apply converges from old to st: plumbs new endpoints, programs flows, then unplumbs
// removed endpoints. full installs a new generation of every flow (Sync); otherwise
// dirty names the units the change touches (nil: all of them, e.g. a network or peer
// change) and only their objects are plumbed, compiled and checked; old then needs to
// hold only those objects (and the networks). applied says whether st is now the
// driver's state: when it is not, what was created for st is removed and nothing
// changed; when it is, err reports what went wrong after the flows were installed.
func (d *Driver) apply(ctx context.Context, old, st *dataplane.Index, full bool, dirty []string) (applied bool, err error) {
	if full {
		dirty = nil
	}
	epIDs := slices.Sorted(maps.Keys(st.Endpoints)) // endpoints to plumb
	gone := []string{}                              // endpoints to unplumb
	var svcIDs []string                             // services whose translations may go (nil: all)
	if dirty != nil {
		epIDs, svcIDs = nil, []string{}
		for _, u := range dirty {
			switch kind, id := splitUnit(u); kind {
			case "ep":
				if _, ok := st.Endpoints[id]; ok {
					epIDs = append(epIDs, id)
				} else if _, ok := old.Endpoints[id]; ok {
					gone = append(gone, id)
				}
			case "svc":
				svcIDs = append(svcIDs, id)
			}
		}
	} else {
		for _, n := range st.Networks {
			if err := n.Validate(); err != nil {
				return false, err
			}
		}
		for _, id := range slices.Sorted(maps.Keys(st.RemoteEndpoints)) {
			if err := checkRemote(st, st.RemoteEndpoints[id]); err != nil {
				return false, err
			}
		}
		for id := range old.Endpoints {
			if _, ok := st.Endpoints[id]; !ok {
				gone = append(gone, id)
			}
		}
	}
	natsBefore := serviceNATs(old, d.vrfIDs, svcIDs)
	var created []dataplane.Endpoint
	newPorts := maps.Clone(d.ports.endpoints)
	rollback := func() {
		for _, ep := range created {
			_ = d.db.deletePort(context.Background(), d.opts.Bridge, ep.HostIfName)
			_ = unplumbEndpoint(d.host.NetNS, ep)
		}
	}
	for _, id := range epIDs {
		ep := st.Endpoints[id]
		if err := ep.Validate(); err != nil {
			rollback()
			return false, err
		}
		n, ok := st.Networks[ep.NetworkID]
		if !ok {
			rollback()
			return false, fmt.Errorf("endpoint %s: network %s is not known", ep.ID, ep.NetworkID)
		}
		prev, had := old.Endpoints[id]
		if had && reflect.DeepEqual(prev, ep) && reflect.DeepEqual(old.Networks[ep.NetworkID], n) && newPorts[id] != 0 {
			continue
		}
		if had && prev.HostIfName != ep.HostIfName {
			rollback()
			return false, fmt.Errorf("endpoint %s: hostIfName changed from %s to %s (delete it first)", id, prev.HostIfName, ep.HostIfName)
		}
		if err := plumbEndpoint(ctx, d.host.NetNS, ep, n); err != nil {
			rollback()
			return false, err
		}
		if !had {
			created = append(created, ep)
		}
		spec := portSpec{Name: ep.HostIfName, ExternalIDs: map[string]string{"endpoint-id": ep.ID}}
		if p := d.db.iface(ep.HostIfName); p == nil {
			n, err := d.db.freeOfport(ctx, ofportFirstEP)
			if err != nil {
				rollback()
				return false, fmt.Errorf("endpoint %s: %w", id, err)
			}
			spec.OfportRequest = n
		}
		if err := d.db.ensurePort(ctx, d.opts.Bridge, spec); err != nil {
			rollback()
			return false, err
		}
		port, err := d.db.ofport(ctx, ep.HostIfName)
		if err != nil {
			rollback()
			return false, err
		}
		newPorts[id] = port
	}
	if len(created) > 0 {
		d.growRxBufs()
	}
	oldPorts := d.ports.endpoints
	d.ports.endpoints = newPorts
	// A full compile allocates ids in copies; a scoped one allocates service ids in
	// place (VRFs come only with networks, i.e. full compiles) and gives back the ids of
	// its services' ports that did not make it into the pipeline.
	ids := idTables{svc: d.svcIDs, vrf: d.vrfIDs}
	if dirty == nil {
		ids = idTables{svc: maps.Clone(d.svcIDs), vrf: maps.Clone(d.vrfIDs)}
	}
	// Whether a scoped change changes what policy judges by (it never changes VRFs). A
	// full compile empties the datapath cache anyway; its re-judging is decided below.
	judged := dirty != nil && rejudgeNeeded(old, st, d.vrfIDs, d.vrfIDs, dirty)
	if full {
		err = d.resync(ctx, st, true, ids)
	} else {
		err = d.program(ctx, st, ids, dirty, judged)
	}
	if dirty != nil {
		releaseServiceIDs(d.svcIDs, d.comp, svcIDs, old, st)
	}
	if err != nil {
		d.ports.endpoints = oldPorts
		rollback()
		return false, err
	}
	if dirty == nil {
		// Drop ids of service ports that are gone.
		inUse := d.comp.serviceKeys()
		for k := range ids.svc {
			if !inUse[k] {
				delete(ids.svc, k)
			}
		}
	}
	oldVRF := d.vrfIDs
	d.svcIDs, d.vrfIDs = ids.svc, ids.vrf
	errs := []error{d.flushRemovedNATs(ctx, natsBefore, serviceNATs(st, d.vrfIDs, svcIDs))}
	if dirty == nil {
		errs = append(errs, d.releaseVRFs(ctx, st))
	}
	if judged || (dirty == nil && rejudgeNeeded(old, st, oldVRF, d.vrfIDs, nil)) {
		// Established connections are judged again, as the eBPF datapath's epoch does.
		errs = append(errs, d.rejudge(ctx, st, d.vrfIDs))
	}
	for _, id := range gone {
		ep := old.Endpoints[id]
		port := d.ports.endpoints[id]
		delete(d.ports.endpoints, id)
		errs = append(errs, d.db.deletePort(ctx, d.opts.Bridge, ep.HostIfName), unplumbEndpoint(d.host.NetNS, ep),
			d.dropPortMeters(ctx, port))
	}
	d.state = st
	errs = append(errs, d.applyCTLimits(ctx)) // endpoints and tenants move the zones' limits
	return true, errors.Join(errs...)
}

// releaseServiceIDs frees in svcIDs the LB ids of the ports services ids had in old or
// have in st that the installed pipeline c does not use.
func releaseServiceIDs(svcIDs map[string]uint32, c *compiled, ids []string, old, st *dataplane.Index) {
	for _, id := range ids {
		inUse := map[string]bool{}
		for _, k := range c.svcKeys[unitSvc(id)] {
			inUse[k] = true
		}
		for _, s := range []*dataplane.Index{old, st} {
			for _, sp := range s.Services[id].Ports {
				if k := serviceKey(id, sp); !inUse[k] {
					delete(svcIDs, k)
				}
			}
		}
	}
}

// rejudgeNeeded says whether established connections must be judged again after the
// state went from old to st: when what policy judges by (group rules, endpoint groups,
// NetworkPolicy layers) changed. dirty names the units that changed (nil: any).
func rejudgeNeeded(old, st *dataplane.Index, oldVRF, vrf map[string]uint32, dirty []string) bool {
	if dirty == nil {
		return verdictChanged(inputsOf(old, oldVRF), inputsOf(st, vrf))
	}
	type member struct {
		tenant string
		ip     netip.Addr
		epg    uint16
	}
	group := func(netID string, ip netip.Addr, epg uint16) member {
		if epg == 0 {
			return member{} // not in any group: policy sees no member
		}
		return member{tenantOf(netID), ip, epg}
	}
	for _, u := range dirty {
		kind, id := splitUnit(u)
		switch kind {
		case "pol":
			epg, _ := strconv.ParseUint(id, 10, 16)
			a, had := old.Policies[uint16(epg)]
			b, has := st.Policies[uint16(epg)]
			if had != has || !reflect.DeepEqual(a, b) {
				return true
			}
		case unitNetpol:
			return true
		case "ep":
			a, b := old.Endpoints[id], st.Endpoints[id]
			if group(a.NetworkID, a.IP, a.EPGID) != group(b.NetworkID, b.IP, b.EPGID) {
				return true
			}
		case "rem":
			a, b := old.RemoteEndpoints[id], st.RemoteEndpoints[id]
			if group(a.NetworkID, a.IP, a.EPGID) != group(b.NetworkID, b.IP, b.EPGID) {
				return true
			}
		}
	}
	return false
}

// update applies a change every unit may depend on (networks, peers): mutate edits a
// copy of the state, which is compiled in full and installed as a difference.
func (d *Driver) update(ctx context.Context, mutate func(st *dataplane.Index) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.state.Clone()
	if err := mutate(st); err != nil {
		return err
	}
	_, err := d.apply(ctx, d.state, st, false, nil)
	return err
}

// changeOne sets (v non-nil) or deletes object key of the state's map pick, touching only
// the units dirty names. The state is changed in place (no copy of every object per
// change) and put back when the change is not applied. check, if set, vets the change
// against the state first.
func changeOne[K comparable, V any](ctx context.Context, d *Driver, pick func(*dataplane.Index) map[K]V, key K, v *V,
	check func(st *dataplane.Index) error, dirty func(old, st *dataplane.Index) []string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if check != nil {
		if err := check(d.state); err != nil {
			return err
		}
	}
	m := pick(d.state)
	prev, had := m[key]
	// old: the object as it was; the networks (which a scoped change never changes) shared.
	old := dataplane.NewIndex()
	old.Networks = d.state.Networks
	if had {
		pick(old)[key] = prev
	}
	if v != nil {
		m[key] = *v
	} else {
		delete(m, key)
	}
	applied, err := d.apply(ctx, old, d.state, false, dirty(old, d.state))
	if !applied {
		if had {
			m[key] = prev
		} else {
			delete(m, key)
		}
	}
	return err
}

// Maps of the desired state, for changeOne.
func endpointsOf(st *dataplane.Index) map[string]dataplane.Endpoint     { return st.Endpoints }
func remotesOf(st *dataplane.Index) map[string]dataplane.RemoteEndpoint { return st.RemoteEndpoints }
func policiesOf(st *dataplane.Index) map[uint16]dataplane.PolicySet     { return st.Policies }
func podPoliciesOf(st *dataplane.Index) map[string]dataplane.PodPolicy  { return st.PodPolicies }
func servicesOf(st *dataplane.Index) map[string]dataplane.Service       { return st.Services }

// units is changeOne's scope for a change that touches just the given units.
func units(names ...string) func(old, st *dataplane.Index) []string {
	return func(*dataplane.Index, *dataplane.Index) []string { return names }
}

// endpointUnits is the scope of a change of local endpoint id: its unit and the
// services that balance to its address before or after (their hairpin flows depend on
// which backends are local).
func endpointUnits(id string) func(old, st *dataplane.Index) []string {
	return func(old, st *dataplane.Index) []string {
		out := []string{unitEp(id)}
		addrs := map[string]map[netip.Addr]bool{}
		for _, s := range []*dataplane.Index{old, st} {
			if ep, ok := s.Endpoints[id]; ok {
				t := tenantOf(ep.NetworkID)
				if addrs[t] == nil {
					addrs[t] = map[netip.Addr]bool{}
				}
				addrs[t][ep.IP] = true
			}
		}
		for sid, s := range st.Services {
			tenant, err := dataplane.ServiceTenant(sid)
			if err != nil || addrs[tenant] == nil {
				continue
			}
			if slices.ContainsFunc(s.Backends, func(b netip.Addr) bool { return addrs[tenant][b] }) {
				out = append(out, unitSvc(sid))
			}
		}
		return out
	}
}

// Sync implements dataplane.Driver: full atomic resync with a new cookie generation.
// Endpoints whose QoS meters cannot be made are left out and reported; the rest is
// installed.
func (d *Driver) Sync(ctx context.Context, s dataplane.State) error {
	st, bad := desiredFrom(s)
	d.mu.Lock()
	defer d.mu.Unlock()
	// Endpoints whose QoS meters cannot be made fail alone: the rest is installed without
	// them (left out, never unlimited), as the agent's one-by-one fallback would. Bands no
	// meter can hold are found first; a meter vswitchd refuses makes the install start
	// again without its endpoint (each round leaves out at least one more).
	refused := qosRefused{}
	for id, ep := range st.Endpoints {
		if _, err := qosMeters(0, ep.QoS); err != nil {
			refused[id] = fmt.Errorf("endpoint %s: %w", id, err)
			delete(st.Endpoints, id)
		}
	}
	var err error
	for {
		_, err = d.apply(ctx, d.state, st, true, nil)
		var more qosRefused
		if !errors.As(err, &more) {
			break
		}
		n := len(refused)
		for id, e := range more {
			if _, ok := st.Endpoints[id]; ok {
				refused[id] = e
				delete(st.Endpoints, id)
			}
		}
		if len(refused) == n {
			break
		}
	}
	if len(refused) > 0 {
		err = errors.Join(refused, err)
	}
	return errors.Join(err, bad)
}

// desiredFrom turns a State into the desired state. A bad remote endpoint is left out
// and reported, an invalid pod policy kept (installed failed closed) and reported.
func desiredFrom(s dataplane.State) (*dataplane.Index, error) {
	remotes := s.RemoteEndpoints // indexed below, each once it passed checkRemote
	s.RemoteEndpoints = nil
	st := dataplane.IndexOf(s)
	var bad []error
	for _, r := range remotes {
		if err := checkRemote(st, r); err != nil {
			bad = append(bad, err)
			continue
		}
		st.RemoteEndpoints[r.ID] = r
	}
	for _, pp := range s.PodPolicies {
		if err := pp.Validate(); err != nil {
			bad = append(bad, fmt.Errorf("pod policy %s: failed closed (all traffic of the pod denied): %w", pp.ID, err))
		}
	}
	return st, errors.Join(bad...)
}

// checkRemote validates a remote endpoint against its network in st.
func checkRemote(st *dataplane.Index, r dataplane.RemoteEndpoint) error {
	n, ok := st.Networks[r.NetworkID]
	if !ok {
		if r.ID == "" {
			return r.Validate("")
		}
		return fmt.Errorf("remote endpoint %s: network %q is not known", r.ID, r.NetworkID)
	}
	return r.Validate(n.Encap)
}

// UpsertNetwork implements dataplane.Driver.
func (d *Driver) UpsertNetwork(ctx context.Context, n dataplane.Network) error {
	if err := n.Validate(); err != nil {
		return err
	}
	return d.update(ctx, func(st *dataplane.Index) error { st.Networks[n.ID] = n; return nil })
}

// DeleteNetwork implements dataplane.Driver.
func (d *Driver) DeleteNetwork(ctx context.Context, id string) error {
	return d.update(ctx, func(st *dataplane.Index) error {
		for _, e := range st.Endpoints {
			if e.NetworkID == id {
				return fmt.Errorf("network %s: endpoint %s still uses it", id, e.ID)
			}
		}
		for _, e := range st.RemoteEndpoints {
			if e.NetworkID == id {
				return fmt.Errorf("network %s: remote endpoint %s still uses it", id, e.ID)
			}
		}
		delete(st.Networks, id)
		return nil
	})
}

// UpsertEndpoint implements dataplane.Driver.
func (d *Driver) UpsertEndpoint(ctx context.Context, ep dataplane.Endpoint) error {
	if err := ep.Validate(); err != nil {
		return err
	}
	return changeOne(ctx, d, endpointsOf, ep.ID, &ep, nil, endpointUnits(ep.ID))
}

// DeleteEndpoint implements dataplane.Driver.
func (d *Driver) DeleteEndpoint(ctx context.Context, id string) error {
	return changeOne(ctx, d, endpointsOf, id, nil, nil, endpointUnits(id))
}

// UpsertRemoteEndpoint implements dataplane.Driver.
func (d *Driver) UpsertRemoteEndpoint(ctx context.Context, ep dataplane.RemoteEndpoint) error {
	return changeOne(ctx, d, remotesOf, ep.ID, &ep, func(st *dataplane.Index) error { return checkRemote(st, ep) }, units(unitRem(ep.ID)))
}

// DeleteRemoteEndpoint implements dataplane.Driver.
func (d *Driver) DeleteRemoteEndpoint(ctx context.Context, id string) error {
	return changeOne(ctx, d, remotesOf, id, nil, nil, units(unitRem(id)))
}

// UpsertPeer implements dataplane.Driver.
func (d *Driver) UpsertPeer(ctx context.Context, p dataplane.Peer) error {
	if p.Host == "" || !p.VTEP.Is4() {
		return fmt.Errorf("peer %q: host must be set and vtep %v IPv4", p.Host, p.VTEP)
	}
	return d.update(ctx, func(st *dataplane.Index) error { st.Peers[p.Host] = p; return nil })
}

// DeletePeer implements dataplane.Driver.
func (d *Driver) DeletePeer(ctx context.Context, host string) error {
	return d.update(ctx, func(st *dataplane.Index) error { delete(st.Peers, host); return nil })
}

// UpsertPolicy implements dataplane.Driver.
func (d *Driver) UpsertPolicy(ctx context.Context, p dataplane.PolicySet) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return changeOne(ctx, d, policiesOf, p.EPGID, &p, nil, units(unitPol(p.EPGID)))
}

// DeletePolicy implements dataplane.Driver.
func (d *Driver) DeletePolicy(ctx context.Context, epgID uint16) error {
	return changeOne(ctx, d, policiesOf, epgID, nil, nil, units(unitPol(epgID)))
}

// UpsertPodPolicy implements dataplane.Driver. An invalid policy is installed failed
// closed (the pod isolated both ways with no rules) and reported.
func (d *Driver) UpsertPodPolicy(ctx context.Context, p dataplane.PodPolicy) error {
	if p.ID == "" {
		return errors.New("pod policy: id is empty")
	}
	err := changeOne(ctx, d, podPoliciesOf, p.ID, &p, nil, units(unitNetpol))
	if verr := p.Validate(); verr != nil && err == nil {
		return fmt.Errorf("pod policy %s: failed closed (all traffic of the pod denied): %w", p.ID, verr)
	}
	return err
}

// DeletePodPolicy implements dataplane.Driver.
func (d *Driver) DeletePodPolicy(ctx context.Context, id string) error {
	return changeOne(ctx, d, podPoliciesOf, id, nil, nil, units(unitNetpol))
}

// UpsertService implements dataplane.Driver.
func (d *Driver) UpsertService(ctx context.Context, s dataplane.Service) error {
	if err := s.Validate(); err != nil {
		return err
	}
	return changeOne(ctx, d, servicesOf, s.ID, &s, nil, serviceUnits(s.ID))
}

// DeleteService implements dataplane.Driver.
func (d *Driver) DeleteService(ctx context.Context, id string) error {
	return changeOne(ctx, d, servicesOf, id, nil, nil, serviceUnits(id))
}

// serviceUnits is the scope of a change of service id: its unit and those of the other
// services of its tenant on its VIP, before or after (their later fragments' flow depends
// on whether the VIP's UDP ports are one service's: sharesUDPVIP).
func serviceUnits(id string) func(old, st *dataplane.Index) []string {
	return func(old, st *dataplane.Index) []string {
		out := []string{unitSvc(id)}
		tenant, err := dataplane.ServiceTenant(id)
		if err != nil {
			return out
		}
		vips := map[netip.Addr]bool{}
		for _, x := range []*dataplane.Index{old, st} {
			if x == nil {
				continue
			}
			if s, ok := x.Services[id]; ok {
				vips[s.VIP] = true
			}
		}
		seen := map[string]bool{id: true}
		for _, x := range []*dataplane.Index{old, st} {
			if x == nil {
				continue
			}
			for sid, s := range x.Services {
				if t, err := dataplane.ServiceTenant(sid); err == nil && t == tenant && vips[s.VIP] && !seen[sid] {
					seen[sid] = true
					out = append(out, unitSvc(sid))
				}
			}
		}
		return out
	}
}

// Status implements dataplane.Driver: bridges with their ports, and per-table flow and
// packet counts of this driver's flows.
func (d *Driver) Status(ctx context.Context) (dataplane.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := dataplane.Status{Dataplane: "ovs", Tables: map[string]any{}, Counters: map[string]any{}}
	bridges := map[string]any{}
	for _, br := range []string{d.opts.Bridge, d.opts.UnderlayBridge} {
		ports := d.db.bridgePorts(br)
		if ports == nil {
			continue
		}
		bridges[br] = ports
		for _, name := range slices.Sorted(maps.Keys(ports)) {
			n := ports[name]
			id := uint32(0)
			if n > 0 {
				id = uint32(n)
			}
			st.Attachments = append(st.Attachments, dataplane.Attachment{Interface: name, Hook: "ovs-port", Program: br, ID: id})
		}
	}
	st.Tables["bridges"] = bridges
	stats, err := d.conn.flowStats(ctx, cookieOwner, cookieOwnerMask)
	if err != nil {
		return st, err
	}
	flows := map[string]int{}
	packets := map[string]uint64{}
	for _, s := range stats {
		name := tableID(s.Table).String()
		flows[name]++
		packets[name] += s.Packets
	}
	st.Tables["flows"] = flows
	st.Counters["packets"] = packets
	st.Counters["generation"] = d.gen
	st.Counters["service_ports"] = len(d.comp.serviceKeys())
	var text []string
	for _, f := range d.comp.list() {
		text = append(text, f.String())
	}
	st.Tables["pipeline"] = text
	return st, nil
}

// Close stops watching the connection and releases handles; OVS keeps forwarding.
func (d *Driver) Close() error {
	select {
	case <-d.stop:
		return nil
	default:
	}
	close(d.stop)
	<-d.done
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		_ = d.conn.Close()
	}
	d.db.Close()
	return nil
}

// Teardown removes flows, ports, bridges and endpoint veths, gives the VTEP address back
// to the wire, and stops the private OVS if this driver runs one.
func (d *Driver) Teardown(ctx context.Context) error {
	d.mu.Lock()
	var errs []error
	if d.conn != nil {
		fm := of.NewFlowMod()
		fm.Command = of.FC_DELETE
		fm.TableId = of.OFPTT_ALL
		fm.Cookie, fm.CookieMask = cookieOwner, cookieOwnerMask
		if m, err := d.conn.marshal(fm); err == nil {
			if err := d.conn.bundle(ctx, [][]byte{m}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, ep := range d.state.Endpoints {
		errs = append(errs, unplumbEndpoint(d.host.NetNS, ep))
	}
	errs = append(errs, d.removeCTLimits(ctx))
	errs = append(errs, d.db.deleteBridge(ctx, d.opts.Bridge))
	if d.wire != nil {
		errs = append(errs, d.db.deleteBridge(ctx, d.opts.UnderlayBridge))
	}
	d.state, d.comp = dataplane.NewIndex(), newCompiled(nil)
	d.mu.Unlock()
	_ = d.Close()
	if d.priv != nil {
		errs = append(errs, d.priv.Stop(ctx))
	}
	if d.wire != nil && d.wire.wire != "" {
		errs = append(errs, restoreAddr(d.host.NetNS, d.wire))
	}
	return errors.Join(errs...)
}

// Counters are the driver's numeric counters for the agent's /metrics: packets matched
// per pipeline table (one flow-stats request), the generation, the service ports, and
// drop_ct_quota: new connections dropped because conntrack refused their commit (a
// tenant zone at its limit, or a full table; ctlimit.go).
func (d *Driver) Counters(ctx context.Context) (map[string]float64, error) {
	d.mu.Lock()
	gen, svcPorts := d.gen, len(d.comp.serviceKeys())
	d.mu.Unlock()
	stats, err := d.conn.flowStats(ctx, cookieOwner, cookieOwnerMask)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{"generation": float64(gen), "service_ports": float64(svcPorts), "monitor_events_lost": float64(d.monLost.Load()),
		"drop_ct_quota": 0}
	// 1 while vswitchd refuses its packet sockets to the agent (rxbuf.go): its ports keep
	// the default receive buffers and drop TCP bursts.
	out["rxbuf_refused"] = 0
	if d.rxBufs.refused() {
		out["rxbuf_refused"] = 1
	}
	for _, s := range stats {
		out["packets_"+tableID(s.Table).String()] += float64(s.Packets)
		if tableID(s.Table) == tCTCheck && s.Priority == 0 {
			out["drop_ct_quota"] += float64(s.Packets) // commits conntrack refused (ctlimit.go)
		}
	}
	meters, err := d.conn.meterStats(ctx)
	if err != nil {
		return nil, err
	}
	out["drop_frag_limit"] = 0                               // fragments past their port's meter (portmeter.go), as the eBPF reason
	out["drop_rate_egress"], out["drop_rate_ingress"] = 0, 0 // past an endpoint's QoS meter (qos.go)
	for _, m := range meters {
		if isFragMeter(m.ID) {
			out["drop_frag_limit"] += float64(m.Dropped)
		}
		if egress, ok := isQoSMeter(m.ID); ok && egress {
			out["drop_rate_egress"] += float64(m.Dropped)
		} else if ok {
			out["drop_rate_ingress"] += float64(m.Dropped)
		}
	}
	return out, nil
}
