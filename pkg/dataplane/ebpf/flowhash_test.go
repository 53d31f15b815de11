package ebpf

import (
	"encoding/binary"
	"math/bits"
	"math/rand"
	"net/netip"
	"testing"
)

// murmur3x86_32 is MurmurHash3 (x86, 32-bit) of data with seed, written from the published
// algorithm (any length), as the reference for flowHash.
func murmur3x86_32(data []byte, seed uint32) uint32 {
	const c1, c2 = 0xcc9e2d51, 0x1b873593
	h := seed
	n := len(data) / 4
	for i := 0; i < n; i++ {
		k := binary.LittleEndian.Uint32(data[4*i:])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	var k uint32
	tail := data[4*n:]
	switch len(tail) {
	case 3:
		k ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		k ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		k ^= uint32(tail[0])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
	}
	h ^= uint32(len(data))
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// TestFlowHashIsMurmur3: flowHash (the differential test's model of cb_flow_hash) is
// MurmurHash3 of the 5-tuple's 12 bytes as they lie in the packet (source address,
// destination address, source port, destination port), seeded with seed ^ proto; so the
// differential test, which checks the datapath against flowHash, checks the datapath
// against the specified hash (every field in, the ports included), not just against a
// twin that could drift with it.
func TestFlowHashIsMurmur3(t *testing.T) {
	if got := murmur3x86_32([]byte("hello"), 0); got != 0x248bfa47 {
		t.Fatalf("reference murmur3(\"hello\", 0) = %#x, want 0x248bfa47", got)
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 1000; i++ {
		var b [12]byte
		r.Read(b[:])
		seed, proto := r.Uint32(), uint8(r.Intn(256))
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[0:4])), binary.BigEndian.Uint16(b[8:]))
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[10:]))
		if got, want := flowHash(seed, src, dst, proto), murmur3x86_32(b[:], seed^uint32(proto)); got != want {
			t.Fatalf("flowHash(%#x, %v, %v, %d) = %#x, murmur3 = %#x", seed, src, dst, proto, got, want)
		}
	}
}

// No tenant's zone, nor its node port zone, is the zone of the node port fragment records
// (CB_NATFRAG_NODEPORT_IN), whatever its name hashes to; other hashes are the zone.
func TestZoneOfHashReservesNodePortFragments(t *testing.T) {
	for _, h := range []uint32{0x7fffffff, 0xffffffff} {
		if z := zoneOfHash(h); z == natFragNodePortIn || z^legacyZoneNodePort == natFragNodePortIn {
			t.Errorf("hash %#x: zone %#x meets the node port fragment records", h, z)
		}
	}
	for _, h := range []uint32{0, 1, 0x7ffffffe, 0x80000000, 0xfffffffe, 0x12345678} {
		if z := zoneOfHash(h); z != h {
			t.Errorf("hash %#x: zone %#x, want the hash", h, z)
		}
	}
}
