package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Conntrack garbage collection (docs/conntrack.md "Garbage collection and flushes"). The
// datapath never deletes an expired entry by itself (it overwrites one only when the same
// flow opens again), and the table is a plain hash that refuses new flows when full, so the
// agent sweeps it: periodically, and right away when an endpoint's entries must go.
//
// Each pass also recounts the live entries of every owner (the counter slot of the local
// endpoint an entry counts against) into cb_ct_owned (flows it opened) and cb_ct_owned_in
// (flows opened to it: owner | ownerIn), which the datapath checks against the
// per-endpoint quota (docs/conntrack.md "Per-endpoint quota"). A count is exact as of the
// sweep; between sweeps the datapath only adds to it.

// DefaultCTGCInterval is how often the conntrack table is swept when nothing asks sooner.
const DefaultCTGCInterval = 10 * time.Second

// CTStats describes the conntrack table and its collector.
type CTStats struct {
	Entries  int           // entries seen by the last pass
	Capacity int           // max entries of the table
	Runs     uint64        // completed passes
	Deleted  uint64        // entries deleted by passes (expired or flushed)
	LastPass time.Duration // duration of the last pass
	Errors   uint64        // passes that failed
	// Egress NAT (nat.h): flows with a live reply mapping, and flows deleted by passes.
	NATFlows    int
	NATCapacity int
	NATDeleted  uint64
}

// ctFlush names the entries of one address in one zone.
type ctFlush struct {
	zone uint32
	ip   uint32 // network order, as in the map
}

// ctGC is the driver's conntrack collector.
type ctGC struct {
	m        *ebpf.Map
	interval time.Duration
	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}

	nat     natGC     // egress NAT tables (nil maps: none)
	owned   *ebpf.Map // cb_ct_owned, entries per owner slot (nil: not recounted)
	ownedIn *ebpf.Map // cb_ct_owned_in, entries opened to each owner slot (nil: not recounted)
	gens    *ebpf.Map // cb_ct_gens, moved on after service flows' entries are deleted (nil: not)

	mu      sync.Mutex
	pending []ctFlush
	stats   CTStats
}

func newCTGC(m *ebpf.Map, interval time.Duration) *ctGC {
	if interval <= 0 {
		interval = DefaultCTGCInterval
	}
	return &ctGC{m: m, interval: interval, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		stats: CTStats{Capacity: int(m.MaxEntries())}}
}

// run sweeps every interval, or sooner when kicked, until stopped.
func (g *ctGC) run() {
	defer close(g.done)
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		case <-g.kick:
		}
		_, _ = g.pass()
	}
}

// close stops the loop and waits for a pass in progress.
func (g *ctGC) close() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}

// flush queues the entries of ip in zone for deletion and wakes the collector.
func (g *ctGC) flush(zone uint32, ip netip.Addr) {
	g.mu.Lock()
	g.pending = append(g.pending, ctFlush{zone: zone, ip: ip4(ip)})
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// monotonicNow is the clock the datapath's cb_now (bpf_ktime_get_coarse_ns) reads.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec), nil
}

