#!/usr/bin/env bash
# Pushes a release to a registry (`make push REGISTRY=host[:port][/path]`, after
# `make release`): both images by tag, with the digests of the OCI layout (so those
# of digests.txt and the SBOM), and the chart package as Helm's OCI artifact, to
#
#   REGISTRY/topodra-kubelet-plugin:<version>
#   REGISTRY/topodra-controller:<version>
#   REGISTRY/topodra:<chart version>               helm install oci://REGISTRY/topodra
#
# It writes $PUSH_DIR/pushed.json (PUSH_DIR defaults to target/push; each artifact
# with its digest) and $PUSH_DIR/values.yaml (global.imageRegistry and both image digests, for
# `helm install --values`), and prints the install command. Credentials: what
# `docker login` (or crane, podman with DOCKER_CONFIG) left in ~/.docker/config.json.
# INSECURE=1 allows a registry without TLS (localhost and 127.0.0.1 always are).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

die() { echo "push.sh: $*" >&2; exit 1; }

registry="${REGISTRY:-}"
[[ -n "$registry" ]] || die "set REGISTRY=host[:port][/path], e.g. make push REGISTRY=registry.example.com/gpu"
img="target/image"
tool="$img/bin/topodra-image"
[[ -x "$tool" && -f "$img/build.json" ]] || die "no $img/build.json: run make release first"
version="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$img/build.json" | head -n1)"
chart_version="$(sed -n 's/^version: *//p' deploy/helm/topodra/Chart.yaml | head -n1)"
chart="target/release-artifacts/$version/topodra-$chart_version.tgz"
[[ -f "$chart" ]] || die "no $chart: run make release first"

out="${PUSH_DIR:-target/push}"
mkdir -p "$out"
args=(-layout "$img/oci" -registry "$registry" -chart "$chart" -record "$out/pushed.json" -values "$out/values.yaml")
plain=""
if [[ "${INSECURE:-0}" == 1 ]]; then
	args+=(-insecure)
	plain=" --plain-http"
fi
"$tool" push "${args[@]}"

chart_digest="$(sed -n '/"kind": "chart"/,/}/s/^ *"digest": "\(.*\)"$/\1/p' "$out/pushed.json")"
cat >&2 <<MSG
push.sh: pushed to $registry; $out/values.yaml pins both images by digest. Install with
  helm install topodra oci://$registry/topodra --version $chart_version$plain \\
    --namespace topodra-system --values $out/values.yaml
(the chart itself by digest: oci://$registry/topodra@$chart_digest; see docs/deployment.md#install-with-helm)
MSG
