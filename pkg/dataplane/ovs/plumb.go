package ovs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/containerend"
)

// nsHandle opens a netlink handle in the namespace at path ("" = the caller's).
func nsHandle(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle()
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", path, err)
	}
	return h, nil
}

// txOff disables TX checksum offload on ifname inside netns path: the userspace datapath
// forwards packets with partial checksums unchanged, which breaks TCP.
func txOff(ctx context.Context, path, ifname string) error {
	args := []string{"-K", ifname, "tx", "off"}
	name := "ethtool"
	if path != "" {
		args = append([]string{"--net=" + path, "ethtool"}, args...)
		name = "nsenter"
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ethtool -K %s tx off: %w: %s", ifname, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// wireARPQuiet makes the wire's kernel side stop answering ARP for addresses it does not
// hold (arp_ignore=1, arp_announce=2): once the VTEP address moved onto the underlay
// bridge, the wire would otherwise still answer for it with its own MAC, and a peer's
// userspace tunnel neighbour cache that snooped that answer sends VXLAN to a MAC the bridge
// never hands to its internal port (found by TestKubernetesServices/ovs: ~1 run in 7).
func wireARPQuiet(ctx context.Context, path, ifname string) error {
	for _, kv := range []string{"arp_ignore=1", "arp_announce=2"} {
		args := []string{"-q", "-w", "net/ipv4/conf/" + ifname + "/" + kv}
		name := "sysctl"
		if path != "" {
			args = append([]string{"--net=" + path, "sysctl"}, args...)
			name = "nsenter"
		}
		if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("sysctl %s of %s: %w: %s", kv, ifname, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// gratuitousARP broadcasts an ARP request for ip from ifname (sender = target = ip) in the
// namespace at nsPath ("" = this one), twice.
func gratuitousARP(nsPath, ifname string, ip netip.Addr) error {
	send := func() error {
		ifc, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		if len(ifc.HardwareAddr) != 6 {
			return fmt.Errorf("%s has no Ethernet address", ifname)
		}
		proto := uint16(unix.ETH_P_ARP)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto>>8|proto<<8))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		bcast := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		frame := make([]byte, 0, 42)
		frame = append(frame, bcast[:6]...)
		frame = append(frame, ifc.HardwareAddr...)
		frame = append(frame, 0x08, 0x06)                // ARP
		frame = append(frame, 0, 1, 0x08, 0, 6, 4, 0, 1) // Ethernet, IPv4, request
		frame = append(frame, ifc.HardwareAddr...)
		frame = append(frame, ip.AsSlice()...)
		frame = append(frame, 0, 0, 0, 0, 0, 0)
		frame = append(frame, ip.AsSlice()...)
		sa := &unix.SockaddrLinklayer{Protocol: proto>>8 | proto<<8, Ifindex: ifc.Index, Halen: 6, Addr: bcast}
		for i := 0; i < 2; i++ {
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("send: %w", err)
			}
		}
		return nil
	}
	if nsPath == "" {
		return send()
	}
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return send() })
}

func randName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// plumbEndpoint creates (or re-configures) the endpoint's veth pair: host end HostIfName
// in the host namespace, container end IfName in ep.NetNS (or left in the host namespace
// when NetNS is empty, with MAC and MTU only).
func plumbEndpoint(ctx context.Context, hostNS string, ep dataplane.Endpoint, n dataplane.Network) error {
	h, err := nsHandle(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	mtu := containerend.MTU(n)
	hostLink, err := h.LinkByName(ep.HostIfName)
	created := false
	if err != nil {
		peer := ep.IfName
		if ep.NetNS != "" {
			peer = randName("cbt")
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ep.HostIfName, MTU: mtu}, PeerName: peer, PeerHardwareAddr: ep.MAC}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("endpoint %s: create veth %s: %w", ep.ID, ep.HostIfName, err)
		}
		created = true
		fail := func(e error) error {
			_ = h.LinkDel(veth)
			return e
		}
		pl, err := h.LinkByName(peer)
		if err != nil {
			return fail(fmt.Errorf("endpoint %s: find veth peer %s: %w", ep.ID, peer, err))
		}
		if err := txOff(ctx, hostNS, peer); err != nil {
			return fail(fmt.Errorf("endpoint %s: %w", ep.ID, err))
		}
		if ep.NetNS != "" {
			cns, err := netns.GetFromPath(ep.NetNS)
			if err != nil {
				return fail(fmt.Errorf("endpoint %s: open netns %s: %w", ep.ID, ep.NetNS, err))
			}
			err = h.LinkSetNsFd(pl, int(cns))
			cns.Close()
			if err != nil {
				return fail(fmt.Errorf("endpoint %s: move %s to %s: %w", ep.ID, peer, ep.NetNS, err))
			}
			ch, err := nsHandle(ep.NetNS)
			if err != nil {
				return fail(err)
			}
			defer ch.Close()
			if err := ch.LinkSetName(pl, ep.IfName); err != nil {
				return fail(fmt.Errorf("endpoint %s: rename %s to %s: %w", ep.ID, peer, ep.IfName, err))
			}
		}
		if hostLink, err = h.LinkByName(ep.HostIfName); err != nil {
			return fail(err)
		}
		if err := txOff(ctx, hostNS, ep.HostIfName); err != nil {
			return fail(fmt.Errorf("endpoint %s: %w", ep.ID, err))
		}
	}
	if err := h.LinkSetMTU(hostLink, mtu); err != nil {
		return fmt.Errorf("endpoint %s: mtu on %s: %w", ep.ID, ep.HostIfName, err)
	}
	// Before the host end is up (a kept one of an older build gets it too).
	if err := dropHostIngress(h, hostLink); err != nil {
		if created {
			_ = h.LinkDel(hostLink)
		}
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	if err := h.LinkSetUp(hostLink); err != nil {
		return fmt.Errorf("endpoint %s: up %s: %w", ep.ID, ep.HostIfName, err)
	}
	if err := containerend.Configure(h, ep, n); err != nil {
		if created {
			_ = h.LinkDel(hostLink)
		}
		return fmt.Errorf("endpoint %s: %w", ep.ID, err)
	}
	return nil
}