// pass deletes expired entries and those of queued flushes. It returns how many entries it
// deleted.
func (g *ctGC) pass() (int, error) {
	start := time.Now()
	g.mu.Lock()
	flushes := g.pending
	g.pending = nil
	g.mu.Unlock()
	n, seen, err := g.sweep(flushes)
	natDeleted, natLive := 0, 0
	if g.nat.flows != nil {
		now, nerr := monotonicNow()
		if nerr == nil {
			match := map[ctFlush]bool{}
			for _, f := range flushes {
				match[f] = true
			}
			natDeleted, natLive, nerr = g.nat.sweep(now, match)
		}
		err = errors.Join(err, nerr)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stats.NATDeleted += uint64(natDeleted)
	g.stats.NATFlows = natLive
	if g.nat.flows != nil {
		g.stats.NATCapacity = int(g.nat.flows.MaxEntries())
	}
	g.stats.Runs++
	g.stats.Deleted += uint64(n)
	g.stats.LastPass = time.Since(start)
	g.stats.Entries = seen - n
	if err != nil {
		g.stats.Errors++
		g.pending = append(g.pending, flushes...) // try again next pass
	}
	return n, err
}

func (g *ctGC) sweep(flushes []ctFlush) (deleted, seen int, err error) {
	plan, err := g.scan(flushes)
	if err != nil {
		return 0, plan.seen, err
	}
	deleted, err = g.apply(plan)
	return deleted, plan.seen, err
}

// ctPlan is what a sweep's read of the table found: the entries to delete and the live
// entries per owner slot.
type ctPlan struct {
	now     uint64
	seen    int
	flushed []contivbpfCbCtKey // entries of flushed addresses: deleted whatever their state
	expired []contivbpfCbCtKey // expired when read: deleted only if still expired
	dnat    bool               // a service flow's entry among them
	owned   []uint32           // live entries by owner slot (nil: not recounted)
	ownedIn []uint32           // live entries opened to each owner slot (nil: not recounted)
}

// ownerIn marks an entry's owner as the endpoint the flow was opened to (CB_OWNER_IN in
// bpf/lib/conntrack.h), counted in cb_ct_owned_in.
const ownerIn = 0x8000

// scan reads the whole table once.
func (g *ctGC) scan(flushes []ctFlush) (ctPlan, error) {
	now, err := monotonicNow()
	if err != nil {
		return ctPlan{}, err
	}
	p := ctPlan{now: now}
	match := map[ctFlush]bool{}
	for _, f := range flushes {
		match[f] = true
	}
	if g.owned != nil {
		p.owned = make([]uint32, g.owned.MaxEntries())
	}
	if g.ownedIn != nil {
		p.ownedIn = make([]uint32, g.ownedIn.MaxEntries())
	}
	err = ctEach(g.m, func(k contivbpfCbCtKey, v contivbpfCbCtEntry) {
		p.seen++
		switch {
		case match[ctFlush{k.Zone, k.Saddr}] || match[ctFlush{k.Zone, k.Daddr}] ||
			(v.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) != 0 && match[ctFlush{k.Zone, v.NatIp}]):
			p.flushed = append(p.flushed, k)
		case v.Expires < now:
			p.expired = append(p.expired, k)
		default:
			p.count(v)
			return
		}
		p.dnat = p.dnat || v.Flags&uint8(contivbpfCbCtFlagsCB_CT_DNAT) != 0
	})
	return p, err
}

// count adds a live entry to its owner's count; one opened from outside also to the
// host's total of those (cb_ct_owned_in[0]).
func (p *ctPlan) count(v contivbpfCbCtEntry) {
	counts, s := p.owned, int(v.Owner)
	if v.Owner&ownerIn != 0 {
		counts, s = p.ownedIn, int(v.Owner&^ownerIn)
		if len(counts) > 0 {
			counts[0]++
		}
		if s == 0 {
			return
		}
	}
	if s < len(counts) {
		counts[s]++
	}
}

// apply deletes what scan found. An entry that was expired when read is read again right
// before its deletion: the datapath overwrites an expired entry when its flow opens again
// (a SYN on the same tuple, the next datagram), and the pass read it up to a whole scan
// earlier. Deleting that fresh entry would cost the new flow its state (its reply, or the
// rest of a TCP handshake, arriving to no entry). The window left is the one between that
// read and the delete (the kernel has no delete-if-unchanged for hash maps).
func (g *ctGC) apply(p ctPlan) (deleted int, err error) {
	var errs []error
	// The counts first, as the scan saw them: the datapath's increments since are lost
	// until the next pass either way, and this keeps that window the scan's alone.
	if p.owned != nil {
		if err := writeCounts(g.owned, contivbpfMapCbCtOwned, p.owned); err != nil {
			errs = append(errs, err)
		}
	}
	if p.ownedIn != nil {
		if err := writeCounts(g.ownedIn, contivbpfMapCbCtOwnedIn, p.ownedIn); err != nil {
			errs = append(errs, err)
		}
	}
	for len(p.flushed) > 0 {
		chunk := p.flushed[:min(len(p.flushed), ctBatch)]
		p.flushed = p.flushed[len(chunk):]
		deleted += g.deleteChunk(chunk, &errs)
	}
recheck:
	for len(p.expired) > 0 {
		chunk := p.expired[:min(len(p.expired), ctBatch)]
		p.expired = p.expired[len(chunk):]
		still := chunk[:0]
		for i := range chunk {
			var v contivbpfCbCtEntry
			switch err := g.m.Lookup(&chunk[i], &v); {
			case errors.Is(err, ebpf.ErrKeyNotExist):
			case err != nil:
				// The map cannot be read: delete nothing more this pass.
				errs = append(errs, fmt.Errorf("read %s: %w", contivbpfMapCbCt, err))
				break recheck
			case v.Expires < p.now:
				still = append(still, chunk[i])
				p.dnat = p.dnat || v.Flags&uint8(contivbpfCbCtFlagsCB_CT_DNAT) != 0
			}
			// Otherwise opened again since the scan: live, kept.
		}
		deleted += g.deleteChunk(still, &errs)
	}
	// Entries deleted may be those of a flushed address, or refreshed in the window above:
	// no memo of a service flow's entry taken before stays current.
	if p.dnat && deleted > 0 && g.gens != nil {
		if err := memoGenJump(g.gens); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return deleted, fmt.Errorf("delete conntrack entries: %w", errors.Join(errs...))
	}
	return deleted, nil
}

