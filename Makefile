# topodra: the two commands of the quick start are `make demo` and `make test`.
# Both install what they need (tests/scripts/setup.sh) on a Debian machine with Rust and Go.

CARGO ?= cargo
SIM_PROFILE ?= dgx-h100
PROFILES := tests/fake-nvml/profiles

.PHONY: all setup build release demo test test-unit lint fmt fmt-check clippy bench clean

all: build

setup:
	@bash tests/scripts/setup.sh

build: setup
	$(CARGO) build --workspace

release: setup
	$(CARGO) build --workspace --release

## demo: discovery on the built-in simulated node (fake NVML + matching hwloc topology).
demo: setup
	@bash tests/scripts/demo.sh $(SIM_PROFILE)

## test: everything CI runs: formatting, lints, unit and integration tests.
test: setup fmt-check clippy test-unit

test-unit:
	@echo "== cargo test (first build compiles the dependency tree: a few minutes on 2 cores)"
	$(CARGO) build -p topodra-fake-nvml
	$(CARGO) test --workspace --no-fail-fast

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
