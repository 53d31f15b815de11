package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// ListingKinds are the tables Listing decodes.
var ListingKinds = []string{"endpoints", "networks", "peers", "ct", "nat", "services", "policy", "netpol", "routes", "counters", "qos"}

// listNames is what the driver knows about the names behind map keys, copied under the
// driver lock so that reading the maps (which can be large) does not hold it.
type listNames struct {
	netByKey map[uint32]string // cb_networks key → network id
	zoneOf   map[uint32]string // routing domain → tenant
	epByKey  map[contivbpfCbEpKey]string
	ifName   map[uint32]string // ifindex → host interface
	hostOf   map[netip.Addr]string
	svcByID  map[uint32]string
	podPol   map[contivbpfCbKpodKey]podPolName // the NetworkPolicy layer's pods
	vrfOf    map[uint32]uint32                 // cb_networks key → routing domain
	netpol   bool                              // some pod has a NetworkPolicy entry
	mapFull  map[string]uint64
}

// It takes each concern's read lock in turn, never two at once: a listing waits only for
// an apply of a concern it names, and only for as long as copying the names takes.
func (d *Driver) names() (listNames, error) {
	if err := d.check(); err != nil {
		return listNames{}, err
	}
	n := listNames{netByKey: map[uint32]string{}, zoneOf: map[uint32]string{}, epByKey: map[contivbpfCbEpKey]string{},
		ifName: map[uint32]string{}, hostOf: map[netip.Addr]string{}, svcByID: map[uint32]string{},
		vrfOf: map[uint32]uint32{}, podPol: map[contivbpfCbKpodKey]podPolName{}}
	d.eps.mu.RLock()
	for id, r := range d.eps.networks {
		n.netByKey[r.key] = id
		n.vrfOf[r.key] = r.vrf
		if _, tenant, ok := strings.Cut(id, "."); ok {
			n.zoneOf[r.vrf] = tenant
		}
	}
	for _, r := range d.eps.endpoints {
		n.epByKey[r.key] = r.id
		n.ifName[uint32(r.ifindex)] = r.hostIf
	}
	for _, r := range d.eps.remotes {
		n.epByKey[r.key] = r.ep.ID
	}
	for host, vtep := range d.eps.peers {
		n.hostOf[vtep] = host
	}
	d.eps.mu.RUnlock()
	d.svc.mu.RLock()
	for id, r := range d.svc.services {
		n.svcByID[r.id] = id
	}
	d.svc.mu.RUnlock()
	d.np.mu.RLock()
	defer d.np.mu.RUnlock()
	n.netpol = len(d.np.podPols) > 0
	for id, r := range d.np.podPols {
		pn := podPolName{id: id}
		if r.failed != nil {
			pn.failed = r.failed.Error()
		}
		n.podPol[r.key] = pn
	}
	n.mapFull = d.mapFullCopy()
	return n, nil
}

func protoName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return strconv.Itoa(int(p))
}

func (n listNames) network(key uint32) string {
	if id, ok := n.netByKey[key]; ok {
		return id
	}
	return fmt.Sprintf("#%d", key)
}

func (n listNames) zone(z uint32) string {
	if t, ok := n.zoneOf[z]; ok {
		return fmt.Sprintf("%d (%s)", z, t)
	}
	return strconv.Itoa(int(z))
}

// space names a conntrack or NAT key's zone and kind: a node port flow's says so.
func (n listNames) space(z uint32, kind uint8) string {
	if kind == ctKindNodePort {
		return n.zone(z) + " nodeport"
	}
	return n.zone(z)
}

