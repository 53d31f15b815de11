package ovs

import (
	"context"
	"encoding/binary"
	"net/netip"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Refusing flows to a service without backends (kube-proxy's REJECT; the eBPF datapath
// does it in bpf/lib/icmp.h): the service_lb flow of such a VIP:port marks a UDP datagram
// or a bare TCP SYN (regFlags bit flagReject), and the answer table sends its first
// rejectMaxLen bytes to the agent through the sender's port meter (portmeter.go) and the
// reject meter; the agent builds the ICMP port unreachable
// (dataplane.ICMPPortUnreachable: from the VIP, quoting the packet's IPv4 header and 8
// bytes) and sends it out of the port the packet came in on (packet-out). The meter bounds
// what a container flooding a dead VIP costs vswitchd and the agent; beyond it packets
// are dropped unanswered, as before.
const (
	rejectMeter  = 0xcb02
	rejectRate   = 1000 // packet-ins per second, all ports together
	rejectBurst  = 200
	rejectMaxLen = 128 // an Ethernet header, an IPv4 header with options and 8 bytes fit

	// The responders that vswitchd runs on every packet (an ICMP field set is a slow-path
	// action: no datapath flow caches it) pass this meter after the sender's port meter:
	// containers pinging VIPs without end hold vswitchd's handler threads no longer than
	// this rate allows.
	responderMeter = 0xcb03
	responderRate  = 1000 // packets per second, all of them together
	responderBurst = 200

	ofptPacketOut  = 13
	ofppController = 0xfffffffd
)

// toAgentReject sends the packet to the agent to be refused (through the reject meter).
func (f *flow) toAgentReject() *flow {
	return f.a(&controller2{maxLen: rejectMaxLen, meter: rejectMeter}, "controller(reject_no_backend)")
}

// isReject says whether a packet-in is one toAgentReject sent.
func isReject(table tableID, regs [8]uint32) bool {
	return table == tAnswer && regs[regFlags]&(1<<flagReject) != 0
}

// Expired TTLs in routing mode (RFC 1812: a router answers them, so traceroute works; the
// eBPF datapath does it in bpf/lib/icmp.h cb_ttl_exceeded): a local endpoint's packet
// that l3_rewrite would route with a TTL of 1 or 0 is sent, through the reject meter, to
// the agent with its network's gateway in regSvcIP (ttlExpiredFlows), through the sending
// port's answer meter and the reject meter like a refusal (answers), and the agent sends
// the sender an ICMP time exceeded from that gateway (dataplane.ICMPTimeExceeded) out of
// the port it came in on. Not for translated (service) packets: the error would quote
// what the client never sent.

// toAgentTTL sends the packet to the agent to be answered time exceeded.
func (f *flow) toAgentTTL() *flow {
	return f.a(&controller2{maxLen: rejectMaxLen, meter: rejectMeter}, "controller(reject_ttl_exceeded)")
}

// isTTLExpired says whether a packet-in is one toAgentTTL sent.
func isTTLExpired(table tableID, regs [8]uint32) bool {
	return table == tAnswer && regs[regFlags]&(1<<flagTTLExpired) != 0
}

// ttlExceeded answers a packet toAgentTTL sent from OpenFlow port inPort, from gateway gw
// (as ipU32 puts it in regSvcIP). It runs in the OpenFlow read loop: it only writes.
func (d *Driver) ttlExceeded(inPort, gw uint32, frame []byte) {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], gw)
	reply, ok := dataplane.ICMPTimeExceeded(frame, netip.AddrFrom4(a))
	c := d.rejectConn.Load()
	if !ok || c == nil {
		return
	}
	if err := c.write(c.newMsg(ofptPacketOut, packetOut(inPort, reply))); err != nil {
		d.log.Debug("ttl exceeded: packet-out failed", "err", err)
	}
}

// setRejectMeter (re)installs the reject meter and the responders' meter; the rejecting
// flows and the VIPs' echo responders refer to them. An OVS that refuses the reject meter
// sends the rejected packets nowhere, one that refuses the responders' has no flow
// answering pings of VIPs (both logged).
func (d *Driver) setRejectMeter(ctx context.Context) {
	if err := d.addMeter(ctx, rejectMeter, rejectRate, rejectBurst); err != nil {
		d.log.Warn("no meter for refusing flows to services without backends: they are dropped unanswered", "err", err)
	}
	if err := d.addMeter(ctx, responderMeter, responderRate, responderBurst); err != nil {
		d.log.Warn("no meter for answering pings of service VIPs: they go unanswered", "err", err)
	}
}

// reject answers a packet a rejecting flow sent from OpenFlow port inPort. It runs in the
// OpenFlow read loop: it only writes.
func (d *Driver) reject(inPort uint32, frame []byte) {
	reply, ok := dataplane.ICMPPortUnreachable(frame)
	c := d.rejectConn.Load()
	if !ok || c == nil {
		return
	}
	if err := c.write(c.newMsg(ofptPacketOut, packetOut(inPort, reply))); err != nil {
		d.log.Debug("reject: packet-out failed", "err", err)
	}
}

// packetOut is an OpenFlow 1.3 packet-out body: data sent out of port.
func packetOut(port uint32, data []byte) []byte {
	b := make([]byte, 16+16, 16+16+len(data))
	binary.BigEndian.PutUint32(b[0:], 0xffffffff) // no buffer
	binary.BigEndian.PutUint32(b[4:], ofppController)
	binary.BigEndian.PutUint16(b[8:], 16) // actions_len; 6 bytes of padding follow
	a := b[16:]
	binary.BigEndian.PutUint16(a[0:], 0) // OFPAT_OUTPUT
	binary.BigEndian.PutUint16(a[2:], 16)
	binary.BigEndian.PutUint32(a[4:], port)
	return append(b, data...)
}
