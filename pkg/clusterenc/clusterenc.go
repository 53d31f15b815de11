// Package clusterenc follows the cluster's encryption setting (the global object's
// "encryption", `netctl global set --encryption`, copied by netmaster into the global
// config) on a running netplugin, which took its mode at start: --encryption when given,
// else the setting as it was then (Decide). A change at runtime is not applied live: the
// host reports in /healthz and a metric that it runs otherwise than the cluster says and
// that a restart applies it. Switching on never leaves a window in clear: a host that
// follows the setting and runs without encryption blocks its overlay traffic to other
// hosts (wgsteer.Block) as soon as the setting says wireguard, until it restarts with
// encryption or the setting turns back (docs/encryption.md).
package clusterenc

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Of is the mode the global config g asks for ("" from a netmaster before the setting:
// none).
func Of(g model.GlobConfig) string {
	if g.Encryption == "" {
		return model.EncryptionNone
	}
	return g.Encryption
}

// Decide is the mode a netplugin starts with: its --encryption flag when given (set),
// else the cluster's setting in g.
func Decide(flag string, set bool, g model.GlobConfig) string {
	if set {
		return flag
	}
	return Of(g)
}

// Watcher streams a key's changes (state.Store).
type Watcher interface {
	ListWatch(ctx context.Context, prefix string, h state.WatchHandler) error
}

// Config is what a Follower needs.
type Config struct {
	// Running is the mode this host runs (Decide at start).
	Running string
	// Follows says the host was started without --encryption: it follows the setting,
	// so a setting of wireguard while it runs none blocks its overlay traffic. With the
	// flag the host keeps the flag's meaning and only reports the difference.
	Follows bool
	// Block stops every locally sent overlay packet to other hosts (wgsteer.Block);
	// Unblock lets them go again (wgsteer.Uninstall).
	Block, Unblock func() error
	// RetryEvery is how often a Block or Unblock that failed is tried again while no new
	// config comes (default 5 s): a failed block leaves the host sending in clear.
	RetryEvery time.Duration
	Log        *slog.Logger
}

// Follower applies each global config to this host's state (Apply); Run feeds it.
type Follower struct {
	cfg Config

	mu      sync.Mutex
	cluster string // the setting last seen ("" none seen)
	blocked bool
	err     error // the last Block or Unblock's
}

// New is a Follower of cfg.
func New(cfg Config) *Follower {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = 5 * time.Second
	}
	return &Follower{cfg: cfg}
}

// Run follows the global config by one etcd watch until ctx ends, and tries a failed
// Block or Unblock again every RetryEvery. A deleted record changes nothing (the last
// setting stands).
func (f *Follower) Run(ctx context.Context, w Watcher) error {
	go f.retry(ctx)
	apply := func(key string, val []byte) {
		if key != state.GlobalConfigKey {
			return
		}
		var g model.GlobConfig
		if err := (state.KV{Key: key, Value: val}).Decode(&g); err != nil {
			f.cfg.Log.Warn("global config unreadable: the encryption setting is not followed", "err", err)
			return
		}
		f.Apply(g)
	}
	return w.ListWatch(ctx, state.GlobalConfigKey, state.WatchHandler{
		Snapshot: func(kvs []state.KV, _ int64) {
			for _, kv := range kvs {
				apply(kv.Key, kv.Value)
			}
		},
		Event: func(ev state.Event) {
			if ev.Type != state.EventDelete {
				apply(ev.Key, ev.Value)
			}
		},
	})
}

// retry runs sync again every RetryEvery while the last one failed, until ctx ends.
func (f *Follower) retry(ctx context.Context) {
	t := time.NewTicker(f.cfg.RetryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.mu.Lock()
		if f.err != nil {
			f.sync()
		}
		f.mu.Unlock()
	}
}

// Apply takes the global config g: the setting is recorded, and a host that follows it
// and runs without encryption blocks its overlay traffic while the setting says
// wireguard or a mode this build does not know (a failed block is retried at the next config and said in Degraded).
func (f *Follower) Apply(g model.GlobConfig) {
	cluster := Of(g)
	f.mu.Lock()
	defer f.mu.Unlock()
	if cluster != f.cluster {
		f.cfg.Log.Info("cluster encryption setting", "cluster", cluster, "running", f.cfg.Running, "follows", f.cfg.Follows)
	}
	f.cluster = cluster
	f.sync()
}

