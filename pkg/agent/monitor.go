package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// MonitorLine is one line of GET /monitor: a drop event with the names of both ends.
type MonitorLine struct {
	dataplane.MonitorEvent
	Host        string `json:"host"`
	SrcEndpoint string `json:"srcEndpoint,omitempty"`
	DstEndpoint string `json:"dstEndpoint,omitempty"`
	// Lost counts events this subscriber missed (slow reader) since its last line; a line
	// with only Lost set reports them.
	Lost uint64 `json:"lost,omitempty"`
}

// monitorFilter selects lines: every set field must match.
type monitorFilter struct {
	endpoint string // substring of either endpoint id, or either address
	tenant   string // tenant of the network the packet belongs to
	reason   string // substring of the reason
	policy   bool   // policy verdicts only (drops, and allowed flows if allowed)
	allowed  bool   // include flows a rule allowed (policy_allow)
}

func (f monitorFilter) match(l MonitorLine) bool {
	if f.reason != "" && !strings.Contains(l.Reason, f.reason) {
		return false
	}
	if l.Reason == "policy_allow" && !f.allowed {
		return false
	}
	if f.policy && l.Reason != "drop_policy" && l.Reason != "policy_allow" {
		return false
	}
	if f.tenant != "" {
		if _, t, _ := strings.Cut(l.Network, "."); t != f.tenant {
			return false
		}
	}
	if f.endpoint != "" {
		ok := strings.Contains(l.SrcEndpoint, f.endpoint) || strings.Contains(l.DstEndpoint, f.endpoint) ||
			(l.Src.IsValid() && l.Src.String() == f.endpoint) || (l.Dst.IsValid() && l.Dst.String() == f.endpoint)
		if !ok {
			return false
		}
	}
	return true
}

// monitorHub fans the driver's single event stream out to every /monitor client. The
// stream is open only while somebody listens.
type monitorHub struct {
	a    *Agent
	src  dataplane.EventSource
	mu   sync.Mutex
	subs map[*monitorSub]struct{}
	stop context.CancelFunc
	done chan struct{} // closed when the current (or last) driver stream has ended
	// names maps addresses to endpoints, rebuilt at most once a second from what is
	// applied (taking the apply lock per event would stall attaches).
	names     map[netip.Addr][]nameEntry
	namesTime time.Time
}

type nameEntry struct{ id, network string }

type monitorSub struct {
	f    monitorFilter
	host string // where the client calls from
	ch   chan MonitorLine
	lost uint64
}

// Stream limits: the inspect API's connection cap (256, cmd/netplugin) is shared with
// /healthz, /metrics and every other request, and a stream holds its connection for as
// long as the client likes: streams take at most a quarter of it, and one host at most
// a quarter of that, so no local process (or host) holding streams can keep probes and
// scrapes out.
const (
	maxMonitorStreams        = 64
	maxMonitorStreamsPerHost = 16
)

// errTooManyStreams refuses a stream beyond the limits (429).
var errTooManyStreams = errors.New("too many /monitor streams open")

func (h *monitorHub) subscribe(f monitorFilter, host string) (*monitorSub, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	mine := 0
	for o := range h.subs {
		if o.host == host {
			mine++
		}
	}
	if len(h.subs) >= maxMonitorStreams || mine >= maxMonitorStreamsPerHost {
		return nil, fmt.Errorf("%w: %d in all (at most %d), %d from %s (at most %d)", errTooManyStreams,
			len(h.subs), maxMonitorStreams, mine, host, maxMonitorStreamsPerHost)
	}
	s := &monitorSub{f: f, host: host, ch: make(chan MonitorLine, 1024)}
	if len(h.subs) == 0 {
		// The last client's stream may still be closing (the driver allows one): wait for
		// it without the lock, which its goroutine needs to finish.
		if done := h.done; done != nil {
			h.mu.Unlock()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
			}
			h.mu.Lock()
		}
	}
	if len(h.subs) == 0 { // still (or again) nobody: open the stream
		ctx, cancel := context.WithCancel(context.Background())
		evs, err := h.src.MonitorEvents(ctx)
		if err != nil {
			cancel()
			return nil, err
		}
		h.stop = cancel
		h.done = make(chan struct{})
		go h.run(evs, h.done)
	}
	h.subs[s] = struct{}{}
	h.updateAllowLocked()
	return s, nil
}

// updateAllowLocked asks the datapath for allowed-flow events while some client wants them.
func (h *monitorHub) updateAllowLocked() {
	want := false
	for s := range h.subs {
		want = want || s.f.allowed
	}
	if err := h.src.SetAllowEvents(want); err != nil {
		h.a.log.Warn("monitor: set allowed-flow events", "on", want, "err", err)
	}
}

