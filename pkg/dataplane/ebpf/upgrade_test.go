package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// udpStream sends numbered datagrams from a to b (every 100 µs) until the returned stop
// is called, which reports how many were sent and how many never arrived.
func udpStream(t *testing.T, a, b dataplane.Endpoint, port int) (stop func() (sent, lost int)) {
	t.Helper()
	var rx, tx *net.UDPConn
	if err := nsexec.Run(b.NetNS, func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: b.IP.AsSlice(), Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_ = rx.SetReadBuffer(4 << 20)
	if err := nsexec.Run(a.NetNS, func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: b.IP.AsSlice(), Port: port})
		return err
	}); err != nil {
		rx.Close()
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			_ = rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := rx.Read(buf)
			if err != nil {
				return
			}
			if n >= 4 {
				mu.Lock()
				seen[binary.BigEndian.Uint32(buf)] = true
				mu.Unlock()
			}
		}
	}()
	quit := make(chan struct{})
	sentc := make(chan int)
	go func() {
		i := 0
		defer func() { sentc <- i }()
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for ; ; i++ {
			var b [32]byte
			binary.BigEndian.PutUint32(b[:], uint32(i))
			if _, err := tx.Write(b[:]); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-quit:
				i++
				return
			}
		}
	}()
	return func() (int, int) {
		close(quit)
		n := <-sentc
		<-done
		rx.Close()
		tx.Close()
		mu.Lock()
		defer mu.Unlock()
		return n, n - len(seen)
	}
}

// linkIDs returns the ids of d's tcx links (the socket LB's cgroup link is not one: an
// earlier build has none).
func linkIDs(t *testing.T, d *Driver) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for name, a := range d.links {
		if a.hook != "" {
			continue
		}
		info, err := a.link.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[name] = uint32(info.ID)
	}
	return out
}

