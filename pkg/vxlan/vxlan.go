// Package vxlan owns VTEP and peer bookkeeping for netplugin: decoding the
// netplugin.vtep registrations every agent publishes under /contiv.io/service/, turning
// them into the peer set of one host, and resolving the VTEP that owns a remote endpoint.
//
// It knows Contiv's registration JSON and the dataplane Peer type, nothing about etcd
// clients or kernels.
package vxlan

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// VTEPService is the registration name of every agent's tunnel endpoint.
const VTEPService = "netplugin.vtep"

// DefaultPort is the VXLAN UDP port (IANA).
const DefaultPort = 4789

// Registration is Contiv's objdb.ServiceInfo (Go field names in JSON).
type Registration struct {
	ServiceName string
	Role        string
	Version     string
	TTL         int
	HostAddr    string
	Port        int
	Hostname    string
}

// Decode parses one registration value.
func Decode(b []byte) (Registration, error) {
	var r Registration
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode service registration: %w", err)
	}
	return r, nil
}

// Table is the set of known VTEP registrations, keyed by etcd key. It is not safe for
// concurrent use; the agent guards it.
type Table map[string]Registration

// Peers returns every other host's VTEP, sorted by host. Registrations of self (by host
// label or by address selfVTEP) and ones without a usable address are left out. A host
// registered twice keeps its lowest address so the result is deterministic.
func (t Table) Peers(self string, selfVTEP netip.Addr) []dataplane.Peer {
	byHost := map[string]netip.Addr{}
	for _, r := range t {
		a, err := netip.ParseAddr(strings.TrimSpace(r.HostAddr))
		if err != nil || !a.Is4() {
			continue
		}
		host := r.Hostname
		if host == "" {
			host = a.String()
		}
		if host == self || (selfVTEP.IsValid() && a == selfVTEP) {
			continue
		}
		if cur, ok := byHost[host]; !ok || a.Less(cur) {
			byHost[host] = a
		}
	}
	out := make([]dataplane.Peer, 0, len(byHost))
	for h, a := range byHost {
		out = append(out, dataplane.Peer{Host: h, VTEP: a})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// VTEPOf returns the registered VTEP of host, if any.
func (t Table) VTEPOf(host string) (netip.Addr, bool) {
	var best netip.Addr
	for _, r := range t {
		if r.Hostname != host {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSpace(r.HostAddr))
		if err != nil || !a.Is4() {
			continue
		}
		if !best.IsValid() || a.Less(best) {
			best = a
		}
	}
	return best, best.IsValid()
}
