// Package conformance is the scenario suite every dataplane.Driver must pass: it builds
// hosts as network namespaces joined by a veth wire, container namespaces behind them, and
// checks forwarding (same host, cross-host VXLAN), ARP handling, deletes, peers, resync
// and restart with real traffic. Backend-specific checks (map or flow contents) belong in
// the backend's own tests; everything here is observable from the containers and the wire.
//
// Run, RunRouting and RunAdversarial run each scenario as a subtest that creates its own
// containers and objects, so any one runs alone and in any order; the scenarios of one
// call share a pair of hosts that is synced back to its baseline after each (see
// runScenarios).
//
// The helpers (NewNetNS, Ping, ...; code inside a namespace runs through pkg/nsexec) are exported for backend tests that need the
// same building blocks.
package conformance

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// Prefix returns a short unique prefix starting with "cbe" for names a test creates: 16
// random bits (names stay within the 15 bytes of an interface name), drawn again while a
// namespace or a root-namespace link already starts with it. Test packages run in
// parallel (make test's -p 2), and a prefix another test held made its namespaces clash
// ("File exists": seen in make test).
func Prefix() string {
	return freePrefix(func() string {
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		return "cbe" + hex.EncodeToString(b)
	})
}

// freePrefix returns the first prefix draw gives that no namespace or root-namespace link
// starts with (after 1,000 draws, whatever the last one was).
func freePrefix(draw func() string) string {
	var p string
	for range 1000 {
		p = draw()
		ns, _ := filepath.Glob(filepath.Join("/run/netns", p+"*"))
		links, _ := filepath.Glob(filepath.Join("/sys/class/net", p+"*"))
		if len(ns) == 0 && len(links) == 0 {
			return p
		}
	}
	return p
}

// NewNetNS creates the named network namespace (under /run/netns) and removes it when the
// test ends. It returns the namespace's path. Loopback is brought up.
func NewNetNS(t testing.TB, name string) string {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("create netns %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	path := filepath.Join("/run/netns", name)
	if out, err := exec.Command("nsenter", "--net="+path, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
	// A new namespace inherits the root namespace's IPv4 forwarding (which dockerd or a
	// CNI plugin on this machine may have turned on): start from a fresh host's 0.
	if out, err := exec.Command("nsenter", "--net="+path, "sysctl", "-qw", "net.ipv4.ip_forward=0").CombinedOutput(); err != nil {
		t.Fatalf("ip_forward=0 in %s: %v: %s", name, err, out)
	}
	return path
}

// Ping sends one ICMP echo from the namespace at path and waits up to wait for the reply.
func Ping(path, ip string, wait time.Duration) error {
	secs := int(wait / time.Second)
	if secs < 1 {
		secs = 1
	}
	out, err := exec.Command("nsenter", "--net="+path, "busybox", "ping", "-c", "1", "-W", fmt.Sprint(secs), ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %v: %s", ip, filepath.Base(path), err, out)
	}
	return nil
}

// PingOK pings until a reply arrives (at most tries attempts of one second).
func PingOK(t testing.TB, path, ip string, tries int) {
	t.Helper()
	var err error
	for i := 0; i < tries; i++ {
		if err = Ping(path, ip, time.Second); err == nil {
			return
		}
	}
	t.Errorf("no reply after %d tries: %v", tries, err)
}

// PingStops asserts that echoes stop being answered within tries pings of one second each:
// for a change a datapath applies a moment later (a kernel work item, a switch's flow cache
// revalidated in the background). It returns the number of replies before they stopped.
func PingStops(t testing.TB, path, ip string, tries int) int {
	t.Helper()
	for n := 0; n < tries; n++ {
		if Ping(path, ip, time.Second) != nil {
			return n
		}
	}
	t.Errorf("ping %s from %s: still answered after %d tries, want no reply", ip, filepath.Base(path), tries)
	return tries
}

// PingFails asserts that one echo (one second) gets no reply.
func PingFails(t testing.TB, path, ip string) {
	t.Helper()
	if err := Ping(path, ip, time.Second); err == nil {
		t.Errorf("ping %s from %s: got a reply, want none", ip, filepath.Base(path))
	}
}
