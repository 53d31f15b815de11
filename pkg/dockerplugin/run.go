package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/docker/docker/client"

	"github.com/contivbpf/contivbpf/pkg/agent"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// FrontEnd configures netplugin's docker-mode front-end.
type FrontEnd struct {
	Store      *state.Store
	Agent      *agent.Agent
	Master     *masterclient.Client
	PluginDir  string // default /run/docker/plugins
	PluginName string // default netplugin
	DockerHost string // Docker API, e.g. unix:///var/run/docker.sock (default: DOCKER_HOST or the standard socket)
	// SocketGroup may also use the plugin socket (mode 0660); empty: 0600.
	SocketGroup string
}

// Run serves the Docker network and IPAM drivers and keeps the local dockerd's networks in
// sync with etcd until ctx ends. The plugin socket is listening before Run returns
// control to the network sync, and it is removed on exit.
func (f FrontEnd) Run(ctx context.Context) error {
	if f.Store == nil || f.Agent == nil || f.Master == nil {
		return errors.New("docker front-end: Store, Agent and Master are required")
	}
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if f.DockerHost != "" {
		opts = append(opts, client.WithHost(f.DockerHost))
	}
	dc, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return fmt.Errorf("docker front-end: docker client for %q: %w", f.DockerHost, err)
	}
	defer dc.Close()
	syncer, err := NewSyncer(SyncConfig{Store: f.Store, Docker: dc, Master: MasterREST{Master: f.Master}, Name: f.PluginName})
	if err != nil {
		return err
	}
	p, err := New(Config{
		Name: f.PluginName, Dir: f.PluginDir, Store: f.Store, Master: f.Master,
		Endpoints: AgentEndpoints{Agent: f.Agent}, Docker: dc, NetworksChanged: syncer.Trigger, SocketGroup: f.SocketGroup,
		Containers: dc, Updater: f.Master,
	})
	if err != nil {
		return err
	}
	l, err := p.Listen()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errc <- p.ServeListener(ctx, l) }()
	go func() { defer wg.Done(); errc <- syncer.Run(ctx) }()
	err = <-errc
	cancel()
	wg.Wait()
	return err
}
