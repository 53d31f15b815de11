package master

// This file: parsing and arithmetic of network subnets (IPv4 with an optional range, IPv6).
// The address allocators are in addr.go, their allocation maps in addrmap.go.

import (
	"fmt"
	"math/big"
	"net/netip"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// Smallest prefix length accepted. Large subnets keep their allocation map in chunks
// (addrmap.go); the chunk summary of a /10 (16,384 bits) is ~2.7 KB.
const minSubnetLen = 10

// subnet4 is a parsed IPv4 network subnet, optionally restricted to a range.
type subnet4 struct {
	base       uint32 // network address
	plen       int
	first, end uint32 // usable range [first, end] (whole subnet when no range was given)
}

func (s subnet4) size() uint32           { return 1 << (32 - s.plen) }
func (s subnet4) contains(a uint32) bool { return a&s.mask() == s.base }
func (s subnet4) mask() uint32           { return ^uint32(0) << (32 - s.plen) }

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func parseIP4(field, s string) (uint32, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return 0, badReq("%s: %q is not an IPv4 address", field, s)
	}
	return u32(a), nil
}

// parseSubnet4 parses "a.b.c.d/len" or "a.b.c.d-e.f.g.h/len".
func parseSubnet4(field, s string) (subnet4, error) {
	if !reSubnet.MatchString(s) {
		return subnet4{}, badReq("%s: %q is not an IPv4 subnet like 10.1.1.0/24 or 10.1.1.10-10.1.1.100/24", field, s)
	}
	addrs, lenStr, _ := strings.Cut(s, "/")
	var plen int
	fmt.Sscanf(lenStr, "%d", &plen)
	if plen < minSubnetLen || plen > 30 {
		return subnet4{}, badReq("%s: prefix length /%d not supported (must be /%d../30)", field, plen, minSubnetLen)
	}
	startS, endS, isRange := strings.Cut(addrs, "-")
	start, err := parseIP4(field, startS)
	if err != nil {
		return subnet4{}, err
	}
	sn := subnet4{plen: plen}
	sn.base = start & sn.mask()
	sn.first, sn.end = sn.base, sn.base+sn.size()-1
	if isRange {
		end, err := parseIP4(field, endS)
		if err != nil {
			return subnet4{}, err
		}
		if end&sn.mask() != sn.base || end < start {
			return subnet4{}, badReq("%s: range %s is not an ascending range inside one /%d", field, addrs, plen)
		}
		sn.first, sn.end = start, end
	}
	return sn, nil
}

// subnetOfState rebuilds the subnet of a network state record.
func subnetOfState(ns *model.CfgNetworkState) (subnet4, error) {
	a, err := netip.ParseAddr(ns.SubnetIP)
	if err != nil || !a.Is4() {
		return subnet4{}, fmt.Errorf("network %s: bad subnetIP %q in state", ns.ID, ns.SubnetIP)
	}
	sn := subnet4{base: u32(a), plen: int(ns.SubnetLen)}
	sn.first, sn.end = sn.base, sn.base+sn.size()-1
	return sn, nil
}

// subnet6 is a parsed IPv6 network subnet (contiv.md 3.6).
type subnet6 struct {
	prefix netip.Prefix
}

func parseSubnet6(field, s string) (subnet6, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() {
		return subnet6{}, badReq("%s: %q is not an IPv6 subnet like 2001:db8::/64", field, s)
	}
	if p.Bits() < 16 || p.Bits() > 127 {
		return subnet6{}, badReq("%s: prefix length /%d not supported (must be /16../127)", field, p.Bits())
	}
	return subnet6{prefix: p.Masked()}, nil
}

func (s subnet6) hostBits() int { return 128 - s.prefix.Bits() }

// hostID returns the host part of a as an address string like "::5".
func (s subnet6) hostID(a netip.Addr) string {
	ab := a.As16()
	pb := s.prefix.Addr().As16()
	var h [16]byte
	for i := range h {
		h[i] = ab[i] &^ pb[i]
	}
	// Clear prefix bits that a might differ in (callers check containment first).
	return netip.AddrFrom16(h).String()
}

func (s subnet6) addr(hostID *big.Int) netip.Addr {
	pb := s.prefix.Addr().As16()
	var hb [16]byte
	hostID.FillBytes(hb[:])
	var out [16]byte
	for i := range out {
		out[i] = pb[i] | hb[i]
	}
	return netip.AddrFrom16(out)
}
