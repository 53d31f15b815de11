package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// XDP modes (Options.XDP): where the uplink's prefilter (cb_xdp_uplink) runs.
const (
	XDPOff     = "off"     // no prefilter: every packet gets its skb and the tc path
	XDPNative  = "native"  // in the driver's receive path (veth and most NICs' drivers)
	XDPGeneric = "generic" // after the skb is built (any device): the same drops, less saved
)

// xdpLinkPrefix names the prefilter's pinned link on the VTEP's device.
const xdpLinkPrefix = "xdp_"

// checkXDPMode says whether mode is one Options.XDP takes ("" is off).
func checkXDPMode(mode string) error {
	switch mode {
	case "", XDPOff, XDPNative, XDPGeneric:
		return nil
	}
	return fmt.Errorf("ebpf: xdp mode %q must be %s, %s or %s", mode, XDPOff, XDPNative, XDPGeneric)
}

// xdpDevice is where the prefilter sits: the device holding the VTEP, where other hosts'
// overlay packets arrive. Zero when the mode is off.
func (d *Driver) xdpDevice() (underlay, error) {
	if d.cfg.XDP == "" || d.cfg.XDP == XDPOff {
		return underlay{}, nil
	}
	dev, err := d.vtepDevice("xdp prefilter")
	if err != nil {
		return underlay{}, err
	}
	return dev, nil
}

// attachXDP puts cb_xdp_uplink on the VTEP's device in the configured mode (a link pinned
// under PinRoot/links, updated in place on restart: no moment without it). A pinned link
// of the other mode is replaced, and one on another device (or any, when off) removed
// first (dropStaleXDP): the prefilter only drops what the tc programs drop too,
// so the moment between the two costs speed, never a packet or a check.
func (d *Driver) attachXDP() error {
	name := xdpLinkPrefix + d.xdp.ifname
	d.dropStaleXDP(name)
	if d.xdp.ifindex == 0 {
		return nil
	}
	prog := d.objs.CbXdpUplink
	flags, want := link.XDPDriverMode, uint32(xdpAttachedDrv)
	if d.cfg.XDP == XDPGeneric {
		flags, want = link.XDPGenericMode, xdpAttachedSKB
	}
	if a, ok := d.links[name]; ok && a.ifindex == d.xdp.ifindex && a.hook == "xdp-"+d.cfg.XDP {
		return nil
	}
	path := filepath.Join(d.cfg.PinRoot, linksDir, name)
	// Another device, or the other mode: replaced.
	l, err := updatePinnedLink(path, prog, func(info *link.Info) bool {
		return info.XDP() != nil && int(info.XDP().Ifindex) == d.xdp.ifindex && d.xdpAttachMode() == want
	})
	if err != nil {
		return err
	}
	if l != nil {
		d.setLink(&attachment{ifname: name, ifindex: d.xdp.ifindex, program: contivbpfProgCbXdpUplink, link: l, hook: "xdp-" + d.cfg.XDP})
		return nil
	}
	err = nsexec.Run(d.cfg.NetNS, func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: d.xdp.ifindex, Flags: flags})
		return err
	})
	if err != nil {
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("ebpf: attach xdp (%s) to %s: %w (another XDP program holds the device: another agent on this host, or a tool; one device takes one XDP program, so detach it or start with --xdp off)", d.cfg.XDP, d.xdp.ifname, err)
		}
		if d.cfg.XDP == XDPNative && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
			return fmt.Errorf("ebpf: attach xdp (native) to %s: %w (the driver has no native XDP, or not at this MTU: --xdp generic works on any device)", d.xdp.ifname, err)
		}
		return fmt.Errorf("ebpf: attach xdp (%s) to %s: %w", d.cfg.XDP, d.xdp.ifname, err)
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return fmt.Errorf("ebpf: pin xdp link of %s: %w", d.xdp.ifname, err)
	}
	d.setLink(&attachment{ifname: name, ifindex: d.xdp.ifindex, program: contivbpfProgCbXdpUplink, link: l, hook: "xdp-" + d.cfg.XDP})
	d.log.Info("xdp prefilter attached", "device", d.xdp.ifname, "mode", d.cfg.XDP)
	return nil
}

// dropStaleXDP detaches every prefilter an earlier run pinned but this one does not want
// (keep is the one it wants, "" none): the mode is off now, or the VTEP moved to another
// device. At the start, not at the first Sync: the earlier build's program would judge
// with maps a layout migration froze (migrate.go) until then, or for good were Sync to
// fail, dropping the overlay packets of peers and endpoints added since. Without a
// prefilter the tc path judges everything: a moment without it costs speed only.
func (d *Driver) dropStaleXDP(keep string) {
	ents, err := os.ReadDir(filepath.Join(d.cfg.PinRoot, linksDir))
	if err != nil {
		return // (open made the directory; Sync's sweep reports what it cannot read)
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, xdpLinkPrefix) && (d.xdp.ifindex == 0 || n != keep) {
			d.detachTCX(n)
			d.log.Info("xdp prefilter detached", "link", n)
		}
	}
}

// The kernel's IFLA_XDP_ATTACHED values for a driver (native) and a generic program.
const (
	xdpAttachedDrv = 1
	xdpAttachedSKB = 2
)

// xdpAttachMode is how an XDP program is attached to the prefilter's device now
// (IFLA_XDP_ATTACHED; 0: none or unknown).
func (d *Driver) xdpAttachMode() uint32 {
	l, err := d.nl.LinkByIndex(d.xdp.ifindex)
	if err != nil || l.Attrs().Xdp == nil {
		return 0
	}
	return uint32(l.Attrs().Xdp.AttachMode)
}

// XDPMode is the mode the uplink's prefilter runs in (XDPOff, XDPNative, XDPGeneric) and
// its device ("" when off).
func (d *Driver) XDPMode() (mode, device string) {
	if d.xdp.ifindex == 0 {
		return XDPOff, ""
	}
	return d.cfg.XDP, d.xdp.ifname
}
