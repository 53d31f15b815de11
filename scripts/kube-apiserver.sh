#!/usr/bin/env bash
# Builds kube-apiserver (and nothing else) from the Go module proxy into a cache outside the
# repo, keyed by version, so only the first run on a machine pays the build (~6 min on 2
# cores). The Kubernetes tests and `make demo-k8s` run this binary as a private API server.
# Prints the binary's path. KUBE_VERSION overrides the version (staging modules follow it).
set -euo pipefail
ver=${KUBE_VERSION:-v1.34.4}
staging=v0.${ver#v1.}
out=${CONTIVBPF_CACHE:-$HOME/.cache/contivbpf}/kube-apiserver/$ver
bin=$out/kube-apiserver
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
mkdir -p "$out"
# One build at a time: `make test` starts one in the background and the tests that need
# the binary call this script too, waiting here until it is there.
exec 9>"$out/.lock"
flock 9
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
{
  echo "module contivbpf.local/kubeapiserver"
  echo
  echo "go 1.26"
  echo
  echo "require k8s.io/kubernetes $ver"
  echo
  for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go \
    cloud-provider cluster-bootstrap code-generator component-base component-helpers \
    controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation \
    endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy \
    kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission \
    sample-apiserver sample-cli-plugin sample-controller; do
    echo "replace k8s.io/$m => k8s.io/$m $staging"
  done
} > go.mod
cat > main.go <<'GO'
package main

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"

func main() {}
GO
echo "kube-apiserver: building $ver from the Go module proxy into $out (first run only, several minutes)" >&2
GOFLAGS=-mod=mod go mod tidy >&2
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$bin.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
mv "$bin.tmp" "$bin"
echo "$bin"
