package ovs

import (
	"bytes"
	"encoding/binary"
	"testing"
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
