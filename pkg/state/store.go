// Package state owns the etcd-backed store shared by netmaster and netplugin: Contiv's
// /contiv.io/ key layout, typed JSON get/put/delete/list, optimistic compare-and-swap
// transactions and prefix watches that resume after a disconnect.
//
// It knows nothing about REST, netlink or dataplanes; callers bring their own value types.
package state

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// Contiv's key prefixes (see shared/reference/contiv.md section 1).
const (
	BasePath        = "/contiv.io/"
	ModelPrefix     = "/contiv.io/obj/modeldb/"
	StatePrefix     = "/contiv.io/state/"
	OperPrefix      = "/contiv.io/oper/"
	ServicePrefix   = "/contiv.io/service/"
	LockPrefix      = "/contiv.io/lock/"
	GlobalConfigKey = "/contiv.io/master/config/global"
	LeaderLockKey   = "/contiv.io/lock/netmaster/leader"
)

// ModelKey is the key of a model object: /contiv.io/obj/modeldb/<objType>/<objKey>.
func ModelKey(objType, objKey string) string {
	return ModelPrefix + objType + "/" + objKey
}

// ErrNotFound is returned by typed reads of a missing key.
var ErrNotFound = errors.New("key not found")

// Store is a thin typed layer over an etcd v3 client.
type Store struct {
	cli *clientv3.Client
}

// New wraps an existing client. The caller keeps ownership of cli.
func New(cli *clientv3.Client) *Store { return &Store{cli: cli} }

// Option configures Open.
type Option func(*clientv3.Config)

// WithTLS dials etcd over TLS with tc (CA to trust, client certificate for etcd's
// --client-cert-auth); "etcd://" endpoints then mean https.
func WithTLS(tc *tls.Config) Option { return func(c *clientv3.Config) { c.TLS = tc } }

// TLSOptions turns etcd certificate flags (--etcd-cacert/--etcd-cert/--etcd-key) into
// Open options; none when no file is set.
func TLSOptions(f tlsconf.Files) ([]Option, error) {
	if f.Empty() {
		return nil, nil
	}
	tc, err := tlsconf.Client(f, "--etcd-cacert/--etcd-cert/--etcd-key")
	if err != nil {
		return nil, err
	}
	return []Option{WithTLS(tc)}, nil
}

// Open dials the given endpoints ("http://host:port" or "https://..."; "etcd://" is
// accepted as http, or https with WithTLS).
func Open(ctx context.Context, endpoints []string, opts ...Option) (*Store, error) {
	cfg := clientv3.Config{
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Context:              ctx,
	}
	for _, o := range opts {
		o(&cfg)
	}
	scheme := "http://"
	if cfg.TLS != nil {
		scheme = "https://"
	}
	for _, e := range endpoints {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		e = strings.Replace(e, "etcd://", scheme, 1)
		if cfg.TLS != nil && strings.HasPrefix(e, "http://") {
			return nil, fmt.Errorf("open etcd: endpoint %s is plain http but etcd TLS options are set", e)
		}
		cfg.Endpoints = append(cfg.Endpoints, e)
	}
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("open etcd: no endpoints given")
	}
	eps := cfg.Endpoints
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("open etcd %v: %w", eps, err)
	}
	return &Store{cli: cli}, nil
}

// Client exposes the raw client for leases, elections and other etcd features.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Close closes the underlying client.
func (s *Store) Close() error { return s.cli.Close() }

// KV is one stored record: its key, value and the revisions etcd created and last
// modified it at (zero for a value a transaction holds unwritten).
type KV struct {
	Key       string
	Value     []byte
	ModRev    int64
	CreateRev int64
}

func kvOf(kv *mvccpb.KeyValue) KV {
	return KV{Key: string(kv.Key), Value: kv.Value, ModRev: kv.ModRevision, CreateRev: kv.CreateRevision}
}

// Decode unmarshals the record's JSON value into v.
func (kv KV) Decode(v any) error {
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return fmt.Errorf("decode %s: %w", kv.Key, err)
	}
	return nil
}

// Get reads key and decodes its JSON into v. It returns ErrNotFound when the key is absent.
func (s *Store) Get(ctx context.Context, key string, v any) error {
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, v); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

// Put encodes v as JSON and writes it at key.
func (s *Store) Put(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if _, err := s.cli.Put(ctx, key, string(b)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// PutLease writes v at key attached to an existing lease.
func (s *Store) PutLease(ctx context.Context, key string, v any, lease clientv3.LeaseID) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if _, err := s.cli.Put(ctx, key, string(b), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Delete removes key; it reports whether the key existed.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	resp, err := s.cli.Delete(ctx, key)
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", key, err)
	}
	return resp.Deleted > 0, nil
}

// List returns every record under prefix, sorted by key, and the store revision it was read at.
func (s *Store) List(ctx context.Context, prefix string) ([]KV, int64, error) {
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", prefix, err)
	}
	out := make([]KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, kvOf(kv))
	}
	return out, resp.Header.Revision, nil
}

// ListJSON lists prefix and decodes every value as T, keyed by the full key.
func ListJSON[T any](ctx context.Context, s *Store, prefix string) (map[string]T, error) {
	kvs, _, err := s.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]T, len(kvs))
	for _, kv := range kvs {
		var v T
		if err := kv.Decode(&v); err != nil {
			return nil, err
		}
		out[kv.Key] = v
	}
	return out, nil
}

