package master

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Address allocation maps.
//
// A network's allocation map has one bit per address of its subnet (bit i ↔ subnet base
// + i). Contiv keeps the whole map inline in the network state record (ipAllocMap), so
// every allocation rewrites 2^(32-len) bits: ~700 KB per allocation in a /10. netmaster
// keeps that inline layout for subnets of up to ipChunkBits addresses (a /24 and smaller,
// and any record already written inline), and stores larger address spaces in chunks:
//
//	/contiv.io/state/ipalloc/<netID>/net/full           Bitset, bit c set = chunk c is full
//	/contiv.io/state/ipalloc/<netID>/net/c/<c, 5 digits> Bitset of ipChunkBits bits
//	/contiv.io/state/ipalloc/<netID>/epg/<epgID>/...     the same for an EPG's ipPool
//
// A chunk without a key holds its base pattern (network, broadcast and gateway addresses
// and addresses outside the network's range are used; for an EPG pool everything outside
// the pool), and a full chunk has no key either: its bit in "full" says so. One allocation
// therefore writes one chunk (a few dozen bytes), plus the summary when a chunk fills up or
// stops being full. The network state record then carries ipAllocStore "chunks/256" and
// an empty ipAllocMap. Chunk keys are only ever written in a transaction that also
// rewrites (and so guards) the owning network state record; deleting the network deletes
// the whole <netID>/ prefix.

// ipChunkBits is the number of addresses per allocation chunk.
const ipChunkBits = 256

// chunkedStore is the ipAllocStore value of chunked maps.
var chunkedStore = "chunks/" + strconv.Itoa(ipChunkBits)

// IPAllocPrefix is the root of chunked allocation maps.
const ipAllocPrefix = "/contiv.io/state/ipalloc/"

// netAllocRoot is the prefix of every chunk key of network netID (net and EPG maps).
func netAllocRoot(netID string) string { return ipAllocPrefix + netID + "/" }

// addrMap is an allocation bitmap, inline or chunked. Changes to a chunked map are
// buffered in the transaction as they are made; an inline map changes its record in
// memory and the caller writes the record, as before.
type addrMap interface {
	Len() uint
	Test(off uint) (bool, error)
	Set(off uint) error
	Clear(off uint) error
	// SetRange and ClearRange change bits [from, to] inclusive.
	SetRange(from, to uint) error
	ClearRange(from, to uint) error
	// NextClear is the lowest clear bit ≥ from.
	NextClear(from uint) (uint, bool, error)
	// NextSet is the lowest set bit in [from, to].
	NextSet(from, to uint) (uint, bool, error)
	// Bits materialises the whole map (for inspect).
	Bits() (model.Bitset, error)
}

// inlineMap is Contiv's layout: the bitmap inside the state record.
type inlineMap struct{ b *model.Bitset }

func (m inlineMap) Len() uint                   { return m.b.Len() }
func (m inlineMap) Test(off uint) (bool, error) { return m.b.Test(off), nil }
func (m inlineMap) Set(off uint) error          { m.b.Set(off); return nil }
func (m inlineMap) Clear(off uint) error        { m.b.Clear(off); return nil }
func (m inlineMap) SetRange(from, to uint) error {
	m.b.SetRange(from, to)
	return nil
}
func (m inlineMap) ClearRange(from, to uint) error {
	for i := from; i <= to && i < m.b.Len(); i++ {
		m.b.Clear(i)
	}
	return nil
}
func (m inlineMap) NextClear(from uint) (uint, bool, error) {
	off, ok := m.b.NextClear(from)
	return off, ok, nil
}
func (m inlineMap) NextSet(from, to uint) (uint, bool, error) {
	off, ok := m.b.NextSet(from)
	return off, ok && off <= to, nil
}
func (m inlineMap) Bits() (model.Bitset, error) { return m.b.Clone(), nil }

// chunkMap is the chunked layout described above.
type chunkMap struct {
	tx     *state.Tx
	prefix string // ".../net/" or ".../epg/<id>/"
	n      uint   // bits in the map (subnet size)
	base   func(off uint) bool
	full   *model.Bitset
	chunks map[uint]*model.Bitset // chunks read or changed in this transaction
	exists map[uint]bool          // whether chunk c has a key (as far as known)
	listed bool                   // exists holds every chunk key
}

func newChunkMap(tx *state.Tx, prefix string, n uint, base func(off uint) bool) *chunkMap {
	return &chunkMap{tx: tx, prefix: prefix, n: n, base: base, chunks: map[uint]*model.Bitset{}, exists: map[uint]bool{}}
}

