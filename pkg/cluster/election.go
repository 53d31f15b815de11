// Package cluster owns netmaster's high-availability pieces on etcd v3: leader election on
// Contiv's lock key (/contiv.io/lock/netmaster/leader), the TTL'd service registry under
// /contiv.io/service/ (objdb.ServiceInfo JSON), and an HTTP front that serves locally on the
// leader and reverse-proxies to the leader elsewhere.
//
// It knows nothing about the REST object model, IPAM or dataplanes: the API is an
// http.Handler handed in by the caller.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// DefaultLeaderTTL is the lease TTL on the leader lock. Contiv used 30 s; a SIGKILLed leader
// is replaced after at most this long (its lease expires), so it is kept short.
const DefaultLeaderTTL = 4 * time.Second

// ElectionConfig configures one candidate.
type ElectionConfig struct {
	// ID is the value written at the lock key while this candidate leads; Contiv writes
	// "<controlIP>:<controlPort>" and followers proxy to http://<ID>. Required.
	ID string
	// Key is the lock key; default state.LeaderLockKey.
	Key string
	// TTL is the lease TTL (whole seconds, at least 2 s); default DefaultLeaderTTL.
	TTL time.Duration
	// OnChange, if set, is called (from the election goroutine, in order) whenever this
	// candidate becomes leader (true) or stops being leader (false).
	OnChange func(leader bool)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Election campaigns for the lock and tracks who holds it.
type Election struct {
	cli *clientv3.Client
	cfg ElectionConfig
	log *slog.Logger

	leader   atomic.Bool
	leadMu   sync.Mutex             // orders leadership transitions and their notifications
	holder   atomic.Pointer[string] // last seen lock value ("" = nobody)
	mu       sync.Mutex
	lease    clientv3.LeaseID // lease of the current campaign (0 = none)
	changeMu sync.Mutex
	subs     []chan bool
}

// NewElection validates cfg. Call Run to campaign.
func NewElection(store *state.Store, cfg ElectionConfig) (*Election, error) {
	if store == nil {
		return nil, errors.New("election: store is nil")
	}
	if cfg.ID == "" {
		return nil, errors.New("election: ID is empty (want <controlIP>:<port>)")
	}
	if cfg.Key == "" {
		cfg.Key = state.LeaderLockKey
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLeaderTTL
	}
	if cfg.TTL < 2*time.Second {
		return nil, fmt.Errorf("election: TTL %s too short (etcd leases need at least 2s)", cfg.TTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Election{cli: store.Client(), cfg: cfg, log: cfg.Logger.With("lock", cfg.Key, "id", cfg.ID)}
	empty := ""
	e.holder.Store(&empty)
	return e, nil
}

// ID is this candidate's lock value.
func (e *Election) ID() string { return e.cfg.ID }

// IsLeader reports whether this candidate holds the lock right now (as far as it knows:
// it steps down when no lease renewal has succeeded for TTL/2, before etcd can expire
// the lease and another candidate can take the lock).
func (e *Election) IsLeader() bool { return e.leader.Load() }

// CurrentLeader is the lock value last observed by Run ("" when nobody holds the lock or
// Run is not running). It never touches etcd.
func (e *Election) CurrentLeader() string { return *e.holder.Load() }

// Leader reads the lock key from etcd and returns the current leader's address ("" if none).
func (e *Election) Leader(ctx context.Context) (string, error) {
	return readLock(ctx, e.cli, e.cfg.Key)
}

// LeaderAddr reads netmaster's leader lock (/contiv.io/lock/netmaster/leader) and returns
// its value "<controlIP>:<port>", or "" when nobody leads. netplugin uses it to find the
// netmaster to talk to.
func LeaderAddr(ctx context.Context, store *state.Store) (string, error) {
	return readLock(ctx, store.Client(), state.LeaderLockKey)
}

func readLock(ctx context.Context, cli *clientv3.Client, key string) (string, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return "", fmt.Errorf("read leader lock %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Changes returns a channel that receives every leadership transition of this candidate
// (true = became leader). Slow readers lose intermediate values, never the latest one.
func (e *Election) Changes() <-chan bool {
	ch := make(chan bool, 1)
	e.changeMu.Lock()
	e.subs = append(e.subs, ch)
	e.changeMu.Unlock()
	return ch
}

func (e *Election) setLeader(v bool) { e.setLeaderUnless(v, nil) }

// setLeaderUnless changes leadership unless lost is closed (then it does nothing): a
// round must not claim leadership after its lease watchdog has given up.
func (e *Election) setLeaderUnless(v bool, lost <-chan struct{}) {
	e.leadMu.Lock()
	defer e.leadMu.Unlock()
	if lost != nil {
		select {
		case <-lost:
			return
		default:
		}
	}
	if e.leader.Swap(v) == v {
		return
	}
	if v {
		e.log.Info("became leader")
	} else {
		e.log.Info("stepped down")
	}
	if e.cfg.OnChange != nil {
		e.cfg.OnChange(v)
	}
	e.changeMu.Lock()
	defer e.changeMu.Unlock()
	for _, ch := range e.subs {
		select { // keep only the latest value for slow readers
		case <-ch:
		default:
		}
		ch <- v
	}
}

func (e *Election) setHolder(h string) { e.holder.Store(&h) }

// Run campaigns until ctx ends: acquire the lock if it is free (create-only transaction),
// otherwise watch it and retry when it is deleted or expires. While leading it keeps the
// lease alive and steps down when the lease is lost or the key is taken away. On return it
// resigns (revokes its lease, deleting the key) so another candidate takes over at once.
func (e *Election) Run(ctx context.Context) error {
	defer e.Resign(context.WithoutCancel(ctx)) //nolint:errcheck // logged inside
	wait := retry.New(200*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil {
		err := e.campaign(ctx)
		e.setLeader(false)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			e.log.Warn("election round failed, retrying", "err", err)
			if !wait.Wait(ctx) {
				break
			}
			continue
		}
		wait.Reset()
	}
	return ctx.Err()
}

// Resign gives up leadership now: it revokes the campaign lease, which deletes the lock key
// if this candidate holds it. Run keeps campaigning unless its context is done.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	id := e.lease
	e.lease = 0
	e.mu.Unlock()
	wasLeader := e.leader.Load()
	e.setLeader(false)
	if id == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.cli.Revoke(ctx, id); err != nil {
		e.log.Warn("revoke election lease", "err", err)
		return fmt.Errorf("resign: revoke lease %x: %w", int64(id), err)
	}
	if wasLeader {
		e.log.Info("resigned leadership")
	}
	return nil
}

// campaign runs one lease lifetime: grant, keep alive, try to acquire, lead or watch.
// It returns nil when the round ended normally (lease lost, key taken) and should be
// retried, or an error from etcd.
func (e *Election) campaign(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ttl := int64(math.Ceil(e.cfg.TTL.Seconds()))
	granted := time.Now() // the lease runs from (at the earliest) here
	lg, err := e.cli.Grant(rctx, ttl)
	if err != nil {
		return fmt.Errorf("grant %ds lease: %w", ttl, err)
	}
	e.mu.Lock()
	e.lease = lg.ID
	e.mu.Unlock()
	defer func() {
		// Leaving the round: drop the lease unless Resign already did.
		e.mu.Lock()
		mine := e.lease == lg.ID
		if mine {
			e.lease = 0
		}
		e.mu.Unlock()
		if mine {
			e.setLeader(false)
			rv, c := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_, _ = e.cli.Revoke(rv, lg.ID)
			c()
		}
	}()
	leaseLost := e.keepLease(rctx, lg.ID, time.Duration(ttl)*time.Second, granted)

	key := e.cfg.Key
	for {
		resp, err := e.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, e.cfg.ID, clientv3.WithLease(lg.ID))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return fmt.Errorf("acquire %s: %w", key, err)
		}
		rev := resp.Header.Revision
		if resp.Succeeded {
			e.setHolder(e.cfg.ID)
			e.setLeaderUnless(true, leaseLost)
		} else {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue // deleted between compare and get: try again
			}
			e.setHolder(string(kvs[0].Value))
			e.log.Debug("lock held by another candidate", "holder", string(kvs[0].Value))
		}
		// Watch the key: as follower until it is deleted, as leader until it is lost.
		gone, err := e.watchKey(rctx, key, rev, leaseLost)
		if err != nil {
			return err
		}
		if !gone {
			return nil // lease lost: new round with a new lease
		}
		e.setHolder("")
		if e.leader.Load() {
			e.log.Warn("leader lock key removed while leading")
			return nil
		}
	}
}

// keepLease renews the lease every ttl/6 and returns a channel that is closed when the
// round must end: the lease is gone, ctx ended, or no renewal has succeeded for ttl/2.
// In the last case it steps down at once, long before etcd can expire the lease (at
// least ttl after the last successful renewal) and another candidate can take the
// lock, so two candidates never both act as leader.
func (e *Election) keepLease(ctx context.Context, id clientv3.LeaseID, ttl time.Duration, granted time.Time) <-chan struct{} {
	lost := make(chan struct{})
	var lastOK atomic.Int64 // send time of the last successful renewal (unix ns)
	lastOK.Store(granted.UnixNano())
	every, grace, check := ttl/6, ttl/2, ttl/20
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			kctx, cancel := context.WithTimeout(ctx, every)
			sent := time.Now()
			r, err := e.cli.KeepAliveOnce(kctx, id)
			cancel()
			switch {
			case err == nil && r.TTL > 0:
				lastOK.Store(sent.UnixNano())
			case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
				e.log.Warn("election lease expired")
				return
			case ctx.Err() == nil:
				e.log.Debug("renew election lease", "err", err)
			}
		}
	}()
	go func() {
		t := time.NewTicker(check)
		defer t.Stop()
		for {
			select {
			case <-renewDone:
				close(lost)
				return
			case <-t.C:
				if since := time.Since(time.Unix(0, lastOK.Load())); since > grace {
					e.log.Warn("election lease not renewed, stepping down", "since", since.Round(time.Millisecond), "ttl", ttl)
					close(lost)
					e.setLeader(false) // now, even if the round is stuck in an etcd call
					return
				}
			}
		}
	}()
	return lost
}

