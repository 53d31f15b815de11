package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// DefaultServiceTTL is the lease TTL of a service registration (Contiv: 10 s).
const DefaultServiceTTL = 10 * time.Second

// ServiceInfo is Contiv's objdb.ServiceInfo; the JSON keys are the Go field names.
type ServiceInfo struct {
	ServiceName string
	Role        string
	Version     string
	TTL         int // seconds
	HostAddr    string
	Port        int
	Hostname    string
}

// Key is the registration key /contiv.io/service/<ServiceName>/<HostAddr>:<Port>.
func (s ServiceInfo) Key() string {
	return ServiceKey(s.ServiceName, s.HostAddr, s.Port)
}

// Addr is "<HostAddr>:<Port>".
func (s ServiceInfo) Addr() string { return net.JoinHostPort(s.HostAddr, strconv.Itoa(s.Port)) }

// ServiceKey builds /contiv.io/service/<name>/<hostAddr>:<port>.
func ServiceKey(name, hostAddr string, port int) string {
	return state.ServicePrefix + name + "/" + hostAddr + ":" + strconv.Itoa(port)
}

func servicePrefix(name string) string { return state.ServicePrefix + name + "/" }

func (s ServiceInfo) validate() error {
	switch {
	case s.ServiceName == "":
		return errors.New("ServiceName is empty")
	case strings.Contains(s.ServiceName, "/"):
		return fmt.Errorf("ServiceName %q contains '/'", s.ServiceName)
	case s.HostAddr == "":
		return errors.New("HostAddr is empty")
	case s.Port <= 0 || s.Port > 65535:
		return fmt.Errorf("Port %d out of range 1-65535", s.Port)
	}
	return nil
}

// Registration keeps one service key alive on a lease. If the lease is lost (etcd down
// longer than the TTL, etcd data wiped and restarted, lease revoked by an operator) it
// registers again with a new lease, backing off while etcd is unreachable.
type Registration struct {
	cli    *clientv3.Client
	ttl    int64
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	info  ServiceInfo
	lease clientv3.LeaseID
	kick  chan struct{} // re-put now (info changed)
}

// Register writes info at its key on a lease of ttl (default DefaultServiceTTL, at least
// 2 s) and keeps it alive until ctx ends or Close is called. info.TTL is set to ttl in
// seconds. The first write must succeed; later losses are repaired in the background.
func Register(ctx context.Context, store *state.Store, info ServiceInfo, ttl time.Duration) (*Registration, error) {
	if store == nil {
		return nil, errors.New("register service: store is nil")
	}
	if err := info.validate(); err != nil {
		return nil, fmt.Errorf("register service: %w", err)
	}
	if ttl == 0 {
		ttl = DefaultServiceTTL
	}
	if ttl < 2*time.Second {
		return nil, fmt.Errorf("register service %s: TTL %s too short (etcd leases need at least 2s)", info.ServiceName, ttl)
	}
	secs := int64(math.Ceil(ttl.Seconds()))
	info.TTL = int(secs)
	rctx, cancel := context.WithCancel(ctx)
	r := &Registration{
		cli: store.Client(), ttl: secs, cancel: cancel, done: make(chan struct{}),
		info: info, kick: make(chan struct{}, 1),
		log: slog.With("service", info.ServiceName, "key", info.Key()),
	}
	leaseLost, err := r.put(rctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("register service %s: %w", info.Key(), err)
	}
	go r.keep(rctx, leaseLost)
	return r, nil
}

// Info returns the registered record.
func (r *Registration) Info() ServiceInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info
}

// SetRole changes the Role field (e.g. netmaster "leader"/"follower") and rewrites the key
// on the same lease.
func (r *Registration) SetRole(ctx context.Context, role string) error {
	r.mu.Lock()
	r.info.Role = role
	info, lease := r.info, r.lease
	r.mu.Unlock()
	b, _ := json.Marshal(info)
	if lease != 0 {
		if _, err := r.cli.Put(ctx, info.Key(), string(b), clientv3.WithLease(lease)); err == nil {
			return nil
		}
	}
	select { // the keeper retries with a fresh lease
	case r.kick <- struct{}{}:
	default:
	}
	return nil
}

// Close stops the keepalive and deletes the registration (revokes its lease).
func (r *Registration) Close(ctx context.Context) error {
	r.cancel()
	<-r.done
	r.mu.Lock()
	lease := r.lease
	r.lease = 0
	key := r.info.Key()
	r.mu.Unlock()
	if lease == 0 {
		return nil
	}
	ctx, c := context.WithTimeout(ctx, 2*time.Second)
	defer c()
	if _, err := r.cli.Revoke(ctx, lease); err != nil {
		return fmt.Errorf("unregister %s: revoke lease: %w", key, err)
	}
	return nil
}

