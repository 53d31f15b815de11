package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// The Kubernetes NetworkPolicy layer (bpf/lib/netpol.h): one cb_kpods entry per pod
// address with a PodPolicy, pointing at rule sets in cb_ksets that pods with equal rules
// share (reference-counted here, by content), each compiled for the programs' lookups
// (kcompile.go). A set's content never changes under its id: a pod whose rules change
// points at another set, written whole before the pod's entry names it.

// PodPolicyError says a pod's NetworkPolicy layer could not be installed: the pod is
// isolated in both directions with no rules (every new flow from or to it is denied, and
// established ones are cut on their next packet) until a valid one replaces it.
type PodPolicyError struct {
	ID  string
	Err error
}

func (e *PodPolicyError) Error() string {
	return fmt.Sprintf("pod policy %s: failed closed (all traffic of the pod denied): %v", e.ID, e.Err)
}

func (e *PodPolicyError) Unwrap() error { return e.Err }

// podPolRec is what the driver wrote for one PodPolicy.
type podPolRec struct {
	p       dataplane.PodPolicy
	key     contivbpfCbKpodKey
	sets    [2]string // content keys of the ingress and egress sets ("" = none)
	failed  error
	written bool
}

// enum cb_kpod_flags (not in the generated bindings: no C type uses the enum).
const (
	kpodInIsolated  = 1
	kpodOutIsolated = 2
)

// kset is one shared rule set.
type kset struct {
	id       uint32
	refs     int
	gen      uint32 // generation it was last written with
	compiled bool   // its prefixes are written (kcompile.go)
	rules    []contivbpfCbKrule
}

// writeSet writes s with the current generation: its compiled form (what the programs
// look up; a set already written gets its head rewritten alone), then its record.
func (d *Driver) writeSet(s *kset) error {
	if s.compiled {
		if err := d.writeKSetHead(s.id, s.rules, d.gen); err != nil {
			return err
		}
	} else {
		if err := writeKSet(d.mapPut, &d.objs, s.id, s.rules, d.gen); err != nil {
			return err
		}
		s.compiled = true
	}
	v := contivbpfCbKset{Count: uint32(len(s.rules)), Generation: d.gen}
	copy(v.Rules[:], s.rules)
	if err := d.mapPut(contivbpfMapCbKsets, d.objs.CbKsets, &s.id, &v); err != nil {
		return err
	}
	s.gen = d.gen
	return nil
}

