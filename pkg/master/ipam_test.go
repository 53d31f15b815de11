package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func netState(t *testing.T, e *env, id string) model.CfgNetworkState {
	t.Helper()
	var ns model.CfgNetworkState
	if err := json.Unmarshal([]byte(e.rawGet(model.NetStateKey(id))), &ns); err != nil {
		t.Fatalf("network state %s: %v", id, err)
	}
	return ns
}

// allocBits reads network id's whole allocation map, inline or chunked.
func allocBits(t *testing.T, e *env, id string) model.Bitset {
	t.Helper()
	var bits model.Bitset
	err := e.store.Update(context.Background(), func(tx *state.Tx) error {
		ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(id))
		if err != nil || !found {
			return fmt.Errorf("network state %s: found %v, %v", id, found, err)
		}
		nm, err := netAllocMap(tx, ns)
		if err != nil {
			return err
		}
		bits, err = nm.Bits()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return bits
}

func TestIPAMRules(t *testing.T) {
	e := newEnv(t, "routing")
	// Gateway .1 → first address .2; without gateway → .1.
	e.net("default", "gw", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.net("default", "nogw", "vxlan", "10.2.1.0/24", "", 0)
	if ip := e.alloc("gw.default"); ip != "10.1.1.2/24" {
		t.Fatalf("gw net first = %s", ip)
	}
	if ip := e.alloc("nogw.default"); ip != "10.2.1.1/24" {
		t.Fatalf("no-gw net first = %s", ip)
	}
	// Pool lookup without NetworkID (docker IPAM form), with and without tenant.
	var r model.AllocAddressResponse
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{AddressPool: "10.1.1.0/24:default"}, &r)
	if r.IPv4Address != "10.1.1.3/24" {
		t.Fatalf("pool alloc = %s", r.IPv4Address)
	}
	// Preferred address is taken as given.
	e.ok("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "gw.default", PreferredIPv4Address: "10.1.1.50"}, &r)
	if r.IPv4Address != "10.1.1.50/24" {
		t.Fatalf("preferred = %s", r.IPv4Address)
	}
	// Release and reuse (lowest free first).
	var s string
	e.ok("POST", "/plugin/releaseAddress", model.ReleaseAddressRequest{NetworkID: "gw.default", IPv4Address: "10.1.1.2"}, &s)
	if s != "success" {
		t.Fatalf("release answered %q", s)
	}
	if ip := e.alloc("gw.default"); ip != "10.1.1.2/24" {
		t.Fatalf("reuse = %s", ip)
	}
	// Gateway can't be released.
	e.ok("POST", "/plugin/releaseAddress", model.ReleaseAddressRequest{NetworkID: "gw.default", IPv4Address: "10.1.1.1"}, nil)
	if ns := netState(t, e, "gw.default"); !ns.IPAllocMap.Test(1) {
		t.Fatal("gateway bit released")
	}
	// Exhaustion: /29 with gateway .1 leaves .2-.6.
	e.net("default", "small", "vlan", "10.3.1.0/29", "10.3.1.1", 0)
	for i := 2; i <= 6; i++ {
		if ip := e.alloc("small.default"); ip != fmt.Sprintf("10.3.1.%d/29", i) {
			t.Fatalf("small alloc %d = %s", i, ip)
		}
	}
	code, out := e.do("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "small.default"})
	if code != http.StatusConflict || !strings.Contains(out, "auto allocation failed - address exhaustion in subnet 10.3.1.0/29") {
		t.Fatalf("exhaustion: %d %s", code, out)
	}
	if ns := netState(t, e, "small.default"); ns.EpAddrCount != 5 {
		t.Fatalf("epAddrCount = %d", ns.EpAddrCount)
	}
	// Range subnet: only the range is handed out.
	e.net("default", "rng", "vxlan", "10.4.1.10-10.4.1.12/24", "", 0)
	ns := netState(t, e, "rng.default")
	if ns.IPAddrRange != "10.4.1.10-10.4.1.12" || ns.SubnetIP != "10.4.1.0" {
		t.Fatalf("range state %+v", ns)
	}
	for i := 10; i <= 12; i++ {
		if ip := e.alloc("rng.default"); ip != fmt.Sprintf("10.4.1.%d/24", i) {
			t.Fatalf("range alloc = %s", ip)
		}
	}
	if code, _ := e.do("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "rng.default"}); code != http.StatusConflict {
		t.Fatalf("range exhaustion: %d", code)
	}
	// Network inspect reports ranges.
	var ni model.NetworkInspect
	e.ok("GET", "/api/v1/inspect/networks/default:small/", nil, &ni)
	if ni.Oper.AllocatedIPAddresses != "10.3.1.1-10.3.1.6" || ni.Oper.AvailableIPAddresses != "" || ni.Oper.AllocatedAddressesCount != 5 {
		t.Fatalf("inspect oper %+v", ni.Oper)
	}
}

func TestEPGPoolAndEndpoints(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "n", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.ok("POST", "/api/v1/endpointGroups/default:web/", `{"groupName":"web","networkName":"n","ipPool":"10.1.1.10-10.1.1.11","tenantName":"default"}`, nil)
	// Plain network allocations skip the pool.
	ns := netState(t, e, "n.default")
	if !ns.IPAllocMap.Test(10) || !ns.IPAllocMap.Test(11) || ns.IPAllocMap.Test(12) {
		t.Fatal("pool bits not reserved in the network map")
	}
	ep1 := e.createEP("default", "n", "web", "a", "")
	ep2 := e.createEP("default", "n", "web", "b", "")
	if ep1.IPAddress != "10.1.1.10" || ep2.IPAddress != "10.1.1.11" || ep1.EndpointGroupID != 1 || ep1.EndpointGroupKey != "web:default" {
		t.Fatalf("pool eps %+v %+v", ep1, ep2)
	}
	code, out := e.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "default", NetworkName: "n", ServiceName: "web",
		ConfigEP: model.ConfigEP{Container: "c", Host: "h"}})
	if code != http.StatusConflict || !strings.Contains(out, "exhaustion") {
		t.Fatalf("pool exhaustion: %d %s", code, out)
	}
	// Docker's "net:epg.tenant" form allocates from the pool too (none left).
	if code, _ := e.do("POST", "/plugin/allocAddress", model.AllocAddressRequest{NetworkID: "n:web.default"}); code != http.StatusConflict {
		t.Fatalf("pool alloc via NetworkID: %d", code)
	}
	var st model.EndpointGroupState
	if err := json.Unmarshal([]byte(e.rawGet("/contiv.io/state/endpointGroups/web:default")), &st); err != nil || st.EpCount != 2 {
		t.Fatalf("epg epCount %+v", st)
	}
	// Releasing an address still held by an endpoint is refused.
	if code, _ := e.do("POST", "/plugin/releaseAddress", model.ReleaseAddressRequest{NetworkID: "n.default", IPv4Address: "10.1.1.10"}); code != http.StatusConflict {
		t.Fatalf("release of a used address: %d", code)
	}
	// EPG with endpoints can't be deleted; network neither.
	if code, _ := e.do("DELETE", "/api/v1/endpointGroups/default:web/", nil); code != http.StatusConflict {
		t.Fatalf("delete epg with eps: %d", code)
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "n", EndpointID: "a"}, nil)
	if ep := e.createEP("default", "n", "web", "c", ""); ep.IPAddress != "10.1.1.10" {
		t.Fatalf("pool reuse %s", ep.IPAddress)
	}
	for _, id := range []string{"b", "c"} {
		e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "n", EndpointID: id}, nil)
	}
	if code, _ := e.do("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "n", EndpointID: "b"}); code != http.StatusNotFound {
		t.Fatalf("second delete: %d", code)
	}
	e.ok("DELETE", "/api/v1/endpointGroups/default:web/", nil, nil)
	ns = netState(t, e, "n.default")
	if ns.IPAllocMap.Test(10) || ns.IPAllocMap.Test(11) || ns.EpCount != 0 || ns.EpAddrCount != 0 {
		t.Fatalf("after epg delete: count %d/%d", ns.EpCount, ns.EpAddrCount)
	}
	// Endpoint inspect by substring.
	e.createEP("default", "n", "", "deadbeef42", "10.1.1.77")
	var ei model.EndpointInspect
	e.ok("GET", "/api/v1/inspect/endpoints/beef4/", nil, &ei)
	if ei.Oper.IpAddress[0] != "10.1.1.77" || ei.Oper.MacAddress != "02:02:0a:01:01:4d" || ei.Oper.Network != "n.default" {
		t.Fatalf("endpoint inspect %+v", ei.Oper)
	}
}

