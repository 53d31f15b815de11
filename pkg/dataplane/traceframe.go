package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Validate checks what both drivers' Trace need: an IPv4 destination, TCP or UDP with a
// destination port, or ICMP.
func (r TraceRequest) Validate() error {
	if !r.Dst.Is4() {
		return fmt.Errorf("trace: destination %v is not an IPv4 address", r.Dst)
	}
	switch r.Proto {
	case 6, 17:
		if r.DstPort == 0 {
			return fmt.Errorf("trace: %s needs a destination port", map[uint8]string{6: "tcp", 17: "udp"}[r.Proto])
		}
	case 1:
	default:
		return fmt.Errorf("trace: protocol %d: want tcp (6), udp (17) or icmp (1)", r.Proto)
	}
	return nil
}

// TraceFrame builds the frame a container would send for a trace: Ethernet, IPv4 (DF,
// TTL 64) and a TCP SYN, a UDP datagram or an ICMP echo request (proto 6, 17, else 1;
// sport is the echo id), with valid checksums. Both drivers use it: the eBPF one runs it
// through its programs, and a TraceTunnel's Inner frame crosses from one host's trace to
// the other's (either dataplane) in this form.
func TraceFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, proto uint8, sport, dport uint16) []byte {
	var l4 []byte
	switch proto {
	case 6:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		binary.BigEndian.PutUint32(l4[4:], 1)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:], 64240)
	case 17:
		l4 = make([]byte, 8+16)
		binary.BigEndian.PutUint16(l4[0:], sport)
		binary.BigEndian.PutUint16(l4[2:], dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	default:
		l4 = make([]byte, 8+16)
		l4[0] = 8 // echo request
		binary.BigEndian.PutUint16(l4[4:], sport)
		binary.BigEndian.PutUint16(l4[6:], 1)
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, proto
	s, t := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], t[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip, 0))
	switch proto {
	case 6:
		binary.BigEndian.PutUint16(l4[16:], checksum(l4, pseudoSum(s, t, proto, len(l4))))
	case 17:
		binary.BigEndian.PutUint16(l4[6:], checksum(l4, pseudoSum(s, t, proto, len(l4))))
	default:
		binary.BigEndian.PutUint16(l4[2:], checksum(l4, 0))
	}
	frame := append(append(append([]byte{}, dstMAC...), srcMAC...), 0x08, 0x00)
	return append(append(frame, ip...), l4...)
}

// TraceFrameFields reads back what TraceFrame wrote (or any Ethernet + IPv4 frame): the
// MACs, addresses, protocol, TTL and ports (the ICMP echo id as sport). ok is false for
// anything shorter or not IPv4.
func TraceFrameFields(f []byte) (srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, proto, ttl uint8, sport, dport uint16, ok bool) {
	if len(f) < 34 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[14]>>4 != 4 {
		return
	}
	ihl := int(f[14]&0x0f) * 4
	if ihl < 20 || len(f) < 14+ihl {
		return
	}
	dstMAC, srcMAC = net.HardwareAddr(f[0:6]), net.HardwareAddr(f[6:12])
	ip := f[14:]
	src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	proto, ttl = ip[9], ip[8]
	l4 := ip[ihl:]
	switch {
	case (proto == 6 || proto == 17) && len(l4) >= 4:
		sport, dport = binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
	case proto == 1 && len(l4) >= 6:
		sport = binary.BigEndian.Uint16(l4[4:])
	}
	return srcMAC, dstMAC, src, dst, proto, ttl, sport, dport, true
}

func pseudoSum(s, t [4]byte, proto uint8, n int) uint32 {
	sum := uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:])) +
		uint32(binary.BigEndian.Uint16(t[0:])) + uint32(binary.BigEndian.Uint16(t[2:]))
	return sum + uint32(proto) + uint32(n)
}

func checksum(b []byte, seed uint32) uint16 {
	sum := seed
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
