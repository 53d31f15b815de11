package ovs

import (
	"encoding/binary"
	"errors"
	"fmt"

	of "github.com/contiv/libOpenflow/openflow13"
)

// Nicira multipath action (NXAST_MULTIPATH): hash the chosen header fields and store a
// link index 0..nLinks-1 in a register field. libOpenflow only names the subtype, so the
// action is encoded here.
//
// Service LB uses it instead of an OpenFlow select group: OVS 3.1 hashes select groups
// (dp_hash, symmetric L3/L4) without UDP ports, so every UDP flow between two addresses
// went to one backend; selection_method=hash with fields() exists only in OpenFlow 1.5
// group properties, which libOpenflow cannot encode. multipath with
// symmetric_l3l4+udp hashes the 5-tuple for TCP and UDP alike.

// Hash field sets (NX_HASH_FIELDS_*) and algorithms (NX_MP_ALG_*).
const (
	nxHashFieldsSymmetricL3L4UDP = 3
	nxHashFieldsNwSrc            = 4 // the IPv4 source alone (session affinity)
	nxHashFieldsSymmetricL3      = 6 // both addresses (fragments: later ones carry no ports)
	nxMPAlgHashThreshold         = 1
	nxMPAlgHRW                   = 2
	nxMultipathLen               = 32
)

type nxMultipath struct {
	fields    uint16
	basis     uint16
	algorithm uint16
	maxLink   uint16 // number of links - 1
	ofsNbits  uint16
	dst       *of.MatchField
}

// mpHash is what multipath hashes: one of the nxHashFields.
type mpHash uint16

// String is the field set as ovs-ofctl prints it.
func (h mpHash) String() string {
	switch h {
	case nxHashFieldsNwSrc:
		return "nw_src"
	case nxHashFieldsSymmetricL3:
		return "symmetric_l3"
	}
	return "symmetric_l3l4+udp"
}

// newMultipath picks one of nLinks (1..65536) by the hash of fields into dst[start..end]. HRW keeps most flows on their backend when one is
// added or removed; OVS limits it to 64 links, beyond which hash-threshold is used.
func newMultipath(nLinks int, dst *of.MatchField, start, end int, fields mpHash) (*nxMultipath, error) {
	if nLinks < 1 || nLinks > 1<<16 || nLinks > 1<<(end-start+1) {
		return nil, fmt.Errorf("multipath: %d links do not fit %d bits", nLinks, end-start+1)
	}
	alg := uint16(nxMPAlgHRW)
	if nLinks > 64 {
		alg = nxMPAlgHashThreshold
	}
	return &nxMultipath{fields: uint16(fields), algorithm: alg, maxLink: uint16(nLinks - 1),
		ofsNbits: of.NewNXRange(start, end).ToOfsBits(), dst: dst}, nil
}

func (a *nxMultipath) Header() *of.ActionHeader {
	return &of.ActionHeader{Type: of.ActionType_Experimenter, Length: nxMultipathLen}
}

func (a *nxMultipath) Len() uint16 { return nxMultipathLen }

func (a *nxMultipath) MarshalBinary() ([]byte, error) {
	b := make([]byte, nxMultipathLen)
	binary.BigEndian.PutUint16(b[0:], of.ActionType_Experimenter)
	binary.BigEndian.PutUint16(b[2:], nxMultipathLen)
	binary.BigEndian.PutUint32(b[4:], of.NxExperimenterID)
	binary.BigEndian.PutUint16(b[8:], of.NXAST_MULTIPATH)
	binary.BigEndian.PutUint16(b[10:], a.fields)
	binary.BigEndian.PutUint16(b[12:], a.basis)
	// b[14:16] pad
	binary.BigEndian.PutUint16(b[16:], a.algorithm)
	binary.BigEndian.PutUint16(b[18:], a.maxLink)
	// b[20:24] arg = 0, b[24:26] pad
	binary.BigEndian.PutUint16(b[26:], a.ofsNbits)
	binary.BigEndian.PutUint32(b[28:], a.dst.MarshalHeader())
	return b, nil
}

func (a *nxMultipath) UnmarshalBinary(b []byte) error {
	if len(b) < nxMultipathLen {
		return errors.New("multipath action: short buffer")
	}
	a.fields = binary.BigEndian.Uint16(b[10:])
	a.basis = binary.BigEndian.Uint16(b[12:])
	a.algorithm = binary.BigEndian.Uint16(b[16:])
	a.maxLink = binary.BigEndian.Uint16(b[18:])
	a.ofsNbits = binary.BigEndian.Uint16(b[26:])
	a.dst = new(of.MatchField)
	return a.dst.UnmarshalHeader(b[28:32])
}
