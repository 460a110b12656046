#!/usr/bin/env bash
# Builds the upstream tools that the end-to-end and scale suites run, each from its
# own wrapper Go module under tests/tools/<tool>/ (pinned in go.mod + go.sum), into
# a cache outside the repository:
#
#   ${TOPODRA_TOOLS_CACHE:-$HOME/.cache/topodra/tools}/<tool>-<version>/bin/
#
# A tool whose cache entry carries a stamp matching its recipe (go.mod, go.sum,
# main files, build flags) is reused; a version bump lands in a new directory, any
# other change rebuilds in place.  Progress goes to stderr; stdout carries only what
# was asked for, so callers can do `eval "$(tests/tools/build.sh --env)"`.
#
# Usage: tests/tools/build.sh [options] [tool...]      (tools: kube etcd kwok helm
#                                                       nvidia-ctk dra-driver-cpu krew;
#                                                       default: all of them)
#   Built only when named: topo-sched (the scale benchmark's legacy baseline:
#   scheduler-plugins' kube-scheduler as `topology-aware-scheduler`).
#   nvidia-ctk (nvidia-cdi-hook and nvidia-ctk of NVIDIA's container toolkit) is the
#   one cgo build; its licence files go to <tool>-<version>/share/, beside bin/.
#   dra-driver-cpu (dracpu, kubernetes-sigs' CPU DRA driver) runs beside our plugin
#   in the whole-node NUMA alignment e2e test.
#   krew (the kubectl plugin manager) installs kubectl-topodra from the krew
#   manifest of make release in the release e2e test.
#   --print-path   print the bin dirs as a PATH fragment (dir:dir:...)
#   --env          print `export TOPODRA_TOOLS_BIN=...` and `export PATH=...`
#                  (and TOPODRA_DRACPU=<path of dracpu> when dra-driver-cpu is asked for)
#   --check        build nothing; exit 1 (listing what is missing) unless all built
#   --force        rebuild even when the stamp matches
#   -h, --help     this text
#
# Environment: TOPODRA_TOOLS_CACHE (cache root), GOCACHE/GOMODCACHE/GOPROXY as usual.
# Times on the 2-core reference machine are in docs/e2e.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}"
all_tools=(kube etcd kwok helm nvidia-ctk dra-driver-cpu krew)
# Known tools that the default list (and so `make test`) leaves out.
named_only_tools=(topo-sched)
# Bump when the recipe below changes in a way go.mod/go.sum do not show.
recipe_rev=1

mode=build
force=0
tools=()
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
	case "$1" in
	--print-path) mode=path ;;
	--env) mode=env ;;
	--check) mode=check ;;
	--force) force=1 ;;
	-h | --help) usage; exit 0 ;;
	-*) echo "build.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
	*)
		case " ${all_tools[*]} ${named_only_tools[*]} " in
		*" $1 "*) tools+=("$1") ;;
		*) echo "build.sh: unknown tool $1 (known: ${all_tools[*]} ${named_only_tools[*]})" >&2; exit 2 ;;
		esac
		;;
	esac
	shift
