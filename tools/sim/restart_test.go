package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
)

// rrLoad keeps request/response round trips going on long-lived TCP connections and
// counts what happened to them.
type rrLoad struct {
	name  string
	conns []net.Conn
	ok    []atomic.Int64 // per connection
	fails atomic.Int64
	reset atomic.Int64
	mu    sync.Mutex
	errs  []error
	wg    sync.WaitGroup
}

// startRR opens n connections from container from to srv and runs 64-byte round trips in
// a loop on each (every one must answer within 3 s) until ctx ends.
func startRR(ctx context.Context, t *testing.T, name string, from *Container, srvAddr string, n int) *rrLoad {
	t.Helper()
	l := &rrLoad{name: name, ok: make([]atomic.Int64, n)}
	d := netbench.NewDialer(NetNSPath(from.Name))
	for i := 0; i < n; i++ {
		c, err := d.Dial(srvAddr)
		if err != nil {
			t.Fatalf("%s: dial %s: %v", name, srvAddr, err)
		}
		l.conns = append(l.conns, c)
	}
	for i, c := range l.conns {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				_ = c.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := netbench.RR(c, 1, 64); err != nil {
					l.fails.Add(1)
					if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
						l.reset.Add(1)
					}
					l.mu.Lock()
					l.errs = append(l.errs, fmt.Errorf("conn %d: %w", i, err))
					l.mu.Unlock()
					return
				}
				l.ok[i].Add(1)
			}
		}()
	}
	return l
}

// counts returns the successful round trips per connection so far.
func (l *rrLoad) counts() []int64 {
	out := make([]int64, len(l.ok))
	for i := range l.ok {
		out[i] = l.ok[i].Load()
	}
	return out
}

func (l *rrLoad) stop() {
	l.wg.Wait()
	for _, c := range l.conns {
		c.Close()
	}
}

// pinger runs `ping -i 0.01` in a container until stopped and reports the loss.
type pinger struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startPing(t *testing.T, from *Container, to *Container) *pinger {
	t.Helper()
	p := &pinger{}
	// nsenter without --fork execs ping itself, so a signal reaches ping.
	p.cmd = exec.Command("nsenter", "--net="+NetNSPath(from.Name), "--", "ping", "-n", "-i", "0.01", "-W", "2", to.IP.Addr().String())
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start ping: %v", err)
	}
	t.Cleanup(func() { // a test that stopped early must not leave ping running
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

var (
	pingTxRe  = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
	pingSeqRe = regexp.MustCompile(`icmp_seq=(\d+) `)
)

// stop interrupts ping and returns sent, the sequence numbers with no reply (the last
// one sent may legitimately still be in flight when ping is interrupted and is not
// counted) and the summary line.
func (p *pinger) stop() (sent int, lost []int, summary string, err error) {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	_ = p.cmd.Wait()
	out := p.out.String()
	m := pingTxRe.FindStringSubmatch(out)
	if m == nil {
		return 0, nil, "", fmt.Errorf("no ping summary in output:\n%s", out)
	}
	sent, _ = strconv.Atoi(m[1])
	got := map[int]bool{}
	for _, s := range pingSeqRe.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(s[1])
		got[n] = true
	}
	for seq := 1; seq < sent; seq++ {
		if !got[seq] {
			lost = append(lost, seq)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "packets transmitted") {
			summary = line
		}
	}
	return sent, lost, summary, nil
}

// tcpRetrans reads TcpRetransSegs of a container's namespace (nstat -az, absolute).
func tcpRetrans(ctx context.Context, ct *Container) int64 {
	out, err := ct.Exec(ctx, "cat", "/proc/net/snmp")
	if err != nil {
		return -1
	}
	var hdr []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "Tcp: ") {
			continue
		}
		f := strings.Fields(line)
		if hdr == nil {
			hdr = f
			continue
		}
		for i, h := range hdr {
			if h == "RetransSegs" && i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				return v
			}
		}
	}
	return -1
}

