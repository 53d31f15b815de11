package ebpf

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// attachWorld is an egressWorld with a driver, one network, a group (9) whose rules deny
// everything its members send, and a UDP socket on the host's address: what a container
// of that group must never reach.
type attachWorld struct {
	*egressWorld
	d    *Driver
	red  dataplane.Network
	host *conformance.HostSocket
}

const attachPort = "18091"

// denyOut is group 9's rule set: nothing its members send is allowed.
var denyOut = dataplane.PolicySet{EPGID: 9, Rules: []dataplane.PolicyRule{{ID: "deny-out", Priority: 1, Action: dataplane.ActionDeny}}}

func newAttachWorld(t *testing.T) *attachWorld {
	t.Helper()
	w := &attachWorld{egressWorld: newEgressWorld(t)}
	// The datapath's guarantees must not rest on the host's sysctls: start from the most
	// lenient host (no reverse-path filter).
	nsRun(t, w.egressWorld.host, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
	w.d = w.driver(t)
	w.red = dataplane.Network{ID: "red.t", Encap: dataplane.EncapVXLAN, Tag: 77,
		Subnet: netip.MustParsePrefix("10.50.0.0/24"), Gateway: netip.MustParseAddr("10.50.0.1")}
	ctx := context.Background()
	if err := w.d.UpsertNetwork(ctx, w.red); err != nil {
		t.Fatal(err)
	}
	if err := w.d.UpsertPolicy(ctx, denyOut); err != nil {
		t.Fatal(err)
	}
	w.host = conformance.ListenHost(t, w.egressWorld.host, ewHostIP+":"+attachPort)
	return w
}

func (w *attachWorld) endpoint(t *testing.T, name, ip string) dataplane.Endpoint {
	ep := w.egressWorld.endpoint(t, w.red, name, ip)
	ep.EPGID = 9
	return ep
}

// reachesHost reports whether ep's container, setting its gateway's neighbour entry to
// the host veth's MAC by hand (nobody answers ARP for it while no program is attached),
// gets a datagram to the host's socket.
func (w *attachWorld) reachesHost(t *testing.T, ep dataplane.Endpoint) bool {
	t.Helper()
	return w.host.ReachedBy(t, ep, w.red.Gateway)
}

// pause returns a hook that stops at its first call until release is called; held is
// closed when it stops.
func pause(t *testing.T) (hook func(), held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	stopped := false
	hook = func() {
		if !stopped {
			stopped = true
			close(h)
			<-r
		}
	}
	released := false
	release = func() {
		if !released {
			released = true
			close(r)
		}
	}
	t.Cleanup(release)
	return hook, h, release
}

// pauseAt stops d's next endpoint apply at step (its StepObserver).
func pauseAt(t *testing.T, d *Driver, step string) (held <-chan struct{}, release func()) {
	hook, held, release := pause(t)
	d.cfg.StepObserver = func(s string, _ time.Duration) {
		if s == step {
			hook()
		}
	}
	return held, release
}

// pauseDetach stops d just after it next detaches ifname's program.
func pauseDetach(t *testing.T, d *Driver, ifname string) (held <-chan struct{}, release func()) {
	hook, held, release := pause(t)
	d.cfg.detached = func(name string) {
		if name == ifname {
			hook()
		}
	}
	return held, release
}

// policedWhileHeld runs call until it holds (held closes; where: what it was held at),
// checks that ep's container does not reach the host meanwhile, releases it and returns
// its error.
func (w *attachWorld) policedWhileHeld(t *testing.T, ep dataplane.Endpoint, held <-chan struct{}, release func(), where string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("call ended (%v) before it was held %s", err, where)
	case <-time.After(10 * time.Second):
		t.Fatalf("call never held %s", where)
	}
	if w.reachesHost(t, ep) {
		t.Errorf("held %s, the container reached the host", where)
	}
	release()
	err := <-done
	w.d.cfg.StepObserver, w.d.cfg.detached = nil, nil
	return err
}

