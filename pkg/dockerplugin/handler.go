package dockerplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/docker/go-plugins-helpers/ipam"
	"github.com/docker/go-plugins-helpers/network"
)

const contentType = "application/vnd.docker.plugins.v1.2+json"

// manifest advertises both drivers: Docker refuses a network-only handler as IPAM driver.
const manifest = `{"Implements": ["NetworkDriver", "IpamDriver"]}`

// Handler returns the HTTP handler with the routes of both drivers. Unknown routes are 404.
func (p *Plugin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /Plugin.Activate", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		_, _ = io.WriteString(w, manifest+"\n")
	})
	// NetworkDriver.
	route(p, mux, "NetworkDriver.GetCapabilities", func(_ context.Context, _ *struct{}) (any, error) {
		return &network.CapabilitiesResponse{Scope: network.LocalScope, ConnectivityScope: network.GlobalScope}, nil
	})
	route(p, mux, "NetworkDriver.CreateNetwork", p.createNetwork)
	route(p, mux, "NetworkDriver.DeleteNetwork", p.deleteNetwork)
	route(p, mux, "NetworkDriver.CreateEndpoint", p.createEndpoint)
	route(p, mux, "NetworkDriver.DeleteEndpoint", p.deleteEndpoint)
	route(p, mux, "NetworkDriver.Join", p.join)
	route(p, mux, "NetworkDriver.Leave", empty[network.LeaveRequest])
	route(p, mux, "NetworkDriver.EndpointOperInfo", func(_ context.Context, _ *network.InfoRequest) (any, error) {
		return &network.InfoResponse{Value: map[string]string{}}, nil
	})
	route(p, mux, "NetworkDriver.DiscoverNew", empty[network.DiscoveryNotification])
	route(p, mux, "NetworkDriver.DiscoverDelete", empty[network.DiscoveryNotification])
	route(p, mux, "NetworkDriver.ProgramExternalConnectivity", empty[network.ProgramExternalConnectivityRequest])
	route(p, mux, "NetworkDriver.RevokeExternalConnectivity", empty[network.RevokeExternalConnectivityRequest])
	route(p, mux, "NetworkDriver.AllocateNetwork", func(_ context.Context, _ *network.AllocateNetworkRequest) (any, error) {
		return nil, fmt.Errorf("AllocateNetwork: swarm mode is not supported; use local scope networks")
	})
	route(p, mux, "NetworkDriver.FreeNetwork", func(_ context.Context, _ *network.FreeNetworkRequest) (any, error) {
		return nil, fmt.Errorf("FreeNetwork: swarm mode is not supported")
	})
	// IpamDriver.
	route(p, mux, "IpamDriver.GetCapabilities", func(_ context.Context, _ *struct{}) (any, error) {
		return map[string]bool{"RequiresMACAddress": false, "RequiresRequestReplay": false}, nil
	})
	route(p, mux, "IpamDriver.GetDefaultAddressSpaces", func(_ context.Context, _ *struct{}) (any, error) {
		return &ipam.AddressSpacesResponse{LocalDefaultAddressSpace: "contiv-local", GlobalDefaultAddressSpace: "contiv-global"}, nil
	})
	route(p, mux, "IpamDriver.RequestPool", p.requestPool)
	route(p, mux, "IpamDriver.ReleasePool", empty[ipam.ReleasePoolRequest])
	route(p, mux, "IpamDriver.RequestAddress", p.requestAddress)
	route(p, mux, "IpamDriver.ReleaseAddress", p.releaseAddress)
	return mux
}

func empty[T any](context.Context, *T) (any, error) { return struct{}{}, nil }

// route registers POST /<name>: decode the JSON body into Req, call fn, answer its result
// or {"Err": msg} with HTTP 500 (what Docker's plugin client reads for both drivers).
func route[Req any](p *Plugin, mux *http.ServeMux, name string, fn func(context.Context, *Req) (any, error)) {
	mux.HandleFunc("POST /"+name, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		req := new(Req)
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil && len(body) > 0 {
			err = json.Unmarshal(body, req)
		}
		if err != nil {
			p.log.Warn("bad request", "call", name, "err", err)
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(network.ErrorResponse{Err: fmt.Sprintf("%s: bad request body: %v", name, err)})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), p.cfg.Timeout)
		defer cancel()
		start := time.Now()
		resp, err := fn(ctx, req)
		took := time.Since(start)
		if err != nil {
			p.log.Warn("request failed", "call", name, "took", took, "err", err)
			w.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(w).Encode(network.ErrorResponse{Err: err.Error()})
			return
		}
		p.log.Debug("request", "call", name, "took", took, "req", req, "resp", resp)
		_ = json.NewEncoder(w).Encode(resp)
	})
}
