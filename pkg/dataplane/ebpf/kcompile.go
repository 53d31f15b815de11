package ebpf

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/cilium/ebpf"
)

// Compiled NetworkPolicy rule sets (bpf/lib/netpol.h "Compiled rule sets"): each set of
// cb_ksets becomes one cb_kset_heads entry and one cb_kcidrs prefix per (protocol, aligned
// port block) of each rule, so the programs look a flow up with at most 2 x 17 lookups
// instead of scanning the set. cb_ksets stays the record the listings, verify and a
// start's recompile read.

// kAnyPortBits is the block size of "any port": the one block of 2^16 ports.
const kAnyPortBits = 16

// portBlock is 2^k ports from block << k.
type portBlock struct {
	k     uint8
	block uint16
}

// portBlocks cuts a rule's destination port range into aligned blocks: lo 0 is any port
// (the one block of k = 16), an empty range (hi < lo) none. As cb_krule_step matched, a
// port lies in one of them exactly when the rule's range holds it.
func portBlocks(lo, hi uint16) []portBlock {
	if lo == 0 {
		return []portBlock{{k: kAnyPortBits}}
	}
	var out []portBlock
	for a, b := uint32(lo), uint32(hi); a <= b; {
		k := min(bits.TrailingZeros32(a), kAnyPortBits)
		for k > 0 && a+(1<<k)-1 > b {
			k--
		}
		out = append(out, portBlock{k: uint8(k), block: uint16(a >> k)})
		a += 1 << k
	}
	return out
}

