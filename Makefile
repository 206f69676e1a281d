# ferry — build, generate, test and demo.
#
# Everything a target needs is built by make itself: the real servers used by
# the end-to-end tests (kcp, kube-apiserver, etcd) and the code generators come
# from Go modules and are cached outside the repository in $(FERRY_CACHE).

SHELL := /usr/bin/env bash -o pipefail
.DEFAULT_GOAL := help

FERRY_CACHE ?= $(HOME)/.cache/ferry
TOOLS_BIN   := $(FERRY_CACHE)/bin

# kcp: the tests run against the current release, built from its source tree
# (KCP_SRC), and a compatibility subset against the oldest supported release,
# built from Go modules.
KCP_VERSION            := v0.32.3
KCP_COMPAT_VERSION     := v0.28.1
KCP_SRC                ?= $(abspath $(CURDIR)/../shared/vendor/kcp-$(KCP_VERSION).tar.gz)
KUBE_APISERVER_VERSION := v1.36.3
ETCD_VERSION           := v3.6.16
BUF_VERSION            := v1.72.0
PROTOC_GEN_GO_VERSION  := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPCURL_VERSION        := v1.9.4
CONTROLLER_GEN_VERSION := v0.23.0
# Keep in step with test/tools/helm/go.mod.
HELM_VERSION           := v3.22.0

# The servers and helm are built from the modules under test/tools. Their
# cached binaries are named by version and by a hash of the files they are
# built from, not checked against those files' modification times: a fresh
# clone (every CI run) has newer files and would rebuild them all, while a
# changed go.mod, go.sum or main.go yields a new name and a new build.
content_sum = $(shell cat $(1) | { sha256sum 2>/dev/null || shasum -a 256; } | cut -c1-12)

# A source tree is keyed by its go.mod and go.sum, a tarball by its bytes.
kcp_src_files  := $(if $(wildcard $(KCP_SRC)/go.mod),$(KCP_SRC)/go.mod $(KCP_SRC)/go.sum,$(wildcard $(KCP_SRC)))
KCP_DIR        := $(TOOLS_BIN)/kcp-$(KCP_VERSION)-$(call content_sum,test/tools/kcp-source/build.sh $(kcp_src_files))
KCP            := $(KCP_DIR)/kcp
KCP_COMPAT     := $(TOOLS_BIN)/kcp-$(KCP_COMPAT_VERSION)-$(call content_sum,test/tools/kcp/go.mod test/tools/kcp/go.sum)
KUBE_APISERVER := $(TOOLS_BIN)/kube-apiserver-$(KUBE_APISERVER_VERSION)-$(call content_sum,test/tools/kube-apiserver/go.mod test/tools/kube-apiserver/go.sum)
ETCD           := $(TOOLS_BIN)/etcd-$(ETCD_VERSION)-$(call content_sum,test/tools/etcd/go.mod test/tools/etcd/go.sum test/tools/etcd/main.go)
BUF            := $(TOOLS_BIN)/buf-$(BUF_VERSION)/buf
PROTOC_GEN_GO  := $(TOOLS_BIN)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS_BIN)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
GRPCURL        := $(TOOLS_BIN)/grpcurl-$(GRPCURL_VERSION)/grpcurl
CONTROLLER_GEN := $(TOOLS_BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
HELM           := $(TOOLS_BIN)/helm-$(HELM_VERSION)-$(call content_sum,test/tools/helm/go.mod test/tools/helm/go.sum)

SERVER_TOOLS := $(KCP) $(KCP_COMPAT) $(KUBE_APISERVER) $(ETCD)
GEN_TOOLS    := $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(CONTROLLER_GEN)

# The test harness and the demo find the servers and binaries through these.
export FERRY_KCP_BIN            := $(KCP)
# kcp's front-proxy, cache-server and sharded-test-server (for the sharded kcp).
export FERRY_KCP_BIN_DIR        := $(KCP_DIR)
export FERRY_KUBE_APISERVER_BIN := $(KUBE_APISERVER)
export FERRY_ETCD_BIN           := $(ETCD)
export FERRY_GRPCURL_BIN        := $(GRPCURL)
export FERRY_HELM_BIN           := $(HELM)
export FERRY_BIN_DIR            := $(CURDIR)/bin

# Paths make generate writes; verify compares their content before and after.
GENERATED     := api/gen api/v1alpha1/zz_generated.deepcopy.go deploy/crd
GENERATED     += deploy/charts/ferry-edge/files
GENERATED_SUM := find $(GENERATED) -type f -exec sha256sum {} + | sort | sha256sum

GO_TEST_FLAGS ?= -race -count=1
E2E_TIMEOUT   ?= 45m
# A -run regexp for test-e2e-current (all tests when empty).
E2E_RUN       ?=

##@ General

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build

.PHONY: build
build: ## Build ferry-broker and ferry-edge into bin/.
	go build -o bin/ferry-broker ./broker/cmd/ferry-broker
	go build -o bin/ferry-edge ./edge/cmd/ferry-edge

.PHONY: build-race
build-race: ## Build both binaries (and the bench's direct copy, the demo and the test CONNECT proxy) with the race detector (used by the e2e tests).
	go build -race -o bin/ferry-broker ./broker/cmd/ferry-broker
	go build -race -o bin/ferry-edge ./edge/cmd/ferry-edge
	go build -race -o bin/ferry-directcopy ./test/cmd/directcopy
	go build -race -o bin/ferry-demo ./test/cmd/demo
	go build -race -o bin/ferry-connect-proxy ./test/cmd/connect-proxy

# Images: static binaries packed by test/tools/image (go-containerregistry)
# into OCI archives, as deploy/images/*.Dockerfile would build them.
IMAGE_VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null)
IMAGE_CREATED   ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_ARCH      ?= $(shell go env GOARCH)
IMAGE_CA_BUNDLE ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt))