// Listing decodes one of ListingKinds from the live maps. limit caps the rows of the
// conntrack listing (0: 1,000); other tables are bounded by the state they mirror.
func (d *Driver) Listing(q dataplane.ListQuery) (dataplane.Listing, error) {
	defer d.lock(0, 0)()
	kind, limit := q.Kind, q.Limit
	if kind == "policy" {
		// Names only the rule sets (a listing of one group reads only its entries):
		// probes poll it while rules change.
		l := dataplane.Listing{Kind: kind}
		return l, d.listPolicy(&l, q.EPG)
	}
	n, err := d.names()
	if err != nil {
		return dataplane.Listing{}, err
	}
	if limit <= 0 {
		limit = 1000
	}
	l := dataplane.Listing{Kind: kind}
	switch kind {
	case "endpoints":
		err = d.listEndpoints(n, &l)
	case "networks":
		err = d.listNetworks(n, &l)
	case "peers":
		err = d.listPeers(n, &l)
	case "ct":
		err = d.listCT(n, &l, limit)
	case "nat":
		err = d.listNAT(n, &l, limit)
	case "services":
		err = d.listServices(n, &l)
	case "netpol":
		err = d.listNetpol(n, &l)
	case "routes":
		err = d.listRoutes(n, &l)
	case "counters":
		err = d.listCounters(n, &l)
	case "qos":
		err = d.listQoS(n, &l)
	default:
		return l, fmt.Errorf("unknown table %q: want one of %s", kind, strings.Join(ListingKinds, ", "))
	}
	return l, err
}

func sortRows(rows [][]string) {
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		for k := range a {
			if a[k] != b[k] {
				return a[k] < b[k]
			}
		}
		return false
	})
}

// listRoutes decodes cb_bgp_routes (routes the host's BGP speaker learned, docs/bgp.md).
func (d *Driver) listRoutes(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"PREFIX", "NEXT HOP", "DEVICE"}
	var k contivbpfCbBgpKey
	var v contivbpfCbBgpRoute
	it := d.objs.CbBgpRoutes.Iterate()
	for it.Next(&k, &v) {
		dev := n.ifName[v.Ifindex]
		if v.Ifindex == uint32(d.upIndex) {
			dev = d.cfg.VLANIf
		}
		if dev == "" {
			dev = fmt.Sprintf("ifindex %d", v.Ifindex)
		}
		l.Rows = append(l.Rows, []string{netip.PrefixFrom(addrFrom(k.Addr), int(k.Prefixlen)).String(), addrFrom(v.Nexthop).String(), dev})
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbBgpRoutes)
}

func (d *Driver) listEndpoints(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"NETWORK", "IP", "MAC", "EPG", "WHERE", "ENDPOINT"}
	var k contivbpfCbEpKey
	var v contivbpfCbEndpoint
	it := d.objs.CbEndpoints.Iterate()
	for it.Next(&k, &v) {
		where := ""
		if v.Flags&uint32(contivbpfCbEpFlagsCB_EP_LOCAL) != 0 {
			where = "local " + n.ifName[v.Ifindex]
			if n.ifName[v.Ifindex] == "" {
				where = fmt.Sprintf("local ifindex %d", v.Ifindex)
			}
		} else {
			vtep := addrFrom(v.Vtep)
			where = "vtep " + vtep.String()
			if h := n.hostOf[vtep]; h != "" {
				where += " (" + h + ")"
			}
		}
		l.Rows = append(l.Rows, []string{n.network(k.Net), addrFrom(k.Ip).String(), macOf(v.Mac), strconv.Itoa(int(v.Epg)), where, n.epByKey[k]})
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbEndpoints)
}

func (d *Driver) listNetworks(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"NETWORK", "KEY", "ZONE", "ENCAP", "TAG", "SUBNET", "GATEWAY", "MTU"}
	var k uint32
	var v contivbpfCbNetwork
	it := d.objs.CbNetworks.Iterate()
	for it.Next(&k, &v) {
		encap, gw := "vxlan", ""
		if v.Encap == uint8(contivbpfCbEncapCB_ENCAP_VLAN) {
			encap = "vlan"
		}
		if v.Gateway != 0 {
			gw = addrFrom(v.Gateway).String()
		}
		l.Rows = append(l.Rows, []string{n.network(k), strconv.Itoa(int(k)), n.zone(v.Vrf), encap, strconv.Itoa(int(v.Tag)),
			fmt.Sprintf("%v/%d", addrFrom(v.Subnet), maskBits(v.Mask)), gw, strconv.Itoa(int(v.Mtu))})
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbNetworks)
}

