#!/usr/bin/env bash
# Installs the Debian packages the build, tests and demo need, only when something is missing.
set -euo pipefail
need=()
check() { # check <command-or-file> <package>
  if [[ "$1" == /* ]]; then [[ -e "$1" ]] || need+=("$2"); else command -v "$1" >/dev/null 2>&1 || need+=("$2"); fi
}
check clang-14 clang-14
check llvm-strip llvm
check /usr/include/bpf/bpf_helpers.h libbpf-dev
check bpftool bpftool
check ovs-vswitchd openvswitch-switch
check dockerd docker.io
check /bin/busybox busybox-static
check etcd etcd-server
check etcdctl etcd-client
check ethtool ethtool
check iperf3 iperf3
check tcpdump tcpdump
check ip iproute2
check ping iputils-ping
check bridge iproute2
check nsenter util-linux
check systemd-analyze systemd
check promtool prometheus
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then echo "deps: missing ${need[*]} and not root; install them with apt-get" >&2; exit 1; fi
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The eBPF dataplane pins maps and links in bpffs; some machines boot without it mounted.
if [[ $(id -u) -eq 0 ]] && ! mountpoint -q /sys/fs/bpf; then
  echo "deps: mounting bpffs at /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi
