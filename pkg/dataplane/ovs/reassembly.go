package ovs

import (
	"context"
	"strconv"
)

// setReassembly turns on the userspace datapath's IPv4 reassembly for conntrack
// (dpctl/ipf-set-enabled): without it every fragment is an invalid packet to ct(), and
// a datagram larger than the MTU never passes a tracked flow or a VIP. With it, each
// ct() holds a datagram's fragments until it is whole, looks the datagram up, and
// releases the fragments with its state (and its NAT applied); the pipeline's fragment
// flows (pipeline.go: laterFragments, servicePort) make all of them reach the same ct()
// actions. A new vswitchd starts with it off: called on every connection. Fragments
// conntrack holds are bounded by vswitchd for the whole datapath (ipf-set-max-nfrags,
// raised here from 1,000 to its ceiling of 5,000; 15 s each), and per container port by
// its fragment meter (portmeter.go); non-last fragments under 1,200 bytes are refused
// (ipf-set-min-frag).
func (d *Driver) setReassembly(ctx context.Context) {
	if _, err := d.appctl(ctx, "dpctl/ipf-set-enabled", "v4"); err != nil {
		d.log.Warn("conntrack reassembly not enabled: fragmented datagrams are dropped", "err", err)
		return
	}
	if _, err := d.appctl(ctx, "dpctl/ipf-set-max-nfrags", strconv.Itoa(fragMaxHeld)); err != nil {
		d.log.Warn("conntrack reassembly keeps vswitchd's fragment ceiling", "err", err)
	}
}
