package ebpf

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Counter is a packet/byte pair summed over CPUs.
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// EndpointCounters are one local endpoint's counters summed over CPUs.
type EndpointCounters struct {
	RxPackets uint64 `json:"rxPackets"`
	RxBytes   uint64 `json:"rxBytes"`
	TxPackets uint64 `json:"txPackets"`
	TxBytes   uint64 `json:"txBytes"`
}

// ReasonCounters returns the non-zero verdict/drop counters by reason.
func (d *Driver) ReasonCounters() (map[Reason]Counter, error) {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return nil, err
	}
	return readReasons(d.objs.CbReasons)
}

// MapFullCount returns how many inserts failed because a map was full, by map name.
func (d *Driver) MapFullCount() map[string]uint64 { return d.mapFullCopy() }

type perCPUMap interface {
	Lookup(key, valueOut any) error
	BatchLookup(cursor *ebpf.MapBatchCursor, keysOut, valuesOut any, opts *ebpf.BatchOptions) (int, error)
}

// readReasons sums the per-CPU verdict counters of every reason: one batch lookup (a
// /metrics scrape is one syscall here, not one per reason), or one lookup per reason where
// the kernel has no batch operations on arrays.
func readReasons(m perCPUMap) (map[Reason]Counter, error) {
	out := map[Reason]Counter{}
	add := func(r Reason, vals []contivbpfCbCounter) {
		var c Counter
		for _, v := range vals {
			c.Packets += v.Packets
			c.Bytes += v.Bytes
		}
		if c.Packets > 0 {
			out[r] = c
		}
	}
	if ncpu, err := ebpf.PossibleCPU(); err == nil {
		keys := make([]uint32, reasonMax)
		vals := make([]contivbpfCbCounter, int(reasonMax)*ncpu)
		var cursor ebpf.MapBatchCursor
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		if (err == nil || errors.Is(err, ebpf.ErrKeyNotExist)) && n == int(reasonMax) {
			for i := 0; i < n; i++ {
				add(Reason(keys[i]), vals[i*ncpu:(i+1)*ncpu])
			}
			return out, nil
		}
	}
	for r := Reason(0); r < reasonMax; r++ {
		var vals []contivbpfCbCounter
		if err := m.Lookup(uint32(r), &vals); err != nil {
			return nil, fmt.Errorf("ebpf: read reason %v: %w", r, err)
		}
		add(r, vals)
	}
	return out, nil
}

// EndpointCounters returns the counters of the local endpoint with the given id.
func (d *Driver) EndpointCounters(id string) (EndpointCounters, error) {
	defer d.lock(0, cEps)()
	if err := d.check(); err != nil {
		return EndpointCounters{}, err
	}
	r, ok := d.eps.endpoints[indexKey(id)]
	if !ok {
		return EndpointCounters{}, fmt.Errorf("ebpf: endpoint %s is not known", id)
	}
	if r.slot == 0 {
		return EndpointCounters{}, fmt.Errorf("ebpf: endpoint %s has no counter slot (not synced since an upgrade)", id)
	}
	var vals []contivbpfCbEpStats
	if err := d.objs.CbEpCounters.Lookup(r.slot, &vals); err != nil {
		return EndpointCounters{}, fmt.Errorf("ebpf: read counters of %s: %w", id, err)
	}
	var c EndpointCounters
	for _, v := range vals {
		c.RxPackets += v.RxPackets
		c.RxBytes += v.RxBytes
		c.TxPackets += v.TxPackets
		c.TxBytes += v.TxBytes
	}
	return c, nil
}

// EndpointEntry is one cb_endpoints entry in readable form.
type EndpointEntry struct {
	Network    uint32 `json:"network"`
	IP         string `json:"ip"`
	MAC        string `json:"mac"`
	Local      bool   `json:"local"`
	Ifindex    uint32 `json:"ifindex,omitempty"`
	VTEP       string `json:"vtep,omitempty"`
	EPG        uint16 `json:"epg"`
	Generation uint32 `json:"generation"`
}

