package wgtunnel

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// Peer is one remote host as the device should know it.
type Peer struct {
	PublicKey wgtypes.Key
	// Endpoint is the peer's underlay address and listen port.
	Endpoint netip.AddrPort
	// AllowedIPs are the inner addresses the peer may send from and is sent to.
	AllowedIPs []netip.Prefix
	// Keepalive, if not 0, is WireGuard's persistent keepalive interval (whole seconds).
	// The device also sends one keepalive as soon as the peer is added, which starts a
	// handshake at once: a device that restarted without its sessions is then known to
	// its peers again without waiting for them to notice (15 s of their traffic lost).
	Keepalive time.Duration
}

// Changes counts what SyncPeers did.
type Changes struct {
	Added, Updated, Removed int
}

// checkPeers refuses a list the device would take in a way nobody asked for: WireGuard
// keeps one peer per key, and an allowed IP on two peers silently moves to the last one
// (so a host could take another's addresses).
func checkPeers(own wgtypes.Key, peers []Peer) error {
	keys := map[wgtypes.Key]bool{}
	owner := map[netip.Prefix]int{}
	for i, p := range peers {
		switch {
		case p.PublicKey == (wgtypes.Key{}):
			return fmt.Errorf("peers[%d]: public key is empty", i)
		case p.PublicKey == own:
			return fmt.Errorf("peers[%d]: public key %s is this device's own", i, p.PublicKey)
		case keys[p.PublicKey]:
			return fmt.Errorf("peers[%d]: public key %s listed twice", i, p.PublicKey)
		case !p.Endpoint.IsValid() || p.Endpoint.Port() == 0 || p.Endpoint.Addr().IsUnspecified():
			return fmt.Errorf("peers[%d] (%s): endpoint %q is not an address:port", i, p.PublicKey, p.Endpoint)
		case p.Keepalive < 0 || p.Keepalive > 65535*time.Second || p.Keepalive%time.Second != 0:
			return fmt.Errorf("peers[%d] (%s): keepalive %s is not 0 to 65535 whole seconds", i, p.PublicKey, p.Keepalive)
		}
		keys[p.PublicKey] = true
		for _, a := range p.AllowedIPs {
			if !a.IsValid() || a.Masked() != a {
				return fmt.Errorf("peers[%d] (%s): allowed IP %q is not a network prefix", i, p.PublicKey, a)
			}
			if j, ok := owner[a]; ok && j == i {
				// (the device keeps it once: the list would never match the device)
				return fmt.Errorf("peers[%d] (%s): allowed IP %s listed twice", i, p.PublicKey, a)
			}
			for q, j := range owner {
				if j != i && q.Overlaps(a) {
					return fmt.Errorf("peers[%d] (%s): allowed IP %s overlaps %s of peers[%d]", i, p.PublicKey, a, q, j)
				}
			}
			owner[a] = i
		}
	}
	return nil
}

