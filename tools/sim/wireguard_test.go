package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// netplugin's default --wireguard-port and --vxlan-port, which the sim leaves as they are.
const (
	wgPort    = 51820
	vxlanPort = 4789
)

// TestWireGuardEncryption: three hosts with `netplugin --encryption wireguard` (eBPF
// dataplane, a VXLAN network). Container ping and TCP cross every pair of hosts and a
// policy's denied port stays denied across hosts, while a capture on the underlay bridge
// sees between the hosts only WireGuard's UDP port and the control plane's TCP: no VXLAN,
// no container address in any outer header or UDP packet, no clear payload. Then the
// third host is restarted without encryption and its key record removed: the other two
// report it waiting on /healthz by name and send it nothing (no clear VXLAN, no
// WireGuard), while between themselves traffic stays encrypted. Restarted with
// encryption again, it comes back keyed and encrypted, and so does a host whose agent
// merely restarts.
func TestWireGuardEncryption(t *testing.T) {
	testroot.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	plain := map[string]bool{} // hosts whose next netplugin runs without --encryption
	c := startCluster(t, ctx, Config{Hosts: 3, PluginArgs: func(c *Cluster, h *Host) []string {
		if plain[h.Name] {
			return nil
		}
		return []string{"--encryption", "wireguard", "--wireguard-dir", filepath.Join(c.WorkDir, h.Name, "wireguard")}
	}})
	h1, h2, h3 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	if err := c.CreateNetwork(ctx, "default", "wg-net", "vxlan", "10.107.0.0/24", "10.107.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := c.CreatePolicy(ctx, "default", "wgp"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []model.Rule{
		{TenantName: "default", PolicyName: "wgp", RuleID: "1", Direction: "in", Action: "deny", Protocol: "tcp", Port: 5998, Priority: 1},
		{TenantName: "default", PolicyName: "wgp", RuleID: "2", Direction: "in", Action: "allow", Protocol: "tcp", Port: 5997, Priority: 2},
	} {
		if err := c.AddRule(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CreateEndpointGroup(ctx, "default", "wg-net", "wg-srv", "wgp"); err != nil {
		t.Fatal(err)
	}
	var cts []*Container // one per host, in host order
	for _, h := range c.Hosts {
		ct, err := c.AddContainer(ctx, h, "c", "default", "wg-net")
		if err != nil {
			t.Fatal(err)
		}
		cts = append(cts, ct)
	}
	srv, err := c.AddContainerInGroup(ctx, h2, "srv", "default", "wg-net", "wg-srv")
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{5997, 5998} {
		if err := c.ServeName(srv, port); err != nil {
			t.Fatal(err)
		}
	}
	ul := underlayCheck{hosts: map[netip.Addr]*Host{}}
	for _, h := range c.Hosts {
		ul.hosts[h.IP] = h
	}
	// crossAll pings and echoes TCP around the ring of hosts' containers.
	crossAll := func(t *testing.T, port int, within time.Duration) {
		t.Helper()
		for i, from := range cts {
			to := cts[(i+1)%len(cts)]
			eventually(t, fmt.Sprintf("ping %s -> %s", from.Name, to.Name), within, func() error {
				out, err := from.Ping(ctx, to.IP.Addr(), 2)
				if err != nil || !strings.Contains(out, " 0% packet loss") {
					return fmt.Errorf("%v: %s", err, out)
				}
				return nil
			})
			if err := from.TCPCheck(ctx, to, port+i); err != nil {
				t.Fatal(err)
			}
		}
	}
	// healthz waits until every host's /healthz first line is what want says.
	healthz := func(t *testing.T, want map[*Host]func(string) bool) {
		t.Helper()
		for h, ok := range want {
			eventually(t, "/healthz of "+h.Name, 20*time.Second, func() error {
				body, err := h.HealthBody(ctx)
				if err != nil || !ok(body) {
					return fmt.Errorf("%v: %q", err, body)
				}
				return nil
			})
		}
	}
	healthy := func(body string) bool { return body == "ok\n" }

	t.Run("encrypted", func(t *testing.T) {
		cp := startCaptureSnap(ctx, t, c.Prefix+"-ul", "br0", 0)
		crossAll(t, 5011, 15*time.Second)
		reach := func(port int) error {
			_, err := AskName(ctx, cts[0], net.JoinHostPort(srv.IP.Addr().String(), fmt.Sprint(port)))
			return err
		}
		check := func() error {
			if err := reach(5997); err != nil {
				return fmt.Errorf("allowed port 5997 from %s: %v", h1.Name, err)
			}
			if reach(5998) == nil {
				return fmt.Errorf("denied port 5998 answers %s across hosts", h1.Name)
			}
			return nil
		}
		eventually(t, "policy across encrypted hosts", 30*time.Second, check)
		if err := check(); err != nil {
			t.Fatalf("policy not stable: %v", err)
		}
		healthz(t, map[*Host]func(string) bool{h1: healthy, h2: healthy, h3: healthy})
		wg := ul.check(t, readPcap(t, cp), c.Hosts, c.Hosts)
		for _, h := range c.Hosts {
			if wg[h.IP] == 0 {
				t.Errorf("no WireGuard packet from %s on the underlay: the traffic did not cross encrypted", h.Name)
			}
		}
	})

	t.Run("key-withheld", func(t *testing.T) {
		// h3 leaves, an admin removes its record (docs/encryption.md: a departed host's
		// record stays until then) and it comes back without encryption.
		if err := c.StopPlugin(h3); err != nil {
			t.Fatal(err)
		}
		if out, err := Exec(ctx, h1.Name, "etcdctl", "--endpoints", c.EtcdURL(), "del", "/contiv.io/oper/wireguard/"+strings.ToLower(h3.Name)); err != nil || strings.TrimSpace(out) != "1" {
			t.Fatalf("delete %s's WireGuard record: %v %s", h3.Name, err, out)
		}
		plain[h3.Name] = true
		if err := c.StartPlugin(ctx, h3); err != nil {
			t.Fatal(err)
		}
		if err := h3.WaitReady(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		waiting := func(body string) bool {
			return strings.HasPrefix(body, "degraded: wireguard: 1 peer host") && strings.Contains(body, h3.Name)
		}
		healthz(t, map[*Host]func(string) bool{h1: waiting, h2: waiting, h3: healthy})
		for _, h := range []*Host{h1, h2} {
			m, err := h.Metrics(ctx)
			if err != nil || !strings.Contains(m, `contiv_wireguard_peers{state="waiting"} 1`) || !strings.Contains(m, `contiv_wireguard_peers{state="keyed"} 1`) {
				t.Errorf("%s metrics: %v; want one peer keyed, one waiting:\n%s", h.Name, err, grepLines(m, "contiv_wireguard"))
			}
		}
		cp := startCaptureSnap(ctx, t, c.Prefix+"-ul", "br0", 0)
		// h1 and h2 still reach each other, encrypted.
		if out, err := cts[0].Ping(ctx, cts[1].IP.Addr(), 3); err != nil || !strings.Contains(out, " 0% packet loss") {
			t.Errorf("ping %s -> %s with %s waiting: %v\n%s", cts[0].Name, cts[1].Name, h3.Name, err, out)
		}
		if err := cts[1].TCPCheck(ctx, cts[0], 5021); err != nil {
			t.Error(err)
		}
		// Nothing from h1 or h2 reaches h3's container, in either direction: h3's clear
		// VXLAN arrives and is dropped where it enters (drop_clear_overlay), and nothing
		// goes back.
		for _, p := range [][2]*Container{{cts[0], cts[2]}, {cts[1], cts[2]}, {cts[2], cts[0]}} {
			if out, err := p[0].Exec(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "1", p[1].IP.Addr().String()); err == nil || !strings.Contains(out, " 100% packet loss") {
				t.Errorf("ping %s -> %s with %s's key withheld answered: %v\n%s", p[0].Name, p[1].Name, h3.Name, err, out)
			}
		}
		if m, err := h1.Metrics(ctx); err != nil || clearDrops(m) == 0 {
			t.Errorf("%s: no drop_clear_overlay after %s's clear VXLAN: %v\n%s", h1.Name, h3.Name, err, grepLines(m, "drop_clear_overlay"))
		}
		if _, err := AskName(ctx, cts[0], net.JoinHostPort(cts[2].IP.Addr().String(), "5031")); err == nil || !os.IsTimeout(err) && !strings.Contains(err.Error(), "timeout") {
			t.Errorf("TCP %s -> %s with %s's key withheld: %v, want a timeout", cts[0].Name, cts[2].Name, h3.Name, err)
		}
		// The frames h1 and h2 send: WireGuard between themselves only. h3's own clear
		// VXLAN is there: the capture sees what the check refuses.
		frames := readPcap(t, cp)
		wg := ul.check(t, frames, []*Host{h1, h2}, []*Host{h1, h2})
		clear := 0
		for _, f := range frames {
			if f.src == h3.IP && f.proto == protoUDP && f.dport == vxlanPort {
				clear++
			}
		}
		if clear == 0 {
			t.Errorf("no clear VXLAN from %s (without encryption) on the underlay: the capture misses what it checks", h3.Name)
		}
		if wg[h1.IP] == 0 || wg[h2.IP] == 0 {
			t.Errorf("WireGuard packets from h1, h2: %d, %d; want both > 0", wg[h1.IP], wg[h2.IP])
		}
	})

	t.Run("rejoin", func(t *testing.T) {
		if err := c.StopPlugin(h3); err != nil {
			t.Fatal(err)
		}
		plain[h3.Name] = false
		if err := c.StartPlugin(ctx, h3); err != nil {
			t.Fatal(err)
		}
		if err := h3.WaitReady(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		healthz(t, map[*Host]func(string) bool{h1: healthy, h2: healthy, h3: healthy})
		cp := startCaptureSnap(ctx, t, c.Prefix+"-ul", "br0", 0)
		crossAll(t, 5041, 15*time.Second)
		// A plain agent restart (h2: same key, a new device without the old sessions).
		if err := c.StopPlugin(h2); err != nil {
			t.Fatal(err)
		}
		if err := c.StartPlugin(ctx, h2); err != nil {
			t.Fatal(err)
		}
		if err := h2.WaitReady(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		// Its new device handshakes with the peers at once (wgsteer.Keepalive): without,
		// their traffic to it, sent in sessions it no longer knows, is dropped until they
		// handshake again after 15 s.
		start := time.Now()
		crossAll(t, 5051, 8*time.Second)
		t.Logf("traffic around the ring again %v after %s's agent restarted", time.Since(start).Round(10*time.Millisecond), h2.Name)
		healthz(t, map[*Host]func(string) bool{h1: healthy, h2: healthy, h3: healthy})
		wg := ul.check(t, readPcap(t, cp), c.Hosts, c.Hosts)
		for _, h := range c.Hosts {
			if wg[h.IP] == 0 {
				t.Errorf("no WireGuard packet from %s after the rejoin", h.Name)
			}
		}
	})
}

// underlayCheck judges what crossed the underlay between encrypting hosts.
type underlayCheck struct {
	hosts map[netip.Addr]*Host // by underlay address
}

// controlPorts are the TCP ports of the control plane, which crosses the underlay by
// itself (TLS with Config.Secure, plain here).
var controlPorts = map[uint16]bool{EtcdPort: true, MasterPort: true, InspectPort: true}

// check fails t for every IPv4 frame not between two hosts' underlay addresses (a
// container's address in an outer header), and for every frame sent by one of from that
// carries TCPCheck's payload in clear or is neither a well-formed WireGuard message
// between WireGuard ports to one of to nor control-plane TCP: clear VXLAN, whose UDP
// carries the containers' frames with their addresses, is one of those. It returns the
// number of WireGuard packets by sender. Frames from other hosts are checked for their
// addresses only.
func (u underlayCheck) check(t *testing.T, frames []ipFrame, from, to []*Host) map[netip.Addr]int {
	t.Helper()
	senders, receivers := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, h := range from {
		senders[h.IP] = true
	}
	for _, h := range to {
		receivers[h.IP] = true
	}
	wg := map[netip.Addr]int{}
	var bad []string
	for _, f := range frames {
		if u.hosts[f.src] == nil || u.hosts[f.dst] == nil && !f.dst.IsMulticast() && f.dst != netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			bad = append(bad, "not between hosts: "+f.String())
			continue
		}
		if !senders[f.src] {
			continue
		}
		switch {
		case bytes.Contains(f.payload, []byte("contivbpf-")):
			bad = append(bad, "clear TCP payload: "+f.String())
		case f.proto == protoUDP && f.sport == wgPort && f.dport == wgPort && receivers[f.dst] && wireGuardMessage(f.payload[8:]):
			wg[f.src]++
		case f.proto == protoTCP && (controlPorts[f.sport] || controlPorts[f.dport]):
			continue
		default:
			bad = append(bad, "neither WireGuard to an encrypting host nor control plane: "+f.String())
		}
	}
	if len(bad) > 0 {
		if len(bad) > 10 {
			bad = append(bad[:10], fmt.Sprintf("... and %d more", len(bad)-10))
		}
		t.Errorf("underlay (%d IPv4 frames):\n%s", len(frames), strings.Join(bad, "\n"))
	}
	t.Logf("underlay: %d IPv4 frames, WireGuard by sender %v", len(frames), wg)
	return wg
}

// wireGuardMessage says whether a UDP payload has the type and size of a WireGuard
// message: a handshake initiation (148 bytes), response (92), cookie reply (64), or
// transport data (16 bytes of header, then the ciphertext and a 16-byte tag; the
// plaintext is padded to 16 bytes only up to the device's MTU, so its length says no
// more).
func wireGuardMessage(b []byte) bool {
	if len(b) < 4 || b[1] != 0 || b[2] != 0 || b[3] != 0 {
		return false
	}
	switch b[0] {
	case 1:
		return len(b) == 148
	case 2:
		return len(b) == 92
	case 3:
		return len(b) == 64
	case 4:
		return len(b) >= 32
	}
	return false
}

const (
	protoTCP = 6
	protoUDP = 17
)

// ipFrame is one captured Ethernet frame carrying IPv4.
type ipFrame struct {
	src, dst     netip.Addr
	proto        byte
	sport, dport uint16
	payload      []byte // everything after the IPv4 header
}

func (f ipFrame) String() string {
	return fmt.Sprintf("proto %d %s:%d -> %s:%d, %d bytes", f.proto, f.src, f.sport, f.dst, f.dport, len(f.payload))
}

// readPcap stops the capture and returns its IPv4 frames (classic pcap, Ethernet, as
// tcpdump -w writes it; other frames, ARP and IPv6, are left out).
func readPcap(t *testing.T, cp *capture) []ipFrame {
	t.Helper()
	cp.stop()
	b, err := os.ReadFile(cp.file)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 24 {
		t.Fatalf("%s: %d bytes, not a pcap file", cp.file, len(b))
	}
	var le binary.ByteOrder = binary.LittleEndian
	switch le.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
	case 0xd4c3b2a1, 0x4d3cb2a1:
		le = binary.BigEndian
	default:
		t.Fatalf("%s: magic %#x, not a pcap file", cp.file, le.Uint32(b))
	}
	if lt := le.Uint32(b[20:]); lt != 1 {
		t.Fatalf("%s: link type %d, want Ethernet", cp.file, lt)
	}
	var out []ipFrame
	for off := 24; off+16 <= len(b); {
		n := int(le.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) {
			break // cut short by the stop
		}
		fr := b[off : off+n]
		off += n
		if len(fr) < 34 || binary.BigEndian.Uint16(fr[12:]) != 0x0800 {
			continue
		}
		ip := fr[14:]
		hl := int(ip[0]&0xf) * 4
		if hl < 20 || len(ip) < hl {
			continue
		}
		f := ipFrame{src: netip.AddrFrom4([4]byte(ip[12:16])), dst: netip.AddrFrom4([4]byte(ip[16:20])), proto: ip[9], payload: ip[hl:]}
		if f.proto == protoUDP && len(f.payload) < 8 || f.proto == protoTCP && len(f.payload) < 20 {
			t.Fatalf("%s: frame cut short: %s", cp.file, f)
		}
		if f.proto == protoTCP || f.proto == protoUDP {
			f.sport, f.dport = binary.BigEndian.Uint16(f.payload), binary.BigEndian.Uint16(f.payload[2:])
		}
		out = append(out, f)
	}
	return out
}

// clearDrops is the drop_clear_overlay packet count in an agent's metrics text (0 when
// absent).
func clearDrops(metrics string) float64 {
	const series = `contiv_datapath_packets_total{drop="true",reason="drop_clear_overlay"} `
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return 0
}
