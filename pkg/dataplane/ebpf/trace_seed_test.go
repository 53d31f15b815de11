package ebpf

import (
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestTraceLBSeed: the trace programs balance with the live datapath's flow hash seed
// (cb_lb_seed), so a traced new connection to a VIP names the backend real traffic would
// get (and is judged by that backend's policy); with the trace collection's own zero
// seed it names another one whenever the hashes differ.
func TestTraceLBSeed(t *testing.T) {
	h, a, _, _, _ := opsHost(t)
	if _, err := h.d.Trace(dataplane.TraceRequest{From: a.ID, Dst: netip.MustParseAddr("10.50.0.100"), Proto: 6, DstPort: 80}); err != nil {
		t.Fatal(err)
	}
	v := h.d.traceColl.Variables["cb_lb_seed"]
	if v == nil {
		t.Fatal("the trace collection has no cb_lb_seed")
	}
	var got uint32
	if err := v.Get(&got); err != nil {
		t.Fatal(err)
	}
	if got != h.d.lbSeed {
		t.Errorf("trace programs hash with seed %#x, the datapath with %#x", got, h.d.lbSeed)
	}
}
