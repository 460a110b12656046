#!/usr/bin/env bash
# Builds cdi-check (this directory's Go module, pinned by go.mod + go.sum) into a
# cache outside the repository and prints the binary's path on stdout:
#
#   ${TOPODRA_TOOLS_CACHE:-$HOME/.cache/topodra/tools}/cdi-check-<version>/cdi-check
#
# <version> is the container-device-interface library version go.mod requires. A
# binary whose stamp matches the recipe (go.mod, go.sum, the non-test .go files, the
# Go toolchain and the flags below) is reused without touching the network; anything
# else rebuilds. Concurrent callers (parallel tests) serialize on a lock. Progress
# goes to stderr, so callers can do `bin="$(tests/cdi-check/build.sh)"`.
#
# Usage: tests/cdi-check/build.sh [--force] [--check]
#   --force   rebuild even when the stamp matches
#   --check   build nothing; print the path and exit 0 if built and current, else 1
#
# Environment: TOPODRA_TOOLS_CACHE (cache root), GOCACHE/GOMODCACHE/GOPROXY as usual.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tool_name=cdi-check
# shellcheck source=../tools/lib.sh
source "$here/../tools/lib.sh"
tool_args "$@"
# Bump when the recipe changes in a way the hashed files do not show.
recipe_rev=1
module=tags.cncf.io/container-device-interface

version="$(go_tool_version "$module" "$here/go.mod")"
tool_name="cdi-check $version"
dir="$cache_root/cdi-check-$version"
bin="$dir/cdi-check"
flags=(-trimpath -ldflags=-s\ -w)

want="$(go_recipe_hash "$here" "${flags[@]}")"
is_current() { tool_stamped "$bin" "$dir" "$want"; }
tool_reuse "$bin" "$dir" is_current

tool_log "building (a cold build, modules downloaded, takes about 35 s on 2 cores)"
tool_go_build "$bin" "$dir" "$want" "$here" -- "${flags[@]}" .
