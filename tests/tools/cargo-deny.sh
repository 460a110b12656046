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
cache_root="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}"
dir="$cache_root/cargo-deny-$version"
bin="$dir/bin/cargo-deny"
cargo="${CARGO:-cargo}"

force=0
check=0
while (($#)); do
	case "$1" in
	--force) force=1 ;;
	--check) check=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "cargo-deny.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

log() { printf '[cargo-deny %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The version check, not mere existence, catches a binary that an interrupted or
# foreign install left behind.
is_current() { [[ -x "$bin" ]] && [[ "$("$bin" --version 2>/dev/null)" == "cargo-deny $version" ]]; }

if ((check)); then
	if is_current; then echo "$bin"; exit 0; fi
	log "not installed: $bin"
	exit 1
fi

mkdir -p "$dir"
# One installer at a time; the others wait, then find the binary there.
exec 9>"$dir/.lock"
if command -v flock >/dev/null; then
	flock 9
fi

if ((!force)) && is_current; then
	log "$version: cached at $bin"
	echo "$bin"
	exit 0
fi

command -v "$cargo" >/dev/null || { log "$cargo is not on PATH; install Rust (rustup)"; exit 1; }
log "$version: building (cargo install --locked: about 4.5 CPU-minutes, 3-16 min on 2 cores by load)"
start=$SECONDS
# No feature flags to trim: cargo-deny 0.20 has none (--no-default-features changes
# nothing), and it fetches the advisory database with the git binary, so the build
# carries no HTTP or git library anyway.
"$cargo" install --locked --quiet --force cargo-deny --version "=$version" --root "$dir" ||
	{ log "$version: install FAILED after $((SECONDS - start))s"; exit 1; }
is_current || { log "$version: installed, but $bin does not report cargo-deny $version"; exit 1; }
log "$version: built in $((SECONDS - start))s -> $bin"
echo "$bin"
