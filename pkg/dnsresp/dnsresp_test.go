package dnsresp

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// dir is a fixed directory: interface ifindex is an endpoint of tenant red whose gateway
// is 10.50.0.1.
type dir struct {
	ifindex int
	names   map[string]map[string][]netip.Addr
}

func (d *dir) Asker(ifindex int) (Asker, bool) {
	if ifindex != d.ifindex {
		return Asker{}, false
	}
	return Asker{Tenant: "red", Gateway: netip.MustParseAddr("10.50.0.1")}, true
}

func (d *dir) Lookup(tenant, name string) ([]netip.Addr, bool) {
	a, ok := d.names[tenant][name]
	return a, ok
}

func sh(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("nsenter", append([]string{"--net=" + ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("%v in %s: %v: %s", args, filepath.Base(ns), err, out)
	}
}

// world: host namespace H (responder on 10.77.0.1:53, an upstream on 10.77.0.2:53, both on
// its loopback) and an endpoint namespace E (10.50.0.2) joined by a veth (h0 in H).
type world struct {
	host, ep string
	srv      *Server
	d        *dir
}

func newWorld(t *testing.T, cfg Config, upstream bool) *world {
	t.Helper()
	testroot.Need(t)
	p := conformance.Prefix()
	w := &world{host: conformance.NewNetNS(t, p+"-h"), ep: conformance.NewNetNS(t, p+"-e")}
	if out, err := exec.Command("ip", "link", "add", p+"h", "netns", p+"-h", "type", "veth", "peer", "name", "eth0", "netns", p+"-e").CombinedOutput(); err != nil {
		t.Fatalf("veth: %v: %s", err, out)
	}
	sh(t, w.host, "ip", "link", "set", p+"h", "name", "h0", "up")
	sh(t, w.host, "ip", "addr", "add", "10.77.0.1/32", "dev", "lo")
	sh(t, w.host, "ip", "addr", "add", "10.77.0.2/32", "dev", "lo")
	sh(t, w.host, "ip", "route", "add", "10.50.0.2/32", "dev", "h0")
	sh(t, w.ep, "ip", "addr", "add", "10.50.0.2/24", "dev", "eth0")
	sh(t, w.ep, "ip", "link", "set", "eth0", "up")
	sh(t, w.ep, "ip", "route", "add", "10.77.0.1/32", "dev", "eth0")
	var h0 *net.Interface
	if err := nsexec.Run(w.host, func() error {
		var err error
		h0, err = net.InterfaceByName("h0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	members := []netip.Addr{}
	for i := range 100 {
		members = append(members, netip.AddrFrom4([4]byte{10, 50, 1, byte(i + 1)}))
	}
	w.d = &dir{ifindex: h0.Index, names: map[string]map[string][]netip.Addr{
		"red":  {"web": {netip.MustParseAddr("10.50.0.7")}, "db": {netip.MustParseAddr("10.50.0.8"), netip.MustParseAddr("10.50.0.9")}, "big": members},
		"blue": {"secret": {netip.MustParseAddr("10.60.0.5")}},
	}}
	if upstream {
		var pc net.PacketConn
		if err := nsexec.Run(w.host, func() error {
			var err error
			pc, err = net.ListenPacket("udp4", "10.77.0.2:53")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		up := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			if strings.EqualFold(r.Question[0].Name, "example.org.") {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)})
			} else {
				m.Rcode = dns.RcodeNameError
			}
			_ = rw.WriteMsg(m)
		})}
		go func() { _ = up.ActivateAndServe() }()
		t.Cleanup(func() { _ = up.Shutdown() })
		cfg.Upstreams = []string{"10.77.0.2:53"}
		cfg.DialUpstream = func(ctx context.Context, addr string) (conn net.Conn, err error) {
			err = nsexec.Run(w.host, func() error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, "udp4", addr)
				return err
			})
			return conn, err
		}
	}
	cfg.Listen = netip.MustParseAddrPort("10.77.0.1:53")
	if err := nsexec.Run(w.host, func() error {
		var err error
		w.srv, err = Listen(context.Background(), cfg, w.d)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = w.srv.Serve(context.Background()) }()
	t.Cleanup(w.srv.Close)
	return w
}

// socket opens a UDP socket in the endpoint.
func (w *world) socket(t *testing.T) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	if err := nsexec.Run(w.ep, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", "10.50.0.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return pc
}

// ask sends msg from the endpoint and returns the answer and the address it came from
// (nil answer: none within wait).
func (w *world) ask(t *testing.T, raw []byte, wait time.Duration) (*dns.Msg, netip.AddrPort) {
	t.Helper()
	pc := w.socket(t)
	defer pc.Close()
	if _, err := pc.WriteTo(raw, &net.UDPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 53}); err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65535)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		return nil, netip.AddrPort{}
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("answer does not decode: %v", err)
	}
	return m, from.(*net.UDPAddr).AddrPort()
}

func query(name string, qtype uint16) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	b, _ := m.Pack()
	return b
}

func answers(m *dns.Msg) string {
	var s []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			s = append(s, a.A.String())
		}
	}
	return strings.Join(s, ",")
}

