package ebpf

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// TestRestartZeroLoss streams UDP between two local endpoints while the driver restarts
// (Close, New, Sync with the same state) and counts what arrives: nothing may be lost,
// because programs are swapped atomically on the pinned links and maps are reused.
func TestRestartZeroLoss(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	conformance.PingOK(t, a.NetNS, "10.50.0.3", 3) // resolve ARP before counting

	var rx *net.UDPConn
	if err := nsexec.Run(b.NetNS, func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.50.0.3"), Port: 9999})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	_ = rx.SetReadBuffer(4 << 20)
	var tx *net.UDPConn
	if err := nsexec.Run(a.NetNS, func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP("10.50.0.3"), Port: 9999})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()

	seen := map[uint32]bool{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			_ = rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := rx.Read(buf)
			if err != nil {
				return
			}
			if n >= 4 {
				mu.Lock()
				seen[binary.BigEndian.Uint32(buf)] = true
				mu.Unlock()
			}
		}
	}()

	const total = 1500
	stop := make(chan struct{})
	sent := make(chan int)
	go func() {
		i := 0
		defer func() { sent <- i }()
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for ; i < total; i++ {
			var b [32]byte
			binary.BigEndian.PutUint32(b[:], uint32(i))
			if _, err := tx.Write(b[:]); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()

	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = h.start(t)
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	n := <-sent
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	lost := n - len(seen)
	t.Logf("restart (Close, New, Sync) took %v while %d datagrams were sent; %d lost", took.Round(time.Millisecond), n, lost)
	if lost != 0 {
		t.Errorf("%d of %d datagrams lost across the restart", lost, n)
	}
}