// UpsertPodPolicy implements dataplane.Driver.
func (d *Driver) UpsertPodPolicy(ctx context.Context, p dataplane.PodPolicy) error {
	defer d.lock(cNp, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.upsertPodPolicy(p)
}

// DeletePodPolicy implements dataplane.Driver.
func (d *Driver) DeletePodPolicy(ctx context.Context, id string) error {
	defer d.lock(cNp, 0)()
	if err := d.check(); err != nil {
		return err
	}
	return d.deletePodPolicy(id)
}

// compileKRules turns one direction's rules into map rules and their content key.
func compileKRules(rs []dataplane.PodRule) ([]contivbpfCbKrule, string) {
	out := make([]contivbpfCbKrule, len(rs))
	var key strings.Builder
	for i, r := range rs {
		m := r.Remote.Masked()
		out[i] = contivbpfCbKrule{
			RemoteIp:   ip4(m.Addr()),
			RemoteMask: binaryNative(net.CIDRMask(m.Bits(), 32)),
			PortMin:    r.PortMin,
			PortMax:    r.PortMax,
			Proto:      r.Proto,
		}
		fmt.Fprintf(&key, "%s/%d/%d-%d;", m, r.Proto, r.PortMin, r.PortMax)
	}
	return out, key.String()
}

// acquireSet returns the id of the set with these rules, writing it when it is new.
func (d *Driver) acquireSet(rules []contivbpfCbKrule, key string) (uint32, error) {
	if s, ok := d.np.ksets[key]; ok {
		if s.gen != d.gen {
			if err := d.writeSet(s); err != nil {
				return 0, err
			}
		}
		s.refs++
		return s.id, nil
	}
	// The next id no set holds (ids wrap after 2^32 sets; a live one is never reused).
	for tries := 0; ; tries++ {
		d.np.nextKSetID++
		if _, used := d.np.ksetIDs[d.np.nextKSetID]; d.np.nextKSetID != 0 && !used {
			break
		}
		if tries > len(d.np.ksetIDs)+1 {
			return 0, fmt.Errorf("%s: no free set id", contivbpfMapCbKsets)
		}
	}
	s := &kset{id: d.np.nextKSetID, rules: rules}
	if err := d.writeSet(s); err != nil {
		return 0, err
	}
	s.refs = 1
	d.np.ksets[key] = s
	d.np.ksetIDs[s.id] = key
	return s.id, nil
}

// releaseSet drops one reference, deleting the set with its last.
func (d *Driver) releaseSet(key string) error {
	s, ok := d.np.ksets[key]
	if !ok {
		return nil
	}
	if s.refs--; s.refs > 0 {
		return nil
	}
	delete(d.np.ksets, key)
	delete(d.np.ksetIDs, s.id)
	if err := d.deleteKSetCompiled(s.id, s.rules); err != nil {
		return err
	}
	if err := mapDel(d.objs.CbKsets, &s.id); err != nil {
		return fmt.Errorf("delete %s %d: %w", contivbpfMapCbKsets, s.id, err)
	}
	return nil
}

func (d *Driver) upsertPodPolicy(p dataplane.PodPolicy) (retErr error) {
	if p.ID == "" {
		return errors.New("pod policy: id is empty")
	}
	old, had := d.np.podPols[p.ID]
	if had && old.failed == nil && old.written && reflect.DeepEqual(old.p, p) {
		// Unchanged: rewritten only for the generation (a Sync's sweep keeps it).
		return d.writeKPod(old)
	}
	// The zone's NetworkPolicy changes (and the old address's zone's): the flows there are
	// judged again. Stamped before the entries are written, the clock (and the layer's
	// feature bit) published after (stamps.go).
	zones := []uint32{vrfOf(p.NetworkID)}
	if had {
		zones = append(zones, old.key.Zone)
	}
	if err := d.announce(nil, zones); err != nil {
		return d.published(fmt.Errorf("pod policy %s: %w", p.ID, err))
	}
	defer func() { retErr = d.published(retErr) }()
	if err := p.Validate(); err != nil {
		return d.failPodClosed(p, err)
	}
	rec := &podPolRec{p: p, key: contivbpfCbKpodKey{Zone: vrfOf(p.NetworkID), Addr: ip4(p.IP)}}
	var ids [2]uint32
	for i, dir := range []struct {
		iso   bool
		rules []dataplane.PodRule
	}{{p.IngressIsolated, p.Ingress}, {p.EgressIsolated, p.Egress}} {
		if !dir.iso || len(dir.rules) == 0 {
			continue
		}
		rules, key := compileKRules(dir.rules)
		id, err := d.acquireSet(rules, key)
		if err != nil {
			for j := 0; j < i; j++ {
				_ = d.releaseSet(rec.sets[j])
			}
			return d.failPodClosed(p, err)
		}
		ids[i], rec.sets[i] = id, key
	}
	if had && old.key != rec.key {
		if err := d.deleteKPod(old); err != nil {
			_ = d.releaseSet(rec.sets[0])
			_ = d.releaseSet(rec.sets[1])
			return fmt.Errorf("pod policy %s: delete old address: %w", p.ID, err)
		}
	}
	if err := d.writeKPodSets(rec, ids); err != nil {
		_ = d.releaseSet(rec.sets[0])
		_ = d.releaseSet(rec.sets[1])
		return d.failPodClosed(p, err)
	}
	d.np.podPols[p.ID] = rec
	d.np.noteFeatures()
	if had {
		errs := []error{d.releaseSet(old.sets[0]), d.releaseSet(old.sets[1])}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("pod policy %s: %w", p.ID, err)
		}
	}
	return nil
}

