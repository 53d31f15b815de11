// Package critest runs a private containerd (Debian's, with its CRI plugin) for tests: its
// own config, root, state, socket, CNI configuration and binary directories, and a pause
// image built here and imported (no registry). Pods are created through the CRI gRPC API
// as the kubelet would (RunPodSandbox), so containerd itself executes the CNI plugin
// chain (contivk8s). It is test scaffolding: no production binary imports it.
package critest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PauseImage is the sandbox image the runtime is configured with.
const PauseImage = "contivbpf.local/pause:1"

// Options configure a runtime.
type Options struct {
	Dir      string // private directory for everything (created)
	ConfList []byte // the CNI conflist containerd uses for every pod
	// Plugins are CNI plugin binaries to install in the runtime's bin dir (name → path).
	Plugins map[string]string
	// Pause is the path of the pause binary (built from ./pause).
	Pause string
}

// Runtime is a running private containerd.
type Runtime struct {
	Dir    string
	Socket string
	cmd    *exec.Cmd
	done   chan struct{}
	conn   *grpc.ClientConn
	CRI    runtimeapi.RuntimeServiceClient
}

// Build compiles, from the repository at root into dir, what a runtime needs besides
// containerd: the pause binary and the CNI plugins the conflist of ConfList uses
// (contivk8s, containernetworking's loopback, which the CRI plugin always runs, and
// portmap), and returns them as Options fields.
func Build(ctx context.Context, root, dir string) (pause string, plugins map[string]string, err error) {
	pkgs := map[string]string{
		"pause":     "./internal/testkit/critest/pause",
		"contivk8s": "./cmd/contivk8s",
		"loopback":  "github.com/containernetworking/plugins/plugins/main/loopback",
		"portmap":   "github.com/containernetworking/plugins/plugins/meta/portmap",
	}
	plugins = map[string]string{}
	for name, pkg := range pkgs {
		out := filepath.Join(dir, name)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("critest: build %s: %v\n%s", name, err, b)
		}
		if name != "pause" {
			plugins[name] = out
		}
	}
	return filepath.Join(dir, "pause"), plugins, nil
}

