// Package dnsresp is the host agent's DNS responder (docs/host-routing.md "DNS"). An
// endpoint's resolver asks its network's gateway on UDP port 53; the datapath steers the
// query to this responder's host address, and the answer goes back from the gateway's
// address on the interface the query came in on. The asking endpoint is known by that
// interface, never by the source it claims, so a tenant is only ever answered with its own
// names: container or pod names, endpoint ids, endpoint group names (every member) and
// service names (the VIP), bare or qualified with the tenant ("web" or "web.blue").
// Other names are forwarded to the host's upstream servers. Queries are rate-limited per
// endpoint; malformed, oversized and refused queries are counted.
package dnsresp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// Asker is the endpoint behind the interface a query arrived on.
type Asker struct {
	Tenant  string
	Gateway netip.Addr // the address the endpoint asked (its network's gateway)
}

// Directory is what the responder needs from the agent.
type Directory interface {
	// Asker returns the local endpoint behind host interface ifindex (ok=false: none).
	Asker(ifindex int) (Asker, bool)
	// Lookup returns the IPv4 addresses of name in tenant (name lower case, without the
	// tenant suffix and the trailing dot); exists=false: no such name.
	Lookup(tenant, name string) (addrs []netip.Addr, exists bool)
}

// Config configures a Server.
type Config struct {
	Listen    netip.AddrPort // a host address, port 53
	Upstreams []string       // "ip:port" forwarded to in order; none: other names get SERVFAIL
	Rate      float64        // queries per second per endpoint (default 200)
	Burst     int            // (default 400)
	TTL       uint32         // of answers (default 5 s)
	// MaxForwards bounds the queries being forwarded at once (default 256); beyond it a
	// query gets SERVFAIL at once.
	MaxForwards int
	// MaxForwardsPerAsker bounds one endpoint's queries being forwarded at once (default
	// 16): one endpoint asking slow names cannot take every other's forwarding.
	MaxForwardsPerAsker int
	// UpstreamDevice, if set, binds the forwarding sockets to that device (SO_BINDTODEVICE):
	// a route to an endpoint can never divert the host's forwarded queries.
	UpstreamDevice string
	// DialUpstream opens the socket a query is forwarded on (default: a UDP net.Dialer in
	// the caller's network namespace, bound to UpstreamDevice; tests pass one that dials
	// inside theirs).
	DialUpstream func(ctx context.Context, addr string) (net.Conn, error)
	Logger       *slog.Logger
}

// Query outcomes (label result of contiv_dns_queries_total).
const (
	ResAnswered   = "answered"    // one of the tenant's names
	ResNXDomain   = "nxdomain"    // a bare or tenant-qualified name the tenant does not have
	ResForwarded  = "forwarded"   // answered by an upstream server
	ResServFail   = "servfail"    // upstream failed or none configured, or too many in flight
	ResRefused    = "refused"     // not a standard query (NOTIMP), or more than one question (FORMERR)
	ResMalformed  = "malformed"   // undecodable, or a response: no reply
	ResRateLimit  = "ratelimited" // over the endpoint's rate: no reply
	ResUnknownSrc = "unknown_src" // not from a local endpoint's interface: no reply
)

// Server answers queries on one UDP socket until Close.
type Server struct {
	cfg     Config
	dir     Directory
	conn    *net.UDPConn
	pc      *ipv4.PacketConn
	log     *slog.Logger
	queries *prometheus.CounterVec
	latency prometheus.Histogram
	fwdSem  chan struct{}

	mu       sync.Mutex
	limiters map[int]*rate.Limiter
	inFlight map[int]int // forwards in flight by asking interface

	wg     sync.WaitGroup
	closed chan struct{}
	once   sync.Once
}

