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
	g.mu.Lock()
	defer g.mu.Unlock()
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
	now, err := monotonicNow()
	if err != nil {
		return 0, 0, err
	}
	match := map[ctFlush]bool{}
	for _, f := range flushes {
		match[f] = true
	}
	var (
		k    contivbpfCbCtKey
		v    contivbpfCbCtEntry
		dead []contivbpfCbCtKey
	)
	it := g.m.Iterate()
	for it.Next(&k, &v) {
		seen++
		if v.Expires < now || match[ctFlush{k.Zone, k.Saddr}] || match[ctFlush{k.Zone, k.Daddr}] ||
			(v.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) != 0 && match[ctFlush{k.Zone, v.NatIp}]) {
			dead = append(dead, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, seen, fmt.Errorf("iterate %s: %w", contivbpfMapCbCt, err)
	}
	var errs []error
	for i := range dead {
		if err := g.m.Delete(&dead[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
			continue
		}
		deleted++
	}
	if len(errs) > 0 {
		return deleted, seen, fmt.Errorf("delete %d conntrack entries: %w", len(errs), errors.Join(errs...))
	}
	return deleted, seen, nil
}

// CTStats reports the conntrack table and collector figures.
func (d *Driver) CTStats() CTStats {
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
	if d.ctgc == nil {
		return 0, errors.New("ebpf: conntrack collector not running")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return d.ctgc.pass()
}
