package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxCompares keeps a transaction under etcd's default --max-txn-ops (128 compares).
const maxCompares = 120

// ErrConflict is returned by Update when the transaction lost every retry to concurrent writers.
var ErrConflict = errors.New("transaction conflict: too many concurrent writers")

// ErrTxnTooLarge is returned when etcd refuses a change for its size (more operations
// than its --max-txn-ops, or a request above --max-request-bytes): nothing was written.
var ErrTxnTooLarge = errors.New("change too large for one etcd transaction")

// Tx is an optimistic, serializable transaction. All reads see one snapshot revision;
// writes are buffered and become visible to later reads of the same Tx. At commit every
// key that was read must be exactly as it was in the snapshot (same revision, or still
// absent), and no key under a listed prefix may have been created or changed, else Update
// retries. Keys deleted under a listed prefix also force a retry while the transaction
// stays within etcd's compare limit; beyond it (very long listings) a deletion under a
// listed prefix alone does not, which can only make a list-based check more permissive.
type Tx struct {
	ctx    context.Context
	cli    *clientv3.Client
	rev    int64
	cmps   []clientv3.Cmp
	seen   map[string]bool
	writes map[string]*string // nil value = delete
	// delPrefixes are ranges deleted as a whole (one etcd operation each).
	delPrefixes []string
}

