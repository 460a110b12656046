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
cache_root="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}"
# Bump when the recipe changes in a way the hashed files do not show.
recipe_rev=1
module=tags.cncf.io/container-device-interface

force=0
check=0
while (($#)); do
	case "$1" in
	--force) force=1 ;;
	--check) check=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "cdi-check/build.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

log() { printf '[cdi-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

command -v go >/dev/null || { log "go is not on PATH; install Go (see tests/scripts/setup.sh)"; exit 1; }

version="$(awk -v m="$module" '
	$1 == "require" && $2 == m { print $3; exit }
	$1 == m && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")"
[[ -n "$version" ]] || { log "cannot read the $module version from $here/go.mod"; exit 1; }
dir="$cache_root/cdi-check-$version"
bin="$dir/cdi-check"
flags=(-trimpath -ldflags=-s\ -w)

recipe_hash() {
	{
		echo "recipe=$recipe_rev go=$(go env GOVERSION) goos=$(go env GOOS) goarch=$(go env GOARCH) flags=${flags[*]}"
		cd "$here"
		cat go.mod go.sum
		find . -maxdepth 1 -name '*.go' ! -name '*_test.go' -type f | LC_ALL=C sort | xargs -r cat
	} | sha256sum | cut -d' ' -f1
}

is_current() { [[ -x "$bin" && -f "$dir/stamp" && "$(cat "$dir/stamp")" == "$1" ]]; }

want="$(recipe_hash)"
if ((check)); then
	if is_current "$want"; then echo "$bin"; exit 0; fi
	log "not built or out of date: $bin"
	exit 1
fi

mkdir -p "$dir"
# One builder at a time; the others wait, then find the stamp current.
exec 9>"$dir/.lock"
if command -v flock >/dev/null; then
	flock 9
fi

if ((!force)) && is_current "$want"; then
	log "$version: cached at $bin"
	echo "$bin"
	exit 0
fi

log "$version: building (a cold build, modules downloaded, takes about 35 s on 2 cores)"
start=$SECONDS
tmp="$(mktemp "$dir/.cdi-check.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
(
	cd "$here"
	CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly" go build "${flags[@]}" -o "$tmp" .
) || { log "$version: build FAILED after $((SECONDS - start))s"; exit 1; }
chmod 755 "$tmp"
mv -f "$tmp" "$bin"
echo "$want" >"$dir/stamp"
log "$version: built in $((SECONDS - start))s -> $bin"
echo "$bin"
