package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
)

// TestSlowClientFlood: thousands of connections that never send a request, stop inside
// their headers or trickle a body (more than its open-file limit, here 2,048 with the
// default cap of limit - 1,024) neither kill netmaster (with its embedded etcd) nor keep a
// real client from creating an object; a path that climbs out of its object ("x/../victim") is refused
// with 400 instead of being redirected to the other object.
func TestSlowClientFlood(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "etcd")
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	port := statetest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := startProc(t, "nm-flood", "prlimit", "--nofile=2048", binPath, "--listen-url", addr, "--control-url", addr,
		"--rpc-port", fmt.Sprint(statetest.FreePort(t)), "--mode", "docker", "--netmode", "vxlan", "--fwdmode", "routing", "--insecure",
		"--etcd-data-dir", dataDir, "--etcd-listen-client-url", clientURL, "--etcd-listen-peer-url", peerURL)
	p.url, p.addr = "http://"+addr, addr
	eventually(t, 30*time.Second, "netmaster leads", func() error {
		i, err := getInfo(p)
		if err == nil && i.CurrentState != "leader" {
			err = fmt.Errorf("state %q", i.CurrentState)
		}
		return err
	})
	mustCall(t, "POST", p.url+"/api/v1/globals/global/", `{"name":"global","networkInfraType":"default","vlans":"1-4094","vxlans":"1-10000","fwdMode":"routing","arpMode":"proxy","pvtSubnet":"172.19.0.0/16"}`, 200)

	var stalled []net.Conn
	defer func() {
		for _, c := range stalled {
			c.Close()
		}
	}()
	for i := 0; i < 3000; i++ {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		switch i % 3 {
		case 1:
			fmt.Fprintf(c, "POST /api/v1/tenants/t%d/ HTTP/1.1\r\nHost: x\r\n", i) // headers never finished
		case 2: // body never finished
			fmt.Fprintf(c, "POST /api/v1/tenants/t%d/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tenantName\":", i)
		}
		stalled = append(stalled, c)
	}
	time.Sleep(1500 * time.Millisecond) // past the slow-body grace: trickling bodies are sheddable
	// Without shedding, the real client waits for the stalled ones' 10 s header timeout
	// (the file descriptors are gone); with it, it is served at once. 5 s is a hang
	// detector, not a speed goal.
	quick := &http.Client{Timeout: 5 * time.Second}
	resp, err := quick.Post(p.url+"/api/v1/tenants/flood/", "application/json", strings.NewReader(`{"tenantName":"flood"}`))
	if err != nil {
		t.Fatalf("create under the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("create under the flood: %d", resp.StatusCode)
	}
	if !p.alive() {
		t.Fatal("netmaster exited under the flood")
	}

	// Raw request line: Go's client would clean the path itself.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "DELETE /api/v1/tenants/x/../flood/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, " 400 ") {
		t.Fatalf("climbing path answered %q, want 400", strings.TrimSpace(line))
	}
	mustCall(t, "GET", p.url+"/api/v1/tenants/flood/", "", 200)
}
