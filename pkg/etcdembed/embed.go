// Package etcdembed runs an in-process etcd server (go.etcd.io/etcd/server/v3/embed) for
// netmaster's default single-node mode and for tests. It owns the server's data directory
// and listeners; it knows nothing about Contiv keys.
package etcdembed

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config says where the embedded etcd keeps data and listens.
type Config struct {
	DataDir   string // e.g. /var/lib/contiv/etcd
	ClientURL string // e.g. http://127.0.0.1:2379
	PeerURL   string // default: client port + 1 on the same host
	Name      string // member name, default "netmaster"
}

// Server is a running embedded etcd.
type Server struct {
	etcd      *embed.Etcd
	clientURL string
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
		peer = fmt.Sprintf("http://%s:%d", cu.Hostname(), p+1)
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
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
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
	return &Server{etcd: e, clientURL: c.ClientURL}, nil
}

// ClientURL is the URL clients dial.
func (s *Server) ClientURL() string { return s.clientURL }

// Close stops the server.
func (s *Server) Close() { s.etcd.Close() }