// compileKSet returns the head and the prefix keys of set id with these rules. A rule
// whose address has bits outside its mask, or whose mask is no prefix, is an error (the
// driver writes neither).
func compileKSet(id uint32, rules []contivbpfCbKrule) (contivbpfCbKsetHead, []contivbpfCbKcidrKey, error) {
	var head contivbpfCbKsetHead
	var keys []contivbpfCbKcidrKey
	seen := map[contivbpfCbKcidrKey]bool{}
	for i, r := range rules {
		m := beU32(r.RemoteMask)
		n := bits.LeadingZeros32(^m)
		if n < 32 && m<<n != 0 {
			return head, nil, fmt.Errorf("rule %d: mask %#08x is not a prefix", i, m)
		}
		if r.RemoteIp&^r.RemoteMask != 0 {
			return head, nil, fmt.Errorf("rule %d: address has bits outside its /%d", i, n)
		}
		for _, b := range portBlocks(r.PortMin, r.PortMax) {
			k := contivbpfCbKcidrKey{Prefixlen: uint32(64 + n), Set: id, Block: b.block, Proto: r.Proto, K: b.k, Remote: r.RemoteIp}
			if r.Proto == 0 {
				head.SizesAny |= 1 << b.k
			} else {
				head.Sizes |= 1 << b.k
			}
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return head, keys, nil
}

// writeKSet writes set id's compiled form into objs' maps (its prefixes, then its head)
// with generation gen, through put (Driver.mapPut; plainPut without a driver). A set's
// prefixes are written once, when it is made (its content never changes under its id);
// a later generation rewrites its head alone (writeKSetHead). On error what was written
// of the prefixes is removed again: no prefix outlives a set that was not made.
func writeKSet(put func(string, *ebpf.Map, any, any) error, objs *contivbpfObjects, id uint32, rules []contivbpfCbKrule, gen uint32) error {
	head, keys, err := compileKSet(id, rules)
	if err != nil {
		return fmt.Errorf("compile rule set %d: %w", id, err)
	}
	v := contivbpfCbKcidr{Generation: gen}
	for i := range keys {
		if err := put(contivbpfMapCbKcidrs, objs.CbKcidrs, &keys[i], &v); err != nil {
			for j := range keys[:i] {
				_ = mapDel(objs.CbKcidrs, &keys[j])
			}
			return err
		}
	}
	head.Generation = gen
	return put(contivbpfMapCbKsetHeads, objs.CbKsetHeads, &id, &head)
}

// writeKSetHead rewrites the head of set id (whose prefixes are in place) with generation
// gen.
func (d *Driver) writeKSetHead(id uint32, rules []contivbpfCbKrule, gen uint32) error {
	head, _, err := compileKSet(id, rules)
	if err != nil {
		return fmt.Errorf("compile rule set %d: %w", id, err)
	}
	head.Generation = gen
	return d.mapPut(contivbpfMapCbKsetHeads, d.objs.CbKsetHeads, &id, &head)
}

// deleteKSetCompiled removes set id's compiled form: its head first (lookups of the set
// then find nothing: deny), then its prefixes.
func (d *Driver) deleteKSetCompiled(id uint32, rules []contivbpfCbKrule) error {
	if err := mapDel(d.objs.CbKsetHeads, &id); err != nil {
		return fmt.Errorf("delete %s %d: %w", contivbpfMapCbKsetHeads, id, err)
	}
	_, keys, err := compileKSet(id, rules)
	if err != nil {
		return nil // never written
	}
	for i := range keys {
		if err := mapDel(d.objs.CbKcidrs, &keys[i]); err != nil {
			return fmt.Errorf("delete %s of set %d: %w", contivbpfMapCbKcidrs, id, err)
		}
	}
	return nil
}

// sweepKSetOrphans removes every head without a set in live and then every prefix whose
// set has no head: what a set left that is gone (a crash between its writes, an earlier
// run's set the sweep took), so that no id handed out later finds another set's prefixes.
func (d *Driver) sweepKSetOrphans(live func(uint32) bool) []error {
	var errs []error
	var id uint32
	var h contivbpfCbKsetHead
	var heads []uint32
	it := d.objs.CbKsetHeads.Iterate()
	for it.Next(&id, &h) {
		if !live(id) {
			heads = append(heads, id)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("iterate %s: %w", contivbpfMapCbKsetHeads, err))
	}
	for i := range heads {
		errs = appendErr(errs, mapDel(d.objs.CbKsetHeads, &heads[i]))
	}
	var k contivbpfCbKcidrKey
	var v contivbpfCbKcidr
	var orphans []contivbpfCbKcidrKey
	cit := d.objs.CbKcidrs.Iterate()
	for cit.Next(&k, &v) {
		if err := d.objs.CbKsetHeads.Lookup(&k.Set, &h); err != nil {
			orphans = append(orphans, k)
		}
	}
	if err := cit.Err(); err != nil {
		errs = append(errs, fmt.Errorf("iterate %s: %w", contivbpfMapCbKcidrs, err))
	}
	for i := range orphans {
		errs = appendErr(errs, mapDel(d.objs.CbKcidrs, &orphans[i]))
	}
	return errs
}

// compilePinnedKSets compiles every set of cb_ksets into the lookup maps (at start, before
// this build's programs are attached: an earlier build scanned cb_ksets itself), each
// with its own generation, after removing what sets without a record left; set ids
// continue above every id any of the three maps holds. A set that cannot be compiled is
// left without a head: the pods pointing at it deny what it would have allowed until the
// first Sync rewrites them.
func (d *Driver) compilePinnedKSets() error {
	sets := map[uint32]contivbpfCbKset{}
	var id uint32
	var v contivbpfCbKset
	it := d.objs.CbKsets.Iterate()
	for it.Next(&id, &v) {
		sets[id] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("ebpf: read %s: %w", contivbpfMapCbKsets, err)
	}
	for id := range sets {
		d.np.nextKSetID = max(d.np.nextKSetID, id)
	}
	var h contivbpfCbKsetHead
	hit := d.objs.CbKsetHeads.Iterate()
	for hit.Next(&id, &h) {
		d.np.nextKSetID = max(d.np.nextKSetID, id)
	}
	var k contivbpfCbKcidrKey
	var c contivbpfCbKcidr
	cit := d.objs.CbKcidrs.Iterate()
	for cit.Next(&k, &c) {
		d.np.nextKSetID = max(d.np.nextKSetID, k.Set)
	}
	if err := errors.Join(hit.Err(), cit.Err()); err != nil {
		return fmt.Errorf("ebpf: read the compiled rule sets: %w", err)
	}
	if err := errors.Join(d.sweepKSetOrphans(func(id uint32) bool { _, ok := sets[id]; return ok })...); err != nil {
		d.log.Warn("compiled rule sets: orphans left", "err", err)
	}
	for id, v := range sets {
		n := min(int(v.Count), len(v.Rules))
		if err := writeKSet(d.mapPut, &d.objs, id, v.Rules[:n], v.Generation); err != nil {
			d.log.Error("NetworkPolicy rule set not compiled: its pods deny", "set", id, "err", err)
		}
	}
	return nil
}