// Listen opens the responder's socket: bound to cfg.Listen, with IP_TRANSPARENT (answers
// leave from the gateway's address, which the host does not hold) and the arrival
// interface of every query reported (IP_PKTINFO).
func Listen(ctx context.Context, cfg Config, dir Directory) (*Server, error) {
	if !cfg.Listen.Addr().Is4() {
		return nil, fmt.Errorf("dns: listen address %v is not IPv4", cfg.Listen)
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 200
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 400
	}
	if cfg.TTL == 0 {
		cfg.TTL = 5
	}
	if cfg.MaxForwards <= 0 {
		cfg.MaxForwards = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxForwardsPerAsker <= 0 {
		cfg.MaxForwardsPerAsker = 16
	}
	if cfg.DialUpstream == nil {
		dev := cfg.UpstreamDevice
		cfg.DialUpstream = func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{}
			if dev != "" {
				d.Control = func(_, _ string, c syscall.RawConn) error {
					var serr error
					if err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), dev) }); err != nil {
						return err
					}
					return serr
				}
			}
			return d.DialContext(ctx, "udp4", addr)
		}
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	pconn, err := lc.ListenPacket(ctx, "udp4", cfg.Listen.String())
	if err != nil {
		return nil, fmt.Errorf("dns: listen on %v: %w", cfg.Listen, err)
	}
	conn := pconn.(*net.UDPConn)
	pc := ipv4.NewPacketConn(conn)
	if err := pc.SetControlMessage(ipv4.FlagInterface|ipv4.FlagDst, true); err != nil {
		conn.Close()
		return nil, fmt.Errorf("dns: ask for the arrival interface: %w", err)
	}
	s := &Server{cfg: cfg, dir: dir, conn: conn, pc: pc, log: cfg.Logger.With("component", "dns"),
		fwdSem: make(chan struct{}, cfg.MaxForwards), limiters: map[int]*rate.Limiter{}, inFlight: map[int]int{}, closed: make(chan struct{}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "contiv_dns_queries_total",
			Help: "DNS queries from local endpoints to the agent's responder, by outcome."}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "contiv_dns_answer_seconds",
			Help:    "Time from reading a query to sending its answer (names of the tenant; forwarded queries excluded).",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3}}),
	}
	for _, r := range []string{ResAnswered, ResNXDomain, ResForwarded, ResServFail, ResRefused, ResMalformed, ResRateLimit, ResUnknownSrc} {
		s.queries.WithLabelValues(r)
	}
	return s, nil
}

// Collectors are the responder's metrics, for the agent's registry.
func (s *Server) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.queries, s.latency}
}

// Count returns the number of queries with outcome result so far.
func (s *Server) Count(result string) float64 {
	var m dto.Metric
	if err := s.queries.WithLabelValues(result).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// Serve answers queries until ctx is done or Close is called.
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.closed:
		}
	}()
	buf := make([]byte, 4096)
	for {
		n, cm, src, err := s.pc.ReadFrom(buf)
		if err != nil {
			select {
			case <-s.closed:
				s.wg.Wait()
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				s.wg.Wait()
				return nil
			}
			s.log.Warn("read query", "err", err)
			continue
		}
		from, ok := src.(*net.UDPAddr)
		if !ok || cm == nil {
			s.queries.WithLabelValues(ResUnknownSrc).Inc()
			continue
		}
		s.handle(append([]byte(nil), buf[:n]...), cm.IfIndex, from)
	}
}

// Close stops Serve and closes the socket.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.closed)
		s.conn.Close()
	})
}

func (s *Server) limiter(ifindex int) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.limiters[ifindex]
	if !ok {
		if len(s.limiters) > 65536 { // never more than the host's interfaces; bound it anyway
			s.limiters = map[int]*rate.Limiter{}
		}
		l = rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)
		s.limiters[ifindex] = l
	}
	return l
}

// handle answers one query read on interface ifindex from the endpoint at from.
func (s *Server) handle(b []byte, ifindex int, from *net.UDPAddr) {
	start := time.Now()
	asker, ok := s.dir.Asker(ifindex)
	if !ok {
		s.queries.WithLabelValues(ResUnknownSrc).Inc()
		return
	}
	if !s.limiter(ifindex).Allow() {
		s.queries.WithLabelValues(ResRateLimit).Inc()
		return
	}
	req := new(dns.Msg)
	if err := req.Unpack(b); err != nil || req.Response || (len(b) > dns.MinMsgSize && req.IsEdns0() == nil) {
		// Undecodable, a response (reflection), or larger than a query without EDNS0 may be.
		s.queries.WithLabelValues(ResMalformed).Inc()
		return
	}
	resp := new(dns.Msg)
	switch {
	case req.Opcode != dns.OpcodeQuery:
		resp.SetRcode(req, dns.RcodeNotImplemented)
		s.reply(resp, req, ifindex, asker, from, ResRefused, start)
		return
	case len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET:
		resp.SetRcode(req, dns.RcodeFormatError)
		s.reply(resp, req, ifindex, asker, from, ResRefused, start)
		return
	}
	q := req.Question[0]
	name, ours := s.ownName(asker.Tenant, q.Name)
	if !ours {
		s.forward(req, ifindex, asker, from)
		return
	}
	addrs, exists := s.dir.Lookup(asker.Tenant, name)
	resp.SetReply(req)
	resp.Authoritative = true
	resp.RecursionAvailable = len(s.cfg.Upstreams) > 0
	if !exists {
		resp.Rcode = dns.RcodeNameError
		s.reply(resp, req, ifindex, asker, from, ResNXDomain, start)
		return
	}
	if q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY {
		for _, a := range addrs {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: s.cfg.TTL}, A: a.AsSlice()})
		}
	}
	s.reply(resp, req, ifindex, asker, from, ResAnswered, start)
}

