package ovs

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

func TestRejectPacketOutAndMark(t *testing.T) {
	data := []byte{1, 2, 3, 4, 5}
	b := packetOut(42, data)
	if binary.BigEndian.Uint32(b[0:]) != 0xffffffff || binary.BigEndian.Uint32(b[4:]) != ofppController ||
		binary.BigEndian.Uint16(b[8:]) != 16 || binary.BigEndian.Uint16(b[16:]) != 0 ||
		binary.BigEndian.Uint16(b[18:]) != 16 || binary.BigEndian.Uint32(b[20:]) != 42 || !bytes.Equal(b[32:], data) {
		t.Errorf("packet-out %x", b)
	}
	var regs [8]uint32
	regs[regFlags] = 1 << flagReject
	if !isReject(tAnswer, regs) || isReject(tServiceLB, regs) || isReject(tAnswer, [8]uint32{}) {
		t.Error("isReject")
	}
}

// TestTTLExpiredFlows (found by review): in routing mode each network sends its local
// endpoints' expired, untranslated packets to the answer table, where they reach the agent
// behind the sending port's answer meter as refusals do (one container cannot spend the
// others' share of the reject meter); bridge mode has none.
func TestTTLExpiredFlows(t *testing.T) {
	for _, mode := range []dataplane.FwdMode{dataplane.FwdRouting, dataplane.FwdBridge} {
		c, err := testPipeline(t).compile(testState(), dataplane.HostConfig{FwdMode: mode}, testPorts, newIDs())
		if err != nil {
			t.Fatal(err)
		}
		marks, agent := 0, 0
		for _, f := range c.list() {
			s := f.String()
			switch {
			case f.table == tL3 && strings.Contains(s, "nw_ttl="):
				marks++
				if !strings.Contains(s, "ct_state=-snat-dnat") || !strings.Contains(s, "reg4[0..1]=0") {
					t.Errorf("%s: expired-TTL flow not limited to local, untranslated packets: %s", mode, s)
				}
			case strings.Contains(s, "reject_ttl_exceeded"):
				agent++
				if f.table != tAnswer || f.meter != answerMeterID(100) {
					t.Errorf("%s: expired TTLs reach the agent without the port's answer meter: %s", mode, s)
				}
			}
		}
		if want := map[dataplane.FwdMode]int{dataplane.FwdRouting: 2, dataplane.FwdBridge: 0}[mode]; marks != want*len(testState().Networks) {
			t.Errorf("%s: %d expired-TTL flows in l3_rewrite, want %d per network", mode, marks, want)
		}
		if agent == 0 {
			t.Errorf("%s: no answer-table flow sends expired TTLs to the agent", mode)
		}
	}
}
