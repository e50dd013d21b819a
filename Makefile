# Kubefill's build, generation and test entry points.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

export GOTOOLCHAIN := local

BIN := $(CURDIR)/bin
API_DIR := staging/src/github.com/kubefill/kubefill-api
CONTROLLER_GEN := $(BIN)/controller-gen
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)

.PHONY: all build generate manifests verify-generated vet fmt test test-unit test-integration test-e2e \
        bench-import bench-upload bench-clone bench-load demo dev dev-down testbin images clean help

all: build

help: ## Show the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## Build the kubefill multi-call binary into bin/
	go build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN)/kubefill ./cmd/kubefill

# controller-gen is pinned in hack/tools/go.mod (a `tool` directive), a module of its own.
$(CONTROLLER_GEN): hack/tools/go.mod
	go -C hack/tools build -o $(CONTROLLER_GEN) sigs.k8s.io/controller-tools/cmd/controller-gen

generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types
	cd $(API_DIR) && $(CONTROLLER_GEN) object:headerFile=$(CURDIR)/hack/boilerplate.go.txt paths=./...

manifests: $(CONTROLLER_GEN) ## Generate the CRD YAML under manifests/crd
	cd $(API_DIR) && $(CONTROLLER_GEN) crd:crdVersions=v1,generateEmbeddedObjectMeta=true paths=./cdi/... output:crd:dir=$(CURDIR)/manifests/crd

verify-generated: generate manifests ## Fail if generated files differ from what is committed
	@if [ -n "$$(git status --porcelain -- $(API_DIR) manifests/crd)" ]; then \
	  echo "generated files are stale; run 'make generate manifests' and commit:"; \
	  git status --porcelain -- $(API_DIR) manifests/crd; git --no-pager diff --stat -- $(API_DIR) manifests/crd; exit 1; fi

fmt: ## Check formatting
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet: ## go vet the product and the API module
	go vet ./...
	cd $(API_DIR) && go vet ./...

images: ## Build the kubefill, busybox, pause and kubefill-dev images as OCI archives in _output/images (no Docker)
	VERSION=$(VERSION) bash hack/images.sh $(CURDIR)/_output/images

testbin: ## Build (or reuse) the real control-plane binaries; prints their directory
	@bash hack/testbin.sh

test: ## Run every test: checks, unit, integration (real kube-apiserver) and end-to-end
	bash hack/test.sh

test-unit: ## Unit tests only
	bash hack/test.sh unit

test-integration: ## Integration tests against a real kube-apiserver and etcd
	bash hack/test.sh integration

test-e2e: ## End-to-end tests on the local cluster
	bash hack/test.sh e2e

bench-import: ## Import benchmarks: ratios against qemu-img, curl+qemu-img and cp
	bash hack/deps.sh
	bash hack/bench-import.sh

demo: ## The main job: a local cluster imports a disk into a PVC through a DataVolume, checks the bytes, tears down
	bash hack/dev.sh check

bench-upload: ## Upload throughput through the proxy as a ratio to a plain loopback TLS copy
	bash hack/deps.sh
	KUBEFILL_BENCH_UPLOAD=1 go test -count=1 -run TestThroughputRatio -v ./pkg/uploadproxy/

bench-clone: ## Clone benchmarks on the local cluster: host-assisted vs cp --sparse=always, 2 vs 20 GiB virtual, snapshot and CSI clone at 1 and 8 GiB, peak RSS
	bash hack/bench-clone.sh

bench-load: ## Load and scale on the local cluster: 100 DataVolumes at once (20 clones), 10,000 PVCs/pods and 200 StorageClasses; controller peak RSS and idle request rate
	bash hack/bench-load.sh

dev: ## Bring the local cluster up with Kubefill running and leave it up (INSTALLED=1: installed from manifests/ as Deployments from the image; make dev-down removes it)
	bash hack/dev.sh

dev-down: ## Tear the local cluster down
	bash hack/dev.sh down

clean:
	rm -rf $(BIN)
