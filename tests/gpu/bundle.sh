#!/usr/bin/env bash
# The programs `make gpu-check` runs, gathered for a machine that has none of them
# (the lent GPU machines: Ubuntu 24.04, no network, no Rust, Go or container runtime).
#
#   bash tests/gpu/bundle.sh
#       Release builds, stripped, plus the tools, into target/gpu-check/bundle.tar.xz:
#       the one file to carry (it must stay under the device tool's 64 MiB).
#   bash tests/gpu/bundle.sh --bin-dir DIR --link --out DIR2
#       The same layout in DIR2 as symbolic links to DIR's binaries and this host's
#       tools, nothing built or compressed: the dry run's bundle (gpu-check.sh --dry-run).
#
# Layout: bin/ (topodra-kubelet-plugin, topodra-gpu-check, cdi-check, nvidia-cdi-hook,
# runc, busybox, ldconfig, lstopo-no-graphics, cuda-probe; topodra-sim-node with
# --bin-dir) and lib/ (the shared libraries of those that a bare Ubuntu may lack:
# libhwloc for the plugin and lstopo, libseccomp for runc).
set -euo pipefail
cd "$(dirname "$0")/../.."

bin_dir=""
link=0
out=target/gpu-check/bundle
while (($#)); do
	case "$1" in
	--bin-dir) bin_dir=$2; shift ;;
	--link) link=1 ;;
	--out) out=$2; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "bundle.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
log() { printf '[gpu-check bundle %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { echo "bundle.sh: $*" >&2; exit 1; }

# put SRC NAME DIR: SRC as DIR/NAME, linked or copied.
put() {
	[[ -e "$1" ]] || die "$1 is missing"
	if ((link)); then ln -sf "$(readlink -f "$1")" "$3/$2"; else cp -L "$1" "$3/$2"; fi
}
host_program() { PATH=$PATH:/usr/sbin:/sbin command -v "$1" || die "$1 is not installed (tests/scripts/setup.sh installs it)"; }
host_library() { # the file ldd resolves NAME to for PROGRAM
	ldd "$2" | awk -v n="$1" '$1 == n {print $3}' | grep . || die "$2 does not link $1"
}

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
if [[ -n "$bin_dir" ]]; then
	for f in topodra-kubelet-plugin topodra-gpu-check topodra-sim-node; do put "$bin_dir/$f" "$f" "$out/bin"; done
else
	log "release build of the plugin and topodra-gpu-check (cold: 10+ minutes on 2 cores)"
	# The revision stamp as the image's build sets it (deploy/image/build.sh), so that
	# the fixture's version.txt names the commit and the two builds share artifacts.
	revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
	[[ $revision == unknown || -z "$(git status --porcelain 2>/dev/null)" ]] || revision+=-dirty
	TOPODRA_REVISION=${TOPODRA_REVISION:-$revision} \
		cargo build --release --locked -p topodra-kubelet-plugin -p topodra-gpu-check
	for f in topodra-kubelet-plugin topodra-gpu-check; do
		put "target/release/$f" "$f" "$out/bin"
		strip "$out/bin/$f"
	done
fi
put "${TOPODRA_CDI_CHECK:-$(bash tests/cdi-check/build.sh)}" cdi-check "$out/bin"
put "${TOPODRA_NVIDIA_CDI_HOOK:-$(bash tests/tools/build.sh --print-path nvidia-ctk)/nvidia-cdi-hook}" nvidia-cdi-hook "$out/bin"
for f in runc busybox ldconfig lstopo-no-graphics; do put "$(host_program "$f")" "$f" "$out/bin"; done
# Statically linked: the container's image is busybox and this ldconfig alone (Ubuntu's
# /sbin/ldconfig is a shell script around ldconfig.real).
for f in busybox ldconfig; do
	file -L "$out/bin/$f" | grep -q 'static' || die "$(host_program "$f") is not statically linked"
done
put "$(host_library libhwloc.so.15 "$out/bin/lstopo-no-graphics")" libhwloc.so.15 "$out/lib"
put "$(host_library libseccomp.so.2 "$out/bin/runc")" libseccomp.so.2 "$out/lib"
# Against this host's glibc (Debian 12, 2.36): runs on any newer one.
cc -O1 -o "$out/bin/cuda-probe" tests/gpu/cuda_probe.c -ldl
if ((link == 0)); then
	strip "$out/bin/cuda-probe"
	tar -C "$out" --owner=0 --group=0 -cf - bin lib | xz -T0 -6 >"$out.tar.xz"
	size=$(stat -c %s "$out.tar.xz")
	log "$out.tar.xz: $((size / 1024 / 1024)) MiB ($(du -sh "$out" | cut -f1) unpacked)"
	((size < 48 * 1024 * 1024)) || die "$out.tar.xz is $size bytes: the device tool carries 64 MiB in all"
	echo "$out.tar.xz"
fi
