#!/usr/bin/env bash
# `make test`: everything CI runs, as timed phases, ending with a table of the phases
# and their times (also when a phase fails), so a slowdown shows in every run.
#
# Where the time goes on the 2-core reference machine, and why the order below: the
# Rust builds (clippy, the debug build, the release build) and the Go tools (the
# Kubernetes components, cargo-deny, ...) are each several CPU-minutes, and neither
# keeps both cores busy all the time (cargo links and compiles its largest crates
# alone; the unit tests mostly wait on processes they start). So the Go tools are
# built in the background at a lower priority from the first phase on: they take the
# cores the foreground leaves idle, and the phases that need them wait for them.
# Every build happens once: the unit tests, the e2e tests and the fuzz targets share
# one debug build (`make build-debug`), and the image, the release artifacts and
# the image check share one release build.
#
# Environment: TOPODRA_TEST_LOG_DIR (default target/test-run): the background tools'
# log and phases.tsv (phase, seconds, result) for whoever wants the figures.
set -euo pipefail
cd "$(dirname "$0")/../.."

log_dir=${TOPODRA_TEST_LOG_DIR:-target/test-run}
mkdir -p "$log_dir"
tsv=$log_dir/phases.tsv
: >"$tsv"
started=$SECONDS
names=()
secs=()
results=()

table() {
	local status=$?
	printf '\n== phases (%s, %s cores)\n' "$(date -u +%FT%TZ)" "$(nproc)"
	printf '%-34s %8s  %s\n' phase seconds result
	local i
	for i in "${!names[@]}"; do
		printf '%-34s %8s  %s\n' "${names[$i]}" "${secs[$i]}" "${results[$i]}"
	done
	local verdict=ok
	[[ $status -eq 0 ]] || verdict=FAILED
	printf '%-34s %8s  %s\n' total "$((SECONDS - started))" "$verdict"
	printf 'total\t%s\t%s\n' "$((SECONDS - started))" "$verdict" >>"$tsv"
	if [[ -n ${tools_pid:-} ]] && kill -0 "$tools_pid" 2>/dev/null; then
		kill -- "-$tools_pid" 2>/dev/null || kill "$tools_pid" 2>/dev/null || true
	fi
}
trap table EXIT

record() {
	names+=("$1")
	secs+=("$2")
	results+=("$3")
	printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$tsv"
}

# phase NAME CMD...: runs CMD, records its time; a failure ends the run.
phase() {
	local name=$1
	shift
	local t0=$SECONDS
	printf '\n\033[1m== [%s] %s\033[0m\n' "$name" "$*"
	if "$@"; then
		record "$name" "$((SECONDS - t0))" ok
	else
		local rc=$?
		record "$name" "$((SECONDS - t0))" "FAILED ($rc)"
		exit "$rc"
	fi
}

# The Go tools (and cargo-deny), built in the background at a lower priority; the
# first two are what the unit tests need, so they come first. Output goes to a log
# (each tool prints progress there every minute); wait_tools shows it.
tools_log=$log_dir/tools.log
build_tools() {
	local t0=$SECONDS
	bash tests/tools/build.sh nvidia-ctk &&
		bash tests/cdi-check/build.sh >/dev/null &&
		bash tests/tools/build.sh kube etcd kwok helm dra-driver-cpu krew &&
		bash tests/tools/cargo-deny.sh >/dev/null
	local rc=$?
	echo "tools: done in $((SECONDS - t0))s (rc $rc)"
	return "$rc"
}
wait_tools() {
	local rc=0
	wait "$tools_pid" || rc=$?
	tools_pid=
	sed 's/^/    /' "$tools_log"
	return "$rc"
}

phase setup bash tests/scripts/setup.sh
# set -m: the background job gets its own process group, so that a failed run can
# stop it with everything it started.
set -m
nice -n 10 bash -c "$(declare -f build_tools); build_tools" >"$tools_log" 2>&1 &
tools_pid=$!
set +m
echo "== tools building in the background (pid $tools_pid, log $tools_log)"

phase fmt-check make -s fmt-check
phase clippy make -s clippy
phase build-debug make -s build-debug
phase fuzz-build make -s fuzz-build
phase tools-cdi make -s tools-cdi
phase test-unit make -s test-unit UNIT_DEPS=
phase gpu-check-dry make -s gpu-check-dry
phase release make -s release
phase wait-tools wait_tools
phase chart-check make -s chart-check
phase deps-check make -s deps-check
phase test-e2e make -s test-e2e
phase e2e make -s e2e E2E_DEPS=
phase image-test make -s image-test
phase image-check make -s image-check
