package ebpf

import (
	"net/netip"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Options are the eBPF backend's own settings, beside the host's dataplane.HostConfig that
// both backends read (ovs.Options are the OVS backend's). The zero value takes every
// default.
type Options struct {
	// PinRoot is the bpffs directory of this host's pins ("" = DefaultPinBase/<host>).
	PinRoot string
	// MapEntries is the capacity of the endpoint and neighbour maps (0 = DefaultMapEntries;
	// the conntrack table holds four times as many, which must fit a map's uint32 size:
	// New refuses more than 1<<30 - 1).
	MapEntries int
	// VXLANIf names the host's collect_md VXLAN device ("" = DefaultVXLANIf).
	VXLANIf string
	// Egress NAT: endpoints reach the outside source-NATed to SNATIP (default: the VTEP)
	// out of EgressIf (default: the device holding SNATIP), with ports (ICMP echo ids)
	// EgressPortMin..EgressPortMax (0, 0 = the default range).
	SNATIP        netip.Addr
	EgressIf      string
	EgressPortMin uint16
	EgressPortMax uint16
	// EgressAllowMetadata lets endpoints reach the cloud instance metadata address
	// 169.254.169.254 through egress NAT (as the node); every other link-local address,
	// and that one by default, is refused (drop_egress_link_local).
	EgressAllowMetadata bool
	// Encrypted says the host's overlay traffic travels inside WireGuard (netplugin
	// --encryption wireguard): decrypted overlay packets come out of the WireGuard device,
	// so every UDP packet to VXLANPort arriving from the wire is dropped
	// (drop_clear_overlay). cb_from_uplink is put on the device holding the VTEP for it:
	// New fails when no device of the host holds the VTEP, or when loopback or a dummy
	// device does (no packet from the underlay enters there).
	Encrypted bool
	// XDP is where the uplink's XDP prefilter runs (XDPOff, "" too; XDPNative; XDPGeneric:
	// xdp.go): on the device holding the VTEP, it drops before the skb what the tc
	// programs would drop anyway (overlay packets from a host that is not a peer, to an
	// unknown VNI, with a spoofed inner source; with Encrypted, every clear overlay
	// packet). New fails when no device of the host holds the VTEP, when loopback or a
	// dummy device does, or (native) when the device's driver has no XDP.
	XDP string
	// DNSIP is the host address the agent's DNS responder listens on (port 53):
	// endpoints' UDP queries to their gateway's port 53 are steered to it. Invalid: none.
	DNSIP netip.Addr
	// CgroupPath is the cgroup v2 directory the socket-level LB is attached to, so the
	// host's own processes reach service VIPs and node ports ("" = the cgroup2 root found
	// at /sys/fs/cgroup/unified or /sys/fs/cgroup; "off" = none).
	CgroupPath string
	// StepObserver, when set, receives the duration of each step of UpsertEndpoint
	// (called with the driver's lock held: it must be quick and must not call back into
	// the driver).
	StepObserver StepObserver
}

// config is what a Driver runs with: the host's config and the options, defaults applied.
type config struct {
	dataplane.HostConfig
	Options
	// detached, when set (tests), is called with the lock held each time an endpoint's
	// tcx link has been detached: where a delete, rollback, sweep or teardown opens the
	// hook.
	detached func(ifname string)
}