done
((${#tools[@]})) || tools=("${all_tools[@]}")

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Module whose version names the cache entry, and the packages to build.
main_module() {
	case "$1" in
	kube) echo k8s.io/kubernetes ;;
	etcd) echo go.etcd.io/etcd/server/v3 ;;
	kwok) echo sigs.k8s.io/kwok ;;
	helm) echo helm.sh/helm/v3 ;;
	nvidia-ctk) echo github.com/NVIDIA/nvidia-container-toolkit ;;
	dra-driver-cpu) echo github.com/kubernetes-sigs/dra-driver-cpu ;;
	krew) echo sigs.k8s.io/krew ;;
	topo-sched) echo sigs.k8s.io/scheduler-plugins ;;
	esac
}
packages() {
	case "$1" in
	kube) echo k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl ;;
	etcd) echo . ;;
	kwok) echo sigs.k8s.io/kwok/cmd/kwok ./kwok-stages ;;
	helm) echo helm.sh/helm/v3/cmd/helm ;;
	nvidia-ctk) echo github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
		github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk ;;
	dra-driver-cpu) echo github.com/kubernetes-sigs/dra-driver-cpu/cmd/dracpu ;;
	krew) echo sigs.k8s.io/krew/cmd/krew ;;
	topo-sched) echo sigs.k8s.io/scheduler-plugins/cmd/scheduler ;;
	esac
}
# Binaries that go build names after their package directory, renamed: FROM:TO.
renames() {
	case "$1" in
	topo-sched) echo scheduler:topology-aware-scheduler ;;
	esac
}
binaries() {
	case "$1" in
	kube) echo kube-apiserver kube-controller-manager kube-scheduler kubectl ;;
	etcd) echo etcd ;;
	kwok) echo kwok kwok-stages ;;
	helm) echo helm ;;
	nvidia-ctk) echo nvidia-cdi-hook nvidia-ctk ;;
	dra-driver-cpu) echo dracpu ;;
	krew) echo krew ;;
	topo-sched) echo topology-aware-scheduler ;;
	esac
}
# Files of the main module's source copied into <tool>-<version>/share/: the licence
# texts that whoever redistributes the binaries (the plugin image) ships with them.
share_files() {
	case "$1" in
	nvidia-ctk) echo LICENSE THIRD_PARTY_NOTICES.md ;;
	esac
}

# cgo_env TOOL: the cgo settings of its build, one NAME=VALUE a line. Every tool is a
# static CGO_ENABLED=0 build except NVIDIA's, which needs cgo for go-nvml (it
# dlopens libnvidia-ml at run time, so nothing NVIDIA links in at build time).
# -Wno-deprecated-declarations: go-nvml's generated bindings call deprecated NVML
# entry points, one warning each otherwise.
cgo_env() {
	case "$1" in
	nvidia-ctk) printf '%s\n' CGO_ENABLED=1 "CGO_CFLAGS=-O2 -Wno-deprecated-declarations" ;;
	*) echo CGO_ENABLED=0 ;;
	esac
}

# The version the wrapper's go.mod requires, read without touching the network.
module_version() { required_version "$1" "$(main_module "$1")"; }
required_version() {
	awk -v m="$2" '
		$1 == "require" && $2 == m { print $3; exit }
		$1 == m && $2 ~ /^v/ { print $2; exit }' "$here/$1/go.mod"
}

# kube_stamp GIT_VERSION DATE: the -X flags, each with a space before it, that make
# a Kubernetes component report GIT_VERSION (vMAJOR.MINOR.PATCH, build metadata
# allowed) and its major and minor.
kube_stamp() {
	local version="$1" date="$2" major minor pkg flags=""
	major="${version#v}"; major="${major%%.*}"
	minor="${version#v*.}"; minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
	done
	echo "$flags"
}

# ldflags TOOL VERSION [BUILD_DATE]: the date only labels the binary and is left
# out of the stamp, so that a cache hit never needs the module cache or network.
ldflags() {
	local tool="$1" version="$2" date="${3:-unset}" flags="-s -w"
	case "$tool" in
	kube)
		# Without these the binaries report v0.0.0-master, and components that
		# compare versions (kubelet, scheduler, compatibility versions) misbehave.
		flags+="$(kube_stamp "$version" "$date")"
		;;
	etcd) flags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=$version" ;;
	kwok) flags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=${version#v}" ;;
	helm) flags+=" -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
	nvidia-ctk)
		# As the toolkit's Makefile builds its commands: CLI_VERSION (versions.mk's
		# LIB_VERSION, no leading v) into internal/info.version, and its extldflags
		# (lazy binding: go-nvml leaves the NVML symbols unresolved until it has
		# dlopened the library). gitCommit stays empty, as in the Makefile outside
		# a git checkout: the module proxy does not say which commit a tag is.
		flags+=" '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
		flags+=" -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${version#v}"
		;;
	dra-driver-cpu)
		# Nothing to stamp: dracpu has no version variable and logs only Go's
		# build info (its VCS fields are empty in a module build; `go version -m`
		# shows the module at v0.2.0).
		;;
	# As krew's Makefile stamps its releases (hack/make-binaries.sh): the tag; the
	# commit stays empty, the module proxy does not say which commit a tag is.
	krew) flags+=" -X sigs.k8s.io/krew/internal/version.gitTag=$version" ;;
	topo-sched)
		# cmd/scheduler is k8s.io/kubernetes' kube-scheduler with plugins added.
		# Stamped like scheduler-plugins' Makefile does (gitVersion=v0.33.5 only),
		# it takes 0.33 as its binary version and refuses to start: "emulation
		# version 0.33 is not between [1.31, 0.33.0]". Stamp the Kubernetes
		# release it is built on, with the scheduler-plugins release as semver
		# build metadata: v1.33.5+scheduler-plugins.v0.33.5.
		local kver
		kver="$(required_version "$tool" k8s.io/kubernetes)"
		flags+="$(kube_stamp "$kver+scheduler-plugins.$version" "$date")"
		;;
	esac
	echo "$flags"
}

