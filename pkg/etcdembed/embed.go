// Package etcdembed runs an in-process etcd server (go.etcd.io/etcd/server/v3/embed) for
// netmaster's default single-node mode and for tests. It owns the server's data directory
// and listeners; it knows nothing about Contiv keys.
package etcdembed

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config says where the embedded etcd keeps data and listens.
type Config struct {
	DataDir   string // e.g. /var/lib/contiv/etcd
	ClientURL string // e.g. http://127.0.0.1:2379
	PeerURL   string // default: client port + 1 on the same host
	Name      string // member name, default "netmaster"
	// CertFile and KeyFile make the client (and an https peer) listener serve TLS; the
	// client URL must then be https://. ClientCAFile turns on client-certificate
	// authentication: only certificates signed by it may connect.
	CertFile, KeyFile, ClientCAFile string
	// ClientCRLFile is a revocation list of client (and peer) certificates: one list, in
	// DER. etcd reads it at every new connection without checking its signature (the
	// caller hands it a checked copy, tlsconf.CRLCopy): a rewritten list takes effect at
	// once, and a file that cannot be read or parsed (PEM included) refuses every new
	// connection until it is fixed. The client CA is read once.
	ClientCRLFile string
	// MaxTxnOps is the most operations one transaction may hold (0: 8192; etcd's own
	// default of 128 is too small for a policy of more than ~60 rules attached at once).
	MaxTxnOps uint
	// QuotaBytes is the backend quota (0: etcd's default, 2 GiB). Past it etcd raises
	// NOSPACE and refuses writes.
	QuotaBytes int64
}

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	clientURL string
	closing   *atomic.Bool
	closeOnce sync.Once
}

// quietCore drops every log entry once the server is being closed.
type quietCore struct {
	zapcore.Core
	closing *atomic.Bool
}

func (q quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if q.closing.Load() {
		return ce
	}
	return q.Core.Check(e, ce)
}

func (q quietCore) With(f []zapcore.Field) zapcore.Core {
	return quietCore{Core: q.Core.With(f), closing: q.closing}
}

// Start starts etcd and waits until it serves clients or ctx ends.
func Start(ctx context.Context, c Config) (*Server, error) {
	cu, err := url.Parse(c.ClientURL)
	if err != nil || cu.Host == "" {
		return nil, fmt.Errorf("etcd client url %q: invalid", c.ClientURL)
	}
	peer := c.PeerURL
	if peer == "" {
		port := cu.Port()
		var p int
		if _, err := fmt.Sscanf(port, "%d", &p); err != nil || p == 0 {
			return nil, fmt.Errorf("etcd client url %q: needs an explicit port", c.ClientURL)
		}
		scheme := "http"
		if c.CertFile != "" {
			scheme = "https"
		}
		peer = fmt.Sprintf("%s://%s:%d", scheme, cu.Hostname(), p+1)
	}
	pu, err := url.Parse(peer)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url %q: %w", peer, err)
	}
	name := c.Name
	if name == "" {
		name = "netmaster"
	}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = c.DataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", name, pu.String())
	// etcd's own errors reach stderr (JSON lines): a failing store must not go unexplained.
	// Close silences it first: a deliberate stop logs no listener errors.
	closing := new(atomic.Bool)
	lg, err := zap.Config{Level: zap.NewAtomicLevelAt(zap.ErrorLevel), Encoding: "json",
		EncoderConfig: zap.NewProductionEncoderConfig(), OutputPaths: []string{"stderr"}, ErrorOutputPaths: []string{"stderr"}}.Build(
		zap.WrapCore(func(c zapcore.Core) zapcore.Core { return quietCore{Core: c, closing: closing} }))
	if err != nil {
		return nil, fmt.Errorf("embedded etcd logger: %w", err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.LogLevel = "error"
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("embedded etcd: certificate and key must be given together")
	}
	if c.CertFile != "" {
		if cu.Scheme != "https" {
			return nil, fmt.Errorf("embedded etcd: TLS needs an https:// client URL, not %q", c.ClientURL)
		}
		ti := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.ClientCAFile, ClientCertAuth: c.ClientCAFile != "", CRLFile: c.ClientCRLFile}
		cfg.ClientTLSInfo = ti
		if pu.Scheme == "https" {
			cfg.PeerTLSInfo = ti
		}
	} else if cu.Scheme == "https" || c.ClientCAFile != "" || c.ClientCRLFile != "" {
		return nil, fmt.Errorf("embedded etcd: https:// or a client CA needs a certificate and key")
	}
	cfg.QuotaBackendBytes = c.QuotaBytes
	cfg.MaxTxnOps = c.MaxTxnOps
	if cfg.MaxTxnOps == 0 {
		cfg.MaxTxnOps = 8192
	}
	cfg.AutoCompactionMode = "revision"
	cfg.AutoCompactionRetention = "10000"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", c.DataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: %w", ctx.Err())
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("start embedded etcd: not ready after 60s")
	}
	slog.Info("embedded etcd ready", "client-url", c.ClientURL, "data-dir", c.DataDir)
	return &Server{etcd: e, clientURL: c.ClientURL, closing: closing}, nil
}

// ClientURL is the URL clients dial.
func (s *Server) ClientURL() string { return s.clientURL }

// Err delivers a fatal error of the running server (its listeners or storage failed).
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the server; calling it again does nothing.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		s.etcd.Close()
	})
}
