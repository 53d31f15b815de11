package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
)

// TestSighupDuringStartup (issue 34, review of item 7): SIGHUP asks netmaster to reload
// its token, CA and CRL files; sent over and over from the moment netmaster logs its first
// line (main runs) while its embedded etcd starts and until it serves, and after, it must
// neither kill netmaster (SIGHUP's default action, before a reloader listens) nor stop it
// from coming up.
func TestSighupDuringStartup(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(tAdmin+" admin alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	p := startNetmaster(t, "nm-sighup", "", "--etcd-data-dir", filepath.Join(dir, "etcd"), "--etcd-listen-client-url", cu,
		"--etcd-listen-peer-url", pu, "--auth-tokens", tokens)
	eventually(t, 10*time.Second, "netmaster's first log line", func() error {
		if st, err := os.Stat(p.log); err != nil || st.Size() == 0 {
			return fmt.Errorf("log empty (%v), alive %v", err, p.alive())
		}
		return nil
	})
	sent := 0
	hup := func() {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err == nil {
			sent++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		hup()
		if !p.alive() {
			t.Fatalf("netmaster died during startup after %d SIGHUPs", sent)
		}
		if st, _, err := call("GET", p.url+"/healthz", ""); err == nil && st == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("netmaster not up after 30 s of SIGHUPs (%d sent)", sent)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for range 20 {
		hup()
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if st, body, err := call("GET", p.url+"/healthz", ""); !p.alive() || err != nil || st != 200 {
		t.Fatalf("after SIGHUPs once up: alive %v, /healthz %d %q %v", p.alive(), st, body, err)
	}
	t.Logf("%d SIGHUPs sent", sent)
}