func (d *Driver) listPeers(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"VTEP", "HOST"}
	var k uint32
	var v contivbpfCbPeer
	it := d.objs.CbPeers.Iterate()
	for it.Next(&k, &v) {
		a := addrFrom(k)
		l.Rows = append(l.Rows, []string{a.String(), n.hostOf[a]})
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbPeers)
}

func (d *Driver) listCT(n listNames, l *dataplane.Listing, limit int) error {
	l.Columns = []string{"ZONE", "PROTO", "SOURCE", "DESTINATION", "STATE", "FLAGS", "NAT", "SERVICE", "EXPIRES"}
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	stamps, err := newStampView(&d.objs, n.vrfOf, n.netpol)
	if err != nil {
		return err
	}
	var k contivbpfCbCtKey
	var v contivbpfCbCtEntry
	it := d.objs.CbCt.Iterate()
	for it.Next(&k, &v) {
		if len(l.Rows) >= limit {
			l.Truncated++
			continue
		}
		ep := func(ip uint32, port uint16) string {
			a := addrFrom(ip).String()
			if k.Proto == 6 || k.Proto == 17 {
				return a + ":" + strconv.Itoa(int(hport(port)))
			}
			return a
		}
		state := ctStateName(ctStateOf(v))
		var flags []string
		for _, f := range []struct {
			bit  contivbpfCbCtFlags
			name string
		}{{contivbpfCbCtFlagsCB_CT_ALLOWED, "allowed"}, {contivbpfCbCtFlagsCB_CT_SVC, "service"}, {contivbpfCbCtFlagsCB_CT_DNAT, "dnat"},
			{contivbpfCbCtFlagsCB_CT_HAIRPIN, "hairpin"}, {contivbpfCbCtFlagsCB_CT_NODEPORT, "nodeport"}, {contivbpfCbCtFlagsCB_CT_SHADOW, "shadowed"},
			{contivbpfCbCtFlagsCB_CT_TCP_REF_OLD, "tcp-ref-old"}} {
			if v.Flags&uint8(f.bit) != 0 {
				flags = append(flags, f.name)
			}
		}
		if v.Flags&uint8(contivbpfCbCtFlagsCB_CT_ALLOWED|contivbpfCbCtFlagsCB_CT_SVC) == 0 {
			flags = append([]string{"denied"}, flags...) // a policy verdict; service entries carry none
		}
		if v.Flags&uint8(contivbpfCbCtFlagsCB_CT_ALLOWED) != 0 && stamps.stale(k, v.Epoch) {
			flags = append(flags, "stale-epoch")
		}
		nat := ""
		if v.NatIp != 0 {
			nat = ep(v.NatIp, v.NatPort)
			if v.NatNet != 0 {
				nat += " on " + n.network(v.NatNet)
			}
		}
		svc := ""
		if v.SvcId != 0 && v.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) != 0 { // (TCP_REF_OLD: a sequence number)
			svc = n.svcByID[v.SvcId]
			if svc == "" {
				svc = fmt.Sprintf("#%d", v.SvcId)
			}
		}
		l.Rows = append(l.Rows, []string{n.space(k.Zone, k.Kind), protoName(k.Proto), ep(k.Saddr, k.Sport), ep(k.Daddr, k.Dport),
			state, strings.Join(flags, ","), nat, svc, expiresIn(v.Expires, now)})
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbCt)
}

