# topodra: the two commands of the quick start are `make demo` and `make test`.
# Both install what they need (tests/scripts/setup.sh) on a Debian machine with Rust and Go.

CARGO ?= cargo
SIM_PROFILE ?= dgx-h100
PROFILES := tests/fake-nvml/profiles

.PHONY: all setup build build-debug fuzz-build release push demo test test-unit test-e2e e2e tools-cdi chart-check deps-check deps-audit lint fmt fmt-check clippy bench bench-prepare bench-socket bench-scale bench-node bench-fragmentation bench-plots clean image image-check image-test gpu-check gpu-check-bundle gpu-check-dry

all: build

setup:
	@bash tests/scripts/setup.sh

build: setup
	$(CARGO) build --workspace

## release: target/release-artifacts/<version>/: the image tarballs (docker-loadable and
## the OCI layout), the chart package, kubectl-topodra's archive and krew manifest
## (RELEASE_URL: where the archive will be downloaded from), an SPDX SBOM, build.json
## and SHA256SUMS.
release: image
	@bash deploy/image/release.sh

## push: `make push REGISTRY=host[:port][/path]` pushes the release's images (by digest)
## and its chart (an OCI artifact) to REGISTRY, writes target/push/values.yaml for helm
## install and prints the command. INSECURE=1 for a registry without TLS.
## docs/deployment.md#images
push: release
	@bash deploy/image/push.sh

## image: the OCI images of the plugin and of the controller (with kubectl-topodra),
## assembled without a container daemon from the release binaries and Debian packages:
## target/image/oci, target/image/*.docker.tar; prints the digests. docs/deployment.md#images
image: setup
	@bash deploy/image/build.sh

## image-check: `make image`, then assemble again and fail unless byte-identical.
image-check: setup
	@bash deploy/image/build.sh --check

## image-test: the image tool's own tests (reproducibility on small fixture inputs).
image-test:
	cd deploy/image && go vet ./... && go test -count=1 ./...

## demo: a local control plane, the plugin on a simulated DGX H100, aligned GPU pods.
demo: setup
	@bash tests/scripts/demo.sh $(SIM_PROFILE)

## test: everything CI runs: formatting, lints, unit, integration and e2e tests, as
## timed phases with the Go tools built alongside (tests/scripts/test.sh), ending with a
## table of the phases and their times.
test:
	@bash tests/scripts/test.sh

## NVIDIA's nvidia-cdi-hook and nvidia-ctk (tests/tools/build.sh nvidia-ctk, a cgo build
## into the tools cache): the hook the plugin installs, and the toolkit's spec generator.
CTK_ENV = ctk="$$(bash tests/tools/build.sh --print-path nvidia-ctk)" && \
	export TOPODRA_NVIDIA_CDI_HOOK="$$ctk/nvidia-cdi-hook" TOPODRA_NVIDIA_CTK="$$ctk/nvidia-ctk"

## build-debug: the one debug build that the unit tests, the e2e tests and the fuzz
## check share: the fake NVML library, then every test, binary and example of the
## workspace with the crash-points feature (fault injection for the crash tests; inert
## unless a test arms it), so that none of them rebuilds the others' binaries.
## --locked: a Cargo.lock that no longer matches the manifests fails the build instead
## of being rewritten unseen (as the release build and the fuzz build require too).
CARGO_TEST = $(CARGO) test --workspace --locked --no-fail-fast --features topodra-kubelet-plugin/crash-points
build-debug: setup
	@echo "== debug build (cold: the dependency tree, a few minutes on 2 cores)"
	$(CARGO) build -p topodra-fake-nvml
	$(CARGO_TEST) --no-run

