package reffwd

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Forwarder is the loaded reference program with its private (unpinned) map.
type Forwarder struct {
	objs reffwdObjects
}

// Load loads the reference forwarder. Needs root (map and program creation).
func Load() (*Forwarder, error) {
	f := &Forwarder{}
	if err := loadReffwdObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("reffwd: load: %w", err)
	}
	return f, nil
}

// Program returns the tc program (rf_forward).
func (f *Forwarder) Program() *ebpf.Program { return f.objs.RfForward }

// SetDest makes packets to dst leave by bpf_redirect_peer(ifindex) with destination MAC mac.
func (f *Forwarder) SetDest(dst netip.Addr, ifindex uint32, mac net.HardwareAddr) error {
	if !dst.Is4() || len(mac) != 6 {
		return fmt.Errorf("reffwd: set dest %v %v: want an IPv4 address and a 6-byte MAC", dst, mac)
	}
	b := dst.As4()
	v := reffwdRfDest{Ifindex: ifindex}
	copy(v.Mac[:], mac)
	if err := f.objs.RfDests.Put(binary.NativeEndian.Uint32(b[:]), &v); err != nil {
		return fmt.Errorf("reffwd: set dest %v: %w", dst, err)
	}
	return nil
}

// Close releases the program and its map.
func (f *Forwarder) Close() error { return f.objs.Close() }
