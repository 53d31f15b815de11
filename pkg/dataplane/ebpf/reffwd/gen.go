// Package reffwd is the reference forwarder of the benchmarks (bpf/ref_forward.c): one
// hash lookup by destination IPv4 address, the destination MAC rewrite and
// bpf_redirect_peer, nothing else. tools/bench times it next to the datapath's paths
// (Program.Benchmark on the same packet) and reports each path as a ratio of it. Like
// package ebpf, the bpf2go output (Go and object) is committed: building needs no clang.
package reffwd

//go:generate go tool bpf2go -cc clang-14 -target bpfel -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -type rf_dest reffwd ../../../../bpf/ref_forward.c -- -I../../../../bpf
