#!/usr/bin/env bash
# Gathers a release into target/release-artifacts/<version>/ (`make release`, after
# `make image`):
#
#   topodra-kubelet-plugin-<version>.docker.tar   docker load / ctr images import
#   topodra-controller-<version>.docker.tar
#   topodra-images-<version>.oci.tar              both images as one OCI layout
#   topodra-<chart version>.tgz                   helm package of deploy/helm/topodra
#   kubectl-topodra-<version>-<os>-<arch>.tar.gz  the kubectl plugin, for krew or by hand
#   topodra.krew.yaml                             krew plugin manifest for that archive;
#                                                 its uri is $RELEASE_URL/<archive>
#                                                 (default: the GitHub release of the tag)
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

# kubectl-topodra, the binary the controller image carries, as krew wants it: a
# gzipped tar with the binary and the licence (krew installs both) at its top, reproducible (sorted names, owner 0, the
# build's SOURCE_DATE_EPOCH as every mtime, no gzip timestamp), and a manifest naming
# its sha256.
epoch="$(sed -n 's/^  "source_date_epoch": \([0-9]*\),$/\1/p' "$img/build.json" | head -n1)"
[[ -n "$epoch" ]] || die "no source_date_epoch in $img/build.json"
os="${platform%/*}" arch="${platform#*/}"
plugin_bin="target/release/kubectl-topodra"
[[ -x "$plugin_bin" ]] || die "no $plugin_bin: run make image first"
got="$("$plugin_bin" --version)"
[[ "$got" == *" $version "* || "$got" == *" $version" ]] || die "$plugin_bin --version says '$got', not $version"
archive="kubectl-topodra-$version-$os-$arch.tar.gz"
stage="$img/kubectl-topodra-archive"
rm -rf "$stage"
mkdir -p "$stage"
install -m 0755 "$plugin_bin" "$stage/kubectl-topodra"
install -m 0644 LICENSE "$stage/LICENSE"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=gnu \
	-C "$stage" -cf - LICENSE kubectl-topodra | gzip -n -9 >"$dest/$archive"
release_url="${RELEASE_URL:-https://github.com/topodra/topodra/releases/download/v$version}"
sha="$(sha256sum "$dest/$archive" | cut -d' ' -f1)"
cat >"$dest/topodra.krew.yaml" <<EOF
# krew plugin manifest of kubectl-topodra $version (make release):
#   kubectl krew install --manifest=topodra.krew.yaml [--archive=$archive]
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: topodra
spec:
  version: v$version
  homepage: https://github.com/topodra/topodra
  shortDescription: Explain GPU placement by the topodra DRA driver
  description: |
    kubectl topodra shows, per node and NUMA node, the GPUs that the topodra DRA
    driver publishes and how many are free for NUMA-aligned claims (nodes), why a
    pod waits for GPUs (explain pod), and where a set of N aligned GPUs fits now
    (fit). It reads ResourceSlices, ResourceClaims and DeviceClasses; it writes
    nothing.
  platforms:
    - selector:
        matchLabels:
          os: $os
          arch: $arch
      uri: $release_url/$archive
      sha256: $sha
      bin: kubectl-topodra
      files:
        - from: kubectl-topodra
          to: .
        - from: LICENSE
          to: .
EOF

# The crates of the binaries as cargo resolves them for the image's platform.
"${CARGO:-cargo}" metadata --format-version 1 --filter-platform "$rust_target" >"$img/cargo-metadata.json"
"$tool" sbom -build "$img/build.json" -cargo-metadata "$img/cargo-metadata.json" \
	-out "$dest/topodra-$version.spdx.json"

(cd "$dest" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort |
	xargs sha256sum >SHA256SUMS)

echo "release.sh: $dest:" >&2
(cd "$dest" && ls -l) >&2
cat "$dest/digests.txt"
