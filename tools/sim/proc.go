package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a daemon the simulator started (netmaster, a netplugin).
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// startProcess runs argv inside namespace ns (via nsenter, which leaves /sys and bpffs
// visible, unlike `ip netns exec`), logging to logPath.
func startProcess(name, ns, logPath string, argv []string) (*Process, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	args := append([]string{"--net=" + NetNSPath(ns), "--"}, argv...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Die with the simulator if it is killed without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits up to timeout, then SIGKILLs.
func (p *Process) Stop(timeout time.Duration) error {
	if ok, _ := p.Exited(); ok {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused process (PausePlugin) must see it
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s; killed", p.Name, p.PID(), timeout)
}

// Kill ends the process at once (SIGKILL), like a crash.
func (p *Process) Kill() {
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// LogTail returns the last n lines of the process log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run executes a short command and returns its combined output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	return runIn(ctx, "", name, args...)
}

func runIn(ctx context.Context, dir, name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// Exec runs argv inside namespace ns and returns its combined output.
func Exec(ctx context.Context, ns string, argv ...string) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("exec: empty command")
	}
	return run(ctx, "nsenter", append([]string{"--net=" + NetNSPath(ns), "--"}, argv...)...)
}
