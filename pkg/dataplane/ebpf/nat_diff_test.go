package ebpf

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/internal/testkit/refmodel"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// The egress NAT differential test: random sequences of endpoint packets to the outside
// (two tenants with the same endpoint address), packets from the outside to the NAT
// address (replies, strangers, wrong ports), time passing and collector passes go through
// the real programs and through refmodel.NATModel; the first verdict, port, delivery or
// table entry that differs fails with the shortest sequence that reproduces it.

const (
	natDiffPorts = 4 // a small range, so sequences exhaust and reuse it
	natPortMin   = 61000
)

var natRemotes = []netip.Addr{worldIP, netip.MustParseAddr("198.51.100.8")}

type natStep struct {
	kind         string // "out", "in", "advance", "gc"
	zone         int    // out: 0 or 1
	remote       int
	proto        uint8 // 1, 6, 17, 47
	sport, dport uint16
	flags        uint8  // TCP flags
	seq, ack     uint32 // TCP sequence and acknowledgment numbers
	frag         bool
	advance      time.Duration
}

func (s natStep) String() string {
	switch s.kind {
	case "out", "in":
		return fmt.Sprintf("%s zone %d remote %d proto %d %d→%d flags %#x seq %d ack %d frag %v", s.kind, s.zone, s.remote, s.proto, s.sport, s.dport, s.flags, s.seq, s.ack, s.frag)
	case "advance":
		return "advance " + s.advance.String()
	}
	return s.kind
}

type natGen struct {
	r     *rand.Rand
	ports []uint16 // NAT ports seen so far (replies aim at them)
	flows []natStep
}

func (g *natGen) flags() uint8 {
	return []uint8{0x02, 0x02, 0x10, 0x12, 0x11, 0x04, 0x18, 0x14}[g.r.IntN(8)]
}

// seqAck picks sequence and acknowledgment numbers that land on both sides of the close
// window's and the note step's edges (the endpoint's SYN at 1000 or 0, its ACKs of 0,
// 5000 or a step less or more than a step on, whose note then lags or moves).
func (g *natGen) seqAck() (uint32, uint32) {
	v := []uint32{0, 1, 1000, 1001, 5000, 5000 + refmodel.TCPCloseWindow - 1, 5000 + refmodel.TCPCloseWindow, 4999, 0x80000000,
		5000 + refmodel.TCPNoteStep - 1, 5000 + refmodel.TCPNoteStep, 5000 + refmodel.TCPNoteStep + refmodel.TCPCloseWindow - 1}
	return v[g.r.IntN(len(v))], v[g.r.IntN(len(v))]
}

func (g *natGen) step() natStep {
	switch n := g.r.IntN(100); {
	case n < 45:
		s := natStep{kind: "out", zone: g.r.IntN(2), remote: g.r.IntN(2), proto: []uint8{6, 6, 17, 17, 1, 47}[g.r.IntN(6)],
			sport: []uint16{40000, 40001, 5353}[g.r.IntN(3)], dport: []uint16{53, 443}[g.r.IntN(2)]}
		s.frag = (s.proto == 6 || s.proto == 17) && g.r.IntN(25) == 0
		if s.proto == 6 {
			s.flags = g.flags()
			s.seq, s.ack = g.seqAck()
		}
		if s.proto == 1 {
			s.dport = s.sport // echo id
		}
		g.flows = append(g.flows, s)
		return s
	case n < 88:
		s := natStep{kind: "in", remote: g.r.IntN(2), proto: []uint8{6, 17, 1}[g.r.IntN(3)], sport: []uint16{53, 443}[g.r.IntN(2)],
			dport: uint16(natPortMin + g.r.IntN(natDiffPorts+2))}
		if len(g.flows) > 0 && g.r.IntN(3) > 0 { // mostly aimed at a flow's remote side
			f := g.flows[g.r.IntN(len(g.flows))]
			s.remote, s.proto, s.sport = f.remote, f.proto, f.dport
		}
		if len(g.ports) > 0 && g.r.IntN(4) > 0 {
			s.dport = g.ports[g.r.IntN(len(g.ports))]
		}
		if s.proto == 6 {
			s.flags = g.flags()
			s.seq, s.ack = g.seqAck()
		}
		if s.proto == 1 {
			s.sport = s.dport
		}
		return s
	case n < 96:
		// Never a multiple of a timeout (as in the main differential test): the two clocks
		// may differ by a tick.
		return natStep{kind: "advance", advance: []time.Duration{3137 * time.Millisecond, 7411 * time.Millisecond,
			31*time.Second + 77*time.Millisecond, 47*time.Second + 313*time.Millisecond}[g.r.IntN(4)]}
	}
	return natStep{kind: "gc"}
}

type natWorld struct {
	t         *testing.T
	objs      *contivbpfObjects
	model     *refmodel.NATModel
	lastClock uint64
	zone      int
	tally     map[string]int
}