func TestIPv6(t *testing.T) {
	e := newEnv(t, "bridge")
	e.ok("POST", "/api/v1/networks/default:v6/", model.Network{TenantName: "default", NetworkName: "v6", Encap: "vxlan",
		Subnet: "10.9.0.0/24", Gateway: "10.9.0.1", Ipv6Subnet: "2001:db8::/100", Ipv6Gateway: "2001:db8::1"}, nil)
	a := e.createEP("default", "v6", "", "a", "")
	b := e.createEP("default", "v6", "", "b", "")
	if a.IPv6Address != "2001:db8::2" || b.IPv6Address != "2001:db8::3" {
		t.Fatalf("v6 addresses %s %s", a.IPv6Address, b.IPv6Address)
	}
	ns := netState(t, e, "v6.default")
	if !ns.IPv6AllocMap["::1"] || !ns.IPv6AllocMap["::2"] || ns.IPv6LastHost != "::3" || ns.IPv6Subnet != "2001:db8::" || ns.IPv6SubnetLen != 100 {
		t.Fatalf("v6 state %+v", ns)
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "v6", EndpointID: "a"}, nil)
	if ns := netState(t, e, "v6.default"); ns.IPv6AllocMap["::2"] || !ns.IPv6AllocMap["::1"] {
		t.Fatalf("v6 release %+v", ns.IPv6AllocMap)
	}
	// Next id follows the last one, then wraps to reuse ::2.
	if c := e.createEP("default", "v6", "", "c", ""); c.IPv6Address != "2001:db8::4" {
		t.Fatalf("v6 next %s", c.IPv6Address)
	}
	// A requested address another endpoint or the gateway holds is refused (found by
	// review: a second holder shared the first's traffic, and its release freed it).
	for _, held := range []string{b.IPv6Address, "2001:db8::1"} {
		code, out := e.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "default", NetworkName: "v6",
			ConfigEP: model.ConfigEP{Container: "thief", Host: "h", IPv6Address: held}})
		if code != http.StatusConflict || !strings.Contains(out, "IPv6Address") {
			t.Errorf("endpoint asking for %s (held): %d %s, want 409", held, code, out)
		}
	}
	if ns := netState(t, e, "v6.default"); !ns.IPv6AllocMap["::3"] || !ns.IPv6AllocMap["::1"] {
		t.Errorf("refused requests freed a held address: %+v", ns.IPv6AllocMap)
	}
	// Overlapping v6 subnet in the same tenant is refused.
	code, out := e.do("POST", "/api/v1/networks/default:v6b/", model.Network{TenantName: "default", NetworkName: "v6b", Encap: "vxlan",
		Subnet: "10.9.1.0/24", Ipv6Subnet: "2001:db8::/64"})
	if code != http.StatusConflict || !strings.Contains(out, "ipv6Subnet") {
		t.Fatalf("v6 overlap: %d %s", code, out)
	}
	// Tiny v6 subnet wraps and exhausts.
	e.ok("POST", "/api/v1/networks/default:v6s/", model.Network{TenantName: "default", NetworkName: "v6s", Encap: "vxlan",
		Subnet: "10.9.2.0/24", Ipv6Subnet: "2001:db9::/126"}, nil)
	for i, want := range []string{"2001:db9::1", "2001:db9::2", "2001:db9::3"} {
		if ep := e.createEP("default", "v6s", "", fmt.Sprint("s", i), ""); ep.IPv6Address != want {
			t.Fatalf("v6s %d = %s", i, ep.IPv6Address)
		}
	}
	if code, _ := e.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "default", NetworkName: "v6s",
		ConfigEP: model.ConfigEP{Container: "s9", Host: "h"}}); code != http.StatusConflict {
		t.Fatalf("v6 exhaustion: %d", code)
	}
	e.ok("POST", "/plugin/deleteEndpoint", model.DeleteEndpointRequest{TenantName: "default", NetworkName: "v6s", EndpointID: "s1"}, nil)
	if ep := e.createEP("default", "v6s", "", "s10", ""); ep.IPv6Address != "2001:db9::2" {
		t.Fatalf("v6 wrap reuse = %s", ep.IPv6Address)
	}
}

