package dataplane

import (
	"encoding/binary"
	"net/netip"
)

// ICMPPortUnreachable is the reply a datapath sends for a frame that opens a flow to a
// service VIP:port without backends (eBPF: bpf/lib/icmp.h; OVS: the agent, on a
// packet-in): an ICMP destination unreachable, code 3 (port unreachable), from the VIP to
// the sender, MACs swapped, TTL 64, TOS 0xc0, IP id 0, quoting the frame's IPv4 header with
// its options and the first 8 bytes of its payload (RFC 792), checksums computed. ok is
// false for a frame no ICMP error may answer (RFC 1122 3.2.2, RFC 1812 4.3.2.7): not an
// untagged IPv4 TCP or UDP frame with 8 bytes of L4 (14 for TCP), a later fragment, to
// or from a link-layer group address, from or to a "this network" (0/8), loopback,
// multicast or broadcast address, a TCP segment other than a bare SYN. The reply is never
// larger than the frame plus 28 bytes.
func ICMPPortUnreachable(frame []byte) (reply []byte, ok bool) {
	if len(frame) < 14+20 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 || frame[0]&1 != 0 || frame[6]&1 != 0 {
		return nil, false
	}
	ip := frame[14:]
	hlen := int(ip[0]&0xf) * 4
	if ip[0]>>4 != 4 || hlen < 20 || binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 {
		return nil, false
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	if !answerable(src) || !answerable(dst) {
		return nil, false
	}
	switch ip[9] {
	case 17:
		if len(ip) < hlen+8 {
			return nil, false
		}
	case 6:
		const syn, fin, rst, ack = 0x02, 0x01, 0x04, 0x10
		if len(ip) < hlen+14 || ip[hlen+13]&(syn|fin|rst|ack) != syn {
			return nil, false
		}
	default:
		return nil, false
	}
	quote := ip[:hlen+8]
	reply = make([]byte, 14+28+len(quote))
	copy(reply[0:6], frame[6:12])
	copy(reply[6:12], frame[0:6])
	binary.BigEndian.PutUint16(reply[12:], 0x0800)
	h := reply[14:34]
	h[0], h[1], h[8], h[9] = 0x45, 0xc0, 64, 1
	binary.BigEndian.PutUint16(h[2:], uint16(28+len(quote)))
	copy(h[12:16], ip[16:20])
	copy(h[16:20], ip[12:16])
	binary.BigEndian.PutUint16(h[10:], checksum(h, 0))
	icmp := reply[34:]
	icmp[0], icmp[1] = 3, 3
	copy(icmp[8:], quote)
	binary.BigEndian.PutUint16(icmp[2:], checksum(icmp, 0))
	return reply, true
}

// answerable says whether a may be either address of a packet an ICMP error answers: not
// in 0.0.0.0/8 ("this network"), loopback, multicast or the limited broadcast (the eBPF
// datapath's cb_dst_invalid).
func answerable(a netip.Addr) bool {
	b := a.As4()
	return b[0] != 0 && !a.IsLoopback() && !a.IsMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}
