package ebpf

import (
	"reflect"
	"unsafe"

	"github.com/cilium/ebpf"
)

// Map owners: every map of the build is declared by exactly one owner, in one place, with
// the Go types the agent encodes its entries with, how its stale entries are collected,
// and how it migrates (migrate.go). Sync's map sweep (sweepMaps) is a loop over the
// owners in the order of mapOwners; planMigrations asks them for migration groups,
// converters and the legacy node port zone fix; New asks them for the sizes that follow
// MapEntries. TestMapOwnersCoverBuild fails when a map of the loaded collection has no
// owner, so a new map cannot be forgotten by the sweep or an upgrade.

// ownedMap is one map as its owner declares it.
type ownedMap struct {
	name string
	// key and value are the Go types the agent encodes the map's entries with (both nil
	// for a stream: no entries); their sizes match the map's (TestMapOwnersCoverBuild).
	key, value reflect.Type
	// scale sizes the map to scale × MapEntries (0: the size bpf/ declares).
	scale uint32
	// kind, when set, says where entries name a node port flow's zone: a build before the
	// kind field is fixed up as it migrates (kindfix.go).
	kind *kindSite
	// convert converts entries whose conversion field names cannot express (nil: by
	// field name, fieldConverter).
	convert entryConverter
}

// mapOwner owns some maps: their garbage collection and their migration.
type mapOwner struct {
	concern string // what writes the maps (the concern of the lock order, or the datapath)
	maps    []ownedMap
	// sweep deletes what older generations left in the maps, and does what must follow
	// (Sync, every concern's write lock held, after the indexes' own sweep). nil: the
	// maps have no generation sweep, for the reason gc gives.
	sweep func(d *Driver) []error
	gc    string
	// together: the programs read the maps as one structure, so they migrate together
	// (migrationGroups).
	together bool
}

// entry declares map name with key type K and value type V.
func entry[K, V any](name string) ownedMap {
	return ownedMap{name: name, key: reflect.TypeFor[K](), value: reflect.TypeFor[V]()}
}

// sized is m sized to scale × MapEntries.
func (m ownedMap) sized(scale uint32) ownedMap { m.scale = scale; return m }

// nodePortZone is m with the legacy node port zone at s fixed on migration.
func (m ownedMap) nodePortZone(s kindSite) ownedMap { m.kind = &s; return m }

// genOwner owns one map whose values carry the generation they were written in: an entry
// of another generation than the driver's is stale and deleted.
func genOwner[K, V any](concern, name string, scale uint32, gen func(*V) uint32) mapOwner {
	return mapOwner{
		concern: concern,
		maps:    []ownedMap{entry[K, V](name).sized(scale)},
		sweep: func(d *Driver) []error {
			return sweepGen(*d.mapField(name), name, d.gen, func(_ *K, v *V) uint32 { return gen(v) })
		},
	}
}

