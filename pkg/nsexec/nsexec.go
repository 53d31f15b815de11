// Package nsexec owns running code inside another network namespace: the one way this
// project does it (the eBPF driver's netlink and attach calls, the simulator's and the
// tests' sockets).
package nsexec

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run calls fn on a locked OS thread inside the network namespace at path ("" = the
// caller's namespace, fn runs directly). Sockets fn creates stay in that namespace after
// it returns. If the thread cannot be switched back it stays locked and dies with its
// goroutine, so no other goroutine ever runs in the wrong namespace.
func Run(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it is discarded when this goroutine exits.
			errc <- fmt.Errorf("return from netns %s: %w (after: %v)", path, err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