.PHONY: image
image: ## Build static binaries and write OCI image archives to bin/images/ (no container daemon needed).
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) go build -trimpath -ldflags "-s -w" -o bin/static/ferry-broker ./broker/cmd/ferry-broker
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) go build -trimpath -ldflags "-s -w" -o bin/static/ferry-edge ./edge/cmd/ferry-edge
	cd test/tools/image && for b in ferry-broker ferry-edge; do \
	  go run . --binary $(CURDIR)/bin/static/$$b --out $(CURDIR)/bin/images/$$b.oci.tar --arch $(IMAGE_ARCH) \
	    --version "$(IMAGE_VERSION)" --revision "$(IMAGE_REVISION)" --created "$(IMAGE_CREATED)" \
	    $(if $(IMAGE_CA_BUNDLE),--ca-bundle $(IMAGE_CA_BUNDLE)) || exit 1; done

.PHONY: generate
generate: $(GEN_TOOLS) ## Regenerate committed code (protobuf, deepcopy, CRD manifests).
	PATH="$(dir $(PROTOC_GEN_GO)):$(dir $(PROTOC_GEN_GO_GRPC)):$$PATH" $(BUF) generate
	$(CONTROLLER_GEN) object paths=./api/v1alpha1/...
	$(CONTROLLER_GEN) crd paths=./api/v1alpha1/... output:crd:dir=deploy/crd
	cp deploy/crd/ferry.dev_publishedresources.yaml deploy/charts/ferry-edge/files/

.PHONY: verify
verify: $(GEN_TOOLS) ## Regenerate and fail if the generated code differs from what is checked out.
	@before=$$($(GENERATED_SUM)); $(MAKE) --no-print-directory generate >/dev/null; after=$$($(GENERATED_SUM)); \
	if [ "$$before" != "$$after" ]; then \
	  echo "generated code was out of date; make generate rewrote it (commit the result):"; git status --short -- $(GENERATED); exit 1; fi

