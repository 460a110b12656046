#!/usr/bin/env bash
# Builds topodra's container images without a container daemon (`make image`):
#
#   1. the release binaries, with TOPODRA_REVISION set so that `--version` names the
#      commit the image labels name;
#   2. the Debian packages of images.go (apt's candidate versions, or the installed
#      ones where newer), downloaded with `apt-get download` into a cache outside the
#      repository (${TOPODRA_TOOLS_CACHE:-~/.cache/topodra/tools}/debs/<arch>);
#   3. the other projects' programs the images carry (NVIDIA's nvidia-cdi-hook), built
#      from their pinned Go modules by tests/tools/build.sh into the same cache;
#   4. deploy/image (topodra-image build) assembles the layers and writes, under
#      target/image/:
#        oci/                                  OCI layout, ref names <image>:<version>
#        <image>-<version>.docker.tar          for `docker load` / `ctr images import`
#        topodra-images-<version>.oci.tar      the layout as one archive
#        build.json, digests.txt               what went in, and the digests
#      and prints each image's digest.
#
# The same binaries (topodra's and the bundled ones), .debs, version, revision and
# SOURCE_DATE_EPOCH (default: the commit time) give the same digests.
#
#   deploy/image/build.sh           build
#   deploy/image/build.sh --check   build, then assemble again into target/image/check
#                                   and fail unless every output is byte-identical
#
# Environment: SOURCE_DATE_EPOCH, TOPODRA_REVISION (default: git rev-parse HEAD, with
# -dirty when the tree has changes), TOPODRA_IMAGE_DEB_DIR (take the .debs from here,
# one per package, and download nothing: to rebuild from archived packages),
# TOPODRA_TOOLS_CACHE (the cache root, as for tests/tools/build.sh), CARGO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

check=0
case "${1:-}" in
--check) check=1 ;;
"") ;;
-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
esac

log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { echo "build.sh: $*" >&2; exit 1; }

cargo="${CARGO:-cargo}"
out="$root/target/image"
tool="$out/bin/topodra-image"

# The crate version is the chart's appVersion: the chart's default image tag.
version="$(awk '/^\[workspace.package\]/ {s=1; next} /^\[/ {s=0} s && $1 == "version" {gsub(/"/, "", $3); print $3; exit}' Cargo.toml)"
app_version="$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2; exit}' deploy/helm/topodra/Chart.yaml)"
[[ -n "$version" ]] || die "no [workspace.package] version in Cargo.toml"
[[ "$version" == "$app_version" ]] ||
	die "Cargo.toml version $version and deploy/helm/topodra/Chart.yaml appVersion $app_version differ: bump both"

revision="${TOPODRA_REVISION:-}"
if [[ -z "$revision" ]]; then
	if revision="$(git rev-parse HEAD 2>/dev/null)"; then
		[[ -z "$(git status --porcelain 2>/dev/null)" ]] || revision+="-dirty"
	else
		revision=unknown
	fi
fi
epoch="${SOURCE_DATE_EPOCH:-}"
if [[ -z "$epoch" ]]; then
	epoch="$(git log -1 --format=%ct 2>/dev/null)" || die "not a git checkout: set SOURCE_DATE_EPOCH"
fi

# Images for the machine's own architecture: the binaries are built natively and
# linked against its libraries (cross builds: docs/deployment.md#arm64-images).
arch="$(dpkg --print-architecture)"
case "$arch" in
amd64 | arm64) ;;
*) die "no image recipe for $arch (docs/deployment.md#images)" ;;
esac

log "topodra $version ($revision), SOURCE_DATE_EPOCH=$epoch, linux/$arch"
log "release binaries (cold: 10+ minutes on 2 cores)"
TOPODRA_REVISION="$revision" "$cargo" build --release --locked -p topodra-kubelet-plugin -p topodra-controller
for b in topodra-kubelet-plugin topodra-controller kubectl-topodra; do
	got="$("target/release/$b" --version)"
	[[ "$got" == *" $version ($revision)" ]] ||
		die "target/release/$b --version says '$got', not '$version ($revision)'"
