#!/usr/bin/env bash
# `make demo`: a local control plane, the plugin on a simulated GPU node, and pods that
# get NUMA-aligned GPU sets from the real kube-scheduler.
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
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

profile=${1:-dgx-h100}
node=sim-$profile
[[ -f tests/fake-nvml/profiles/$profile.yaml ]] || {
    echo "no profile $profile; have: $(ls tests/fake-nvml/profiles | sed -n 's/\.yaml$//p' | tr '\n' ' ')" >&2
    exit 2
}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/topodra-demo.XXXXXX")
pids=()
cleanup() {
    status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
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

step "building (first run: the Rust workspace, then Kubernetes from its Go modules, 15-30 min on 2 cores)"
cargo build -q -p topodra-fake-nvml -p topodra-kubelet-plugin -p topodra-controller
bash tests/tools/build.sh kube etcd nvidia-ctk >&2
eval "$(bash tests/tools/build.sh --env kube etcd)"
# NVIDIA's nvidia-cdi-hook (built from the pinned toolkit module): the plugin installs
# it into its directory under the node's kubelet plugins directory, as it installs the
# image's copy on a real node, and the claims' CDI specs name it.
hook=$(bash tests/tools/build.sh --print-path nvidia-ctk)/nvidia-cdi-hook
gobin=${TOPODRA_TOOLS_CACHE:-$HOME/.cache/topodra/tools}/demo-bin
mkdir -p "$gobin"
(cd tests/cluster && CGO_ENABLED=0 go build -trimpath -o "$gobin/topodra-cluster" ./cmd/topodra-cluster)
(cd tests/e2e && CGO_ENABLED=0 go build -trimpath -o "$gobin/topodra-kubelet-harness" ./cmd/topodra-kubelet-harness)
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

step "the plugin on a simulated $profile ($(sed -n 's/^description: *//p' tests/fake-nvml/profiles/$profile.yaml | tr -d '"'))"
mapfile -t sim_flags < <(target/debug/topodra-sim-node --cdi-hook "$hook" "$profile" "$nodedir/sim")
echo "1234-demo-boot" >"$nodedir/boot_id"
KUBECONFIG=$nodedir/plugin.kubeconfig target/debug/topodra-kubelet-plugin serve \
    --node-name "$node" --kubelet-registry-dir "$nodedir/registry" --kubelet-plugins-dir "$nodedir/plugins" \
    --cdi-dir "$nodedir/cdi" --http-addr 127.0.0.1:0 --boot-id-file "$nodedir/boot_id" \
    "${sim_flags[@]}" >"$dir/plugin.log" 2>&1 &
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
step "kubectl describe resourceslice (first two devices)"
kubectl describe resourceslice | awk '/^    Attributes:/{n++} n<=2' | sed -n '1,80p'

step "three pods, each asking for 4 GPUs on one NUMA node (deploy/examples/01-four-gpus-one-numa-node.yaml)"
example=$(ls deploy/examples/01-*.yaml)
kubectl apply -f "$example" >/dev/null
for name in second third; do
    sed "s/^  name: four-gpus-one-numa-node$/  name: four-gpus-one-numa-node/; /^kind: Pod/,\$ s/^  name: four-gpus-one-numa-node$/  name: $name/" "$example" |
        awk '/^kind: Pod/{p=1} p' | sed '1i apiVersion: v1' | kubectl apply -f - >/dev/null
done
pods=(four-gpus-one-numa-node second third)
for _ in $(seq 150); do
    running=$(kubectl get pods -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c Running || true)
    [[ $running -ge 2 ]] && break
    sleep 0.2
done
sleep 2
kubectl get pods -o wide

step "each claim's allocation and the NUMA node of every GPU"
kubectl get resourceslices -o json >"$dir/slices.json"
kubectl get resourceclaims -o json >"$dir/claims.json"
python3 - "$dir/slices.json" "$dir/claims.json" <<'PY'
import json, sys
numa = {}
for s in json.load(open(sys.argv[1]))["items"]:
    for d in s["spec"].get("devices", []):
        a = d.get("attributes", {}).get("resource.kubernetes.io/numaNode", {})
        numa[d["name"]] = a.get("int", a.get("ints"))
for c in json.load(open(sys.argv[2]))["items"]:
    name = c["metadata"]["name"]
    status = c.get("status") or {}
    pod = next((r["name"] for r in status.get("reservedFor") or []), "-")
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    if not results:
        print(f"  {name:<40} pod {pod:<26} not allocated")
        continue
    devices = ", ".join(f"{r['device']} (NUMA {numa.get(r['device'])})" for r in results)
    print(f"  {name:<40} pod {pod:<26} {devices}")
PY
echo
echo "   the third pod stays Pending; the scheduler says:"
kubectl get events --field-selector involvedObject.name=third,reason=FailedScheduling \
    -o jsonpath='{range .items[*]}      {.message}{"\n"}{end}' | tail -1

step "why the third pod waits, in topology terms: the controller's Event, and kubectl topodra"
for _ in $(seq 150); do
    [[ -n $(kubectl get events --field-selector involvedObject.name=third,reason=WaitingForGPUs -o name 2>/dev/null) ]] && break
    sleep 0.2
done
echo "   kubectl get events --field-selector reason=WaitingForGPUs:"
kubectl get events --field-selector involvedObject.name=third,reason=WaitingForGPUs \
    -o jsonpath='{range .items[*]}      {.message}{"\n"}{end}' | tail -1
echo
echo "   kubectl topodra nodes:"
PATH=$repo/target/debug:$PATH kubectl topodra nodes | sed 's/^/      /'
echo
echo "   kubectl topodra explain pod/third:"
PATH=$repo/target/debug:$PATH kubectl topodra explain pod/third | sed 's/^/      /'

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

step "deleting the first pod: unprepared, its CDI spec removed, and the Pending pod gets the freed GPUs"
kubectl delete pod four-gpus-one-numa-node --wait=true >/dev/null
for _ in $(seq 150); do
    [[ $(kubectl get pod third -o jsonpath='{.status.phase}') == Running ]] && break
    sleep 0.2
done
kubectl get pods -o wide
echo "   CDI specs on the node: $(ls "$nodedir/cdi" | tr '\n' ' ')"
step "done; cleaning up"