.PHONY: lint
lint: $(BUF) ## gofmt check, go vet and buf lint.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(BUF) lint

##@ Test

.PHONY: test
test: verify lint test-unit test-image test-e2e ## Everything CI runs: generated-code check, lint, unit, image and e2e tests.

.PHONY: test-unit
test-unit: ## Unit tests (no servers).
	go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/e2e)

.PHONY: test-e2e
test-e2e: test-e2e-current test-e2e-compat ## End-to-end tests against real kcp (both versions), kube-apiserver and etcd.

# The long, mostly idle tests (the certificate renewal soak waits for ten
# minutes of two-minute certificates) run in a second go test process of
# their own servers beside the rest of the suite, which saves their
# duration; their output follows the suite's. E2E_RUN runs the named tests
# in one process instead.
E2E_BESIDE ?= ^TestCertificateRenewal$$

.PHONY: test-e2e-current
test-e2e-current: tools build-race ## The whole e2e suite against kcp $(KCP_VERSION).
ifneq ($(E2E_RUN),)
	FERRY_ARTIFACTS=$(CURDIR)/_artifacts go test $(GO_TEST_FLAGS) -timeout $(E2E_TIMEOUT) -v -run '$(E2E_RUN)' ./test/e2e/...
else
	@mkdir -p _artifacts; beside=_artifacts/e2e-beside.log; \
	FERRY_ARTIFACTS=$(CURDIR)/_artifacts go test $(GO_TEST_FLAGS) -timeout $(E2E_TIMEOUT) -v -run '$(E2E_BESIDE)' ./test/e2e/... >$$beside 2>&1 & pid=$$!; \
	FERRY_ARTIFACTS=$(CURDIR)/_artifacts go test $(GO_TEST_FLAGS) -timeout $(E2E_TIMEOUT) -v -skip '$(E2E_BESIDE)' ./test/e2e/...; rc=$$?; \
	wait $$pid; brc=$$?; echo "=== the tests run beside the suite ($(E2E_BESIDE)):"; cat $$beside; \
	if [ $$rc -ne 0 ] || [ $$brc -ne 0 ]; then echo "e2e failed (suite exit $$rc, beside exit $$brc)"; exit 1; fi
endif

# The compatibility subset: publish, create / update / status / delete,
# related objects both ways, edge and broker restarts.
E2E_COMPAT_TESTS ?= ^(TestPublishProjectsCRDIntoAPIExport|TestPublishedKindIsServedInConsumerWorkspace|TestSyncCreateUpdateStatusDelete|TestRelatedSecretFromServiceCluster|TestRelatedObjectsFromKCP|TestSyncConvergesAcrossEdgeAndBrokerRestarts)$$

.PHONY: test-e2e-compat
test-e2e-compat: $(KCP_COMPAT) $(KUBE_APISERVER) $(ETCD) $(GRPCURL) $(HELM) build-race ## The compatibility subset against kcp $(KCP_COMPAT_VERSION), the oldest supported.
	FERRY_KCP_BIN=$(KCP_COMPAT) FERRY_ARTIFACTS=$(CURDIR)/_artifacts go test $(GO_TEST_FLAGS) -timeout $(E2E_TIMEOUT) -v \
	  -run '$(E2E_COMPAT_TESTS)' ./test/e2e/...

.PHONY: test-image
test-image: image ## Read the image archives back: static binary, user 65532, entrypoint.
	cd test/tools/image && go vet . && FERRY_IMAGE_DIR=$(CURDIR)/bin/images FERRY_STATIC_BIN_DIR=$(CURDIR)/bin/static go test -count=1 -v .

FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Fuzz the edge's intent handling and the broker's report handling (FUZZTIME each, default 30s).
	go test -run '^$$' -fuzz '^FuzzIntent$$' -fuzztime $(FUZZTIME) ./edge/replication
	go test -run '^$$' -fuzz '^FuzzReport$$' -fuzztime $(FUZZTIME) ./broker/replication