// newNATWorld starts a sequence on objs (natFixture with natDiffPorts): the NAT tables are
// emptied and the sending endpoint is put back in zone 0.
func newNATWorld(t *testing.T, objs *contivbpfObjects) *natWorld {
	for _, m := range []*ebpf.Map{objs.CbSnat, objs.CbSnatRev} {
		if err := emptyMap(m); err != nil {
			t.Fatal(err)
		}
	}
	setZone(t, objs, natZone(0))
	w := &natWorld{t: t, objs: objs, model: refmodel.NewNATModel(natPortMin, natPortMin+natDiffPorts-1)}
	w.lastClock = w.clock()
	return w
}

func (w *natWorld) clock() uint64 {
	now, err := monotonicNow()
	if err != nil {
		w.t.Fatal(err)
	}
	return now
}

func (w *natWorld) syncClock() {
	if now := w.clock(); now > w.lastClock {
		w.model.Advance(time.Duration(now - w.lastClock))
		w.lastClock = now
	}
}

func natZone(z int) uint32 { return testZone + uint32(z) }

func (w *natWorld) frame(s natStep) []byte {
	src, dst := srcIP, natRemotes[s.remote]
	if s.kind == "in" {
		src, dst = natRemotes[s.remote], hostIP
	}
	var f []byte
	switch s.proto {
	case 1:
		typ := uint8(8)
		if s.kind == "in" {
			typ = 0
		}
		f = icmpEcho(src, dst, typ, s.sport)
	case 6, 17:
		frag := uint16(0)
		if s.frag {
			frag = 0x2000
		}
		f = l4Frame(s.proto, src, dst, s.sport, s.dport, s.flags, frag)
		if s.proto == 6 {
			f = withSeq(f, s.seq, s.ack)
		}
	default:
		f = ipFrame(src, dst, ipOpts{})
		f[14+9] = s.proto
	}
	return f
}

func (w *natWorld) packet(s natStep) refmodel.ModelPacket {
	p := refmodel.ModelPacket{Zone: natZone(s.zone), Src: srcIP, Dst: natRemotes[s.remote], Proto: s.proto, Sport: s.sport, Dport: s.dport,
		SYN: s.flags&0x02 != 0, ACK: s.flags&0x10 != 0, FIN: s.flags&0x01 != 0, RST: s.flags&0x04 != 0, SeqNum: s.seq, AckNum: s.ack}
	if s.frag {
		p.Frag = refmodel.FragFirst
	}
	if s.kind == "in" {
		p.Src, p.Dst = natRemotes[s.remote], hostIP
	}
	if s.proto == 1 {
		p.ICMPType = 8
		if s.kind == "in" {
			p.ICMPType = 0
		}
	}
	return p
}

// apply runs one step on both sides and returns the first difference ("" if none).
func (w *natWorld) apply(s natStep) string {
	t := w.t
	switch s.kind {
	case "advance":
		ageMap(t, w.objs.CbSnat, func(v *contivbpfCbSnatEntry) *uint64 { return &v.Expires }, s.advance)
		w.syncClock()
		w.model.Advance(s.advance)
		return w.compareTables()
	case "gc":
		w.syncClock()
		_, _, err := natGC{flows: w.objs.CbSnat, replies: w.objs.CbSnatRev}.sweep(w.clock(), nil)
		if err != nil {
			t.Fatal(err)
		}
		w.model.GC()
		return w.compareTables()
	case "out":
		if s.zone != w.zone {
			setZone(t, w.objs, natZone(s.zone))
			w.zone = s.zone
		}
	}
	w.syncClock()
	res := run(t, w.objs, map[string]*ebpf.Program{"out": w.objs.CbFromContainer, "in": w.objs.CbFromUplink}[s.kind], w.frame(s), nil)
	var got string
	var port uint16
	switch {
	case res.ret == tcxNext && len(res.diff) == 0:
		got = "host"
	case len(res.diff) != 1:
		t.Fatalf("step %v: reason counters moved %v, want exactly one", s, res.diff)
	default:
		for r := range res.diff {
			got = r.String()
		}
		ip := res.out[14:]
		if got == "fwd_egress" || got == "fwd_egress_reply" {
			off := 20 // TCP/UDP: the port that was rewritten
			if s.kind == "in" {
				off = 22
			}
			if s.proto == 1 {
				off = 24 // echo id
			}
			port = binary.BigEndian.Uint16(ip[off:])
		}
	}
	if w.tally != nil {
		w.tally[s.kind+":"+got]++
	}
	p := w.packet(s)
	var want string
	var wantPort uint16
	if s.kind == "out" {
		mp, drop := w.model.Egress(p, func(free func(uint16) bool) (uint16, bool) {
			if got == "fwd_egress" {
				if !free(port) {
					return 0, false // reported below as a difference
				}
				return port, true
			}
			for q := uint16(natPortMin); q < natPortMin+natDiffPorts; q++ {
				if free(q) {
					return q, true // the datapath refused a flow the model has a port for
				}
			}
			return 0, false
		})
		want, wantPort = "fwd_egress", mp
		if drop != "" {
			want, wantPort = drop, 0
		}
	} else {
		want = "host"
		if k, ok, drop := w.model.Reply(p); ok {
			want, wantPort = "fwd_egress_reply", k.Sport
		} else if drop != "" {
			want = drop
		}
	}
	if got != want || port != wantPort {
		return fmt.Sprintf("datapath %s port %d, model %s port %d", got, port, want, wantPort)
	}
	return w.compareTables()
}

