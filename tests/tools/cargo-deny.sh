#!/usr/bin/env bash
# Installs cargo-deny, the dependency policy checker that `make deps-check` and
# `make deps-audit` run against deny.toml, at a pinned version into a cache outside
# the repository, and prints the binary's path on stdout:
#
#   ${TOPODRA_TOOLS_CACHE:-$HOME/.cache/topodra/tools}/cargo-deny-<version>/bin/cargo-deny
#
# The install uses cargo-deny's own Cargo.lock (--locked), so the same version always
# builds the same dependency tree. A binary already there that reports the pinned
# version is reused without touching the network. Concurrent callers serialize on a
# lock. Progress goes to stderr, so callers can do `bin="$(tests/tools/cargo-deny.sh)"`.
#
# Usage: tests/tools/cargo-deny.sh [--force] [--check]
#   --force   reinstall even when the cached binary is there
#   --check   install nothing; print the path and exit 0 if installed, else 1
#
# Environment: TOPODRA_TOOLS_CACHE (cache root), CARGO, CARGO_HOME as usual.
set -euo pipefail

# Bumping it: change the version, run `make deps-check`, fix deny.toml for whatever
# the new release reports differently.
version=0.20.2
tool_name="cargo-deny $version"
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tool_args "$@"
dir="$cache_root/cargo-deny-$version"
bin="$dir/bin/cargo-deny"
cargo="${CARGO:-cargo}"

# The version check, not mere existence, catches a binary that an interrupted or
# foreign install left behind.
is_current() { [[ -x "$bin" ]] && [[ "$("$bin" --version 2>/dev/null)" == "cargo-deny $version" ]]; }
tool_reuse "$bin" "$dir" is_current

command -v "$cargo" >/dev/null || { tool_log "$cargo is not on PATH; install Rust (rustup)"; exit 1; }
tool_log "building (cargo install --debug --locked: about 2 CPU-minutes, 1-4 min on 2 cores by load)"
start=$SECONDS
# No feature flags to trim: cargo-deny 0.20 has none (--no-default-features changes
# nothing), and it fetches the advisory database with the git binary, so the build
# carries no HTTP or git library anyway.
# --debug: an unoptimised build takes 63 s instead of 166 s on a cold CI run (2
# cores), and checking this workspace then takes 1.9 s instead of 0.8 s; the
# checks and their verdicts are the same code either way.
"$cargo" install --debug --locked --quiet --force cargo-deny --version "=$version" --root "$dir" ||
	{ tool_log "install FAILED after $((SECONDS - start))s"; exit 1; }
is_current || { tool_log "installed, but $bin does not report cargo-deny $version"; exit 1; }
tool_log "built in $((SECONDS - start))s -> $bin"
echo "$bin"
