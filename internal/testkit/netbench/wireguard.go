package netbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

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
	// Devices are the two devices' names, in namespace order.
	Devices []string
	// Kind is the devices' implementation.
	Kind   wgtunnel.Kind
	keyDir string
	procs  []*wgProc
}

// wgProc is a child process holding one device (WireGuardChild).
type wgProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// WireGuardChildArg is argv[1] of a child holding one baseline device: a program that
// builds the baseline dispatches it to WireGuardChild first thing in main (TestMain).
const WireGuardChildArg = "__netbench-wireguard"

// wgListenPort is each device's UDP port (each in its own namespace).
const wgListenPort = 51820

// WireGuardPair builds the encrypted cross-host baseline: two namespaces <prefix>1 and
// <prefix>2 joined by a veth wire (WGUnderlay1/2, MTU 1500), each with a WireGuard device
// opened by pkg/wgtunnel as netplugin --encryption wireguard opens its own (the kernel
// module's where the kernel has one, else wireguard-go), named <prefix>w1/<prefix>w2
// (unique per machine: a userspace device's control socket is named after it), MTU 1500
// minus 80 as netplugin sets it, addresses WGTunnel1/2 in one /24 (the route between
// them). Each device's only peer is the other: allowed IP its tunnel /32, endpoint its
// wire address. Nothing else is in the path. Each device is held by its own child
// process (self WireGuardChildArg ...), as each host's device is by its own netplugin:
// wireguard-go in the caller's process would share its scheduler with the probes.
func WireGuardPair(ctx context.Context, prefix, self string) (_ *WireGuard, err error) {
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
	var dirs, pubs []string
	for i, n := range ns {
		if err := w.addNS(n); err != nil {
			return nil, err
		}
		dir := fmt.Sprintf("%s/%d", w.keyDir, i+1)
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		k, err := wgtunnel.LoadOrCreateKey(dir)
		if err != nil {
			return nil, err
		}
		dirs, pubs = append(dirs, dir), append(pubs, k.PublicKey().String())
		w.Devices = append(w.Devices, fmt.Sprintf("%sw%d", prefix, i+1))
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
		cmd := exec.CommandContext(ctx, self, WireGuardChildArg, NSPath(n), w.Devices[i], dirs[i], inner[i]+"/24",
			pubs[1-i], fmt.Sprintf("%s:%d", wire[1-i], wgListenPort), inner[1-i]+"/32")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		p := &wgProc{cmd: cmd}
		if p.stdin, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start device %s: %w", w.Devices[i], err)
		}
		w.procs = append(w.procs, p)
		line, err := bufio.NewReader(out).ReadString('\n')
		kind, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
		if err != nil || !ok {
			return nil, fmt.Errorf("device %s: child said %q: %v", w.Devices[i], line, err)
		}
		w.Kind = wgtunnel.Kind(kind)
	}
	return w, nil
}

// WireGuardChild is the child side of WireGuardPair: args are the namespace path, device
// name, key directory, device address, the peer's public key, endpoint and allowed IP.
// It opens the device, takes the peer, prints "ready <kind>" and holds the device until
// its standard input closes.
func WireGuardChild(args []string) int {
	if err := wireGuardChild(args); err != nil {
		fmt.Fprintf(os.Stderr, "netbench wireguard child: %v\n", err)
		return 1
	}
	return 0
}

func wireGuardChild(args []string) error {
	if len(args) != 7 {
		return fmt.Errorf("want 7 arguments, have %d", len(args))
	}
	addr, err := netip.ParsePrefix(args[3])
	if err != nil {
		return fmt.Errorf("address: %w", err)
	}
	pub, err := wgtypes.ParseKey(args[4])
	if err != nil {
		return fmt.Errorf("peer key: %w", err)
	}
	ep, err := netip.ParseAddrPort(args[5])
	if err != nil {
		return fmt.Errorf("peer endpoint: %w", err)
	}
	allowed, err := netip.ParsePrefix(args[6])
	if err != nil {
		return fmt.Errorf("peer allowed IP: %w", err)
	}
	ctx := context.Background()
	t, err := wgtunnel.Open(ctx, wgtunnel.Config{NetNS: args[0], Name: args[1], StateDir: args[2], Address: addr,
		ListenPort: wgListenPort, MTU: 1500 - 80})
	if err != nil {
		return err
	}
	defer t.Close()
	if _, err := t.SyncPeers(ctx, []wgtunnel.Peer{{PublicKey: pub, Endpoint: ep, AllowedIPs: []netip.Prefix{allowed}}}); err != nil {
		return err
	}
	fmt.Printf("ready %s\n", t.Kind())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// Close stops the devices' processes and removes the namespaces and the keys.
func (w *WireGuard) Close() {
	for _, p := range w.procs {
		_ = p.stdin.Close()
		done := make(chan struct{})
		go func() {
			_ = p.cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	}
	w.procs = nil
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
