package ovs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SchemaPath is where Debian's openvswitch-common installs the Open_vSwitch schema.
const SchemaPath = "/usr/share/openvswitch/vswitch.ovsschema"

// Private is an ovsdb-server + ovs-vswitchd pair whose every file (database, sockets,
// pid files, logs, unixctl sockets, bridge management sockets) lives in Dir. The
// vswitchd runs inside network namespace NetNS (so its netdev taps do not collide with
// another instance's) and keeps running after the driver closes: flows survive an agent
// restart. StopPrivate (or Driver.Teardown) ends both daemons.
type Private struct {
	Dir   string
	NetNS string // path of the network namespace vswitchd runs in ("" = the caller's)
}

// DBSocket is the OVSDB endpoint of the instance.
func (p Private) DBSocket() string { return "unix:" + filepath.Join(p.Dir, "db.sock") }

func (p Private) pidFile(daemon string) string { return filepath.Join(p.Dir, daemon+".pid") }

func (p Private) env() []string {
	return append(os.Environ(), "OVS_RUNDIR="+p.Dir, "OVS_DBDIR="+p.Dir, "OVS_LOGDIR="+p.Dir,
		"OVS_SYSCONFDIR="+p.Dir, "OVS_PKGDATADIR=/usr/share/openvswitch")
}

// pid returns the pid of a running daemon of the instance, or 0.
func (p Private) pid(daemon string) int {
	b, err := os.ReadFile(p.pidFile(daemon))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if !alive(pid) {
		return 0
	}
	// The pid could have been reused: check it is still our daemon.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), p.Dir) {
		return 0
	}
	return pid
}

// Running reports whether both daemons of the instance are alive.
func (p Private) Running() bool { return p.pid("ovsdb-server") != 0 && p.pid("ovs-vswitchd") != 0 }

func (p Private) run(ctx context.Context, netns bool, name string, args ...string) error {
	if netns && p.NetNS != "" {
		args = append([]string{"--net=" + p.NetNS, name}, args...)
		name = "nsenter"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = p.env()
	cmd.Dir = p.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Start creates the database if needed and starts whichever daemon is not running.
// Both daemons detach: they are not children of this process.
func (p Private) Start(ctx context.Context) error {
	if p.Dir == "" || !filepath.IsAbs(p.Dir) {
		return fmt.Errorf("private ovs: dir %q must be an absolute path", p.Dir)
	}
	if len(filepath.Join(p.Dir, "ovs-vswitchd.12345.ctl")) > 100 {
		return fmt.Errorf("private ovs: dir %q is too long for unix socket paths", p.Dir)
	}
	if err := os.MkdirAll(p.Dir, 0o750); err != nil {
		return fmt.Errorf("private ovs: create dir: %w", err)
	}
	db := filepath.Join(p.Dir, "conf.db")
	if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
		if err := p.run(ctx, false, "ovsdb-tool", "create", db, SchemaPath); err != nil {
			return fmt.Errorf("private ovs: create db: %w", err)
		}
	}
	if p.pid("ovsdb-server") == 0 {
		if err := p.run(ctx, false, "ovsdb-server", db,
			"--remote=punix:"+filepath.Join(p.Dir, "db.sock"),
			"--pidfile="+p.pidFile("ovsdb-server"),
			"--unixctl="+filepath.Join(p.Dir, "ovsdb-server.ctl"),
			"--log-file="+filepath.Join(p.Dir, "ovsdb-server.log"),
			"-vconsole:off", "--detach", "--no-chdir"); err != nil {
			return fmt.Errorf("private ovs: start ovsdb-server: %w", err)
		}
		if err := p.run(ctx, false, "ovs-vsctl", "--db="+p.DBSocket(), "--no-wait", "--timeout=5", "init"); err != nil {
			return fmt.Errorf("private ovs: init db: %w", err)
		}
	}
	if p.pid("ovs-vswitchd") == 0 {
		return p.StartVswitchd(ctx)
	}
	return nil
}

// StartVswitchd starts ovs-vswitchd (in NetNS) against the instance's database.
func (p Private) StartVswitchd(ctx context.Context) error {
	if err := p.run(ctx, true, "ovs-vswitchd", p.DBSocket(),
		"--pidfile="+p.pidFile("ovs-vswitchd"),
		"--unixctl="+filepath.Join(p.Dir, "ovs-vswitchd.ctl"),
		"--log-file="+filepath.Join(p.Dir, "ovs-vswitchd.log"),
		"-vconsole:off", "--detach", "--no-chdir"); err != nil {
		return fmt.Errorf("private ovs: start ovs-vswitchd: %w", err)
	}
	return nil
}

// StopVswitchd stops only ovs-vswitchd (its flows and groups are lost, the database stays).
func (p Private) StopVswitchd(ctx context.Context) error { return p.stop(ctx, "ovs-vswitchd") }

// Stop ends both daemons; the directory is left for the caller to remove.
func (p Private) Stop(ctx context.Context) error {
	return errors.Join(p.stop(ctx, "ovs-vswitchd"), p.stop(ctx, "ovsdb-server"))
}

func (p Private) stop(ctx context.Context, daemon string) error {
	pid := p.pid(daemon)
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("private ovs: stop %s (pid %d): %w", daemon, pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = os.Remove(p.pidFile(daemon))
	return nil
}

// alive reports whether pid exists and is not a zombie (detached daemons are reparented
// to an init that may reap them late).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}
