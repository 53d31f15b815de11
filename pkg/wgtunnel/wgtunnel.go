// Package wgtunnel owns a host's WireGuard device: it creates one device in a given
// network namespace (the kernel module's when the kernel has it, otherwise an in-process
// wireguard-go device over a TUN created inside that namespace), keeps the host's private
// key in a 0600 file under the agent's state directory (it never leaves the host), sets
// the listen port and brings the peer set to a desired list. Every setting goes through
// wgctrl, which drives both kinds of device alike. Close removes the device.
//
// It does not steer any traffic into the device: which packets enter it is the
// datapath's business (docs/encryption.md).
package wgtunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Kind names the implementation behind a device.
type Kind string

const (
	// Kernel is the kernel module's device (ip link type wireguard).
	Kernel Kind = "kernel"
	// Userspace is an in-process wireguard-go device over /dev/net/tun.
	Userspace Kind = "userspace"
)

// DefaultMTU leaves room for WireGuard's 60 bytes (IPv4) or 80 (IPv6) of overhead on a
// 1500-byte underlay.
const DefaultMTU = 1420

// Config says where and how to make the device.
type Config struct {
	// NetNS is the path of the network namespace that holds the device and its UDP
	// socket ("": the caller's).
	NetNS string
	// Name is the device's name (at most 15 bytes). A userspace device's control socket is
	// /var/run/wireguard/<Name>.sock (where wgctrl and wg(8) look), so names are unique
	// per machine, not only per namespace.
	Name string
	// StateDir holds the private key (KeyFile).
	StateDir string
	// ListenPort is the UDP port (0: one the kernel picks; ListenPort reports it).
	ListenPort int
	// Address is the device's own address (optional).
	Address netip.Prefix
	// MTU of the device (0: DefaultMTU).
	MTU int
	// FirewallMark marks the device's own UDP packets (0: none), so that policy routing
	// can keep them out of the table that steers traffic into the device.
	FirewallMark int
	// Userspace skips the kernel module even where it exists.
	Userspace bool
	Log       *slog.Logger
}

// Tunnel is one WireGuard device this process created and owns.
type Tunnel struct {
	cfg  Config
	kind Kind
	pub  wgtypes.Key
	nl   *netlink.Handle
	wg   *wgctrl.Client

	// userspace only
	dev  *device.Device
	uapi net.Listener
	sock string

	mu     sync.Mutex // one configuration at a time
	closed bool
}

// Open creates the device described by cfg, gives it the host's key (LoadOrCreateKey),
// the listen port and address, and brings it up with no peers. A device of that name
// that already exists is refused: this tunnel owns only what it created.
func Open(ctx context.Context, cfg Config) (_ *Tunnel, err error) {
	if cfg.Name == "" || len(cfg.Name) > unix.IFNAMSIZ-1 || filepath.Base(cfg.Name) != cfg.Name {
		return nil, fmt.Errorf("wireguard device name %q: want 1-%d bytes, no '/'", cfg.Name, unix.IFNAMSIZ-1)
	}
	if cfg.ListenPort < 0 || cfg.ListenPort > 65535 {
		return nil, fmt.Errorf("wireguard listen port %d: out of range 0-65535", cfg.ListenPort)
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key, err := LoadOrCreateKey(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	t := &Tunnel{cfg: cfg, pub: key.PublicKey()}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	// Both clients are made inside the namespace: netlink and wgctrl's generic netlink
	// socket stay there. (wgctrl reaches a userspace device by its socket path.)
	err = nsexec.Run(cfg.NetNS, func() error {
		var err error
		if t.nl, err = netlink.NewHandle(); err != nil {
			return fmt.Errorf("netlink handle: %w", err)
		}
		if _, err := t.nl.LinkByName(cfg.Name); err == nil {
			return fmt.Errorf("wireguard device %s: a link of that name already exists", cfg.Name)
		}
		if err := t.create(); err != nil {
			return err
		}
		if t.wg, err = wgctrl.New(); err != nil {
			return fmt.Errorf("wgctrl client: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wireguard device %s in netns %q: %w", cfg.Name, cfg.NetNS, err)
	}
	port, mark := cfg.ListenPort, cfg.FirewallMark
	if err := t.wg.ConfigureDevice(cfg.Name, wgtypes.Config{PrivateKey: &key, ListenPort: &port, FirewallMark: &mark, ReplacePeers: true}); err != nil {
		return nil, fmt.Errorf("configure wireguard device %s: %w", cfg.Name, err)
	}
	if err := t.linkUp(); err != nil {
		return nil, err
	}
	cfg.Log.Info("wireguard device up", "device", cfg.Name, "kind", t.kind, "netns", cfg.NetNS, "publicKey", t.pub.String(), "listenPort", t.ListenPort())
	return t, nil
}

// create makes the device in the current (locked) namespace: the kernel module's if the
// kernel has one, else wireguard-go's.
func (t *Tunnel) create() error {
	if !t.cfg.Userspace {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = t.cfg.Name, t.cfg.MTU
		err := t.nl.LinkAdd(&netlink.Wireguard{LinkAttrs: la})
		if err == nil {
			t.kind = Kernel
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("add kernel wireguard link: %w", err)
		}
	}
	t.kind = Userspace
	td, err := tun.CreateTUN(t.cfg.Name, t.cfg.MTU)
	if err != nil {
		return fmt.Errorf("create tun: %w", err)
	}
	ns := t.cfg.NetNS
	logger := &device.Logger{
		Verbosef: func(f string, a ...any) { t.cfg.Log.Debug(fmt.Sprintf(f, a...), "device", t.cfg.Name) },
		Errorf:   func(f string, a ...any) { t.cfg.Log.Warn(fmt.Sprintf(f, a...), "device", t.cfg.Name) },
	}
	t.dev = device.NewDevice(nsTun{Device: td, ns: ns}, nsBind{Bind: conn.NewDefaultBind(), ns: ns}, logger)
	f, err := ipc.UAPIOpen(t.cfg.Name)
	if err != nil {
		return fmt.Errorf("open control socket: %w", err)
	}
	t.sock = f.Name()
	if t.uapi, err = ipc.UAPIListen(t.cfg.Name, f); err != nil {
		f.Close()
		return fmt.Errorf("listen on control socket: %w", err)
	}
	go t.serveUAPI(t.uapi, t.dev)
	return nil
}

// serveUAPI answers wgctrl on the control socket until it closes.
func (t *Tunnel) serveUAPI(l net.Listener, dev *device.Device) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go dev.IpcHandle(c)
	}
}

// linkUp sets the address (if any) and brings the link up; a userspace device opens its
// UDP socket (inside the namespace: nsBind).
func (t *Tunnel) linkUp() error {
	link, err := t.nl.LinkByName(t.cfg.Name)
	if err != nil {
		return fmt.Errorf("wireguard device %s: %w", t.cfg.Name, err)
	}
	if t.cfg.Address.IsValid() {
		a := &netlink.Addr{IPNet: prefixNet(t.cfg.Address)}
		if err := t.nl.AddrReplace(link, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", t.cfg.Address, t.cfg.Name, err)
		}
	}
	if err := t.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", t.cfg.Name, err)
	}
	if t.dev != nil {
		// The TUN's "up" event does the same, later; do it now so the socket is open
		// (and its error seen) when Open returns.
		if err := t.dev.Up(); err != nil {
			return fmt.Errorf("wireguard device %s up: %w", t.cfg.Name, err)
		}
	}
	return nil
}

// Kind reports which implementation runs the device.
func (t *Tunnel) Kind() Kind { return t.kind }

// Name is the device's name.
func (t *Tunnel) Name() string { return t.cfg.Name }

// PublicKey is the host's public key, the one to publish (it changes with ReloadKey).
func (t *Tunnel) PublicKey() wgtypes.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pub
}

