// Package httpserve owns how our HTTP APIs face careless and hostile clients: server
// timeouts, header limits, a connection cap that sheds the connections doing nothing
// useful (no complete request yet, idle keep-alive, or a request body still trickling in
// after a grace period) instead of letting a flood of slow clients hold every file
// descriptor, and budgets on the request body bytes held in memory, per caller and in
// all, with bodies read only where the server's owner places BodyFirst (after
// authentication: nobody's body is buffered before it is known whose it is).
// netmaster's REST API and netplugin's local API both serve through it.
package httpserve

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits configures a Server. Zero values take the defaults below.
type Limits struct {
	// MaxConns caps open connections; at the cap, the oldest connection that has not sent
	// a complete request (or sits idle between requests) is closed to admit the new one,
	// and when there is none the new one is closed. Default: DefaultMaxConns(), which
	// leaves room under RLIMIT_NOFILE for everything else the process opens.
	MaxConns int
	// ReadHeaderTimeout bounds the time to send request headers (default 10 s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included (default 60 s).
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response (default 60 s).
	WriteTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections (default 120 s).
	IdleTimeout time.Duration
	// MaxHeaderBytes defaults to 64 KiB.
	MaxHeaderBytes int
	// BodyBytes is how much of a request body is read before the handler runs (default
	// 1 MiB; the handler reads any rest itself and applies its own limit).
	BodyBytes int64
	// SlowBodyGrace is how long a request body may take to arrive before, at the cap, its
	// connection may be shed like an idle one (default 1 s).
	SlowBodyGrace time.Duration
	// CallerBytes bounds the request body bytes one caller (CallerOf) may have in memory:
	// read before its handler runs and held while it runs (default 8 MiB); TotalBytes
	// bounds all callers together (default 256 MiB). A request beyond either is refused
	// with 429 and Retry-After before any of its body is read. Each request is charged
	// BodyBytes (what may be read of it), or its Content-Length when smaller.
	CallerBytes, TotalBytes int64
	// CallerOf names a request's caller for CallerBytes, from what the handlers in front of
	// BodyFirst set (an authenticated identity); nil or "": one caller for all.
	CallerOf func(*http.Request) string
	// Logger receives shedding reports (rate-limited); default slog.Default().
	Logger *slog.Logger
}

// reserveFDs is what DefaultMaxConns keeps free for etcd clients, files and outgoing
// connections.
const reserveFDs = 1024

// DefaultMaxConns is RLIMIT_NOFILE minus a reserve, at least 64.
func DefaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	n := int(rl.Cur) - reserveFDs
	if rl.Cur > 1<<20 {
		n = 1<<20 - reserveFDs
	}
	return max(n, 64)
}

// RaiseFDLimit sets the soft RLIMIT_NOFILE to the hard limit and returns the new value.
func RaiseFDLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			return 0, err
		}
	}
	return rl.Cur, nil
}

// New returns a server with the limits applied for the handler build returns; build gets
// the middleware that reads a request's body before the handler it wraps runs, within the
// budgets (BodyFirst), and places it where bodies are to be read: after authentication.
// Serve it with Serve (not srv.HTTP.Serve) so the connection cap is enforced.
func New(l Limits, build func(bodyFirst func(http.Handler) http.Handler) http.Handler) *Server {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns()
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = 10 * time.Second
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = 60 * time.Second
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = 60 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 120 * time.Second
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = 64 << 10
	}
	if l.Logger == nil {
		l.Logger = slog.Default()
	}
	if l.BodyBytes <= 0 {
		l.BodyBytes = 1 << 20
	}
	if l.SlowBodyGrace <= 0 {
		l.SlowBodyGrace = time.Second
	}
	if l.CallerBytes <= 0 {
		l.CallerBytes = 8 << 20
	}
	if l.TotalBytes <= 0 {
		l.TotalBytes = 256 << 20
	}
	s := &Server{limits: l, conns: map[net.Conn]*list.Element{}, idle: list.New(),
		reading: map[net.Conn]*list.Element{}, readingList: list.New(), held: map[string]int64{}}
	s.HTTP = &http.Server{
		Handler:           CleanPaths(build(s.bodyFirst)),
		ConnContext:       func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ConnState:         s.connState,
		ErrorLog:          slog.NewLogLogger(l.Logger.Handler(), slog.LevelDebug),
	}
	return s
}

