package state_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/state"
)

type counter struct {
	N int `json:"n"`
}

func TestTypedCRUD(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	key := state.ModelKey("tenant", "blue")
	if key != "/contiv.io/obj/modeldb/tenant/blue" {
		t.Fatalf("model key = %s", key)
	}
	if err := s.Put(ctx, key, counter{N: 3}); err != nil {
		t.Fatal(err)
	}
	var c counter
	if err := s.Get(ctx, key, &c); err != nil || c.N != 3 {
		t.Fatalf("get = %+v, %v", c, err)
	}
	kvs, _, err := s.List(ctx, state.ModelPrefix)
	if err != nil || len(kvs) != 1 {
		t.Fatalf("list = %v, %v", kvs, err)
	}
	if ok, err := s.Delete(ctx, key); !ok || err != nil {
		t.Fatalf("delete = %v, %v", ok, err)
	}
	if err := s.Get(ctx, key, &c); err == nil {
		t.Fatal("get after delete succeeded")
	}
}

// Concurrent read-modify-write transactions must never lose an increment.
func TestUpdateSerializes(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	const workers, each = 8, 25
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := s.Update(ctx, func(tx *state.Tx) error {
					var c counter
					if _, err := tx.Get("/t/counter", &c); err != nil {
						return err
					}
					c.N++
					return tx.Put("/t/counter", c)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var c counter
	if err := s.Get(ctx, "/t/counter", &c); err != nil || c.N != workers*each {
		t.Fatalf("counter = %d (%v), want %d", c.N, err, workers*each)
	}
}

// A transaction that listed a prefix must retry when another writer adds a key under it.
func TestUpdatePrefixConflict(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	attempts := 0
	err := s.Update(ctx, func(tx *state.Tx) error {
		attempts++
		kvs, err := tx.List("/t/set/")
		if err != nil {
			return err
		}
		if attempts == 1 {
			if err := s.Put(ctx, "/t/set/other", counter{}); err != nil {
				return err
			}
		}
		return tx.Put("/t/count", counter{N: len(kvs)})
	})
	if err != nil {
		t.Fatal(err)
	}
	var c counter
	_ = s.Get(ctx, "/t/count", &c)
	if attempts != 2 || c.N != 1 {
		t.Fatalf("attempts=%d count=%d, want 2 and 1", attempts, c.N)
	}
}

// TestTxKeysAndRevisions: Keys lists what List does without the values (own writes
// included, deletes left out) and guards the commit alike; records carry their create and
// modify revisions.
func TestTxKeysAndRevisions(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	for _, k := range []string{"/t/set/a", "/t/set/b", "/t/setx"} {
		if err := s.Put(ctx, k, counter{N: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(ctx, "/t/set/a", counter{N: 2}); err != nil { // (modified after b was created)
		t.Fatal(err)
	}
	attempts := 0
	err := s.Update(ctx, func(tx *state.Tx) error {
		attempts++
		tx.Delete("/t/set/b")
		if err := tx.Put("/t/set/c", counter{}); err != nil {
			return err
		}
		keys, err := tx.Keys("/t/set/")
		if err != nil {
			return err
		}
		var got []string
		for _, kv := range keys {
			if kv.Value != nil {
				t.Errorf("Keys gave a value for %s", kv.Key)
			}
			got = append(got, kv.Key)
		}
		want := "/t/set/a,/t/set/c"
		if attempts > 1 {
			want = "/t/set/a,/t/set/c,/t/set/d"
		}
		if strings.Join(got, ",") != want {
			t.Errorf("attempt %d: Keys = %v, want %s", attempts, got, want)
		}
		a, found, err := tx.GetKV("/t/set/a")
		if err != nil || !found {
			return fmt.Errorf("GetKV: %v %v", found, err)
		}
		if keys[0].CreateRev != a.CreateRev || a.CreateRev == 0 || a.ModRev <= a.CreateRev || string(a.Value) != `{"n":2}` {
			t.Errorf("revisions: Keys %+v, GetKV %+v", keys[0], a)
		}
		if attempts == 1 { // a key created under the listed prefix: the commit retries
			return s.Put(ctx, "/t/set/d", counter{})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2", attempts)
	}
}

func TestUpdateErrorWritesNothing(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	err := s.Update(ctx, func(tx *state.Tx) error {
		_ = tx.Put("/t/a", counter{N: 1})
		return fmt.Errorf("refused")
	})
	if err == nil {
		t.Fatal("expected error")
	}
	kvs, _, _ := s.List(ctx, "/t/")
	if len(kvs) != 0 {
		t.Fatalf("failed update wrote %v", kvs)
	}
}

func TestListWatch(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = s.Put(ctx, "/w/a", counter{N: 1})
	snap := make(chan int, 4)
	evs := make(chan state.Event, 16)
	go s.ListWatch(ctx, "/w/", state.WatchHandler{
		Snapshot: func(kvs []state.KV, _ int64) { snap <- len(kvs) },
		Event:    func(ev state.Event) { evs <- ev },
	})
	if n := <-snap; n != 1 {
		t.Fatalf("snapshot has %d keys", n)
	}
	_ = s.Put(ctx, "/w/b", counter{N: 2})
	_, _ = s.Delete(ctx, "/w/a")
	for _, want := range []struct {
		typ state.EventType
		key string
	}{{state.EventPut, "/w/b"}, {state.EventDelete, "/w/a"}} {
		select {
		case ev := <-evs:
			if ev.Type != want.typ || ev.Key != want.key {
				t.Fatalf("event %v %s, want %v %s", ev.Type, ev.Key, want.typ, want.key)
			}
			if ev.Type == state.EventDelete && len(ev.PrevValue) == 0 {
				t.Fatal("delete event without previous value")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event")
		}
	}
}

// A key read inside a transaction and deleted by someone else before the commit must
// make the transaction retry (etcd compares a missing key's ModRevision as 0, so a
// "not newer than the snapshot" guard alone would let the stale write through).
func TestUpdateRetriesWhenReadKeyDeleted(t *testing.T) {
	for _, viaList := range []bool{false, true} {
		t.Run(fmt.Sprintf("list=%v", viaList), func(t *testing.T) {
			s, _ := statetest.Store(t)
			ctx := context.Background()
			if err := s.Put(ctx, "/d/net", counter{N: 1}); err != nil {
				t.Fatal(err)
			}
			attempts := 0
			err := s.Update(ctx, func(tx *state.Tx) error {
				attempts++
				exists := false
				if viaList {
					kvs, err := tx.List("/d/")
					if err != nil {
						return err
					}
					exists = len(kvs) == 1
				} else {
					var c counter
					found, err := tx.Get("/d/net", &c)
					if err != nil {
						return err
					}
					exists = found
				}
				if attempts == 1 {
					if _, err := s.Delete(ctx, "/d/net"); err != nil {
						return err
					}
				}
				if !exists {
					return nil // the network is gone: nothing to write
				}
				return tx.Put("/e/ep-on-net", counter{N: 1})
			})
			if err != nil {
				t.Fatal(err)
			}
			if attempts != 2 {
				t.Fatalf("attempts = %d, want 2 (the delete must abort the first commit)", attempts)
			}
			if kvs, _, _ := s.List(ctx, "/e/"); len(kvs) != 0 {
				t.Fatalf("stale write committed: %v", kvs)
			}
		})
	}
}

// A key that was absent when read must abort the commit if someone creates it meanwhile.
func TestUpdateRetriesWhenAbsentKeyCreated(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	attempts := 0
	err := s.Update(ctx, func(tx *state.Tx) error {
		attempts++
		var c counter
		found, err := tx.Get("/a/tag-100", &c)
		if err != nil {
			return err
		}
		if attempts == 1 {
			if err := s.Put(ctx, "/a/tag-100", counter{N: 7}); err != nil {
				return err
			}
		}
		if found {
			return nil
		}
		return tx.Put("/a/tag-100", counter{N: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	var c counter
	if err := s.Get(ctx, "/a/tag-100", &c); err != nil || c.N != 7 || attempts != 2 {
		t.Fatalf("tag = %d (%v) after %d attempts; the other writer's claim must win", c.N, err, attempts)
	}
}

// TestTxnTooLarge: a change with more operations than etcd's --max-txn-ops fails with
// ErrTxnTooLarge (a size limit the API turns into 413, not a 500) and writes nothing.
func TestTxnTooLarge(t *testing.T) {
	cu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	srv, err := etcdembed.Start(context.Background(), etcdembed.Config{DataDir: t.TempDir(), ClientURL: cu, PeerURL: pu, MaxTxnOps: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s, err := state.Open(context.Background(), []string{cu})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Update(context.Background(), func(tx *state.Tx) error {
		for i := 0; i < 40; i++ {
			if err := tx.Put(fmt.Sprintf("/big/%d", i), i); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, state.ErrTxnTooLarge) {
		t.Fatalf("40 writes with --max-txn-ops 16: %v", err)
	}
	// Beyond what the client sends in one message (gRPC's 2 MiB), and beyond etcd's request
	// size (1.5 MiB by default): the same error.
	for _, n := range []int{2, 4} {
		err = s.Update(context.Background(), func(tx *state.Tx) error {
			for i := 0; i < n; i++ {
				if err := tx.Put(fmt.Sprintf("/big/large-%d", i), strings.Repeat("x", 800<<10)); err != nil {
					return err
				}
			}
			return nil
		})
		if !errors.Is(err, state.ErrTxnTooLarge) {
			t.Fatalf("%d × 800 KiB in one change: %v", n, err)
		}
	}
	kvs, _, err := s.List(context.Background(), "/big/")
	if err != nil || len(kvs) != 0 {
		t.Fatalf("refused change left %d keys (%v)", len(kvs), err)
	}
}

// DeletePrefix removes any number of keys in one operation; reads of the same transaction
// see them gone, and a write under the deleted prefix is refused instead of failing at etcd.
func TestDeletePrefix(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		if err := s.Put(ctx, fmt.Sprintf("/dp/a/%03d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(ctx, "/dp/b", 1); err != nil {
		t.Fatal(err)
	}
	err := s.Update(ctx, func(tx *state.Tx) error {
		if err := tx.Put("/dp/a/new", 1); err != nil {
			return err
		}
		tx.DeletePrefix("/dp/a/")
		var v int
		if found, err := tx.Get("/dp/a/007", &v); err != nil || found {
			return fmt.Errorf("get after DeletePrefix: found %v, %v", found, err)
		}
		if kvs, err := tx.List("/dp/"); err != nil || len(kvs) != 1 || kvs[0].Key != "/dp/b" {
			return fmt.Errorf("list after DeletePrefix: %v, %v", kvs, err)
		}
		if err := tx.Put("/dp/a/again", 2); err == nil {
			return errors.New("put under a deleted prefix accepted")
		}
		tx.Delete("/dp/a/001") // already covered: no second operation
		return tx.Put("/dp/c", 3)
	})
	if err != nil {
		t.Fatal(err)
	}
	kvs, _, err := s.List(ctx, "/dp/")
	if err != nil || len(kvs) != 2 || kvs[0].Key != "/dp/b" || kvs[1].Key != "/dp/c" {
		t.Fatalf("after commit: %v, %v", kvs, err)
	}
}

// TestTxChangesAndBefore: Changes lists a transaction's buffered writes (puts and deletes,
// sorted) and deleted prefixes; Before reads keys as they were in its snapshot whatever it
// wrote since, in batches past the batch size, and leaves absent keys out.
func TestTxChangesAndBefore(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	var keys []string
	for i := 0; i < 105; i++ {
		k := fmt.Sprintf("/t/k%03d", i)
		keys = append(keys, k)
		if err := s.Put(ctx, k, i); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Update(ctx, func(tx *state.Tx) error {
		if _, err := tx.Get("/t/k000", new(int)); err != nil {
			return err
		}
		if err := tx.Put("/t/k001", 99); err != nil {
			return err
		}
		tx.Delete("/t/k002")
		if err := tx.Put("/t/new", 1); err != nil {
			return err
		}
		tx.DeletePrefix("/u/")
		changes, dels := tx.Changes()
		want := []state.Change{{Key: "/t/k001", Value: []byte("99")}, {Key: "/t/k002", Deleted: true}, {Key: "/t/new", Value: []byte("1")}}
		if len(changes) != len(want) || len(dels) != 1 || dels[0] != "/u/" {
			t.Fatalf("changes %+v, deleted prefixes %v", changes, dels)
		}
		for i := range want {
			if changes[i].Key != want[i].Key || string(changes[i].Value) != string(want[i].Value) || changes[i].Deleted != want[i].Deleted {
				t.Errorf("change %d: %+v, want %+v", i, changes[i], want[i])
			}
		}
		before, err := tx.Before(append(keys, "/t/new"))
		if err != nil {
			return err
		}
		if len(before) != len(keys) || string(before["/t/k001"]) != "1" || string(before["/t/k002"]) != "2" ||
			string(before[keys[len(keys)-1]]) != fmt.Sprint(len(keys)-1) {
			t.Errorf("before: %d keys, k001=%s k002=%s", len(before), before["/t/k001"], before["/t/k002"])
		}
		return errors.New("abort")
	})
	if err == nil || err.Error() != "abort" {
		t.Fatal(err)
	}
}

// TestListUnguarded: ListUnguarded sees the snapshot and the transaction's own writes
// like List, but a change under its prefix after the read does not make the commit retry
// (a guard read in the same transaction still does).
func TestListUnguarded(t *testing.T) {
	s, _ := statetest.Store(t)
	ctx := context.Background()
	for _, k := range []string{"/l/a", "/l/b"} {
		if err := s.Put(ctx, k, 1); err != nil {
			t.Fatal(err)
		}
	}
	runs := 0
	err := s.Update(ctx, func(tx *state.Tx) error {
		runs++
		if err := tx.Put("/l/c", 3); err != nil {
			return err
		}
		kvs, err := tx.ListUnguarded("/l/")
		if err != nil {
			return err
		}
		if len(kvs) != 3 || kvs[2].Key != "/l/c" {
			t.Errorf("listed %+v, want a, b and the own write c", kvs)
		}
		if runs == 1 { // a concurrent writer under the prefix
			if err := s.Put(ctx, "/l/a", 2); err != nil {
				return err
			}
			if _, err := s.Delete(ctx, "/l/b"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || runs != 1 {
		t.Fatalf("unguarded listing: %v after %d runs, want one", err, runs)
	}
	runs = 0
	err = s.Update(ctx, func(tx *state.Tx) error {
		runs++
		if _, err := tx.ListUnguarded("/l/"); err != nil {
			return err
		}
		if _, err := tx.Get("/g", new(int)); err != nil {
			return err
		}
		if runs == 1 {
			if err := s.Put(ctx, "/g", 1); err != nil {
				return err
			}
		}
		return tx.Put("/l/d", 4)
	})
	if err != nil || runs != 2 {
		t.Fatalf("with a guarded read changed: %v after %d runs, want two", err, runs)
	}
	// KeysUnguarded: the keys only, no guard (Guards counts them: List adds one per key
	// and one for the prefix).
	runs = 0
	err = s.Update(ctx, func(tx *state.Tx) error {
		runs++
		kvs, err := tx.KeysUnguarded("/l/")
		if err != nil {
			return err
		}
		if len(kvs) != 3 || kvs[0].Key != "/l/a" || kvs[0].Value != nil || tx.Guards() != 0 {
			t.Errorf("keys %+v with %d guards, want a, c and d without values or guards", kvs, tx.Guards())
		}
		if _, err := tx.List("/l/"); err != nil || tx.Guards() != 4 {
			t.Errorf("a guarded listing of 3 keys: %d guards (%v), want 4", tx.Guards(), err)
		}
		return nil
	})
	if err != nil || runs != 1 {
		t.Fatalf("unguarded keys: %v after %d runs, want one", err, runs)
	}
}

// TestListWatchHealth: a watch whose connection to etcd is lost is resumed by the client
// by itself and is silent meanwhile, as an idle watch is: only WatchHandler.Health tells
// them apart. Idle and connected, the watch stays healthy (etcd answers its progress
// requests), also beside another watch of the same client that etcd would not answer
// progress for (it starts past etcd's revision); etcd cut off (a proxy closing every connection), Health hears an error
// within two periods; etcd back, nil again, and a change made meanwhile arrives.
func TestListWatchHealth(t *testing.T) {
	direct, url := statetest.Store(t)
	proxy := statetest.NewProxy(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := state.Open(ctx, []string{proxy.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Another watch of this client, started past etcd's revision (nothing written
	// since): etcd answers no progress request on a stream holding such a watch.
	other := make(chan struct{})
	go func() {
		defer close(other)
		_ = s.ListWatch(ctx, "/o/", state.WatchHandler{})
	}()
	defer func() { cancel(); <-other }()
	time.Sleep(100 * time.Millisecond)
	health := make(chan error, 64)
	evs := make(chan state.Event, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.ListWatch(ctx, "/h/", state.WatchHandler{
			Event:       func(ev state.Event) { evs <- ev },
			Health:      func(err error) { health <- err },
			HealthEvery: 100 * time.Millisecond,
		})
	}()
	defer func() { cancel(); <-done }()
	next := func(what string) error {
		t.Helper()
		select {
		case err := <-health:
			return err
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Health not called", what)
			return nil
		}
	}
	if err := next("start"); err != nil {
		t.Fatalf("healthy watch reported %v", err)
	}
	select {
	case err := <-health:
		t.Fatalf("an idle, connected watch reported %v", err)
	case <-time.After(600 * time.Millisecond):
	}
	proxy.Cut()
	start := time.Now()
	if err := next("etcd cut off"); err == nil {
		t.Fatal("watch cut off from etcd reported healthy")
	} else {
		t.Logf("cut off: %v after %s", err, time.Since(start).Round(time.Millisecond))
	}
	if err := direct.Put(ctx, "/h/x", counter{N: 1}); err != nil {
		t.Fatal(err)
	}
	proxy.Mend()
	for {
		if err := next("etcd back"); err == nil {
			break
		}
	}
	select {
	case ev := <-evs:
		if ev.Key != "/h/x" {
			t.Fatalf("event %s, want /h/x", ev.Key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("change made while cut off not delivered")
	}
}

// TestListWatchOneTransaction: the events of one transaction share one revision, and each
// is delivered, with and without Health (a watch that skipped what it had seen by the last
// event's revision delivered the first key of a transaction only: an agent missed a rule
// written with its policy).
func TestListWatchOneTransaction(t *testing.T) {
	s, _ := statetest.Store(t)
	for _, withHealth := range []bool{false, true} {
		t.Run(fmt.Sprintf("health=%v", withHealth), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			prefix := fmt.Sprintf("/tx%v/", withHealth)
			snap := make(chan struct{}, 1)
			evs := make(chan state.Event, 16)
			h := state.WatchHandler{
				Snapshot: func([]state.KV, int64) { snap <- struct{}{} },
				Event:    func(ev state.Event) { evs <- ev },
			}
			if withHealth {
				h.Health = func(error) {}
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = s.ListWatch(ctx, prefix, h) }()
			defer func() { cancel(); <-done }()
			<-snap
			if _, err := s.Client().Txn(ctx).Then(
				clientv3.OpPut(prefix+"a", "1"), clientv3.OpPut(prefix+"b", "2"), clientv3.OpPut(prefix+"c", "3")).Commit(); err != nil {
				t.Fatal(err)
			}
			var got []string
			for len(got) < 3 {
				select {
				case ev := <-evs:
					got = append(got, ev.Key)
				case <-time.After(5 * time.Second):
					t.Fatalf("events of one transaction: got %v, want %sa, %sb and %sc", got, prefix, prefix, prefix)
				}
			}
		})
	}
}
