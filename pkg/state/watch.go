package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

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
	// Health, when set, hears whether the watch delivers: an error when the list or the
	// watch failed, or when two progress requests (sent every HealthEvery; 0:
	// DefaultHealthEvery) went unanswered; nil once it delivers again.
	// Without it nothing notices a lost connection: the client resumes the watch by
	// itself, and meanwhile the channel is silent, as it is when nothing changes.
	Health      func(err error)
	HealthEvery time.Duration
}

// DefaultHealthEvery is how often a watch with a WatchHandler.Health asks etcd for a
// progress notification (one small message on the watch stream, no read).
const DefaultHealthEvery = time.Second

// ErrWatchSilent is what WatchHandler.Health hears when etcd did not answer a progress
// request in time: changes are not being delivered.
var ErrWatchSilent = errors.New("etcd did not answer the watch's progress request")

// watchHealth tells h.Health of changes only (the first report always).
type watchHealth struct {
	fn      func(error)
	said    bool
	healthy bool
}

func (w *watchHealth) report(err error) {
	if w.fn == nil || w.said && w.healthy == (err == nil) {
		return
	}
	w.said, w.healthy = true, err == nil
	w.fn(err)
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
	health := &watchHealth{fn: h.Health}
	every := h.HealthEvery
	if every <= 0 {
		every = DefaultHealthEvery
	}
	for ctx.Err() == nil {
		if needList {
			kvs, r, err := s.List(ctx, prefix)
			if err != nil {
				health.report(fmt.Errorf("list %s: %w", prefix, err))
				log.Warn("list for watch failed, retrying", "err", err)
				if !wait.Wait(ctx) {
					break
				}
				continue
			}
			rev = r
			needList = false
			health.report(nil)
			if h.Snapshot != nil {
				h.Snapshot(kvs, r)
			}
		}
		wctx := clientv3.WithRequireLeader(ctx)
		// etcd answers a progress request only when every watch of the stream has caught
		// up and none starts past its revision: a watch with Health has a stream of its
		// own (the client keys streams by metadata) and starts at the revision seen,
		// whose events it skips. (etcd catches such a watch up within its 100 ms sync:
		// a change in that first moment comes up to 0.1 s late.)
		start := rev + 1
		if h.Health != nil {
			wctx = metadata.AppendToOutgoingContext(wctx, "contiv-watch", prefix)
			start = rev
		}
		wctx, cancel := context.WithCancel(wctx)
		ch := s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(start), clientv3.WithPrevKV())
		s.watchOnce(wctx, ch, &rev, &needList, wait, health, every, h, log)
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

// watchOnce delivers ch's events to h until ch ends or fails (needList set when its
// revision was compacted). With h.Health it asks etcd for a progress notification every
// `every` and reports the watch silent when the last two are still unanswered.
func (s *Store) watchOnce(wctx context.Context, ch clientv3.WatchChan, rev *int64, needList *bool, wait *retry.Backoff,
	health *watchHealth, every time.Duration, h WatchHandler, log *slog.Logger) {
	var tick <-chan time.Time
	if h.Health != nil {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	// Events up to the revision seen when this watch started were delivered already (a
	// watch with Health starts at that revision). Not the last event's revision: the
	// events of one transaction share one, and each must be delivered.
	seen := *rev
	unanswered := 0                  // (progress requests since the last response)
	asking := make(chan struct{}, 1) // (a progress request under way)
	for {
		var resp clientv3.WatchResponse
		select {
		case <-tick:
			// etcd ignores a request while the watch is still catching up, so one
			// unanswered request is not yet silence.
			if unanswered >= 2 {
				health.report(ErrWatchSilent)
			}
			unanswered++
			// The request waits while the client reconnects: sent apart, one at a time,
			// with the watch's context (a stream the client would make for another
			// context could be taken by the next watch and die with that context).
			select {
			case asking <- struct{}{}:
				go func() {
					defer func() { <-asking }()
					_ = s.cli.RequestProgress(wctx) // (unanswered: reported at a later tick)
				}()
			default:
			}
			continue
		case r, ok := <-ch:
			if !ok {
				return
			}
			resp = r
		}
		if err := resp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) || resp.CompactRevision > 0 {
				*needList = true
			}
			health.report(fmt.Errorf("watch: %w", err))
			log.Warn("watch interrupted", "err", err, "rev", *rev)
			return
		}
		unanswered = 0
		health.report(nil)
		wait.Reset()
		for _, e := range resp.Events {
			if e.Kv.ModRevision <= seen {
				continue // (delivered already)
			}
			ev := Event{Key: string(e.Kv.Key), Value: e.Kv.Value, Rev: e.Kv.ModRevision}
			if e.Type == clientv3.EventTypeDelete {
				ev.Type = EventDelete
			}
			if e.PrevKv != nil {
				ev.PrevValue = e.PrevKv.Value
			}
			*rev = e.Kv.ModRevision
			if h.Event != nil {
				h.Event(ev)
			}
		}
	}
}