func sub(a, b []int64) []int64 {
	out := make([]int64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

// restartUnderLoad SIGKILLs host 1's netplugin while long-lived TCP connections do
// request/response in a loop and a 100/s ping runs, cross-host and same-host on the
// network, keeps the host without an agent for a while, starts the agent again and waits
// for its resync. Not one round trip may fail, no connection may be reset and no ping may
// be lost; every connection must keep going while no agent runs.
//
// Around the restart it also checks that the agent replaces programs on the pinned links
// (same tcx link ids) and sweeps only stale entries: a remote container deleted while no
// agent ran disappears from h1's maps, one added meanwhile appears, and live entries are
// rewritten in the new generation.
func restartUnderLoad(ctx context.Context, t *testing.T, c *Cluster, network, p string, a, a2, b *Container, port int) {
	h1, h2 := c.Hosts[0], c.Hosts[1]
	gone, err := c.AddContainer(ctx, h2, p+"gone", "default", network)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "h1 programs "+gone.Name, 10*time.Second, func() error {
		_, err := driverEntry(ctx, h1, gone.IP.Addr())
		return err
	})
	linksBefore := driverLinks(ctx, t, h1)
	genBefore, err := driverEntry(ctx, h1, a.IP.Addr())
	if err != nil {
		t.Fatal(err)
	}
	srvB, err := netbench.StartServer(NetNSPath(b.Name), net.JoinHostPort(b.IP.Addr().String(), strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer srvB.Close()
	srvA, err := netbench.StartServer(NetNSPath(a.Name), net.JoinHostPort(a.IP.Addr().String(), strconv.Itoa(port+1)))
	if err != nil {
		t.Fatal(err)
	}
	defer srvA.Close()

	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	cross := startRR(lctx, t, network+" cross-host a->b", a, net.JoinHostPort(b.IP.Addr().String(), strconv.Itoa(port)), 3)
	local := startRR(lctx, t, network+" same-host a2->a", a2, net.JoinHostPort(a.IP.Addr().String(), strconv.Itoa(port+1)), 2)
	retrans0 := tcpRetrans(ctx, a) + tcpRetrans(ctx, a2)
	pingX := startPing(t, a, b)
	pingL := startPing(t, a2, a)

	time.Sleep(time.Second)
	killAt := time.Now()
	c.KillPlugin(h1)
	killed := time.Since(killAt)
	crossDown, localDown := cross.counts(), local.counts()
	const agentless = 3 * time.Second
	// Meanwhile the cluster changes: one remote container comes, another goes (in this
	// order, so netmaster does not hand the freed address to the new one).
	added, err := c.AddContainer(ctx, h2, p+"new", "default", network)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveContainer(ctx, gone); err != nil {
		t.Fatal(err)
	}
	time.Sleep(agentless - time.Since(killAt))
	crossUp, localUp := cross.counts(), local.counts()
	startAt := time.Now()
	if err := c.StartPlugin(ctx, h1); err != nil {
		t.Fatal(err)
	}
	// Generous: loading the programs is CPU-bound verification, and the rest of `make test`
	// loads programs on the same 2 cores meanwhile (32 s once); traffic must flow
	// throughout either way.
	if err := h1.WaitReady(ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	resync := time.Since(startAt)
	time.Sleep(time.Second) // traffic after the sweep
	lcancel()
	cross.stop()
	local.stop()
	retrans := tcpRetrans(ctx, a) + tcpRetrans(ctx, a2) - retrans0
	sentX, lostX, sumX, errX := pingX.stop()
	sentL, lostL, sumL, errL := pingL.stop()

	t.Logf("SIGKILL took %s; no agent for %s; restart to healthy (resync) %s", killed.Round(time.Millisecond), agentless, resync.Round(time.Millisecond))
	t.Logf("cross-host RR per conn: total %v, while no agent %v; fails %d resets %d", cross.counts(), sub(crossUp, crossDown), cross.fails.Load(), cross.reset.Load())
	t.Logf("same-host RR per conn: total %v, while no agent %v; fails %d resets %d", local.counts(), sub(localUp, localDown), local.fails.Load(), local.reset.Load())
	t.Logf("ping cross-host: %s (lost seqs %v); same-host: %s (lost seqs %v)", sumX, lostX, sumL, lostL)
	t.Logf("TCP retransmitted segments in the client namespaces: %d", retrans)

	for _, l := range []*rrLoad{cross, local} {
		if n := l.fails.Load(); n > 0 {
			t.Errorf("%s: %d round trips failed (%d resets): %v", l.name, n, l.reset.Load(), l.errs)
		}
	}
	for i, n := range sub(crossUp, crossDown) {
		if n == 0 {
			t.Errorf("cross-host conn %d made no round trip while no agent ran", i)
		}
	}
	for i, n := range sub(localUp, localDown) {
		if n == 0 {
			t.Errorf("same-host conn %d made no round trip while no agent ran", i)
		}
	}
	for _, e := range []error{errX, errL} {
		if e != nil {
			t.Error(e)
		}
	}
	if len(lostX) > 0 || sentX < 200 {
		t.Errorf("cross-host ping: %d sent, lost %v", sentX, lostX)
	}
	if len(lostL) > 0 || sentL < 200 {
		t.Errorf("same-host ping: %d sent, lost %v", sentL, lostL)
	}
	// Programs were replaced on the same links; stale entries swept, new ones written.
	linksAfter := driverLinks(ctx, t, h1)
	if !reflect.DeepEqual(linksBefore, linksAfter) {
		t.Errorf("tcx links of h1 changed across the restart (want the programs replaced on the pinned links):\nbefore %v\nafter  %v", linksBefore, linksAfter)
	}
	if _, err := driverEntry(ctx, h1, gone.IP.Addr()); err == nil {
		t.Errorf("h1 still has the entry of %s (%s), deleted while its agent was down", gone.Name, gone.IP.Addr())
	}
	if _, err := driverEntry(ctx, h1, added.IP.Addr()); err != nil {
		t.Errorf("h1 lacks %s (added while its agent was down): %v", added.Name, err)
	}
	if genAfter, err := driverEntry(ctx, h1, a.IP.Addr()); err != nil || genAfter <= genBefore {
		t.Errorf("live entry of %s: generation %d -> %d (%v); want it rewritten in a newer generation", a.Name, genBefore, genAfter, err)
	}
	if out, err := a.Ping(ctx, added.IP.Addr(), 2); err != nil {
		t.Errorf("ping %s -> %s after restart: %v\n%s", a.Name, added.Name, err, out)
	}
	t.Logf("links kept: %d tcx links, same ids; %s swept, %s added", len(linksAfter), gone.IP.Addr(), added.IP.Addr())
	if err := c.RemoveContainer(ctx, added); err != nil {
		t.Error(err)
	}

	// The restarted agent knows everything again (the removal just above reaches it
	// through its watch: give it a moment).
	eventually(t, "h1's endpoints after the restart", 10*time.Second, func() error {
		var eps endpoints
		if err := h1.InspectGet(ctx, "/inspect/endpoints", &eps); err != nil {
			return err
		}
		if n := countNet(eps, network); n != [2]int{2, 1} {
			return fmt.Errorf("h1 endpoints of %s: %d local, %d remote, want 2 and 1: %+v", network, n[0], n[1], eps)
		}
		return nil
	})
}

// driverStatus is the part of /inspect/driver (eBPF) the restart checks read.
type driverStatus struct {
	Attachments []struct {
		Interface string
		ID        uint32
	}
	Tables struct {
		Endpoints []struct {
			IP         string
			Generation uint32
		}
	}
}

// driverLinks returns h's tcx attachments, interface → link id.
func driverLinks(ctx context.Context, t *testing.T, h *Host) map[string]uint32 {
	t.Helper()
	var st driverStatus
	if err := h.InspectGet(ctx, "/inspect/driver", &st); err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, a := range st.Attachments {
		out[a.Interface] = a.ID
	}
	return out
}

// driverEntry returns the generation of ip's cb_endpoints entry on h, or an error if h's
// maps have no entry for it.
func driverEntry(ctx context.Context, h *Host, ip netip.Addr) (uint32, error) {
	var st driverStatus
	if err := h.InspectGet(ctx, "/inspect/driver", &st); err != nil {
		return 0, err
	}
	for _, e := range st.Tables.Endpoints {
		if e.IP == ip.String() {
			return e.Generation, nil
		}
	}
	return 0, fmt.Errorf("%s has no cb_endpoints entry for %s", h.Name, ip)
}

// countNet counts local and remote endpoints of a network ("<net>.<tenant>-..." ids).
func countNet(eps endpoints, network string) [2]int {
	var n [2]int
	for _, e := range eps.Local {
		if strings.HasPrefix(e.ID, network+".") {
			n[0]++
		}
	}
	for _, e := range eps.Remote {
		if strings.HasPrefix(e.ID, network+".") {
			n[1]++
		}
	}
	return n
}