// deletedByPrefix reports whether key lies under a prefix this transaction deletes.
func (t *Tx) deletedByPrefix(key string) bool {
	for _, p := range t.delPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

func (t *Tx) snapshotOpts() []clientv3.OpOption {
	if t.rev == 0 {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithRev(t.rev)}
}

func (t *Tx) noteRev(rev int64) {
	if t.rev == 0 {
		t.rev = rev
	}
}

// GetRaw returns the raw value of key, or found=false.
func (t *Tx) GetRaw(key string) ([]byte, bool, error) {
	kv, found, err := t.GetKV(key)
	return kv.Value, found, err
}

// GetKV returns the record at key with its revisions (zero for a value this transaction
// wrote), or found=false.
func (t *Tx) GetKV(key string) (KV, bool, error) {
	if w, ok := t.writes[key]; ok {
		if w == nil {
			return KV{}, false, nil
		}
		return KV{Key: key, Value: []byte(*w)}, true, nil
	}
	if t.deletedByPrefix(key) {
		return KV{}, false, nil
	}
	resp, err := t.cli.Get(t.ctx, key, t.snapshotOpts()...)
	if err != nil {
		return KV{}, false, fmt.Errorf("get %s: %w", key, err)
	}
	t.noteRev(resp.Header.Revision)
	if !t.seen[key] {
		t.seen[key] = true
		t.cmps = append(t.cmps, unchanged(key, resp.Kvs))
	}
	if len(resp.Kvs) == 0 {
		return KV{}, false, nil
	}
	return kvOf(resp.Kvs[0]), true, nil
}

// Get decodes key into v; found reports whether the key exists.
func (t *Tx) Get(key string, v any) (bool, error) {
	b, ok, err := t.GetRaw(key)
	if err != nil || !ok {
		return ok, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return true, fmt.Errorf("decode %s: %w", key, err)
	}
	return true, nil
}

// List returns the records under prefix as seen by this transaction (own writes included),
// sorted by key. Any later change under prefix makes the commit retry.
func (t *Tx) List(prefix string) ([]KV, error) { return t.list(prefix, true, false) }

// ListUnguarded is List without commit guards: later changes under prefix do not make the
// commit retry. A caller whose result depends on the records must read, with a guard, a
// record that every concurrent writer of them also rewrites (netmaster's usage recount: the
// tenant's usage record), else use List.
func (t *Tx) ListUnguarded(prefix string) ([]KV, error) { return t.list(prefix, false, false) }

// Keys is List without the values (KV.Value is nil): what a caller that needs only which
// records exist reads, at a fraction of the bytes. It guards the commit as List does.
func (t *Tx) Keys(prefix string) ([]KV, error) { return t.list(prefix, true, true) }

// KeysUnguarded is Keys without commit guards, for callers that guard otherwise as
// ListUnguarded says.
func (t *Tx) KeysUnguarded(prefix string) ([]KV, error) { return t.list(prefix, false, true) }

func (t *Tx) list(prefix string, guard, keysOnly bool) ([]KV, error) {
	opts := append(t.snapshotOpts(), clientv3.WithPrefix())
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	resp, err := t.cli.Get(t.ctx, prefix, opts...)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	t.noteRev(resp.Header.Revision)
	if guard && !t.seen["prefix:"+prefix] {
		t.seen["prefix:"+prefix] = true
		// Created or modified keys under prefix show up as a newer ModRevision.
		t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(prefix), "<", t.rev+1).WithPrefix())
		// Deleted keys do not: guard each listed key individually while there is room.
		if len(t.cmps)+len(resp.Kvs) <= maxCompares {
			for _, kv := range resp.Kvs {
				k := string(kv.Key)
				if !t.seen[k] {
					t.seen[k] = true
					t.cmps = append(t.cmps, clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision))
				}
			}
		}
	}
	m := make(map[string]KV, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if !t.deletedByPrefix(string(kv.Key)) {
			m[string(kv.Key)] = kvOf(kv)
		}
	}
	for k, w := range t.writes {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		switch {
		case w == nil:
			delete(m, k)
		case keysOnly:
			m[k] = KV{Key: k}
		default:
			m[k] = KV{Key: k, Value: []byte(*w)}
		}
	}
	out := make([]KV, 0, len(m))
	for _, kv := range m {
		out = append(out, kv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Guards is how many commit guards (etcd compares) the transaction holds so far: etcd
// evaluates each, so a reader that must cost the same however much the store holds
// keeps their number bounded.
func (t *Tx) Guards() int { return len(t.cmps) }

// unchanged is the commit guard for a key read at the snapshot: same ModRevision if it
// existed, never created if it did not. (A plain "ModRevision < snapshot+1" guard would let
// a key deleted after the read pass, since etcd compares a missing key as revision 0.)
func unchanged(key string, kvs []*mvccpb.KeyValue) clientv3.Cmp {
	if len(kvs) == 0 {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)
}

// Put buffers a JSON write of v at key. A key under a prefix this transaction deletes
// cannot be written again (etcd refuses a put inside a deleted range of the same txn).
func (t *Tx) Put(key string, v any) error {
	if t.deletedByPrefix(key) {
		return fmt.Errorf("put %s: its prefix is deleted in the same transaction", key)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	s := string(b)
	t.writes[key] = &s
	return nil
}

// Delete buffers a delete of key.
func (t *Tx) Delete(key string) {
	if !t.deletedByPrefix(key) {
		t.writes[key] = nil
	}
}

// DeletePrefix buffers the deletion of every key under prefix, as one operation whatever
// their number. Buffered writes under prefix are dropped. The deletion is not guarded: keys
// created under prefix by a concurrent writer are deleted too, so use it for records only
// this transaction's guarded owner (for example a network state record it read) can create.
func (t *Tx) DeletePrefix(prefix string) {
	if prefix == "" {
		return
	}
	for k := range t.writes {
		if strings.HasPrefix(k, prefix) {
			delete(t.writes, k)
		}
	}
	t.delPrefixes = append(t.delPrefixes, prefix)
}

func (t *Tx) commit() (bool, error) {
	if len(t.writes) == 0 && len(t.delPrefixes) == 0 {
		return true, nil
	}
	ops := make([]clientv3.Op, 0, len(t.writes)+len(t.delPrefixes))
	for _, p := range t.delPrefixes {
		ops = append(ops, clientv3.OpDelete(p, clientv3.WithPrefix()))
	}
	keys := make([]string, 0, len(t.writes))
	for k := range t.writes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if w := t.writes[k]; w == nil {
			ops = append(ops, clientv3.OpDelete(k))
		} else {
			ops = append(ops, clientv3.OpPut(k, *w))
		}
	}
	resp, err := t.cli.Txn(t.ctx).If(t.cmps...).Then(ops...).Commit()
	if err != nil {
		// etcd's limits (--max-txn-ops, --max-request-bytes) and the client's own on what it
		// sends (gRPC's 2 MiB): sizes, never a failure of the store.
		if msg := err.Error(); strings.Contains(msg, "too many operations in txn") || strings.Contains(msg, "request is too large") ||
			strings.Contains(msg, "trying to send message larger than max") {
			return false, fmt.Errorf("%w: %d writes and %d checks (%v)", ErrTxnTooLarge, len(ops), len(t.cmps), err)
		}
		return false, fmt.Errorf("commit transaction: %w", err)
	}
	return resp.Succeeded, nil
}

// Update runs fn in a transaction and commits its writes atomically. If a key or prefix
// fn read changed before the commit, fn runs again on a fresh snapshot. An error from fn
// aborts with nothing written.
func (s *Store) Update(ctx context.Context, fn func(tx *Tx) error) error {
	const maxAttempts = 200
	for attempt := 0; attempt < maxAttempts; attempt++ {
		tx := &Tx{ctx: ctx, cli: s.cli, seen: map[string]bool{}, writes: map[string]*string{}}
		if err := fn(tx); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				continue // its snapshot was compacted away (state.Reclaim): a fresh one
			}
			return err
		}
		ok, err := tx.commit()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		// Back off a little, with jitter, so competing writers spread out.
		d := time.Duration(rand.IntN(1+min(attempt, 20))) * time.Millisecond
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	return ErrConflict
}
