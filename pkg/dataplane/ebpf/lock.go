package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ErrPinRootBusy is wrapped by the error of New when another driver holds the pin root.
var ErrPinRootBusy = errors.New("another driver uses this pin root")

// lockPinRoot takes an exclusive, non-blocking flock on the pin root directory itself
// (bpffs holds no regular files, but flock works on a directory's fd). The lock lives as
// long as the returned file stays open, and the kernel drops it when the process exits,
// so a crashed agent never leaves a stale lock behind.
func lockPinRoot(root string) (*os.File, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("ebpf: create pin root: %w", err)
	}
	f, err := os.OpenFile(root, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ebpf: open pin root %s: %w", root, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err == nil {
		return f, nil
	}
	defer f.Close()
	if errors.Is(err, syscall.EWOULDBLOCK) {
		holder := "another driver"
		if pid := lockHolder(f); pid > 0 {
			holder = fmt.Sprintf("pid %d", pid)
			if pid == os.Getpid() {
				holder += " (this process)"
			}
		}
		return nil, fmt.Errorf("ebpf: pin root %s is locked by %s: %w", root, holder, ErrPinRootBusy)
	}
	return nil, fmt.Errorf("ebpf: lock pin root %s: %w", root, err)
}

// lockHolder returns the pid of the process holding a flock on f's inode, from
// /proc/locks ("1: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<ino> 0 EOF", device numbers
// in hex); 0 if it cannot tell (another pid namespace reports -1 or nothing).
func lockHolder(f *os.File) int {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0
	}
	dev := uint64(st.Dev) // glibc's gnu_dev_major/minor
	major := (dev>>8)&0xfff | (dev>>32)&0xfffff000
	minor := dev&0xff | (dev>>12)&0xffffff00
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, st.Ino)
	pl, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer pl.Close()
	sc := bufio.NewScanner(pl)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// "->" marks a waiter; fields: id, FLOCK, ADVISORY, WRITE, pid, dev:ino, start, end.
		if len(fs) < 6 || fs[1] != "FLOCK" || fs[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(fs[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}
