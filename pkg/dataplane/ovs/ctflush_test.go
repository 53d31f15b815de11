package ovs

import (
	"encoding/hex"
	"net/netip"
	"slices"
	"testing"
)

// TestCTFlushEncoding compares the NXT_CT_FLUSH payload with what `ovs-ofctl ct-flush
// SWITCH zone=7 ct_nw_dst=10.36.1.201,ct_nw_proto=17,ct_tp_dst=53 ct_nw_src=10.36.1.2`
// (OVS 3.1) sends after the Nicira subtype.
func TestCTFlushEncoding(t *testing.T) {
	m := ctMatch{zone: 7, proto: 17,
		orig:  ctTuple{dst: netip.MustParseAddr("10.36.1.201"), dport: 53},
		reply: ctTuple{src: netip.MustParseAddr("10.36.1.2")}}
	const want = "1100000000000000" +
		"0000002800000000" + "00010014" + "00000000000000000000ffff0a2401c9" + "00000000" + "0003000800350000" +
		"0001002000000000" + "00000014" + "00000000000000000000ffff0a240102" + "00000000" +
		"0002000800070000"
	if got := hex.EncodeToString(m.encode()); got != want {
		t.Errorf("encoding\n got %s\nwant %s", got, want)
	}
}

// TestServiceNATsRemoved: removing a backend leaves exactly its translation to flush;
// services of tenants without a VRF here have none.
func TestServiceNATsRemoved(t *testing.T) {
	vrf := map[string]uint32{"default": 3}
	before := testState()
	after := before.Clone()
	s := after.Services["s:default"]
	s.Backends = s.Backends[:1]
	after.Services[s.ID] = s
	lone := s
	lone.ID = "s:nobody"
	after.Services[lone.ID] = lone
	var removed []ctMatch
	b, a := serviceNATs(before, vrf, nil), serviceNATs(after, vrf, nil)
	for m := range b {
		if !a[m] {
			removed = append(removed, m)
		}
	}
	// The reply side names the backend and its target port (what the removed backend's
	// guard flow matches, and a narrower flush).
	// In both zones of the tenant: its own (local clients) and its inbound one.
	want := ctMatch{zone: 3, vrf: 3, proto: 6, orig: ctTuple{dst: s.VIP, dport: 80}, reply: ctTuple{src: netip.MustParseAddr("10.1.0.9"), sport: 8080}}
	wantIn := want
	wantIn.zone = 3 | inboundZoneBit
	slices.SortFunc(removed, func(x, y ctMatch) int { return int(x.zone) - int(y.zone) })
	if len(removed) != 2 || removed[0] != want || removed[1] != wantIn {
		t.Errorf("removed = %v, want [%v %v]", removed, want, wantIn)
	}
	if len(a) != 2 {
		t.Errorf("after = %v, want one translation in each zone (s:nobody has no VRF here)", a)
	}
}