// deleteChunk deletes keys (at most ctBatch) and returns how many went; errors other than
// an entry already gone are appended to errs.
func (g *ctGC) deleteChunk(keys []contivbpfCbCtKey, errs *[]error) int {
	if len(keys) == 0 {
		return 0
	}
	n, err := g.m.BatchDelete(keys, nil)
	if err == nil {
		return n
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		*errs = append(*errs, err)
		return n
	}
	// An entry went meanwhile (the datapath replaced it, or a flush raced): delete the
	// rest one by one.
	for i := n + 1; i < len(keys); i++ {
		if err := g.m.Delete(&keys[i]); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			*errs = append(*errs, err)
		}
	}
	return n
}

// writeCounts replaces every slot's count in m (cb_ct_owned or cb_ct_owned_in, named name)
// with the live entries a sweep saw. Entries the datapath opened while the sweep ran and
// after it read their bucket are not in the new count (the quota lets that many more
// through until the next sweep).
func writeCounts(m *ebpf.Map, name string, owned []uint32) error {
	keys := make([]uint32, 0, ctBatch)
	vals := make([]contivbpfCbCtCount, 0, ctBatch)
	for s := 0; s < len(owned); s += ctBatch {
		keys, vals = keys[:0], vals[:0]
		for i := s; i < min(s+ctBatch, len(owned)); i++ {
			keys = append(keys, uint32(i))
			vals = append(vals, contivbpfCbCtCount{Count: owned[i]})
		}
		if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// A client→VIP entry's state holds ctMemo when its epoch is the stamp of the service fast
// path's memo of the flow's own entry, whose state is then in the ctMemoState bits
// (CB_CT_MEMO and CB_CT_MEMO_STATE in bpf/lib/conntrack.h; docs/conntrack.md "The
// service fast path's memo").
const (
	ctMemo      = 0x80
	ctMemoState = 0x03
)

// ctStateOf is the state an entry shows: a client→VIP entry's memo bits are not its state.
func ctStateOf(v contivbpfCbCtEntry) uint8 {
	if v.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) != 0 && v.State&ctMemo != 0 {
		return uint8(contivbpfCbCtStateCB_CTS_NEW)
	}
	return v.State
}

// markShadowed sets CB_CT_SHADOW on every entry of m whose reverse tuple holds a service
// flow's entry (DNAT), as the datapath does when it writes either (cb_ct_shadow): entries
// an earlier build wrote carry no mark, and the fast path trusts an unmarked entry to be
// no service flow's reply. The driver runs it once at start, after this build's programs
// are attached (they mark what they write from then on). Two batch passes (the service
// flows' reverse tuples, then the entries under them) and an update per entry it marks,
// which may lose a refresh the datapath wrote meanwhile (the next packet refreshes it
// again). The driver moves the memo generation on after it (memoGenJump). It returns how
// many entries it marked.
func markShadowed(m *ebpf.Map) (int, error) {
	shadow := uint8(contivbpfCbCtFlagsCB_CT_SHADOW)
	reverse := map[contivbpfCbCtKey]bool{}
	var unmarked []contivbpfCbCtKey
	var vals []contivbpfCbCtEntry
	for pass := 0; pass < 2; pass++ {
		err := ctEach(m, func(k contivbpfCbCtKey, v contivbpfCbCtEntry) {
			switch {
			case pass == 0 && v.Flags&uint8(contivbpfCbCtFlagsCB_CT_DNAT) != 0:
				k.Saddr, k.Daddr, k.Sport, k.Dport = k.Daddr, k.Saddr, k.Dport, k.Sport
				reverse[k] = true
			case pass == 1 && reverse[k] && v.Flags&shadow == 0:
				v.Flags |= shadow
				unmarked, vals = append(unmarked, k), append(vals, v)
			}
		})
		if err != nil || len(reverse) == 0 {
			return 0, err
		}
	}
	marked := 0
	for i := range unmarked {
		if err := m.Update(&unmarked[i], &vals[i], ebpf.UpdateExist); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue // gone meanwhile
			}
			return marked, fmt.Errorf("mark %s entry: %w", contivbpfMapCbCt, err)
		}
		marked++
	}
	return marked, nil
}