// mapOwners is every owner, in the order Sync sweeps them: endpoints, interfaces,
// networks and peers; group policy (its rule lists, then the compiled heads with their
// versions' keys); the NetworkPolicy layer (pods, then a stale set's head before its
// prefixes, so it never admits more than it did, then its record); services, backends,
// VIPs, then memberships (each service that lost one has its revision bumped after the
// delete); the groups' state; routes, node ports, tenant networks, host routes. The
// owners without a sweep follow.
func mapOwners() []mapOwner {
	var (
		ct contivbpfCbCtKey
		sn contivbpfCbSnatKey
		rv contivbpfCbSnatRval
		fr contivbpfCbFragKey
	)
	frag := kindSite{zoneOff: unsafe.Offsetof(fr.Zone), kindOff: unsafe.Offsetof(fr.Kind)}
	return []mapOwner{
		genOwner[contivbpfCbEpKey]("endpoints", contivbpfMapCbEndpoints, 1,
			func(v *contivbpfCbEndpoint) uint32 { return v.Generation }),
		{
			concern: "endpoints",
			maps: []ownedMap{
				entry[uint32, contivbpfCbIface](contivbpfMapCbIfaceDirect),
				entry[uint32, contivbpfCbIface](contivbpfMapCbIfaces).sized(1),
			},
			sweep: (*Driver).sweepIfaces,
		},
		genOwner[uint32]("networks", contivbpfMapCbNetworks, 0,
			func(v *contivbpfCbNetwork) uint32 { return v.Generation }),
		genOwner[uint32]("peers", contivbpfMapCbPeers, 0,
			func(v *contivbpfCbPeer) uint32 { return v.Generation }),
		genOwner[contivbpfCbPolKey]("policy", contivbpfMapCbPolicies, 0,
			func(v *contivbpfCbPolicy) uint32 { return v.Generation }),
		{
			concern: "policy",
			maps: []ownedMap{
				entry[contivbpfCbPolKey, contivbpfCbPolHead](contivbpfMapCbPolHeads),
				entry[contivbpfCbPolRuleKey, contivbpfCbPolRule](contivbpfMapCbPolRules).sized(1),
				entry[contivbpfCbPolCidrKey, contivbpfCbPolCidr](contivbpfMapCbPolCidrs).sized(1),
			},
			// A stale head, then every key and prefix of a version no head names.
			sweep: func(d *Driver) []error { return d.pols.pol.sweep(d.gen) },
			// The heads name versions whose keys live in the other two: a program
			// reading a new head from a shared heads map missed every key.
			together: true,
		},
		genOwner[contivbpfCbKpodKey]("netpol", contivbpfMapCbKpods, 0,
			func(v *contivbpfCbKpod) uint32 { return v.Generation }),
		{
			concern: "netpol",
			maps: []ownedMap{
				entry[uint32, contivbpfCbKsetHead](contivbpfMapCbKsetHeads),
				entry[contivbpfCbKcidrKey, contivbpfCbKcidr](contivbpfMapCbKcidrs).sized(4),
			},
			// A set no pod uses any more: its head, then its prefixes.
			sweep: func(d *Driver) []error {
				return d.sweepKSetOrphans(func(id uint32) bool { _, ok := d.np.ksetIDs[id]; return ok })
			},
		},
		genOwner[uint32]("netpol", contivbpfMapCbKsets, 0,
			func(v *contivbpfCbKset) uint32 { return v.Generation }),
		genOwner[contivbpfCbSvcKey]("services", contivbpfMapCbServices, 0,
			func(v *contivbpfCbSvc) uint32 { return v.Generation }),
		genOwner[contivbpfCbBackendKey]("services", contivbpfMapCbBackends, 1,
			func(v *contivbpfCbBackend) uint32 { return v.Generation }),
		genOwner[contivbpfCbVipKey]("services", contivbpfMapCbVips, 0,
			func(v *contivbpfCbVip) uint32 { return v.Generation }),
		{
			concern: "services",
			maps: []ownedMap{
				entry[contivbpfCbMemberKey, contivbpfCbMember](contivbpfMapCbMembers),
				entry[uint32, contivbpfCbSvcRev](contivbpfMapCbSvcRevs),
			},
			sweep: (*Driver).sweepMembers,
		},
		{
			concern: "policy",
			maps: []ownedMap{
				entry[uint32, contivbpfCbEpgState](contivbpfMapCbEpgs),
				entry[uint32, contivbpfCbZoneStamp](contivbpfMapCbZoneStamps),
			},
			// Groups no rule set of this generation wrote (cleared, with their stamps
			// moved); a zone's stamp only ever moves on (stamps.go).
			sweep: (*Driver).sweepEPGStates,
		},
		genOwner[contivbpfCbRouteKey]("endpoints", contivbpfMapCbRoutes, 1,
			func(v *contivbpfCbRoute) uint32 { return v.Generation }),
		genOwner[contivbpfCbNpKey]("services", contivbpfMapCbNodeports, 0,
			func(v *contivbpfCbNp) uint32 { return v.Generation }),
		genOwner[contivbpfCbTnetKey]("networks", contivbpfMapCbTenantNets, 0,
			func(v *contivbpfCbTnet) uint32 { return v.Generation }),
		genOwner[uint32]("endpoints", contivbpfMapCbHostRoutes, 0,
			func(v *contivbpfCbHostRoute) uint32 { return v.Generation }),

		// No generation sweep.
		{
			concern: "host",
			maps:    []ownedMap{entry[uint32, contivbpfCbHostIp](contivbpfMapCbHostIps)},
			gc:      "rewritten whole from the host's address list (syncHostIPs)",
		},
		{
			concern: "services",
			maps:    []ownedMap{entry[contivbpfCbHostSvcKey, contivbpfCbHostSvc](contivbpfMapCbHostSvcs)},
			gc:      "settled by each service change, rewritten whole by Sync (syncHostSvcs)",
		},
		{
			concern: "host",
			maps:    []ownedMap{entry[contivbpfCbDenyKey, uint32](contivbpfMapCbDenySrc)},
			gc:      "rewritten whole from the deny list by the agent (SetDenySources)",
		},
		{
			concern: "routes",
			maps:    []ownedMap{entry[contivbpfCbBgpKey, contivbpfCbBgpRoute](contivbpfMapCbBgpRoutes)},
			gc:      "rewritten whole from the BGP speaker's routes (SetNativeRouting)",
		},
		{
			concern: "config",
			maps:    []ownedMap{entry[uint32, contivbpfCbConfig](contivbpfMapCbCfg)},
			gc:      "one entry, rewritten by writeConfig",
		},
		{
			concern: "endpoints",
			maps: []ownedMap{
				entry[uint32, contivbpfCbEpStats](contivbpfMapCbEpCounters).sized(1),
				entry[uint32, contivbpfCbQosEntry](contivbpfMapCbQos).sized(1),
				entry[uint32, contivbpfCbCtCount](contivbpfMapCbCtOwned).sized(1),
				entry[uint32, contivbpfCbCtCount](contivbpfMapCbCtOwnedIn).sized(1),
			},
			gc: "arrays by counter slot: a slot is zeroed when handed out (slots.go)",
		},
		{
			concern: "datapath",
			maps:    []ownedMap{entry[uint32, contivbpfCbCounter](contivbpfMapCbReasons)},
			gc:      "counters by reason, never stale",
		},
		{
			concern: "conntrack",
			maps: []ownedMap{
				entry[contivbpfCbCtKey, contivbpfCbCtEntry](contivbpfMapCbCt).sized(4).
					nodePortZone(kindSite{zoneOff: unsafe.Offsetof(ct.Zone), kindOff: unsafe.Offsetof(ct.Kind)}),
				entry[uint32, contivbpfCbCtGen](contivbpfMapCbCtGens),
				entry[contivbpfCbSnatKey, contivbpfCbSnatEntry](contivbpfMapCbSnat).
					nodePortZone(kindSite{zoneOff: unsafe.Offsetof(sn.Zone), kindOff: unsafe.Offsetof(sn.Kind)}),
				entry[contivbpfCbSnatRkey, contivbpfCbSnatRval](contivbpfMapCbSnatRev).
					nodePortZone(kindSite{inValue: true, zoneOff: unsafe.Offsetof(rv.Zone), kindOff: unsafe.Offsetof(rv.Kind)}),
				entry[contivbpfCbPeerFlowKey, contivbpfCbPeerFlow](contivbpfMapCbPeerFlows),
				entry[contivbpfCbFragKey, contivbpfCbFragEntry](contivbpfMapCbFrags).nodePortZone(frag),
				entry[contivbpfCbFragKey, contivbpfCbNatfrag](contivbpfMapCbNatFrags).nodePortZone(frag),
				entry[contivbpfCbFragZoneKey, contivbpfCbFragBudget](contivbpfMapCbFragBudgets),
				entry[contivbpfCbFragSrcKey, contivbpfCbFragBudget](contivbpfMapCbFragSrcBudgets),
			},
			gc: "flow state the datapath writes: expired by the conntrack collector (conntrack.go, natgc.go) or LRU",
		},
		{
			concern: "datapath",
			maps: []ownedMap{
				{name: contivbpfMapCbEvents},
				entry[uint32, uint32](contivbpfMapCbCalls),
			},
			gc: "the drop event stream and the stage program array (filled at load)",
		},
		{
			concern: "datapath",
			maps: []ownedMap{
				entry[uint32, contivbpfCbIface](contivbpfMapCbIfaceScratch),
				entry[uint32, contivbpfCbHandoffRaw](contivbpfMapCbHandoffScratch),
				entry[uint32, contivbpfCbPolScratch](contivbpfMapCbPolScratch),
				entry[uint32, contivbpfCbTcpSeqs](contivbpfMapCbTcpScratch),
				entry[uint32, contivbpfCbVerdict](contivbpfMapCbVerdicts),
				entry[uint32, contivbpfCbIcmpBudget](contivbpfMapCbIcmpBudget),
			},
			gc: "a packet's scratch and the ICMP budget: one entry, not pinned",
		},
	}
}

