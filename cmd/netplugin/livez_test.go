package main

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLivezWhileWaitingForCluster (issue 38 review): netplugin started without
// --encryption waits for netmaster's global config before it opens the datapath; while it
// waits (here: an etcd that never answers) /livez must answer 200, else the Kubernetes
// liveness probe (deploy/kubernetes/contiv.yaml) restarts it, which ends no wait, and
// /healthz 503 (not ready); nothing else is served before the agent exists.
func TestLivezWhileWaitingForCluster(t *testing.T) {
	dir := t.TempDir()
	etcd, err := net.Listen("tcp", "127.0.0.1:0") // (an etcd that never answers)
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	np := startNetplugin(t, dir, "--host", "cbh-livez", "--vtep-ip", "127.0.0.1", "--dataplane", "ovs",
		"--ovs-db", "unix:"+filepath.Join(dir, "none.sock"), "--dns-listen", "off",
		"--etcd-endpoints", "http://"+etcd.Addr().String(), "--inspect-listen", addr)
	get := func(path string) (int, string, error) {
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body, err := get("/livez")
		if err == nil && code == http.StatusOK {
			break
		}
		select {
		case <-np.exited:
			t.Fatalf("netplugin exited while waiting for its global config: %v\n%s", np.err, np.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/livez while netplugin waits for the global config: %d %q %v, want 200 within 10 s\n%s", code, body, err, np.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body, err := get("/healthz"); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "global config") {
		t.Errorf("/healthz while waiting: %d %q %v, want 503 saying what it waits for", code, body, err)
	}
	if code, _, err := get("/inspect/agent"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("/inspect/agent while waiting: %d %v, want 503", code, err)
	}
}
