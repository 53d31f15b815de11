package ebpf

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Verify compares the live maps with state s (what the agent applied from netmaster's
// records): every entry s implies must be in its map with the same content, and no map
// may hold an entry s does not imply. Generations and padding are not compared. Each
// concern's maps are read under that concern's read lock, one concern at a time, so no
// change of it interleaves and no apply of a concern Verify does not read (NetworkPolicy)
// is waited for.
func (d *Driver) Verify(s dataplane.State) ([]dataplane.Drift, error) {
	v := verifier{d: d}
	for _, part := range []struct {
		c    concerns
		read func()
	}{
		{cEps, func() {
			v.networks(s.Networks)
			v.endpoints(s.Endpoints, s.RemoteEndpoints)
			v.peers(s.Peers)
			v.hostRoutes(s.Endpoints)
		}},
		{cPols, func() { v.policies(s.Policies) }},
		{cSvc, func() {
			v.services(s.Services)
			v.nodePorts(s.Services)
		}},
	} {
		unlock := d.lock(0, part.c)
		err := d.check()
		if err == nil {
			part.read()
		}
		unlock()
		if err != nil {
			return nil, err
		}
	}
	sort.Slice(v.out, func(i, j int) bool {
		a, b := v.out[i], v.out[j]
		if a.Table != b.Table {
			return a.Table < b.Table
		}
		return a.Object < b.Object
	})
	return v.out, v.err
}

type verifier struct {
	d   *Driver
	out []dataplane.Drift
	err error
}

func (v *verifier) add(table, object, kind, detail string) {
	v.out = append(v.out, dataplane.Drift{Table: table, Object: object, Kind: kind, Detail: detail})
}

func (v *verifier) iterErr(err error, table string) {
	if err != nil && v.err == nil {
		v.err = fmt.Errorf("ebpf: verify %s: %w", table, err)
	}
}

func (v *verifier) networks(nets []dataplane.Network) {
	d := v.d
	want := map[uint32]contivbpfCbNetwork{}
	name := map[uint32]string{}
	for _, n := range nets {
		r, ok := d.eps.networks[n.ID]
		if !ok {
			v.add(contivbpfMapCbNetworks, n.ID, "missing", "the driver has no record of this network")
			continue
		}
		n = r.net // with the MTU default the driver applied
		e := networkValue(n, r.vrf)
		want[r.key], name[r.key] = e, n.ID
	}
	var k uint32
	var got contivbpfCbNetwork
	it := d.objs.CbNetworks.Iterate()
	seen := map[uint32]bool{}
	for it.Next(&k, &got) {
		seen[k] = true
		e, ok := want[k]
		if !ok {
			v.add(contivbpfMapCbNetworks, fmt.Sprintf("key %d", k), "extra", fmt.Sprintf("subnet %v/%d tag %d", addrFrom(got.Subnet), maskBits(got.Mask), got.Tag))
			continue
		}
		got.Generation = 0
		if got != e {
			v.add(contivbpfMapCbNetworks, name[k], "different", fmt.Sprintf("map: subnet %v/%d gw %v tag %d mtu %d flags %#x; want subnet %v/%d gw %v tag %d mtu %d flags %#x",
				addrFrom(got.Subnet), maskBits(got.Mask), addrFrom(got.Gateway), got.Tag, got.Mtu, got.Flags, addrFrom(e.Subnet), maskBits(e.Mask), addrFrom(e.Gateway), e.Tag, e.Mtu, e.Flags))
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbNetworks)
	for k := range want {
		if !seen[k] {
			v.add(contivbpfMapCbNetworks, name[k], "missing", "no map entry")
		}
	}
}

func (v *verifier) endpoints(local []dataplane.Endpoint, remote []dataplane.RemoteEndpoint) {
	d := v.d
	want := map[contivbpfCbEpKey]contivbpfCbEndpoint{}
	name := map[contivbpfCbEpKey]string{}
	ifWant := map[uint32]contivbpfCbIface{}
	ifName := map[uint32]string{}
	for _, ep := range local {
		r, ok := d.eps.endpoints[indexKey(ep.ID)]
		nr, nok := d.eps.networks[ep.NetworkID]
		if !ok || !nok {
			v.add(contivbpfMapCbEndpoints, ep.ID, "missing", "the driver has no record of this endpoint")
			continue
		}
		e := contivbpfCbEndpoint{Ifindex: uint32(r.ifindex), Epg: ep.EPGID, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL), Slot: r.slot}
		if ep.QoS.IngressRate != 0 {
			e.Flags |= uint32(contivbpfCbEpFlagsCB_EP_QOS_IN)
		}
		copy(e.Mac[:], ep.MAC)
		want[r.key], name[r.key] = e, ep.ID
		ifc := contivbpfCbIface{Net: nr.key, Ip: r.key.Ip, Epg: ep.EPGID, Slot: r.slot, Vrf: nr.vrf, Qos: qosWord(ep.QoS)}
		copy(ifc.Mac[:], ep.MAC)
		ifWant[uint32(r.ifindex)], ifName[uint32(r.ifindex)] = ifc, ep.ID
		v.qos(ep, r.slot)
	}
	for _, ep := range remote {
		r, ok := d.eps.remotes[ep.ID]
		if !ok {
			v.add(contivbpfMapCbEndpoints, ep.ID, "missing", "the driver has no record of this remote endpoint")
			continue
		}
		e := contivbpfCbEndpoint{Epg: ep.EPGID, Flags: uint32(contivbpfCbEpFlagsCB_EP_REMOTE)}
		if ep.VTEP.IsValid() {
			e.Vtep = ip4(ep.VTEP)
		}
		copy(e.Mac[:], ep.MAC)
		want[r.key], name[r.key] = e, ep.ID
	}
	var k contivbpfCbEpKey
	var got contivbpfCbEndpoint
	seen := map[contivbpfCbEpKey]bool{}
	it := d.objs.CbEndpoints.Iterate()
	for it.Next(&k, &got) {
		seen[k] = true
		e, ok := want[k]
		obj := fmt.Sprintf("%v in network key %d", addrFrom(k.Ip), k.Net)
		if !ok {
			v.add(contivbpfMapCbEndpoints, obj, "extra", "mac "+macOf(got.Mac))
			continue
		}
		got.Generation = 0
		if got != e {
			v.add(contivbpfMapCbEndpoints, name[k], "different", fmt.Sprintf("map: mac %s epg %d ifindex %d vtep %v flags %#x; want mac %s epg %d ifindex %d vtep %v flags %#x",
				macOf(got.Mac), got.Epg, got.Ifindex, addrFrom(got.Vtep), got.Flags, macOf(e.Mac), e.Epg, e.Ifindex, addrFrom(e.Vtep), e.Flags))
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbEndpoints)
	for k := range want {
		if !seen[k] {
			v.add(contivbpfMapCbEndpoints, name[k], "missing", "no map entry")
		}
	}
	iseen := map[uint32]bool{}
	v.iterErr(d.ifaces().each(func(ik uint32, ig contivbpfCbIface) {
		iseen[ik] = true
		e, ok := ifWant[ik]
		if !ok {
			v.add(contivbpfMapCbIfaces, "ifindex "+strconv.Itoa(int(ik)), "extra", fmt.Sprintf("ip %v", addrFrom(ig.Ip)))
			return
		}
		ig.Generation = 0
		if ig != e {
			v.add(contivbpfMapCbIfaces, ifName[ik], "different", fmt.Sprintf("map: ip %v mac %s epg %d qos %#x; want ip %v mac %s epg %d qos %#x",
				addrFrom(ig.Ip), macOf(ig.Mac), ig.Epg, ig.Qos, addrFrom(e.Ip), macOf(e.Mac), e.Epg, e.Qos))
		}
	}), contivbpfMapCbIfaces)
	for k := range ifWant {
		if !iseen[k] {
			v.add(contivbpfMapCbIfaces, ifName[k], "missing", "no map entry")
		}
	}
}

// qos checks the buckets at slot against ep's QoS (qos.go): the word and flag name them,
// and a bucket without its rate passes everything.
func (v *verifier) qos(ep dataplane.Endpoint, slot uint32) {
	var got contivbpfCbQosEntry
	if err := v.d.objs.CbQos.Lookup(slot, &got); err != nil {
		v.add(contivbpfMapCbQos, ep.ID, "missing", fmt.Sprintf("slot %d: %v", slot, err))
		return
	}
	for _, b := range []struct {
		dir         string
		got         contivbpfCbQosBucket
		rate, burst uint64
	}{{"egress", got.Out, ep.QoS.EgressRate, ep.QoS.EgressBurst}, {"ingress", got.In, ep.QoS.IngressRate, ep.QoS.IngressBurst}} {
		want := qosBucket(b.rate, b.burst)
		if b.got.Nsb != want.Nsb || b.got.Tau != want.Tau {
			gr, gb := b.got.rate()
			wr, wb := want.rate()
			v.add(contivbpfMapCbQos, ep.ID, "different", fmt.Sprintf("slot %d %s: map rate %d bit/s burst %d bytes; want rate %d burst %d",
				slot, b.dir, gr, gb, wr, wb))
		}
	}
}

func (v *verifier) peers(peers []dataplane.Peer) {
	want := map[uint32]string{}
	for _, p := range peers {
		if p.VTEP.Is4() {
			want[ip4(p.VTEP)] = p.Host
		}
	}
	var k uint32
	var got contivbpfCbPeer
	seen := map[uint32]bool{}
	it := v.d.objs.CbPeers.Iterate()
	for it.Next(&k, &got) {
		seen[k] = true
		if _, ok := want[k]; !ok {
			v.add(contivbpfMapCbPeers, addrFrom(k).String(), "extra", "no host has this VTEP")
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbPeers)
	for k, h := range want {
		if !seen[k] {
			v.add(contivbpfMapCbPeers, h+" "+addrFrom(k).String(), "missing", "no map entry")
		}
	}
}

func (v *verifier) policies(sets []dataplane.PolicySet) {
	d := v.d
	want := map[contivbpfCbPolKey][]rankedRule{}
	for _, p := range sets {
		if _, failed := d.pols.failed[p.EPGID]; failed {
			continue // deny-all: no rule entries by design
		}
		eg, in, err := compileRuleSet(p)
		if err != nil {
			continue
		}
		for dir, rs := range [][]rankedRule{eg, in} {
			if len(rs) > 0 {
				want[policiesKey(p.EPGID, uint8(dir))] = rs
			}
		}
	}
	dirName := func(k contivbpfCbPolKey) string {
		if k.Dir == uint8(contivbpfCbPolDirCB_DIR_INGRESS) {
			return fmt.Sprintf("epg %d ingress", k.Epg)
		}
		return fmt.Sprintf("epg %d egress", k.Epg)
	}
	var k contivbpfCbPolKey
	var got contivbpfCbPolicy
	seen := map[contivbpfCbPolKey]bool{}
	it := d.objs.CbPolicies.Iterate()
	for it.Next(&k, &got) {
		seen[k] = true
		rs, ok := want[k]
		if !ok {
			v.add(contivbpfMapCbPolicies, dirName(k), "extra", fmt.Sprintf("%d rules", got.Count))
			continue
		}
		if int(got.Count) != len(rs) {
			v.add(contivbpfMapCbPolicies, dirName(k), "different", fmt.Sprintf("map: %d rules; want %d", got.Count, len(rs)))
			continue
		}
		for i, r := range rs {
			if got.Rules[i] != r.r {
				v.add(contivbpfMapCbPolicies, dirName(k)+" #"+strconv.Itoa(i+1), "different", "rule "+r.id+" is not what the map holds at its position")
			}
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbPolicies)
	for k := range want {
		if !seen[k] {
			v.add(contivbpfMapCbPolicies, dirName(k), "missing", "no map entry")
		}
	}
}

func (v *verifier) services(svcs []dataplane.Service) {
	d := v.d
	type svcWant struct {
		id, count uint32
		name      string
		target    uint16
	}
	want := map[contivbpfCbSvcKey]svcWant{}
	backends := map[contivbpfCbBackendKey]netip.Addr{}
	bname := map[contivbpfCbBackendKey]string{}
	for _, s := range svcs {
		r, ok := d.svc.services[s.ID]
		if !ok {
			v.add(contivbpfMapCbServices, s.ID, "missing", "the driver has no record of this service")
			continue
		}
		for _, k := range r.keys {
			tp := uint16(0)
			for _, p := range r.svc.Ports {
				if nport(p.Port) == k.Port && p.Proto == k.Proto {
					tp = p.TargetPort
					if tp == 0 {
						tp = p.Port
					}
				}
			}
			want[k] = svcWant{id: r.id, count: uint32(r.nBackends), name: s.ID, target: nport(tp)}
		}
		seenB := map[netip.Addr]bool{}
		i := uint32(0)
		for _, b := range r.svc.Backends {
			if seenB[b] {
				continue
			}
			seenB[b] = true
			bk := *backendKey(r.id, i)
			backends[bk], bname[bk] = b, s.ID
			i++
		}
	}
	var k contivbpfCbSvcKey
	var got contivbpfCbSvc
	seen := map[contivbpfCbSvcKey]bool{}
	it := d.objs.CbServices.Iterate()
	for it.Next(&k, &got) {
		seen[k] = true
		obj := fmt.Sprintf("%v:%d/%s", addrFrom(k.Vip), hport(k.Port), protoName(k.Proto))
		e, ok := want[k]
		if !ok {
			v.add(contivbpfMapCbServices, obj, "extra", fmt.Sprintf("service slot %d", got.Id))
			continue
		}
		if got.Id != e.id || got.Count != e.count || got.TargetPort != e.target {
			v.add(contivbpfMapCbServices, e.name+" "+obj, "different", fmt.Sprintf("map: slot %d, %d backends, target port %d; want slot %d, %d backends, target port %d",
				got.Id, got.Count, hport(got.TargetPort), e.id, e.count, hport(e.target)))
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbServices)
	for k, e := range want {
		if !seen[k] {
			v.add(contivbpfMapCbServices, fmt.Sprintf("%s %v:%d/%s", e.name, addrFrom(k.Vip), hport(k.Port), protoName(k.Proto)), "missing", "no map entry")
		}
	}
	var bk contivbpfCbBackendKey
	var bv contivbpfCbBackend
	bseen := map[contivbpfCbBackendKey]bool{}
	it = d.objs.CbBackends.Iterate()
	for it.Next(&bk, &bv) {
		bseen[bk] = true
		b, ok := backends[bk]
		obj := fmt.Sprintf("slot %d backend %d", bk.SvcId, bk.Index)
		if !ok {
			v.add(contivbpfMapCbBackends, obj, "extra", addrFrom(bv.Ip).String())
			continue
		}
		if addrFrom(bv.Ip) != b {
			v.add(contivbpfMapCbBackends, bname[bk]+" "+obj, "different", fmt.Sprintf("map: %v; want %v", addrFrom(bv.Ip), b))
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbBackends)
	for bk, b := range backends {
		if !bseen[bk] {
			v.add(contivbpfMapCbBackends, fmt.Sprintf("%s slot %d backend %d (%v)", bname[bk], bk.SvcId, bk.Index, b), "missing", "no map entry")
		}
	}
}

func maskOf(bits int) []byte {
	m := make([]byte, 4)
	for i := 0; i < bits; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

// nodePorts compares cb_nodeports with the services' node ports.
func (v *verifier) nodePorts(svcs []dataplane.Service) {
	d := v.d
	want := map[contivbpfCbNpKey]contivbpfCbNp{}
	name := map[contivbpfCbNpKey]string{}
	for _, s := range svcs {
		r, ok := d.svc.services[s.ID]
		if !ok {
			continue // reported by services
		}
		for _, p := range r.svc.Ports {
			if p.NodePort == 0 {
				continue
			}
			k, v := nodePortEntry(r.zone, r.svc.VIP, p)
			want[k] = v
			name[k] = s.ID
		}
	}
	var k contivbpfCbNpKey
	var got contivbpfCbNp
	seen := map[contivbpfCbNpKey]bool{}
	it := d.objs.CbNodeports.Iterate()
	for it.Next(&k, &got) {
		seen[k] = true
		obj := fmt.Sprintf("node port %d/%s", hport(k.Port), protoName(k.Proto))
		e, ok := want[k]
		if !ok {
			v.add(contivbpfMapCbNodeports, obj, "extra", fmt.Sprintf("to %v:%d", addrFrom(got.Vip), hport(got.SvcPort)))
			continue
		}
		got.Generation = 0
		if got != e {
			v.add(contivbpfMapCbNodeports, name[k]+" "+obj, "different", fmt.Sprintf("map: to %v:%d zone %d; want %v:%d zone %d",
				addrFrom(got.Vip), hport(got.SvcPort), got.Zone, addrFrom(e.Vip), hport(e.SvcPort), e.Zone))
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbNodeports)
	for k := range want {
		if !seen[k] {
			v.add(contivbpfMapCbNodeports, fmt.Sprintf("%s node port %d/%s", name[k], hport(k.Port), protoName(k.Proto)), "missing", "no map entry")
		}
	}
}

// hostRoutes checks that every address the host routes to a local endpoint (cb_host_routes)
// leads to that endpoint's veth, and that no entry names an address no local endpoint has.
func (v *verifier) hostRoutes(local []dataplane.Endpoint) {
	d := v.d
	addrs := map[uint32]bool{}
	for _, ep := range local {
		addrs[ip4(ep.IP)] = true
	}
	var k uint32
	var got contivbpfCbHostRoute
	it := d.objs.CbHostRoutes.Iterate()
	for it.Next(&k, &got) {
		ip := addrFrom(k)
		ik, owned := d.eps.hostRoutes[ip]
		switch {
		case !addrs[k]:
			v.add(contivbpfMapCbHostRoutes, ip.String(), "extra", fmt.Sprintf("routed to ifindex %d, no local endpoint has it", got.Ifindex))
		case !owned || d.eps.endpoints[ik].ifindex != int(got.Ifindex):
			v.add(contivbpfMapCbHostRoutes, ip.String(), "different", fmt.Sprintf("map: ifindex %d; the driver routes it to %q", got.Ifindex, ik))
		}
	}
	v.iterErr(it.Err(), contivbpfMapCbHostRoutes)
}
