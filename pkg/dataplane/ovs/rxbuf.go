package ovs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// rxBufBytes is the receive buffer given to each AF_PACKET socket vswitchd reads a port
// with (the kernel doubles it: rb 8 MiB). The userspace datapath reads every endpoint's
// veth through one packet socket polled by vswitchd's main thread; with the default
// (net.core.rmem_default, 208 KiB: about 90 full-size frames) a TCP sender's burst
// overflows it while the thread is busy elsewhere, the socket drops (ss -0 -m: d…),
// and TCP retransmits tens of thousands of segments and backs off: iperf3 between two
// endpoints carried 0.39-0.52 Gbit/s with 31k-46k retransmits in 3 s. With 8 MiB: 1.0-1.9
// Gbit/s and no drops; 2 MiB (rb) still dropped (4k-8k retransmits). It is a limit, not an
// allocation: memory is charged only while frames wait. vswitchd has no setting for it
// and the sysctl is host-wide, so the agent sets it on vswitchd's own sockets.
const rxBufBytes = 4 << 20

// rxBufScan is how often the driver looks for sockets vswitchd opened on its own: after
// a restart it reopens every port's socket, some only after the agent's repair ran.
const rxBufScan = 2 * time.Second

// packetSockets raises SO_RCVBUF of vswitchd's packet sockets to rxBufBytes.
type packetSockets struct {
	mu      sync.Mutex
	pid     int
	seen    map[string]bool // socket inodes already handled for pid
	lastErr string          // the last failure logged (a lasting one is logged once)
	// refusedPid is the vswitchd whose descriptors pidfd_getfd refused (EPERM: no
	// CAP_SYS_PTRACE over it, a Yama ptrace scope, another user namespace). Asking again
	// for each socket every rxBufScan cannot succeed: it is not asked again until
	// vswitchd is another process.
	refusedPid int
	refusal    error
	// getfd is pidfd_getfd (nil: unix.PidfdGetfd); tests stand in for a refusing kernel.
	getfd func(pidfd, fd, flags int) (int, error)
}

// errGetfdRefused marks a pidfd_getfd refused by the kernel's permission checks.
var errGetfdRefused = errors.New("pidfd_getfd refused")

// refused says whether raising the buffers was refused for the current vswitchd (shown
// in Status as the counter rxbuf_refused).
func (p *packetSockets) refused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusedPid != 0 && p.refusedPid == p.pid
}

// grow handles every socket of process pid not handled before: an AF_PACKET socket whose
// receive buffer is below rxBufBytes gets it through a duplicate of its descriptor
// (pidfd_getfd, needs CAP_SYS_PTRACE over pid) and SO_RCVBUFFORCE (CAP_NET_ADMIN). A new
// pid (vswitchd restarted) starts over. It returns how many sockets it raised.
//
// is says whether pid is still vswitchd. It is asked once the pidfd is held, and the
// process is then checked to be alive through that pidfd: a pid reused between the
// caller's check and pidfd_open (vswitchd died, another process took its number) is
// never reached into.
func (p *packetSockets) grow(pid int, is func(pid int) bool) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pid <= 0 {
		return 0, fmt.Errorf("packet socket buffers: no vswitchd pid")
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("packet socket buffers: pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	if !is(pid) {
		return 0, fmt.Errorf("packet socket buffers: process %d is no longer vswitchd", pid)
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return 0, fmt.Errorf("packet socket buffers: process %d: %w", pid, err)
	}
	if p.pid != pid || p.seen == nil {
		p.pid, p.seen = pid, map[string]bool{}
	}
	if p.refusedPid == pid {
		return 0, p.refusal // the same refusal: logged once by the caller
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("packet socket buffers: list %s: %w", dir, err)
	}
	raised := 0
	var errs []error
	// Only sockets still open stay in seen: ports come and go with endpoints.
	seen := map[string]bool{}
	defer func() { p.seen = seen }()
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		if p.seen[link] {
			seen[link] = true
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ok, err := p.growOne(pidfd, fd)
		if errors.Is(err, errGetfdRefused) {
			// Every other descriptor would be refused alike: stop here, and for this
			// vswitchd.
			p.refusedPid = pid
			p.refusal = fmt.Errorf("packet socket buffers: vswitchd %d: %w (not tried again until vswitchd restarts)", pid, err)
			return raised, p.refusal
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("packet socket buffers: fd %d of %d: %w", fd, pid, err))
			continue
		}
		seen[link] = true
		if ok {
			raised++
		}
	}
	return raised, errors.Join(errs...)
}

// growOne raises the receive buffer of descriptor fd of the process behind pidfd if it is
// a packet socket with less than rxBufBytes; it reports whether it did. A refusal
// (EPERM) is errGetfdRefused.
func (p *packetSockets) growOne(pidfd, fd int) (bool, error) {
	getfd := p.getfd
	if getfd == nil {
		getfd = unix.PidfdGetfd
	}
	dup, err := getfd(pidfd, fd, 0)
	if err != nil {
		if errors.Is(err, unix.EBADF) {
			return false, nil // closed meanwhile
		}
		if errors.Is(err, unix.EPERM) {
			return false, fmt.Errorf("%w: %w", errGetfdRefused, err)
		}
		return false, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(dup)
	dom, err := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil || dom != unix.AF_PACKET {
		return false, nil
	}
	cur, err := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return false, fmt.Errorf("read SO_RCVBUF: %w", err)
	}
	if cur >= rxBufBytes {
		return false, nil
	}
	if err := unix.SetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rxBufBytes); err != nil {
		return false, fmt.Errorf("set SO_RCVBUFFORCE: %w", err)
	}
	return true, nil
}

// logOnce records msg as the current failure ("" = none) and reports whether it differs
// from the one before.
func (p *packetSockets) logOnce(msg string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := p.lastErr != msg
	p.lastErr = msg
	return changed
}