# Release time of the pinned module (for buildDate), from the module cache or proxy.
module_time() {
	local t
	t="$(cd "$here/$1" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$(main_module "$1")" 2>/dev/null || true)"
	echo "${t:-1970-01-01T00:00:00Z}"
}

recipe_hash() {
	local tool="$1"
	{
		echo "recipe=$recipe_rev go=$(go env GOVERSION) goos=$(go env GOOS) goarch=$(go env GOARCH)"
		echo "ldflags=$(ldflags "$tool" "$(module_version "$tool")")"
		# Only where they differ from the defaults, so that the stamps of the other
		# tools stay what they were. A cgo build also depends on the C compiler.
		if [[ "$(cgo_env "$tool")" != CGO_ENABLED=0 ]]; then
			echo "cgo=$(cgo_env "$tool" | tr '\n' ' ')cc=$("$(go env CC)" --version 2>/dev/null | head -n1)"
		fi
		[[ -z "$(share_files "$tool")" ]] || echo "share=$(share_files "$tool")"
		(cd "$here/$tool" && cat go.mod go.sum && find . -name '*.go' -type f | LC_ALL=C sort | xargs -r cat)
	} | sha256sum | cut -d' ' -f1
}

tool_dir() { echo "$cache_root/$1-$(module_version "$1")"; }

is_built() {
	local tool="$1" dir b
	dir="$(tool_dir "$tool")"
	[[ -f "$dir/stamp" ]] || return 1
	[[ "$(cat "$dir/stamp")" == "$(recipe_hash "$tool")" ]] || return 1
	for b in $(binaries "$tool"); do [[ -x "$dir/bin/$b" ]] || return 1; done
	for b in $(share_files "$tool"); do [[ -f "$dir/share/$b" ]] || return 1; done
}

