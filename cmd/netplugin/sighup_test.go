package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// mainEnv, set in the environment, makes the test binary run netplugin's main with its
// arguments (TestMain): the tests start netplugin as a process without building it.
const mainEnv = "CBH_NETPLUGIN_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSighupDuringStartup (issue 34): SIGHUP asks netplugin to reload its inspect token
// file; one that arrives while netplugin starts (here: waiting for its OVSDB, a socket
// that accepts and never answers), before a reloader listens, must not kill it (SIGHUP's
// default action), with or without a token file.
func TestSighupDuringStartup(t *testing.T) {
	for _, withTokens := range []bool{false, true} {
		t.Run(fmt.Sprintf("tokens=%v", withTokens), func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "db.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			etcd, err := net.Listen("tcp", "127.0.0.1:0") // (an etcd that never answers)
			if err != nil {
				t.Fatal(err)
			}
			defer etcd.Close()
			// (--encryption given: without it netplugin reads the cluster's setting from
			// etcd before it opens the datapath, and this etcd never answers.)
			args := []string{"--host", "cbh-sighup", "--vtep-ip", "127.0.0.1", "--dataplane", "ovs", "--ovs-db", "unix:" + sock, "--encryption", "none",
				"--dns-listen", "off", "--etcd-endpoints", "http://" + etcd.Addr().String(), "--inspect-listen", "127.0.0.1:0"}
			if withTokens {
				tokens := filepath.Join(dir, "tokens")
				if err := os.WriteFile(tokens, []byte("cbh-sighup-token-0123456789 admin\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--inspect-token-file", tokens)
			}
			np := startNetplugin(t, dir, args...)
			cmd, exited := np.cmd, np.exited
			select {
			case c := <-accepted:
				defer c.Close()
			case <-exited:
				t.Fatalf("netplugin exited before it reached its OVSDB: %v\n%s", np.err, np.log())
			case <-time.After(20 * time.Second):
				t.Fatal("netplugin did not reach its OVSDB in 20 s")
			}
			for range 3 {
				if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
					break // (dead: reported below)
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case <-exited:
				t.Errorf("a SIGHUP while netplugin starts killed it: %v", np.err)
			case <-time.After(300 * time.Millisecond):
			}
		})
	}
}

// netplugin is a netplugin process the test started (startNetplugin).
type netplugin struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when it exited, err then set
	err     error
	logPath string
}

func (n *netplugin) log() string { b, _ := os.ReadFile(n.logPath); return string(b) }

// startNetplugin runs netplugin's main with args as a process logging to dir, stopped
// (SIGTERM, then SIGKILL after 5 s) at the test's end.
func startNetplugin(t *testing.T, dir string, args ...string) *netplugin {
	t.Helper()
	n := &netplugin{cmd: exec.Command(os.Args[0], args...), exited: make(chan struct{}), logPath: filepath.Join(dir, "netplugin.log")}
	n.cmd.Env = append(os.Environ(), mainEnv+"=1")
	out, err := os.Create(n.logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.err = n.cmd.Wait(); close(n.exited) }()
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(5 * time.Second):
			_ = n.cmd.Process.Kill()
			<-n.exited
		}
	})
	return n
}