// CleanPaths refuses, with 400, a request path that a router would rewrite or that could
// name another object: "." or ".." segments, empty segments, and encoded '/', '\\' or
// NUL. Go's ServeMux would otherwise answer "/a/x/../victim/" with a redirect to
// "/a/victim/", and a decoded "%2F" would split an object key.
func CleanPaths(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := uncleanPath(r.URL.EscapedPath()); msg != "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, "path "+strconv.Quote(r.URL.EscapedPath())+": "+msg+"\n")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func uncleanPath(p string) string {
	if p == "" || p[0] != '/' {
		return "must start with /"
	}
	lower := strings.ToLower(p)
	for _, enc := range []string{"%2f", "%5c", "%00"} {
		if strings.Contains(lower, enc) {
			return "encoded '/', '\\' or NUL is not allowed"
		}
	}
	segs := strings.Split(p[1:], "/")
	for i, seg := range segs {
		switch {
		case seg == "." || seg == ".." || strings.EqualFold(seg, "%2e") || strings.EqualFold(seg, "%2e%2e") ||
			strings.EqualFold(seg, ".%2e") || strings.EqualFold(seg, "%2e."):
			return "'.' and '..' segments are not allowed"
		case seg == "" && i != len(segs)-1 && len(segs) > 1:
			return "empty segments are not allowed"
		}
	}
	return ""
}

// Server is an http.Server with a shedding connection cap.
type Server struct {
	HTTP   *http.Server
	limits Limits

	mu    sync.Mutex
	conns map[net.Conn]*list.Element // every open connection; element non-nil while sheddable
	idle  *list.List                 // sheddable connections (new or idle), oldest first
	// reading holds the connections whose request body is being read before the handler
	// runs, oldest first (values are *bodyRead).
	reading     map[net.Conn]*list.Element
	readingList *list.List
	shed        uint64
	lastLog     time.Time
	// held is the body bytes each caller has charged (CallerBytes), heldAll their sum
	// (TotalBytes); refused counts the requests refused for either.
	held    map[string]int64
	heldAll int64
	refused uint64
}

// connKey is the context key of a request's connection.
type connKey struct{}

type bodyRead struct {
	c     net.Conn
	since time.Time
}

// bodyFirst reads up to BodyBytes of the request body before calling h, with the
// connection marked as reading: a client trickling its body can then be shed at the cap
// (after SlowBodyGrace) and its handler never runs. h gets the bytes read followed by
// whatever is left. The bytes are charged to the caller's and the server's budgets as they
// arrive (what a client announces but does not send holds nothing), until h returns; a
// request arriving while either budget is spent is refused (429) unread, and one whose
// bytes would take a budget past it is refused when they arrive.
func (s *Server) bodyFirst(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		if r.Body == nil || r.Body == http.NoBody || c == nil {
			h.ServeHTTP(w, r)
			return
		}
		caller := ""
		if s.limits.CallerOf != nil {
			caller = s.limits.CallerOf(r)
		}
		s.mu.Lock()
		if _, open := s.conns[c]; !open {
			s.mu.Unlock()
			return // already shed
		}
		if s.held[caller] >= s.limits.CallerBytes || s.heldAll >= s.limits.TotalBytes {
			s.refused++
			s.mu.Unlock()
			tooMany(w)
			return
		}
		s.reading[c] = s.readingList.PushBack(&bodyRead{c: c, since: time.Now()})
		s.mu.Unlock()
		// (Never more than what may be read, nor than the announced length.)
		limit := s.limits.BodyBytes + 1
		if r.ContentLength >= 0 && r.ContentLength < limit {
			limit = r.ContentLength
		}
		body := &chargedBody{s: s, caller: caller, max: int(limit)}
		defer func() { s.release(caller, body.charged) }()
		_, err := io.Copy(body, io.LimitReader(r.Body, s.limits.BodyBytes+1))
		s.mu.Lock()
		el, stillReading := s.reading[c]
		if stillReading {
			s.readingList.Remove(el)
			delete(s.reading, c)
		}
		s.mu.Unlock()
		switch {
		case errors.Is(err, errOverBudget):
			tooMany(w)
			return
		case err != nil || !stillReading:
			// Shed, timed out or gone: nobody is listening for an answer.
			if err == nil {
				err = net.ErrClosed
			}
			http.Error(w, "read request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body.data), r.Body), r.Body}
		h.ServeHTTP(w, r)
	})
}

