#!/usr/bin/env bash
# make gpu-check: one prepared check for a machine with a real NVIDIA GPU and driver
# (docs/e2e.md, "The real-GPU check"). It only reads the GPU's settings: no MIG or
# compute-mode change, no reset.
#
#   bash tests/gpu/gpu-check.sh [--bundle DIR|TAR] [--out DIR]
#       On the GPU machine, from the carried bundle (tests/gpu/bundle.sh builds
#       target/gpu-check/bundle.tar.xz). Records what the machine reports, checks that
#       discovery agrees, runs one claim's whole life (topodra-gpu-check lifecycle),
#       and leaves it all in --out (default: $OUT/gpu-check where $OUT is set, else
#       target/gpu-check/results), the folder to commit as the machine's fixture.
#   bash tests/gpu/gpu-check.sh --dry-run --bin-dir target/debug [--profile NAME] [--out DIR]
#       The same steps on a simulated node, from this checkout's debug build; what only
#       a real GPU can show is SKIP, anything else must pass. `make test` runs it.
#
# Prints a verdict line per step (gpu-check: <step>: PASS|FAIL|SKIP ...) and a last line
# `gpu-check: VERDICT PASS|FAIL`; exits non-zero on FAIL.
set -uo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS

dry_run=0
bundle=target/gpu-check/bundle.tar.xz
bin_dir=""
profile=dgx-h100
out=""
while (($#)); do
	case "$1" in
	--dry-run) dry_run=1 ;;
	--bundle) bundle=$2; shift ;;
	--bin-dir) bin_dir=$2; shift ;;
	--profile) profile=$2; shift ;;
	--out) out=$2; shift ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
if [[ -z "$out" ]]; then
	if [[ -n "${OUT:-}" ]]; then out=$OUT/gpu-check; else out=target/gpu-check/results; fi
fi
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/topodra-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

failed=0
verdict() { # STEP PASS|FAIL|SKIP DETAIL
	echo "gpu-check: $1: $2 $3" | tee -a "$out/verdicts.txt"
	[[ $2 != FAIL ]] || failed=1
}
# record NAME CMD...: CMD's output into the results folder; a failure is noted in the
# file, not fatal (what the machine cannot answer is a fact too).
record() {
	local name=$1
	shift
	timeout 60 "$@" >"$out/$name" 2>&1 || echo "(exit $? from: $*)" >>"$out/$name"
}
die() {
	verdict setup FAIL "$*"
	echo "gpu-check: VERDICT FAIL"
	exit 1
}
((EUID == 0)) || die "needs root (device nodes, runc, the kubelet's directories)"

# The programs, in one bundle whichever the mode (tests/gpu/bundle.sh): bin/ and lib/.
b=$work/bin
if ((dry_run)); then
	[[ -n "$bin_dir" ]] || die "--dry-run needs --bin-dir (the debug build: make build-debug)"
	bash tests/gpu/bundle.sh --bin-dir "$bin_dir" --link --out "$work" 2>"$out/bundle.log" ||
		die "tests/gpu/bundle.sh: $(tail -n 3 "$out/bundle.log")"
else
	case "$bundle" in
	*.tar.xz) tar -xJf "$bundle" -C "$work" || die "cannot unpack $bundle (tests/gpu/bundle.sh builds it)" ;;
	*) cp -a "$bundle/." "$work/" || die "cannot copy $bundle" ;;
	esac
