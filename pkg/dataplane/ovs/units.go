package ovs

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// The pipeline is compiled per unit: the object a group of flows comes from (a network,
// a local or remote endpoint, a group's rules, a service) plus the flows no object owns
// (base) and the NetworkPolicy layer (netpol, one unit). A change recompiles only the
// units it touches and installs the difference, so its cost does not grow with the
// number of services or endpoints (recompile). Network and peer changes, which every
// endpoint's flows depend on, compile everything.
//
// A unit's name sorts in merge order. When two units produce a flow with the same match
// (e.g. a local and a remote endpoint with one address while a container moves), the
// first unit's flow is installed; the others' are kept and take over when it goes.
const (
	unitBase   = "0base"
	unitNetpol = "5netpol"
)

func unitNet(id string) string  { return "1net/" + id }
func unitEp(id string) string   { return "2ep/" + id }
func unitRem(id string) string  { return "3rem/" + id }
func unitPol(epg uint16) string { return fmt.Sprintf("4pol/%05d", epg) }
func unitSvc(id string) string  { return "6svc/" + id }

// splitUnit returns a unit's kind ("net", "ep", "rem", "pol", "svc", or the unit name
// of base and netpol) and object id.
func splitUnit(u string) (kind, id string) {
	if u == unitBase || u == unitNetpol {
		return u, ""
	}
	k, id, _ := strings.Cut(u[1:], "/")
	return k, id
}

// compiled is the pipeline as installed: every unit's flows, and per flow match the
// units producing it and the flow installed (the first unit's).
type compiled struct {
	units  map[string][]*flow
	owners map[string][]string // flow key → units producing it, in merge order
	flows  map[string]*flow    // flow key → installed flow

	svcKeys map[string][]string // service unit → its LB keys ("service/proto/port")
	svcVKs  map[string][]string // service unit → its VIP:ports ("vrf/vip/proto/port")
	svcVIPs map[string]string   // "vrf/vip/proto/port" → service id
	vrf     map[string]uint32   // tenant → VRF the units were compiled with
	inbound map[uint32]uint32   // VRF → inbound zone the units were compiled with (vrf.go)
}

func newCompiled(vrf map[string]uint32) *compiled {
	return &compiled{units: map[string][]*flow{}, owners: map[string][]string{}, flows: map[string]*flow{},
		svcKeys: map[string][]string{}, svcVKs: map[string][]string{}, svcVIPs: map[string]string{}, vrf: vrf}
}

// list returns the installed flows sorted by key.
func (c *compiled) list() []*flow {
	out := make([]*flow, 0, len(c.flows))
	for _, k := range slices.Sorted(maps.Keys(c.flows)) {
		out = append(out, c.flows[k])
	}
	return out
}

// serviceKeys returns every LB key in use.
func (c *compiled) serviceKeys() map[string]bool {
	m := map[string]bool{}
	for _, keys := range c.svcKeys {
		for _, k := range keys {
			m[k] = true
		}
	}
	return m
}

// claimService records service unit u's LB keys and VIP:ports, refusing a VIP:port
// another service of the same VRF holds. Units other than services pass. It returns a
// function that restores the claims as they were.
func (c *compiled) claimService(u string, d *dataplane.Index, env *unitEnv, keys []string) (func(), error) {
	kind, id := splitUnit(u)
	if kind != "svc" {
		return func() {}, nil
	}
	oldKeys, oldVKs := c.svcKeys[u], c.svcVKs[u]
	undo := func() {
		for _, vk := range c.svcVKs[u] {
			delete(c.svcVIPs, vk)
		}
		for _, vk := range oldVKs {
			c.svcVIPs[vk] = id
		}
		setOrDelete(c.svcKeys, u, oldKeys)
		setOrDelete(c.svcVKs, u, oldVKs)
	}
	for _, vk := range oldVKs {
		delete(c.svcVIPs, vk)
	}
	delete(c.svcKeys, u)
	delete(c.svcVKs, u)
	s, ok := d.Services[id]
	if !ok || len(keys) == 0 {
		return undo, nil
	}
	tenant, _ := dataplane.ServiceTenant(id)
	v := env.vrf[tenant]
	var vks []string
	for _, sp := range s.Ports {
		vk := fmt.Sprintf("%d/%v/%d/%d", v, s.VIP, sp.Proto, sp.Port)
		if other, dup := c.svcVIPs[vk]; dup {
			c.svcVKs[u] = vks
			undo()
			if other == id {
				return nil, fmt.Errorf("service %s: port %d/%d is listed twice", id, sp.Port, sp.Proto)
			}
			return nil, fmt.Errorf("service %s: %v:%d/%d is already service %s of tenant %s", id, s.VIP, sp.Port, sp.Proto, other, tenant)
		}
		c.svcVIPs[vk] = id
		vks = append(vks, vk)
	}
	c.svcKeys[u] = keys
	c.svcVKs[u] = vks
	return undo, nil
}