// writeKPodSets writes rec's entry pointing at set ids.
func (d *Driver) writeKPodSets(rec *podPolRec, ids [2]uint32) error {
	v := contivbpfCbKpod{InSet: ids[0], OutSet: ids[1], Generation: d.gen}
	if rec.failed != nil || rec.p.IngressIsolated {
		v.Flags |= kpodInIsolated
	}
	if rec.failed != nil || rec.p.EgressIsolated {
		v.Flags |= kpodOutIsolated
	}
	if err := d.mapPut(contivbpfMapCbKpods, d.objs.CbKpods, &rec.key, &v); err != nil {
		return err
	}
	rec.written = true
	d.np.kpodOwner[rec.key] = rec.p.ID
	return nil
}

// deleteKPod removes rec's entry unless another pod policy wrote the same key since (an
// address reused in the zone).
func (d *Driver) deleteKPod(rec *podPolRec) error {
	if !rec.written || d.np.kpodOwner[rec.key] != rec.p.ID {
		return nil
	}
	if err := mapDel(d.objs.CbKpods, &rec.key); err != nil {
		return err
	}
	delete(d.np.kpodOwner, rec.key)
	return nil
}

// writeKPod rewrites rec's entry with the sets it holds.
func (d *Driver) writeKPod(rec *podPolRec) error {
	var ids [2]uint32
	for i, k := range rec.sets {
		if s, ok := d.np.ksets[k]; ok && k != "" {
			ids[i] = s.id
			if s.gen != d.gen {
				if err := d.writeSet(s); err != nil {
					return err
				}
			}
		}
	}
	return d.writeKPodSets(rec, ids)
}

// failPodClosed isolates p's address both ways with no rules and returns the
// *PodPolicyError saying so. A policy whose address cannot even be parsed has nothing to
// close: the error alone is returned.
func (d *Driver) failPodClosed(p dataplane.PodPolicy, cause error) error {
	perr := &PodPolicyError{ID: p.ID, Err: cause}
	old, had := d.np.podPols[p.ID]
	if had {
		_ = d.releaseSet(old.sets[0])
		_ = d.releaseSet(old.sets[1])
	}
	if !p.IP.Is4() || p.NetworkID == "" {
		if had {
			_ = d.deleteKPod(old)
		}
		delete(d.np.podPols, p.ID)
		d.np.noteFeatures()
		return perr
	}
	rec := &podPolRec{p: p, key: contivbpfCbKpodKey{Zone: vrfOf(p.NetworkID), Addr: ip4(p.IP)}, failed: cause}
	if had && old.key != rec.key {
		_ = d.deleteKPod(old)
	}
	again := had && old.failed != nil && old.failed.Error() == cause.Error()
	if !again {
		d.log.Error("pod policy failed closed", "pod", p.ID, "err", cause)
	}
	d.np.podPols[p.ID] = rec
	d.np.noteFeatures()
	if err := d.writeKPodSets(rec, [2]uint32{}); err != nil {
		return errors.Join(perr, fmt.Errorf("pod policy %s: write deny-all entry: %w", p.ID, err))
	}
	return perr
}

func (d *Driver) deletePodPolicy(id string) (retErr error) {
	rec, ok := d.np.podPols[id]
	if !ok {
		return nil
	}
	// Its zone's flows are judged again (stamps.go).
	if err := d.announce(nil, []uint32{rec.key.Zone}); err != nil {
		return d.published(fmt.Errorf("pod policy %s: %w", id, err))
	}
	defer func() { retErr = d.published(retErr) }()
	if err := d.deleteKPod(rec); err != nil {
		return fmt.Errorf("pod policy %s: delete: %w", id, err)
	}
	delete(d.np.podPols, id)
	d.np.noteFeatures()
	errs := []error{d.releaseSet(rec.sets[0]), d.releaseSet(rec.sets[1])}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pod policy %s: %w", id, err)
	}
	return nil
}
