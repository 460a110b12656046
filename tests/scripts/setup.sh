#!/usr/bin/env bash
# Installs what building and testing topodra needs on a Debian machine that has Rust
# and Go: the system hwloc library (hwlocality links against it; its `vendored`
# feature would download at build time), libudev (hwloc's static link line names it),
# the lstopo tools the fixture checks use, and runc with a static busybox, which
# kubelet-plugin/tests/oci_runtime.rs runs a workload container with, and the C
# compiler and glibc headers of the one cgo build (NVIDIA's nvidia-cdi-hook and
# nvidia-ctk, tests/tools/build.sh nvidia-ctk; Rust's linker needs them too), and
# Prometheus and its promtool (package prometheus), which check the chart's alert
# rules and evaluate its dashboard's queries against a scraped run.
# Idempotent and quiet when all is there.
set -euo pipefail

packages=(libhwloc-dev hwloc-nox libudev-dev pkg-config runc busybox-static gcc libc6-dev prometheus)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]} (apt)"
    sudo=""
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "setup: need root or sudo to apt-get install ${missing[*]}" >&2; exit 1; }
        sudo=sudo
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for tool in cargo go; do
    command -v "$tool" >/dev/null || { echo "setup: $tool is not on PATH; install Rust (rustup) and Go first" >&2; exit 1; }
done