// IfaceEntry is one cb_ifaces entry in readable form.
type IfaceEntry struct {
	Ifindex    uint32 `json:"ifindex"`
	Network    uint32 `json:"network"`
	IP         string `json:"ip"`
	MAC        string `json:"mac"`
	Generation uint32 `json:"generation"`
	// QoS is what the datapath holds the endpoint to (qos.go; nil: nothing), read back
	// from its buckets.
	QoS *dataplane.QoS `json:"qos,omitempty"`
}

// NetworkEntry is one cb_networks entry in readable form.
type NetworkEntry struct {
	Key        uint32 `json:"key"`
	Encap      string `json:"encap"`
	Tag        uint32 `json:"tag"`
	Subnet     string `json:"subnet"`
	Gateway    string `json:"gateway,omitempty"`
	MTU        uint16 `json:"mtu"`
	Generation uint32 `json:"generation"`
}

// PeerEntry is one cb_peers entry.
type PeerEntry struct {
	VTEP       string `json:"vtep"`
	Generation uint32 `json:"generation"`
}

// Tables is the content of the state maps.
type Tables struct {
	Endpoints []EndpointEntry `json:"endpoints"`
	Ifaces    []IfaceEntry    `json:"ifaces"`
	Networks  []NetworkEntry  `json:"networks"`
	Peers     []PeerEntry     `json:"peers"`
}

// DumpTables reads every state map.
func (d *Driver) DumpTables() (Tables, error) {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return Tables{}, err
	}
	return d.dumpTables()
}

func (d *Driver) dumpTables() (Tables, error) {
	var t Tables
	var ek contivbpfCbEpKey
	var ev contivbpfCbEndpoint
	it := d.objs.CbEndpoints.Iterate()
	for it.Next(&ek, &ev) {
		e := EndpointEntry{Network: ek.Net, IP: addrFrom(ek.Ip).String(), MAC: macOf(ev.Mac), EPG: ev.Epg,
			Local: ev.Flags&uint32(contivbpfCbEpFlagsCB_EP_LOCAL) != 0, Generation: ev.Generation}
		if e.Local {
			e.Ifindex = ev.Ifindex
		} else {
			e.VTEP = addrFrom(ev.Vtep).String()
		}
		t.Endpoints = append(t.Endpoints, e)
	}
	if err := it.Err(); err != nil {
		return t, fmt.Errorf("ebpf: dump %s: %w", contivbpfMapCbEndpoints, err)
	}
	sort.Slice(t.Endpoints, func(i, j int) bool {
		a, b := t.Endpoints[i], t.Endpoints[j]
		return a.Network < b.Network || a.Network == b.Network && a.IP < b.IP
	})
	if err := d.ifaces().each(func(ik uint32, iv contivbpfCbIface) {
		t.Ifaces = append(t.Ifaces, IfaceEntry{Ifindex: ik, Network: iv.Net, IP: addrFrom(iv.Ip).String(), MAC: macOf(iv.Mac), Generation: iv.Generation,
			QoS: d.qosOf(iv)})
	}); err != nil {
		return t, fmt.Errorf("ebpf: %w", err)
	}
	sort.Slice(t.Ifaces, func(i, j int) bool { return t.Ifaces[i].Ifindex < t.Ifaces[j].Ifindex })
	var nk uint32
	var nv contivbpfCbNetwork
	it = d.objs.CbNetworks.Iterate()
	for it.Next(&nk, &nv) {
		e := NetworkEntry{Key: nk, Tag: nv.Tag, MTU: nv.Mtu, Generation: nv.Generation, Encap: "vxlan",
			Subnet: fmt.Sprintf("%v/%d", addrFrom(nv.Subnet), maskBits(nv.Mask))}
		if nv.Encap == uint8(contivbpfCbEncapCB_ENCAP_VLAN) {
			e.Encap = "vlan"
		}
		if nv.Gateway != 0 {
			e.Gateway = addrFrom(nv.Gateway).String()
		}
		t.Networks = append(t.Networks, e)
	}
	if err := it.Err(); err != nil {
		return t, fmt.Errorf("ebpf: dump %s: %w", contivbpfMapCbNetworks, err)
	}
	sort.Slice(t.Networks, func(i, j int) bool { return t.Networks[i].Key < t.Networks[j].Key })
	var pk uint32
	var pv contivbpfCbPeer
	it = d.objs.CbPeers.Iterate()
	for it.Next(&pk, &pv) {
		t.Peers = append(t.Peers, PeerEntry{VTEP: addrFrom(pk).String(), Generation: pv.Generation})
	}
	if err := it.Err(); err != nil {
		return t, fmt.Errorf("ebpf: dump %s: %w", contivbpfMapCbPeers, err)
	}
	sort.Slice(t.Peers, func(i, j int) bool { return t.Peers[i].VTEP < t.Peers[j].VTEP })
	return t, nil
}

