package cluster

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// cutProxy forwards loopback TCP connections to an etcd client URL until Cut, which
// closes every connection and the listener: etcd becomes unreachable for the clients
// dialled through the proxy only.
type cutProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newCutProxy(t *testing.T, etcdURL string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, target: strings.TrimPrefix(etcdURL, "http://")}
	t.Cleanup(p.Cut)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
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
				return
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) URL() string { return "http://" + p.l.Addr().String() }

func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestElectionStepsDownBeforeLeaseExpiry: when the leader cannot reach etcd it must stop
// acting as leader within about TTL/2, before etcd expires its lease and another
// candidate takes the lock: there is never a moment with two leaders.
func TestElectionStepsDownBeforeLeaseExpiry(t *testing.T) {
	direct, url := statetest.Store(t)
	proxy := newCutProxy(t, url)
	viaProxy, err := state.Open(context.Background(), []string{proxy.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })

	const ttl = 2 * time.Second
	a, _ := startElection(t, viaProxy, "10.0.0.1:9999", ttl)
	waitFor(t, 5*time.Second, "a leads", a.IsLeader)
	b, _ := startElection(t, direct, "10.0.0.2:9999", ttl)
	waitFor(t, 5*time.Second, "b sees a as leader", func() bool { return b.CurrentLeader() == "10.0.0.1:9999" })
	time.Sleep(ttl / 3) // let a renew a few times so the cut lands at a random point

	cut := time.Now()
	proxy.Cut()
	var aDown, bUp time.Duration
	deadline := cut.Add(4 * ttl)
	for time.Now().Before(deadline) && (aDown == 0 || bUp == 0) {
		now := time.Since(cut)
		if aDown == 0 && !a.IsLeader() {
			aDown = now
		}
		if bUp == 0 && b.IsLeader() {
			bUp = now
			if aDown == 0 {
				t.Fatalf("two leaders: b leads %s after the cut while a still does", now)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("after cutting a off etcd: a stepped down at %s, b took over at %s (TTL %s)", aDown, bUp, ttl)
	if aDown == 0 {
		t.Fatal("a never stepped down")
	}
	if aDown > ttl/2+250*time.Millisecond {
		t.Errorf("a stepped down %s after losing etcd, want within TTL/2 (+250ms) = %s", aDown, ttl/2+250*time.Millisecond)
	}
	if bUp == 0 {
		t.Fatal("b never took over")
	}
	if aDown >= bUp {
		t.Errorf("leadership overlap: a stepped down at %s, b led from %s", aDown, bUp)
	}
}
