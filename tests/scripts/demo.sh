#!/usr/bin/env bash
# `make demo`: a local control plane, the plugin on a simulated GPU node, and pods that
# get topology-aligned GPU sets from the real kube-scheduler.
#
# Everything runs as local processes: etcd, kube-apiserver, kube-scheduler and
# kube-controller-manager built from their Go modules (tests/tools, cached outside the
# repository), the kubelet's own plugin-manager and DRA-manager code as the node
# (tests/e2e's topodra-kubelet-harness, which also injects the CDI specs with the CDI
# library container runtimes use), and topodra-kubelet-plugin on a simulated machine
# (tests/fake-nvml: fake NVML + the machine's hwloc topology), and topodra-controller
# under the chart's controller ServiceAccount, which explains the pod left waiting
# (kubectl topodra shows the same). Cleans up on exit;
# TOPODRA_DEMO_KEEP=1 keeps the directory with every log.
#
# Each machine's demo asks for what shows its topology (scenario below): N pods, each
# with its own claim for G GPUs that share one attribute, where the machine has room
# for N-1 such sets. It checks what it says: N-1 pods run, each on GPUs that share the
# attribute, the last one waits and the controller says why, and it runs once the
# first pod is deleted. Anything else exits non-zero.
#
#   tests/scripts/demo.sh [profile]   (default dgx-h100)
#   tests/scripts/demo.sh --list      the profiles that have a demo
#
# Environment: TOPODRA_DEMO_KEEP=1 (keep the directory), TOPODRA_DEMO_PREBUILT=1 (build
# no Rust: use target/debug as it is; the e2e test that runs every profile's demo
# shares those binaries with the other tests).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

demo_profiles=(dgx-h100 dgx-a100 l40s-pcie snc4-xeon gb200 dgx-h100-mig l40s-mps)
# scenario PROFILE sets pods, gpus (per pod), attr (the claim's matchAttribute),
# plugin_args and what (the sentence that says why this machine gives N-1 sets); a
# dynamic MIG scenario sets mig instead, one PROFILE:COUNT per pod; an MPS scenario
# sets mps (two pods share one GPU). sim is the simulated machine's profile, the
# scenario's name unless it says otherwise.
scenario() {
    plugin_args=() mig=() mps= sim=$1
    case $1 in
    l40s-mps)
        sim=l40s-pcie mps=1 plugin_args=(--mps)
        what="two pods share one GPU through MPS: each gets its own memory and SM limits from its claim, enforced by the GPU's one MPS server" ;;
    dgx-h100-mig)
        mig=(7g.80gb:4 1g.10gb:4 3g.40gb:2 7g.80gb:4) plugin_args=(--dynamic-mig)
        pods=${#mig[@]} attr=profile
        what="MIG partitions the scheduler picks and the plugin makes at prepare: four 7g.80gb take four GPUs, four 1g.10gb carve one more, two 3g.40gb one or two more, so fewer than four GPUs are left uncarved for the last four 7g.80gb" ;;
    dgx-h100)
        pods=3 gpus=4 attr=resource.kubernetes.io/numaNode
        what="4 GPUs on one NUMA node: the DGX H100 has one NUMA node per socket, 4 GPUs on each" ;;
    dgx-a100)
        pods=5 gpus=2 attr=resource.kubernetes.io/numaNode
        what="2 GPUs on one NUMA node: the EPYCs in NPS4 make 8 NUMA nodes, and 4 of them hold a pair of GPUs" ;;
    l40s-pcie)
        pods=5 gpus=2 attr=gpu.topodra.dev/pcieSwitch
        what="2 GPUs behind one PCIe switch (peer-to-peer without the root complex): 4 switches, a pair behind each" ;;
    snc4-xeon)
        pods=3 gpus=4 attr=resource.kubernetes.io/numaNode plugin_args=(--numa-node-format=list)
        what="4 GPUs on one NUMA node in the list form: with sub-NUMA clustering each GPU has its own NUMA node, and the list form (--numa-node-format=list) also names the other 3 of its socket, so 4 GPUs of one socket match" ;;
    gb200)
        pods=3 gpus=2 attr=resource.kubernetes.io/numaNode
        what="2 GPUs on one NUMA node: each Grace CPU of the tray has its own NUMA node and a pair of Blackwell GPUs" ;;
    *) return 1 ;;
    esac
}