BENCH_WORKSPACES ?= 10
BENCH_OBJECTS    ?= 100
BENCH_OUT        ?= $(CURDIR)/_bench
# A directory to collect CPU and heap profiles of broker and edge in (off when empty).
BENCH_PROFILES   ?=

.PHONY: bench
bench: tools ## Real-server benchmark: BENCH_WORKSPACES x BENCH_OBJECTS through the floor, the direct copy and ferry (table, JSON, SVG in BENCH_OUT).
	go build -o bin/bench/ferry-broker ./broker/cmd/ferry-broker
	go build -o bin/bench/ferry-edge ./edge/cmd/ferry-edge
	go build -o bin/bench/ferry-directcopy ./test/cmd/directcopy
	FERRY_BIN_DIR=$(CURDIR)/bin/bench FERRY_ARTIFACTS=$(CURDIR)/_artifacts FERRY_BENCH_OUT=$(BENCH_OUT) \
	FERRY_BENCH_WORKSPACES=$(BENCH_WORKSPACES) FERRY_BENCH_OBJECTS=$(BENCH_OBJECTS) FERRY_BENCH_PROFILES=$(BENCH_PROFILES) \
		go test -run '^$$' -bench '^BenchmarkSync$$' -benchtime 1x -timeout 90m -v ./test/e2e/

# The workspace-heavy shape: many workspaces, few objects each, ferry only.
BENCH_WS_WORKSPACES ?= 300
BENCH_WS_OBJECTS    ?= 3
# 1: the suite's kcp; 2: a sharded kcp (root shard + one), workspace i on shard i%2.
BENCH_WS_SHARDS     ?= 1

.PHONY: bench-workspaces
bench-workspaces: tools ## Real-server benchmark: BENCH_WS_WORKSPACES x BENCH_WS_OBJECTS through ferry on BENCH_WS_SHARDS kcp shards (broker memory per workspace, time until every workspace is synced, per shard too; table and JSON in BENCH_OUT).
	go build -o bin/bench/ferry-broker ./broker/cmd/ferry-broker
	go build -o bin/bench/ferry-edge ./edge/cmd/ferry-edge
	FERRY_BIN_DIR=$(CURDIR)/bin/bench FERRY_ARTIFACTS=$(CURDIR)/_artifacts FERRY_BENCH_OUT=$(BENCH_OUT) \
	FERRY_BENCH_WS_WORKSPACES=$(BENCH_WS_WORKSPACES) FERRY_BENCH_WS_OBJECTS=$(BENCH_WS_OBJECTS) FERRY_BENCH_WS_SHARDS=$(BENCH_WS_SHARDS) FERRY_BENCH_PROFILES=$(BENCH_PROFILES) \
		go test -run '^$$' -bench '^BenchmarkWorkspaces$$' -benchtime 1x -timeout 90m -v ./test/e2e/

# Simulated edges against one broker (no service cluster: the edges hold no
# objects). A load run, never part of make test.
BENCH_EDGES        ?= 100
BENCH_EDGES_STEADY ?= 60s
# Workspaces the edges' APIExports are spread over, round-robin (1: all in
# one, the broker's best case; kcp creates ~300 workspaces in ~2 minutes).
BENCH_EDGES_WORKSPACES ?= 1
# Edges that publish a CRD each and answer intents (0: no intent or report
# traffic), and the objects per second the generator writes across them.
BENCH_EDGES_TRAFFIC      ?= 20
BENCH_EDGES_TRAFFIC_RATE ?= 10
# More ferry-broker flags, e.g. --max-concurrent-handshakes=0 (no admission bound).
BENCH_EDGES_BROKER_ARGS ?=

