package ebpf

import "fmt"

// Reason is a verdict or drop reason: the cb_reason enum of bpf/lib/drop.h, shared by the
// datapath, metrics and netctl. Values are a stable ABI.
type Reason uint32

// Verdicts and drop reasons (generated from bpf/lib/drop.h by bpf2go).
const (
	ReasonUnspec            = Reason(contivbpfCbReasonCB_REASON_UNSPEC)
	FwdLocal                = Reason(contivbpfCbReasonCB_FWD_LOCAL)
	FwdTunnel               = Reason(contivbpfCbReasonCB_FWD_TUNNEL)
	FwdUplink               = Reason(contivbpfCbReasonCB_FWD_UPLINK)
	ARPReply                = Reason(contivbpfCbReasonCB_ARP_REPLY)
	PolicyAllow             = Reason(contivbpfCbReasonCB_POLICY_ALLOW) // events only, never counted
	FwdHost                 = Reason(contivbpfCbReasonCB_FWD_HOST)
	FwdEgress               = Reason(contivbpfCbReasonCB_FWD_EGRESS)
	FwdEgressReply          = Reason(contivbpfCbReasonCB_FWD_EGRESS_REPLY)
	ICMPGatewayReply        = Reason(contivbpfCbReasonCB_ICMP_GW_REPLY)
	FwdNodePort             = Reason(contivbpfCbReasonCB_FWD_NODEPORT)
	FwdNodePortReply        = Reason(contivbpfCbReasonCB_FWD_NODEPORT_REPLY)
	FwdDNS                  = Reason(contivbpfCbReasonCB_FWD_DNS)
	FwdNative               = Reason(contivbpfCbReasonCB_FWD_NATIVE)
	ICMPVIPReply            = Reason(contivbpfCbReasonCB_ICMP_VIP_REPLY)
	DropMalformedEth        = Reason(contivbpfCbReasonCB_DROP_MALFORMED_ETH)
	DropUnknownIface        = Reason(contivbpfCbReasonCB_DROP_UNKNOWN_IFACE)
	DropNotIPv4             = Reason(contivbpfCbReasonCB_DROP_NOT_IPV4)
	DropMalformedARP        = Reason(contivbpfCbReasonCB_DROP_MALFORMED_ARP)
	DropARPNotRequest       = Reason(contivbpfCbReasonCB_DROP_ARP_NOT_REQUEST)
	DropARPUnknownTarget    = Reason(contivbpfCbReasonCB_DROP_ARP_UNKNOWN_TARGET)
	DropARPSelf             = Reason(contivbpfCbReasonCB_DROP_ARP_SELF)
	DropMalformedIP         = Reason(contivbpfCbReasonCB_DROP_MALFORMED_IP)
	DropSpoofedSrc          = Reason(contivbpfCbReasonCB_DROP_SPOOFED_SRC)
	DropUnknownDst          = Reason(contivbpfCbReasonCB_DROP_UNKNOWN_DST)
	DropUnknownNetwork      = Reason(contivbpfCbReasonCB_DROP_UNKNOWN_NETWORK)
	DropUnknownPeer         = Reason(contivbpfCbReasonCB_DROP_UNKNOWN_PEER)
	DropNoTunnelKey         = Reason(contivbpfCbReasonCB_DROP_NO_TUNNEL_KEY)
	DropTunnelErr           = Reason(contivbpfCbReasonCB_DROP_TUNNEL_ERR)
	DropNoVXLAN             = Reason(contivbpfCbReasonCB_DROP_NO_VXLAN)
	DropNoUplink            = Reason(contivbpfCbReasonCB_DROP_NO_UPLINK)
	DropToGateway           = Reason(contivbpfCbReasonCB_DROP_TO_GATEWAY)
	DropPolicy              = Reason(contivbpfCbReasonCB_DROP_POLICY)
	DropNoBackend           = Reason(contivbpfCbReasonCB_DROP_NO_BACKEND)
	DropARPFromOverlay      = Reason(contivbpfCbReasonCB_DROP_ARP_FROM_OVERLAY)
	DropRemoteSrc           = Reason(contivbpfCbReasonCB_DROP_REMOTE_SRC)
	DropVLANErr             = Reason(contivbpfCbReasonCB_DROP_VLAN_ERR)
	DropMalformedL4         = Reason(contivbpfCbReasonCB_DROP_MALFORMED_L4)
	DropNATErr              = Reason(contivbpfCbReasonCB_DROP_NAT_ERR)
	DropFragToService       = Reason(contivbpfCbReasonCB_DROP_FRAG_TO_SERVICE)
	DropTTLExceeded         = Reason(contivbpfCbReasonCB_DROP_TTL_EXCEEDED)
	DropFragNoFirst         = Reason(contivbpfCbReasonCB_DROP_FRAG_NO_FIRST)
	DropCTFull              = Reason(contivbpfCbReasonCB_DROP_CT_FULL)
	DropOverlaySpoof        = Reason(contivbpfCbReasonCB_DROP_OVERLAY_SPOOF)
	DropVLANTagged          = Reason(contivbpfCbReasonCB_DROP_VLAN_TAGGED)
	DropEgressNoPort        = Reason(contivbpfCbReasonCB_DROP_EGRESS_NO_PORT)
	DropEgressUnsupported   = Reason(contivbpfCbReasonCB_DROP_EGRESS_UNSUPPORTED)
	DropEgressNoFlow        = Reason(contivbpfCbReasonCB_DROP_EGRESS_NO_FLOW)
	DropEgressInvalidDst    = Reason(contivbpfCbReasonCB_DROP_EGRESS_INVALID_DST)
	DropUplinkToEndpoint    = Reason(contivbpfCbReasonCB_DROP_UPLINK_TO_ENDPOINT)
	DropNodePortNoLocal     = Reason(contivbpfCbReasonCB_DROP_NODEPORT_NO_LOCAL)
	DropEgressOverlay       = Reason(contivbpfCbReasonCB_DROP_EGRESS_OVERLAY)
	DropHostNoRoute         = Reason(contivbpfCbReasonCB_DROP_HOST_NO_ROUTE)
	DropNoRoute             = Reason(contivbpfCbReasonCB_DROP_NO_ROUTE)
	DropNetpol              = Reason(contivbpfCbReasonCB_DROP_NETPOL)
	DropCTQuota             = Reason(contivbpfCbReasonCB_DROP_CT_QUOTA)
	RejectNoBackend         = Reason(contivbpfCbReasonCB_REJECT_NO_BACKEND) // dropped and answered with ICMP port unreachable
	DropFragLimit           = Reason(contivbpfCbReasonCB_DROP_FRAG_LIMIT)
	DropNodePortInternalSrc = Reason(contivbpfCbReasonCB_DROP_NODEPORT_INTERNAL_SRC)
	DropEgressLinkLocal     = Reason(contivbpfCbReasonCB_DROP_EGRESS_LINK_LOCAL)
	RejectTTLExceeded       = Reason(contivbpfCbReasonCB_REJECT_TTL_EXCEEDED) // dropped and answered with ICMP time exceeded
	DropNoStage             = Reason(contivbpfCbReasonCB_DROP_NO_STAGE)
	DropEgressUnanswered    = Reason(contivbpfCbReasonCB_DROP_EGRESS_UNANSWERED)
	DropNodePortBlind       = Reason(contivbpfCbReasonCB_DROP_NODEPORT_BLIND)
	DropRateEgress          = Reason(contivbpfCbReasonCB_DROP_RATE_EGRESS)   // an endpoint's QoS egress rate (qos.go)
	DropRateIngress         = Reason(contivbpfCbReasonCB_DROP_RATE_INGRESS)  // an endpoint's QoS ingress rate (qos.go)
	DropClearOverlay        = Reason(contivbpfCbReasonCB_DROP_CLEAR_OVERLAY) // encryption on: an overlay packet from the underlay in clear
	DropDeniedSource        = Reason(contivbpfCbReasonCB_DROP_DENIED_SOURCE) // from the underlay, from a prefix on the deny list (prefilter)
	reasonMax               = Reason(contivbpfCbReasonCB_REASON_MAX)
	firstDrop               = Reason(contivbpfCbReasonCB_DROP_MIN)
)

