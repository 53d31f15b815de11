package ebpf

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNetNS runs fn on a locked OS thread inside ns (a path; "" = the caller's namespace).
// tcx attach by ifindex resolves the device in the calling thread's namespace, so every
// attach goes through here. If the thread cannot be switched back it stays locked and
// dies with its goroutine, so no other goroutine ever runs in the wrong namespace.
func inNetNS(ns string, fn func() error) error {
	if ns == "" {
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
		target, err := netns.GetFromPath(ns)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it is discarded when this goroutine exits.
			errc <- fmt.Errorf("return from netns %s: %w (after: %v)", ns, err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