func (d *Driver) listServices(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"SERVICE", "ZONE", "FRONTEND", "TARGET PORT", "BACKENDS"}
	backends := map[uint32][]string{}
	var bk contivbpfCbBackendKey
	var bv contivbpfCbBackend
	it := d.objs.CbBackends.Iterate()
	type slot struct {
		i  uint32
		ip string
	}
	bySvc := map[uint32][]slot{}
	for it.Next(&bk, &bv) {
		bySvc[bk.SvcId] = append(bySvc[bk.SvcId], slot{bk.Index, addrFrom(bv.Ip).String()})
	}
	if err := iterErr(it.Err(), contivbpfMapCbBackends); err != nil {
		return err
	}
	for id, ss := range bySvc {
		sort.Slice(ss, func(i, j int) bool { return ss[i].i < ss[j].i })
		for _, s := range ss {
			backends[id] = append(backends[id], s.ip)
		}
	}
	var k contivbpfCbSvcKey
	var v contivbpfCbSvc
	it = d.objs.CbServices.Iterate()
	for it.Next(&k, &v) {
		name := n.svcByID[v.Id]
		if name == "" {
			name = fmt.Sprintf("#%d", v.Id)
		}
		b := backends[v.Id]
		if len(b) > int(v.Count) {
			b = b[:v.Count]
		}
		l.Rows = append(l.Rows, []string{name, n.zone(k.Zone), fmt.Sprintf("%v:%d/%s", addrFrom(k.Vip), hport(k.Port), protoName(k.Proto)),
			strconv.Itoa(int(hport(v.TargetPort))), strings.Join(b, " ")})
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbServices)
}

// listPolicy decodes the rule sets in cb_policies (of group epg only, when not 0), each
// entry named by the agent's rule it was compiled from, and the groups failed closed.
func (d *Driver) listPolicy(l *dataplane.Listing, epg uint16) error {
	l.Columns = []string{"EPG", "DIRECTION", "#", "RULE", "ACTION", "PROTO", "PORT", "REMOTE", "FLAGS"}
	if err := d.check(); err != nil {
		return err
	}
	d.pols.mu.RLock()
	sets := map[uint16]dataplane.PolicySet{}
	failed := map[uint16]string{}
	for g, p := range d.pols.policies {
		if epg == 0 || g == epg {
			sets[g] = p
		}
	}
	for g, err := range d.pols.failed {
		if epg == 0 || g == epg {
			failed[g] = err.Error()
		}
	}
	d.pols.mu.RUnlock()
	type row struct {
		epg uint16
		dir uint8
		i   int
		r   []string
	}
	var rows []row
	compiled := map[uint16][2][]rankedRule{} // by group: egress, ingress
	add := func(k contivbpfCbPolKey, v *contivbpfCbPolicy) {
		c, ok := compiled[k.Epg]
		if !ok {
			if p, known := sets[k.Epg]; known {
				if eg, in, err := compileRuleSet(p); err == nil {
					c = [2][]rankedRule{eg, in}
				}
			}
			compiled[k.Epg] = c
		}
		want := c[0]
		dir := "egress"
		if k.Dir == uint8(contivbpfCbPolDirCB_DIR_INGRESS) {
			want, dir = c[1], "ingress"
		}
		for i := 0; i < int(v.Count) && i < len(v.Rules); i++ {
			r := v.Rules[i]
			id := "(not in the agent's state)"
			if i < len(want) && want[i].r == r {
				id = want[i].id
			}
			action := map[uint8]string{uint8(contivbpfCbRuleActionCB_ACT_ALLOW): "allow", uint8(contivbpfCbRuleActionCB_ACT_DENY): "deny"}[r.Action]
			port := "any"
			if r.Port != 0 {
				port = strconv.Itoa(int(hport(r.Port)))
			}
			var remote []string
			if r.RemoteMask != 0 || r.RemoteIp != 0 {
				remote = append(remote, fmt.Sprintf("%v/%d", addrFrom(r.RemoteIp), maskBits(r.RemoteMask)))
			}
			if r.RemoteEpg != 0 {
				remote = append(remote, fmt.Sprintf("epg %d", r.RemoteEpg))
			}
			if len(remote) == 0 {
				remote = []string{"any"}
			}
			flags := ""
			if r.Flags&1 != 0 {
				flags = "syn-only"
			}
			rows = append(rows, row{k.Epg, k.Dir, i, []string{strconv.Itoa(int(k.Epg)), dir, strconv.Itoa(i + 1), id,
				action + " (prio " + strconv.Itoa(int(r.Prio)/2) + ")", protoName(r.Proto), port, strings.Join(remote, " "), flags}})
		}
	}
	var v contivbpfCbPolicy
	if epg != 0 {
		for _, dir := range []uint8{uint8(contivbpfCbPolDirCB_DIR_EGRESS), uint8(contivbpfCbPolDirCB_DIR_INGRESS)} {
			k := policiesKey(epg, dir)
			switch err := d.objs.CbPolicies.Lookup(&k, &v); {
			case err == nil:
				add(k, &v)
			case !errors.Is(err, ebpf.ErrKeyNotExist):
				return fmt.Errorf("lookup %s: %w", contivbpfMapCbPolicies, err)
			}
		}
	} else {
		var k contivbpfCbPolKey
		it := d.objs.CbPolicies.Iterate()
		for it.Next(&k, &v) {
			add(k, &v)
		}
		if err := iterErr(it.Err(), contivbpfMapCbPolicies); err != nil {
			return err
		}
	}
	for g, why := range failed {
		rows = append(rows, row{g, 2, 0, []string{strconv.Itoa(int(g)), "both", "-", "(failed closed: " + why + ")", "deny", "any", "any", "any", ""}})
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.epg != b.epg {
			return a.epg < b.epg
		}
		if a.dir != b.dir {
			return a.dir > b.dir // ingress first
		}
		return a.i < b.i
	})
	for _, r := range rows {
		l.Rows = append(l.Rows, r.r)
	}
	return nil
}