done

log "image tool (deploy/image)"
mkdir -p "$out/bin"
go -C "$here" build -trimpath -buildvcs=false -o "$tool" .

# Debian packages: apt's candidate, the version `apt-get install` would give now (with
# the archive's security fixes), unless this machine has a newer one installed: the
# image's glibc must be at least the one the binaries were linked against.
mapfile -t packages < <("$tool" packages)
apt_opts=(-q)
# As root apt downloads as the _apt user, who cannot write into a cache under /root.
((EUID)) || apt_opts+=(-o APT::Sandbox::User=root)
debs=()
if [[ -n "${TOPODRA_IMAGE_DEB_DIR:-}" ]]; then
	for pkg in "${packages[@]}"; do
		found=()
		for f in "$TOPODRA_IMAGE_DEB_DIR/${pkg}_"*"_${arch}.deb" "$TOPODRA_IMAGE_DEB_DIR/${pkg}_"*"_all.deb"; do
			[[ -f "$f" ]] && found+=("$f")
		done
		((${#found[@]} == 1)) || die "want one .deb of $pkg in $TOPODRA_IMAGE_DEB_DIR, found ${#found[@]}"
		debs+=("${found[0]}")
	done
else
	cache="${TOPODRA_TOOLS_CACHE:-${HOME:-/root}/.cache/topodra/tools}/debs/$arch"
	mkdir -p "$cache"
	for pkg in "${packages[@]}"; do
		ver="$(apt-cache policy "$pkg:$arch" | awk '$1 == "Candidate:" {print $2}')"
		installed="$(dpkg-query -W -f '${Version}' "$pkg:$arch" 2>/dev/null || true)"
		if [[ -z "$ver" || "$ver" == "(none)" ]] ||
			{ [[ -n "$installed" ]] && dpkg --compare-versions "$installed" gt "$ver"; }; then
			ver="$installed"
		fi
		[[ -n "$ver" ]] || die "$pkg: neither installed nor known to apt (apt-get update?)"
		file=""
		for a in "$arch" all; do
			f="$cache/${pkg}_${ver//:/%3a}_${a}.deb"
			[[ -f "$f" ]] && file="$f"
		done
		if [[ -z "$file" ]]; then
			log "apt-get download $pkg=$ver"
			(cd "$cache" && apt-get download "${apt_opts[@]}" "$pkg:$arch=$ver" >&2) ||
				die "apt-get download $pkg:$arch=$ver failed (apt-get update?)"
			for a in "$arch" all; do
				f="$cache/${pkg}_${ver//:/%3a}_${a}.deb"
				[[ -f "$f" ]] && file="$f"
			done
			[[ -n "$file" ]] || die "apt-get download $pkg=$ver wrote no ${pkg}_${ver}_{$arch,all}.deb"
		fi
		debs+=("$file")
	done
fi

# Bundled programs: each tool's cache entry (bin/ and share/), built if it is not yet.
tool_args=()
for t in $("$tool" tools); do
	log "bundled programs: tests/tools/build.sh $t"
	bin_dir="$(bash tests/tools/build.sh --print-path "$t")"
	tool_args+=(-tool "$t=$(dirname "$bin_dir")")
done

assemble() {
	local dest="$1" args=("${tool_args[@]}")
	for d in "${debs[@]}"; do args+=(-deb "$d"); done
	"$tool" build -out "$dest" -bin target/release -arch "$arch" \
		-version "$version" -revision "$revision" -epoch "$epoch" "${args[@]}"
}

log "assembling the images into target/image"
assemble "$out"

if ((check)); then
	log "assembling again into target/image/check"
	rm -rf "$out/check"
	assemble "$out/check" >/dev/null
	(cd "$out" && for f in digests.txt build.json ./*.tar; do cmp "$f" "check/$f"; done) ||
		die "the second build differs from the first"
	diff -r "$out/oci" "$out/check/oci" >/dev/null || die "the second OCI layout differs from the first"
	log "reproducible: the second build is byte-identical"
	rm -rf "$out/check"
fi