func setOrDelete[V any](m map[string][]V, k string, v []V) {
	if v == nil {
		delete(m, k)
	} else {
		m[k] = v
	}
}

// undoLog remembers what setUnit replaced, so a change the switch refused can be taken
// back from the compiled pipeline.
type undoLog struct {
	units  map[string][]*flow
	owners map[string][]string
	flows  map[string]*flow
}

func newUndoLog() *undoLog {
	return &undoLog{units: map[string][]*flow{}, owners: map[string][]string{}, flows: map[string]*flow{}}
}

// setUnit replaces unit u's flows and records, per flow key it touches, the flow
// installed before the first touch and the one to install now.
func (c *compiled) setUnit(u string, flows []*flow, log *undoLog, changes map[string]*flowChange) {
	if _, ok := log.units[u]; !ok {
		log.units[u] = c.units[u]
	}
	mine := make(map[string]*flow, len(flows))
	touch := func(k string) {
		if _, ok := log.owners[k]; !ok {
			log.owners[k] = slices.Clone(c.owners[k])
			log.flows[k] = c.flows[k]
		}
		if _, ok := changes[k]; !ok {
			changes[k] = &flowChange{old: c.flows[k], unit: u}
		}
	}
	var keys []string
	for _, f := range c.units[u] {
		k := f.key()
		touch(k)
		keys = append(keys, k)
		c.owners[k] = slices.DeleteFunc(slices.Clone(c.owners[k]), func(o string) bool { return o == u })
	}
	for _, f := range flows {
		k := f.key()
		touch(k)
		keys = append(keys, k)
		mine[k] = f
		owners := slices.Clone(c.owners[k])
		if i, found := slices.BinarySearch(owners, u); !found {
			owners = slices.Insert(owners, i, u)
		}
		c.owners[k] = owners
	}
	if len(flows) == 0 {
		delete(c.units, u)
	} else {
		c.units[u] = flows
	}
	for _, k := range keys {
		ch := changes[k]
		owners := c.owners[k]
		switch {
		case len(owners) == 0:
			delete(c.owners, k)
			delete(c.flows, k)
			ch.new = nil
		case owners[0] == u:
			ch.new = mine[k]
		default:
			ch.new = c.unitFlow(owners[0], k)
		}
		if ch.new != nil {
			c.flows[k] = ch.new
		}
	}
}

// undo takes back every setUnit recorded in log.
func (c *compiled) undo(log *undoLog) {
	for u, flows := range log.units {
		if len(flows) == 0 {
			delete(c.units, u)
		} else {
			c.units[u] = flows
		}
	}
	for k, owners := range log.owners {
		if len(owners) == 0 {
			delete(c.owners, k)
			delete(c.flows, k)
			continue
		}
		c.owners[k] = owners
		c.flows[k] = log.flows[k]
	}
}

// unitFlow returns unit u's flow with key k.
func (c *compiled) unitFlow(u, k string) *flow {
	for _, f := range c.units[u] {
		if f.key() == k {
			return f
		}
	}
	return nil
}

// flowChange is one flow match whose installed flow changes: old or new may be nil.
type flowChange struct {
	old, new *flow
	unit     string // the first unit that touched it
}

// recompile compiles units dirty again against d and applies them to c. It returns the
// installed flows that changed and a function that takes the change back (when the
// switch refuses it). On a compile error c is unchanged.
func (pl *pipeline) recompile(c *compiled, d *dataplane.Index, host dataplane.HostConfig, p ports, svcIDs map[string]uint32, dirty []string) ([]flowChange, func(), error) {
	env := newUnitEnv(d, host, p, c.vrf, c.inbound, svcIDs)
	dirty = slices.Clone(dirty)
	slices.Sort(dirty)
	dirty = slices.Compact(dirty)
	type result struct {
		flows []*flow
		keys  []string
	}
	res := make([]result, len(dirty))
	for i, u := range dirty {
		flows, keys, err := pl.compileUnit(env, u)
		if err != nil {
			return nil, nil, err
		}
		res[i] = result{flows, keys}
	}
	// Service claims first: a refused one changes nothing.
	var unclaim []func()
	undoClaims := func() {
		for i := len(unclaim) - 1; i >= 0; i-- {
			unclaim[i]()
		}
	}
	for i, u := range dirty {
		undo, err := c.claimService(u, d, env, res[i].keys)
		if err != nil {
			undoClaims()
			return nil, nil, err
		}
		unclaim = append(unclaim, undo)
	}
	log := newUndoLog()
	touched := map[string]*flowChange{}
	for i, u := range dirty {
		c.setUnit(u, res[i].flows, log, touched)
	}
	var changes []flowChange
	for _, k := range slices.Sorted(maps.Keys(touched)) {
		if ch := touched[k]; ch.old != ch.new {
			changes = append(changes, *ch)
		}
	}
	undo := func() {
		c.undo(log)
		undoClaims()
	}
	return changes, undo, nil
}