// compareTables compares cb_snat with the model's flows: key, port, state, liveness and
// the TCP close reference.
func (w *natWorld) compareTables() string {
	now := w.clock()
	got := map[refmodel.NATFlowKey]string{}
	var k contivbpfCbSnatKey
	var v contivbpfCbSnatEntry
	it := w.objs.CbSnat.Iterate()
	for it.Next(&k, &v) {
		fk := refmodel.NATFlowKey{Zone: k.Zone, Src: addrFrom(k.Saddr), Dst: addrFrom(k.Daddr), Sport: hport(k.Sport), Dport: hport(k.Dport), Proto: k.Proto}
		got[fk] = fmt.Sprintf("port %d state %d live %v tcp ref %d:%d", hport(v.NatPort), v.State, v.Expires >= now, v.TcpRefKind, v.TcpRef)
	}
	if err := it.Err(); err != nil {
		w.t.Fatal(err)
	}
	want := map[refmodel.NATFlowKey]string{}
	for fk, f := range w.model.Flows {
		want[fk] = fmt.Sprintf("port %d state %d live %v tcp ref %d:%d", f.Port, f.State, f.Deadline >= w.model.Now, f.RefKind, f.Ref)
	}
	var diffs []string
	for fk, g := range got {
		if want[fk] != g {
			diffs = append(diffs, fmt.Sprintf("%+v: datapath %q model %q", fk, g, want[fk]))
		}
	}
	for fk, m := range want {
		if _, ok := got[fk]; !ok {
			diffs = append(diffs, fmt.Sprintf("%+v: datapath none, model %q", fk, m))
		}
	}
	return strings.Join(diffs, "; ")
}

func replayNAT(t *testing.T, objs *contivbpfObjects, steps []natStep, tally map[string]int) (int, string) {
	w := newNATWorld(t, objs)
	w.tally = tally
	for i, s := range steps {
		if d := w.apply(s); d != "" {
			return i, d
		}
	}
	return -1, ""
}

func TestNATDifferential(t *testing.T) {
	testroot.Need(t)
	seqs, length := envInt("CONTIVBPF_DIFF_SEQS", 30), envInt("CONTIVBPF_DIFF_LEN", 120)
	base := uint64(envInt("CONTIVBPF_DIFF_SEED", 1))
	tally := map[string]int{}
	objs := natFixture(t, natDiffPorts)
	for n := 0; n < seqs; n++ {
		seed := base + uint64(n)
		g := &natGen{r: rand.New(rand.NewPCG(seed, 0x4a7))}
		steps := make([]natStep, length)
		for i := range steps {
			steps[i] = g.step()
		}
		// Replies aim at NAT ports the datapath handed out: learn them from a first replay.
		w := newNATWorld(t, objs)
		for i, s := range steps {
			if s.kind == "in" && len(g.ports) > 0 && i%2 == 0 {
				steps[i].dport = g.ports[(i/2)%len(g.ports)]
				if s.proto == 1 {
					steps[i].sport = steps[i].dport
				}
			}
			if d := w.apply(steps[i]); d != "" {
				break
			}
			for _, f := range w.model.Flows {
				g.ports = append(g.ports, f.Port)
			}
		}
		at, diff := replayNAT(t, objs, steps, tally)
		if at < 0 {
			continue
		}
		short := steps[:at+1]
		for changed := true; changed; {
			changed = false
			for i := 0; i < len(short)-1; i++ {
				cand := append(append([]natStep(nil), short[:i]...), short[i+1:]...)
				if a, _ := replayNAT(t, objs, cand, nil); a >= 0 {
					short, changed = cand[:a+1], true
					i--
				}
			}
		}
		var b strings.Builder
		for i, s := range short {
			fmt.Fprintf(&b, "\n  %2d %v", i, s)
		}
		_, last := replayNAT(t, objs, short, nil)
		t.Fatalf("seed %d: datapath and model differ at step %d: %s\nshortest sequence (%d steps):%s\nlast: %s", seed, at, diff, len(short), b.String(), last)
	}
	t.Logf("%d sequences: datapath and model agree; outcomes %v", seqs, tally)
}