func mapIDOf(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func pinnedMap(t *testing.T, pinRoot, name string) *ebpf.Map {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinRoot, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestUpgradeMapLayout runs the programs of an earlier build with another map layout
// (contivbpfv1: cb_endpoint fields reordered and without generation or counter slot,
// cb_iface without slot, per-endpoint counters in the per-CPU hash cb_ep_metrics instead
// of slots in cb_ep_counters, cb_peers with 1024 instead of 4096 entries), then starts the current build against its pins while a UDP
// stream flows between two endpoints: the maps are migrated (entries converted by field
// name), links keep their ids, the old maps are freed, and no datagram is lost.
func TestUpgradeMapLayout(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		Peers: []dataplane.Peer{{Host: "h2", VTEP: netip.MustParseAddr("10.254.0.2")}}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]contivbpfCbEndpoint{}
	for _, ep := range []dataplane.Endpoint{a, b} {
		var v contivbpfCbEndpoint
		if err := h.d.objs.CbEndpoints.Lookup(&contivbpfCbEpKey{Net: 77, Ip: ip4(ep.IP)}, &v); err != nil {
			t.Fatal(err)
		}
		want[ep.IP] = v
	}
	links := linkIDs(t, h.d)
	if len(links) != 3 {
		t.Fatalf("links %v, want vxlan + 2 endpoints", links)
	}

	// The earlier build takes over the same pins (its layout differs, so this is a
	// migration too, towards v1).
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	old, err := New(ctx, h.cfg, withSpec(loadContivbpfv1))
	if err != nil {
		t.Fatalf("start the v1 build: %v", err)
	}
	h.d = old
	if got := linkIDs(t, old); !equalIDs(got, links) {
		t.Fatalf("v1 build: link ids %v, want %v", got, links)
	}
	oldEps := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints)
	oldPeers := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbPeers)
	if oldEps.ValueSize() != 20 || oldPeers.MaxEntries() != 1024 {
		t.Fatalf("v1 pins: endpoint value %d bytes (want 20), peers %d entries (want 1024)", oldEps.ValueSize(), oldPeers.MaxEntries())
	}
	for ip, w := range want {
		var v contivbpfv1CbEndpoint
		if err := oldEps.Lookup(&contivbpfCbEpKey{Net: 77, Ip: ip4(ip)}, &v); err != nil {
			t.Fatalf("v1 endpoint %v: %v", ip, err)
		}
		if v.Ifindex != w.Ifindex || v.Mac != w.Mac || v.Flags != w.Flags || v.Epg != w.Epg {
			t.Errorf("v1 endpoint %v = %+v, converted from %+v", ip, v, w)
		}
	}
	oldIDs := []ebpf.MapID{mapIDOf(t, oldEps), mapIDOf(t, oldPeers)}
	oldEps.Close()
	oldPeers.Close()
	// v1 counts per endpoint in cb_ep_metrics (per-CPU hash by {net, ip}), whose entries
	// its agent created with each endpoint (this driver runs v1's programs but cannot
	// Sync v1's layout, so the test writes them); the upgrade carries the counts into the
	// counter slots.
	metrics := pinnedMap(t, h.cfg.PinRoot, legacyMetricsMap)
	for _, ep := range []dataplane.Endpoint{a, b} {
		if err := metrics.Put(&contivbpfCbEpKey{Net: 77, Ip: ip4(ep.IP)}, make([]contivbpfCbEpStats, ebpf.MustPossibleCPU())); err != nil {
			t.Fatal(err)
		}
	}
	conformance.PingOK(t, a.NetNS, b.IP.String(), 3) // the v1 programs forward
	burst := uint64(0)                               // datagrams the kernel took (ICMP port unreachable fails some writes)
	if err := nsexec.Run(a.NetNS, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: b.IP.AsSlice(), Port: 9})
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < 3000; i++ {
			if _, err := c.Write(make([]byte, 16)); err == nil {
				burst++
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var v1Tx uint64
	var vals []contivbpfCbEpStats
	if err := metrics.Lookup(&contivbpfCbEpKey{Net: 77, Ip: ip4(a.IP)}, &vals); err != nil {
		t.Fatalf("v1 counters of a: %v", err)
	}
	for _, v := range vals {
		v1Tx += v.TxPackets
	}
	metrics.Close()
	if burst < 1000 || v1Tx < burst {
		t.Fatalf("v1 counted %d packets sent by a, want ≥ %d", v1Tx, burst)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	stop := udpStream(t, a, b, 9998)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	d, err := New(ctx, h.cfg)
	if err != nil {
		stop()
		t.Fatalf("upgrade to the current build: %v", err)
	}
	h.d = d
	took := time.Since(start)
	// Entries as the migration converted them (before Sync rewrites them).
	for ip, w := range want {
		var v contivbpfCbEndpoint
		if err := d.objs.CbEndpoints.Lookup(&contivbpfCbEpKey{Net: 77, Ip: ip4(ip)}, &v); err != nil {
			t.Errorf("endpoint %v after upgrade: %v", ip, err)
			continue
		}
		w.Generation = 0 // not in v1: defaulted
		w.Slot = v.Slot  // not in v1: allocated when the endpoint is adopted
		if v.Slot == 0 {
			t.Errorf("endpoint %v: no counter slot after upgrade", ip)
		}
		if v != w {
			t.Errorf("endpoint %v after upgrade = %+v, want %+v", ip, v, w)
		}
	}
	var peer contivbpfCbPeer
	if err := d.objs.CbPeers.Lookup(ip4(netip.MustParseAddr("10.254.0.2")), &peer); err != nil {
		t.Errorf("peer after upgrade: %v", err)
	}
	if c, err := d.EndpointCounters(a.ID); err != nil || c.TxPackets < v1Tx {
		t.Errorf("counters of a after upgrade: %+v, %v; want ≥ %d packets sent (carried from v1)", c, err, v1Tx)
	}
	if err := d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	sent, lost := stop()
	t.Logf("upgrade v1 → current (New) took %v; %d datagrams sent, %d lost", took.Round(time.Millisecond), sent, lost)
	if lost != 0 {
		t.Errorf("%d of %d datagrams lost across the upgrade", lost, sent)
	}
	if got := linkIDs(t, d); !equalIDs(got, links) {
		t.Errorf("after upgrade: link ids %v, want %v", got, links)
	}
	eps := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints)
	peers := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbPeers)
	if eps.ValueSize() != 28 || peers.MaxEntries() != 4096 {
		t.Errorf("pins after upgrade: endpoint value %d bytes, peers %d entries", eps.ValueSize(), peers.MaxEntries())
	}
	if mapIDOf(t, eps) != mapIDOf(t, d.objs.CbEndpoints) {
		t.Error("the pinned cb_endpoints is not the map the programs use")
	}
	ents, _ := os.ReadDir(h.cfg.PinRoot)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), migrationTempPrefix) || e.Name() == legacyMetricsMap {
			t.Errorf("pin %s left", e.Name())
		}
	}
	// The v1 maps are freed once nothing references them.
	deadline := time.Now().Add(3 * time.Second)
	for _, id := range oldIDs {
		for {
			m, err := ebpf.NewMapFromID(id)
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if err == nil {
				m.Close()
			}
			if time.Now().After(deadline) {
				t.Errorf("v1 map id %d still exists: %v", id, err)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	conformance.PingOK(t, a.NetNS, b.IP.String(), 3)
}

func equalIDs(a, b map[string]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestMapEntriesResize: a bigger MapEntries migrates the pins (entries kept, same links); one
// too small for the entries is refused and changes nothing.
func TestMapEntriesResize(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", false)
	b := h.endpoint(t, "b", "10.50.0.3", false)
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	links := linkIDs(t, h.d)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	big := h.cfg
	big.MapEntries = 2048
	d, err := New(ctx, big)
	if err != nil {
		t.Fatalf("grow MapEntries: %v", err)
	}
	h.d = d
	if got := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints).MaxEntries(); got != 2048 {
		t.Errorf("pinned cb_endpoints has %d entries, want 2048", got)
	}
	if got := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbCt).MaxEntries(); got != 4*2048 {
		t.Errorf("pinned cb_ct has %d entries, want %d", got, 4*2048)
	}
	if n := countEntries(t, d.objs.CbEndpoints); n != 2 {
		t.Errorf("%d endpoint entries after resize, want 2", n)
	}
	if n := countEntries(t, d.objs.CbIfaces); n != 2 {
		t.Errorf("%d iface entries after resize, want 2", n)
	}
	if got := linkIDs(t, d); !equalIDs(got, links) {
		t.Errorf("after resize: link ids %v, want %v", got, links)
	}
	if err := d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	id := mapIDOf(t, d.objs.CbEndpoints)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	tiny := h.cfg
	tiny.MapEntries = 1
	if _, err := New(ctx, tiny); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("MapEntries too small for the entries: %v, want a 'do not fit' error", err)
	}
	m := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints)
	if mapIDOf(t, m) != id || m.MaxEntries() != 2048 {
		t.Errorf("refused resize changed the pin: id %d (was %d), %d entries", mapIDOf(t, m), id, m.MaxEntries())
	}
	h.d = nil
	d, err = New(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
}
