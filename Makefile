# contivbpf: Contiv-compatible container networking with an eBPF dataplane.
# `make demo` runs the walkthrough end to end; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
DATAPLANE ?= ebpf
GOTEST_FLAGS ?= -count=1 -p 2 -timeout 25m
# The benchmark fixtures (pkg/dataplane/ebpf/bench_export.go, tools/bench's prog stage)
# build only with this tag, so the binaries under cmd/ never contain them; vet, the tests
# and the bench build with it.
BENCH_TAGS := -tags cbbench
export PATH := $(PATH):/usr/local/go/bin:/usr/sbin:/sbin:$(or $(CONTIVBPF_CACHE),$(HOME)/.cache/contivbpf)/prometheus/usr/bin

KUBE_CACHE := $(or $(CONTIVBPF_CACHE),$(HOME)/.cache/contivbpf)/kube-apiserver

.PHONY: all deps build generate test unit bench demo demo-docker demo-k8s clean kube-apiserver-bg

all: build

deps:
	@./scripts/deps.sh

# Every binary's --version: `git describe` and the build time (pkg/buildinfo).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BUILDINFO := github.com/contivbpf/contivbpf/pkg/buildinfo
GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).gitCommit=$(GIT_COMMIT) -X $(BUILDINFO).buildTime=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)

build:
	@mkdir -p bin
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

# Regenerates the bpf2go output (Go bindings + BPF objects are committed, so plain
# `go build` needs no clang).
generate: deps
	$(GO) generate ./pkg/dataplane/ebpf/...

# Every test: unit, BPF Program.Run, namespaces, etcd, OVS, dockerd. Needs root for the
# kernel-facing tests (they say so and skip when not root).
# CONTIVBPF_TEST_BIN lets process-level tests reuse the binaries `build` just made.
# kube-apiserver (scripts/kube-apiserver.sh, cached outside the repo) builds in the
# background on a machine's first run, started before everything else so it overlaps deps,
# build, vet and the other tests; the Kubernetes tests wait for it.
test: kube-apiserver-bg deps build
	$(GO) vet ./...
	$(GO) vet $(BENCH_TAGS) ./...
	CONTIVBPF_TEST_BIN=$(CURDIR)/bin $(GO) test $(BENCH_TAGS) $(GOTEST_FLAGS) ./...

unit:
	$(GO) test $(BENCH_TAGS) -count=1 -short ./...

bench: deps build
	$(GO) run $(BENCH_TAGS) ./tools/bench --dataplane=$(DATAPLANE)

demo: deps build
	$(GO) run ./tools/demo --dataplane=$(DATAPLANE)

demo-docker: deps build
	$(GO) run ./tools/demodocker

# Kubernetes walkthrough: a real kube-apiserver (built on first use), two simulated nodes,
# pods attached by their labels, a tenant-bound namespace, a Service across both nodes.
demo-k8s: deps build
	$(GO) run ./tools/demok8s --dataplane=$(DATAPLANE)

kube-apiserver-bg:
	@mkdir -p $(KUBE_CACHE) && (./scripts/kube-apiserver.sh > $(KUBE_CACHE)/build.log 2>&1 &)

clean:
	rm -rf bin
