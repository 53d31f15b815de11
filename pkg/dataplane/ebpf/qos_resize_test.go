package ebpf

import (
	"context"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TestQoSResize: a bigger MapEntries migrates cb_qos (an array with a bpf_spin_lock) with
// the rest: a limited endpoint keeps its buckets across the restart, before any Sync.
func TestQoSResize(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "qr", "10.50.0.2", false)
	a.QoS = dataplane.QoS{EgressRate: 10e6, IngressRate: 20e6, DSCP: 10, SetDSCP: true}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	big := h.cfg
	big.MapEntries = 2048
	d, err := New(ctx, big.HostConfig, big.Options)
	if err != nil {
		t.Fatalf("grow MapEntries: %v", err)
	}
	h.d = d
	if got := d.objs.CbQos.MaxEntries(); got != 2048 {
		t.Errorf("cb_qos has %d entries, want 2048", got)
	}
	var ifc contivbpfCbIface
	if err := d.ifaces().each(func(_ uint32, v contivbpfCbIface) {
		if v.Ip == ip4(a.IP) {
			ifc = v
		}
	}); err != nil || ifc.Slot == 0 {
		t.Fatalf("iface entry of %v after resize: %+v %v", a.IP, ifc, err)
	}
	if ifc.Qos != qosWord(a.QoS) {
		t.Errorf("qos word after resize %#x, want %#x", ifc.Qos, qosWord(a.QoS))
	}
	var e contivbpfCbQosEntry
	if err := d.objs.CbQos.Lookup(ifc.Slot, &e); err != nil {
		t.Fatal(err)
	}
	out, in := qosBucket(a.QoS.EgressRate, 0), qosBucket(a.QoS.IngressRate, 0)
	if e.Out.Nsb != out.Nsb || e.Out.Tau != out.Tau || e.In.Nsb != in.Nsb || e.In.Tau != in.Tau {
		t.Errorf("buckets after resize %+v, want out %+v in %+v", e, out, in)
	}
	if err := d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if v, err := d.Verify(state); err != nil || len(v) != 0 {
		t.Errorf("after resize and Sync: drift %+v %v", v, err)
	}
}