func (d *Driver) listCounters(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"COUNTER", "KIND", "PACKETS", "BYTES"}
	reasons, err := readReasons(d.objs.CbReasons)
	if err != nil {
		return err
	}
	for r, c := range reasons {
		kind := "verdict"
		if r.IsDrop() {
			kind = "drop"
		}
		l.Rows = append(l.Rows, []string{r.String(), kind, strconv.FormatUint(c.Packets, 10), strconv.FormatUint(c.Bytes, 10)})
	}
	for m, c := range n.mapFull {
		l.Rows = append(l.Rows, []string{"map_full " + m, "insert failed", strconv.FormatUint(c, 10), ""})
	}
	sortRows(l.Rows)
	return nil
}

func iterErr(err error, mapName string) error {
	if err != nil {
		return fmt.Errorf("ebpf: read %s: %w", mapName, err)
	}
	return nil
}

func ctStateName(s uint8) string {
	switch s {
	case uint8(contivbpfCbCtStateCB_CTS_NEW):
		return "new"
	case uint8(contivbpfCbCtStateCB_CTS_ESTABLISHED):
		return "established"
	case uint8(contivbpfCbCtStateCB_CTS_CLOSING):
		return "closing"
	}
	return strconv.Itoa(int(s))
}

// expiresIn renders a cb_now() deadline relative to now.
func expiresIn(deadline, now uint64) string {
	if deadline <= now {
		return "expired"
	}
	return (time.Duration(deadline-now) / time.Second * time.Second).String()
}

