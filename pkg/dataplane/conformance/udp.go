package conformance

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// UDPServer echoes datagrams inside a namespace and counts them per client address.
type UDPServer struct {
	conn    net.PacketConn
	Addr    string
	mu      sync.Mutex
	clients map[string]int
	ident   []byte // when set, every reply is ident instead of the datagram
	silent  bool   // count only, answer nothing
}

// StartUDPEcho listens on ip:port inside the namespace at path.
func StartUDPEcho(path, ip string, port int) (*UDPServer, error) {
	return startUDPServer(path, ip, port, nil, false)
}

// StartUDPIdent listens on ip:port inside the namespace at path and answers every datagram
// with ip (as text): the reply tells which backend a balanced flow reached.
func StartUDPIdent(path, ip string, port int) (*UDPServer, error) {
	return startUDPServer(path, ip, port, []byte(ip), false)
}

// StartUDPCount listens on ip:port inside the namespace at path and counts the datagrams
// per client without answering (Flows): a sink that sends nothing back.
func StartUDPCount(path, ip string, port int) (*UDPServer, error) {
	return startUDPServer(path, ip, port, nil, true)
}

func startUDPServer(path, ip string, port int, ident []byte, silent bool) (*UDPServer, error) {
	var pc net.PacketConn
	err := nsexec.Run(path, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(ip, fmt.Sprint(port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("udp listen on %s:%d: %w", ip, port, err)
	}
	s := &UDPServer{conn: pc, Addr: pc.LocalAddr().String(), clients: map[string]int{}, ident: ident, silent: silent}
	go s.loop()
	return s, nil
}

func (s *UDPServer) loop() {
	buf := make([]byte, 65535) // whole datagrams, fragmented ones too
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.clients[from.String()]++
		s.mu.Unlock()
		if s.silent {
			continue
		}
		reply := buf[:n]
		if s.ident != nil {
			reply = s.ident
		}
		_, _ = s.conn.WriteTo(reply, from)
	}
}

// Flows is the number of distinct client addresses seen.
func (s *UDPServer) Flows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

// Clients returns the client addresses seen ("ip:port"), in no order.
func (s *UDPServer) Clients() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.clients))
	for c := range s.clients {
		out = append(out, c)
	}
	return out
}

// Close stops the server.
func (s *UDPServer) Close() { s.conn.Close() }

// UDPExchange sends msg from a fresh socket (new source port) in the namespace at path
// to addr and waits for the echo; it retries a few times (the first datagram may be
// lost to ARP resolution). It returns the address the reply came from.
func UDPExchange(path, addr string, msg []byte, wait time.Duration) (string, error) {
	var pc net.PacketConn
	err := nsexec.Run(path, func() error {
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
	buf := make([]byte, 65535)
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

// SendUDP sends one datagram from a plain UDP socket bound to src (an address of the
// namespace at path, port chosen by the kernel) to dst ("ip:port").
func SendUDP(path, src, dst string, payload []byte) error {
	return nsexec.Run(path, func() error {
		la, err := net.ResolveUDPAddr("udp4", net.JoinHostPort(src, "0"))
		if err != nil {
			return fmt.Errorf("udp from %s: %w", src, err)
		}
		ra, err := net.ResolveUDPAddr("udp4", dst)
		if err != nil {
			return fmt.Errorf("udp to %s: %w", dst, err)
		}
		c, err := net.DialUDP("udp4", la, ra)
		if err != nil {
			return fmt.Errorf("udp %s → %s: %w", src, dst, err)
		}
		defer c.Close()
		if _, err := c.Write(payload); err != nil {
			return fmt.Errorf("udp %s → %s: send: %w", src, dst, err)
		}
		return nil
	})
}

// UDPReply is one datagram a UDPFlow received.
type UDPReply struct {
	At   time.Time
	From string // source address of the reply
	Body string
}

// UDPFlow is one UDP socket (one fixed source port) inside a namespace, sending to one
// address.
type UDPFlow struct {
	pc net.PacketConn
	to *net.UDPAddr
}

// OpenUDPFlow opens the flow's socket in the namespace at path.
func OpenUDPFlow(path, addr string) (*UDPFlow, error) {
	to, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("udp flow to %s: %w", addr, err)
	}
	var pc net.PacketConn
	err = nsexec.Run(path, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", ":0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("udp flow to %s: socket: %w", addr, err)
	}
	return &UDPFlow{pc: pc, to: to}, nil
}

// Close closes the flow's socket.
func (f *UDPFlow) Close() { f.pc.Close() }

// Run sends one datagram every interval for d and returns every reply received meanwhile.
func (f *UDPFlow) Run(d, interval time.Duration) ([]UDPReply, error) {
	var out []UDPReply
	buf := make([]byte, 2048)
	end := time.Now().Add(d)
	for seq := 0; time.Now().Before(end); seq++ {
		next := time.Now().Add(interval)
		if _, err := f.pc.WriteTo([]byte(fmt.Sprintf("seq-%d", seq)), f.to); err != nil {
			return out, fmt.Errorf("udp flow to %s: send: %w", f.to, err)
		}
		for {
			_ = f.pc.SetReadDeadline(next)
			n, from, err := f.pc.ReadFrom(buf)
			if err != nil {
				break // deadline: time for the next datagram
			}
			out = append(out, UDPReply{At: time.Now(), From: from.String(), Body: string(buf[:n])})
		}
	}
	return out, nil
}

// ReplyProbe checks that an ICMP error a client's kernel sends about a service's reply
// reaches the backend as an error about its own packet: the client sends one datagram
// from Client to VIP and closes its socket; the backend, its socket bound to Backend and
// connected to Peer (the client as the backend sees it: the VIP for a hairpin), reads it
// and answers; the client's port unreachable (quoting VIP → Client, sent to the VIP) must
// make the backend's socket see ECONNREFUSED.
type ReplyProbe struct {
	ClientNS, BackendNS   string
	Client, Backend, Peer netip.AddrPort
	VIP                   netip.AddrPort
}

// Refused runs the probe: nil once the backend's socket saw ECONNREFUSED, within three
// datagrams (the first may be lost to ARP resolution).
func (p ReplyProbe) Refused() error {
	var bc *net.UDPConn
	err := nsexec.Run(p.BackendNS, func() error {
		var err error
		bc, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(p.Backend), net.UDPAddrFromAddrPort(p.Peer))
		return err
	})
	if err != nil {
		return fmt.Errorf("backend socket %v → %v: %w", p.Backend, p.Peer, err)
	}
	defer bc.Close()
	send := func() error {
		return nsexec.Run(p.ClientNS, func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(p.Client), net.UDPAddrFromAddrPort(p.VIP))
			if err != nil {
				return fmt.Errorf("client socket %v → %v: %w", p.Client, p.VIP, err)
			}
			defer c.Close()
			_, err = c.Write([]byte("ask"))
			return err
		})
	}
	buf := make([]byte, 64)
	for try := 0; try < 3; try++ {
		if err := send(); err != nil {
			return err
		}
		_ = bc.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := bc.Read(buf); err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				return nil // the error about an earlier answer
			}
			continue
		}
		if _, err := bc.Write([]byte("answer")); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("backend answer: %w", err)
		}
		_ = bc.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := bc.Read(buf); errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
	}
	return fmt.Errorf("backend %v: no ECONNREFUSED for its answers to %v (the client's port unreachable lost or not translated)", p.Backend, p.Peer)
}
