# The MPS part of tests/scripts/demo.sh (`make demo SIM_PROFILE=l40s-mps`), sourced by
# it once the cluster, the node and the plugin (--mps) are up: two pods share one GPU
# through MPS, each with its own limits from its claim, printed from the CDI edits
# the runtime would apply; the GPU's compute mode and MPS daemon on the simulated
# node; and the daemon quitting after the last share. Uses demo.sh's step, fail,
# dir, nodedir, sim_flags and what.

driver_root=
for f in "${sim_flags[@]}"; do
    [[ $f == --driver-root=* ]] && driver_root=${f#--driver-root=}
done
[[ -n $driver_root ]] || fail "topodra-sim-node printed no --driver-root"

step "kubectl describe resourceslice (gpu-0-mps: the GPU's attributes, its memory and SMs to share)"
kubectl describe resourceslice >"$dir/describe.txt"
# A device's fields are described in name order, its Name last.
awk '
    /^    Attributes:/ { block = "" }
    { block = block $0 "\n" }
    /^    Name: +gpu-0-mps$/ { printf "%s", block; exit }' "$dir/describe.txt" >"$dir/mps-device.txt"
grep -A1 -e '^      Sharing:' -e '^      Type:' "$dir/mps-device.txt"
sed -n '/^    Capacity:/,$p' "$dir/mps-device.txt"
[[ -s $dir/mps-device.txt ]] || fail "no device gpu-0-mps in the slices"


step "$what"
: >"$dir/demo-claim.yaml"
for spec in "1 20Gi 60" "2 10Gi 40"; do
    read -r i memory compute <<<"$spec"
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
            deviceClassName: mps.topodra.dev
            capacity:
              requests:
                memory: $memory
                compute: "$compute"
YAML
done
sed -n '/name: demo-1$/,/^---/p' "$dir/demo-claim.yaml" | sed '$d' | sed 's/^/      /'
kubectl apply -f "$dir/demo-claim.yaml" >/dev/null
for i in 1 2; do
    kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: demo-$i
spec:
  restartPolicy: Never
  resourceClaims:
    - name: gpus
      resourceClaimTemplateName: demo-$i
  containers:
    - name: main
      image: ubuntu:24.04
      command: ["sh", "-c", "nvidia-smi -L; env | grep -e ^TOPODRA_ -e ^CUDA_MPS_; sleep 3600"]
      resources:
        claims:
          - name: gpus
YAML
done
for i in 1 2; do
    for _ in $(seq 150); do
        [[ $(kubectl get pod "demo-$i" -o jsonpath='{.status.phase}') == Running ]] && break
        sleep 0.2
    done
    [[ $(kubectl get pod "demo-$i" -o jsonpath='{.status.phase}') == Running ]] ||
        { kubectl get pods -o wide >&2; fail "demo-$i did not run within 30 s"; }
done
kubectl get pods -o wide

step "each claim's allocation: one MPS device, a share ID, the memory and SMs consumed"
kubectl get resourceclaims -o json >"$dir/claims.json"
python3 - "$dir/claims.json" <<'PY' || fail "the two shares are not on one GPU"
import json, sys
devices = set()
for c in json.load(open(sys.argv[1]))["items"]:
    st = c.get("status") or {}
    pod = next((r["name"] for r in st.get("reservedFor") or []), "-")
    for r in ((st.get("allocation") or {}).get("devices") or {}).get("results") or []:
        used = ", ".join(f"{k} {v}" for k, v in sorted((r.get("consumedCapacity") or {}).items()))
        print(f"  {c['metadata']['name']:<24} pod {pod:<7} {r['device']} (share {r.get('shareID', '-')[:8]}…): {used}")
        devices.add(r["device"])
sys.exit(0 if len(devices) == 1 else 1)
PY

step "the CDI edits the runtime would apply: each container's limits and the GPU's MPS pipe directory"
python3 - "$nodedir/kubelet/pods" <<'PY'
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    rec = json.load(open(os.path.join(d, f)))
    for ctr in rec.get("containers", []):
        if not ctr.get("cdiDevices"):
            continue
        print(f"  pod {rec.get('namespace')}/{rec.get('name')}:")
        for e in ctr.get("env", []):
            if e.startswith(("CUDA_MPS_", "TOPODRA_SHARING", "TOPODRA_GPU_MEMORY")):
                print(f"    {e}")
        for m in ctr.get("mounts", []):
            if m.get("destination") == "/tmp/nvidia-mps":
                print(f"    mount {m.get('source')} -> /tmp/nvidia-mps")
PY

step "on the node: the GPU in EXCLUSIVE_PROCESS, one MPS control daemon for it (what the driver was told)"
sed 's/^/   nvidia-cuda-mps-control /' "$driver_root/var/log/nvidia-cuda-mps-control.calls"
grep -q '^start ' "$driver_root/var/log/nvidia-cuda-mps-control.calls" || fail "no MPS daemon was started"
echo "   the simulated driver's compute modes (3 is EXCLUSIVE_PROCESS; the others are at 0, the default):"
awk '/^  GPU-/ { gpu = $1 } /compute_mode:/ { print "      " gpu " " $0 }' "$nodedir/sim/nvml/nvml-state.yaml" | sed 's/:  */: /g'
grep -q 'compute_mode: 3' "$nodedir/sim/nvml/nvml-state.yaml" || fail "no GPU is in EXCLUSIVE_PROCESS" 

step "kubectl topodra nodes (the shared GPU) and fit (where one more share of 20Gi and 50 % would go)"
PATH=$repo/target/debug:$PATH kubectl topodra nodes | sed 's/^/      /'
echo
PATH=$repo/target/debug:$PATH kubectl topodra fit --sharing MPS --share-memory 20Gi --share-compute 50 |
    sed 's/^/      /'

step "deleting both pods: the last share's unprepare tells the daemon to quit"
kubectl delete pod demo-1 demo-2 --wait=true >/dev/null
for _ in $(seq 150); do
    grep -q '^quit ' "$driver_root/var/log/nvidia-cuda-mps-control.calls" && break
    sleep 0.2
done
grep -q '^quit ' "$driver_root/var/log/nvidia-cuda-mps-control.calls" || fail "the MPS daemon was not told to quit"
tail -1 "$driver_root/var/log/nvidia-cuda-mps-control.calls" | sed 's/^/   nvidia-cuda-mps-control /'
echo "   CDI specs on the node: $(ls "$nodedir/cdi" | tr '\n' ' ')"
step "done: two pods shared one GPU through MPS with their own limits, and the daemon went with the last share; cleaning up"
