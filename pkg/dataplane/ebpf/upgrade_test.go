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

// TestUpgradeMapLayout upgrades a host from a real earlier build (oldBuildObject: per-endpoint
// counters in the per-CPU hash cb_ep_metrics, cb_endpoint and cb_iface without counter
// slot, cb_config, cb_ct and others of another layout, none of the maps added since) while
// a UDP stream flows between two endpoints: runOldAgent leaves that build's programs
// forwarding on pinned maps and tcx links, then the current build starts against its pins.
// The maps are migrated (entries converted by field name), the veths adopted, links keep
// their ids, the counters move from cb_ep_metrics into slots, the old maps are freed, and
// no datagram is lost.
func TestUpgradeMapLayout(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	peerVTEP := netip.MustParseAddr("10.254.0.2")
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		Peers: []dataplane.Peer{{Host: "h2", VTEP: peerVTEP}}}
	// The old build's agent runs on a host the current one never touched.
	if err := h.d.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	old := runOldAgent(t, h, []dataplane.Endpoint{a, b}, peerVTEP)
	links := old.links
	if len(links) != 3 {
		t.Fatalf("old build: links %v, want vxlan + 2 endpoints", links)
	}
	oldEps := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints)
	oldIfaces := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbIfaces)
	oldCfg := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbCfg)
	metrics := pinnedMap(t, h.cfg.PinRoot, legacyMetricsMap)
	if oldEps.ValueSize() != 24 || oldIfaces.ValueSize() != 20 || oldCfg.ValueSize() != 28 || metrics.Type() != ebpf.PerCPUHash {
		t.Fatalf("old pins: endpoint value %d bytes (want 24), iface %d (want 20), config %d (want 28), %s a %v (want PerCPUHash)",
			oldEps.ValueSize(), oldIfaces.ValueSize(), oldCfg.ValueSize(), legacyMetricsMap, metrics.Type())
	}
	oldIDs := []ebpf.MapID{mapIDOf(t, oldEps), mapIDOf(t, oldIfaces), mapIDOf(t, oldCfg), mapIDOf(t, metrics)}
	oldEps.Close()
	oldIfaces.Close()
	oldCfg.Close()

	conformance.PingOK(t, a.NetNS, b.IP.String(), 3) // the old programs forward
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
	var oldTx uint64
	var vals []oldEpStats
	if err := metrics.Lookup(oldEpKey{Net: netKey(h.net), Ip: ip4(a.IP)}, &vals); err != nil {
		t.Fatalf("old build: counters of a: %v", err)
	}
	for _, v := range vals {
		oldTx += v.TxPackets
	}
	metrics.Close()
	if burst < 1000 || oldTx < burst {
		t.Fatalf("old build counted %d packets sent by a, want ≥ %d", oldTx, burst)
	}

	stop := udpStream(t, a, b, 9998)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	d, err := New(ctx, h.cfg.HostConfig, h.cfg.Options)
	if err != nil {
		stop()
		t.Fatalf("upgrade to the current build: %v", err)
	}
	h.d = d
	took := time.Since(start)
	// Entries as the migration converted them and the adoption gave them slots (before
	// Sync rewrites them).
	for ip, o := range old.eps {
		var v contivbpfCbEndpoint
		if err := d.objs.CbEndpoints.Lookup(&contivbpfCbEpKey{Net: netKey(h.net), Ip: ip4(ip)}, &v); err != nil {
			t.Errorf("endpoint %v after upgrade: %v", ip, err)
			continue
		}
		if v.Slot == 0 {
			t.Errorf("endpoint %v: no counter slot after upgrade", ip)
		}
		w := contivbpfCbEndpoint{Ifindex: o.Ifindex, Vtep: o.Vtep, Mac: o.Mac, Epg: o.Epg, Flags: o.Flags, Generation: o.Generation, Slot: v.Slot}
		if v != w {
			t.Errorf("endpoint %v after upgrade = %+v, want %+v", ip, v, w)
		}
		if ifc, err := d.readIface(o.Ifindex); err != nil {
			t.Errorf("iface of %v after upgrade: %v", ip, err)
		} else if wi := (contivbpfCbIface{Net: netKey(h.net), Ip: ip4(ip), Mac: o.Mac, Epg: o.Epg, Generation: o.Generation, Slot: v.Slot}); ifc != wi {
			t.Errorf("iface of %v after upgrade = %+v, want %+v", ip, ifc, wi)
		}
		// The earlier build kept interfaces in the hash: moved into the array, hash copy gone.
		var direct contivbpfCbIface
		if err := d.objs.CbIfaceDirect.Lookup(o.Ifindex, &direct); err != nil || direct.Ip != ip4(ip) {
			t.Errorf("iface of %v (ifindex %d) not in %s after upgrade: %+v, %v", ip, o.Ifindex, contivbpfMapCbIfaceDirect, direct, err)
		}
		var hashed contivbpfCbIface
		if err := d.objs.CbIfaces.Lookup(o.Ifindex, &hashed); err == nil {
			t.Errorf("iface of %v still in %s after upgrade: %+v", ip, contivbpfMapCbIfaces, hashed)
		}
	}
	var nv contivbpfCbNetwork
	if err := d.objs.CbNetworks.Lookup(netKey(h.net), &nv); err != nil || nv.Vrf != vrfOf(h.net.ID) || nv.Generation != 1 {
		t.Errorf("network after upgrade: %+v, %v", nv, err)
	}
	var peer contivbpfCbPeer
	if err := d.objs.CbPeers.Lookup(ip4(peerVTEP), &peer); err != nil {
		t.Errorf("peer after upgrade: %v", err)
	}
	if c, err := d.EndpointCounters(a.ID); err != nil || c.TxPackets < oldTx {
		t.Errorf("counters of a after upgrade: %+v, %v; want ≥ %d packets sent (carried from %s)", c, err, oldTx, legacyMetricsMap)
	}
	if err := d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	sent, lost := stop()
	t.Logf("upgrade %s → current (New) took %v; %d datagrams sent, %d lost", oldBuildObject, took.Round(time.Millisecond), sent, lost)
	if lost != 0 {
		t.Errorf("%d of %d datagrams lost across the upgrade", lost, sent)
	}
	if got := linkIDs(t, d); !equalIDs(got, links) {
		t.Errorf("after upgrade: link ids %v, want %v", got, links)
	}
	for _, ep := range []dataplane.Endpoint{a, b} {
		if l, err := d.nl.LinkByName(ep.HostIfName); err != nil || l.Attrs().Alias != d.endpointAlias(indexKey(ep.ID)) {
			t.Errorf("veth of %s after Sync: %v (want the scoped alias)", ep.ID, err)
		}
	}
	eps := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints)
	ifaces := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbIfaces)
	if eps.ValueSize() != uint32(binary.Size(contivbpfCbEndpoint{})) || ifaces.ValueSize() != uint32(binary.Size(contivbpfCbIface{})) {
		t.Errorf("pins after upgrade: endpoint value %d bytes, iface %d", eps.ValueSize(), ifaces.ValueSize())
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
	// The old build's maps are freed once nothing references them.
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
				t.Errorf("old build's map id %d still exists: %v", id, err)
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
	d, err := New(ctx, big.HostConfig, big.Options)
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
	if n := countIfaces(t, d); n != 2 {
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
	if _, err := New(ctx, tiny.HostConfig, tiny.Options); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("MapEntries too small for the entries: %v, want a 'do not fit' error", err)
	}
	m := pinnedMap(t, h.cfg.PinRoot, contivbpfMapCbEndpoints)
	if mapIDOf(t, m) != id || m.MaxEntries() != 2048 {
		t.Errorf("refused resize changed the pin: id %d (was %d), %d entries", mapIDOf(t, m), id, m.MaxEntries())
	}
	h.d = nil
	d, err = New(ctx, big.HostConfig, big.Options)
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
}
