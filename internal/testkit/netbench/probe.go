package netbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Server is a TCP echo server living in one namespace. It answers fixed-size requests
// with same-size responses and accepts connections for the connection-rate probe.
type Server struct {
	ln    net.Listener
	wg    sync.WaitGroup
	addr  string
	mu    sync.Mutex
	conns map[net.Conn]bool // open connections, closed by Close
}

// StartServer listens on addr (ip:port) inside the namespace at nsPath.
func StartServer(nsPath, addr string) (*Server, error) {
	var ln net.Listener
	err := nsexec.Run(nsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s in %s: %w", addr, nsPath, err)
	}
	s := &Server{ln: ln, addr: addr, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.conns == nil { // closed meanwhile
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
			buf := make([]byte, 64*1024)
			for {
				var hdr [4]byte
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				n := int(binary.BigEndian.Uint32(hdr[:]))
				if n > len(buf) {
					return
				}
				if _, err := io.ReadFull(c, buf[:n]); err != nil {
					return
				}
				if _, err := c.Write(append(hdr[:], buf[:n]...)); err != nil {
					return
				}
			}
		}()
	}
}

// Close stops the server, closes the connections still open (a client blocked on one,
// e.g. after a failed test, would otherwise keep Close waiting) and waits for them to end.
func (s *Server) Close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.conns = nil
	s.mu.Unlock()
	s.wg.Wait()
}

// Dialer opens connections from inside a namespace.
type Dialer struct {
	nsPath string
}

// NewDialer returns a dialer whose sockets are created in the namespace at nsPath.
func NewDialer(nsPath string) *Dialer { return &Dialer{nsPath: nsPath} }

// Dial connects to addr from the dialer's namespace.
func (d *Dialer) Dial(addr string) (net.Conn, error) {
	var c net.Conn
	err := nsexec.Run(d.nsPath, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

// RR performs n request/response round trips of size bytes on one connection and
// returns every round-trip time.
func RR(conn net.Conn, n, size int) ([]time.Duration, error) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	msg := make([]byte, 4+size)
	binary.BigEndian.PutUint32(msg, uint32(size))
	resp := make([]byte, 4+size)
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := conn.Write(msg); err != nil {
			return out, fmt.Errorf("rr write: %w", err)
		}
		if _, err := io.ReadFull(conn, resp); err != nil {
			return out, fmt.Errorf("rr read: %w", err)
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}

// CRR opens, uses once and closes connections for d and returns connections per second.
// Each connection does one 64-byte round trip, like netperf's TCP_CRR.
func CRR(ctx context.Context, dialer *Dialer, addr string, d time.Duration) (float64, error) {
	var count int
	var firstErr error
	// Create every socket inside the namespace from one locked thread to avoid paying
	// for a namespace switch per connection.
	err := nsexec.Run(dialer.nsPath, func() error {
		deadline := time.Now().Add(d)
		start := time.Now()
		for time.Now().Before(deadline) && ctx.Err() == nil {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			if _, err := RR(c, 1, 64); err != nil && firstErr == nil {
				firstErr = err
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST instead of TIME_WAIT, so ports are not exhausted
			}
			c.Close()
			count++
		}
		el := time.Since(start).Seconds()
		if el > 0 {
			count = int(float64(count) / el * 1000)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if count == 0 && firstErr != nil {
		return 0, fmt.Errorf("crr %s: %w", addr, firstErr)
	}
	return float64(count) / 1000, nil
}

// Percentile returns the p-th percentile (0-100) of samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(float64(len(s)-1) * p / 100)
	return s[idx]
}

// ErrNoSamples is returned when a probe produced nothing to measure.
var ErrNoSamples = errors.New("no samples")