// list reads every chunk key once, for operations over many chunks.
func (m *chunkMap) list() (map[uint]model.Bitset, error) {
	kvs, err := m.tx.List(m.prefix + "c/")
	if err != nil {
		return nil, err
	}
	stored := map[uint]model.Bitset{}
	for _, kv := range kvs {
		c, err := strconv.ParseUint(strings.TrimPrefix(kv.Key, m.prefix+"c/"), 10, 32)
		if err != nil || uint(c) >= m.nChunks() {
			return nil, fmt.Errorf("allocation map %s: stray key %s", m.prefix, kv.Key)
		}
		var b model.Bitset
		if err := kv.Decode(&b); err != nil {
			return nil, err
		}
		if b.Len() != m.chunkBits(uint(c)) {
			return nil, fmt.Errorf("allocation map %s: chunk %d has %d bits, want %d", m.prefix, c, b.Len(), m.chunkBits(uint(c)))
		}
		stored[uint(c)] = b
	}
	if !m.listed {
		m.listed = true
		for c := range stored {
			if _, known := m.exists[c]; !known {
				m.exists[c] = true
			}
		}
	}
	return stored, nil
}

func (m *chunkMap) nChunks() uint                   { return (m.n + ipChunkBits - 1) / ipChunkBits }
func (m *chunkMap) fullKey() string                 { return m.prefix + "full" }
func (m *chunkMap) chunkKey(c uint) string          { return fmt.Sprintf("%sc/%05d", m.prefix, c) }
func (m *chunkMap) chunkBits(c uint) uint           { return min(ipChunkBits, m.n-c*ipChunkBits) }
func (m *chunkMap) Len() uint                       { return m.n }
func (m *chunkMap) isFullChunk(b model.Bitset) bool { return b.Count() == b.Len() }

// baseChunk is chunk c as it is without a key.
func (m *chunkMap) baseChunk(c uint) model.Bitset {
	b := model.NewBitset(m.chunkBits(c))
	for i := uint(0); i < b.Len(); i++ {
		if m.base(c*ipChunkBits + i) {
			b.Set(i)
		}
	}
	return b
}

// init writes the summary of a new map: chunks whose base pattern is full.
func (m *chunkMap) init() error {
	full := model.NewBitset(m.nChunks())
	for c := uint(0); c < m.nChunks(); c++ {
		if b := m.baseChunk(c); m.isFullChunk(b) {
			full.Set(c)
		}
	}
	m.full = &full
	m.listed = true // a new map has no chunk keys
	return m.tx.Put(m.fullKey(), full)
}

func (m *chunkMap) summary() (*model.Bitset, error) {
	if m.full != nil {
		return m.full, nil
	}
	var full model.Bitset
	found, err := m.tx.Get(m.fullKey(), &full)
	if err != nil {
		return nil, err
	}
	if !found || full.Len() != m.nChunks() {
		return nil, fmt.Errorf("allocation map %s: summary %s missing or of the wrong size", m.prefix, m.fullKey())
	}
	m.full = &full
	return m.full, nil
}

// chunk returns chunk c for reading and changing (changes need put).
func (m *chunkMap) chunk(c uint) (*model.Bitset, error) {
	if b, ok := m.chunks[c]; ok {
		return b, nil
	}
	full, err := m.summary()
	if err != nil {
		return nil, err
	}
	var b model.Bitset
	if full.Test(c) {
		b = model.NewBitset(m.chunkBits(c))
		b.SetRange(0, b.Len()-1)
	} else if m.listed && !m.exists[c] {
		b = m.baseChunk(c)
	} else {
		found, err := m.tx.Get(m.chunkKey(c), &b)
		if err != nil {
			return nil, err
		}
		m.exists[c] = found
		if !found {
			b = m.baseChunk(c)
		} else if b.Len() != m.chunkBits(c) {
			return nil, fmt.Errorf("allocation map %s: chunk %d has %d bits, want %d", m.prefix, c, b.Len(), m.chunkBits(c))
		}
	}
	m.chunks[c] = &b
	return &b, nil
}

// put buffers chunk c: a full chunk becomes a summary bit, a chunk equal to its base
// pattern has no key, anything else is written.
func (m *chunkMap) put(c uint) error {
	b := m.chunks[c]
	full, err := m.summary()
	if err != nil {
		return err
	}
	wasFull := full.Test(c)
	isFull := m.isFullChunk(*b)
	if isFull != wasFull {
		if isFull {
			full.Set(c)
		} else {
			full.Clear(c)
		}
		if err := m.tx.Put(m.fullKey(), *full); err != nil {
			return err
		}
	}
	if isFull || equalBits(*b, m.baseChunk(c)) {
		has, err := m.keyExists(c)
		if err != nil {
			return err
		}
		if has {
			m.tx.Delete(m.chunkKey(c))
			m.exists[c] = false
		}
		return nil
	}
	m.exists[c] = true
	return m.tx.Put(m.chunkKey(c), *b)
}

