package ebpf

import (
	"context"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestEndpointUpdateRefusedKeepsOld: an update of an endpoint to an address another local
// endpoint owns is refused before anything of the old endpoint is removed.
func TestEndpointUpdateRefusedKeepsOld(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	if err := h.d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b}}); err != nil {
		t.Fatal(err)
	}
	conformance.PingOK(t, b.NetNS, "10.50.0.2", 1)
	hostA, err := h.d.nl.LinkByName(a.HostIfName)
	if err != nil {
		t.Fatal(err)
	}

	clash := a
	clash.IP = b.IP
	err = h.d.UpsertEndpoint(ctx, clash)
	if err == nil || !strings.Contains(err.Error(), "already used by local endpoint "+b.ID) {
		t.Fatalf("clashing update: err = %v, want 'already used by local endpoint %s'", err, b.ID)
	}

	// The old endpoint is intact: same veth, map entries, tcx link, and it forwards.
	l, err := h.d.nl.LinkByName(a.HostIfName)
	if err != nil {
		t.Fatalf("veth of %s gone after refused update: %v", a.ID, err)
	}
	if l.Attrs().Index != hostA.Attrs().Index {
		t.Errorf("veth of %s recreated: ifindex %d, was %d", a.ID, l.Attrs().Index, hostA.Attrs().Index)
	}
	var v contivbpfCbEndpoint
	key := contivbpfCbEpKey{Net: h.d.eps.networks[h.net.ID].key, Ip: ip4(a.IP)}
	if err := h.d.objs.CbEndpoints.Lookup(&key, &v); err != nil {
		t.Fatalf("cb_endpoints entry of %s gone: %v", a.IP, err)
	}
	if int(v.Ifindex) != l.Attrs().Index || v.Flags&uint32(contivbpfCbEpFlagsCB_EP_LOCAL) == 0 {
		t.Errorf("cb_endpoints entry of %s = %+v", a.IP, v)
	}
	if ifc, err := h.d.readIface(uint32(l.Attrs().Index)); err != nil || ifc.Ip != ip4(a.IP) {
		t.Errorf("interface entry of %s: %+v, %v", a.HostIfName, ifc, err)
	}
	st, err := h.d.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	attached := false
	for _, at := range st.Attachments {
		if at.Interface == a.HostIfName {
			attached = true
		}
	}
	if !attached {
		t.Errorf("no tcx attachment on %s after refused update: %+v", a.HostIfName, st.Attachments)
	}
	conformance.PingOK(t, b.NetNS, "10.50.0.2", 1)
	conformance.PingOK(t, a.NetNS, "10.50.0.3", 1)

	// A refused rename onto a foreign interface also leaves it alone.
	foreign := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.prefix + "fx"}, PeerName: h.prefix + "fy"}
	if err := h.d.nl.LinkAdd(foreign); err != nil {
		t.Fatal(err)
	}
	moved := a
	moved.HostIfName = foreign.Name
	if err := h.d.UpsertEndpoint(ctx, moved); err == nil || !strings.Contains(err.Error(), "is not this endpoint's veth") {
		t.Fatalf("update onto foreign interface: err = %v", err)
	}
	if _, err := h.d.nl.LinkByName(a.HostIfName); err != nil {
		t.Fatalf("veth of %s gone after refused rename: %v", a.ID, err)
	}
	conformance.PingOK(t, b.NetNS, "10.50.0.2", 1)
}
