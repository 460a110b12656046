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
cache_root="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}"
module=sigs.k8s.io/dra-example-driver
version="$(awk -v m="$module" '
	$1 == "require" && $2 == m { print $3; exit }
	$1 == m && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")"
pkg=sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin
recipe_rev=1

force=0
check=0
while (($#)); do
	case "$1" in
	--force) force=1 ;;
	--check) check=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "build-example-driver.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

log() { printf '[dra-example-driver %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v go >/dev/null || { log "go is not on PATH"; exit 1; }
[[ -n "$version" ]] || { log "cannot read the $module version from $here/go.mod"; exit 1; }

dir="$cache_root/dra-example-driver-$version"
bin="$dir/dra-example-kubeletplugin"
# The optimised build a release image carries (Go optimises by default; -s -w only
# drops symbols, which RSS would otherwise partly count).
flags=(-trimpath -ldflags=-s\ -w)
want="$({
	echo "recipe=$recipe_rev go=$(go env GOVERSION) goos=$(go env GOOS) goarch=$(go env GOARCH) flags=${flags[*]}"
	cat "$here/go.mod" "$here/go.sum"
} | sha256sum | cut -d' ' -f1)"
is_current() { [[ -x "$bin" && -f "$dir/stamp" && "$(cat "$dir/stamp")" == "$want" ]]; }

if ((check)); then
	if is_current; then echo "$bin"; exit 0; fi
	log "not built or out of date: $bin"
	exit 1
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
if command -v flock >/dev/null; then
	flock 9
fi
if ((!force)) && is_current; then
	log "$version: cached at $bin"
	echo "$bin"
	exit 0
fi

log "$version: building $pkg (modules downloaded on first use: a few minutes on 2 cores)"
start=$SECONDS
tmp="$(mktemp "$dir/.dra-example-kubeletplugin.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
(
	cd "$here"
	CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly" go build "${flags[@]}" -o "$tmp" "$pkg"
) || { log "$version: build FAILED after $((SECONDS - start))s"; exit 1; }
chmod 755 "$tmp"
mv -f "$tmp" "$bin"
echo "$want" >"$dir/stamp"
log "$version: built in $((SECONDS - start))s -> $bin"
echo "$bin"