// sync brings the block to what f.cluster asks for (f.mu held).
func (f *Follower) sync() {
	cluster := f.cluster
	// (Any setting but none asks for encryption: one this build does not know, a newer
	// netmaster's, is blocked for as wireguard is, never run in clear.)
	block := f.cfg.Follows && f.cfg.Running == model.EncryptionNone && cluster != model.EncryptionNone
	if block == f.blocked && f.err == nil {
		return
	}
	op, do := "unblock", f.cfg.Unblock
	if block {
		op, do = "block", f.cfg.Block
	}
	prev := f.err
	f.err = nil
	if err := do(); err != nil {
		f.err = fmt.Errorf("%s overlay traffic to other hosts: %w", op, err)
		if prev == nil || prev.Error() != f.err.Error() { // (not at every retry)
			f.cfg.Log.Error("cluster encryption setting not applied", "err", f.err)
		}
		return
	}
	f.blocked = block
	if block {
		f.cfg.Log.Warn("the cluster's encryption is wireguard, this host runs none: overlay traffic to other hosts is dropped until netplugin restarts and applies it")
	}
}

// Degraded is what /healthz says: "" while this host runs what the cluster says (or no
// setting was seen yet).
func (f *Follower) Degraded() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.err != nil:
		return fmt.Sprintf("encryption: the cluster's setting is %s, this host runs %s, and %v", f.cluster, f.cfg.Running, f.err)
	case f.cluster == "" || f.cluster == f.cfg.Running:
		return ""
	case f.blocked:
		return fmt.Sprintf("encryption: the cluster's setting is %s, this host runs %s: its overlay traffic to other hosts is dropped (fail closed) until netplugin restarts, which applies the setting", f.cluster, f.cfg.Running)
	case !f.cfg.Follows && f.cluster == model.EncryptionNone:
		// The operator's flag encrypts where the cluster does not ask for it: nothing goes
		// in clear, and peers without a key are reported as waiting (wgsteer). Only the
		// metric says the two differ.
		return ""
	case !f.cfg.Follows:
		return fmt.Sprintf("encryption: the cluster's setting is %s, this host runs %s as its --encryption flag says", f.cluster, f.cfg.Running)
	}
	return fmt.Sprintf("encryption: the cluster's setting is %s, this host runs %s: a netplugin restart applies it", f.cluster, f.cfg.Running)
}

var (
	descMismatch = prometheus.NewDesc("contiv_encryption_cluster_mismatch",
		"1 while the cluster's encryption setting (netctl global set --encryption) differs from what this host runs (a netplugin restart applies it, or its --encryption flag overrides it).",
		[]string{"cluster", "running"}, nil)
	descBlocked = prometheus.NewDesc("contiv_encryption_overlay_blocked",
		"1 while this host drops its overlay traffic to other hosts because the cluster's setting says wireguard and it runs without encryption (fail closed until restarted).",
		nil, nil)
)

// Collector exports contiv_encryption_cluster_mismatch{cluster,running} and
// contiv_encryption_overlay_blocked.
func (f *Follower) Collector() prometheus.Collector { return collector{f} }

type collector struct{ f *Follower }

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- descMismatch; ch <- descBlocked }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.f.mu.Lock()
	cluster, blocked := c.f.cluster, c.f.blocked
	c.f.mu.Unlock()
	if cluster == "" {
		cluster = c.f.cfg.Running // (nothing seen yet)
	}
	mismatch, b := 0.0, 0.0
	if cluster != c.f.cfg.Running {
		mismatch = 1
	}
	if blocked {
		b = 1
	}
	ch <- prometheus.MustNewConstMetric(descMismatch, prometheus.GaugeValue, mismatch, cluster, c.f.cfg.Running)
	ch <- prometheus.MustNewConstMetric(descBlocked, prometheus.GaugeValue, b)
}
