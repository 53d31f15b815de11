// Package dockertest runs private Docker daemons for tests and demos: one dockerd per
// simulated host, inside that host's network namespace and inside a private mount namespace
// in which a per-host directory is bind-mounted over /run/docker/plugins, so every simulated
// host discovers its own `netplugin` socket. It also builds a busybox image with
// `docker import` from the busybox-static binary (there is no registry here).
//
// Everything lives in one directory per daemon (data-root, exec-root, pidfile, socket,
// config, mount namespace file). Stop removes it and ends only the processes this package
// started (dockerd, and the containerd dockerd started, found through its pidfile).
//
// It knows nothing about netplugin; it is plumbing around the Debian docker.io 20.10 binaries.
package dockertest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Binaries used (the 20.10 CLI matches the daemon; /usr/local/bin/docker may be newer).
const (
	DockerdBin = "/usr/sbin/dockerd"
	DockerCLI  = "/usr/bin/docker"
	BusyboxBin = "/bin/busybox"
	// PluginsDir is where dockerd looks for plugin sockets; each daemon sees its own
	// directory there.
	PluginsDir = "/run/docker/plugins"
	// BusyboxImage is the tag ImportBusybox gives the image.
	BusyboxImage = "cbr-busybox:latest"
)

// Options configures one daemon.
type Options struct {
	// Dir holds every file of the daemon. Keep it short: unix socket paths under it are
	// limited to 108 bytes. Created if missing, removed by Stop.
	Dir string
	// NetNS is the name of an existing network namespace (/run/netns/NAME) the daemon runs in.
	NetNS string
	// Log receives the daemon's output (nil: DIR/dockerd.log).
	Log io.Writer
	// LiveRestore keeps containers running while dockerd restarts (daemon.json
	// "live-restore"), see Daemon.Restart.
	LiveRestore bool
	// DNS are the servers containers' resolvers (Docker's embedded DNS) forward to
	// (daemon.json "dns"); empty: the host's.
	DNS []string
}

// Daemon is one running private dockerd.
type Daemon struct {
	Dir       string
	NetNS     string
	Socket    string // unix socket path of the Docker API
	PluginDir string // host path seen by this daemon as /run/docker/plugins
	MountNS   string // file pinning the daemon's mount namespace

	cmd    *exec.Cmd
	done   chan error
	logf   *os.File
	logw   io.Writer
	args   []string // nsenter arguments that start dockerd
	nsDirs []string // bind mounts to undo, innermost last
}

// Host returns the Docker API host string for clients ("unix:///path").
func (d *Daemon) Host() string { return "unix://" + d.Socket }

// NsenterArgs returns the command prefix that runs a program in the daemon's mount and
// network namespaces (where /run/docker/plugins is this daemon's plugin directory).
func (d *Daemon) NsenterArgs() []string {
	return []string{"nsenter", "--mount=" + d.MountNS, "--net=/run/netns/" + d.NetNS}
}

