package netbench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/wgtunnel"
)

// Addresses of the WireGuardPair baseline: the underlay wire and the tunnel.
const (
	WGUnderlay1 = "10.194.0.1"
	WGUnderlay2 = "10.194.0.2"
	WGTunnel1   = "10.193.0.1"
	WGTunnel2   = "10.193.0.2"
)

// WireGuard is the encrypted cross-host baseline built by WireGuardPair.
type WireGuard struct {
	*Topology
	// Tunnels are the two devices, in namespace order.
	Tunnels []*wgtunnel.Tunnel
	keyDir  string
}

// WireGuardPair builds the encrypted cross-host baseline: two namespaces <prefix>1 and
// <prefix>2 joined by a veth wire (WGUnderlay1/2, MTU 1500), each with a WireGuard device
// opened by pkg/wgtunnel as netplugin --encryption wireguard opens its own (the kernel
// module's where the kernel has one, else wireguard-go in this process), named
// <prefix>w1/<prefix>w2 (unique per machine: a userspace device's control socket is
// named after it), MTU 1500 minus 80 as netplugin sets it, addresses WGTunnel1/2 in one
// /24 (the route between them). Each device's only peer is the other: allowed IP its
// tunnel /32, endpoint its wire address. Nothing else is in the path.
func WireGuardPair(ctx context.Context, prefix string) (_ *WireGuard, err error) {
	w := &WireGuard{Topology: &Topology{}}
	defer func() {
		if err != nil {
			w.Close()
			err = fmt.Errorf("build wireguard baseline: %w", err)
		}
	}()
	if w.keyDir, err = os.MkdirTemp("", prefix+"-wgkeys"); err != nil {
		return nil, err
	}
	ns := []string{prefix + "1", prefix + "2"}
	wire := []string{WGUnderlay1, WGUnderlay2}
	inner := []string{WGTunnel1, WGTunnel2}
	for _, n := range ns {
		if err := w.addNS(n); err != nil {
			return nil, err
		}
	}
	if err := nsip(ns[0], "link", "add", "wire", "type", "veth", "peer", "name", "wire", "netns", ns[1]); err != nil {
		return nil, err
	}
	for i, n := range ns {
		if err := nsip(n, "addr", "add", wire[i]+"/24", "dev", "wire"); err != nil {
			return nil, err
		}
		if err := nsip(n, "link", "set", "wire", "up"); err != nil {
			return nil, err
		}
		dir := fmt.Sprintf("%s/%d", w.keyDir, i+1)
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		t, err := wgtunnel.Open(ctx, wgtunnel.Config{NetNS: NSPath(n), Name: fmt.Sprintf("%sw%d", prefix, i+1), StateDir: dir,
			Address: netip.MustParsePrefix(inner[i] + "/24"), MTU: 1500 - 80})
		if err != nil {
			return nil, err
		}
		w.Tunnels = append(w.Tunnels, t)
	}
	for i, t := range w.Tunnels {
		o := w.Tunnels[1-i]
		peer := wgtunnel.Peer{PublicKey: o.PublicKey(),
			Endpoint:   netip.AddrPortFrom(netip.MustParseAddr(wire[1-i]), uint16(o.ListenPort())),
			AllowedIPs: []netip.Prefix{netip.MustParsePrefix(inner[1-i] + "/32")}}
		if _, err := t.SyncPeers(ctx, []wgtunnel.Peer{peer}); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Close removes the devices, the namespaces and the keys.
func (w *WireGuard) Close() {
	for _, t := range w.Tunnels {
		_ = t.Close()
	}
	w.Tunnels = nil
	w.Topology.Close()
	if w.keyDir != "" {
		_ = os.RemoveAll(w.keyDir)
	}
}

// TxBytes is the bytes sent by the link named dev in the named namespace.
func TxBytes(ns, dev string) (uint64, error) {
	var n uint64
	err := nsexec.Run(NSPath(ns), func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("link %s: %w", dev, err)
		}
		if l.Attrs().Statistics == nil {
			return errors.New("no statistics")
		}
		n = l.Attrs().Statistics.TxBytes
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("tx bytes of %s in %s: %w", dev, ns, err)
	}
	return n, nil
}
