package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/retry"
)

// EventType says whether a key was written or removed.
type EventType int

// Event types.
const (
	EventPut EventType = iota
	EventDelete
)

func (t EventType) String() string {
	if t == EventDelete {
		return "delete"
	}
	return "put"
}

// Event is one change under a watched prefix. PrevValue is set for deletes and overwrites.
type Event struct {
	Type      EventType
	Key       string
	Value     []byte
	PrevValue []byte
	Rev       int64
}

// WatchHandler receives a full snapshot first (and again whenever the watch had to be
// rebuilt from scratch, e.g. after compaction), then individual events in order.
type WatchHandler struct {
	Snapshot func(kvs []KV, rev int64)
	Event    func(ev Event)
}

// ListWatch lists prefix, hands the snapshot to h, then streams changes. When the watch
// breaks (etcd unreachable, leader change) it resumes from the last revision seen so no
// event is lost; when that revision was compacted it relists and delivers a new snapshot.
// It blocks until ctx is done.
func (s *Store) ListWatch(ctx context.Context, prefix string, h WatchHandler) error {
	log := slog.With("prefix", prefix)
	var rev int64
	needList := true
	wait := retry.New(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		if needList {
			kvs, r, err := s.List(ctx, prefix)
			if err != nil {
				log.Warn("list for watch failed, retrying", "err", err)
				if !wait.Wait(ctx) {
					break
				}
				continue
			}
			rev = r
			needList = false
			if h.Snapshot != nil {
				h.Snapshot(kvs, r)
			}
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		ch := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
		for resp := range ch {
			if err := resp.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) || resp.CompactRevision > 0 {
					needList = true
				}
				log.Warn("watch interrupted", "err", err, "rev", rev)
				break
			}
			wait.Reset()
			for _, e := range resp.Events {
				ev := Event{Key: string(e.Kv.Key), Value: e.Kv.Value, Rev: e.Kv.ModRevision}
				if e.Type == clientv3.EventTypeDelete {
					ev.Type = EventDelete
				}
				if e.PrevKv != nil {
					ev.PrevValue = e.PrevKv.Value
				}
				rev = e.Kv.ModRevision
				if h.Event != nil {
					h.Event(ev)
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			break
		}
		if !wait.Wait(ctx) {
			break
		}
	}
	return fmt.Errorf("watch %s: %w", prefix, ctx.Err())
}
