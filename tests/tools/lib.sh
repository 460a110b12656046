# Shared by the scripts that build one pinned tool into the cache outside the
# repository and print its path (tests/cdi-check/build.sh, tests/tools/cargo-deny.sh,
# tests/nodebench/build-example-driver.sh). Source it after `set -euo pipefail` with
# `tool_name` set; then:
#
#   tool_args "$@"                 --force / --check / --help into $force and $check
#   tool_log MESSAGE...            a timestamped progress line on stderr
#   go_module_version MOD GOMOD    the version GOMOD requires of MOD
#   go_tool_version MOD GOMOD      go_module_version, after checking that go is on
#                                  PATH; exits with a message if either fails
#   go_recipe_hash SRC FLAGS...    the stamp of a go build with FLAGS of the module
#                                  in SRC
#   tool_stamped BIN DIR WANT      BIN is built and DIR/stamp is WANT
#   tool_reuse BIN DIR is_current  --check mode, the lock, and the cached fast path:
#                                  returns (exits) when nothing is to be built
#   tool_go_build BIN DIR WANT SRC -- GO-BUILD-ARGS...
#                                  go build in SRC into a temporary file, then moves it
#                                  to BIN and writes the stamp WANT; a static
#                                  CGO_ENABLED=0 build unless the array tool_go_env
#                                  (NAME=VALUE words) says otherwise
#
# Progress goes to stderr, the binary's path to stdout, so callers can do
# `bin="$(script)"`.

: "${tool_name:?set tool_name before sourcing tests/tools/lib.sh}"
# shellcheck disable=SC2034 # read by the scripts that source this file
cache_root="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}"

tool_log() { printf '[%s %s] %s\n' "$tool_name" "$(date +%H:%M:%S)" "$*" >&2; }

tool_args() {
	force=0
	check=0
	while (($#)); do
		case "$1" in
		--force) force=1 ;;
		--check) check=1 ;;
		-h | --help)
			# The script's header comment, up to `set -euo`, is its help.
			sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
			exit 0
			;;
		*) echo "$(basename "$0"): unknown argument $1" >&2; exit 2 ;;
		esac
		shift
	done
}

go_module_version() {
	awk -v m="$1" '
		$1 == "require" && $2 == m { print $3; exit }
		$1 == m && $2 ~ /^v/ { print $2; exit }' "$2"
}

go_tool_version() {
	command -v go >/dev/null || { tool_log "go is not on PATH; install Go (see tests/scripts/setup.sh)"; exit 1; }
	local version
	version="$(go_module_version "$1" "$2")"
	[[ -n "$version" ]] || { tool_log "cannot read the $1 version from $2"; exit 1; }
	echo "$version"
}

# The stamp hashes $recipe_rev (bumped when the recipe changes in a way the hashed
# files do not show), the Go toolchain and platform, the build flags, SRC's go.mod
# and go.sum and its non-test .go files (a tools module that only requires the tool
# has none).
go_recipe_hash() {
	local src="$1"
	shift
	{
		echo "recipe=$recipe_rev go=$(go env GOVERSION) goos=$(go env GOOS) goarch=$(go env GOARCH) flags=$*"
		cd "$src"
		cat go.mod go.sum
		find . -maxdepth 1 -name '*.go' ! -name '*_test.go' -type f | LC_ALL=C sort | xargs -r cat
	} | sha256sum | cut -d' ' -f1
}

tool_stamped() { [[ -x "$1" && -f "$2/stamp" && "$(cat "$2/stamp")" == "$3" ]]; }

# $3 is the name of a function that succeeds when BIN is there and current.
tool_reuse() {
	local bin="$1" dir="$2" is_current="$3"
	if ((check)); then
		if "$is_current"; then echo "$bin"; exit 0; fi
		tool_log "not built or out of date: $bin"
		exit 1
	fi
	mkdir -p "$dir"
	# One builder at a time; the others wait, then find the tool current. The lock
	# is held until the script exits.
	exec 9>"$dir/.lock"
	if command -v flock >/dev/null; then
		flock 9
	fi
	if ((!force)) && "$is_current"; then
		tool_log "cached at $bin"
		echo "$bin"
		exit 0
	fi
}

tool_go_build() {
	local bin="$1" dir="$2" want="$3" src="$4"
	shift 5 # the four above and the `--`
	local start=$SECONDS
	tool_tmp="$(mktemp "$dir/.$(basename "$bin").XXXXXX")"
	trap 'rm -f "$tool_tmp"' EXIT
	(
		cd "$src"
		env CGO_ENABLED=0 ${tool_go_env[@]+"${tool_go_env[@]}"} GOWORK=off GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly" \
			go build -o "$tool_tmp" "$@"
	) || { tool_log "build FAILED after $((SECONDS - start))s"; exit 1; }
	chmod 755 "$tool_tmp"
	mv -f "$tool_tmp" "$bin"
	echo "$want" >"$dir/stamp"
	tool_log "built in $((SECONDS - start))s -> $bin"
	echo "$bin"
}
