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
check containerd containerd
check ctr containerd
check runc runc
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
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then echo "deps: missing ${need[*]} and not root; install them with apt-get" >&2; exit 1; fi
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# FRR (the BGP router of the route-distribution tests): the tests run its daemons
# themselves in a namespace; the package's own service is never started (policy-rc.d
# refuses it for the install where systemd runs).
if [[ ! -x /usr/lib/frr/bgpd ]]; then
  if [[ $(id -u) -ne 0 ]]; then echo "deps: missing frr and not root; install it with apt-get" >&2; exit 1; fi
  echo "deps: installing frr (service not started)"
  export DEBIAN_FRONTEND=noninteractive
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made_policy=1
  fi
  trap '[[ $made_policy -eq 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends frr >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends frr >/dev/null; }
  [[ $made_policy -eq 1 ]] && rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi
# Prometheus 2.42 (Debian) for the alert-rule and scrape tests: its binaries are unpacked
# into a cache outside the repo (the Makefile puts it on PATH), never installed, because the
# package would start a system Prometheus on :9090.
prom_dir=${CONTIVBPF_CACHE:-$HOME/.cache/contivbpf}/prometheus
if ! command -v promtool >/dev/null 2>&1 && [[ ! -x $prom_dir/usr/bin/promtool ]]; then
  echo "deps: unpacking Debian's prometheus into $prom_dir"
  mkdir -p "$prom_dir"
  (cd "$prom_dir" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } &&
    dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb)
fi
# The eBPF dataplane pins maps and links in bpffs; some machines boot without it mounted.
if [[ $(id -u) -eq 0 ]] && ! mountpoint -q /sys/fs/bpf; then
  echo "deps: mounting bpffs at /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi
