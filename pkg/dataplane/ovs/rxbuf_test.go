package ovs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// packetRcvbuf reads, with ss in namespace ns, the receive buffer of the packet socket
// bound to ifname (vswitchd's socket for that port).
func packetRcvbuf(ns, ifname string) (int, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-0", "-m").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ss in %s: %w: %s", ns, err, out)
	}
	re := regexp.MustCompile(`\*:` + regexp.QuoteMeta(ifname) + `\s.*\n?.*skmem:\([^)]*rb(\d+)`)
	m := re.FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("no packet socket on %s in %s:\n%s", ifname, ns, out)
	}
	return strconv.Atoi(m[1])
}

// TestPacketSocketRcvbuf: vswitchd's packet sockets of endpoint ports get rxBufBytes
// (the kernel reports twice that) when the ports are created and again after vswitchd
// restarts (new sockets). With the default 208 KiB the socket dropped a quarter of a
// TCP sender's frames (issue 39: 0.2-0.5 Gbit/s with tens of thousands of retransmits).
func TestPacketSocketRcvbuf(t *testing.T) {
	needOVS(t)
	id := testID()
	h := oneHost(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c1, c2 := newNS(t, id, "c1"), newNS(t, id, "c2")
	d := newDriver(t, h)
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbo1"+id), ep("e2", "10.1.0.2", c2, "cbo2"+id)
	if err := d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1}}); err != nil {
		t.Fatal(err)
	}
	// A port added by a later change (not the first Sync) is covered too.
	if err := d.UpsertEndpoint(ctx, e2); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, ifname := range []string{e1.HostIfName, e2.HostIfName} {
			rb, err := packetRcvbuf(h.ns, ifname)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if rb < 2*rxBufBytes {
				t.Errorf("%s: packet socket of %s: rcvbuf %d, want %d", when, ifname, rb, 2*rxBufBytes)
			}
		}
	}
	check("after add")
	if err := ping(c1, "10.1.0.2"); err != nil {
		t.Fatal(err)
	}
	// The metric says whether vswitchd refused its sockets: not here.
	refusedCounter := func() float64 {
		t.Helper()
		c, err := d.Counters(ctx)
		v, ok := c["rxbuf_refused"]
		if err != nil || !ok {
			t.Fatalf("counters %v, %v: no rxbuf_refused", c, err)
		}
		return v
	}
	if v := refusedCounter(); v != 0 {
		t.Errorf("rxbuf_refused = %v after the buffers were raised", v)
	}
	d.rxBufs.mu.Lock()
	d.rxBufs.refusedPid = d.rxBufs.pid // as a refusal (TestPacketSocketsRefusedOnce) leaves it
	d.rxBufs.mu.Unlock()
	if v := refusedCounter(); v != 1 {
		t.Errorf("rxbuf_refused = %v for a refusing vswitchd, want 1", v)
	}

	p := Private{Dir: h.dir, NetNS: h.cfg.NetNS}
	if err := p.StopVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.StartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error { return ping(c1, "10.1.0.2") })
	eventually(t, 5*time.Second, func() error {
		for _, ifname := range []string{e1.HostIfName, e2.HostIfName} {
			if rb, err := packetRcvbuf(h.ns, ifname); err != nil || rb < 2*rxBufBytes {
				return fmt.Errorf("after vswitchd restart: %s rcvbuf %d (%v), want %d", ifname, rb, err, 2*rxBufBytes)
			}
		}
		return nil
	})
}

