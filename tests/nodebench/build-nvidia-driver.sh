#!/usr/bin/env bash
# Builds the GPU kubelet plugin of NVIDIA's DRA driver (sigs.k8s.io/dra-driver-nvidia-gpu,
# cmd/gpu-kubelet-plugin) from its Go module at the release nvidiadriver/go.mod pins,
# into a cache outside the repository, and prints the binary's path on stdout:
#
#   ${TOPODRA_TOOLS_CACHE:-$HOME/.cache/topodra/tools}/dra-driver-nvidia-gpu-<version>/gpu-kubelet-plugin
#
# As the driver's Makefile builds it: cgo on (go-nvml dlopens libnvidia-ml at run
# time and leaves its symbols unresolved until then, hence the linker flags), -s -w,
# and the release stamped into internal/info.version. The commit stays empty: a
# module build has no git checkout. v0.5.0 is not used: it needs
# github.com/NVIDIA/go-nvfm, which the module proxy here does not serve.
# A binary whose stamp matches the recipe (go.mod, go.sum, Go toolchain, C compiler,
# flags) is reused without the network. Progress goes to stderr.
#
# Usage: tests/nodebench/build-nvidia-driver.sh [--force] [--check]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/nvidiadriver" && pwd)"
tool_name=dra-driver-nvidia-gpu
# shellcheck source=../tools/lib.sh
source "$here/../../tools/lib.sh"
tool_args "$@"
module=sigs.k8s.io/dra-driver-nvidia-gpu
pkg=$module/cmd/gpu-kubelet-plugin
recipe_rev=1

version="$(go_tool_version "$module" "$here/go.mod")"
tool_name="dra-driver-nvidia-gpu $version"

dir="$cache_root/dra-driver-nvidia-gpu-$version"
bin="$dir/gpu-kubelet-plugin"
# -Wno-deprecated-declarations: go-nvml's generated bindings call deprecated NVML
# entry points, one warning each otherwise.
tool_go_env=(CGO_ENABLED=1 "CGO_CFLAGS=-O2 -Wno-deprecated-declarations"
	"CGO_LDFLAGS_ALLOW=-Wl,--unresolved-symbols=ignore-in-object-files")
ldflags="-s -w -X $module/internal/info.version=$version"
ldflags+=" '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
flags=(-trimpath "-ldflags=$ldflags")
cc="$("$(go env CC)" --version 2>/dev/null | head -n1)"
want="$(go_recipe_hash "$here" "${flags[@]}" "${tool_go_env[@]}" "cc=$cc")"
is_current() { tool_stamped "$bin" "$dir" "$want"; }
tool_reuse "$bin" "$dir" is_current

tool_log "building $pkg with cgo (modules downloaded on first use: about 2-4 minutes on 2 cores)"
tool_go_build "$bin" "$dir" "$want" "$here" -- "${flags[@]}" "$pkg"
