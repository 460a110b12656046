#!/usr/bin/env bash
# Builds the kubelet plugin of the upstream reference DRA driver
# (sigs.k8s.io/dra-example-driver) from its Go module at the release exampledriver/go.mod
# pins, into a cache outside the repository, and prints the binary's path on stdout:
#
#   ${TOPODRA_TOOLS_CACHE:-$HOME/.cache/topodra/tools}/dra-example-driver-<version>/dra-example-kubeletplugin
#
# exampledriver/ is a tools module that requires the driver and nothing else, so its
# build list is the driver's own release build list (k8s 0.36, not our 0.37): the
# benchmark compares against what upstream released. (`go install pkg@version` would
# do the same, but it asks the proxy for the module's version list, which it refuses.)
# A binary whose stamp matches the recipe (go.mod, go.sum, Go toolchain, flags) is
# reused without the network. Progress goes to stderr.
#
# Usage: tests/nodebench/build-example-driver.sh [--force] [--check]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/exampledriver" && pwd)"
tool_name=dra-example-driver
# shellcheck source=../tools/lib.sh
source "$here/../../tools/lib.sh"
tool_args "$@"
module=sigs.k8s.io/dra-example-driver
pkg=sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin
recipe_rev=1

version="$(go_tool_version "$module" "$here/go.mod")"
tool_name="dra-example-driver $version"

dir="$cache_root/dra-example-driver-$version"
bin="$dir/dra-example-kubeletplugin"
# The optimised build a release image carries (Go optimises by default; -s -w only
# drops symbols, which RSS would otherwise partly count).
flags=(-trimpath -ldflags=-s\ -w)
want="$(go_recipe_hash "$here" "${flags[@]}")"
is_current() { tool_stamped "$bin" "$dir" "$want"; }
tool_reuse "$bin" "$dir" is_current

tool_log "building $pkg (modules downloaded on first use: a few minutes on 2 cores)"
tool_go_build "$bin" "$dir" "$want" "$here" -- "${flags[@]}" "$pkg"
