package statetest

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards loopback TCP connections to an etcd client URL. Cut closes every
// connection and refuses new ones: etcd becomes unreachable for the clients dialled
// through the proxy only. Mend lets them connect again. The proxy stops at test end.
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

// NewProxy starts a Proxy to etcdURL ("http://host:port").
func NewProxy(t testing.TB, etcdURL string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{l: l, target: strings.TrimPrefix(etcdURL, "http://")}
	t.Cleanup(func() { p.Cut(); l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.cut
			p.mu.Unlock()
			if cut {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				up.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.l.Addr().String() }

// Cut closes every forwarded connection and refuses new ones until Mend.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Mend forwards new connections again.
func (p *Proxy) Mend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}
