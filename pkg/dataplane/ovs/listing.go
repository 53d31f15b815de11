package ovs

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// ListingKinds are the tables Listing decodes on OVS: those of the eBPF driver that have
// an OVS counterpart, and the installed flows by the object they come from.
var ListingKinds = []string{"endpoints", "networks", "peers", "ct", "services", "policy", "counters", "flows", "qos"}

// Listing implements the agent's decoded tables (netctl bpf <kind>) for OVS: what the
// driver installed, named (endpoints, networks, peers, services, policy rules, flows by
// object), the switch's conntrack table (dpctl/dump-conntrack, at most limit rows) and
// its per-table packet counters.
func (d *Driver) Listing(q dataplane.ListQuery) (dataplane.Listing, error) {
	kind, limit := q.Kind, q.Limit
	if limit <= 0 {
		limit = 1000
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	l := dataplane.Listing{Kind: kind}
	var err error
	switch kind {
	case "endpoints":
		d.listEndpoints(&l)
	case "networks":
		d.listNetworks(&l)
	case "peers":
		l.Columns = []string{"VTEP", "HOST"}
		for _, p := range d.state.Peers {
			l.Rows = append(l.Rows, []string{p.VTEP.String(), p.Host})
		}
	case "ct":
		err = d.listCT(ctx, &l, limit)
	case "services":
		d.listServices(&l)
	case "policy":
		d.listPolicy(&l, q.EPG)
	case "counters":
		err = d.listCounters(ctx, &l)
	case "flows":
		l.Columns = []string{"TABLE", "OBJECT", "FLOW", "ACTIONS"}
		for k, f := range d.comp.flows {
			l.Rows = append(l.Rows, []string{f.table.String(), unitObject(d.comp.owners[k][0]),
				fmt.Sprintf("priority=%d,%s", f.prio, strings.Join(f.matchText, ",")), f.actionsText()})
		}
	case "qos":
		var stats []meterStat
		if stats, err = d.conn.meterStats(ctx); err == nil {
			qosRows(&l, d.state, d.ports, stats)
		}
	case "nat", "netpol", "routes":
		return l, fmt.Errorf("unknown table %q on the OVS dataplane (eBPF only): want one of %s", kind, strings.Join(ListingKinds, ", "))
	default:
		return l, fmt.Errorf("unknown table %q: want one of %s", kind, strings.Join(ListingKinds, ", "))
	}
	slices.SortFunc(l.Rows, func(a, b []string) int { return slices.Compare(a, b) })
	return l, err
}

func (d *Driver) listEndpoints(l *dataplane.Listing) {
	l.Columns = []string{"NETWORK", "IP", "MAC", "EPG", "WHERE", "ENDPOINT"}
	for id, e := range d.state.Endpoints {
		l.Rows = append(l.Rows, []string{e.NetworkID, e.IP.String(), e.MAC.String(), strconv.Itoa(int(e.EPGID)),
			fmt.Sprintf("local %s (port %d)", e.HostIfName, d.ports.endpoints[id]), id})
	}
	for id, r := range d.state.RemoteEndpoints {
		l.Rows = append(l.Rows, []string{r.NetworkID, r.IP.String(), r.MAC.String(), strconv.Itoa(int(r.EPGID)),
			fmt.Sprintf("vtep %s (%s)", r.VTEP, r.Host), id})
	}
}

func (d *Driver) listNetworks(l *dataplane.Listing) {
	l.Columns = []string{"NETWORK", "KEY", "ZONE", "ENCAP", "TAG", "SUBNET", "GATEWAY", "MTU"}
	for id, n := range d.state.Networks {
		gw := ""
		if n.Gateway.IsValid() {
			gw = n.Gateway.String()
		}
		l.Rows = append(l.Rows, []string{id, strconv.Itoa(int(netKey(n))), d.zoneName(d.vrfIDs[tenantOf(id)]), string(n.Encap),
			strconv.Itoa(int(n.Tag)), n.Subnet.String(), gw, strconv.Itoa(n.MTU)})
	}
}

// zoneName is "<id> (<tenant>)" for a VRF id.
func (d *Driver) zoneName(v uint32) string {
	for t, id := range d.vrfIDs {
		if id == v {
			return fmt.Sprintf("%d (%s)", v, t)
		}
	}
	return strconv.Itoa(int(v))
}

func (d *Driver) listCT(ctx context.Context, l *dataplane.Listing, limit int) error {
	l.Columns = []string{"ZONE", "PROTO", "SOURCE", "DESTINATION", "NAT"}
	out, err := d.appctl(ctx, "dpctl/dump-conntrack")
	if err != nil {
		return err
	}
	tenants := tenantZones(d.vrfIDs)
	for _, c := range parseConntrack(out) {
		if len(l.Rows) == limit {
			l.Truncated++
			continue
		}
		zone := d.zoneName(uint32(c.zone))
		if v, ok := tenants[c.zone]; ok && uint32(c.zone) != v {
			zone = d.zoneName(v) + " inbound"
		} else if c.zone&hairpinZoneBit != 0 {
			zone = d.zoneName(uint32(c.zone&^hairpinZoneBit)) + " hairpin"
		}
		nat := ""
		if c.replySrc != c.dst {
			nat = fmt.Sprintf("dnat %v:%d", c.replySrc, c.replySport)
		}
		l.Rows = append(l.Rows, []string{zone, protoName(c.proto), fmt.Sprintf("%v:%d", c.src, c.sport), fmt.Sprintf("%v:%d", c.dst, c.dport), nat})
	}
	return nil
}

func (d *Driver) listServices(l *dataplane.Listing) {
	l.Columns = []string{"SERVICE", "ZONE", "FRONTEND", "TARGET PORT", "BACKENDS"}
	for id, s := range d.state.Services {
		tenant, _ := dataplane.ServiceTenant(id)
		for _, sp := range s.Ports {
			target := sp.TargetPort
			if target == 0 {
				target = sp.Port
			}
			var bs []string
			for _, b := range s.Backends {
				bs = append(bs, b.String())
			}
			for _, b := range s.Draining {
				bs = append(bs, b.String()+" (draining)")
			}
			l.Rows = append(l.Rows, []string{id, d.zoneName(d.vrfIDs[tenant]), fmt.Sprintf("%v:%d/%s", s.VIP, sp.Port, protoName(sp.Proto)),
				strconv.Itoa(int(target)), strings.Join(bs, ", ")})
		}
	}
}

// listPolicy lists the installed rule sets (of group only, when not 0).
func (d *Driver) listPolicy(l *dataplane.Listing, group uint16) {
	l.Columns = []string{"EPG", "DIRECTION", "#", "RULE", "ACTION", "PROTO", "PORT", "REMOTE", "PRIORITY"}
	for _, epg := range slices.Sorted(maps.Keys(d.state.Policies)) {
		if group != 0 && epg != group {
			continue
		}
		for i, r := range d.state.Policies[epg].Rules {
			dir, proto, port, remote := "egress", "any", "", ""
			if r.Ingress {
				dir = "ingress"
			}
			if r.Proto != 0 {
				proto = protoName(r.Proto)
			}
			if r.Port != 0 {
				port = strconv.Itoa(int(r.Port))
			}
			switch {
			case r.RemoteEPG != 0:
				remote = fmt.Sprintf("group %d", r.RemoteEPG)
			case r.Remote.IsValid():
				remote = r.Remote.String()
			}
			prio := 100 + 2*r.Priority
			if r.Action == dataplane.ActionDeny {
				prio++
			}
			l.Rows = append(l.Rows, []string{strconv.Itoa(int(epg)), dir, strconv.Itoa(i + 1), r.ID, string(r.Action), proto, port, remote, strconv.Itoa(prio)})
		}
	}
}

func (d *Driver) listCounters(ctx context.Context, l *dataplane.Listing) error {
	l.Columns = []string{"TABLE", "FLOWS", "PACKETS", "BYTES"}
	stats, err := d.conn.flowStats(ctx, cookieOwner, cookieOwnerMask)
	if err != nil {
		return err
	}
	type sum struct{ flows, packets, bytes uint64 }
	by := map[tableID]*sum{}
	for _, s := range stats {
		t := tableID(s.Table)
		if by[t] == nil {
			by[t] = &sum{}
		}
		by[t].flows++
		by[t].packets += s.Packets
		by[t].bytes += s.Bytes
	}
	for t, s := range by {
		l.Rows = append(l.Rows, []string{t.String(), strconv.FormatUint(s.flows, 10), strconv.FormatUint(s.packets, 10), strconv.FormatUint(s.bytes, 10)})
	}
	return nil
}