// KeyFile is the path of the host's private key file.
func (t *Tunnel) KeyFile() string { return filepath.Join(t.cfg.StateDir, KeyFile) }

// ReloadKey reads the key file again (LoadOrCreateKey, with its checks: a removed file
// means a new key) and, when it holds another key than the device's, gives the device
// that key and reports changed. The peers stay configured; their sessions expire, so the
// next packet to a peer starts a handshake with the new key, which that peer answers
// once it holds the new public key (publishing it is the caller's business). A refused
// file leaves the device's key in place. Reloads are serialized, the file read (or
// made) and the device configured together: two racing after the file was removed would
// each make a key, and the device could keep one while the file holds the other.
func (t *Tunnel) ReloadKey() (changed bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false, fmt.Errorf("wireguard device %s: closed", t.cfg.Name)
	}
	k, err := LoadOrCreateKey(t.cfg.StateDir)
	if err != nil {
		return false, err
	}
	if k.PublicKey() == t.pub {
		return false, nil
	}
	if err := t.wg.ConfigureDevice(t.cfg.Name, wgtypes.Config{PrivateKey: &k}); err != nil {
		return false, fmt.Errorf("new private key on wireguard device %s: %w", t.cfg.Name, err)
	}
	t.cfg.Log.Info("wireguard key rotated", "device", t.cfg.Name, "old", t.pub.String(), "new", k.PublicKey().String())
	t.pub = k.PublicKey()
	return true, nil
}

// ListenPort is the UDP port the device listens on (0 if it cannot be read).
func (t *Tunnel) ListenPort() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0
	}
	d, err := t.wg.Device(t.cfg.Name)
	if err != nil {
		return 0
	}
	return d.ListenPort
}

// Close removes the device (and a userspace device's socket and goroutines). It is
// idempotent.
func (t *Tunnel) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	// The socket's path goes before its listener closes: once closed, another Open of
	// the same name may create a socket there, which a later remove would delete.
	if t.sock != "" {
		if err := os.Remove(t.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove control socket: %w", err))
		}
	}
	if t.uapi != nil {
		errs = append(errs, t.uapi.Close())
	}
	if t.dev != nil {
		t.dev.Close() // closes the TUN, which removes its link
	}
	if t.kind == Kernel && t.nl != nil {
		if link, err := t.nl.LinkByName(t.cfg.Name); err == nil {
			if err := t.nl.LinkDel(link); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", t.cfg.Name, err))
			}
		}
	}
	if t.wg != nil {
		errs = append(errs, t.wg.Close())
	}
	if t.nl != nil {
		t.nl.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close wireguard device %s: %w", t.cfg.Name, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nsBind opens wireguard-go's UDP sockets inside the namespace, whichever goroutine asks:
// the device reopens them when its link goes up, from a goroutine of its own.
type nsBind struct {
	conn.Bind
	ns string
}

func (b nsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	err = nsexec.Run(b.ns, func() error {
		var err error
		fns, actual, err = b.Bind.Open(port)
		return err
	})
	return fns, actual, err
}

// nsTun reads the TUN's MTU (looked up by name) inside the namespace.
type nsTun struct {
	tun.Device
	ns string
}

func (d nsTun) MTU() (mtu int, err error) {
	err = nsexec.Run(d.ns, func() error {
		var err error
		mtu, err = d.Device.MTU()
		return err
	})
	return mtu, err
}
