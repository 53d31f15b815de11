package dockerplugin

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// Docker's endpoint requests carry no container name. Once a container joined, the plugin
// looks it up through the Docker API and tells netmaster its name and labels
// (/plugin/updateEndpoint "start", as Contiv's plugin did on container start): the name is
// what the DNS responders answer, the labels select service providers.

// ContainerLister lists Docker containers (*client.Client satisfies it).
type ContainerLister interface {
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
}

// EndpointUpdater reports a started container to netmaster (*masterclient.Client).
type EndpointUpdater interface {
	UpdateEndpoint(ctx context.Context, req model.UpdateEndpointRequest) error
}

// nameWait bounds how long the plugin waits for a joined endpoint's container to show in
// the Docker API (Docker finishes starting it after Join returns).
const nameWait = 15 * time.Second

// announceContainer finds the container of Docker endpoint dockerEP (on docker network
// netID) and reports its name and labels for ep. It gives up after nameWait, when the
// endpoint is deleted (stopAnnouncing) or when the plugin stops serving.
func (p *Plugin) announceContainer(netID, dockerEP string, ep endpoint) {
	if p.cfg.Containers == nil || p.cfg.Updater == nil {
		return
	}
	p.mu.Lock()
	ctx, cancel := context.WithTimeout(p.life, nameWait)
	if prev, ok := p.announcing[dockerEP]; ok {
		prev()
	}
	p.announcing[dockerEP] = cancel
	p.mu.Unlock()
	defer func() {
		cancel()
		p.mu.Lock()
		delete(p.announcing, dockerEP)
		p.mu.Unlock()
	}()
	for {
		list, err := p.cfg.Containers.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("network", netID))})
		if err == nil {
			for _, c := range list {
				if c.NetworkSettings == nil || len(c.Names) == 0 {
					continue
				}
				for _, es := range c.NetworkSettings.Networks {
					if es == nil || es.EndpointID != dockerEP {
						continue
					}
					req := model.UpdateEndpointRequest{IPAddress: ep.IP.String(), ContainerID: c.ID, Labels: c.Labels,
						Tenant: ep.Ref.Tenant, Network: ep.Ref.Network, Event: "start", EndpointID: dockerEP,
						EPCommonName: strings.TrimPrefix(c.Names[0], "/")}
					if err := p.cfg.Updater.UpdateEndpoint(ctx, req); err != nil {
						p.log.Warn("report container to netmaster", "container", req.EPCommonName, "err", err)
					}
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				p.log.Warn("container of endpoint not found in the Docker API; it has no name in DNS", "endpoint", short(dockerEP))
			}
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// stopAnnouncing cancels the container lookup of Docker endpoint dockerEP, if one runs.
func (p *Plugin) stopAnnouncing(dockerEP string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cancel, ok := p.announcing[dockerEP]; ok {
		cancel()
		delete(p.announcing, dockerEP)
	}
}
