package sim

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// NetNSPath is where `ip netns add NAME` pins a namespace.
func NetNSPath(name string) string { return "/run/netns/" + name }

// inNS runs fn on an OS thread switched into the named namespace. Sockets created by fn
// stay in that namespace after the thread switches back.
func inNS(name string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(NetNSPath(name))
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with this goroutine instead of going back
			// to the scheduler in the wrong namespace.
			done <- fmt.Errorf("return from netns %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// DialContext dials addr from inside the named namespace.
func DialContext(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s in netns %s: %w", network, addr, ns, err)
	}
	return c, nil
}

// Listen opens a listener inside the named namespace.
func Listen(ns, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNS(ns, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in netns %s: %w", network, addr, ns, err)
	}
	return l, nil
}

// ListenPacket opens a packet socket (e.g. UDP) inside the named namespace.
func ListenPacket(ns, network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := inNS(ns, func() error {
		var err error
		l, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in netns %s: %w", network, addr, ns, err)
	}
	return l, nil
}
