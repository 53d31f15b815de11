// Package testroot owns the one rule for tests that need root (network namespaces, BPF
// programs and maps, bpffs, mounts, a private dockerd or OVS): as root, as CI runs them,
// they run; otherwise they are skipped and say why. It is test support: only tests and
// test harness packages import it, never a production package.
package testroot

import (
	"os"
	"testing"
)

// Need skips t unless the process runs as root.
func Need(t testing.TB) {
	t.Helper()
	if !Have() {
		t.Skipf("this test needs root: skipped because not running as root (euid %d)", os.Geteuid())
	}
}

// Have says whether the process runs as root: for a TestMain deciding whether to prepare
// what its root tests need (it has no t to skip).
func Have() bool { return os.Geteuid() == 0 }
