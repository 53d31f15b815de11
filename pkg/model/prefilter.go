package model

import "strings"

// The deny list (this project's extension, issue 36): source prefixes an admin denies at
// the hosts' uplinks. Each entry is one prefix, for every host or for one host; an agent
// drops the underlay's IPv4 packets from the entries that apply to it where they enter
// (the eBPF backend's XDP prefilter and cb_from_uplink: drop_denied_source).

// CollPrefilters is the REST collection of the deny list: /api/v1/prefilters/<name>/.
const CollPrefilters = "prefilters"

// PrefilterPrefix holds one record per deny list entry.
const PrefilterPrefix = "/contiv.io/state/prefilters/"

// MaxPrefilters bounds the deny list (the eBPF map holds as many prefixes).
const MaxPrefilters = 1024

// PrefilterKey is the record of entry name.
func PrefilterKey(name string) string { return PrefilterPrefix + name }

// Prefilter is one deny list entry: packets from CIDR (an IPv4 prefix, as netmaster
// stores it: masked) are dropped at Host's uplink, or at every host's when Host is "".
type Prefilter struct {
	Name string `json:"name"`
	CIDR string `json:"cidr"`
	Host string `json:"host,omitempty"`
}

// AppliesTo reports whether the entry applies to host (host names are case-insensitive).
func (p *Prefilter) AppliesTo(host string) bool {
	return p.Host == "" || strings.EqualFold(p.Host, host)
}
