package conformance

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Raw frame builders for the adversarial cases: what a hostile container writes with an
// AF_PACKET socket. Checksums are correct unless a case says otherwise.

// Broadcast is the Ethernet broadcast address.
var Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// TCP flag bits.
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPPsh = 0x08
	TCPAck = 0x10
)

// EthFrame returns an Ethernet II frame.
func EthFrame(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	f := make([]byte, 14, 14+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], etherType)
	return append(f, payload...)
}

// LoneLastFragment returns a UDP datagram's last fragment (offset 1,480, 64 bytes, IP id
// id) from src to dst in an Ethernet frame: a fragment whose datagram never completes.
func LoneLastFragment(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, id uint16) []byte {
	pkt := IPv4Packet(src, dst, 17, make([]byte, 64))
	binary.BigEndian.PutUint16(pkt[4:], id)
	binary.BigEndian.PutUint16(pkt[6:], 185) // offset 1,480 (185 × 8), no MF, no DF
	pkt[10], pkt[11] = 0, 0
	binary.BigEndian.PutUint16(pkt[10:], checksum(pkt[:20], 0))
	return EthFrame(dstMAC, srcMAC, 0x0800, pkt)
}

// TagFrame inserts a VLAN tag (tpid 0x8100 for 802.1Q, 0x88a8 for 802.1ad) after the
// MAC addresses of frame.
func TagFrame(frame []byte, tpid, vid uint16) []byte {
	out := make([]byte, 0, len(frame)+4)
	out = append(out, frame[:12]...)
	out = binary.BigEndian.AppendUint16(out, tpid)
	out = binary.BigEndian.AppendUint16(out, vid&0x0fff)
	return append(out, frame[12:]...)
}

// IPv4Packet returns an IPv4 packet (20-byte header, TTL 64, DF) around payload.
func IPv4Packet(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	var id [2]byte
	_, _ = rand.Read(id[:])
	copy(h[4:6], id[:])
	h[6] = 0x40
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	binary.BigEndian.PutUint16(h[10:], checksum(h, 0))
	return append(h, payload...)
}

// UDPDatagram returns a UDP header and payload with its checksum over the pseudo-header.
func UDPDatagram(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	c := checksum(u, pseudoSum(src, dst, 17, len(u)))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return u
}

// TCPSegment returns a 20-byte TCP header (window 65535) with payload and checksum.
func TCPSegment(src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags uint8, payload []byte) []byte {
	t := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dport)
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], ack)
	t[12] = 5 << 4
	t[13] = flags
	binary.BigEndian.PutUint16(t[14:], 65535)
	t = append(t, payload...)
	binary.BigEndian.PutUint16(t[16:], checksum(t, pseudoSum(src, dst, 6, len(t))))
	return t
}

// UDPFrame is a complete Ethernet/IPv4/UDP frame.
func UDPFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	return EthFrame(dstMAC, srcMAC, 0x0800, IPv4Packet(src, dst, 17, UDPDatagram(src, dst, sport, dport, payload)))
}

// ARPFrame is an Ethernet ARP frame (op 1 request, 2 reply); requests go to broadcast.
func ARPFrame(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	a := make([]byte, 28)
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], 0x0800)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], op)
	copy(a[8:14], sha)
	s, t := spa.As4(), tpa.As4()
	copy(a[14:18], s[:])
	copy(a[18:24], tha)
	copy(a[24:28], t[:])
	dst := tha
	if op == 1 {
		dst = Broadcast
	}
	return EthFrame(dst, sha, 0x0806, a)
}

func pseudoSum(src, dst netip.Addr, proto uint8, n int) uint32 {
	s, d := src.As4(), dst.As4()
	var sum uint32
	for _, b := range [][4]byte{s, d} {
		sum += uint32(b[0])<<8 | uint32(b[1])
		sum += uint32(b[2])<<8 | uint32(b[3])
	}
	return sum + uint32(proto) + uint32(n)
}

func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// SendRawFrame writes frame as is (no tag offload, no checksum help) to ifname inside the
// namespace at nsPath through an AF_PACKET socket.
func SendRawFrame(nsPath, ifname string, frame []byte) error {
	return SendRawFrames(nsPath, ifname, [][]byte{frame})
}

// SendRawFrames writes frames (each as is) to ifname inside the namespace at nsPath
// through one AF_PACKET socket.
func SendRawFrames(nsPath, ifname string, frames [][]byte) error {
	return nsexec.Run(nsPath, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("raw frame: %w", err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("raw frame: socket: %w", err)
		}
		defer unix.Close(fd)
		for _, frame := range frames {
			sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6, Protocol: htons(binary.BigEndian.Uint16(frame[12:14]))}
			copy(sa.Addr[:], frame[0:6])
			if err := unix.Sendto(fd, frame, 0, sa); err != nil {
				return fmt.Errorf("raw frame on %s: send: %w", ifname, err)
			}
		}
		return nil
	})
}

// Frames stops the capture and returns every frame it saw (VLAN tags re-inserted).
func (c *Capture) Frames() [][]byte {
	close(c.stop)
	<-c.done
	unix.Close(c.fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

// VXLANPayload is the UDP payload of a VXLAN packet (RFC 7348): an 8-byte header with the
// I flag and vni, then the inner Ethernet frame.
func VXLANPayload(vni uint32, inner []byte) []byte {
	h := make([]byte, 8, 8+len(inner))
	h[0] = 0x08
	binary.BigEndian.PutUint32(h[4:], vni<<8)
	return append(h, inner...)
}