// Start creates the daemon's directory and mount namespace and starts dockerd, waiting until
// its API answers.
func Start(ctx context.Context, o Options) (*Daemon, error) {
	if o.Dir == "" {
		return nil, errors.New("dockertest: Options.Dir is empty")
	}
	if o.NetNS == "" {
		return nil, errors.New("dockertest: Options.NetNS is empty")
	}
	if _, err := os.Stat("/run/netns/" + o.NetNS); err != nil {
		return nil, fmt.Errorf("dockertest: network namespace %q: %w", o.NetNS, err)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("dockertest: dir %q: %w", o.Dir, err)
	}
	d := &Daemon{
		Dir:       dir,
		NetNS:     o.NetNS,
		Socket:    filepath.Join(dir, "docker.sock"),
		PluginDir: filepath.Join(dir, "plugins"),
		MountNS:   filepath.Join(dir, "ns", "mnt"),
	}
	if len(d.Socket) > 100 {
		return nil, fmt.Errorf("dockertest: dir %q is too long for unix sockets", dir)
	}
	ok := false
	defer func() {
		if !ok {
			d.Stop()
		}
	}()
	for _, sub := range []string{"plugins", "ns", "data", "exec"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("dockertest: mkdir: %w", err)
		}
	}
	if err := d.makeMountNS(ctx); err != nil {
		return nil, err
	}
	cfg := map[string]any{
		"deprecated-key-path": filepath.Join(dir, "key.json"),
		"shutdown-timeout":    1,
		"log-level":           "warn",
		"live-restore":        o.LiveRestore,
	}
	if len(o.DNS) > 0 {
		cfg["dns"] = o.DNS
	}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("dockertest: write daemon config: %w", err)
	}
	args := append(d.NsenterArgs()[1:], DockerdBin,
		"--config-file", cfgPath,
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"-H", d.Host(),
		"--iptables=false", "--ip6tables=false", "--ip-masq=false", "--bridge=none",
	)
	d.args = args
	d.logw = o.Log
	if d.logw == nil {
		f, err := os.Create(filepath.Join(dir, "dockerd.log"))
		if err != nil {
			return nil, fmt.Errorf("dockertest: log file: %w", err)
		}
		d.logf = f
		d.logw = f
	}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

func (d *Daemon) start(ctx context.Context) error {
	cmd := exec.Command("nsenter", d.args...)
	cmd.Stdout, cmd.Stderr = d.logw, d.logw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dockertest: start dockerd: %w", err)
	}
	d.cmd = cmd
	d.done = make(chan error, 1)
	go func() { d.done <- cmd.Wait() }()
	if err := d.waitReady(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("dockertest: dockerd in %s: %w (log: %s)", d.NetNS, err, d.logTail())
	}
	return nil
}

// stopDaemon ends dockerd: SIGTERM, then SIGKILL of its process group after 15 s.
func (d *Daemon) stopDaemon() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		slog.Warn("dockertest: dockerd did not stop, killing", "dir", d.Dir)
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
	d.cmd = nil
}

// Restart stops dockerd and starts it again with the same files. With
// Options.LiveRestore the containers keep running meanwhile.
func (d *Daemon) Restart(ctx context.Context) error {
	d.stopDaemon()
	return d.start(ctx)
}

// makeMountNS pins a private mount namespace to ns/mnt in which PluginDir is mounted over
// /run/docker/plugins.
func (d *Daemon) makeMountNS(ctx context.Context) error {
	nsDir := filepath.Dir(d.MountNS)
	// A mount namespace can only be pinned on a private mount.
	if err := run(ctx, "mount", "--bind", nsDir, nsDir); err != nil {
		return err
	}
	d.nsDirs = append(d.nsDirs, nsDir)
	if err := run(ctx, "mount", "--make-private", nsDir); err != nil {
		return err
	}
	if err := os.WriteFile(d.MountNS, nil, 0o600); err != nil {
		return fmt.Errorf("dockertest: create %s: %w", d.MountNS, err)
	}
	if err := os.MkdirAll(PluginsDir, 0o755); err != nil {
		return fmt.Errorf("dockertest: mkdir %s: %w", PluginsDir, err)
	}
	if err := run(ctx, "unshare", "--mount="+d.MountNS, "--propagation", "private",
		"mount", "--bind", d.PluginDir, PluginsDir); err != nil {
		return err
	}
	d.nsDirs = append(d.nsDirs, d.MountNS)
	return nil
}

func (d *Daemon) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cl := d.HTTPClient()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
		resp, err := cl.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("dockerd exited: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("API not ready: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// HTTPClient returns a client that reaches the daemon's API socket (any host name).
func (d *Daemon) HTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.Socket)
		},
	}}
}

// Docker runs the 20.10 docker CLI against this daemon and returns its combined output.
func (d *Daemon) Docker(ctx context.Context, args ...string) (string, error) {
	return d.DockerStdin(ctx, nil, args...)
}