// ownerAddr is the zone and address (network order, as in the map) of the endpoint an
// owner slot belongs to.
type ownerAddr struct{ zone, ip uint32 }

// markInbound gives the entries an earlier build wrote for flows opened to a local
// endpoint the ownerIn mark this build writes: those carry the receiver's slot alone, and
// the collector would count them against the endpoint's own quota (cb_ct_owned) instead of
// its quota of flows opened to it. Such an entry's key has the owner's address as its
// destination and another as its source, in the owner's zone (either kind; owners:
// each slot's endpoint, from the interface entries). Run at start, once this build's
// programs are attached; an update may lose a refresh the datapath wrote meanwhile (as
// markShadowed). It returns how many entries it marked.
func markInbound(m *ebpf.Map, owners map[uint16]ownerAddr) (int, error) {
	var keys []contivbpfCbCtKey
	var vals []contivbpfCbCtEntry
	err := ctEach(m, func(k contivbpfCbCtKey, v contivbpfCbCtEntry) {
		o, ok := owners[v.Owner]
		if v.Owner == 0 || v.Owner&ownerIn != 0 || !ok || k.Zone != o.zone ||
			k.Daddr != o.ip || k.Saddr == o.ip {
			return
		}
		v.Owner |= ownerIn
		keys, vals = append(keys, k), append(vals, v)
	})
	if err != nil {
		return 0, err
	}
	marked := 0
	for i := range keys {
		if err := m.Update(&keys[i], &vals[i], ebpf.UpdateExist); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue // gone meanwhile
			}
			return marked, fmt.Errorf("mark %s entry: %w", contivbpfMapCbCt, err)
		}
		marked++
	}
	return marked, nil
}

// owners maps the owner slot of every local endpoint to its zone and address (its
// interface entry).
func (t ifaceTable) owners() (map[uint16]ownerAddr, error) {
	out := map[uint16]ownerAddr{}
	err := t.each(func(_ uint32, v contivbpfCbIface) {
		if v.Slot != 0 && v.Slot < ownerIn {
			out[uint16(v.Slot)] = ownerAddr{zone: v.Vrf, ip: v.Ip}
		}
	})
	return out, err
}

// memoGenJump moves the service fast path's memo generation (cb_ct_gens) far on, after
// the agent changed service flows' entries itself: no memo taken before stays current. A
// read and a write, not the datapath's atomic add: an increment the datapath makes between
// them is lost, which is harmless (the jump already moved the generation past every memo
// taken before the read), and to go back the generation would need 2^20 increments in
// that moment.
func memoGenJump(m *ebpf.Map) error {
	var g contivbpfCbCtGen
	if err := m.Lookup(uint32(0), &g); err != nil {
		return fmt.Errorf("read %s: %w", contivbpfMapCbCtGens, err)
	}
	g.Gen += 1 << 20
	if err := m.Put(uint32(0), &g); err != nil {
		return fmt.Errorf("write %s: %w", contivbpfMapCbCtGens, err)
	}
	return nil
}

// ctEach calls fn with every entry of conntrack map m, a batch at a time.
func ctEach(m *ebpf.Map, fn func(contivbpfCbCtKey, contivbpfCbCtEntry)) error {
	keys := make([]contivbpfCbCtKey, ctBatch)
	vals := make([]contivbpfCbCtEntry, ctBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("batch lookup %s: %w", contivbpfMapCbCt, err)
		}
	}
}

// ctBatch is how many entries one batch syscall of the collector reads or deletes.
const ctBatch = 4096

// CTStats reports the conntrack table and collector figures.
func (d *Driver) CTStats() CTStats {
	defer d.lock(0, 0)() // Close drops the collector
	if d.ctgc == nil {
		return CTStats{}
	}
	d.ctgc.mu.Lock()
	defer d.ctgc.mu.Unlock()
	return d.ctgc.stats
}

// CTGC runs one collector pass now (tests, the inspect API) and returns how many entries
// it deleted.
func (d *Driver) CTGC(ctx context.Context) (int, error) {
	defer d.lock(0, 0)() // Close drops the collector; no concern's apply is waited for
	if d.ctgc == nil {
		return 0, errors.New("ebpf: conntrack collector not running")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return d.ctgc.pass()
}