// TestAttachNoUnpolicedWindow: a container whose group denies everything it sends
// never reaches the host while its endpoint is applied (held after its map entries,
// before its program is attached), rolled back or deleted (held as its program is
// detached), across an agent restart, or torn down. Before, the host veth was up from
// its creation and stayed up until after its program was detached: a datagram to the
// host's address arrived unjudged in each of these windows (restart had none).
func TestAttachNoUnpolicedWindow(t *testing.T) {
	w := newAttachWorld(t)
	ctx := context.Background()
	top := t

	t.Run("apply", func(t *testing.T) {
		ep := w.endpoint(t, "a", "10.50.0.10")
		apply := func() error { return w.d.UpsertEndpoint(ctx, ep) }
		held, release := pauseAt(t, w.d, StepMaps)
		if err := w.policedWhileHeld(t, ep, held, release, "before its program was attached", apply); err != nil {
			t.Fatal(err)
		}
		if w.reachesHost(t, ep) {
			t.Error("applied, the container reached the host its group denies")
		}
		// A second apply of the same endpoint (its veth kept) is policed throughout too.
		held, release = pauseAt(t, w.d, StepMaps)
		if err := w.policedWhileHeld(t, ep, held, release, "in a re-apply", apply); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("rollback", func(t *testing.T) {
		// A full host route table fails the apply after the attach: it is rolled back.
		hr := w.d.objs.CbHostRoutes
		var filled []uint32
		for i := uint32(0); i < hr.MaxEntries(); i++ {
			k := ip4(netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}))
			if err := hr.Put(k, &contivbpfCbHostRoute{Ifindex: 9999}); err != nil {
				break
			}
			filled = append(filled, k)
		}
		defer func() {
			for _, k := range filled {
				_ = hr.Delete(k)
			}
		}()
		ep := w.endpoint(t, "c", "10.50.0.12")
		held, release := pauseDetach(t, w.d, ep.HostIfName)
		if err := w.policedWhileHeld(t, ep, held, release, "as a rollback detached its program",
			func() error { return w.d.UpsertEndpoint(ctx, ep) }); err == nil {
			t.Fatal("apply with a full host route table succeeded")
		}
	})

	// Restarts: between two agents (Close keeps the pinned link) and after the next one
	// adopts the veth (link.Update swaps the program in place), it stays policed. With the
	// pins gone with bpffs while no agent ran, the veth's link (only its pin held it) went
	// with its program: the next agent adopts a veth it knows nothing of (no interface
	// entry), which must not be up until its Sync recreates it.
	for _, c := range []struct {
		name, short, ip string
		pinsLost        bool
	}{{"restart", "e", "10.50.0.13", false}, {"restart-pins-lost", "l", "10.50.0.15", true}} {
		t.Run(c.name, func(t *testing.T) {
			ep := w.endpoint(t, c.short, c.ip)
			if err := w.d.UpsertEndpoint(ctx, ep); err != nil {
				t.Fatal(err)
			}
			if err := w.d.Close(); err != nil {
				t.Fatal(err)
			}
			if c.pinsLost {
				if err := os.RemoveAll(w.d.cfg.PinRoot); err != nil {
					t.Fatal(err)
				}
			} else if w.reachesHost(t, ep) {
				t.Error("between two agents, the container reached the host")
			}
			w.d = w.driver(top)
			if w.reachesHost(t, ep) {
				t.Error("adopted, the container reached the host")
			}
			st := dataplane.State{Networks: []dataplane.Network{w.red}, Endpoints: []dataplane.Endpoint{ep},
				Policies: []dataplane.PolicySet{denyOut}}
			if err := w.d.Sync(ctx, st); err != nil {
				t.Fatal(err)
			}
			if w.reachesHost(t, ep) {
				t.Error("adopted and synced, the container reached the host")
			}
			if err := conformance.Ping(ep.NetNS, w.red.Gateway.String(), time.Second); err != nil {
				t.Errorf("synced, the endpoint is not forwarding: %v", err)
			}
		})
	}

	// Teardown last: it ends the driver.
	for _, c := range []struct {
		name, ip string
		call     func(ep dataplane.Endpoint) error
	}{
		{"delete", "10.50.0.11", func(ep dataplane.Endpoint) error { return w.d.DeleteEndpoint(ctx, ep.ID) }},
		{"teardown", "10.50.0.14", func(dataplane.Endpoint) error { return w.d.Teardown(ctx) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := w.endpoint(t, c.name[:3], c.ip)
			if err := w.d.UpsertEndpoint(ctx, ep); err != nil {
				t.Fatal(err)
			}
			held, release := pauseDetach(t, w.d, ep.HostIfName)
			if err := w.policedWhileHeld(t, ep, held, release, "as "+c.name+" detached its program",
				func() error { return c.call(ep) }); err != nil {
				t.Fatal(err)
			}
		})
	}
}
