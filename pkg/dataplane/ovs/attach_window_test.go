package ovs

import (
	"context"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestHostVethNeverReachesHost: the bridge reads an endpoint's host veth through a packet
// socket, which does not stop the kernel's own receive path on that veth. A container of
// a group denied everything that sets its gateway's neighbour entry to the host veth's MAC
// must still not reach a socket on the host's address (rp_filter 0): not once its veth
// exists and before its port does, not once it is applied, not after an older build
// (no drop filter on its veth) is followed by this one, not after vswitchd restarts. Before, the datagram arrived in
// each case, for as long as the veth existed.
func TestHostVethNeverReachesHost(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, _ := twoHosts(t, id)
	sh(t, "ip", "netns", "exec", h1.ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
	host := conformance.ListenHost(t, h1.cfg.NetNS, "192.168.77.1:18092")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	e := ep("e1", "10.1.0.1", newNS(t, id, "c1"), "cbo1"+id)
	e.EPGID = 9
	deny := dataplane.PolicySet{EPGID: 9, Rules: []dataplane.PolicyRule{{ID: "deny-out", Priority: 1, Action: dataplane.ActionDeny}}}
	st := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e}, Policies: []dataplane.PolicySet{deny}}

	if err := plumbEndpoint(ctx, h1.cfg.NetNS, e, vxNet); err != nil {
		t.Fatal(err)
	}
	if host.ReachedBy(t, e, vxNet.Gateway) {
		t.Error("plumbed, before its port existed, the container reached the host")
	}
	d := newDriver(t, h1)
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if host.ReachedBy(t, e, vxNet.Gateway) {
		t.Error("applied, the container reached the host its group denies")
	}

	// A veth of an older build has no filter: the next driver adds it.
	sh(t, "ip", "netns", "exec", h1.ns, "tc", "qdisc", "del", "dev", e.HostIfName, "clsact")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, h1)
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if host.ReachedBy(t, e, vxNet.Gateway) {
		t.Error("adopted from an older build, the container reached the host")
	}

	// A restarted vswitchd configures every port again: the filter stays.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := (Private{Dir: h1.dir}).StopVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, h1)
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	if host.ReachedBy(t, e, vxNet.Gateway) {
		t.Error("after a vswitchd restart, the container reached the host")
	}
}
