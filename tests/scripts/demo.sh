#!/usr/bin/env bash
# `make demo`: discovery on a built-in simulated GPU node.
#
# The fake NVML library (tests/fake-nvml) answers for the GPUs of a machine profile
# and the profile's hwloc topology stands in for the machine, so the real discovery
# code path (nvml-wrapper, hwlocality) runs on a laptop. The later end-to-end demo
# adds a local control plane and a pod; this part shows what would be published.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=${1:-dgx-h100}
profiles=tests/fake-nvml/profiles
[[ -f $profiles/$profile.yaml ]] || { echo "no profile $profile; have: $(ls $profiles | sed -n 's/\.yaml$//p' | tr '\n' ' ')" >&2; exit 2; }

echo "== building (the first build compiles the dependency tree: a few minutes on 2 cores)"
cargo build -q -p topodra-fake-nvml -p topodra-kubelet-plugin

plugin=target/debug/topodra-kubelet-plugin
run() {
    TOPODRA_FAKE_NVML_PROFILE=$profiles/$profile.yaml "$plugin" discover \
        --nvml-lib target/debug/libtopodra_fake_nvml.so \
        --hwloc-xml "$profiles/$profile.hwloc.xml" \
        --node-name "sim-$profile" "$@"
}

echo
echo "== simulated node: $profile ($(sed -n 's/^description: *//p' $profiles/$profile.yaml | tr -d '"'))"
echo "== topodra-kubelet-plugin discover"
run
echo
echo "== the ResourceSlice that would be published (discover -o yaml), first device:"
run -o yaml | awk '/^    - attributes:/{n++} n<2' 
echo "   ..."
echo
echo "== list form of numaNode (--numa-node-format list), first device's numaNode:"
run -o json --numa-node-format list | grep -m1 -A6 '"resource.kubernetes.io/numaNode"'
