package sim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTwoHostDatapath runs one two-host cluster (the underlay wire doubling as the VLAN
// uplink) through datapath properties, each on its own network and containers: VXLAN MTU
// and no fragments on the wire, VLAN networks (802.1Q tag on the wire, no ARP, MTU 1500),
// and a SIGKILL restart under load on each.
func TestTwoHostDatapath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 2, VLANUplink: true})
	h1 := c.Hosts[0]

	t.Run("vxlan", func(t *testing.T) {
		if err := c.CreateNetwork(ctx, "default", "vx-net", "vxlan", "10.105.1.0/24", "10.105.1.1"); err != nil {
			t.Fatal(err)
		}
		a, a2, b := threeContainers(ctx, t, c, "vx-net", "x")
		t.Run("mtu", func(t *testing.T) {
			if out, err := a.Exec(ctx, "ip", "-o", "link", "show", "eth0"); err != nil || !strings.Contains(out, "mtu 1450 ") {
				t.Errorf("container eth0 should have MTU 1450 on vxlan: %s %v", out, err)
			}
			// 1422 + 8 ICMP + 20 IP = 1450: passes with DF, cross-host.
			out, err := a.Exec(ctx, "ping", "-M", "do", "-s", "1422", "-c", "3", "-i", "0.2", "-W", "2", b.IP.Addr().String())
			if err != nil || !strings.Contains(out, " 0% packet loss") {
				t.Errorf("1450-byte DF ping: %v\n%s", err, out)
			}
			// One byte more is refused by the sender's stack, not lost on the way.
			out, err = a.Exec(ctx, "ping", "-M", "do", "-s", "1423", "-c", "1", "-W", "2", b.IP.Addr().String())
			if err == nil || !strings.Contains(out, "message too long") {
				t.Errorf("1451-byte DF ping should fail locally with 'message too long': %v\n%s", err, out)
			}
			t.Logf("1451-byte DF ping: %s", firstLine(out, "message too long"))
			// Bulk TCP both ways: the wire carries no IP fragment (outer or inner). The
			// wire segments like a NIC would (no GSO super-frames on it), so frame sizes
			// are what a physical link would carry.
			for _, h := range c.Hosts {
				if _, err := Exec(ctx, h.Name, "ethtool", "-K", "uplink", "tso", "off", "gso", "off"); err != nil {
					t.Fatal(err)
				}
			}
			capture := startCapture(ctx, t, h1.Name, "uplink")
			for _, dir := range [][2]*Container{{a, b}, {b, a}} {
				if err := bulkTCP(ctx, dir[0], dir[1], 5200, 16<<20); err != nil {
					t.Fatal(err)
				}
			}
			frags := capture.count(ctx, t, "ip[6:2] & 0x3fff != 0")
			vx := capture.count(ctx, t, "udp port 4789")
			big := capture.count(ctx, t, "udp port 4789 and greater 1514")
			over := capture.count(ctx, t, "greater 1515")
			t.Logf("wire during 2x16 MiB TCP: %d VXLAN frames (%d of them 1514 bytes), %d IP fragments, %d frames over 1514 bytes", vx, big, frags, over)
			if frags != 0 {
				t.Errorf("%d IP fragments on the underlay", frags)
			}
			if over != 0 {
				t.Errorf("%d frames longer than 1514 bytes on a 1500-MTU wire", over)
			}
			if vx < 2000 || big == 0 {
				t.Errorf("capture saw only %d VXLAN frames (%d large): the capture did not see the transfer", vx, big)
			}
		})
		t.Run("restart-under-load", func(t *testing.T) {
			restartUnderLoad(ctx, t, c, "vx-net", "x", a, a2, b, 7100)
		})
	})
	t.Run("vlan", func(t *testing.T) {
		if err := c.CreateTaggedNetwork(ctx, "default", "vl-net", "vlan", 100, "10.106.1.0/24", "10.106.1.1"); err != nil {
			t.Fatal(err)
		}
		capture := startCapture(ctx, t, h1.Name, "uplink")
		a, a2, b := threeContainers(ctx, t, c, "vl-net", "v")
		if out, err := a.Exec(ctx, "ip", "-o", "link", "show", "eth0"); err != nil || !strings.Contains(out, "mtu 1500 ") {
			t.Errorf("container eth0 should have MTU 1500 on vlan: %s %v", out, err)
		}
		for _, p := range [][2]*Container{{a, b}, {b, a}, {a2, b}} {
			// 1472 + 28 = 1500 with DF: VLAN networks keep the full MTU.
			out, err := p[0].Exec(ctx, "ping", "-M", "do", "-s", "1472", "-c", "3", "-i", "0.2", "-W", "2", p[1].IP.Addr().String())
			if err != nil || !strings.Contains(out, " 0% packet loss") {
				t.Errorf("1500-byte DF ping %s -> %s on vlan: %v\n%s", p[0].Name, p[1].IP.Addr(), err, out)
			}
		}
		if err := a.TCPCheck(ctx, b, 5300); err != nil {
			t.Error(err)
		}
		tagged := capture.lines(ctx, t, []string{"-e"}, "vlan 100 and icmp")
		untagged := capture.count(ctx, t, fmt.Sprintf("icmp and host %s", b.IP.Addr()))
		arp := capture.count(ctx, t, "arp or (vlan and arp)")
		// (pcap's "vlan" keyword shifts later offsets, so the tag is read directly.)
		other := capture.count(ctx, t, "ether[12:2] = 0x8100 and (ether[14:2] & 0x0fff) != 100")
		tcp := capture.count(ctx, t, fmt.Sprintf("vlan 100 and tcp port 5300 and host %s", b.IP.Addr()))
		t.Logf("wire: %d ICMP and %d TCP frames tagged 802.1Q 100, %d untagged ICMP frames of the containers, %d ARP frames, %d frames with another tag", len(tagged), tcp, untagged, arp, other)
		if tcp == 0 {
			t.Error("no tagged TCP frame of the TCP check on the wire")
		}
		if len(tagged) < 18 {
			t.Errorf("want at least 18 ICMP frames with 802.1Q tag 100 on the wire (3 pings x 3 pairs x 2), got %d", len(tagged))
		}
		for _, l := range tagged {
			if !strings.Contains(l, "vlan 100") || !strings.Contains(l, "ethertype 802.1Q") {
				t.Errorf("frame not tagged 100: %s", l)
				break
			}
		}
		if len(tagged) > 0 {
			t.Logf("e.g. %s", tagged[0])
		}
		if untagged != 0 || arp != 0 || other != 0 {
			t.Errorf("wire carried %d untagged container ICMP frames, %d ARP frames, %d other-tag frames; want 0", untagged, arp, other)
		}
		// The uplink's own program (802.1Q pop) is replaced on restart too.
		t.Run("restart-under-load", func(t *testing.T) {
			restartUnderLoad(ctx, t, c, "vl-net", "v", a, a2, b, 7200)
		})
	})
}