var reasonNames = map[Reason]string{
	ReasonUnspec:            "unspec",
	FwdLocal:                "fwd_local",
	FwdTunnel:               "fwd_tunnel",
	FwdUplink:               "fwd_uplink",
	ARPReply:                "arp_reply",
	PolicyAllow:             "policy_allow",
	FwdHost:                 "fwd_host",
	FwdEgress:               "fwd_egress",
	FwdEgressReply:          "fwd_egress_reply",
	ICMPGatewayReply:        "icmp_gw_reply",
	FwdNodePort:             "fwd_nodeport",
	FwdNodePortReply:        "fwd_nodeport_reply",
	FwdDNS:                  "fwd_dns",
	FwdNative:               "fwd_native",
	ICMPVIPReply:            "icmp_vip_reply",
	DropMalformedEth:        "drop_malformed_eth",
	DropUnknownIface:        "drop_unknown_iface",
	DropNotIPv4:             "drop_not_ipv4",
	DropMalformedARP:        "drop_malformed_arp",
	DropARPNotRequest:       "drop_arp_not_request",
	DropARPUnknownTarget:    "drop_arp_unknown_target",
	DropARPSelf:             "drop_arp_self",
	DropMalformedIP:         "drop_malformed_ip",
	DropSpoofedSrc:          "drop_spoofed_src",
	DropUnknownDst:          "drop_unknown_dst",
	DropUnknownNetwork:      "drop_unknown_network",
	DropUnknownPeer:         "drop_unknown_peer",
	DropNoTunnelKey:         "drop_no_tunnel_key",
	DropTunnelErr:           "drop_tunnel_err",
	DropNoVXLAN:             "drop_no_vxlan",
	DropNoUplink:            "drop_no_uplink",
	DropToGateway:           "drop_to_gateway",
	DropPolicy:              "drop_policy",
	DropNoBackend:           "drop_no_backend",
	DropARPFromOverlay:      "drop_arp_from_overlay",
	DropRemoteSrc:           "drop_remote_src",
	DropVLANErr:             "drop_vlan_err",
	DropMalformedL4:         "drop_malformed_l4",
	DropNATErr:              "drop_nat_err",
	DropFragToService:       "drop_frag_to_service",
	DropTTLExceeded:         "drop_ttl_exceeded",
	DropFragNoFirst:         "drop_frag_no_first",
	DropCTFull:              "drop_ct_full",
	DropOverlaySpoof:        "drop_overlay_spoof",
	DropVLANTagged:          "drop_vlan_tagged",
	DropEgressNoPort:        "drop_egress_no_port",
	DropEgressUnsupported:   "drop_egress_unsupported",
	DropEgressNoFlow:        "drop_egress_no_flow",
	DropEgressInvalidDst:    "drop_egress_invalid_dst",
	DropUplinkToEndpoint:    "drop_uplink_to_endpoint",
	DropNodePortNoLocal:     "drop_nodeport_no_local",
	DropEgressOverlay:       "drop_egress_overlay",
	DropHostNoRoute:         "drop_host_no_route",
	DropNoRoute:             "drop_no_route",
	DropNetpol:              "drop_netpol",
	DropCTQuota:             "drop_ct_quota",
	RejectNoBackend:         "reject_no_backend",
	DropFragLimit:           "drop_frag_limit",
	DropNodePortInternalSrc: "drop_nodeport_internal_src",
	DropEgressLinkLocal:     "drop_egress_link_local",
	RejectTTLExceeded:       "reject_ttl_exceeded",
	DropNoStage:             "drop_no_stage",
	DropEgressUnanswered:    "drop_egress_unanswered",
	DropNodePortBlind:       "drop_nodeport_blind",
	DropRateEgress:          "drop_rate_egress",
	DropRateIngress:         "drop_rate_ingress",
	DropClearOverlay:        "drop_clear_overlay",
	DropDeniedSource:        "drop_denied_source",
}

// String is the reason's metric/CLI name, e.g. "drop_unknown_dst".
func (r Reason) String() string {
	if n, ok := reasonNames[r]; ok {
		return n
	}
	return fmt.Sprintf("reason_%d", uint32(r))
}

// IsDrop reports whether the reason discards the packet.
func (r Reason) IsDrop() bool { return r >= firstDrop }

// Reasons lists every defined reason in numeric order.
func Reasons() []Reason {
	var out []Reason
	for r := Reason(0); r < reasonMax; r++ {
		if _, ok := reasonNames[r]; ok {
			out = append(out, r)
		}
	}
	return out
}
