package model

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"strings"
)

// WireGuard host records (this project's extension, issue 38): each host's WireGuard
// public key and the underlay address:port its device listens on, one record per host.
// Netmaster writes a record for the host's agent (POST /plugin/publishWireGuard); an agent
// bound to a host publishes only that host's (docs/encryption.md). The private key never
// leaves the host.

// WireGuardPrefix holds one WireGuardHost per host.
const WireGuardPrefix = "/contiv.io/oper/wireguard/"

// WireGuardKey is the record of host. Host names are case-insensitive: one host, one
// record, however its agent spells it.
func WireGuardKey(host string) string { return WireGuardPrefix + strings.ToLower(host) }

// WireGuardHost is the record at WireGuardKey(Host).
type WireGuardHost struct {
	Host string `json:"host"`
	// PublicKey is the device's public key, base64 as wg(8) prints it.
	PublicKey string `json:"publicKey"`
	// Endpoint is the host's underlay address and the device's listen port ("ip:port").
	Endpoint string `json:"endpoint"`
	// Rotate is the last rotation an admin requested of this host's key, counted from 1
	// (POST /wireguard/hosts/<host>/rotate; 0: none). Only netmaster sets it; an agent's
	// publication keeps it (Republished).
	Rotate uint64 `json:"rotate,omitempty"`
	// Rotated is the last requested rotation the published key answers: netmaster sets it
	// to Rotate when a publication brings another key than the record held. Rotate >
	// Rotated: the host's agent is to make a new key (wgsteer), pending until it publishes.
	// (Both omitted when 0: a build before them reads the record as it always did.)
	Rotated uint64 `json:"rotated,omitempty"`
}

// Republished is the record an agent's publication h makes over prev (nil: none): the
// rotation an admin requested stays, and is answered when h brings another key.
func (h WireGuardHost) Republished(prev *WireGuardHost) WireGuardHost {
	h.Rotate, h.Rotated = 0, 0
	if prev == nil {
		return h
	}
	h.Rotate, h.Rotated = prev.Rotate, prev.Rotated
	if h.PublicKey != prev.PublicKey {
		h.Rotated = prev.Rotate
	}
	return h
}

// RotationPending reports whether an admin asked for a new key the record does not hold yet.
func (h WireGuardHost) RotationPending() bool { return h.Rotate > h.Rotated }

// RotationState is the record's rotation for people: "-" (never requested), "done N" or
// "pending N" (N: the generation last requested).
func (h WireGuardHost) RotationState() string {
	switch {
	case h.Rotate == 0:
		return "-"
	case h.RotationPending():
		return fmt.Sprintf("pending %d", h.Rotate)
	}
	return fmt.Sprintf("done %d", h.Rotate)
}

// Check validates the record; its error names the field.
func (h WireGuardHost) Check() error {
	if h.Host == "" {
		return fmt.Errorf("host: required")
	}
	k, err := base64.StdEncoding.DecodeString(h.PublicKey)
	switch {
	case err != nil || len(k) != 32:
		return fmt.Errorf("publicKey: %q is not a base64 WireGuard key (32 bytes)", h.PublicKey)
	case base64.StdEncoding.EncodeToString(k) != h.PublicKey:
		// Decoding ignores line breaks and the last character's spare bits: one key would
		// have many spellings, and two hosts could hold one key under different strings.
		return fmt.Errorf("publicKey: %q is not spelled as wg(8) prints the key", h.PublicKey)
	case string(k) == string(make([]byte, 32)):
		return fmt.Errorf("publicKey: the all-zero key is not a key")
	}
	ap, err := netip.ParseAddrPort(h.Endpoint)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" || !ap.Addr().IsGlobalUnicast() {
		return fmt.Errorf("endpoint: %q is not a unicast address:port (port 1-65535)", h.Endpoint)
	}
	return nil
}
