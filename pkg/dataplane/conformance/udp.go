package conformance

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// UDPServer echoes datagrams inside a namespace and counts them per client address.
type UDPServer struct {
	conn    net.PacketConn
	Addr    string
	mu      sync.Mutex
	clients map[string]int
}

// StartUDPEcho listens on ip:port inside the namespace at path.
func StartUDPEcho(path, ip string, port int) (*UDPServer, error) {
	var pc net.PacketConn
	err := InNetNS(path, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(ip, fmt.Sprint(port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("udp listen on %s:%d: %w", ip, port, err)
	}
	s := &UDPServer{conn: pc, Addr: pc.LocalAddr().String(), clients: map[string]int{}}
	go s.loop()
	return s, nil
}

func (s *UDPServer) loop() {
	buf := make([]byte, 2048)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.clients[from.String()]++
		s.mu.Unlock()
		_, _ = s.conn.WriteTo(buf[:n], from)
	}
}

// Flows is the number of distinct client addresses seen.
func (s *UDPServer) Flows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

// Close stops the server.
func (s *UDPServer) Close() { s.conn.Close() }

// UDPExchange sends msg from a fresh socket (new source port) in the namespace at path
// to addr and waits for the echo; it retries a few times (the first datagram may be
// lost to ARP resolution). It returns the address the reply came from.
func UDPExchange(path, addr string, msg []byte, wait time.Duration) (string, error) {
	var pc net.PacketConn
	err := InNetNS(path, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", ":0")
		return err
	})
	if err != nil {
		return "", fmt.Errorf("udp socket: %w", err)
	}
	defer pc.Close()
	to, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	for try := 0; try < 3; try++ {
		if _, err := pc.WriteTo(msg, to); err != nil {
			return "", fmt.Errorf("udp send to %s: %w", addr, err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(wait))
		n, from, err := pc.ReadFrom(buf)
		if err == nil && string(buf[:n]) == string(msg) {
			return from.String(), nil
		}
	}
	return "", fmt.Errorf("udp %s from %s: no echo", addr, pc.LocalAddr())
}