// ConfList is the conflist the runtime gives pods: contivk8s talking to the netplugin
// socket, chained with portmap.
func ConfList(socket string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"contiv","plugins":[{"type":"contivk8s","socket":%q},{"type":"portmap","capabilities":{"portMappings":true},"snat":false}]}`, socket))
}

// Start writes the configuration, starts containerd, imports the pause image and connects
// to its CRI service.
func Start(ctx context.Context, o Options) (*Runtime, error) {
	r := &Runtime{Dir: o.Dir, Socket: filepath.Join(o.Dir, "containerd.sock"), done: make(chan struct{})}
	bin, conf := filepath.Join(o.Dir, "cni", "bin"), filepath.Join(o.Dir, "cni", "conf")
	for _, d := range []string{bin, conf, filepath.Join(o.Dir, "root"), filepath.Join(o.Dir, "state")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("critest: %w", err)
		}
	}
	for name, path := range o.Plugins {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("critest: plugin %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(bin, name), b, 0o755); err != nil {
			return nil, fmt.Errorf("critest: install plugin %s: %w", name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, "10-contiv.conflist"), o.ConfList, 0o600); err != nil {
		return nil, fmt.Errorf("critest: write conflist: %w", err)
	}
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.overlayfs"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
`, filepath.Join(o.Dir, "root"), filepath.Join(o.Dir, "state"), r.Socket, r.Socket+".ttrpc", PauseImage, bin, conf)
	cfgPath := filepath.Join(o.Dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("critest: write config: %w", err)
	}
	logf, err := os.Create(filepath.Join(o.Dir, "containerd.log"))
	if err != nil {
		return nil, fmt.Errorf("critest: %w", err)
	}
	r.cmd = exec.Command("containerd", "--config", cfgPath)
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := r.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("critest: start containerd: %w", err)
	}
	go func() {
		_ = r.cmd.Wait()
		logf.Close()
		close(r.done)
	}()
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	if err := r.waitSocket(ctx); err != nil {
		return nil, err
	}
	if err := r.importPause(ctx, o.Pause); err != nil {
		return nil, err
	}
	r.conn, err = grpc.NewClient("unix://"+r.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("critest: dial CRI: %w", err)
	}
	r.CRI = runtimeapi.NewRuntimeServiceClient(r.conn)
	// The CRI plugin is up once it answers Version.
	deadline := time.Now().Add(20 * time.Second)
	for {
		vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := r.CRI.Version(vctx, &runtimeapi.VersionRequest{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("critest: CRI service does not answer: %w (log %s)", err, r.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ok = true
	return r, nil
}

func (r *Runtime) waitSocket(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(r.Socket); err == nil {
			return nil
		}
		select {
		case <-r.done:
			return fmt.Errorf("critest: containerd exited: %s", r.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("critest: no socket after 20s: %s", r.logTail())
		}
	}
}

// logTail is the end of containerd's log, for errors.
func (r *Runtime) logTail() string {
	b, _ := os.ReadFile(filepath.Join(r.Dir, "containerd.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// importPause builds a one-layer image around the pause binary (docker-archive layout)
// and imports it into the k8s.io namespace with ctr.
func (r *Runtime) importPause(ctx context.Context, pause string) error {
	bin, err := os.ReadFile(pause)
	if err != nil {
		return fmt.Errorf("critest: pause binary: %w", err)
	}
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	if err := lw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := lw.Write(bin); err != nil {
		return err
	}
	if err := lw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/pause"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{PauseImage}, "Layers": []string{"layer.tar"}}})
	var img bytes.Buffer
	iw := tar.NewWriter(&img)
	for _, f := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", config}, {"layer.tar", layer.Bytes()}} {
		if err := iw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := iw.Write(f.data); err != nil {
			return err
		}
	}
	if err := iw.Close(); err != nil {
		return err
	}
	path := filepath.Join(r.Dir, "pause.tar")
	if err := os.WriteFile(path, img.Bytes(), 0o600); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "ctr", "--address", r.Socket, "-n", "k8s.io", "images", "import", "--snapshotter", "native", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("critest: import the pause image: %v: %s", err, out)
	}
	return nil
}

// RunPod creates a pod sandbox as the kubelet does for pod namespace/name (uid: any unique
// string) and returns its id and the IPv4 address the CNI chain gave it.
func (r *Runtime) RunPod(ctx context.Context, namespace, name, uid string) (string, netip.Addr, error) {
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: uid},
		Hostname:     name,
		LogDirectory: filepath.Join(r.Dir, "logs", namespace+"_"+name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	resp, err := r.CRI.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", netip.Addr{}, fmt.Errorf("RunPodSandbox %s/%s: %w\ncontainerd log:\n%s", namespace, name, err, r.logTail())
	}
	st, err := r.CRI.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId})
	if err != nil {
		return resp.PodSandboxId, netip.Addr{}, fmt.Errorf("PodSandboxStatus %s: %w", resp.PodSandboxId, err)
	}
	var ip netip.Addr
	if n := st.GetStatus().GetNetwork(); n != nil {
		ip, _ = netip.ParseAddr(n.Ip)
	}
	return resp.PodSandboxId, ip, nil
}

// NetNS is the network namespace path of a sandbox (from its verbose status).
func (r *Runtime) NetNS(ctx context.Context, id string) (string, error) {
	st, err := r.CRI.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return "", err
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		}
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		return "", fmt.Errorf("sandbox %s info: %w", id, err)
	}
	for _, n := range info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" && n.Path != "" {
			return n.Path, nil
		}
	}
	return "", fmt.Errorf("sandbox %s: no network namespace path in its status", id)
}

// RemovePod stops (CNI DEL) and removes a sandbox.
func (r *Runtime) RemovePod(ctx context.Context, id string) error {
	if _, err := r.CRI.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", id, err)
	}
	if _, err := r.CRI.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", id, err)
	}
	return nil
}

// Close removes every sandbox left, stops containerd and unmounts what it left under its
// directory.
func (r *Runtime) Close() error {
	var errs []error
	if r.CRI != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if l, err := r.CRI.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, s := range l.Items {
				if err := r.RemovePod(ctx, s.Id); err != nil {
					errs = append(errs, err)
				}
			}
		}
		cancel()
	}
	if r.conn != nil {
		r.conn.Close()
	}
	if r.cmd != nil && r.cmd.Process != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
	}
	// Mounts containerd left (sandbox netns, shm, rootfs) under the private directory.
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var mnts []string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], r.Dir+"/") {
				mnts = append(mnts, f[4])
			}
		}
		for i := len(mnts) - 1; i >= 0; i-- {
			_ = syscall.Unmount(mnts[i], syscall.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(r.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