build_one() {
	local tool="$1" version dir start tmp gotmp
	version="$(module_version "$tool")"
	dir="$(tool_dir "$tool")"
	if ((!force)) && is_built "$tool"; then
		log "$tool $version: cached in $dir/bin"
		return 0
	fi
	# Two builds of the same tool at once (parallel make targets): the second
	# waits for the first and then finds it built.
	mkdir -p "$dir"
	local lockfd
	exec {lockfd}>"$dir/.lock"
	if ! flock -n "$lockfd"; then
		log "$tool $version: another build is running, waiting for it"
		flock "$lockfd"
		if ((!force)) && is_built "$tool"; then
			log "$tool $version: built by the other build in $dir/bin"
			exec {lockfd}>&-
			return 0
		fi
	fi
	local hint=""
	case "$tool" in
	kube) hint=" (cold: about 15-30 minutes on 2 cores)" ;;
	topo-sched) hint=" (cold: about 10-20 minutes on 2 cores)" ;;
	nvidia-ctk) hint=" (cold: about 1-2 minutes on 2 cores)" ;;
	dra-driver-cpu) hint=" (cold: about 2-4 minutes on 2 cores)" ;;
	krew) hint=" (cold: about 1 minute on 2 cores)" ;;
	esac
	log "$tool $version: building $(binaries "$tool")$hint"
	start=$SECONDS
	tmp="$(mktemp -d "$dir/.bin.XXXXXX")"
	# Heartbeat so a long cold build is visibly alive.
	(exec {lockfd}>&-; while sleep 60; do log "$tool $version: still building ($((SECONDS - start))s)"; done) &
	local beat=$!
	local rc=0
	# The build's own temporary directory: cgo writes the preamble it probes types with
	# into $TMPDIR and runs the C compiler on it there, so a quoted include resolves in
	# $TMPDIR first. A stray /tmp/nvml.h (an older NVML header) once made go-nvml's
	# `#include "nvml.h"` miss the types its own header declares.
	gotmp="$(mktemp -d "$dir/.tmp.XXXXXX")"
	(
		cd "$here/$tool"
		local cgo=()
		mapfile -t cgo < <(cgo_env "$tool")
		# shellcheck disable=SC2046
		env "${cgo[@]}" TMPDIR="$gotmp" GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly" \
			go build -trimpath -ldflags="$(ldflags "$tool" "$version" "$(module_time "$tool")")" -o "$tmp/" $(packages "$tool")
	) || rc=$?
	rm -rf "$gotmp"
	local r
	for r in $(renames "$tool"); do
		((rc == 0)) || break
		mv "$tmp/${r%%:*}" "$tmp/${r#*:}" || rc=$?
	done
	local share="" src
	if ((rc == 0)) && [[ -n "$(share_files "$tool")" ]]; then
		share="$(mktemp -d "$dir/.share.XXXXXX")"
		src="$(cd "$here/$tool" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' "$(main_module "$tool")")" || rc=$?
		for r in $(share_files "$tool"); do
			((rc == 0)) || break
			cp "$src/$r" "$share/$r" && chmod 644 "$share/$r" || rc=$?
		done
	fi
	kill "$beat" 2>/dev/null || true
	wait "$beat" 2>/dev/null || true
	if ((rc != 0)); then
		rm -rf "$tmp" ${share:+"$share"}
		log "$tool $version: build FAILED after $((SECONDS - start))s"
		exec {lockfd}>&-
		return "$rc"
	fi
	chmod 755 "$tmp"
	rm -rf "$dir/bin" "$dir/share"
	mv "$tmp" "$dir/bin"
	if [[ -n "$share" ]]; then
		chmod 755 "$share"
		mv "$share" "$dir/share"
	fi
	recipe_hash "$tool" >"$dir/stamp"
	exec {lockfd}>&-
	log "$tool $version: built in $((SECONDS - start))s -> $dir/bin"
}

bin_path() {
	local out="" t
	for t in "${tools[@]}"; do out+="${out:+:}$(tool_dir "$t")/bin"; done
	echo "$out"
}

command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }

if [[ "$mode" == check ]]; then
	missing=0
	for t in "${tools[@]}"; do
		if ! is_built "$t"; then echo "not built: $t $(module_version "$t") ($(tool_dir "$t"))" >&2; missing=1; fi
	done
	exit "$missing"
fi

total=$SECONDS
for t in "${tools[@]}"; do build_one "$t"; done
log "all requested tools ready in $((SECONDS - total))s"

case "$mode" in
path) bin_path ;;
env)
	p="$(bin_path)"
	printf 'export TOPODRA_TOOLS_BIN=%q\n' "$p"
	printf 'export PATH=%q:"$PATH"\n' "$p"
	# The e2e test that runs the CPU driver finds it by this variable (the binary's
	# name alone says nothing of which driver it is).
	case " ${tools[*]} " in
	*" dra-driver-cpu "*) printf 'export TOPODRA_DRACPU=%q\n' "$(tool_dir dra-driver-cpu)/bin/dracpu" ;;
	esac
	;;
esac
