#!/usr/bin/env bash
# One-stop entry for shells and Makefiles (make demo, make bench):
#   - builds (or reuses) the pinned tools with tests/tools/build.sh,
#   - builds the topodra-cluster CLI of this directory (Go's build cache makes
#     a rebuild take about a second),
#   - runs it with TOPODRA_TOOLS_BIN set.
#
#   eval "$(tests/cluster/topodra-cluster.sh up --dir /tmp/topodra)"   # background
#   kubectl get --raw /readyz
#   tests/cluster/topodra-cluster.sh down --dir /tmp/topodra
#
# Tools to build can be narrowed with TOPODRA_TOOLS (default: "kube etcd").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache_root="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}"

# shellcheck disable=SC2086
tools_path="$("$root/tests/tools/build.sh" --print-path ${TOPODRA_TOOLS:-kube etcd})"
export TOPODRA_TOOLS_BIN="$tools_path${TOPODRA_TOOLS_BIN:+:$TOPODRA_TOOLS_BIN}"

cli="$cache_root/topodra-cluster/bin/topodra-cluster"
mkdir -p "$(dirname "$cli")"
(cd "$here" && CGO_ENABLED=0 go build -trimpath -o "$cli.tmp" ./cmd/topodra-cluster && mv "$cli.tmp" "$cli")
exec "$cli" "$@"