// threeContainers attaches <host1>-<p>a, <host1>-<p>a2 and <host2>-<p>b to network and
// waits for cross-host reachability.
func threeContainers(ctx context.Context, t *testing.T, c *Cluster, network, p string) (a, a2, b *Container) {
	t.Helper()
	var err error
	if a, err = c.AddContainer(ctx, c.Hosts[0], p+"a", "default", network); err != nil {
		t.Fatal(err)
	}
	if a2, err = c.AddContainer(ctx, c.Hosts[0], p+"a2", "default", network); err != nil {
		t.Fatal(err)
	}
	if b, err = c.AddContainer(ctx, c.Hosts[1], p+"b", "default", network); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cross-host ping on "+network, 10*time.Second, func() error {
		out, err := a.Ping(ctx, b.IP.Addr(), 1)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	return a, a2, b
}

func firstLine(out, sub string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// capture is a tcpdump writing headers of every frame on one interface to a file.
type capture struct {
	cmd  *exec.Cmd
	file string
}

// startCapture runs tcpdump on ifname inside host namespace ns (via nsenter) and returns
// once it is capturing (the first 128 bytes of each frame).
func startCapture(ctx context.Context, t *testing.T, ns, ifname string) *capture {
	t.Helper()
	return startCaptureSnap(ctx, t, ns, ifname, 128)
}

// startCaptureSnap is startCapture keeping snap bytes of each frame (0: all of it).
func startCaptureSnap(ctx context.Context, t *testing.T, ns, ifname string, snap int) *capture {
	t.Helper()
	file := filepath.Join(t.TempDir(), ifname+".pcap")
	cmd := exec.Command("nsenter", "--net="+NetNSPath(ns), "--", "tcpdump", "--immediate-mode", "-Z", "root", "-i", ifname, "-nn", "-s", fmt.Sprint(snap), "-U", "-w", file)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tcpdump: %v", err)
	}
	cp := &capture{cmd: cmd, file: file}
	t.Cleanup(func() { cp.stop() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if strings.Contains(sc.Text(), "listening on") {
				ready <- ""
			}
		}
		ready <- strings.Join(lines, "\n")
	}()
	select {
	case msg := <-ready:
		if msg != "" {
			t.Fatalf("tcpdump on %s in %s exited: %s", ifname, ns, msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("tcpdump on %s in %s not capturing after 10s", ifname, ns)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	return cp
}

func (cp *capture) stop() {
	if cp.cmd.ProcessState != nil {
		return
	}
	// tcpdump drops what is still in its ring buffer when interrupted: give it time to
	// write the last frames first.
	time.Sleep(500 * time.Millisecond)
	_ = cp.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = cp.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cp.cmd.Process.Kill()
		<-done
	}
}

// count stops the capture (first call) and counts the frames matching a pcap filter.
func (cp *capture) count(ctx context.Context, t *testing.T, filter string) int {
	t.Helper()
	cp.stop()
	out, err := run(ctx, "tcpdump", "-r", cp.file, "-nn", filter)
	if err != nil {
		t.Fatalf("tcpdump -r %s %q: %v", cp.file, filter, err)
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if l != "" && !strings.HasPrefix(l, "reading from file") {
			n++
		}
	}
	return n
}

// lines reads the capture with extra tcpdump flags and returns the matching lines.
func (cp *capture) lines(ctx context.Context, t *testing.T, flags []string, filter string) []string {
	t.Helper()
	cp.stop()
	out, err := run(ctx, "tcpdump", append(append([]string{"-r", cp.file, "-nn"}, flags...), filter)...)
	if err != nil {
		t.Fatalf("tcpdump -r %s %q: %v", cp.file, filter, err)
	}
	var res []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" && !strings.HasPrefix(l, "reading from file") {
			res = append(res, l)
		}
	}
	return res
}

// bulkTCP sends n bytes from one container to a listener in the other and checks they all
// arrived.
func bulkTCP(ctx context.Context, from, to *Container, port, n int) error {
	addr := net.JoinHostPort(to.IP.Addr().String(), fmt.Sprint(port))
	l, err := Listen(to.Name, "tcp", addr)
	if err != nil {
		return err
	}
	defer l.Close()
	got := make(chan int64, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		k, _ := io.Copy(io.Discard, conn)
		got <- k
	}()
	conn, err := DialContext(ctx, from.Name, "tcp", addr)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	buf := bytes.Repeat([]byte{0xa5}, 64<<10)
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := conn.Write(buf); err != nil {
			conn.Close()
			return fmt.Errorf("bulk %s -> %s: write: %w", from.Name, addr, err)
		}
	}
	conn.Close()
	if k := <-got; k != int64(n) {
		return fmt.Errorf("bulk %s -> %s: received %d of %d bytes", from.Name, addr, k, n)
	}
	return nil
}
