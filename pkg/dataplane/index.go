package dataplane

import (
	"cmp"
	"maps"
	"slices"
)

// Index is a State keyed by object id: what a consumer of driver calls (the agent's
// record of what it applied, a driver's own desired state) holds between calls. Later
// objects of a State replace earlier ones with the same key.
type Index struct {
	Networks        map[string]Network        // by ID
	Endpoints       map[string]Endpoint       // by ID
	RemoteEndpoints map[string]RemoteEndpoint // by ID
	Peers           map[string]Peer           // by Host
	Policies        map[uint16]PolicySet      // by EPGID
	Services        map[string]Service        // by ID
	PodPolicies     map[string]PodPolicy      // by ID (the pod's endpoint id)
}

// NewIndex returns an empty Index with every map allocated.
func NewIndex() *Index {
	return &Index{
		Networks:        map[string]Network{},
		Endpoints:       map[string]Endpoint{},
		RemoteEndpoints: map[string]RemoteEndpoint{},
		Peers:           map[string]Peer{},
		Policies:        map[uint16]PolicySet{},
		Services:        map[string]Service{},
		PodPolicies:     map[string]PodPolicy{},
	}
}

// IndexOf indexes the objects of s.
func IndexOf(s State) *Index {
	x := NewIndex()
	put(x.Networks, s.Networks, Network.key)
	put(x.Endpoints, s.Endpoints, Endpoint.key)
	put(x.RemoteEndpoints, s.RemoteEndpoints, RemoteEndpoint.key)
	put(x.Peers, s.Peers, Peer.key)
	put(x.Policies, s.Policies, PolicySet.key)
	put(x.Services, s.Services, Service.key)
	put(x.PodPolicies, s.PodPolicies, PodPolicy.key)
	return x
}

// State returns the indexed objects as a State, sorted (see State.Sort); an empty map
// gives a nil list.
func (x *Index) State() State {
	s := State{
		Networks:        slices.Collect(maps.Values(x.Networks)),
		Endpoints:       slices.Collect(maps.Values(x.Endpoints)),
		RemoteEndpoints: slices.Collect(maps.Values(x.RemoteEndpoints)),
		Peers:           slices.Collect(maps.Values(x.Peers)),
		Policies:        slices.Collect(maps.Values(x.Policies)),
		Services:        slices.Collect(maps.Values(x.Services)),
		PodPolicies:     slices.Collect(maps.Values(x.PodPolicies)),
	}
	s.Sort()
	return s
}

// Clone returns a copy of x with maps of its own; the objects in them are shared
// (shallow copies).
func (x *Index) Clone() *Index {
	return &Index{
		Networks:        maps.Clone(x.Networks),
		Endpoints:       maps.Clone(x.Endpoints),
		RemoteEndpoints: maps.Clone(x.RemoteEndpoints),
		Peers:           maps.Clone(x.Peers),
		Policies:        maps.Clone(x.Policies),
		Services:        maps.Clone(x.Services),
		PodPolicies:     maps.Clone(x.PodPolicies),
	}
}

// Sort orders every list of s by its Index key (peers by Host, rule sets by EPGID, the
// rest by ID), in place, so equal states compare and print equal.
func (s *State) Sort() {
	sortBy(s.Networks, Network.key)
	sortBy(s.Endpoints, Endpoint.key)
	sortBy(s.RemoteEndpoints, RemoteEndpoint.key)
	sortBy(s.Peers, Peer.key)
	sortBy(s.Policies, PolicySet.key)
	sortBy(s.Services, Service.key)
	sortBy(s.PodPolicies, PodPolicy.key)
}

// The Index keys of the objects.
func (v Network) key() string        { return v.ID }
func (v Endpoint) key() string       { return v.ID }
func (v RemoteEndpoint) key() string { return v.ID }
func (v Peer) key() string           { return v.Host }
func (v PolicySet) key() uint16      { return v.EPGID }
func (v Service) key() string        { return v.ID }
func (v PodPolicy) key() string      { return v.ID }

// put adds the objects of l to m by their key; a later one replaces an earlier one.
func put[K comparable, V any](m map[K]V, l []V, key func(V) K) {
	for _, v := range l {
		m[key(v)] = v
	}
}

// sortBy sorts l by the key of each element.
func sortBy[T any, K cmp.Ordered](l []T, key func(T) K) {
	slices.SortFunc(l, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
}
