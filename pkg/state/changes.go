package state

import (
	"fmt"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Change is one write a transaction holds: a put of Value, or a delete.
type Change struct {
	Key     string
	Value   []byte
	Deleted bool
}

// Changes returns the writes the transaction holds so far, sorted by key, and the prefixes
// it deletes whole (DeletePrefix). A caller that keeps books on what a transaction changes
// (netmaster's per-tenant usage) reads them before the commit.
func (t *Tx) Changes() (changes []Change, deletedPrefixes []string) {
	changes = make([]Change, 0, len(t.writes))
	for k, w := range t.writes {
		c := Change{Key: k, Deleted: w == nil}
		if w != nil {
			c.Value = []byte(*w)
		}
		changes = append(changes, c)
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].Key < changes[j].Key })
	return changes, append([]string(nil), t.delPrefixes...)
}

// beforeBatch keeps one read of Before within an external etcd's default --max-txn-ops.
const beforeBatch = 100

// Before returns the values keys had in the transaction's snapshot, whatever it wrote to
// them since (keys absent there are left out of the map). It reads in batches, without
// adding commit guards: a caller whose sums depend on these values must read a record
// every concurrent writer of those keys also rewrites (for netmaster's usage books, the
// tenant's usage record), so that a concurrent change makes the commit retry.
func (t *Tx) Before(keys []string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(keys))
	for start := 0; start < len(keys); start += beforeBatch {
		batch := keys[start:min(start+beforeBatch, len(keys))]
		ops := make([]clientv3.Op, 0, len(batch))
		for _, k := range batch {
			ops = append(ops, clientv3.OpGet(k, t.snapshotOpts()...))
		}
		resp, err := t.cli.Txn(t.ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("read %d keys as they were at revision %d: %w", len(batch), t.rev, err)
		}
		t.noteRev(resp.Header.Revision)
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				out[string(kv.Key)] = kv.Value
			}
		}
	}
	return out, nil
}
