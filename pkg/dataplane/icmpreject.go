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
	ip, hlen, ok := quotable(frame)
	if !ok {
		return nil, false
	}
	switch ip[9] {
	case 17:
	case 6:
		const syn, fin, rst, ack = 0x02, 0x01, 0x04, 0x10
		if len(ip) < hlen+14 || ip[hlen+13]&(syn|fin|rst|ack) != syn {
			return nil, false
		}
	default:
		return nil, false
	}
	return icmpError(frame, 3, 3, netip.AddrFrom4([4]byte(ip[16:20]))), true
}

// ICMPTimeExceeded is the reply a datapath that routes sends for a frame whose TTL runs
// out (eBPF: bpf/lib/icmp.h cb_ttl_exceeded; OVS: the agent, on a packet-in): an ICMP
// time exceeded in transit (type 11, code 0) from gw, the router the sender addressed,
// otherwise as ICMPPortUnreachable's (RFC 1812 5.3.1). ok is false for a frame no ICMP
// error may answer, as ICMPPortUnreachable's, and for one that is itself an ICMP error
// or not TCP, UDP or ICMP.
func ICMPTimeExceeded(frame []byte, gw netip.Addr) (reply []byte, ok bool) {
	ip, _, ok := quotable(frame)
	if !ok || !gw.Is4() || !answerable(gw) {
		return nil, false
	}
	switch ip[9] {
	case 6, 17:
	case 1:
		if t := ip[int(ip[0]&0xf)*4]; t == 3 || t == 4 || t == 5 || t == 11 || t == 12 {
			return nil, false // an error is never answered with an error
		}
	default:
		return nil, false
	}
	return icmpError(frame, 11, 0, gw), true
}

// quotable returns the IPv4 header of frame and its length when an ICMP error may quote
// it (see ICMPPortUnreachable): an untagged IPv4 frame with 8 bytes of L4, not a later
// fragment, between unicast link-layer and answerable IPv4 addresses.
func quotable(frame []byte) (ip []byte, hlen int, ok bool) {
	if len(frame) < 14+20 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 || frame[0]&1 != 0 || frame[6]&1 != 0 {
		return nil, 0, false
	}
	ip = frame[14:]
	hlen = int(ip[0]&0xf) * 4
	if ip[0]>>4 != 4 || hlen < 20 || len(ip) < hlen+8 || binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 {
		return nil, 0, false
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	if !answerable(src) || !answerable(dst) {
		return nil, 0, false
	}
	return ip, hlen, true
}

// icmpError builds the ICMP error (typ, code) from the address from about frame (quotable):
// back to its sender, MACs swapped, TTL 64, TOS 0xc0, IP id 0, quoting its IPv4 header and
// 8 bytes, checksums computed.
func icmpError(frame []byte, typ, code uint8, from netip.Addr) []byte {
	ip := frame[14:]
	quote := ip[:int(ip[0]&0xf)*4+8]
	reply := make([]byte, 14+28+len(quote))
	copy(reply[0:6], frame[6:12])
	copy(reply[6:12], frame[0:6])
	binary.BigEndian.PutUint16(reply[12:], 0x0800)
	h := reply[14:34]
	h[0], h[1], h[8], h[9] = 0x45, 0xc0, 64, 1
	binary.BigEndian.PutUint16(h[2:], uint16(28+len(quote)))
	f := from.As4()
	copy(h[12:16], f[:])
	copy(h[16:20], ip[12:16])
	binary.BigEndian.PutUint16(h[10:], checksum(h, 0))
	icmp := reply[34:]
	icmp[0], icmp[1] = typ, code
	copy(icmp[8:], quote)
	binary.BigEndian.PutUint16(icmp[2:], checksum(icmp, 0))
	return reply
}

// answerable says whether a may be either address of a packet an ICMP error answers: not
// in 0.0.0.0/8 ("this network"), loopback, multicast or the limited broadcast (the eBPF
// datapath's cb_dst_invalid).
func answerable(a netip.Addr) bool {
	b := a.As4()
	return b[0] != 0 && !a.IsLoopback() && !a.IsMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}
