# topodra: the two commands of the quick start are `make demo` and `make test`.
# Both install what they need (tests/scripts/setup.sh) on a Debian machine with Rust and Go.

CARGO ?= cargo
SIM_PROFILE ?= dgx-h100
PROFILES := tests/fake-nvml/profiles

.PHONY: all setup build release demo test test-unit test-e2e e2e tools-cdi chart-check lint fmt fmt-check clippy bench bench-prepare bench-scale clean

all: build

setup:
	@bash tests/scripts/setup.sh

build: setup
	$(CARGO) build --workspace

release: setup
	$(CARGO) build --workspace --release

## demo: a local control plane, the plugin on a simulated DGX H100, aligned GPU pods.
demo: setup
	@bash tests/scripts/demo.sh $(SIM_PROFILE)

## test: everything CI runs: formatting, lints, unit and integration tests.
test: setup fmt-check clippy chart-check test-unit test-e2e e2e

test-unit: tools-cdi
	@echo "== cargo test (first build compiles the dependency tree: a few minutes on 2 cores)"
	$(CARGO) build -p topodra-fake-nvml
	TOPODRA_CDI_CHECK=$$(bash tests/cdi-check/build.sh) TOPODRA_REQUIRE_TOOLS=1 $(CARGO) test --workspace --no-fail-fast

## test-e2e: a real control plane built from its Go modules (tools cached outside the
## repository: the first build takes 15-30 minutes on 2 cores), then the end-to-end suites.
test-e2e:
	@bash tests/tools/build.sh kube etcd kwok
	eval "$$(bash tests/tools/build.sh --env)" && cd tests/cluster && TOPODRA_REQUIRE_TOOLS=1 go test -count=1 ./...
	cd tests/scale && CGO_ENABLED=0 go vet ./... && CGO_ENABLED=0 go test -trimpath -count=1 ./...

## e2e: the end-to-end tests of tests/e2e: the plugin binary on simulated nodes, the
## kubelet's own plugin-manager and DRA-manager code (tests/e2e/harness) as its peer, the
## real kube-scheduler and controller-manager. E2E_RUN=<regexp> selects tests.
E2E_RUN ?= .
e2e:
	$(CARGO) build -p topodra-fake-nvml -p topodra-kubelet-plugin -p topodra-controller
	@bash tests/tools/build.sh kube etcd helm
	eval "$$(bash tests/tools/build.sh --env kube etcd helm)" && cd tests/e2e && \
		TOPODRA_REQUIRE_TOOLS=1 CGO_ENABLED=0 go test -trimpath -count=1 -timeout 30m -v -run '$(E2E_RUN)' ./...

## tools-cdi: the CDI Go library check (what container runtimes run on our specs), and its own tests.
tools-cdi:
	@bash tests/cdi-check/build.sh >/dev/null
	cd tests/cdi-check && go test ./...

## chart-check: helm lint, and deploy/manifests/topodra.yaml is the chart rendered now.
chart-check:
	@bash deploy/render.sh --check

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## bench: prepare/unprepare latency of the release plugin over its real sockets, as
## ratios to references measured in the same run; writes target/bench/prepare.json.
## See docs/benchmarks.md. TOPODRA_BENCH_ITERS / TOPODRA_BENCH_WARMUP override 1000 / 100.
## bench: both benchmarks: prepare latency over the real sockets, then the scale run.
bench: bench-prepare bench-scale

bench-prepare: setup
	@echo "== cargo bench (release build: the first one takes several minutes on 2 cores)"
	$(CARGO) build -p topodra-fake-nvml
	$(CARGO) bench -p topodra-kubelet-plugin --bench prepare

## bench-scale: the talk's experiment on SCALE_NODES kwok nodes (default 100): the DRA
## stack against the legacy topology stack, each on its own control plane; results in
## target/bench-scale (docs/benchmarks.md). SCALE_ARGS passes more flags, e.g.
## SCALE_ARGS="-waves 5 -idle 10m".
SCALE_NODES ?= 100
SCALE_ARGS ?=
bench-scale: setup
	@echo "== release builds of the plugin, the fake NVML and the controller"
	$(CARGO) build --release -p topodra-fake-nvml -p topodra-kubelet-plugin -p topodra-controller
	@bash tests/tools/build.sh kube etcd kwok helm topo-sched
	eval "$$(bash tests/tools/build.sh --env kube etcd kwok helm topo-sched)" && cd tests/scale && \
		CGO_ENABLED=0 go run -trimpath . -nodes $(SCALE_NODES) -out target/bench-scale $(SCALE_ARGS)

clean:
	$(CARGO) clean
