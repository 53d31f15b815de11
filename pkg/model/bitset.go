package model

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
)

// Bitset is a fixed-length bit set whose JSON form is the one of github.com/jainvipin/bitset:
// a base64 (URL alphabet, padded) string of [8-byte big-endian length][big-endian uint64
// words], bit i being bit i%64 (LSB first) of word i/64. The zero value is an empty set.
type Bitset struct {
	length uint
	words  []uint64
}

// NewBitset returns an all-clear set of n bits.
func NewBitset(n uint) Bitset {
	return Bitset{length: n, words: make([]uint64, (n+63)/64)}
}

// Len is the number of bits.
func (b Bitset) Len() uint { return b.length }

// Test reports whether bit i is set; bits beyond Len are clear.
func (b Bitset) Test(i uint) bool {
	if i >= b.length {
		return false
	}
	return b.words[i/64]&(1<<(i%64)) != 0
}

// Set sets bit i; it reports false (and changes nothing) when i is out of range.
func (b *Bitset) Set(i uint) bool {
	if i >= b.length {
		return false
	}
	b.words[i/64] |= 1 << (i % 64)
	return true
}

// Clear clears bit i; out-of-range bits are ignored.
func (b *Bitset) Clear(i uint) {
	if i < b.length {
		b.words[i/64] &^= 1 << (i % 64)
	}
}

// SetRange sets bits [from, to] inclusive, clipped to the set.
func (b *Bitset) SetRange(from, to uint) {
	for i := from; i <= to && i < b.length; i++ {
		b.Set(i)
	}
}

// NextClear returns the lowest clear bit ≥ from.
func (b Bitset) NextClear(from uint) (uint, bool) {
	for i := from; i < b.length; {
		w := b.words[i/64] | (1<<(i%64) - 1) // ignore bits below i in this word
		if w != ^uint64(0) {
			j := (i/64)*64 + uint(bits.TrailingZeros64(^w))
			if j < b.length {
				return j, true
			}
			return 0, false
		}
		i = (i/64 + 1) * 64
	}
	return 0, false
}

// NextSet returns the lowest set bit ≥ from.
func (b Bitset) NextSet(from uint) (uint, bool) {
	for i := from; i < b.length; {
		w := b.words[i/64] &^ (1<<(i%64) - 1)
		if w != 0 {
			j := (i/64)*64 + uint(bits.TrailingZeros64(w))
			if j < b.length {
				return j, true
			}
			return 0, false
		}
		i = (i/64 + 1) * 64
	}
	return 0, false
}

// Count is the number of set bits.
func (b Bitset) Count() uint {
	n := 0
	for _, w := range b.words {
		n += bits.OnesCount64(w)
	}
	return uint(n)
}

// Clone returns an independent copy.
func (b Bitset) Clone() Bitset {
	return Bitset{length: b.length, words: append([]uint64(nil), b.words...)}
}

// MarshalBinary gives the jainvipin/bitset binary form.
func (b Bitset) MarshalBinary() []byte {
	out := make([]byte, 8+8*len(b.words))
	binary.BigEndian.PutUint64(out, uint64(b.length))
	for i, w := range b.words {
		binary.BigEndian.PutUint64(out[8+8*i:], w)
	}
	return out
}

// String is the base64 JSON payload.
func (b Bitset) String() string {
	return base64.URLEncoding.EncodeToString(b.MarshalBinary())
}

// MarshalJSON encodes the set as a JSON string.
func (b Bitset) MarshalJSON() ([]byte, error) {
	return json.Marshal(b.String())
}

// UnmarshalJSON decodes the JSON string form; null gives an empty set.
func (b *Bitset) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = Bitset{}
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("bitset: %w", err)
	}
	return b.parse(s)
}

// ParseBitset decodes the base64 string form.
func ParseBitset(s string) (Bitset, error) {
	var b Bitset
	err := b.parse(s)
	return b, err
}

func (b *Bitset) parse(s string) error {
	raw, err := base64.URLEncoding.DecodeString(s)
	if err != nil {
		return fmt.Errorf("bitset: %w", err)
	}
	if len(raw) < 8 || (len(raw)-8)%8 != 0 {
		return fmt.Errorf("bitset: bad encoded length %d", len(raw))
	}
	n := binary.BigEndian.Uint64(raw)
	nw := (len(raw) - 8) / 8
	if uint64(nw) != (n+63)/64 {
		return fmt.Errorf("bitset: length %d does not match %d words", n, nw)
	}
	words := make([]uint64, nw)
	for i := range words {
		words[i] = binary.BigEndian.Uint64(raw[8+8*i:])
	}
	b.length, b.words = uint(n), words
	return nil
}
