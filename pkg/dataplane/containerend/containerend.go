// Package containerend owns the container side of an endpoint's veth pair, the same for
// both dataplanes: its MAC and MTU, and inside the container's namespace its IPv4 (and,
// best effort, IPv6) address, link state, loopback and default route via the gateway.
package containerend

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// MTU is the MTU of n's containers: n.MTU, or 1450 on VXLAN (a 1500 underlay less the
// encapsulation) and 1500 on VLAN when unset.
func MTU(n dataplane.Network) int {
	if n.MTU != 0 {
		return n.MTU
	}
	if n.Encap == dataplane.EncapVXLAN {
		return 1450
	}
	return 1500
}

// Configure sets up the container end ep.IfName of endpoint ep on network n. host is a
// netlink handle in the host namespace, where the container end is when ep.NetNS is empty
// (then only MAC and MTU are set: the runtime moves and addresses it, and an end the
// runtime already moved is no error).
func Configure(host *netlink.Handle, ep dataplane.Endpoint, n dataplane.Network) error {
	h := host
	if ep.NetNS != "" {
		cns, err := netns.GetFromPath(ep.NetNS)
		if err != nil {
			return fmt.Errorf("open container netns %s: %w", ep.NetNS, err)
		}
		defer cns.Close()
		if h, err = netlink.NewHandleAt(cns); err != nil {
			return fmt.Errorf("netlink in %s: %w", ep.NetNS, err)
		}
		defer h.Close()
	}
	l, err := h.LinkByName(ep.IfName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if ep.NetNS == "" && errors.As(err, &nf) {
			return nil // the runtime (Docker) already moved it into the container
		}
		return fmt.Errorf("look up container end %s: %w", ep.IfName, err)
	}
	if l.Attrs().HardwareAddr.String() != ep.MAC.String() {
		if err := h.LinkSetHardwareAddr(l, ep.MAC); err != nil {
			return fmt.Errorf("set mac of %s: %w", ep.IfName, err)
		}
	}
	if mtu := MTU(n); l.Attrs().MTU != mtu {
		if err := h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set mtu of %s: %w", ep.IfName, err)
		}
	}
	if ep.NetNS == "" {
		return nil
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ep.IP.AsSlice(), Mask: net.CIDRMask(n.Subnet.Bits(), 32)}}
	if err := h.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("set address %v on %s: %w", addr, ep.IfName, err)
	}
	if ep.IPv6.IsValid() {
		// Best effort: neither datapath forwards IPv6 yet, and a namespace may have it off.
		a6 := &netlink.Addr{IPNet: &net.IPNet{IP: ep.IPv6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		_ = h.AddrReplace(l, a6)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", ep.IfName, err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		if err := h.LinkSetUp(lo); err != nil {
			return fmt.Errorf("set lo up: %w", err)
		}
	}
	if n.Gateway.IsValid() {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: n.Gateway.AsSlice()}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("default route via %v on %s: %w", n.Gateway, ep.IfName, err)
		}
	}
	return nil
}
