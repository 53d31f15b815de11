package conformance

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// TCPServer is an echo server listening inside a namespace.
type TCPServer struct {
	ln       net.Listener
	Addr     string
	Accepted atomic.Int64 // connections accepted so far
}

// StartTCPEcho listens on ip:0 inside the namespace at path and echoes every connection.
func StartTCPEcho(path, ip string) (*TCPServer, error) {
	return StartTCPEchoPort(path, ip, 0)
}

// StartTCPEchoPort is StartTCPEcho on a given port.
func StartTCPEchoPort(path, ip string, port int) (*TCPServer, error) {
	var ln net.Listener
	err := nsexec.Run(path, func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(ip, fmt.Sprint(port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", ip, err)
	}
	s := &TCPServer{ln: ln, Addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.Accepted.Add(1)
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return s, nil
}

// Close stops the server.
func (s *TCPServer) Close() { s.ln.Close() }

// DialTCP connects from inside the namespace at path.
func DialTCP(path, addr string) (net.Conn, error) {
	return DialTCPTimeout(path, addr, 3*time.Second)
}

// DialTCPTimeout is DialTCP with a connect timeout.
func DialTCPTimeout(path, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := nsexec.Run(path, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

// EchoRoundTrip sends n random bytes over c and checks they come back unchanged.
func EchoRoundTrip(c net.Conn, n int) error {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(buf)
		errc <- err
	}()
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, buf) {
		return fmt.Errorf("echo differs")
	}
	return nil
}

// TCPCheck opens a connection from client to a fresh echo server in server, moves n bytes
// both ways and closes everything.
func TCPCheck(serverNS, serverIP, clientNS string, n int) error {
	s, err := StartTCPEcho(serverNS, serverIP)
	if err != nil {
		return err
	}
	defer s.Close()
	c, err := DialTCP(clientNS, s.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return EchoRoundTrip(c, n)
}

// WireStats summarises a capture on an underlay wire.
type WireStats struct {
	Frames        int
	VXLAN         int         // UDP frames to the VXLAN port
	ARPForSubnet  int         // plain ARP frames whose sender or target is in the container subnet
	ARPInOverlay  int         // VXLAN frames carrying ARP
	OtherARPFrame int         // underlay ARP (host addresses), allowed
	VLAN          map[int]int // 802.1Q frames by VLAN id
}

// Capture records every frame seen on one interface.
type Capture struct {
	fd      int
	mu      sync.Mutex
	frames  [][]byte
	partial []bool // the frame's L4 checksum was not done yet (CHECKSUM_PARTIAL)
	stop    chan struct{}
	done    chan struct{}
}

// CapturedFrame is one frame a Capture saw. CsumPartial: its skb was CHECKSUM_PARTIAL
// (TP_STATUS_CSUMNOTREADY), so its TCP or UDP checksum field holds the pseudo header's
// sum, which a device completes on transmit.
type CapturedFrame struct {
	Data        []byte
	CsumPartial bool
}

// StartCapture opens an AF_PACKET socket on ifname inside the namespace at path.
func StartCapture(path, ifname string) (*Capture, error) {
	c := &Capture{fd: -1, stop: make(chan struct{}), done: make(chan struct{})}
	err := nsexec.Run(path, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		// Offloaded VLAN tags are not in the frame bytes: ask for them as auxdata.
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
			unix.Close(fd)
			return err
		}
		// Room for a burst the reader has not caught up with (a busy machine): frames the
		// socket drops are frames the capture never saw.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("capture on %s: %w", ifname, err)
	}
	go c.loop()
	return c, nil
}

func (c *Capture) loop() {
	defer close(c.done)
	buf := make([]byte, 65536)
	oob := make([]byte, 256)
	stopping := false
	for {
		if !stopping {
			select {
			case <-c.stop:
				stopping = true // read what the socket still holds, then end
			default:
			}
		}
		n, oobn, _, _, err := unix.Recvmsg(c.fd, buf, oob, 0)
		if err != nil || n <= 0 {
			if stopping {
				return
			}
			continue
		}
		f := append([]byte(nil), buf[:n]...)
		status, tci, ok := auxData(oob[:oobn])
		if ok && (status&unix.TP_STATUS_VLAN_VALID != 0 || tci != 0) && n >= 12 {
			// Re-insert the offloaded tag so the frame reads as it was on the wire.
			tag := []byte{0x81, 0x00, byte(tci >> 8), byte(tci)}
			f = append(append(append([]byte(nil), f[:12]...), tag...), f[12:]...)
		}
		c.mu.Lock()
		c.frames = append(c.frames, f)
		c.partial = append(c.partial, ok && status&unix.TP_STATUS_CSUMNOTREADY != 0)
		c.mu.Unlock()
	}
}

// auxData extracts the status and an offloaded VLAN tag from PACKET_AUXDATA.
func auxData(oob []byte) (status uint32, tci uint16, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, 0, false
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_PACKET || m.Header.Type != unix.PACKET_AUXDATA || len(m.Data) < 20 {
			continue
		}
		return binary.NativeEndian.Uint32(m.Data[0:4]), binary.NativeEndian.Uint16(m.Data[16:18]), true
	}
	return 0, 0, false
}

// StopFrames ends the capture and returns what it saw.
func (c *Capture) StopFrames() []CapturedFrame {
	close(c.stop)
	<-c.done
	unix.Close(c.fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]CapturedFrame, len(c.frames))
	for i, f := range c.frames {
		out[i] = CapturedFrame{Data: f, CsumPartial: c.partial[i]}
	}
	return out
}

// Stop ends the capture and classifies what was seen.
func (c *Capture) Stop(subnet netip.Prefix, vxlanPort int) WireStats {
	close(c.stop)
	<-c.done
	unix.Close(c.fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := WireStats{VLAN: map[int]int{}}
	for _, f := range c.frames {
		s.Frames++
		if len(f) >= 18 && binary.BigEndian.Uint16(f[12:]) == 0x8100 {
			s.VLAN[int(binary.BigEndian.Uint16(f[14:])&0x0fff)]++
		}
		if isARP, sip, tip := arpAddrs(f); isARP {
			if subnet.Contains(sip) || subnet.Contains(tip) {
				s.ARPForSubnet++
			} else {
				s.OtherARPFrame++
			}
			continue
		}
		if inner, ok := vxlanInner(f, vxlanPort); ok {
			s.VXLAN++
			if isARP, _, _ := arpAddrs(inner); isARP {
				s.ARPInOverlay++
			}
		}
	}
	return s
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// arpAddrs reports whether f is an (optionally 802.1Q-tagged) ARP frame and its addresses.
func arpAddrs(f []byte) (bool, netip.Addr, netip.Addr) {
	if len(f) < 14 {
		return false, netip.Addr{}, netip.Addr{}
	}
	off := 12
	typ := binary.BigEndian.Uint16(f[off:])
	if typ == 0x8100 && len(f) >= 18 {
		off += 4
		typ = binary.BigEndian.Uint16(f[off:])
	}
	if typ != 0x0806 {
		return false, netip.Addr{}, netip.Addr{}
	}
	a := f[off+2:]
	if len(a) < 28 {
		return true, netip.Addr{}, netip.Addr{}
	}
	return true, netip.AddrFrom4([4]byte(a[14:18])), netip.AddrFrom4([4]byte(a[24:28]))
}

// vxlanInner returns the inner Ethernet frame of an IPv4/UDP VXLAN packet.
func vxlanInner(f []byte, port int) ([]byte, bool) {
	if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
		return nil, false
	}
	ip := f[14:]
	ihl := int(ip[0]&0xf) * 4
	if ip[9] != 17 || len(ip) < ihl+8+8 {
		return nil, false
	}
	udp := ip[ihl:]
	if int(binary.BigEndian.Uint16(udp[2:])) != port {
		return nil, false
	}
	return udp[8+8:], true
}