// unsubscribe removes s; the last one closes the driver stream and waits until it is
// closed, so a client that reconnects at once finds it free.
func (h *monitorHub) unsubscribe(s *monitorSub) {
	h.mu.Lock()
	delete(h.subs, s)
	var done chan struct{}
	if len(h.subs) > 0 {
		h.updateAllowLocked()
	}
	if len(h.subs) == 0 && h.stop != nil {
		h.stop() // closes the driver stream: the datapath stops emitting
		h.stop = nil
		done = h.done
	}
	h.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
}

func (h *monitorHub) run(evs <-chan dataplane.MonitorEvent, done chan struct{}) {
	defer close(done)
	for ev := range evs {
		l := h.describe(ev)
		h.mu.Lock()
		for s := range h.subs {
			if !s.f.match(l) {
				continue
			}
			out := l
			out.Lost, s.lost = s.lost, 0
			select {
			case s.ch <- out:
			default:
				s.lost += 1 + out.Lost
			}
		}
		h.mu.Unlock()
	}
}

// describe names the endpoints of ev: the network is the one of the interface the packet
// came from when that is a local endpoint, which settles overlapping subnets.
func (h *monitorHub) describe(ev dataplane.MonitorEvent) MonitorLine {
	if time.Since(h.namesTime) > time.Second {
		s := h.a.Inspect()
		names := map[netip.Addr][]nameEntry{}
		for _, ep := range s.Endpoints {
			names[ep.IP] = append(names[ep.IP], nameEntry{ep.ID, ep.NetworkID})
		}
		for _, ep := range s.RemoteEndpoints {
			names[ep.IP] = append(names[ep.IP], nameEntry{ep.ID, ep.NetworkID})
		}
		h.names, h.namesTime = names, time.Now()
	}
	l := MonitorLine{MonitorEvent: ev, Host: h.a.cfg.Host}
	pick := func(a netip.Addr) nameEntry {
		cands := h.names[a]
		for _, c := range cands {
			if l.Network == "" || c.network == l.Network {
				return c
			}
		}
		if len(cands) == 1 {
			return cands[0]
		}
		return nameEntry{}
	}
	if ev.Src.IsValid() {
		src := pick(ev.Src)
		l.SrcEndpoint = src.id
		if l.Network == "" {
			l.Network = src.network
		}
	}
	if ev.Src.IsValid() || ev.Count > 0 {
		// Also without a source: a counted drop at the receiver (MonitorEvent.Count), whose
		// network the driver gives.
		l.DstEndpoint = pick(ev.Dst).id
	}
	return l
}

// serveMonitor streams matching drop events as JSON lines until the client goes away.
// Query: endpoint, tenant, reason, policy=1 (policy verdicts only), allowed=1 (also flows
// a rule allowed).
func (a *Agent) serveMonitor(w http.ResponseWriter, req *http.Request) {
	h, err := a.monitor()
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotImplemented)
		return
	}
	q := req.URL.Query()
	f := monitorFilter{endpoint: q.Get("endpoint"), tenant: q.Get("tenant"), reason: q.Get("reason")}
	for name, dst := range map[string]*bool{"policy": &f.policy, "allowed": &f.allowed} {
		if v := q.Get(name); v != "" {
			if *dst, err = strconv.ParseBool(v); err != nil {
				http.Error(w, fmt.Sprintf("%s: %q is not a boolean", name, v), http.StatusBadRequest)
				return
			}
		}
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming not supported", http.StatusInternalServerError)
		return
	}
	// A monitor outlives the server's write timeout.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	host, _, err := net.SplitHostPort(req.RemoteAddr)
	if err != nil {
		host = req.RemoteAddr
	}
	s, err := h.subscribe(f, host)
	if errors.Is(err, errTooManyStreams) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, err.Error(), http.StatusTooManyRequests)
		return
	}
	if err != nil {
		http.Error(w, "open drop events: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer h.unsubscribe(s)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	enc := json.NewEncoder(w)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-req.Context().Done():
			return
		case l := <-s.ch:
			if enc.Encode(l) != nil {
				return
			}
			fl.Flush()
		case <-tick.C:
			h.mu.Lock()
			lost := s.lost
			s.lost = 0
			h.mu.Unlock()
			if lost > 0 {
				if enc.Encode(MonitorLine{Host: a.cfg.Host, Lost: lost}) != nil {
					return
				}
				fl.Flush()
			}
		}
	}
}

// monitor returns the agent's hub, made on first use.
func (a *Agent) monitor() (*monitorHub, error) {
	src, ok := a.cfg.Driver.(dataplane.EventSource)
	if !ok {
		return nil, fmt.Errorf("this dataplane has no drop event stream")
	}
	a.monOnce.Do(func() { a.mon = &monitorHub{a: a, src: src, subs: map[*monitorSub]struct{}{}} })
	return a.mon, nil
}
