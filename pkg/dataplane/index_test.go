package dataplane

import (
	"net/netip"
	"reflect"
	"testing"
)

// TestIndexRoundTrip: IndexOf then State gives back every object of every kind, each
// list sorted by its key, whatever the order going in.
func TestIndexRoundTrip(t *testing.T) {
	in := State{
		Networks:        []Network{{ID: "n2.t"}, {ID: "n1.t"}},
		Endpoints:       []Endpoint{{ID: "n1.t-b"}, {ID: "n1.t-a"}},
		RemoteEndpoints: []RemoteEndpoint{{ID: "n2.t-d"}, {ID: "n2.t-c"}},
		Peers:           []Peer{{Host: "h3"}, {Host: "h2", VTEP: netip.MustParseAddr("192.168.1.2")}},
		Policies:        []PolicySet{{EPGID: 9}, {EPGID: 3}},
		Services:        []Service{{ID: "web:t"}, {ID: "api:t"}},
		PodPolicies:     []PodPolicy{{ID: "n1.t-b"}, {ID: "n1.t-a", IngressIsolated: true}},
	}
	want := State{
		Networks:        []Network{{ID: "n1.t"}, {ID: "n2.t"}},
		Endpoints:       []Endpoint{{ID: "n1.t-a"}, {ID: "n1.t-b"}},
		RemoteEndpoints: []RemoteEndpoint{{ID: "n2.t-c"}, {ID: "n2.t-d"}},
		Peers:           []Peer{{Host: "h2", VTEP: netip.MustParseAddr("192.168.1.2")}, {Host: "h3"}},
		Policies:        []PolicySet{{EPGID: 3}, {EPGID: 9}},
		Services:        []Service{{ID: "api:t"}, {ID: "web:t"}},
		PodPolicies:     []PodPolicy{{ID: "n1.t-a", IngressIsolated: true}, {ID: "n1.t-b"}},
	}
	if got := IndexOf(in).State(); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n%+v\nwant\n%+v", got, want)
	}
	if got := NewIndex().State(); !reflect.DeepEqual(got, State{}) {
		t.Fatalf("empty index: %+v, want the zero State", got)
	}
}

// TestIndexClone: changing a clone's maps leaves the original as it was, and the
// other way round.
func TestIndexClone(t *testing.T) {
	x := IndexOf(State{Networks: []Network{{ID: "n"}}, Peers: []Peer{{Host: "h2"}}, PodPolicies: []PodPolicy{{ID: "p"}}})
	before := x.State()
	c := x.Clone()
	c.Networks["m"] = Network{ID: "m"}
	delete(c.Peers, "h2")
	c.PodPolicies["p"] = PodPolicy{ID: "p", EgressIsolated: true}
	c.Services["s:t"] = Service{ID: "s:t"}
	if got := x.State(); !reflect.DeepEqual(got, before) {
		t.Fatalf("original changed with its clone: %+v, want %+v", got, before)
	}
	x.Endpoints["e"] = Endpoint{ID: "e"}
	if _, ok := c.Endpoints["e"]; ok {
		t.Fatal("clone changed with its original")
	}
}