// Health is what etcd says about itself, as seen through this client.
type Health struct {
	// Reachable is true when at least one endpoint answered Status.
	Reachable bool
	// Err is the last Status error (when an endpoint did not answer).
	Err error
	// DBSize and DBSizeInUse are the largest backend sizes among the members (bytes).
	DBSize, DBSizeInUse int64
	// Alarms are the active alarms ("NOSPACE on member 8e9e05c52164694d", ...).
	Alarms []string
}

// Health asks every endpoint for its status and the cluster for its alarms.
func (s *Store) Health(ctx context.Context) Health {
	var h Health
	for _, ep := range s.cli.Endpoints() {
		st, err := s.cli.Status(ctx, ep)
		if err != nil {
			h.Err = fmt.Errorf("etcd %s: %w", ep, err)
			continue
		}
		h.Reachable = true
		h.DBSize = max(h.DBSize, st.DbSize)
		h.DBSizeInUse = max(h.DBSizeInUse, st.DbSizeInUse)
	}
	if !h.Reachable {
		return h
	}
	if resp, err := s.cli.AlarmList(ctx); err != nil {
		h.Err = fmt.Errorf("etcd alarms: %w", err)
	} else {
		for _, a := range resp.Alarms {
			h.Alarms = append(h.Alarms, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
		}
	}
	return h
}

// Reclaimed is what Reclaim did.
type Reclaimed struct {
	// Compacted is the revision history was compacted to (0: none; only with NOSPACE).
	Compacted int64
	// Defragmented are the endpoints whose backend file was defragmented.
	Defragmented []string
	// Disarmed says the NOSPACE alarm was lifted.
	Disarmed bool
	// StillFull is set when NOSPACE stays: after compaction and defragmentation a member's
	// backend still holds more than roomFraction of the quota (live data, not history).
	StillFull bool
}

// roomFraction is the share of the quota a member's backend must be below before Reclaim
// lifts NOSPACE: with less room the alarm would come straight back. Past historyFraction
// of the quota in use, Reclaim compacts the history ahead of the alarm: auto-compaction
// keeps 10,000 revisions, far more than the room left under churn.
const (
	roomFraction    = 0.75
	historyFraction = 0.6
)

// Reclaim returns space to etcd (netmaster's embedded one; an external cluster is its
// operators'): every endpoint whose backend file holds at least minWaste bytes no longer
// in use (freed by compaction, kept in the file until a defragmentation) is defragmented.
// Under the NOSPACE alarm, where etcd takes only reads and deletes, the history is first
// compacted to the current revision (what deleted objects still hold goes; watchers
// re-list, ErrCompacted), every endpoint is defragmented, and once each member's backend
// is below roomFraction of quota the alarm is lifted: a cluster filled by a caller and
// cleaned up by deletes comes back without an operator. Defragmenting blocks that member's
// reads and writes for its duration; callers run it rarely and on one node.
func (s *Store) Reclaim(ctx context.Context, quota, minWaste int64) (Reclaimed, error) {
	var r Reclaimed
	alarms, err := s.cli.AlarmList(ctx)
	if err != nil {
		return r, fmt.Errorf("etcd alarms: %w", err)
	}
	var nospace []*etcdserverpb.AlarmMember
	for _, a := range alarms.Alarms {
		if a.Alarm == etcdserverpb.AlarmType_NOSPACE {
			nospace = append(nospace, a)
		}
	}
	compact := len(nospace) > 0
	if !compact && quota > 0 {
		for _, ep := range s.cli.Endpoints() {
			if st, err := s.cli.Status(ctx, ep); err == nil && float64(st.DbSizeInUse) > historyFraction*float64(quota) {
				compact = true
			}
		}
		if compact {
			// What the compaction frees stays in the file, which the quota measures:
			// defragmented once it is an eighth of the quota.
			minWaste = min(minWaste, quota/8)
		}
	}
	if compact {
		rev := alarms.Header.Revision
		if _, err := s.cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			return r, fmt.Errorf("compact etcd to revision %d: %w", rev, err)
		}
		r.Compacted = rev
	}
	// Under NOSPACE a defragmentation is worth its pause (it blocks the reads etcd still
	// serves) only when it gives back a sixteenth of the quota: not again and again over
	// live data that fills it.
	if len(nospace) > 0 && quota > 0 {
		minWaste = min(minWaste, quota/16)
	}
	for _, ep := range s.cli.Endpoints() {
		st, err := s.cli.Status(ctx, ep)
		if err != nil {
			return r, fmt.Errorf("etcd %s status: %w", ep, err)
		}
		if st.DbSize-st.DbSizeInUse < minWaste {
			continue
		}
		if _, err := s.cli.Defragment(ctx, ep); err != nil {
			return r, fmt.Errorf("defragment etcd %s: %w", ep, err)
		}
		r.Defragmented = append(r.Defragmented, ep)
	}
	if len(nospace) == 0 {
		return r, nil
	}
	for _, ep := range s.cli.Endpoints() {
		st, err := s.cli.Status(ctx, ep)
		if err != nil {
			return r, fmt.Errorf("etcd %s status: %w", ep, err)
		}
		if quota <= 0 || float64(st.DbSize) > roomFraction*float64(quota) {
			r.StillFull = true
			return r, nil
		}
	}
	for _, a := range nospace {
		if _, err := s.cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			return r, fmt.Errorf("lift etcd's NOSPACE alarm of member %x: %w", a.MemberID, err)
		}
	}
	r.Disarmed = true
	return r, nil
}
