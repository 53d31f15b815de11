// Package ebpf is the eBPF backend of dataplane.Driver: it loads the programs from bpf/
// (compiled by bpf2go; the generated Go and object are committed, so building needs no
// clang), pins their maps and tcx links under Options.PinRoot, creates the endpoint
// veths and the collect_md VXLAN device, and converges the maps to the desired state.
//
// It owns the kernel objects of one host (netlink, bpffs pins, tcx links) and must not
// know about etcd, REST or Contiv's JSON.
package ebpf

//go:generate go tool bpf2go -cc clang-14 -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -type cb_ep_key -type cb_endpoint -type cb_iface -type cb_network -type cb_peer -type cb_config -type cb_ep_stats -type cb_counter -type cb_ct_key -type cb_ct_entry -type cb_ct_count -type cb_pol_key -type cb_rule -type cb_policy -type cb_pol_head -type cb_pol_rule_key -type cb_pol_rule -type cb_pol_cidr_key -type cb_pol_cidr -type cb_pol_best -type cb_svc_key -type cb_svc -type cb_backend_key -type cb_backend -type cb_vip -type cb_vip_key -type cb_member_key -type cb_member -type cb_natfrag -type cb_epg_state -type cb_route_key -type cb_route -type cb_frag_key -type cb_frag_entry -type cb_frag_zone_key -type cb_snat_key -type cb_snat_entry -type cb_snat_rkey -type cb_snat_rval -type cb_host_ip -type cb_host_route -type cb_np_key -type cb_np -type cb_tnet_key -type cb_tnet -type cb_peer_flow_key -type cb_peer_flow -type cb_host_svc_key -type cb_host_svc -type cb_bgp_key -type cb_bgp_route -type cb_kpod_key -type cb_kpod -type cb_krule -type cb_kset -type cb_kset_head -type cb_kcidr_key -type cb_kcidr -type cb_qos_entry -type cb_qos_bucket -type cb_deny_key contivbpf ../../../bpf/contivbpf.c -- -I../../../bpf