func TestTagAllocation(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "x1", "vxlan", "10.1.1.0/24", "", 0)
	e.net("default", "x2", "vxlan", "10.1.2.0/24", "", 0)
	e.net("default", "v1", "vlan", "10.1.3.0/24", "", 0)
	e.net("default", "v2", "vlan", "10.1.4.0/24", "", 10)
	for id, want := range map[string][2]int{"x1.default": {1, 1}, "x2.default": {2, 2}, "v1.default": {1, 0}, "v2.default": {10, 0}} {
		if ns := netState(t, e, id); ns.PktTag != want[0] || ns.ExtPktTag != want[1] {
			t.Fatalf("%s tags %d/%d want %v", id, ns.PktTag, ns.ExtPktTag, want)
		}
	}
	// Requested tag taken → 409, and etcd unchanged.
	before, rev := e.snapshot()
	code, out := e.do("POST", "/api/v1/networks/default:v3/", model.Network{TenantName: "default", NetworkName: "v3", Encap: "vlan", Subnet: "10.1.5.0/24", PktTag: 10})
	if code != http.StatusConflict || !strings.Contains(out, "VLAN 10 is already in use") {
		t.Fatalf("taken vlan: %d %s", code, out)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("refused network changed etcd")
	}
	// Requested VNI.
	e.net("default", "x3", "vxlan", "10.1.6.0/24", "", 5000)
	if ns := netState(t, e, "x3.default"); ns.ExtPktTag != 5000 || ns.PktTag != 3 {
		t.Fatalf("x3 tags %d/%d", ns.PktTag, ns.ExtPktTag)
	}
	// Range change excluding used tags is refused; a compatible one works.
	var g model.Global
	e.ok("GET", "/api/v1/globals/global/", nil, &g)
	bad := g
	bad.Vxlans = "1-4000"
	if code, out := e.do("POST", "/api/v1/globals/global/", bad); code != http.StatusConflict || !strings.Contains(out, "VXLAN 5000") {
		t.Fatalf("shrinking vxlans: %d %s", code, out)
	}
	bad = g
	bad.Vlans = "11-100"
	if code, _ := e.do("POST", "/api/v1/globals/global/", bad); code != http.StatusConflict {
		t.Fatalf("shrinking vlans: %d", code)
	}
	good := g
	good.Vlans = "1-100"
	e.ok("POST", "/api/v1/globals/global/", good, nil)
	if code, _ := e.do("POST", "/api/v1/networks/default:v4/", model.Network{TenantName: "default", NetworkName: "v4", Encap: "vlan", Subnet: "10.1.7.0/24", PktTag: 200}); code != http.StatusConflict {
		t.Fatalf("vlan outside range: %d", code)
	}
	// fwdMode change refused while networks exist.
	fm := good
	fm.FwdMode = "routing"
	if code, _ := e.do("POST", "/api/v1/globals/global/", fm); code != http.StatusConflict {
		t.Fatalf("fwd mode change: %d", code)
	}
	// Tags released on delete and reused.
	e.ok("DELETE", "/api/v1/networks/default:x1/", nil, nil)
	e.ok("DELETE", "/api/v1/networks/default:v1/", nil, nil)
	e.net("default", "x4", "vxlan", "10.1.8.0/24", "", 0)
	e.net("default", "v5", "vlan", "10.1.9.0/24", "", 0)
	if ns := netState(t, e, "x4.default"); ns.ExtPktTag != 1 || ns.PktTag != 1 {
		t.Fatalf("x4 reuse %d/%d", ns.PktTag, ns.ExtPktTag)
	}
	if ns := netState(t, e, "v5.default"); ns.PktTag != 1 {
		t.Fatalf("v5 reuse %d", ns.PktTag)
	}
}