// errOverBudget stops a body whose bytes would take a budget past its limit.
var errOverBudget = errors.New("request body bytes over budget")

func tooMany(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "too many request bytes in flight; retry later", http.StatusTooManyRequests)
}

// chargedBody holds a request body as it arrives, in a buffer whose every growth is
// charged to the caller's and the server's budgets first (charged: its capacity, what it
// holds in memory; bodyFirst gives it back). It grows by doubling, up to max.
type chargedBody struct {
	s       *Server
	caller  string
	max     int
	charged int64
	data    []byte
}

func (b *chargedBody) Write(p []byte) (int, error) {
	if free := cap(b.data) - len(b.data); free < len(p) {
		grown := min(max(2*cap(b.data), len(b.data)+len(p), 512), max(b.max, len(b.data)+len(p)))
		n := int64(grown - cap(b.data))
		b.s.mu.Lock()
		if b.s.held[b.caller]+n > b.s.limits.CallerBytes || b.s.heldAll+n > b.s.limits.TotalBytes {
			b.s.refused++
			b.s.mu.Unlock()
			return 0, errOverBudget
		}
		b.s.held[b.caller] += n
		b.s.heldAll += n
		b.charged += n
		b.s.mu.Unlock()
		b.data = append(make([]byte, 0, grown), b.data...)
	}
	b.data = append(b.data, p...)
	return len(p), nil
}

// Serve accepts on ln until Shutdown/Close.
func (s *Server) Serve(ln net.Listener) error {
	return s.HTTP.Serve(&capListener{Listener: ln, s: s})
}

// release gives charge bytes of caller's budget back.
func (s *Server) release(caller string, charge int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.heldAll -= charge
	if s.held[caller] -= charge; s.held[caller] <= 0 {
		delete(s.held, caller)
	}
}

// BodyBytesHeld reports the request body bytes charged to the budgets now, and how many
// requests the budgets refused.
func (s *Server) BodyBytesHeld() (held int64, refused uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heldAll, s.refused
}

// Shed reports how many connections were closed to stay under the cap.
func (s *Server) Shed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shed
}

// Open reports the number of open connections.
func (s *Server) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

type capListener struct {
	net.Listener
	s *Server
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.s.admit(c) {
			return c, nil
		}
		c.Close()
	}
}

// admit registers c, shedding the oldest sheddable connection at the cap; false when
// nothing could be shed (c is refused).
func (s *Server) admit(c net.Conn) bool {
	s.mu.Lock()
	var victim net.Conn
	if len(s.conns) >= s.limits.MaxConns {
		if front := s.idle.Front(); front != nil {
			victim = front.Value.(net.Conn)
			s.idle.Remove(front)
		} else if front := s.readingList.Front(); front != nil && time.Since(front.Value.(*bodyRead).since) > s.limits.SlowBodyGrace {
			victim = front.Value.(*bodyRead).c
			s.readingList.Remove(front)
			delete(s.reading, victim)
		} else {
			s.shed++
			s.noteShedLocked()
			s.mu.Unlock()
			return false
		}
		delete(s.conns, victim)
		s.shed++
		s.noteShedLocked()
	}
	s.conns[c] = s.idle.PushBack(c) // new: sheddable until a request arrives
	s.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
	return true
}

func (s *Server) noteShedLocked() {
	if time.Since(s.lastLog) > 10*time.Second {
		s.lastLog = time.Now()
		s.limits.Logger.Warn("connection cap reached: closing connections that sent no request or trickle a body",
			"max_conns", s.limits.MaxConns, "shed_total", s.shed)
	}
}

func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, known := s.conns[c]
	switch st {
	case http.StateNew:
		// Registered by admit.
	case http.StateActive:
		if known && el != nil {
			s.idle.Remove(el)
			s.conns[c] = nil
		}
	case http.StateIdle:
		if known && el == nil {
			s.conns[c] = s.idle.PushBack(c)
		}
	case http.StateHijacked, http.StateClosed:
		if known {
			if el != nil {
				s.idle.Remove(el)
			}
			delete(s.conns, c)
		}
		if el, ok := s.reading[c]; ok {
			s.readingList.Remove(el)
			delete(s.reading, c)
		}
	}
}