// TestPacketSocketsGrow: on a process of its own (this test's), grow raises a packet
// socket's receive buffer once, leaves other sockets alone, and forgets closed sockets.
func TestPacketSocketsGrow(t *testing.T) {
	testroot.Need(t)
	pkt, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0) // protocol 0: receives nothing
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pkt)
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	udpBefore, _ := unix.GetsockoptInt(udp, unix.SOL_SOCKET, unix.SO_RCVBUF)
	link := func(fd int) string {
		l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	pktLink := link(pkt)

	self := func(pid int) bool { return pid == os.Getpid() }
	var p packetSockets
	// A process found not to be vswitchd once its pidfd is held is left alone (a pid
	// reused after the caller's check).
	if n, err := p.grow(os.Getpid(), func(int) bool { return false }); err == nil || n != 0 {
		t.Fatalf("grow of a pid no longer vswitchd = %d, %v; want an error and nothing raised", n, err)
	}
	if rb, _ := unix.GetsockoptInt(pkt, unix.SOL_SOCKET, unix.SO_RCVBUF); rb == 2*rxBufBytes {
		t.Fatal("packet socket raised although its process was no longer vswitchd")
	}
	n, err := p.grow(os.Getpid(), self)
	if err != nil || n < 1 {
		t.Fatalf("grow = %d, %v; want at least the packet socket", n, err)
	}
	if rb, _ := unix.GetsockoptInt(pkt, unix.SOL_SOCKET, unix.SO_RCVBUF); rb != 2*rxBufBytes {
		t.Errorf("packet socket rcvbuf %d, want %d", rb, 2*rxBufBytes)
	}
	if rb, _ := unix.GetsockoptInt(udp, unix.SOL_SOCKET, unix.SO_RCVBUF); rb != udpBefore {
		t.Errorf("udp socket rcvbuf %d, want it untouched (%d)", rb, udpBefore)
	}
	if n, err := p.grow(os.Getpid(), self); err != nil || n != 0 {
		t.Errorf("second grow = %d, %v; want 0 (each socket once)", n, err)
	}
	if !p.seen[pktLink] {
		t.Fatalf("%s not remembered", pktLink)
	}
	unix.Close(pkt)
	if _, err := p.grow(os.Getpid(), self); err != nil {
		t.Fatal(err)
	}
	if p.seen[pktLink] {
		t.Errorf("closed socket %s still remembered (%d entries)", pktLink, len(p.seen))
	}
	if _, err := p.grow(0, self); err == nil {
		t.Error("grow of pid 0 succeeded")
	}
}

// TestPacketSocketsRefusedOnce: when pidfd_getfd is refused (EPERM) grow stops at the
// first socket and does not ask again for that vswitchd (before, every socket was
// tried again every rxBufScan, each refused), says so (refused: the driver's counter
// rxbuf_refused), and asks again once vswitchd is another process.
func TestPacketSocketsRefusedOnce(t *testing.T) {
	testroot.Need(t)
	for range 2 { // two packet sockets: a refusal of the first must spare the second
		pkt, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pkt)
	}
	calls := 0
	p := packetSockets{getfd: func(int, int, int) (int, error) { calls++; return -1, unix.EPERM }}
	self := func(pid int) bool { return pid == os.Getpid() }
	n, err := p.grow(os.Getpid(), self)
	if n != 0 || !errors.Is(err, unix.EPERM) {
		t.Fatalf("grow refused = %d, %v; want 0 and EPERM", n, err)
	}
	if calls != 1 {
		t.Errorf("%d pidfd_getfd calls after the first refusal, want 1", calls)
	}
	if !p.refused() {
		t.Error("refusal not reported")
	}
	for range 3 {
		if _, err := p.grow(os.Getpid(), self); !errors.Is(err, unix.EPERM) {
			t.Errorf("later grow = %v, want the refusal again", err)
		}
	}
	if calls != 1 {
		t.Errorf("%d pidfd_getfd calls after 4 scans, want 1 (asked again for a vswitchd that refused)", calls)
	}
	// vswitchd restarted (another pid): asked again, and no longer refused once it works.
	p.getfd = nil
	p.pid = -1
	p.refusedPid = 12345
	if _, err := p.grow(os.Getpid(), self); err != nil {
		t.Fatalf("grow for a new vswitchd: %v", err)
	}
	if p.refused() {
		t.Error("still reported refused for a vswitchd that accepted")
	}
}

// TestVswitchdPidRefusesImpostor: a pid file left by a vswitchd that died may name a pid
// reused by another user's process that calls itself ovs-vswitchd; the agent must not
// take that process's sockets (pidfd_getfd) and force their buffers past rmem_max.
func TestVswitchdPidRefusesImpostor(t *testing.T) {
	testroot.Need(t)
	dir, err := os.MkdirTemp("", "cbo-rxpid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("sleep (coreutils) not found: %v", err)
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	fake := dir + "/ovs-vswitchd"
	if err := os.WriteFile(fake, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(fake, "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := os.WriteFile(dir+"/ovs-vswitchd.pid", []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &Driver{opts: Options{RunDir: dir}}
	if pid := d.vswitchdPid(); pid != 0 {
		t.Errorf("vswitchdPid took %d, a process of uid 65534 named ovs-vswitchd, for root's pid file", pid)
	}
}
