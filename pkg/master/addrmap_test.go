package master

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// TestChunkMapMatchesInline drives a chunked map in etcd and Contiv's inline bitmap with the
// same random operations (single bits, ranges, lowest-free allocation, range searches, each
// transaction a few of them) and requires the same answers and the same bits throughout.
// It also checks the layout invariants: no key for a full chunk or a chunk equal to its
// base pattern, and a summary bit exactly for the full chunks.
func TestChunkMapMatchesInline(t *testing.T) {
	store, url := statetest.Store(t)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		subnet string
		gw     string
		pool   [2]string // EPG pool map instead of a network map when set
	}{
		{name: "slash22-gw", subnet: "10.9.0.0/22", gw: "10.9.0.1"},
		{name: "range-no-gw", subnet: "10.9.1.7-10.9.2.250/21"},
		{name: "slash20-gw-last", subnet: "10.9.16.0/20", gw: "10.9.31.254"},
		{name: "pool", subnet: "10.9.32.0/21", pool: [2]string{"10.9.33.100", "10.9.35.20"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sn, err := parseSubnet4("subnet", tc.subnet)
			if err != nil {
				t.Fatal(err)
			}
			var base func(uint) bool
			if tc.pool[0] != "" {
				f, _ := parseIP4("", tc.pool[0])
				l, _ := parseIP4("", tc.pool[1])
				base = poolBase(sn, f, l)
			} else {
				var gw uint32
				if tc.gw != "" {
					gw, _ = parseIP4("", tc.gw)
				}
				base = netBase(sn, gw, tc.gw != "")
			}
			n := uint(sn.size())
			ref := model.NewBitset(n)
			for i := uint(0); i < n; i++ {
				if base(i) {
					ref.Set(i)
				}
			}
			prefix := ipAllocPrefix + "test-" + tc.name + "/net/"
			open := func(tx *state.Tx) *chunkMap { return newChunkMap(tx, prefix, n, base) }
			if err := store.Update(ctx, func(tx *state.Tx) error { return open(tx).init() }); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			for step := 0; step < 300; step++ {
				want := ref.Clone()
				var log []string
				err := store.Update(ctx, func(tx *state.Tx) error {
					want = ref.Clone()
					log = log[:0]
					m := open(tx)
					for k := 0; k < 1+rng.IntN(4); k++ {
						a := uint(rng.IntN(int(n)))
						b := min(n-1, a+uint(rng.IntN(700)))
						switch op := rng.IntN(7); op {
						case 0, 1: // allocate lowest, as allocLowest does
							got, ok, err := allocLowest(m)
							if err != nil {
								return err
							}
							w, wok := want.NextClear(0)
							if wok {
								want.Set(w)
							}
							log = append(log, fmt.Sprintf("alloc→%d,%v", got, ok))
							if ok != wok || (ok && got != w) {
								return fmt.Errorf("allocLowest = %d,%v; inline %d,%v", got, ok, w, wok)
							}
						case 2:
							log = append(log, fmt.Sprintf("clear %d", a))
							if err := m.Clear(a); err != nil {
								return err
							}
							want.Clear(a)
						case 3:
							log = append(log, fmt.Sprintf("setrange %d-%d", a, b))
							if err := m.SetRange(a, b); err != nil {
								return err
							}
							want.SetRange(a, b)
						case 4:
							log = append(log, fmt.Sprintf("clearrange %d-%d", a, b))
							if err := m.ClearRange(a, b); err != nil {
								return err
							}
							for i := a; i <= b; i++ {
								want.Clear(i)
							}
						case 5:
							got, ok, err := m.NextSet(a, b)
							if err != nil {
								return err
							}
							w, wok := want.NextSet(a)
							wok = wok && w <= b
							if ok != wok || (ok && got != w) {
								return fmt.Errorf("NextSet(%d,%d) = %d,%v; inline %d,%v", a, b, got, ok, w, wok)
							}
						case 6:
							got, err := m.Test(a)
							if err != nil {
								return err
							}
							if got != want.Test(a) {
								return fmt.Errorf("Test(%d) = %v, inline %v", a, got, want.Test(a))
							}
						}
					}
					return nil
				})
				if err != nil {
					t.Fatalf("step %d (%s): %v", step, strings.Join(log, "; "), err)
				}
				ref = want
				var got model.Bitset
				if err := store.Update(ctx, func(tx *state.Tx) error {
					var err error
					got, err = open(tx).Bits()
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if !equalBits(got, ref) {
					t.Fatalf("step %d (%s): chunked map differs from inline (%d vs %d bits set)", step, strings.Join(log, "; "), got.Count(), ref.Count())
				}
			}
			// Layout invariants.
			resp, err := raw.Get(ctx, prefix, clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			var full model.Bitset
			keys := map[uint]bool{}
			for _, kv := range resp.Kvs {
				k := strings.TrimPrefix(string(kv.Key), prefix)
				if k == "full" {
					if err := full.UnmarshalJSON(kv.Value); err != nil {
						t.Fatal(err)
					}
					continue
				}
				var c uint
				if _, err := fmt.Sscanf(k, "c/%05d", &c); err != nil {
					t.Fatalf("stray key %s", kv.Key)
				}
				keys[c] = true
				var b model.Bitset
				if err := b.UnmarshalJSON(kv.Value); err != nil {
					t.Fatal(err)
				}
				m := newChunkMap(nil, prefix, n, base)
				if b.Count() == b.Len() || equalBits(b, m.baseChunk(c)) {
					t.Errorf("chunk %d is stored although full or equal to its base", c)
				}
			}
			for c := uint(0); c*ipChunkBits < n; c++ {
				isFull := true
				for i := c * ipChunkBits; i < min(n, (c+1)*ipChunkBits); i++ {
					isFull = isFull && ref.Test(i)
				}
				if full.Test(c) != isFull {
					t.Errorf("summary bit of chunk %d = %v, chunk full = %v", c, full.Test(c), isFull)
				}
				if isFull && keys[c] {
					t.Errorf("full chunk %d has a key", c)
				}
			}
		})
	}
}

// putBytes sums key and value bytes of every put under /contiv.io/ in revisions (from, to].
func putBytes(t *testing.T, raw *clientv3.Client, from, to int64) int {
	t.Helper()
	n, err := statetest.PutBytes(context.Background(), raw, "/contiv.io/", from, to)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) rev() int64 {
	e.t.Helper()
	resp, err := e.raw.Get(context.Background(), "/contiv.io/none")
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestAllocationBytesDoNotGrowWithSubnet: what one allocation writes to etcd is the same
// in a /24 (Contiv's inline bitmap) and a /10 (chunks); before chunks a /10 allocation wrote
// ~700 KB.
func TestAllocationBytesDoNotGrowWithSubnet(t *testing.T) {
	e := newEnv(t, "routing")
	e.net("default", "small", "vxlan", "10.60.1.0/24", "10.60.1.1", 0)
	e.net("default", "huge", "vxlan", "10.128.0.0/10", "10.128.0.1", 0)
	per := map[string]float64{}
	const n = 200
	for _, net := range []string{"small.default", "huge.default"} {
		from := e.rev()
		for i := 0; i < n; i++ {
			e.alloc(net)
		}
		per[net] = float64(putBytes(t, e.raw, from, e.rev())) / n
	}
	t.Logf("etcd bytes per allocation: /24 %.0f, /10 %.0f", per["small.default"], per["huge.default"])
	if per["huge.default"] > 1.5*per["small.default"] {
		t.Fatalf("a /10 allocation writes %.0f bytes, a /24 one %.0f: cost grows with the subnet", per["huge.default"], per["small.default"])
	}
	// The network inspect still lists the allocations of the chunked map.
	var out model.NetworkInspect
	e.ok("GET", "/api/v1/inspect/networks/default:huge/", nil, &out)
	if out.Oper.AllocatedIPAddresses != "10.128.0.1-10.128.0.201" || out.Oper.AllocatedAddressesCount != n {
		t.Fatalf("inspect: allocated %q count %d", out.Oper.AllocatedIPAddresses, out.Oper.AllocatedAddressesCount)
	}
}

// TestTenThousandAllocationsInSlash10 is the NOSPACE reproduction: 10,000 allocations in a
// /10 on an embedded etcd whose quota (64 MiB) the inline layout exhausts after ~90.
// Releases and reallocation go through the same chunks, and deleting the network removes
// every chunk key.
func TestTenThousandAllocationsInSlash10(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	ctx := context.Background()
	e := newEnvEtcd(t, etcdembed.Config{QuotaBytes: 64 << 20}, "routing")
	e.net("default", "wide", "vxlan", "10.64.0.0/10", "10.64.0.1", 0)
	const total, workers = 10000, 4
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < total/workers; i++ {
				code, body := e.do("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "wide.default"})
				if code != 200 {
					errs <- fmt.Errorf("allocation: %d %s", code, body)
					return
				}
				mu.Lock()
				if seen[body] {
					mu.Unlock()
					errs <- fmt.Errorf("duplicate %s", body)
					return
				}
				seen[body] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if bits := allocBits(t, e, "wide.default"); bits.Count() != total+3 {
		t.Fatalf("%d bits set, want %d", bits.Count(), total+3)
	}
	if ns := netState(t, e, "wide.default"); ns.EpAddrCount != total || ns.IPAllocMap.Len() != 0 {
		t.Fatalf("state: epAddrCount %d, inline map %d bits", ns.EpAddrCount, ns.IPAllocMap.Len())
	}
	st := e.store.Health(ctx)
	t.Logf("etcd after %d allocations: %+v", total, st)
	// Release one in a full chunk and get it back as the lowest free address.
	e.ok("POST", "/plugin/releaseAddress", model.ReleaseAddressRequest{NetworkID: "wide.default", IPv4Address: "10.64.0.77/10"}, nil)
	if got := e.alloc("wide.default"); got != "10.64.0.77/10" {
		t.Fatalf("reallocation gave %s, want 10.64.0.77/10", got)
	}
	e.ok("DELETE", "/api/v1/networks/default:wide/", nil, nil)
	resp, err := e.raw.Get(ctx, ipAllocPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("%d allocation keys left after the network was deleted", resp.Count)
	}
}

// TestLegacyInlineMapStillServed: a large network whose state record carries Contiv's
// inline ipAllocMap (written by Contiv, or by netmaster before chunks) keeps being read and
// written in that layout.
func TestLegacyInlineMapStillServed(t *testing.T) {
	e := newEnv(t, "routing")
	e.net("default", "old", "vxlan", "10.70.0.0/20", "10.70.0.1", 0)
	ctx := context.Background()
	ns := netState(t, e, "old.default")
	sn, _ := parseSubnet4("", "10.70.0.0/20")
	gw, _ := parseIP4("", "10.70.0.1")
	ns.IPAllocStore = ""
	ns.IPAllocMap = newIPMap(sn, gw, true)
	ns.IPAllocMap.Set(5) // 10.70.0.5 held by someone
	if err := e.store.Put(ctx, model.NetStateKey("old.default"), &ns); err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw.Delete(ctx, netAllocRoot("old.default"), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10.70.0.2/20", "10.70.0.3/20", "10.70.0.4/20", "10.70.0.6/20"} {
		if got := e.alloc("old.default"); got != want {
			t.Fatalf("allocated %s, want %s", got, want)
		}
	}
	if code, body := e.do("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "old.default", PreferredIPv4Address: "10.70.0.5"}); code != 409 {
		t.Fatalf("taken preferred address in a legacy map: %d %s", code, body)
	}
	e.ok("POST", "/plugin/releaseAddress", model.ReleaseAddressRequest{NetworkID: "old.default", IPv4Address: "10.70.0.3/20"}, nil)
	after := netState(t, e, "old.default")
	if after.IPAllocStore != "" || after.IPAllocMap.Len() != 4096 || !after.IPAllocMap.Test(6) || after.IPAllocMap.Test(3) {
		t.Fatalf("legacy record changed layout or bits: store %q, %d bits", after.IPAllocStore, after.IPAllocMap.Len())
	}
	resp, err := e.raw.Get(ctx, ipAllocPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("chunk keys written for a legacy network: %v %v", resp, err)
	}
}

// TestChunkedEPGPool: an EPG pool spanning several chunks of a /16. The pool's addresses
// are reserved in the network map (whole chunks as summary bits), endpoints of the group
// get pool addresses, others never do, inspect shows both maps, and deleting the group
// frees the pool and removes its chunk keys.
func TestChunkedEPGPool(t *testing.T) {
	e := newEnv(t, "bridge")
	ctx := context.Background()
	e.net("default", "wide", "vxlan", "10.90.0.0/16", "10.90.0.1", 0)
	// A taken address inside the requested pool refuses the group.
	e.createEP("default", "wide", "", "early", "10.90.2.200")
	if code, body := e.do("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"wide","ipPool":"10.90.1.250-10.90.4.3","tenantName":"default"}`); code != 409 || !strings.Contains(body, "10.90.2.200") {
		t.Fatalf("pool over a taken address: %d %s", code, body)
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "wide", EndpointID: "early"}, nil)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"wide","ipPool":"10.90.1.250-10.90.4.3","tenantName":"default"}`, nil)
	var st model.EndpointGroupState
	if err := json.Unmarshal([]byte(e.rawGet(model.EPGStateKey("web:default"))), &st); err != nil || st.EPGIPAllocStore != "chunks/256" || st.EPGIPAllocMap.Len() != 0 {
		t.Fatalf("epg state: store %q, inline %d bits, %v", st.EPGIPAllocStore, st.EPGIPAllocMap.Len(), err)
	}
	var got []string
	for i := 0; i < 8; i++ {
		got = append(got, e.createEP("default", "wide", "web", fmt.Sprintf("w%d", i), "").IPAddress)
	}
	if got[0] != "10.90.1.250" || got[6] != "10.90.2.0" || got[7] != "10.90.2.1" {
		t.Fatalf("pool endpoints got %v", got)
	}
	if ep := e.createEP("default", "wide", "", "plain", ""); ep.IPAddress != "10.90.0.2" {
		t.Fatalf("plain endpoint got %s", ep.IPAddress)
	}
	// The network map holds the whole pool; plain allocations go around it.
	bits := allocBits(t, e, "wide.default")
	for _, a := range []string{"10.90.1.250", "10.90.3.7", "10.90.4.3"} {
		v, _ := parseIP4("", a)
		if !bits.Test(uint(v - u32(mustAddr("10.90.0.0")))) {
			t.Fatalf("pool address %s not reserved in the network map", a)
		}
	}
	var gi model.EndpointGroupInspect
	e.ok("GET", "/api/v1/inspect/endpointGroups/default:web/", nil, &gi)
	if gi.Oper.AllocatedIPAddresses != "10.90.1.250-10.90.2.1" || gi.Oper.AvailableIPAddresses != "10.90.2.2-10.90.4.3" {
		t.Fatalf("epg inspect: allocated %q available %q", gi.Oper.AllocatedIPAddresses, gi.Oper.AvailableIPAddresses)
	}
	// Release and reuse inside the pool.
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "wide", EndpointID: "w3"}, nil)
	if ep := e.createEP("default", "wide", "web", "w3b", ""); ep.IPAddress != got[3] {
		t.Fatalf("pool reuse gave %s, want %s", ep.IPAddress, got[3])
	}
	for _, id := range []string{"w0", "w1", "w2", "w3b", "w4", "w5", "w6", "w7"} {
		e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "wide", EndpointID: id}, nil)
	}
	e.ok("DELETE", "/api/v1/endpointGroups/default:web/", nil, nil)
	if bits := allocBits(t, e, "wide.default"); bits.Count() != 4 { // network, gateway, plain, broadcast
		t.Fatalf("after group delete %d bits set, want 4", bits.Count())
	}
	resp, err := e.raw.Get(ctx, netAllocRoot("wide.default")+"epg/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("pool keys left after group delete: %v %v", resp, err)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
