// Package netbench measures network paths between namespaces for `make bench`: TCP
// request/response latency, new-connection rate and bulk throughput (iperf3), plus the
// kernel-only baseline topologies (a direct veth pair; a Linux bridge + kernel VXLAN
// between two hosts) that contivbpf's paths are compared against in the same run.
//
// It knows nothing about netmaster or the dataplane drivers.
package netbench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"github.com/vishvananda/netns"
)

// NSPath returns the bind-mount path of a named network namespace.
func NSPath(name string) string { return "/var/run/netns/" + name }

// InNS runs fn on an OS thread that has entered the namespace at path. Sockets created
// inside fn belong to that namespace for their whole life.
func InNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked on purpose when switching fails or succeeds: it
		// exits with the goroutine instead of returning to the pool in a foreign netns.
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return <-errc
}

// NSCmd builds a command that runs inside the named namespace through nsenter, which
// (unlike `ip netns exec`) leaves /sys and bpffs alone.
func NSCmd(name string, args ...string) *exec.Cmd {
	full := append([]string{"--net=" + NSPath(name), "--"}, args...)
	cmd := exec.Command("nsenter", full...)
	cmd.Stderr = os.Stderr
	return cmd
}

// Run runs a command in a namespace and returns its combined output.
func Run(name string, args ...string) (string, error) {
	cmd := NSCmd(name, args...)
	cmd.Stderr = nil
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%v in %s: %w: %s", args, name, err, out)
	}
	return string(out), nil
}