// put grants a lease, writes the key on it and starts its keepalive. The returned channel
// closes when the lease is lost.
func (r *Registration) put(ctx context.Context) (<-chan struct{}, error) {
	lg, err := r.cli.Grant(ctx, r.ttl)
	if err != nil {
		return nil, fmt.Errorf("grant %ds lease: %w", r.ttl, err)
	}
	r.mu.Lock()
	info := r.info
	r.mu.Unlock()
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", info.Key(), err)
	}
	if _, err := r.cli.Put(ctx, info.Key(), string(b), clientv3.WithLease(lg.ID)); err != nil {
		_, _ = r.cli.Revoke(context.WithoutCancel(ctx), lg.ID)
		return nil, fmt.Errorf("put %s: %w", info.Key(), err)
	}
	ka, err := r.cli.KeepAlive(ctx, lg.ID)
	if err != nil {
		return nil, fmt.Errorf("keep lease alive: %w", err)
	}
	r.mu.Lock()
	old := r.lease
	r.lease = lg.ID
	r.mu.Unlock()
	if old != 0 && old != lg.ID {
		_, _ = r.cli.Revoke(context.WithoutCancel(ctx), old)
	}
	lost := make(chan struct{})
	go func() {
		for range ka { //nolint:revive // drain
		}
		close(lost)
	}()
	return lost, nil
}

func (r *Registration) keep(ctx context.Context, leaseLost <-chan struct{}) {
	defer close(r.done)
	wait := retry.New(200*time.Millisecond, 5*time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-leaseLost:
			r.log.Warn("registration lease lost, registering again")
		case <-r.kick:
		}
		for {
			lost, err := r.put(ctx)
			if err == nil {
				leaseLost = lost
				wait.Reset()
				break
			}
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("re-register failed, retrying", "err", err)
			if !wait.Wait(ctx) {
				return
			}
		}
	}
}

// ListServices returns every registration of service name, sorted by key.
func ListServices(ctx context.Context, store *state.Store, name string) ([]ServiceInfo, error) {
	return listServices(ctx, store, name, false)
}

// listServices is ListServices; keyed leaves out registrations whose value names another
// service, address or port than their key (etcd RBAC confines an agent to the keys it
// enrolled, not to what it writes in them).
func listServices(ctx context.Context, store *state.Store, name string, keyed bool) ([]ServiceInfo, error) {
	kvs, _, err := store.List(ctx, servicePrefix(name))
	if err != nil {
		return nil, fmt.Errorf("list service %s: %w", name, err)
	}
	out := make([]ServiceInfo, 0, len(kvs))
	for _, kv := range kvs {
		var si ServiceInfo
		if err := kv.Decode(&si); err != nil {
			return nil, err
		}
		if keyed && si.Key() != kv.Key {
			continue
		}
		out = append(out, si)
	}
	return out, nil
}

// ServiceEventType says whether a registration appeared (or changed) or went away.
type ServiceEventType int

// Service event types.
const (
	ServiceAdded ServiceEventType = iota
	ServiceRemoved
)

func (t ServiceEventType) String() string {
	if t == ServiceRemoved {
		return "removed"
	}
	return "added"
}

// ServiceEvent is one change to the registrations of a service.
type ServiceEvent struct {
	Type ServiceEventType
	Info ServiceInfo
}

// WatchServices calls fn for every registration of service name that exists now (Added),
// then for every later change: Added when a key appears or its content changes, Removed
// (with the last known record) when it is deleted or its lease expires. Lease keepalives
// produce no events. It survives etcd disconnects (resuming without losing changes) and
// blocks until ctx ends. fn is called from one goroutine, in order.
func WatchServices(ctx context.Context, store *state.Store, name string, fn func(ServiceEvent)) error {
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("watch services: invalid service name %q", name)
	}
	known := map[string]ServiceInfo{}
	decode := func(key string, b []byte) (ServiceInfo, bool) {
		var si ServiceInfo
		if err := json.Unmarshal(b, &si); err != nil {
			slog.Warn("ignoring undecodable service registration", "key", key, "err", err)
			return si, false
		}
		return si, true
	}
	return store.ListWatch(ctx, servicePrefix(name), state.WatchHandler{
		Snapshot: func(kvs []state.KV, _ int64) {
			seen := map[string]bool{}
			for _, kv := range kvs {
				si, ok := decode(kv.Key, kv.Value)
				if !ok {
					continue
				}
				seen[kv.Key] = true
				if old, had := known[kv.Key]; had && old == si {
					continue
				}
				known[kv.Key] = si
				fn(ServiceEvent{Type: ServiceAdded, Info: si})
			}
			for k, si := range known {
				if !seen[k] {
					delete(known, k)
					fn(ServiceEvent{Type: ServiceRemoved, Info: si})
				}
			}
		},
		Event: func(ev state.Event) {
			if ev.Type == state.EventDelete {
				si, had := known[ev.Key]
				if !had {
					if si2, ok := decode(ev.Key, ev.PrevValue); ok {
						si, had = si2, true
					}
				}
				delete(known, ev.Key)
				if had {
					fn(ServiceEvent{Type: ServiceRemoved, Info: si})
				}
				return
			}
			si, ok := decode(ev.Key, ev.Value)
			if !ok {
				return
			}
			if old, had := known[ev.Key]; had && old == si {
				return
			}
			known[ev.Key] = si
			fn(ServiceEvent{Type: ServiceAdded, Info: si})
		},
	})
}