if [[ ${1:-} == --list ]]; then
    printf '%s\n' "${demo_profiles[@]}"
    exit 0
fi
profile=${1:-dgx-h100}
node=sim-$profile
scenario "$profile" || {
    if [[ -f tests/fake-nvml/profiles/$profile.yaml ]]; then
        echo "the profile $profile has no demo (it is for tests); the demo runs on: ${demo_profiles[*]}" >&2
    else
        echo "no demo $profile; the demo runs on: ${demo_profiles[*]}" >&2
    fi
    exit 2
}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# fail MESSAGE: the demo did not show what it says; the logs stay.
fail() {
    printf '\n\033[1mDEMO FAILED (%s): %s\033[0m\n' "$profile" "$*" >&2
    exit 1
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/topodra-demo.XXXXXX")
pids=()
cleanup() {
    status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    # MPS control daemons run in sessions of their own, no child of the plugin.
    for f in "$dir"/node/plugins/*/mps/*/pipe/nvidia-cuda-mps-control.pid; do
        [[ -f $f ]] && kill -9 "$(cat "$f")" 2>/dev/null || true
    done
    if [[ -n ${cluster_bin:-} && -f $dir/cluster/cluster.json ]]; then
        "$cluster_bin" down --dir "$dir/cluster" >/dev/null 2>&1 || true
    fi
    if [[ ${TOPODRA_DEMO_KEEP:-} == 1 || $status -ne 0 ]]; then
        echo "logs and state kept in $dir"
    else
        rm -rf "$dir"
    fi
}
trap cleanup EXIT INT TERM

step "building (first run: the Rust workspace alongside Kubernetes from its Go modules, 15-20 min on 2 cores)"
# Into this run's directory: demos may run side by side (the e2e test runs every
# profile's), and one could otherwise replace a binary another is starting.
gobin=$dir/bin
mkdir -p "$gobin"
gobuild_log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# The Go side in two parts. Kubernetes' components, then the cluster CLI and the
# kubelet harness, whose kubelet code is the largest compile after Kubernetes itself:
# in that order because the three share their Kubernetes packages, built once
# (tests/tools/kube pins the modules the harness's go.mod does). And NVIDIA's
# nvidia-cdi-hook (built from the pinned toolkit module: the plugin installs it into
# its directory under the node's kubelet plugins directory, as it installs the
# image's copy on a real node, and the claims' CDI specs name it) with etcd, which
# share nothing with the rest and fill the cores once cargo is done.
build_go_kube() {
    bash tests/tools/build.sh kube &&
        gobuild_log "the cluster CLI and the kubelet harness: building" &&
        (cd tests/cluster && CGO_ENABLED=0 go build -trimpath -o "$gobin/topodra-cluster" ./cmd/topodra-cluster) &&
        (cd tests/e2e && CGO_ENABLED=0 go build -trimpath -o "$gobin/topodra-kubelet-harness" ./cmd/topodra-kubelet-harness) &&
        gobuild_log "the cluster CLI and the kubelet harness: built"
}
build_go_rest() { bash tests/tools/build.sh etcd nvidia-ctk; }
if [[ ${TOPODRA_DEMO_PREBUILT:-} == 1 ]]; then
    for b in topodra-sim-node topodra-kubelet-plugin topodra-controller kubectl-topodra; do
        [[ -x target/debug/$b ]] || fail "TOPODRA_DEMO_PREBUILT=1, but there is no target/debug/$b"
    done
    { build_go_kube && build_go_rest; } >&2 || fail "building the Go side failed"
else
    # Kubernetes builds alongside cargo: neither keeps both cores busy all the time.
    # The Go builds' progress lines (each says every minute that it is still going)
    # are followed as they come; cargo, quiet, says so too.
    : >"$dir/tools-build.log"
    build_go_kube >>"$dir/tools-build.log" 2>&1 &
    kube_pid=$!
    # tail follows until the placeholder process it watches ends, once both Go parts are.
    sleep infinity &
    hold_pid=$!
    tail --pid="$hold_pid" -n +1 -f "$dir/tools-build.log" 2>/dev/null | sed -u -n 's/^\(\[tools .*\)/   \1/p' &
    follow_pid=$!
    cargo_start=$SECONDS
    (while sleep 60; do printf '   [cargo %s] the Rust workspace: still building (%ds)\n' "$(date +%H:%M:%S)" $((SECONDS - cargo_start)); done) &
    beat_pid=$!
    # Stopped by cleanup when the demo fails here.
    pids+=("$kube_pid" "$hold_pid" "$beat_pid")
    cargo_rc=0
    cargo build -q -p topodra-fake-nvml -p topodra-kubelet-plugin -p topodra-controller || cargo_rc=$?
    kill "$beat_pid" 2>/dev/null || true
    wait "$beat_pid" 2>/dev/null || true
    ((cargo_rc == 0)) || fail "building the Rust workspace failed"
    printf '   [cargo %s] the Rust workspace: built in %ds\n' "$(date +%H:%M:%S)" $((SECONDS - cargo_start))
    rest_rc=0
    build_go_rest >>"$dir/tools-build.log" 2>&1 || rest_rc=$?
    kube_rc=0
    wait "$kube_pid" || kube_rc=$?
    kill "$hold_pid" 2>/dev/null || true
    wait "$follow_pid" 2>/dev/null || true
    ((kube_rc == 0 && rest_rc == 0)) || { cat "$dir/tools-build.log" >&2; fail "building the Go side failed"; }
fi
eval "$(bash tests/tools/build.sh --env kube etcd)"
hook=$(bash tests/tools/build.sh --print-path nvidia-ctk)/nvidia-cdi-hook
cluster_bin=$gobin/topodra-cluster
harness_bin=$gobin/topodra-kubelet-harness

step "starting a local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager v1.37.2)"
"$cluster_bin" up --dir "$dir/cluster" >"$dir/cluster-up.log"
eval "$("$cluster_bin" env --dir "$dir/cluster")"
kubectl version 2>/dev/null | sed 's/^/   /'

step "installing topodra's cluster objects (deploy/manifests, without the DaemonSet: the plugin runs as a process here)"
kubectl apply -f deploy/manifests/00-namespace.yaml >/dev/null
python3 - "$dir/objects.yaml" <<'PY'
import re, sys
docs = re.split(r"(?m)^---\s*$", open("deploy/manifests/topodra.yaml").read())
keep = [d for d in docs if not re.search(r"(?m)^kind:\s*DaemonSet\s*$", d) and d.strip()]
open(sys.argv[1], "w").write("\n---\n".join(keep))
PY
kubectl apply -f "$dir/objects.yaml" | sed 's/^/   /'

step "the node $node: the kubelet's plugin manager and DRA manager (topodra-kubelet-harness)"
nodedir=$dir/node
mkdir -p "$nodedir"
"$harness_bin" --cluster-dir "$dir/cluster" --node-name "$node" \
    --registry-dir "$nodedir/registry" --plugins-dir "$nodedir/plugins" \
    --cdi-dir "$nodedir/cdi" --state-dir "$nodedir/kubelet" \
    --write-plugin-kubeconfig "$nodedir/plugin.kubeconfig" >"$dir/harness.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [[ -s $nodedir/plugin.kubeconfig ]] && break; sleep 0.2; done
[[ -s $nodedir/plugin.kubeconfig ]] || { echo "the harness did not come up; see $dir/harness.log" >&2; tail -20 "$dir/harness.log" >&2; exit 1; }

step "the plugin on a simulated $sim ($(sed -n 's/^description: *//p' tests/fake-nvml/profiles/$sim.yaml | tr -d '"'))${plugin_args[0]:+, with ${plugin_args[*]}}"
mapfile -t sim_flags < <(target/debug/topodra-sim-node --cdi-hook "$hook" "$sim" "$nodedir/sim")
echo "1234-demo-boot" >"$nodedir/boot_id"
KUBECONFIG=$nodedir/plugin.kubeconfig target/debug/topodra-kubelet-plugin serve \
    --node-name "$node" --kubelet-registry-dir "$nodedir/registry" --kubelet-plugins-dir "$nodedir/plugins" \
    --cdi-dir "$nodedir/cdi" --http-addr 127.0.0.1:0 --boot-id-file "$nodedir/boot_id" \
    "${sim_flags[@]}" ${plugin_args[@]+"${plugin_args[@]}"} >"$dir/plugin.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
    [[ -n $(kubectl get resourceslices -o name 2>/dev/null) ]] && break
    sleep 0.2
done
[[ -n $(kubectl get resourceslices -o name 2>/dev/null) ]] || { echo "no ResourceSlice; see $dir/plugin.log" >&2; tail -20 "$dir/plugin.log" >&2; exit 1; }

step "the controller (topodra-controller as the chart's ServiceAccount topodra-system/topodra-controller)"
# A kubeconfig with the ServiceAccount's token instead of the admin's certificate, so
# the controller runs with the chart's RBAC, as in a cluster.
ctrl_kc=$dir/controller.kubeconfig
kubectl config view --raw --minify --flatten >"$ctrl_kc"
admin_user=$(KUBECONFIG=$ctrl_kc kubectl config view -o jsonpath='{.users[0].name}')
KUBECONFIG=$ctrl_kc kubectl config set-credentials topodra-controller \
    --token="$(kubectl create token topodra-controller -n topodra-system --duration 24h)" >/dev/null
KUBECONFIG=$ctrl_kc kubectl config set-context --current --user=topodra-controller >/dev/null
KUBECONFIG=$ctrl_kc kubectl config unset "users.$admin_user" >/dev/null
KUBECONFIG=$ctrl_kc POD_NAMESPACE=topodra-system POD_NAME=demo-controller target/debug/topodra-controller \
    --leader-elect=false --node-resource-topology=false --http-bind-address 127.0.0.1 --http-port 0 \
    >"$dir/controller.log" 2>&1 &
pids+=($!)
echo "   running; its log: controller.log"

step "kubectl get resourceslices"
kubectl get resourceslices
if [[ -n $mps ]]; then
    # shellcheck source=tests/scripts/demo-mps.sh
    source tests/scripts/demo-mps.sh
    exit 0
fi
if [[ ${#mig[@]} -eq 0 ]]; then
    step "kubectl describe resourceslice (first two devices)"
    kubectl describe resourceslice | awk '/^    Attributes:/{n++} n<=2' | sed -n '1,80p'
else
    # With dynamic MIG the pool has one slice of counter sets (a slice holds devices
    # or counters, never both) and slices of devices that consume them.
    counters=$(kubectl get resourceslices -o jsonpath='{range .items[?(@.spec.sharedCounters)]}{.metadata.name}{"\n"}{end}' | head -1)
    [[ -n $counters ]] || fail "no slice of counter sets: is --dynamic-mig on?"
    step "kubectl describe resourceslice $counters (the first GPU's counter set)"
    # Whole files first: an awk that stops early would end kubectl with SIGPIPE.
    kubectl describe resourceslice "$counters" >"$dir/counters.txt"
    awk '/^  Shared Counters:/{s=1} {print} s && /^    Name:/{exit}' "$dir/counters.txt"
    step "kubectl describe resourceslice (one partition: its attributes and what it consumes)"
    kubectl describe resourceslice >"$dir/describe.txt"
    # A device's fields are described in name order, its Name last.
    awk '
        /^    Attributes:/ { if (keep) exit; block = "" }
        { block = block $0 "\n" }
        /^    Name: +gpu-7-mig-1g-10gb-6$/ { keep = 1 }
        END { if (keep) printf "%s", block }' "$dir/describe.txt"
fi

last=demo-$pods
phase_of() { kubectl get pod "$1" -o jsonpath='{.status.phase}'; }
if [[ ${#mig[@]} -eq 0 ]]; then
    step "$pods pods, each with its own claim for $gpus GPUs sharing $attr"
    echo "   $what: room for $((pods - 1)) such sets, so $last waits."
    # One template, as deploy/examples/ writes them; each pod gets its own claim from it.
    cat >"$dir/demo-claim.yaml" <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: demo-gpus
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: gpu.topodra.dev
            allocationMode: ExactCount
            count: $gpus
      constraints:
        - requests: ["gpus"]
          matchAttribute: $attr
YAML
    sed 's/^/      /' "$dir/demo-claim.yaml"
    kubectl apply -f "$dir/demo-claim.yaml" >/dev/null
    template_of() { echo demo-gpus; }
else
    step "$pods pods asking for MIG partitions of mig.topodra.dev: ${mig[*]}"
    echo "   $what: $last waits."
    : >"$dir/demo-claim.yaml"
    for i in $(seq "$pods"); do
        cat >>"$dir/demo-claim.yaml" <<YAML
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: demo-$i
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: mig.topodra.dev
            count: ${mig[$((i - 1))]#*:}
            selectors:
              - cel:
                  expression: device.attributes["gpu.topodra.dev"].profile == "${mig[$((i - 1))]%%:*}"
YAML
    done
    sed -n '/name: demo-1$/,/^---/p' "$dir/demo-claim.yaml" | sed '$d' | sed 's/^/      /'
    kubectl apply -f "$dir/demo-claim.yaml" >/dev/null
    template_of() { echo "demo-$1"; }
fi
for i in $(seq "$pods"); do
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: demo-$i
spec:
  restartPolicy: Never
  resourceClaims:
    - name: gpus
      resourceClaimTemplateName: $(template_of "$i")
  containers:
    - name: main
      image: ubuntu:24.04
      command: ["sh", "-c", "nvidia-smi -L; env | grep ^TOPODRA_; sleep 3600"]
      resources:
        claims:
          - name: gpus
YAML
    # One after the other, so that the last one is the one that waits.
    [[ $i -lt $pods ]] || break
    for _ in $(seq 150); do
        [[ $(phase_of "demo-$i") == Running ]] && break
        sleep 0.2
    done
    [[ $(phase_of "demo-$i") == Running ]] ||
        { kubectl get pods -o wide >&2; fail "demo-$i did not run within 30 s, though the machine has room for it"; }
done
# The scheduler's verdict on the last pod, before the table says it waits.
for _ in $(seq 150); do
    [[ -n $(kubectl get events --field-selector "involvedObject.name=$last,reason=FailedScheduling" -o name 2>/dev/null) ]] && break
    sleep 0.2
done
kubectl get pods -o wide
[[ $(phase_of "$last") == Pending ]] ||
    fail "$last is $(phase_of "$last"), not Pending: the machine had room for more than $((pods - 1)) sets"

step "each claim's allocation, and $attr of every device"
kubectl get resourceslices -o json >"$dir/slices.json"
kubectl get resourceclaims -o json >"$dir/claims.json"
# Prints the table, and exits non-zero unless every allocation has the devices asked
# for and a value of the attribute that all of them share (for a list, one value
# common to every device's list, as the scheduler matches lists). With MIG the
# attribute is the profile, so each claim's partitions are of the profile it asked.
want=${gpus:-}
[[ ${#mig[@]} -eq 0 ]] || want=$(printf '%s\n' "${mig[@]}" | sed 's/.*://' | paste -sd,)
python3 - "$dir/slices.json" "$dir/claims.json" "$attr" "$want" <<'PY' || fail "an allocation does not share $attr"
import json, sys
attr = sys.argv[3]
counts = [int(n) for n in sys.argv[4].split(",")]
values = {}
for s in json.load(open(sys.argv[1]))["items"]:
    # A slice may name its driver's own attributes without the domain.
    domain, _, short = attr.rpartition("/")
    names = [attr] + ([short] if domain == s["spec"]["driver"] else [])
    for d in s["spec"].get("devices", []):
        attrs = d.get("attributes", {})
        a = next((attrs[n] for n in names if n in attrs), {})
        v = next((a[k] for k in ("int", "string", "ints", "strings") if k in a), None)
        values[d["name"]] = v if isinstance(v, list) else ([] if v is None else [v])
ok = True
for c in json.load(open(sys.argv[2]))["items"]:
    name = c["metadata"]["name"]
    status = c.get("status") or {}
    pod = next((r["name"] for r in status.get("reservedFor") or []), "-")
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    if not results:
        print(f"  {name:<24} pod {pod:<7} not allocated")
        continue
    shared = set.intersection(*(set(values.get(r["device"], [])) for r in results))
    devices = ", ".join(f"{r['device']} ({','.join(map(str, values.get(r['device'], [])))})" for r in results)
    print(f"  {name:<24} pod {pod:<7} {devices}; shared: {','.join(map(str, sorted(shared))) or 'NONE'}")
    want = counts[0] if len(counts) == 1 else counts[int(name.split("-")[1]) - 1]
    if not shared or len(results) != want:
        ok = False
sys.exit(0 if ok else 1)
PY
echo
echo "   $last stays Pending; the scheduler says:"
kubectl get events --field-selector "involvedObject.name=$last,reason=FailedScheduling" \
    -o jsonpath='{range .items[*]}      {.message}{"\n"}{end}' | tail -1

step "why $last waits, in topology terms: the controller's Event, and kubectl topodra"
for _ in $(seq 150); do
    [[ -n $(kubectl get events --field-selector "involvedObject.name=$last,reason=WaitingForGPUs" -o name 2>/dev/null) ]] && break
    sleep 0.2
done
why=$(kubectl get events --field-selector "involvedObject.name=$last,reason=WaitingForGPUs" \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | tail -1)
[[ -n $why ]] || fail "the controller did not say within 30 s why $last waits (controller.log)"
[[ ${#mig[@]} -eq 0 || $why == *carved* ]] || fail "the controller's reason does not name the carved GPUs: $why"
echo "   kubectl get events --field-selector reason=WaitingForGPUs:"
echo "      $why"
echo
echo "   kubectl topodra nodes:"
PATH=$repo/target/debug:$PATH kubectl topodra nodes | sed 's/^/      /'
echo
echo "   kubectl topodra explain pod/$last:"
PATH=$repo/target/debug:$PATH kubectl topodra explain "pod/$last" | sed 's/^/      /'

step "the CDI edits the runtime would apply (injected by the CDI library from the plugin's specs)"
python3 - "$nodedir/kubelet/pods" <<'PY'
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    rec = json.load(open(os.path.join(d, f)))
    if not any(c.get("cdiDevices") for c in rec.get("containers", [])):
        continue
    print(f"  pod {rec.get('namespace')}/{rec.get('name')}:")
    for ctr in rec.get("containers", [rec]):
        devs = [x.get("path") for x in ctr.get("devices", ctr.get("linux", {}).get("devices", []))]
        env = [e for e in ctr.get("env", ctr.get("process", {}).get("env", [])) if e.startswith(("TOPODRA_", "CUDA_"))]
        mounts = [m.get("destination") for m in ctr.get("mounts", [])]
        print(f"    device nodes: {' '.join(devs)}")
        print(f"    env:          {' '.join(env)}")
        print(f"    mounts:       {len(mounts)} driver files, e.g. {', '.join(mounts[:2])}")
PY

step "deleting demo-1: unprepared, its CDI spec removed, and $last gets the GPUs it freed"
devices_of() {
    kubectl get resourceclaims -o json | python3 -c '
import json, sys
for c in json.load(sys.stdin)["items"]:
    st = c.get("status") or {}
    if any(r.get("name") == sys.argv[1] for r in st.get("reservedFor") or []):
        print(" ".join(r["device"] for r in st["allocation"]["devices"]["results"]))' "$1"
}
freed=$(devices_of demo-1)
kubectl delete pod demo-1 --wait=true >/dev/null
for _ in $(seq 150); do
    [[ $(phase_of "$last") == Running ]] && break
    sleep 0.2
done
kubectl get pods -o wide
[[ $(phase_of "$last") == Running ]] || fail "$last did not run within 30 s of demo-1's GPUs ($freed) being freed"
echo "   demo-1 had: $freed"
echo "   $last got:  $(devices_of "$last")"
echo "   CDI specs on the node: $(ls "$nodedir/cdi" | tr '\n' ' ')"
step "done: $((pods - 1)) pods ran on aligned sets${mig[0]:+ of MIG partitions}, $last waited with its reason and ran once GPUs were freed; cleaning up"