// ownName says whether qname is one of the tenant namespace's names: a single label, or
// a single label followed by the asking tenant's name. It returns that label.
func (s *Server) ownName(tenant, qname string) (string, bool) {
	n := strings.ToLower(strings.TrimSuffix(qname, "."))
	if n == "" {
		return "", false
	}
	if !strings.Contains(n, ".") {
		return n, true
	}
	if label, ok := strings.CutSuffix(n, "."+strings.ToLower(tenant)); ok && label != "" && !strings.Contains(label, ".") {
		return label, true
	}
	return "", false
}

// forward asks the upstream servers in order, in the background (bounded).
func (s *Server) forward(req *dns.Msg, ifindex int, asker Asker, from *net.UDPAddr) {
	fail := func() {
		resp := new(dns.Msg)
		resp.SetRcode(req, dns.RcodeServerFailure)
		s.reply(resp, req, ifindex, asker, from, ResServFail, time.Time{})
	}
	if len(s.cfg.Upstreams) == 0 {
		fail()
		return
	}
	s.mu.Lock()
	busy := s.inFlight[ifindex] >= s.cfg.MaxForwardsPerAsker
	if !busy {
		s.inFlight[ifindex]++
	}
	s.mu.Unlock()
	if busy {
		fail()
		return
	}
	release := func() {
		s.mu.Lock()
		if s.inFlight[ifindex]--; s.inFlight[ifindex] <= 0 {
			delete(s.inFlight, ifindex)
		}
		s.mu.Unlock()
	}
	select {
	case s.fwdSem <- struct{}{}:
	default:
		release()
		fail()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.fwdSem }()
		defer release()
		for _, up := range s.cfg.Upstreams {
			select {
			case <-s.closed:
				return
			default:
			}
			if resp, err := s.exchange(req, up); err == nil {
				s.reply(resp, req, ifindex, asker, from, ResForwarded, time.Time{})
				return
			}
		}
		fail()
	}()
}

// exchange forwards req to upstream up and returns its answer (2 s at most).
func (s *Server) exchange(req *dns.Msg, up string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := s.cfg.DialUpstream(ctx, up)
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", up, err)
	}
	defer conn.Close()
	co := &dns.Conn{Conn: conn, UDPSize: 4096}
	_ = co.SetDeadline(time.Now().Add(2 * time.Second))
	if err := co.WriteMsg(req); err != nil {
		return nil, fmt.Errorf("send to upstream %s: %w", up, err)
	}
	for {
		resp, err := co.ReadMsg()
		if err != nil {
			return nil, fmt.Errorf("answer from upstream %s: %w", up, err)
		}
		if resp.Id == req.Id && resp.Response {
			return resp, nil
		}
	}
}

// reply sends resp from the gateway's address out of the interface the query came in on,
// no larger than the asker can take (truncated with TC otherwise).
func (s *Server) reply(resp, req *dns.Msg, ifindex int, asker Asker, to *net.UDPAddr, result string, start time.Time) {
	size := dns.MinMsgSize
	if o := req.IsEdns0(); o != nil {
		size = min(max(int(o.UDPSize()), dns.MinMsgSize), 1232)
	}
	resp.Truncate(size)
	b, err := resp.Pack()
	if err != nil {
		s.log.Warn("pack answer", "err", err)
		return
	}
	cm := &ipv4.ControlMessage{IfIndex: ifindex, Src: asker.Gateway.AsSlice()}
	if _, err := s.pc.WriteTo(b, cm, to); err != nil {
		select {
		case <-s.closed:
		default:
			s.log.Warn("send answer", "to", to, "err", err)
		}
		return
	}
	s.queries.WithLabelValues(result).Inc()
	if !start.IsZero() {
		s.latency.Observe(time.Since(start).Seconds())
	}
}
