package unixsock

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestModeIgnoresUmask: with a permissive umask the socket is still 0600 (0660 with a
// group), and a stale file at the path is replaced.
func TestModeIgnoresUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "x.sock")
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(p, "")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	l.Close()
	if st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("mode %v", st.Mode())
	}
	l, err = Listen(p, "0")
	if err != nil {
		t.Fatal(err)
	}
	st, _ = os.Stat(p)
	l.Close()
	if st.Mode().Perm() != 0o660 || st.Sys().(*syscall.Stat_t).Gid != 0 {
		t.Fatalf("group socket mode %v gid %d", st.Mode(), st.Sys().(*syscall.Stat_t).Gid)
	}
	if _, err := Listen(p, "no-such-group-cbx"); err == nil {
		t.Fatal("unknown group accepted")
	}
}