// listNAT decodes the egress NAT flows (cb_snat): the endpoint's side, the remote side and
// the host port the flow uses.
func (d *Driver) listNAT(n listNames, l *dataplane.Listing, limit int) error {
	l.Columns = []string{"ZONE", "PROTO", "ENDPOINT", "REMOTE", "NAT", "STATE", "NETWORK", "EXPIRES"}
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	natIP := ""
	if d.egress.ip.IsValid() {
		natIP = d.egress.ip.String()
	}
	var k contivbpfCbSnatKey
	var v contivbpfCbSnatEntry
	it := d.objs.CbSnat.Iterate()
	for it.Next(&k, &v) {
		if len(l.Rows) >= limit {
			l.Truncated++
			continue
		}
		port := func(p uint16) string {
			if k.Proto == 1 {
				return " id " + strconv.Itoa(int(hport(p)))
			}
			return ":" + strconv.Itoa(int(hport(p)))
		}
		l.Rows = append(l.Rows, []string{n.space(k.Zone, k.Kind), protoName(k.Proto), addrFrom(k.Saddr).String() + port(k.Sport),
			addrFrom(k.Daddr).String() + port(k.Dport), natIP + port(v.NatPort), ctStateName(v.State), n.network(v.Net),
			expiresIn(v.Expires, now)})
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("ebpf: read %s: %w", contivbpfMapCbSnat, err)
	}
	sortRows(l.Rows)
	return nil
}

// podPolName names a cb_kpods entry.
type podPolName struct {
	id     string
	failed string
}

// listNetpol decodes the NetworkPolicy layer: one row per rule of each pod's isolated
// directions (an isolated direction without rules is one row "(no rule: deny all)").
func (d *Driver) listNetpol(n listNames, l *dataplane.Listing) error {
	l.Columns = []string{"ZONE", "POD ADDRESS", "ENDPOINT", "DIRECTION", "SET", "#", "REMOTE", "PROTO", "PORTS"}
	var k contivbpfCbKpodKey
	var v contivbpfCbKpod
	type row struct {
		zone uint32
		addr netip.Addr
		dir  string
		i    int
		r    []string
	}
	var rows []row
	it := d.objs.CbKpods.Iterate()
	for it.Next(&k, &v) {
		addr := addrFrom(k.Addr)
		name := n.podPol[k]
		ep := name.id
		if ep == "" {
			ep = "(not in the agent's state)"
		} else if name.failed != "" {
			ep += " (failed closed: " + name.failed + ")"
		}
		for _, dir := range []struct {
			name string
			flag uint32
			set  uint32
		}{{"ingress", kpodInIsolated, v.InSet}, {"egress", kpodOutIsolated, v.OutSet}} {
			if v.Flags&dir.flag == 0 {
				continue
			}
			base := []string{n.zone(k.Zone), addr.String(), ep, dir.name, strconv.Itoa(int(dir.set))}
			var set contivbpfCbKset
			if dir.set == 0 || d.objs.CbKsets.Lookup(&dir.set, &set) != nil || set.Count == 0 {
				rows = append(rows, row{k.Zone, addr, dir.name, 0, append(base, "-", "(no rule: deny all)", "", "")})
				continue
			}
			for i := 0; i < int(set.Count) && i < len(set.Rules); i++ {
				r := set.Rules[i]
				ports := "any"
				if r.PortMin != 0 {
					ports = strconv.Itoa(int(r.PortMin))
					if r.PortMax != r.PortMin {
						ports += "-" + strconv.Itoa(int(r.PortMax))
					}
				}
				rows = append(rows, row{k.Zone, addr, dir.name, i, append(base, strconv.Itoa(i+1),
					fmt.Sprintf("%v/%d", addrFrom(r.RemoteIp), maskBits(r.RemoteMask)), protoName(r.Proto), ports)})
			}
		}
	}
	if err := iterErr(it.Err(), contivbpfMapCbKpods); err != nil {
		return err
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		switch {
		case a.zone != b.zone:
			return a.zone < b.zone
		case a.addr != b.addr:
			return a.addr.Less(b.addr)
		case a.dir != b.dir:
			return a.dir > b.dir // ingress first
		}
		return a.i < b.i
	})
	for _, r := range rows {
		l.Rows = append(l.Rows, r.r)
	}
	return nil
}
