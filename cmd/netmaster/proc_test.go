package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
)

// binPath is the netmaster binary built once by TestMain.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cbh-netmaster-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "netmaster")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	out, err := exec.Command(gobin, "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build netmaster: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one netmaster (or etcd) process started by a test.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	url  string // http://listen address (netmaster only)
	addr string // control address (netmaster only)
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("--- %s log (tail) ---\n%s", name, b)
		}
	})
	return p
}

func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startNetmaster runs the built binary on free loopback ports against etcdEndpoints (or
// an embedded etcd when etcdEndpoints is empty and extra carries the etcd flags).
func startNetmaster(t *testing.T, name, etcdEndpoints string, extra ...string) *proc {
	t.Helper()
	port := statetest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"--listen-url", addr, "--control-url", addr, "--rpc-port", fmt.Sprint(statetest.FreePort(t)),
		"--mode", "docker", "--netmode", "vxlan", "--fwdmode", "routing"}
	if !hasString(extra, "--tls-cert") {
		args = append(args, "--insecure")
	}
	if etcdEndpoints != "" {
		args = append(args, "--etcd-endpoints", etcdEndpoints)
	}
	args = append(args, extra...)
	p := startProc(t, name, binPath, args...)
	p.url, p.addr = "http://"+addr, addr
	return p
}

type info struct {
	LocalIP        string   `json:"local-ip"`
	LeaderIP       string   `json:"leader-ip"`
	CurrentState   string   `json:"current-state"`
	NetpluginNodes []string `json:"netplugin-nodes"`
	NetmasterNodes []string `json:"netmaster-nodes"`
}

var httpc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 64, MaxIdleConnsPerHost: 64}}

func call(method, url, body string) (int, string, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/problem+json") // real statuses, as our netctl asks
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func getInfo(p *proc) (info, error) {
	st, body, err := call("GET", p.url+"/info", "")
	if err != nil {
		return info{}, err
	}
	if st != 200 {
		return info{}, fmt.Errorf("/info: %d %s", st, body)
	}
	var i info
	if err := json.Unmarshal([]byte(body), &i); err != nil {
		return info{}, fmt.Errorf("/info: %w: %s", err, body)
	}
	return i, nil
}

func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("%s: not after %s: %v", what, d, err)
}

// leaderOf waits until exactly one of ps reports leader and all live ones agree.
func leaderOf(t *testing.T, ps []*proc, d time.Duration) *proc {
	t.Helper()
	var leader *proc
	eventually(t, d, "one agreed leader", func() error {
		leader = nil
		for _, p := range ps {
			if !p.alive() {
				continue
			}
			i, err := getInfo(p)
			if err != nil {
				return err
			}
			if i.CurrentState == "leader" {
				if leader != nil {
					return fmt.Errorf("two leaders: %s and %s", leader.name, p.name)
				}
				leader = p
			}
		}
		if leader == nil {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	return leader
}

func mustCall(t *testing.T, method, url, body string, want int) string {
	t.Helper()
	st, b, err := call(method, url, body)
	if err != nil || st != want {
		t.Fatalf("%s %s: status %d (want %d), err %v, body %s", method, url, st, want, err, b)
	}
	return b
}

func netJSON(name, subnet, gw string) string {
	return fmt.Sprintf(`{"tenantName":"default","networkName":%q,"encap":"vxlan","subnet":%q,"gateway":%q}`, name, subnet, gw)
}

func networkNames(t *testing.T, url string) []string {
	t.Helper()
	var nets []struct {
		NetworkName string `json:"networkName"`
	}
	if err := json.Unmarshal([]byte(mustCall(t, "GET", url+"/api/v1/networks/", "", 200)), &nets); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range nets {
		out = append(out, n.NetworkName)
	}
	return out
}

func hasString(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func postJSON(url string, v any) (int, []byte, error) {
	b, _ := json.Marshal(v)
	resp, err := httpc.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