// TestLocalVLANsExhausted: once every host-local VLAN (1-4094) is taken, a VXLAN network
// is still created, with no local VLAN (pktTag 0), and its deletion frees nothing it did
// not take. Before, the 4,095th VXLAN network of the cluster was refused 409.
func TestLocalVLANsExhausted(t *testing.T) {
	e := newEnv(t, "bridge")
	e.net("default", "x1", "vxlan", "10.1.1.0/24", "", 0)
	setFree := func(edit func(*model.VxlanResourceOper)) {
		t.Helper()
		err := e.store.Update(context.Background(), func(tx *state.Tx) error {
			var oper model.VxlanResourceOper
			if _, err := tx.Get(model.VxlanResOperKey, &oper); err != nil {
				return err
			}
			edit(&oper)
			return tx.Put(model.VxlanResOperKey, oper)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Every local VLAN taken (as 4,094 networks would).
	setFree(func(o *model.VxlanResourceOper) { o.FreeLocalVLANs = model.NewBitset(numVLANs) })
	e.net("default", "x2", "vxlan", "10.1.2.0/24", "", 0)
	ns := netState(t, e, "x2.default")
	if ns.PktTag != 0 || ns.ExtPktTag != 2 {
		t.Fatalf("x2 tags %d/%d, want no local VLAN and VNI 2", ns.PktTag, ns.ExtPktTag)
	}
	e.ok("DELETE", "/api/v1/networks/default:x2/", nil, nil)
	var oper model.VxlanResourceOper
	if err := e.store.Update(context.Background(), func(tx *state.Tx) error {
		_, err := tx.Get(model.VxlanResOperKey, &oper)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if oper.FreeLocalVLANs.Test(0) {
		t.Fatal("deleting a network without a local VLAN freed local VLAN 0")
	}
	// x1's VLAN freed on delete is taken again by the next network.
	e.ok("DELETE", "/api/v1/networks/default:x1/", nil, nil)
	e.net("default", "x3", "vxlan", "10.1.3.0/24", "", 0)
	if ns := netState(t, e, "x3.default"); ns.PktTag != 1 {
		t.Fatalf("x3 local VLAN %d, want 1 (freed by x1)", ns.PktTag)
	}
}

// TestConcurrentAllocTwoMasters hammers two Masters sharing one etcd: no address may be
// handed out twice.
func TestConcurrentAllocTwoMasters(t *testing.T) {
	e1 := newEnv(t, "bridge")
	e2 := newEnvOn(t, e1.store, e1.url, "bridge")
	e1.net("default", "big", "vxlan", "10.50.0.0/22", "10.50.0.1", 0)
	const n = 500
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	var errs []string
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			srv := e1.srv
			if i%2 == 1 {
				srv = e2.srv
			}
			resp, err := client.Post(srv.URL+"/plugin/allocAddress", "application/json", strings.NewReader(`{"NetworkID":"big.default"}`))
			if err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
				return
			}
			defer resp.Body.Close()
			var r model.AllocAddressResponse
			err = json.NewDecoder(resp.Body).Decode(&r)
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != http.StatusOK || err != nil {
				errs = append(errs, fmt.Sprintf("status %d %v", resp.StatusCode, err))
				return
			}
			got[r.IPv4Address]++
		}(i)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d failed allocations, first: %s", len(errs), errs[0])
	}
	for ip, c := range got {
		if c > 1 {
			t.Fatalf("%s handed out %d times", ip, c)
		}
	}
	if len(got) != n {
		t.Fatalf("%d distinct addresses, want %d", len(got), n)
	}
	ns := netState(t, e1, "big.default")
	if bits := allocBits(t, e1, "big.default"); ns.EpAddrCount != n || bits.Count() != n+3 || ns.IPAllocStore != "chunks/256" {
		t.Fatalf("state: epAddrCount %d, bits %d, store %q", ns.EpAddrCount, bits.Count(), ns.IPAllocStore)
	}
}