func maskBits(m uint32) int {
	a := addrFrom(m).As4()
	n := 0
	for _, b := range a {
		for i := 7; i >= 0; i-- {
			if b&(1<<i) != 0 {
				n++
			}
		}
	}
	return n
}

// Status implements dataplane.Driver: the driver's own tcx attachments (bpftool 7.1
// cannot list them), the state maps and the counters.
func (d *Driver) Status(ctx context.Context) (dataplane.Status, error) {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return dataplane.Status{}, err
	}
	st := dataplane.Status{Dataplane: "ebpf", Tables: map[string]any{}, Counters: map[string]any{}}
	d.linkMu.Lock()
	for _, name := range sortedKeys(d.links) {
		a := d.links[name]
		att := dataplane.Attachment{Interface: name, Hook: "tcx-ingress", Program: a.program}
		if a.hook != "" {
			att.Hook = a.hook
		}
		if info, err := a.link.Info(); err == nil {
			att.ID = uint32(info.ID)
		}
		st.Attachments = append(st.Attachments, att)
	}
	d.linkMu.Unlock()
	t, err := d.dumpTables()
	if err != nil {
		return st, err
	}
	st.Tables["endpoints"] = t.Endpoints
	st.Tables["ifaces"] = t.Ifaces
	st.Tables["networks"] = t.Networks
	st.Tables["peers"] = t.Peers
	pols := map[string]int{}
	d.pols.mu.RLock()
	for epg, p := range d.pols.policies {
		pols[fmt.Sprint(epg)] = len(p.Rules)
	}
	d.pols.mu.RUnlock()
	st.Tables["policies"] = pols // rules per endpoint group
	svcs := map[string]any{}
	d.svc.mu.RLock()
	for id, r := range d.svc.services {
		svcs[id] = map[string]any{"vip": r.svc.VIP.String(), "ports": r.svc.Ports, "backends": r.svc.Backends, "slot": r.id}
	}
	d.svc.mu.RUnlock()
	st.Tables["services"] = svcs
	st.Tables["pinRoot"] = d.cfg.PinRoot
	st.Tables["generation"] = d.generation()
	reasons, err := readReasons(d.objs.CbReasons)
	if err != nil {
		return st, err
	}
	rc := map[string]Counter{}
	for r, c := range reasons {
		rc[r.String()] = c
	}
	st.Counters["reasons"] = rc
	st.Counters["mapFull"] = d.mapFullCopy()
	return st, nil
}

// Counters are the driver's numeric counters for the agent's /metrics: packets and bytes
// by verdict/drop reason and failed inserts by map. O(1) in the size of the state: no
// state map is read, and no concern's lock is taken (statMu only to copy the map-full
// counts).
func (d *Driver) Counters(ctx context.Context) (map[string]float64, error) {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for m, n := range d.mapFullCopy() {
		out["map_full_"+m] = float64(n)
	}
	reasons, err := readReasons(d.objs.CbReasons)
	if err != nil {
		return nil, err
	}
	for r, c := range reasons {
		out[r.String()+"_packets"] = float64(c.Packets)
		out[r.String()+"_bytes"] = float64(c.Bytes)
	}
	return out, ctx.Err()
}
