package sim

import (
	"context"
	"fmt"
	"net"

	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// NetNSPath is where `ip netns add NAME` pins a namespace.
func NetNSPath(name string) string { return "/run/netns/" + name }

// DialContext dials addr from inside the named namespace.
func DialContext(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := nsexec.Run(NetNSPath(ns), func() error {
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
	err := nsexec.Run(NetNSPath(ns), func() error {
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
	err := nsexec.Run(NetNSPath(ns), func() error {
		var err error
		l, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in netns %s: %w", network, addr, ns, err)
	}
	return l, nil
}