fi
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing=$(for f in "$b"/*; do ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$(basename "$f"): |"; done)
[[ -z "$missing" ]] || die "libraries missing: $missing"
"$b/topodra-kubelet-plugin" --version >"$out/version.txt" 2>&1 || die "the plugin does not run: $(cat "$out/version.txt")"

# Where the driver is, and the plugin flags that say so.
plugin_flags=()
if ((dry_run)); then
	"$b/topodra-sim-node" --cdi-hook "$b/nvidia-cdi-hook" --driver-root-device-nodes "$profile" "$work/node" \
		>"$work/sim-flags" 2>"$out/sim-node.log" || die "topodra-sim-node $profile: $(cat "$out/sim-node.log")"
	while read -r flag; do
		case "$flag" in
		--dev-root=*) ;; # the nodes are under the driver root (--driver-root-device-nodes)
		--driver-root=*) driver_root=${flag#--driver-root=}; plugin_flags+=("$flag") ;;
		*) plugin_flags+=("$flag") ;;
		esac
	done <"$work/sim-flags"
	dev_root=$driver_root
	smi=$driver_root/usr/bin/nvidia-smi
	echo "dry run: simulated $profile" >"$out/machine.txt"
else
	# GKE's layout, and the lent machines': lib64/ and bin/ under /usr/local/nvidia.
	driver_root=/
	for d in /usr/local/nvidia /run/nvidia/driver; do
		if compgen -G "$d/lib64/libcuda.so.*" >/dev/null || compgen -G "$d/usr/lib/x86_64-linux-gnu/libcuda.so.*" >/dev/null; then
			driver_root=$d
			break
		fi
	done
	dev_root=/
	smi=$(command -v nvidia-smi || echo "$driver_root/bin/nvidia-smi")
	plugin_flags+=("--driver-root=$driver_root" "--cdi-hook-source=$b/nvidia-cdi-hook")
	# NVML from the driver root where it is there, rather than whatever the loader's
	# cache finds first.
	for nvml in "$driver_root/lib64/libnvidia-ml.so.1" "$driver_root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"; do
		if [[ -e $nvml ]]; then
			plugin_flags+=("--nvml-lib=$nvml")
			break
		fi
	done
	{
		echo "driver root: $driver_root"
		uname -a
		cat /etc/os-release 2>/dev/null | grep -E '^(PRETTY_NAME|VERSION_ID)='
		cat /proc/driver/nvidia/version 2>/dev/null
	} >"$out/machine.txt"
fi
verdict setup PASS "driver root $driver_root, dev root $dev_root, $(cat "$out/version.txt")"

# 1. What the machine reports.
record nvidia-smi-q.xml "$smi" -q -x
record nvidia-smi-topo.txt "$smi" topo -m
record nvidia-smi-L.txt "$smi" -L
if ((dry_run)); then
	cp "$work/node/topology.xml" "$out/lstopo.xml"
else
	record lstopo.xml "$b/lstopo-no-graphics" --of xml --whole-io
	record lscpu.txt lscpu
	{
		cat /proc/devices
		echo
		ls -l /dev/nvidia* /dev/nvidia-caps 2>&1
		echo
		ls -lR /proc/driver/nvidia/capabilities 2>&1
	} >"$out/devices.txt" 2>&1
	mkdir -p "$out/sysfs"
	for dev in /sys/bus/pci/devices/*; do
		[[ "$(cat "$dev/vendor" 2>/dev/null)" == 0x10de ]] || continue
		d=$out/sysfs/$(basename "$dev")
		mkdir -p "$d"
		for f in class device subsystem_device numa_node local_cpulist current_link_speed current_link_width max_link_speed max_link_width; do
			cat "$dev/$f" >"$d/$f" 2>/dev/null || true
		done
		readlink -f "$dev" >"$d/path"
	done
fi
mapfile -t discover_flags < <(printf '%s\n' "${plugin_flags[@]}" | grep -E '^--(nvml-lib|hwloc-xml)=')
discover=("$b/topodra-kubelet-plugin" discover --node-name gpu-check --require-nvml "${discover_flags[@]}")
for format in inventory json nvml; do
	name=$format.json
	[[ $format != json ]] || name=slices.json
	if timeout 60 "${discover[@]}" -o "$format" >"$out/$name" 2>"$work/discover.err"; then
		verdict "discover-$format" PASS "$(wc -c <"$out/$name") bytes"
	else
		verdict "discover-$format" FAIL "$(tail -n 3 "$work/discover.err")"
	fi
done
dry=()
((dry_run == 0)) || dry=(--dry-run)

# 2. Discovery against nvidia-smi and sysfs.
"$b/topodra-gpu-check" agree "${dry[@]}" --out "$out" --inventory "$out/inventory.json" \
	--nvidia-smi-xml "$out/nvidia-smi-q.xml" | tee -a "$out/verdicts.txt" || failed=1

# 3. One claim's whole life.
timeout 360 "$b/topodra-gpu-check" lifecycle "${dry[@]}" --out "$out" --work "$work/lifecycle" \
	--plugin "$b/topodra-kubelet-plugin" --dev-root "$dev_root" \
	--runtime "$b/runc" --cdi-check "$b/cdi-check" --busybox "$b/busybox" --ldconfig "$b/ldconfig" \
	--probe "$b/cuda-probe" -- "${plugin_flags[@]}" | tee -a "$out/verdicts.txt"
rc=${PIPESTATUS[0]}
((rc == 0)) || { failed=1; ((rc == 1)) || verdict lifecycle FAIL "exit $rc (124: over 360 s)"; }

verdict total "$([[ $failed == 0 ]] && echo PASS || echo FAIL)" "in $((SECONDS - started)) s"
if ((failed)); then
	echo "gpu-check: VERDICT FAIL (results in $out)"
	exit 1
fi
echo "gpu-check: VERDICT PASS (results in $out)"