.PHONY: bench-edges
bench-edges: $(KCP) ## Load benchmark: BENCH_EDGES simulated edges (own certificate and APIExport each) over mTLS against the real broker and kcp, BENCH_EDGES_TRAFFIC of them with intent/report traffic: broker CPU and memory per edge, handshakes/s, reconnect storms (table and JSON in BENCH_OUT).
	go build -o bin/bench/ferry-broker ./broker/cmd/ferry-broker
	go build -o bin/bench/edgeload ./test/cmd/edgeload
	bin/bench/edgeload --edges $(BENCH_EDGES) --workspaces $(BENCH_EDGES_WORKSPACES) --steady $(BENCH_EDGES_STEADY) --kcp-bin $(KCP) \
	  --traffic-edges $(BENCH_EDGES_TRAFFIC) --traffic-rate $(BENCH_EDGES_TRAFFIC_RATE) \
	  --broker-bin $(CURDIR)/bin/bench/ferry-broker --dir $(CURDIR)/_artifacts/bench-edges --out $(BENCH_OUT) \
	  $(foreach a,$(BENCH_EDGES_BROKER_ARGS),--broker-arg=$(a))

.PHONY: bench-unit
bench-unit: ## Micro-benchmarks of pure code (no servers).
	go test -run '^$$' -bench . -benchmem $$(go list ./... | grep -v /test/)

##@ Demo

.PHONY: demo
demo: tools build ## Run kcp, a service cluster, broker and edge on loopback (Ctrl-C stops all).
	go build -o bin/ferry-demo ./test/cmd/demo
	bin/ferry-demo --dir _demo

##@ Tools

.PHONY: tools
tools: $(SERVER_TOOLS) $(GEN_TOOLS) $(GRPCURL) $(HELM) ## Build the real servers, code generators, grpcurl and helm (cached).

# kcp v0.29 and later build only from a whole source tree (see the script);
# it says what to provide when KCP_SRC is missing.
$(KCP):
	@mkdir -p $(TOOLS_BIN)
	test/tools/kcp-source/build.sh "$(KCP_SRC)" $(KCP_VERSION) $(KCP_DIR)

$(KCP_COMPAT):
	@mkdir -p $(dir $@)
	cd test/tools/kcp && go build -o $@.tmp \
	  -ldflags "-X k8s.io/component-base/version.gitVersion=v1.32.3+kcp-$(KCP_COMPAT_VERSION) \
	            -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=32 \
	            -X k8s.io/client-go/pkg/version.gitVersion=v1.32.3+kcp-$(KCP_COMPAT_VERSION) \
	            -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=32" \
	  github.com/kcp-dev/kcp/cmd/kcp
	mv $@.tmp $@

$(KUBE_APISERVER):
	@mkdir -p $(dir $@)
	cd test/tools/kube-apiserver && go build -o $@.tmp \
	  -ldflags "-X k8s.io/component-base/version.gitVersion=$(KUBE_APISERVER_VERSION) \
	            -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36 \
	            -X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_APISERVER_VERSION) \
	            -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36" \
	  k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.tmp $@

$(ETCD):
	@mkdir -p $(dir $@)
	cd test/tools/etcd && go build -o $@.tmp .
	mv $@.tmp $@

# Helm for the chart tests; the version and the Kubernetes version it assumes
# by default (from its client-go, as Helm's own build sets them).
$(HELM):
	@mkdir -p $(dir $@)
	cd test/tools/helm && go build -o $@.tmp \
	  -ldflags "-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	            -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37 \
	            -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37" \
	  helm.sh/helm/v3/cmd/helm
	mv $@.tmp $@

# go install verifies each tool against its own go.sum; the directory name
# carries the version so a version bump rebuilds.
$(BUF):
	GOBIN=$(dir $@) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(PROTOC_GEN_GO):
	GOBIN=$(dir $@) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(dir $@) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(CONTROLLER_GEN):
	GOBIN=$(dir $@) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
$(GRPCURL):
	GOBIN=$(dir $@) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

.PHONY: clean
clean: ## Remove build output and demo state (keeps the tool cache).
	rm -rf bin _demo _artifacts
