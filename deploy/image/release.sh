#!/usr/bin/env bash
# Gathers a release into target/release-artifacts/<version>/ (`make release`, after
# `make image`):
#
#   topodra-kubelet-plugin-<version>.docker.tar   docker load / ctr images import
#   topodra-controller-<version>.docker.tar
#   topodra-images-<version>.oci.tar              both images as one OCI layout
#   topodra-<chart version>.tgz                   helm package of deploy/helm/topodra
#   topodra-<version>.spdx.json                   SPDX 2.3 SBOM: images, Debian
#                                                 packages, the crates in the binaries
#   build.json, digests.txt                       what went into the images, digests
#   SHA256SUMS                                    over all of the above
#
# helm comes from $HELM, else PATH, else tests/tools/build.sh (as for deploy/render.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

die() { echo "release.sh: $*" >&2; exit 1; }

img="target/image"
tool="$img/bin/topodra-image"
[[ -f "$img/build.json" && -x "$tool" ]] || die "no $img/build.json: run make image first"

version="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$img/build.json" | head -n1)"
platform="$(sed -n 's/^  "platform": "\(.*\)",$/\1/p' "$img/build.json" | head -n1)"
[[ -n "$version" && -n "$platform" ]] || die "no version or platform in $img/build.json"
case "$platform" in
linux/amd64) rust_target=x86_64-unknown-linux-gnu ;;
linux/arm64) rust_target=aarch64-unknown-linux-gnu ;;
*) die "unknown platform $platform" ;;
esac

helm="${HELM:-}"
if [[ -z "$helm" ]]; then
	if command -v helm >/dev/null 2>&1; then
		helm=helm
	else
		helm="$(bash tests/tools/build.sh --print-path helm)/helm"
	fi
fi

dest="target/release-artifacts/$version"
rm -rf "$dest"
mkdir -p "$dest"

cp "$img/topodra-kubelet-plugin-$version.docker.tar" "$img/topodra-controller-$version.docker.tar" \
	"$img/topodra-images-$version.oci.tar" "$img/build.json" "$img/digests.txt" "$dest/"

"$helm" package deploy/helm/topodra --destination "$dest" >&2

# The crates of the binaries as cargo resolves them for the image's platform.
"${CARGO:-cargo}" metadata --format-version 1 --filter-platform "$rust_target" >"$img/cargo-metadata.json"
"$tool" sbom -build "$img/build.json" -cargo-metadata "$img/cargo-metadata.json" \
	-out "$dest/topodra-$version.spdx.json"

(cd "$dest" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort |
	xargs sha256sum >SHA256SUMS)

echo "release.sh: $dest:" >&2
(cd "$dest" && ls -l) >&2
cat "$dest/digests.txt"