// keyExists tells whether chunk c has a key, reading the key list once if it is unknown.
func (m *chunkMap) keyExists(c uint) (bool, error) {
	if has, known := m.exists[c]; known {
		return has, nil
	}
	if m.listed {
		return false, nil
	}
	if _, err := m.list(); err != nil {
		return false, err
	}
	return m.exists[c], nil
}

func equalBits(a, b model.Bitset) bool {
	if a.Len() != b.Len() {
		return false
	}
	for i := uint(0); i < a.Len(); i++ {
		if a.Test(i) != b.Test(i) {
			return false
		}
	}
	return true
}

func (m *chunkMap) Test(off uint) (bool, error) {
	if off >= m.n {
		return false, nil
	}
	b, err := m.chunk(off / ipChunkBits)
	if err != nil {
		return false, err
	}
	return b.Test(off % ipChunkBits), nil
}

func (m *chunkMap) Set(off uint) error   { return m.change(off, off, true) }
func (m *chunkMap) Clear(off uint) error { return m.change(off, off, false) }
func (m *chunkMap) SetRange(from, to uint) error {
	return m.change(from, to, true)
}
func (m *chunkMap) ClearRange(from, to uint) error {
	return m.change(from, to, false)
}

func (m *chunkMap) change(from, to uint, set bool) error {
	if to >= m.n {
		to = m.n - 1
	}
	for c := from / ipChunkBits; from <= to && c <= to/ipChunkBits; c++ {
		lo, hi := max(from, c*ipChunkBits), min(to, c*ipChunkBits+m.chunkBits(c)-1)
		var b *model.Bitset
		if set && lo == c*ipChunkBits && hi == c*ipChunkBits+m.chunkBits(c)-1 {
			// Whole chunk: no need to read it.
			nb := model.NewBitset(m.chunkBits(c))
			b = &nb
			m.chunks[c] = b
		} else {
			var err error
			if b, err = m.chunk(c); err != nil {
				return err
			}
		}
		for i := lo; i <= hi; i++ {
			if set {
				b.Set(i - c*ipChunkBits)
			} else {
				b.Clear(i - c*ipChunkBits)
			}
		}
		if err := m.put(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *chunkMap) NextClear(from uint) (uint, bool, error) {
	full, err := m.summary()
	if err != nil {
		return 0, false, err
	}
	for c := from / ipChunkBits; c < m.nChunks(); c++ {
		if full.Test(c) {
			continue
		}
		b, err := m.chunk(c)
		if err != nil {
			return 0, false, err
		}
		start := uint(0)
		if c == from/ipChunkBits {
			start = from % ipChunkBits
		}
		if i, ok := b.NextClear(start); ok {
			return c*ipChunkBits + i, true, nil
		}
	}
	return 0, false, nil
}

func (m *chunkMap) NextSet(from, to uint) (uint, bool, error) {
	if to >= m.n {
		to = m.n - 1
	}
	if from > to {
		return 0, false, nil
	}
	full, err := m.summary()
	if err != nil {
		return 0, false, err
	}
	if to/ipChunkBits-from/ipChunkBits > 2 && !m.listed {
		if _, err := m.list(); err != nil {
			return 0, false, err
		}
	}
	for c := from / ipChunkBits; c <= to/ipChunkBits; c++ {
		lo := max(from, c*ipChunkBits)
		if full.Test(c) {
			return lo, true, nil
		}
		b, err := m.chunk(c)
		if err != nil {
			return 0, false, err
		}
		if i, ok := b.NextSet(lo - c*ipChunkBits); ok && c*ipChunkBits+i <= to {
			return c*ipChunkBits + i, true, nil
		}
	}
	return 0, false, nil
}

func (m *chunkMap) Bits() (model.Bitset, error) {
	full, err := m.summary()
	if err != nil {
		return model.Bitset{}, err
	}
	stored, err := m.list()
	if err != nil {
		return model.Bitset{}, err
	}
	out := model.NewBitset(m.n)
	for c := uint(0); c < m.nChunks(); c++ {
		var b model.Bitset
		if cached, ok := m.chunks[c]; ok {
			b = *cached
		} else if full.Test(c) {
			out.SetRange(c*ipChunkBits, c*ipChunkBits+m.chunkBits(c)-1)
			continue
		} else if s, ok := stored[c]; ok {
			b = s
		} else {
			b = m.baseChunk(c)
		}
		for i, ok := b.NextSet(0); ok; i, ok = b.NextSet(i + 1) {
			out.Set(c*ipChunkBits + i)
		}
	}
	return out, nil
}

// netBase is the base pattern of network ns: network, broadcast and gateway addresses and
// addresses outside its range are used.
func netBase(sn subnet4, gw uint32, hasGW bool) func(off uint) bool {
	n := uint(sn.size())
	return func(off uint) bool {
		a := sn.base + uint32(off)
		return off == 0 || off == n-1 || (hasGW && a == gw) || a < sn.first || a > sn.end
	}
}

// poolBase is the base pattern of an EPG pool map: everything outside [first, last] and
// the network and broadcast addresses are used.
func poolBase(sn subnet4, first, last uint32) func(off uint) bool {
	n := uint(sn.size())
	return func(off uint) bool {
		a := sn.base + uint32(off)
		return off == 0 || off == n-1 || a < first || a > last
	}
}

// useChunks tells whether a new map of n bits is stored in chunks.
func useChunks(n uint32) bool { return n > ipChunkBits }

// netRange gives the network's usable range from its state record.
func netRange(ns *model.CfgNetworkState, sn subnet4) subnet4 {
	if first, last, ok := strings.Cut(ns.IPAddrRange, "-"); ok {
		f, err1 := parseIP4("", first)
		l, err2 := parseIP4("", last)
		if err1 == nil && err2 == nil && sn.contains(f) && sn.contains(l) && f <= l {
			sn.first, sn.end = f, l
		}
	}
	return sn
}

// netAllocMap opens the allocation map of network ns.
func netAllocMap(tx *state.Tx, ns *model.CfgNetworkState) (addrMap, error) {
	if ns.IPAllocStore == "" {
		return inlineMap{&ns.IPAllocMap}, nil
	}
	if ns.IPAllocStore != chunkedStore {
		return nil, fmt.Errorf("network %s: unknown ipAllocStore %q", ns.ID, ns.IPAllocStore)
	}
	sn, err := subnetOfState(ns)
	if err != nil {
		return nil, err
	}
	sn = netRange(ns, sn)
	var gw uint32
	hasGW := false
	if ns.Gateway != "" {
		if g, err := parseIP4("gateway", ns.Gateway); err == nil {
			gw, hasGW = g, true
		}
	}
	return newChunkMap(tx, netAllocRoot(ns.ID)+"net/", uint(sn.size()), netBase(sn, gw, hasGW)), nil
}

// epgAllocMap opens the pool allocation map of EPG g of network ns.
func epgAllocMap(tx *state.Tx, ns *model.CfgNetworkState, g *model.EndpointGroupState) (addrMap, error) {
	if g.EPGIPAllocStore == "" {
		return inlineMap{&g.EPGIPAllocMap}, nil
	}
	if g.EPGIPAllocStore != chunkedStore {
		return nil, fmt.Errorf("endpoint group %s: unknown epgIpAllocStore %q", g.ID, g.EPGIPAllocStore)
	}
	sn, err := subnetOfState(ns)
	if err != nil {
		return nil, err
	}
	first, last, err := parsePool(g.IPPool)
	if err != nil {
		return nil, err
	}
	return newChunkMap(tx, epgAllocPrefix(ns.ID, g.ID), uint(sn.size()), poolBase(sn, first, last)), nil
}

func epgAllocPrefix(netID, epgID string) string { return netAllocRoot(netID) + "epg/" + epgID + "/" }

// newIPMap marks network, broadcast, gateway and everything outside the range as used.
func newIPMap(sn subnet4, gw uint32, hasGW bool) model.Bitset {
	n := sn.size()
	b := model.NewBitset(uint(n))
	used := netBase(sn, gw, hasGW)
	for off := uint(0); off < uint(n); off++ {
		if used(off) {
			b.Set(off)
		}
	}
	return b
}

// formatRanges renders the offsets for which want(bit) holds as "a-b, c" address ranges.
func formatRanges(sn subnet4, b model.Bitset, want bool, skip func(off uint) bool) string {
	var parts []string
	n := b.Len()
	for i := uint(0); i < n; {
		if b.Test(i) != want || (skip != nil && skip(i)) {
			i++
			continue
		}
		j := i
		for j+1 < n && b.Test(j+1) == want && (skip == nil || !skip(j+1)) {
			j++
		}
		if i == j {
			parts = append(parts, addr4(sn.base+uint32(i)).String())
		} else {
			parts = append(parts, addr4(sn.base+uint32(i)).String()+"-"+addr4(sn.base+uint32(j)).String())
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