## fuzz-build: the fuzz targets (fuzz/, their own workspace and lock file) built on
## stable, without the sanitizers cargo-fuzz adds, so that a rename in the crates they
## call cannot break them unseen; then each replays its seed corpus (fuzz/corpus/<target>,
## libFuzzer's -runs=0: every input once, no fuzzing). In target/, where the debug
## build's dependencies are reused (only the fuzz bins themselves land in target/debug).
## Fuzzing for real: docs/e2e.md, "Fuzzing".
FUZZ_TARGETS = $(basename $(notdir $(wildcard fuzz/fuzz_targets/*.rs)))
fuzz-build: setup
	$(CARGO) build --locked --manifest-path fuzz/Cargo.toml --target-dir target --bins
	@for t in $(FUZZ_TARGETS); do \
		[ -d fuzz/corpus/$$t ] || { echo "fuzz: $$t has no seed corpus"; continue; }; \
		out=$$(target/debug/$$t -runs=0 fuzz/corpus/$$t 2>&1) || { echo "$$out"; echo "fuzz: $$t FAILED on its corpus"; exit 1; }; \
		echo "fuzz: $$t: $$(echo "$$out" | tail -n1)"; \
	done

## UNIT_DEPS: what test-unit builds first; `make test` has built it in an earlier phase
## and passes it empty (building again would not be a no-op: the fake NVML's cdylib
## has one file name for every feature set, so `cargo build -p topodra-fake-nvml` and
## `cargo test` each rebuild what the other wrote).
UNIT_DEPS ?= tools-cdi build-debug
test-unit: $(UNIT_DEPS)
	@echo "== cargo test"
	$(CTK_ENV) && TOPODRA_CDI_CHECK=$$(bash tests/cdi-check/build.sh) TOPODRA_REQUIRE_TOOLS=1 $(CARGO_TEST)

## gpu-check: the real-GPU check (tests/gpu/gpu-check.sh), on a machine with an NVIDIA
## GPU and driver: records what the machine reports, checks discovery against it, and
## runs one claim in runc with a CUDA probe; results in $$OUT/gpu-check (or
## target/gpu-check/results), the folder to commit as the machine's fixture. It needs
## the bundle that gpu-check-bundle builds here. docs/e2e.md, "The real-GPU check".
gpu-check:
	@bash tests/gpu/gpu-check.sh

## gpu-check-bundle: target/gpu-check/bundle.tar.xz, every program gpu-check runs
## (release builds, stripped, and the tools), for a machine without Rust, Go or runc.
gpu-check-bundle: setup
	@bash tests/gpu/bundle.sh

## gpu-check-dry: the same script on a simulated node from the debug build, where what
## only a real GPU shows is SKIP and everything else must pass (make test runs it).
gpu-check-dry:
	@bash tests/gpu/gpu-check.sh --dry-run --bin-dir target/debug --out target/gpu-check/dry-run

## test-e2e: a real control plane built from its Go modules (tools cached outside the
## repository: the first build takes 15-30 minutes on 2 cores), then the end-to-end suites.
## Every Go test here is built as the tools are (CGO_ENABLED=0, -trimpath), so that a
## cold run compiles client-go and its dependencies once, for both.
test-e2e:
	@bash tests/tools/build.sh kube etcd kwok
	eval "$$(bash tests/tools/build.sh --env)" && cd tests/cluster && TOPODRA_REQUIRE_TOOLS=1 CGO_ENABLED=0 go test -trimpath -count=1 ./...
	cd tests/scale && CGO_ENABLED=0 go vet -trimpath ./... && CGO_ENABLED=0 go test -trimpath -count=1 ./...
	cd tests/nodebench && CGO_ENABLED=0 go vet -trimpath ./... && CGO_ENABLED=0 go test -trimpath -count=1 ./...

## e2e: the end-to-end tests of tests/e2e: the plugin binary on simulated nodes, the
## kubelet's own plugin-manager and DRA-manager code (tests/e2e/harness) as its peer, the
## real kube-scheduler and controller-manager. E2E_RUN=<regexp> selects tests.
## E2E_PARALLEL tests run at once: each has its own control plane and node, and most of
## a test's time is waiting on them (docs/e2e.md, "How long make test takes").
E2E_RUN ?= .
E2E_PARALLEL ?= 6
## The image tests run the plugin from the root filesystem of `make image`'s OCI layout.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
IMAGE_ROOTFS := target/image/rootfs/kubelet-plugin
## E2E_DEPS: what e2e builds first; `make test` has built them in earlier phases and
## passes it empty.
E2E_DEPS ?= release build-debug
e2e: $(E2E_DEPS)
	@bash tests/tools/build.sh kube etcd helm nvidia-ctk dra-driver-cpu krew
	rm -rf $(IMAGE_ROOTFS)
	target/image/bin/topodra-image unpack -ref topodra-kubelet-plugin:$(VERSION) -dest $(IMAGE_ROOTFS)
	eval "$$(bash tests/tools/build.sh --env kube etcd helm dra-driver-cpu krew)" && $(CTK_ENV) && cd tests/e2e && \
		TOPODRA_IMAGE_ROOTFS=$(CURDIR)/$(IMAGE_ROOTFS) TOPODRA_RELEASE_DIR=$(CURDIR)/target/release-artifacts/$(VERSION) \
		TOPODRA_IMAGE_TOOL=$(CURDIR)/target/image/bin/topodra-image TOPODRA_REQUIRE_TOOLS=1 CGO_ENABLED=0 \
		go test -trimpath -count=1 -timeout 30m -v -parallel $(E2E_PARALLEL) -run '$(E2E_RUN)' ./...

## tools-cdi: the CDI Go library check (what container runtimes run on our specs), and its own tests.
tools-cdi:
	@bash tests/cdi-check/build.sh >/dev/null
	cd tests/cdi-check && go test ./...

## chart-check: helm lint, and deploy/manifests/topodra.yaml is the chart rendered now.
chart-check:
	@bash deploy/render.sh --check

## deps-check: the dependency policy in deny.toml (licenses, one version of each crate,
## no wildcards, crates.io only), offline, with the pinned cargo-deny that
## tests/tools/cargo-deny.sh builds into the tools cache. cargo-deny reads the manifests
## of every platform's dependencies; `cargo fetch` gets those a Linux build never
## downloads (once; a no-op after). Exceptions: docs/design.md, "Dependency policy".
deps-check:
	@deny="$$(bash tests/tools/cargo-deny.sh)" && $(CARGO) fetch --locked && \
		"$$deny" --offline --locked check licenses bans sources

## deps-audit: RustSec advisories for Cargo.lock. Online (it fetches the advisory
## database), so not part of `make test`.
deps-audit:
	@deny="$$(bash tests/tools/cargo-deny.sh)" && "$$deny" --locked check advisories

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

# Twice: the crash-points code (test-only fault injection) is compiled only with its feature.
clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --all-targets --features topodra-kubelet-plugin/crash-points -- -D warnings

## bench-prepare: prepare/unprepare latency of the release plugin over its real sockets, as
## ratios to references measured in the same run; writes target/bench/prepare.json.
## See docs/benchmarks.md. TOPODRA_BENCH_ITERS / TOPODRA_BENCH_WARMUP override 1000 / 100.
## bench: every benchmark: prepare latency over the real sockets, what unfinished
## messages on the DRA socket make the plugin hold, the scale run, the node path
## against the reference driver, and dynamic MIG fragmentation by device order.
bench: bench-prepare bench-socket bench-scale bench-node bench-fragmentation

## bench-fragmentation: a churn of MIG profile and whole-GPU claims on the simulated
## DGX H100 with dynamic MIG, through the real 1.37.2 allocator, for topodra's device
## order against a lexical and a shuffled one; writes target/bench/fragmentation.json
## (docs/benchmarks.md, "Dynamic MIG: device order and fragmentation").
bench-fragmentation: setup
	$(CARGO) build -p topodra-fake-nvml
	$(CARGO) build -p topodra-kubelet-plugin --features topodra-kubelet-plugin/crash-points
	cd tests/e2e && TOPODRA_BENCH_FRAGMENTATION=$(CURDIR)/target/bench/fragmentation.json CGO_ENABLED=0 \
		go test -trimpath -count=1 -timeout 20m -v -run '^TestFragmentationBenchmark$$' .

bench-prepare: setup
	@echo "== cargo bench (release build: the first one takes several minutes on 2 cores)"
	$(CARGO) build -p topodra-fake-nvml
	$(CARGO) bench -p topodra-kubelet-plugin --bench prepare

## bench-socket: the plugin's memory while local clients hold unfinished 4 MiB messages on
## its DRA socket; writes target/bench/socket_memory.json (docs/benchmarks.md).
bench-socket: setup
	$(CARGO) build -p topodra-fake-nvml
	$(CARGO) bench -p topodra-kubelet-plugin --bench socket_memory

## bench-scale: the talk's experiment on SCALE_NODES kwok nodes (default 100): the DRA
## stack against the legacy topology stack, each on its own control plane; results in
## target/bench-scale (docs/benchmarks.md). SCALE_ARGS passes more flags, e.g.
## SCALE_ARGS="-waves 5 -idle 10m".
SCALE_NODES ?= 100
SCALE_ARGS ?=
# The topology-aware scheduler (a kube-scheduler of its own, 10-20 minutes cold) only
# where the legacy stack runs.
SCALE_TOOLS = kube etcd kwok helm $(if $(findstring -legacy=false,$(SCALE_ARGS)),,topo-sched)
bench-scale: setup
	@echo "== release builds of the plugin, the fake NVML and the controller"
	$(CARGO) build --release -p topodra-fake-nvml -p topodra-kubelet-plugin -p topodra-controller
	@bash tests/tools/build.sh $(SCALE_TOOLS)
	eval "$$(bash tests/tools/build.sh --env $(SCALE_TOOLS))" && cd tests/scale && \
		CGO_ENABLED=0 go run -trimpath . -nodes $(SCALE_NODES) -out target/bench-scale $(SCALE_ARGS)

## bench-node: the node path against the reference driver (sigs.k8s.io/dra-example-driver)
## and NVIDIA's GPU kubelet plugin (sigs.k8s.io/dra-driver-nvidia-gpu, on the same
## simulated node as topodra), each built from its Go module at the version
## tests/nodebench/{exampledriver,nvidiadriver}/go.mod pins: each plugin registered by
## the kubelet's plugin-manager code, then prepare/unprepare latency over its DRA
## socket, RSS, start to slices published and slice bytes per device; writes
## target/bench/nodebench.json, .md and .slices.json (docs/benchmarks.md).
## NODE_BENCH_ARGS passes flags.
NODE_BENCH_ARGS ?=
bench-node: setup
	$(CARGO) build --release -p topodra-kubelet-plugin -p topodra-fake-nvml
	@bash tests/tools/build.sh kube etcd
	bash tests/nodebench/build-example-driver.sh >/dev/null
	bash tests/nodebench/build-nvidia-driver.sh >/dev/null
	eval "$$(bash tests/tools/build.sh --env kube etcd)" && $(CTK_ENV) && cd tests/nodebench && \
		CGO_ENABLED=0 go run -trimpath . -out $(CURDIR)/target/bench/nodebench.json \
		-topodra-plugin $(CURDIR)/target/release/topodra-kubelet-plugin \
		-sim-node $(CURDIR)/target/release/topodra-sim-node \
		-example-plugin "$$(bash build-example-driver.sh --check)" \
		-example-version "$$(awk '$$1 == "require" && $$2 == "sigs.k8s.io/dra-example-driver" { print $$3 }' exampledriver/go.mod)" \
		-nvidia-plugin "$$(bash build-nvidia-driver.sh --check)" \
		-nvidia-cdi-hook "$$TOPODRA_NVIDIA_CDI_HOOK" \
		$(NODE_BENCH_ARGS)

## bench-plots: PNG plots of the committed scale results, in docs/benchmarks: from the
## fair-method runs of both stacks (scale-100-fair), throughput, latency, CPU per pod and
## Go heap, DRA against legacy, medians with the runs' range; from the earlier tuning
## runs, memory over time (tuning-default) and the API server's memory under the
## tunings (tuning-*). See docs/benchmarks.md.
BENCH_DOCS = ../../docs/benchmarks
bench-plots:
	cd tests/scale && CGO_ENABLED=0 go run -trimpath ./cmd/bench-plots -out $(BENCH_DOCS) \
		-scale $(BENCH_DOCS)/scale-100-fair.json -memory $(BENCH_DOCS)/tuning-default.json \
		-series $(BENCH_DOCS)/tuning-default.json,$(BENCH_DOCS)/tuning-gogc50.json,$(BENCH_DOCS)/tuning-goaway.json

clean:
	$(CARGO) clean
