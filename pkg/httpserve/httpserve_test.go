package httpserve

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSlowClientsAreShed: 300 connections that never send a request, against a cap of
// 50, neither exhaust the server nor keep a real client out; a request in progress is
// never the one shed.
func TestSlowClientsAreShed(t *testing.T) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "ok")
	})
	s := New(h, Limits{MaxConns: 50})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.HTTP.Close()
	addr := ln.Addr().String()

	// A request in progress (handler blocked) must survive the flood.
	slowDone := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/slow")
		if err != nil {
			slowDone <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slowDone <- string(b)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for s.Open() == 0 || s.idle.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("slow request never became active")
		}
		time.Sleep(10 * time.Millisecond)
	}

	var stalled []net.Conn
	defer func() {
		for _, c := range stalled {
			c.Close()
		}
	}()
	for i := 0; i < 300; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		stalled = append(stalled, c)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("real client kept out by stalled connections: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("body %q", b)
	}
	if n := s.Open(); n > 50 {
		t.Errorf("%d connections open, cap 50", n)
	}
	if s.Shed() < 250 {
		t.Errorf("shed %d connections, want at least 250", s.Shed())
	}
	close(release)
	if got := <-slowDone; got != "ok" {
		t.Errorf("request in progress was cut: %s", got)
	}
	// Shed connections were really closed: a read sees EOF or reset, not a timeout.
	_ = stalled[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := stalled[0].Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("oldest stalled connection still open: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	s := New(http.NotFoundHandler(), Limits{})
	if s.HTTP.ReadHeaderTimeout == 0 || s.HTTP.ReadTimeout == 0 || s.HTTP.IdleTimeout == 0 || s.HTTP.MaxHeaderBytes != 64<<10 {
		t.Fatalf("defaults not applied: %+v", s.HTTP)
	}
	if s.limits.MaxConns < 64 {
		t.Fatalf("max conns %d", s.limits.MaxConns)
	}
}

func TestCleanPaths(t *testing.T) {
	h := CleanPaths(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") }))
	s := New(h, Limits{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.HTTP.Close()
	for path, want := range map[string]int{
		"/api/v1/networks/default:n1/":       200,
		"/":                                  200,
		"/api/v1/networks/x/../victim/":      400,
		"/api/v1/networks/x/%2e%2e/victim/":  400,
		"/api/v1/networks/default%2Fvictim/": 400,
		"/api/v1/networks/./default:n1/":     400,
		"/api/v1//networks/":                 400,
		"/api/v1/networks/a%00b/":            400,
		"/api/v1/networks/a..b/":             200, // dots inside a name are names
	} {
		// Raw request line: net/http's client would clean some of these itself.
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		b, _ := io.ReadAll(c)
		c.Close()
		line, _, _ := strings.Cut(string(b), "\r\n")
		if !strings.Contains(line, " "+strconv.Itoa(want)+" ") {
			t.Errorf("%s: %s, want %d", path, line, want)
		}
	}
}

// TestSlowBodiesAreShed: clients that send complete headers and then trickle their body
// fill the cap; past SlowBodyGrace they are shed for a new client, their handlers never
// run, and a body that arrives in time reaches the handler whole.
func TestSlowBodiesAreShed(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	s := New(h, Limits{MaxConns: 8, SlowBodyGrace: 200 * time.Millisecond, BodyBytes: 16})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.HTTP.Close()
	addr := ln.Addr().String()
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := 0; i < 8; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
		slow = append(slow, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := s.readingList.Len()
		s.mu.Unlock()
		if n == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slow bodies registered, want 8", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // past the grace
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	long := strings.Repeat("y", 40) // longer than BodyBytes: the rest follows the buffered part
	resp, err := hc.Post("http://"+addr+"/x", "application/json", strings.NewReader(long))
	if err != nil {
		t.Fatalf("client kept out by slow bodies: %v", err)
	}
	resp.Body.Close()
	if s.Shed() == 0 {
		t.Fatal("no slow-body connection was shed")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || bodies[0] != long {
		t.Fatalf("handler saw bodies %q, want only the real client's", bodies)
	}
}