// ownedMaps is every owned map by name.
func ownedMaps() map[string]ownedMap {
	out := map[string]ownedMap{}
	for _, o := range mapOwners() {
		for _, m := range o.maps {
			out[m.name] = m
		}
	}
	return out
}

// maxMapScale is the largest multiple of MapEntries a map is sized to (New refuses a
// MapEntries whose multiple does not fit a map's uint32 size).
func maxMapScale() uint32 {
	var most uint32
	for _, o := range mapOwners() {
		for _, m := range o.maps {
			most = max(most, m.scale)
		}
	}
	return most
}

// sizeMaps sizes the maps of spec that follow MapEntries (New checked that each size
// fits).
func sizeMaps(spec *ebpf.CollectionSpec, mapEntries int) {
	for name, m := range ownedMaps() {
		if ms, ok := spec.Maps[name]; ok && m.scale != 0 {
			ms.MaxEntries = m.scale * uint32(mapEntries)
		}
	}
}

// sweepMaps deletes every entry written by an older generation: each owner's sweep, in
// the order of mapOwners.
func (d *Driver) sweepMaps() []error {
	var errs []error
	for _, o := range mapOwners() {
		if o.sweep != nil {
			errs = append(errs, o.sweep(d)...)
		}
	}
	return errs
}

// sweepIfaces deletes the interface entries (cb_iface_direct, cb_ifaces) of older
// generations.
func (d *Driver) sweepIfaces() []error {
	var (
		errs  []error
		stale []uint32
	)
	ifs := d.ifaces()
	errs = appendErr(errs, ifs.each(func(ik uint32, iv contivbpfCbIface) {
		if iv.Generation != d.gen {
			stale = append(stale, ik)
		}
	}))
	for _, k := range stale {
		errs = appendErr(errs, ifs.del(k))
	}
	return errs
}

// sweepMembers deletes memberships of older generations, then bumps the revision of each
// service that lost one (a client→VIP entry stops trusting a backend it no longer has).
func (d *Driver) sweepMembers() []error {
	left, errs := sweepGenKeys(d.objs.CbMembers, contivbpfMapCbMembers, d.gen,
		func(k *contivbpfCbMemberKey, v *contivbpfCbMember) uint32 { return v.Generation })
	bumped := map[uint32]bool{}
	for _, m := range left {
		if !bumped[m.SvcId] {
			bumped[m.SvcId] = true
			errs = appendErr(errs, svcRevBump(d.objs.CbSvcRevs, m.SvcId))
		}
	}
	return errs
}