// SyncPeers makes the device's peers exactly peers, in one wgctrl call: a peer not
// listed is removed, a new one added, one whose endpoint or allowed IPs differ updated
// (its session kept), an unchanged one left alone. A list with a repeated or the device's
// own key, a bad endpoint, an allowed IP listed twice or on two peers is refused and
// changes nothing.
func (t *Tunnel) SyncPeers(ctx context.Context, peers []Peer) (Changes, error) {
	var ch Changes
	if err := ctx.Err(); err != nil {
		return ch, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ch, fmt.Errorf("wireguard device %s: closed", t.cfg.Name)
	}
	if err := checkPeers(t.pub, peers); err != nil {
		return ch, fmt.Errorf("wireguard device %s: %w", t.cfg.Name, err)
	}
	have, err := t.peers()
	if err != nil {
		return ch, err
	}
	var cfg []wgtypes.PeerConfig
	want := map[wgtypes.Key]bool{}
	for _, p := range peers {
		want[p.PublicKey] = true
		old, found := have[p.PublicKey]
		if found && samePeer(old, p) {
			continue
		}
		if found {
			ch.Updated++
		} else {
			ch.Added++
		}
		ips := make([]net.IPNet, 0, len(p.AllowedIPs))
		for _, a := range p.AllowedIPs {
			ips = append(ips, *prefixNet(a))
		}
		keepalive := p.Keepalive
		cfg = append(cfg, wgtypes.PeerConfig{
			PublicKey:                   p.PublicKey,
			Endpoint:                    net.UDPAddrFromAddrPort(p.Endpoint),
			PersistentKeepaliveInterval: &keepalive,
			ReplaceAllowedIPs:           true,
			AllowedIPs:                  ips,
		})
	}
	for k := range have {
		if !want[k] {
			ch.Removed++
			cfg = append(cfg, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		}
	}
	if len(cfg) == 0 {
		return ch, nil
	}
	if err := t.wg.ConfigureDevice(t.cfg.Name, wgtypes.Config{Peers: cfg}); err != nil {
		return Changes{}, fmt.Errorf("configure peers of wireguard device %s: %w", t.cfg.Name, err)
	}
	t.cfg.Log.Info("wireguard peers synced", "device", t.cfg.Name, "added", ch.Added, "updated", ch.Updated, "removed", ch.Removed)
	return ch, nil
}

// Peers reads the device's peers back through wgctrl.
func (t *Tunnel) Peers(ctx context.Context) ([]Peer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	have, err := t.peers()
	if err != nil {
		return nil, err
	}
	out := make([]Peer, 0, len(have))
	for _, p := range have {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return slices.Compare(a.PublicKey[:], b.PublicKey[:]) })
	return out, nil
}

// peers reads the device's peers by key.
func (t *Tunnel) peers() (map[wgtypes.Key]Peer, error) {
	d, err := t.wg.Device(t.cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("read wireguard device %s: %w", t.cfg.Name, err)
	}
	out := make(map[wgtypes.Key]Peer, len(d.Peers))
	for _, p := range d.Peers {
		q := Peer{PublicKey: p.PublicKey, Keepalive: p.PersistentKeepaliveInterval}
		if p.Endpoint != nil {
			q.Endpoint = p.Endpoint.AddrPort()
		}
		for _, n := range p.AllowedIPs {
			a, _ := netip.AddrFromSlice(n.IP)
			bits, _ := n.Mask.Size()
			q.AllowedIPs = append(q.AllowedIPs, netip.PrefixFrom(a.Unmap(), bits))
		}
		out[p.PublicKey] = q
	}
	return out, nil
}

// samePeer reports whether the device's peer have already is want.
func samePeer(have, want Peer) bool {
	if have.Endpoint.Addr().Unmap() != want.Endpoint.Addr().Unmap() || have.Endpoint.Port() != want.Endpoint.Port() || have.Keepalive != want.Keepalive {
		return false
	}
	a := slices.Clone(have.AllowedIPs)
	b := slices.Clone(want.AllowedIPs)
	cmp := func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	}
	slices.SortFunc(a, cmp)
	slices.SortFunc(b, cmp)
	return slices.Equal(a, b)
}

// PeerOf makes the peer of a host's published record (model.WireGuardHost) with the
// inner addresses it is given.
func PeerOf(rec model.WireGuardHost, allowed []netip.Prefix) (Peer, error) {
	if err := rec.Check(); err != nil {
		return Peer{}, fmt.Errorf("wireguard record of host %q: %w", rec.Host, err)
	}
	k, err := wgtypes.ParseKey(rec.PublicKey)
	if err != nil {
		return Peer{}, fmt.Errorf("wireguard record of host %q: publicKey: %w", rec.Host, err)
	}
	ep, err := netip.ParseAddrPort(rec.Endpoint)
	if err != nil {
		return Peer{}, fmt.Errorf("wireguard record of host %q: endpoint: %w", rec.Host, err)
	}
	return Peer{PublicKey: k, Endpoint: ep, AllowedIPs: allowed}, nil
}