// dropHostIngress makes the host's own stack drop everything that arrives on the host end
// l of an endpoint's veth: a clsact qdisc with a direct-action cls_bpf filter whose
// program drops every packet (the filter holds the program; nothing is pinned). The bridge
// still gets every frame: it reads the veth through a packet socket, which sees a frame
// before tc ingress runs; the kernel's IPv4 receive path, which comes after, would
// otherwise hand a container that addresses its frames to the host veth's MAC to the
// host's sockets (and, on a forwarding host, past it) unjudged, for as long as the veth
// exists (issue 33). Idempotent: the filter has a fixed priority and handle.
func dropHostIngress(h *netlink.Handle, l netlink.Link) error {
	name := l.Attrs().Name
	qs, err := h.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", name, err)
	}
	if !slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" }) {
		q := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
		if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add clsact qdisc to %s: %w", name, err)
		}
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: hostIngressName, Type: ebpf.SchedCLS, License: "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, int32(netlink.TC_ACT_SHOT)), asm.Return()}})
	if err != nil {
		return fmt.Errorf("load the drop program for %s: %w", name, err)
	}
	defer prog.Close()
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
		Priority: hostIngressPrio, Handle: 1, Protocol: unix.ETH_P_ALL}, Fd: prog.FD(), Name: hostIngressName, DirectAction: true}
	if err := h.FilterReplace(f); err != nil {
		return fmt.Errorf("add ingress drop filter to %s: %w", name, err)
	}
	return nil
}

const (
	hostIngressPrio = 1              // tc priority of dropHostIngress's filter
	hostIngressName = "cb_host_drop" // its program's name
)

// unplumbEndpoint deletes the host end of the veth (the pair goes with it).
func unplumbEndpoint(hostNS string, ep dataplane.Endpoint) error {
	h, err := nsHandle(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(ep.HostIfName)
	if err != nil {
		return nil
	}
	if err := h.LinkDel(l); err != nil {
		return fmt.Errorf("endpoint %s: delete %s: %w", ep.ID, ep.HostIfName, err)
	}
	return nil
}

// underlay describes where the VTEP address lives.
type underlay struct {
	wire string       // physical (veth) interface carrying VXLAN packets
	addr netlink.Addr // the VTEP address with its prefix
}

// findUnderlay finds the interface holding vtep in the host namespace. If the address is
// already on the underlay bridge's LOCAL port, the wire comes from the bridge's record.
func findUnderlay(hostNS string, vtep netip.Addr, bridge string) (*underlay, bool, error) {
	h, err := nsHandle(hostNS)
	if err != nil {
		return nil, false, err
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, false, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.Equal(ip4(vtep)) {
			l, err := h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, false, err
			}
			return &underlay{wire: l.Attrs().Name, addr: a}, l.Attrs().Name == bridge, nil
		}
	}
	return nil, false, nil
}

// moveAddr moves addr from link "from" to link "to" (waiting for "to" to appear: the
// netdev datapath creates the bridge's tap asynchronously) and brings "to" up.
func moveAddr(ctx context.Context, hostNS string, addr netlink.Addr, from, to string) error {
	h, err := nsHandle(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	var tl netlink.Link
	deadline := time.Now().Add(5 * time.Second)
	for {
		if tl, err = h.LinkByName(to); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("underlay: %s did not appear: %w", to, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if from != "" {
		if fl, err := h.LinkByName(from); err == nil {
			if tl.Attrs().MTU != fl.Attrs().MTU {
				_ = h.LinkSetMTU(tl, fl.Attrs().MTU)
			}
			a := addr
			if err := h.AddrDel(fl, &a); err != nil && !errors.Is(err, netlink.ErrNotImplemented) {
				// Already gone is fine.
				_ = err
			}
		}
	}
	a := netlink.Addr{IPNet: addr.IPNet}
	if err := h.AddrReplace(tl, &a); err != nil {
		return fmt.Errorf("underlay: address %v on %s: %w", addr.IPNet, to, err)
	}
	if err := h.LinkSetUp(tl); err != nil {
		return fmt.Errorf("underlay: up %s: %w", to, err)
	}
	// Peers (their kernels and their vswitchds' tunnel neighbour caches, which snoop
	// gratuitous ARP) may hold the wire's MAC for this address from before the move: tell
	// them the bridge's. Best effort: the caches also refresh on their own, minutes later.
	if ip, ok := netip.AddrFromSlice(addr.IPNet.IP.To4()); ok {
		if err := gratuitousARP(hostNS, to, ip); err != nil {
			return fmt.Errorf("underlay: announce %v on %s: %w", ip, to, err)
		}
	}
	return nil
}

func linkUp(hostNS, name string) error {
	h, err := nsHandle(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	return h.LinkSetUp(l)
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: ip4(p.Addr()), Mask: net.CIDRMask(p.Bits(), 32)}
}

// restoreAddr puts the VTEP address back on the wire after the underlay bridge is gone.
func restoreAddr(hostNS string, ul *underlay) error {
	h, err := nsHandle(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(ul.wire)
	if err != nil {
		return nil
	}
	a := netlink.Addr{IPNet: ul.addr.IPNet}
	if err := h.AddrReplace(l, &a); err != nil {
		return fmt.Errorf("restore %v on %s: %w", ul.addr.IPNet, ul.wire, err)
	}
	return nil
}
