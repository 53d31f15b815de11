package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// ProxiedHeader marks a request forwarded by a follower, so that two followers with
// different views of the lock never bounce a request between them.
const ProxiedHeader = "X-Contiv-Proxied-By"

// UnprocessedHeader marks a 503 the front answered before any handler saw the request (no
// leader yet, leadership changing, a request proxied twice, a leader that refused the
// connection): nothing was done, so a client may send it again whatever its method
// (pkg/masterclient does, within its deadline).
const UnprocessedHeader = "X-Contiv-Unprocessed"

// LeaderView is what the front needs from an election.
type LeaderView interface {
	IsLeader() bool
	CurrentLeader() string
	ID() string
}

// Front serves requests with Local while this node leads and reverse-proxies them to
// http://<lock value> otherwise (Contiv's follower behaviour), streaming bodies both ways
// and preserving status codes. When no leader is known it answers 503 with Retry-After.
type Front struct {
	view   LeaderView
	local  http.Handler
	proxy  *httputil.ReverseProxy
	log    *slog.Logger
	scheme string
	// forward, when set, edits the proxied request (caller identity for the leader).
	forward func(in, out *http.Request)
}

// UseTLS makes the front proxy to the leader over HTTPS with tc (nil: system roots).
func (f *Front) UseTLS(tc *tls.Config) {
	f.scheme = "https"
	if tr, ok := f.proxy.Transport.(*http.Transport); ok {
		tr = tr.Clone()
		tr.TLSClientConfig = tc
		f.proxy.Transport = tr
	}
}

// NewFront builds the leader-or-proxy handler. transport may be nil (a default with short
// dial timeouts is used).
func NewFront(view LeaderView, local http.Handler, transport http.RoundTripper) *Front {
	if transport == nil {
		transport = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		}
	}
	f := &Front{view: view, local: local, log: slog.With("component", "leader-proxy"), scheme: "http"}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			leader := pr.In.Context().Value(leaderCtxKey{}).(string)
			pr.SetURL(&url.URL{Scheme: f.scheme, Host: leader})
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			pr.Out.Header.Set(ProxiedHeader, view.ID())
			if f.forward != nil {
				f.forward(pr.In, pr.Out)
			}
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			leader, _ := r.Context().Value(leaderCtxKey{}).(string)
			f.log.Warn("proxy to leader failed", "leader", leader, "path", r.URL.Path, "err", err)
			// Only a connection never made is known to have done nothing at the leader.
			var oe *net.OpError
			// (The leader's address and the dial error stay in the log: callers that may
			// not see hosts' addresses get this answer too.)
			unavailable(w, "netmaster leader unreachable: try again", errors.As(err, &oe) && oe.Op == "dial")
		},
	}
	return f
}

type leaderCtxKey struct{}

func unavailable(w http.ResponseWriter, msg string, unprocessed bool) {
	w.Header().Set("Retry-After", "1")
	if unprocessed {
		w.Header().Set(UnprocessedHeader, "1")
	}
	http.Error(w, msg, http.StatusServiceUnavailable)
}

// ServeHTTP implements http.Handler.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.view.IsLeader() {
		f.local.ServeHTTP(w, r)
		return
	}
	leader := f.view.CurrentLeader()
	switch {
	case leader == "":
		unavailable(w, "no netmaster leader elected yet", true)
		return
	case leader == f.view.ID():
		// Our own stale lock (previous incarnation) or a transition in progress.
		unavailable(w, "netmaster leadership is changing", true)
		return
	case r.Header.Get(ProxiedHeader) != "":
		unavailable(w, fmt.Sprintf("request already proxied by %s; this node is not the leader", r.Header.Get(ProxiedHeader)), true)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), leaderCtxKey{}, leader))
	f.proxy.ServeHTTP(w, r)
}
