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

// HostVTEPPrefix holds every host's last known VTEP, one key per host, written by that
// host's own agent with no lease. Unlike the netplugin.vtep registration it outlives the
// agent, so peers keep forwarding to a host whose agent is down (and to which other agents
// were restarted meanwhile). Deleting a host's key forgets it once it has no endpoints.
const HostVTEPPrefix = "/contiv.io/oper/vteps/"

// HostVTEP is the record at HostVTEPPrefix + Host.
type HostVTEP struct {
	Host string `json:"host"`
	VTEP string `json:"vtep"`
}

// HostVTEPKey is the etcd key of host's VTEP record.
func HostVTEPKey(host string) string { return HostVTEPPrefix + host }

// DecodeHostVTEP parses and checks one HostVTEP record.
func DecodeHostVTEP(b []byte) (HostVTEP, netip.Addr, error) {
	var h HostVTEP
	if err := json.Unmarshal(b, &h); err != nil {
		return h, netip.Addr{}, fmt.Errorf("decode host vtep: %w", err)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(h.VTEP))
	switch {
	case h.Host == "":
		return h, a, fmt.Errorf("host vtep: host is empty")
	case err != nil || !a.Is4() || a.IsUnspecified() || a.IsMulticast():
		return h, a, fmt.Errorf("host vtep %s: vtep %q is not an IPv4 unicast address", h.Host, h.VTEP)
	}
	return h, a, nil
}
