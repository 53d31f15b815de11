//go:build tools

// Package deps pins the modules the project uses before every package imports them.
package deps

import (
	_ "github.com/cilium/ebpf"
	_ "github.com/cilium/ebpf/link"
	_ "github.com/containernetworking/cni/libcni"
	_ "github.com/containernetworking/cni/pkg/skel"
	_ "github.com/containernetworking/plugins/pkg/ns"
	_ "github.com/docker/go-plugins-helpers/ipam"
	_ "github.com/docker/go-plugins-helpers/network"
	_ "github.com/gorilla/mux"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/spf13/cobra"
	_ "github.com/urfave/cli/v2"
	_ "github.com/vishvananda/netlink"
	_ "github.com/vishvananda/netns"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
)
