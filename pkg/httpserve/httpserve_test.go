package httpserve

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	s := New(Limits{MaxConns: 50}, all(h))
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
	idle := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.idle.Len()
	}
	for s.Open() == 0 || idle() != 0 {
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
	s := New(Limits{}, all(http.NotFoundHandler()))
	if s.HTTP.ReadHeaderTimeout == 0 || s.HTTP.ReadTimeout == 0 || s.HTTP.IdleTimeout == 0 || s.HTTP.MaxHeaderBytes != 64<<10 {
		t.Fatalf("defaults not applied: %+v", s.HTTP)
	}
	if s.limits.MaxConns < 64 {
		t.Fatalf("max conns %d", s.limits.MaxConns)
	}
}

func TestCleanPaths(t *testing.T) {
	h := CleanPaths(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") }))
	s := New(Limits{}, all(h))
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
	s := New(Limits{MaxConns: 8, SlowBodyGrace: 200 * time.Millisecond, BodyBytes: 16}, all(h))
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

// all builds a handler that reads every request's body first (BodyFirst in front of h).
func all(h http.Handler) func(func(http.Handler) http.Handler) http.Handler {
	return func(bodyFirst func(http.Handler) http.Handler) http.Handler { return bodyFirst(h) }
}

// serveOn starts s on a loopback port and returns its address.
func serveOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.HTTP.Close() })
	return ln.Addr().String()
}

// TestBodyReadOnlyBehindTheGate (control plane issue, memory before authentication): a
// gate placed in front of BodyFirst (authentication) answers a request it refuses at once,
// without waiting for or buffering its body; one it lets in has its body read as before.
func TestBodyReadOnlyBehindTheGate(t *testing.T) {
	var reached atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		reached.Add(int64(len(b)))
		io.WriteString(w, "ok")
	})
	gate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Ok") == "" {
				http.Error(w, "who are you", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	s := New(Limits{}, func(bodyFirst func(http.Handler) http.Handler) http.Handler { return gate(bodyFirst(h)) })
	addr := serveOn(t, s)
	ask := func(hdr string) string {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// A megabyte announced, a hundred bytes sent: the answer must not wait for the rest.
		fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: x\r\n%sContent-Length: 1048576\r\n\r\n%s", hdr, strings.Repeat("z", 100))
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	if line := ask(""); !strings.Contains(line, " 401 ") {
		t.Fatalf("unauthenticated request with a pending body answered %q, want 401 at once", line)
	}
	if held, _ := s.BodyBytesHeld(); held != 0 {
		t.Errorf("%d body bytes held after a refused request", held)
	}
	if line := ask("X-Ok: 1\r\n"); line != "" {
		t.Fatalf("an admitted request was answered %q before its body arrived", line)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/x", strings.NewReader(strings.Repeat("y", 5000)))
	req.Header.Set("X-Ok", "1")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || reached.Load() != 5000 {
		t.Fatalf("admitted request: %d, handler read %d bytes, want 200 and 5000", resp.StatusCode, reached.Load())
	}
}

// TestBodyBudgets: a caller's bodies in memory are bounded (CallerBytes), all callers'
// together too (TotalBytes); a request beyond either is refused with 429 and Retry-After
// before its body is read, and what a finished request held is given back.
func TestBodyBudgets(t *testing.T) {
	release := make(chan struct{})
	var in sync.WaitGroup
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		in.Done()
		<-release
	})
	s := New(Limits{BodyBytes: 1024, CallerBytes: 3 * 1024, TotalBytes: 5 * 1024,
		CallerOf: func(r *http.Request) string { return r.Header.Get("X-Caller") }}, all(h))
	addr := serveOn(t, s)
	hc := &http.Client{Timeout: 10 * time.Second}
	post := func(caller string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/x", strings.NewReader(strings.Repeat("b", 1024)))
		req.Header.Set("X-Caller", caller)
		return hc.Do(req)
	}
	var held sync.WaitGroup
	hold := func(caller string) {
		in.Add(1)
		held.Add(1)
		go func() {
			defer held.Done()
			if resp, err := post(caller); err == nil {
				resp.Body.Close()
			}
		}()
	}
	for i := 0; i < 3; i++ {
		hold("a")
	}
	in.Wait()
	refused := func(caller, why string) {
		t.Helper()
		resp, err := post(caller)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: %d (Retry-After %q), want 429 with Retry-After", why, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	refused("a", "a caller past its budget")
	hold("b")
	hold("b")
	in.Wait()
	refused("c", "a new caller past the server's budget")
	if got, n := s.BodyBytesHeld(); got != 5*1024 || n != 2 {
		t.Errorf("held %d bytes, %d refused; want 5120 and 2", got, n)
	}
	close(release)
	held.Wait()
	if got, _ := s.BodyBytesHeld(); got != 0 {
		t.Errorf("%d bytes still held after every request finished", got)
	}
	in.Add(1) // (the handler counts it in)
	resp, err := post("a")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the release: %d, want 200", resp.StatusCode)
	}
}

// TestBodyChargedAsItArrives: a body is charged as its bytes arrive, not by the length it
// announces. Two requests of one caller announcing 1,024 bytes each and stalling after 10
// hold 512 bytes each of the caller's 2,048, so the caller's next request gets in; before,
// each held its announced 1,024 and the next was refused 429.
func TestBodyChargedAsItArrives(t *testing.T) {
	var mu sync.Mutex
	var got []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
	})
	s := New(Limits{BodyBytes: 1024, CallerBytes: 2048, TotalBytes: 1 << 20, SlowBodyGrace: time.Minute}, all(h))
	addr := serveOn(t, s)
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n0123456789")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if held, _ := s.BodyBytesHeld(); held == 2*512 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d bytes held by two stalled 10-byte bodies, want 1024", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	body := strings.Repeat("z", 1000)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Post("http://"+addr+"/x", "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the caller's request beside two stalled ones: %d, want 200", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != body {
		t.Fatalf("handler saw %d bodies, want the real one", len(got))
	}
}