func TestResponder(t *testing.T) {
	w := newWorld(t, Config{}, true)
	for _, tc := range []struct {
		name  string
		qtype uint16
		rcode int
		want  string
	}{
		{"web.", dns.TypeA, dns.RcodeSuccess, "10.50.0.7"},
		{"WEB.red.", dns.TypeA, dns.RcodeSuccess, "10.50.0.7"},
		{"db.", dns.TypeA, dns.RcodeSuccess, "10.50.0.8,10.50.0.9"},
		{"web.", dns.TypeAAAA, dns.RcodeSuccess, ""},
		{"nosuch.", dns.TypeA, dns.RcodeNameError, ""},
		{"nosuch.red.", dns.TypeA, dns.RcodeNameError, ""},
		// Another tenant's name is never answered from its state: bare it is red's (none),
		// qualified it goes upstream like any other name.
		{"secret.", dns.TypeA, dns.RcodeNameError, ""},
		{"secret.blue.", dns.TypeA, dns.RcodeNameError, ""},
		{"example.org.", dns.TypeA, dns.RcodeSuccess, "192.0.2.1"},
	} {
		t.Run(tc.name+dns.TypeToString[tc.qtype], func(t *testing.T) {
			m, from := w.ask(t, query(tc.name, tc.qtype), 3*time.Second)
			if m == nil {
				t.Fatal("no answer")
			}
			if from != netip.MustParseAddrPort("10.50.0.1:53") {
				t.Errorf("answer from %v, want the gateway 10.50.0.1:53", from)
			}
			if m.Rcode != tc.rcode || answers(m) != tc.want {
				t.Errorf("rcode %s answers %q, want %s %q", dns.RcodeToString[m.Rcode], answers(m), dns.RcodeToString[tc.rcode], tc.want)
			}
		})
	}
	t.Run("large-group-truncated", func(t *testing.T) {
		m, _ := w.ask(t, query("big.", dns.TypeA), 3*time.Second)
		if m != nil {
			m.Compress = true // as it came on the wire
		}
		if m == nil || !m.Truncated || m.Len() > 512 {
			t.Fatalf("answer without EDNS0: %d answers, %d bytes, truncated %v", len(m.Answer), m.Len(), m.Truncated)
		}
		q := new(dns.Msg)
		q.SetQuestion("big.", dns.TypeA)
		q.SetEdns0(4096, false)
		b, _ := q.Pack()
		m, _ = w.ask(t, b, 3*time.Second)
		if m != nil {
			m.Compress = true
		}
		if m == nil || m.Len() > 1232 || len(m.Answer) < 60 {
			t.Fatalf("with EDNS0 4096: %d answers, %d bytes", len(m.Answer), m.Len())
		}
	})
	t.Run("hostile", func(t *testing.T) {
		before := w.srv.Count(ResMalformed)
		for _, raw := range [][]byte{{1, 2, 3}, make([]byte, 3000), func() []byte {
			m := new(dns.Msg)
			m.SetQuestion("web.", dns.TypeA)
			m.Response = true // a reflected answer
			b, _ := m.Pack()
			return b
		}()} {
			if m, _ := w.ask(t, raw, 300*time.Millisecond); m != nil {
				t.Errorf("answered %d bytes of garbage: %v", len(raw), m)
			}
		}
		if got := w.srv.Count(ResMalformed) - before; got != 3 {
			t.Errorf("malformed counted %v, want 3", got)
		}
		two := new(dns.Msg)
		two.SetQuestion("web.", dns.TypeA)
		two.Question = append(two.Question, dns.Question{Name: "db.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		b, _ := two.Pack()
		if m, _ := w.ask(t, b, 3*time.Second); m == nil || m.Rcode != dns.RcodeFormatError {
			t.Errorf("two questions: %v", m)
		}
		notify := new(dns.Msg)
		notify.SetNotify("red.")
		b, _ = notify.Pack()
		if m, _ := w.ask(t, b, 3*time.Second); m == nil || m.Rcode != dns.RcodeNotImplemented {
			t.Errorf("notify: %v", m)
		}
	})
	t.Run("unknown-interface", func(t *testing.T) {
		w.d.ifindex = -1
		defer func(i int) { w.d.ifindex = i }(w.d.ifindex)
		if m, _ := w.ask(t, query("web.", dns.TypeA), 300*time.Millisecond); m != nil {
			t.Errorf("answered a query from no known endpoint")
		}
	})
}

func TestResponderRateLimit(t *testing.T) {
	w := newWorld(t, Config{Rate: 5, Burst: 5}, false)
	// The responder answers (a busy machine may take a while to schedule it), then its
	// endpoint's bucket refills to the burst.
	if m, _ := w.ask(t, query("web.", dns.TypeA), 5*time.Second); m == nil {
		t.Fatal("the responder does not answer")
	}
	time.Sleep(1200 * time.Millisecond)
	// 20 queries at once from one endpoint: the burst is answered, the rest is not.
	pc := w.socket(t)
	defer pc.Close()
	for range 20 {
		if _, err := pc.WriteTo(query("web.", dns.TypeA), &net.UDPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 53}); err != nil {
			t.Fatal(err)
		}
	}
	answered := 0
	buf := make([]byte, 4096)
	for wait := 3 * time.Second; ; wait = 500 * time.Millisecond {
		_ = pc.SetReadDeadline(time.Now().Add(wait))
		if _, _, err := pc.ReadFrom(buf); err != nil {
			break
		}
		answered++
	}
	limited := func() bool { return w.srv.Count(ResRateLimit) >= 13 }
	for deadline := time.Now().Add(3 * time.Second); !limited() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if answered < 5 || answered > 7 || !limited() {
		t.Errorf("%d of 20 answered, %v rate-limited; want the burst of 5 answered", answered, w.srv.Count(ResRateLimit))
	}
	// No upstream: other names fail fast.
	time.Sleep(time.Second)
	if m, _ := w.ask(t, query("example.org.", dns.TypeA), 3*time.Second); m == nil || m.Rcode != dns.RcodeServerFailure {
		t.Errorf("without upstream: %v", m)
	}
}
