package ebpf

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Endpoint veths carry an alias naming the endpoint. Several agents may share a network
// namespace (tests, the simulator, two pin roots on one host), so an alias alone must not
// make a veth this agent's to adopt or delete.
//
// Two formats are recognised:
//
//	contivbpf:<tag>:<endpoint key>  scoped: <tag> is pinTag(PinRoot); this agent's iff the
//	                                tag is its own (endpointAlias builds it)
//	contivbpf:<endpoint key>        legacy (written by builds before the scoped format):
//	                                this agent's only if its pinned state knows the veth
//	                                (a cb_ifaces entry or a pinned tcx link for that ifindex,
//	                                or the endpoint index)

const pinTagLen = 8 // hex digits

// pinTag is a short, stable hash of the pin root that scopes endpoint aliases.
func pinTag(pinRoot string) string {
	h := sha256.Sum256([]byte(filepath.Clean(pinRoot)))
	return hex.EncodeToString(h[:])[:pinTagLen]
}

// endpointAlias is the scoped alias of endpoint key ik for this agent.
func (d *Driver) endpointAlias(ik string) string {
	return aliasPrefix + pinTag(d.cfg.PinRoot) + ":" + ik
}

// splitAlias parses an endpoint alias: the endpoint key and, for the scoped format, the
// pin tag ("" for a legacy alias). ok is false for a link that is no endpoint veth.
func splitAlias(alias string) (tag, ik string, ok bool) {
	rest, ok := strings.CutPrefix(alias, aliasPrefix)
	if !ok || rest == "" {
		return "", "", false
	}
	if t, k, found := strings.Cut(rest, ":"); found && len(t) == pinTagLen && isLowerHex(t) && k != "" {
		return t, k, true
	}
	return "", rest, true
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ownedEndpointLink returns the endpoint key of l if l is an endpoint veth of this agent.
// A scoped alias decides by its tag; a legacy alias needs evidence in this agent's own
// state, which a veth of another agent (another pin root) never has.
func (d *Driver) ownedEndpointLink(l netlink.Link) (string, bool) {
	a := l.Attrs()
	tag, ik, ok := splitAlias(a.Alias)
	if !ok {
		return "", false
	}
	if tag == pinTag(d.cfg.PinRoot) {
		return ik, true
	}
	// Legacy, or another agent's scoped alias: the whole rest is a legacy key (a legacy
	// key may itself look like "<8 hex>:..."), and only this agent's state can claim it.
	legacy := strings.TrimPrefix(a.Alias, aliasPrefix)
	if r, known := d.eps.endpoints[legacy]; known && r.ifindex == a.Index {
		return legacy, true
	}
	if d.objs.CbIfaces != nil {
		if _, err := d.readIface(uint32(a.Index)); err == nil {
			return legacy, true
		}
	}
	pl, err := link.LoadPinnedLink(filepath.Join(d.cfg.PinRoot, linksDir, a.Name), nil)
	if err != nil {
		return "", false
	}
	defer pl.Close()
	if info, err := pl.Info(); err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == a.Index {
		return legacy, true
	}
	return "", false
}