// DockerStdin is Docker with stdin.
func (d *Daemon) DockerStdin(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, DockerCLI, append([]string{"-H", d.Host()}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Join(d.Dir, "cli"))
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ImportBusybox imports BusyboxImage (busybox-static with sh, ping, ip, sleep and friends).
func (d *Daemon) ImportBusybox(ctx context.Context) error {
	tarball, err := BusyboxTar()
	if err != nil {
		return err
	}
	if _, err := d.DockerStdin(ctx, bytes.NewReader(tarball), "import", "-", BusyboxImage); err != nil {
		return fmt.Errorf("dockertest: import busybox: %w", err)
	}
	return nil
}

// BusyboxTar builds a root filesystem tarball holding /bin/busybox and applet symlinks.
func BusyboxTar() ([]byte, error) {
	bin, err := os.ReadFile(BusyboxBin)
	if err != nil {
		return nil, fmt.Errorf("dockertest: read %s (install busybox-static): %w", BusyboxBin, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, dir := range []string{"bin/", "etc/", "proc/", "sys/", "dev/", "tmp/", "root/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: now}); err != nil {
			return nil, fmt.Errorf("dockertest: tar: %w", err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: now}); err != nil {
		return nil, fmt.Errorf("dockertest: tar: %w", err)
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, fmt.Errorf("dockertest: tar: %w", err)
	}
	for _, applet := range []string{"sh", "ping", "ip", "sleep", "ifconfig", "cat", "ls", "hostname", "route", "arp", "nc", "wget", "true", "echo"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: now}); err != nil {
			return nil, fmt.Errorf("dockertest: tar: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("dockertest: tar: %w", err)
	}
	return buf.Bytes(), nil
}

// Stop ends dockerd (SIGTERM, then SIGKILL after 15 s), the containerd it started, undoes the
// mounts and removes Dir. Safe to call more than once.
func (d *Daemon) Stop() error {
	var errs []error
	if d.cmd != nil {
		// Best effort: a daemon that already died has nothing to list.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = d.RemoveContainers(ctx)
		cancel()
	}
	d.stopDaemon()
	// containerd started by this dockerd (exits by itself on a clean dockerd stop).
	d.killByPidfile(filepath.Join(d.Dir, "exec", "containerd", "containerd.pid"), "containerd")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Unmount whatever dockerd left mounted under Dir (shm, overlay mounts), deepest first.
	for _, m := range mountsUnder(d.Dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for i := len(d.nsDirs) - 1; i >= 0; i-- {
		if err := run(ctx, "umount", "-l", d.nsDirs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	d.nsDirs = nil
	if d.logf != nil {
		d.logf.Close()
		d.logf = nil
	}
	if d.Dir != "" {
		if err := os.RemoveAll(d.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// killByPidfile kills the process in pidfile if it is still the named program.
func (d *Daemon) killByPidfile(pidfile, comm string) {
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(c)) != comm {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// mountsUnder lists mount points under dir from /proc/self/mountinfo, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if strings.HasPrefix(mp, dir+"/") && mp != filepath.Join(dir, "ns") && mp != filepath.Join(dir, "ns", "mnt") {
			out = append(out, mp)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("dockertest: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (d *Daemon) logTail() string {
	b, err := os.ReadFile(filepath.Join(d.Dir, "dockerd.log"))
	if err != nil {
		return "(no log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func runOut(ctx context.Context, argv ...string) (string, error) {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

// RemoveContainers force-removes every container of the daemon, so none outlives it
// (with live-restore they would) and a scenario can start clean.
func (d *Daemon) RemoveContainers(ctx context.Context) error {
	out, err := d.Docker(ctx, "ps", "-aq")
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	if ids := strings.Fields(out); len(ids) > 0 {
		if _, err := d.Docker(ctx, append([]string{"rm", "-f"}, ids...)...); err != nil {
			return fmt.Errorf("remove containers: %w", err)
		}
	}
	return nil
}
