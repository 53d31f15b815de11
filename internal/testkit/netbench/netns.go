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
)

// NSPath returns the bind-mount path of a named network namespace.
func NSPath(name string) string { return "/var/run/netns/" + name }

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