// watchKey waits until key is deleted (true) or the lease is lost or the key taken over
// while leading (false). Value changes update the observed holder. A broken watch (etcd
// member restart, leader change) is re-established from a fresh read, not treated as loss.
func (e *Election) watchKey(ctx context.Context, key string, rev int64, leaseLost <-chan struct{}) (bool, error) {
	for {
		gone, broken, err := e.watchOnce(ctx, key, rev, leaseLost)
		if !broken || err != nil {
			return gone, err
		}
		if !retry.New(200*time.Millisecond, 200*time.Millisecond).Wait(ctx) {
			return false, ctx.Err()
		}
		select {
		case <-leaseLost:
			return false, nil
		default:
		}
		gctx, cancel := context.WithTimeout(ctx, e.cfg.TTL/2)
		resp, err := e.cli.Get(gctx, key)
		cancel()
		if err != nil {
			e.log.Warn("re-read leader lock after broken watch", "err", err)
			continue // the lease deadline decides when to give up
		}
		if len(resp.Kvs) == 0 {
			return true, nil
		}
		v := string(resp.Kvs[0].Value)
		e.setHolder(v)
		if e.leader.Load() && v != e.cfg.ID {
			return false, nil
		}
		rev = resp.Header.Revision
	}
}

func (e *Election) watchOnce(ctx context.Context, key string, rev int64, leaseLost <-chan struct{}) (gone, broken bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := e.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
	for {
		select {
		case <-leaseLost:
			if ctx.Err() != nil {
				return false, false, ctx.Err()
			}
			e.log.Warn("election lease lost")
			return false, false, nil
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return false, false, ctx.Err()
				}
				return false, true, nil
			}
			if err := wr.Err(); err != nil {
				e.log.Warn("leader lock watch interrupted", "err", err)
				return false, true, nil
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return true, false, nil
				}
				e.setHolder(string(ev.Kv.Value))
				if e.leader.Load() && string(ev.Kv.Value) != e.cfg.ID {
					e.log.Warn("leader lock overwritten", "holder", string(ev.Kv.Value))
					return false, false, nil
				}
			}
		}
	}
}
