#!/usr/bin/env bash
# Smoke test of the legacy baseline's topology-aware scheduler (tool topo-sched:
# scheduler-plugins' kube-scheduler with NodeResourceTopologyMatch) against the
# local v1.37.2 control plane of tests/cluster:
#
#   1. builds (or reuses) topo-sched, helm and the cluster tools, starts a cluster;
#   2. installs the NodeResourceTopology CRD from deploy/helm/topodra;
#   3. creates Node gpu-node-0 (8 nvidia.com/gpu, 64 CPUs, 256Gi, Ready) and its
#      NodeResourceTopology as the NFD topology updater would publish it: zones
#      node-0 and node-1 with 4 GPUs, 32 CPUs and 128Gi each, policy
#      single-numa-node, scope pod;
#   4. starts topology-aware-scheduler as a second scheduler with
#      scheduler-config.yaml.in rendered for --mode;
#   5. asks for 5 GPUs (must be refused: no NUMA node has 5), then 4 GPUs (must
#      be bound to gpu-node-0), then 4 GPUs again (printed only: the answer
#      depends on the cache mode, see docs/e2e.md).
#
# Usage: tests/tools/topo-sched/smoke.sh [--mode overreserve|passthrough|discard]
#                                         [--dir DIR] [--keep]
#   --mode   NRT cache of the plugin (default overreserve):
#              overreserve  cacheResyncPeriodSeconds 5 (cache, Reserve accounting)
#              passthrough  cacheResyncPeriodSeconds 0 (reads NRT on every call)
#              discard      discardReservedNodes true
#   --dir    work directory (default: a new temporary one)
#   --keep   keep the work directory (logs, rendered config) after the run
# Exit status 0 only when both checks pass. The cluster and the scheduler are
# always stopped.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
mode=overreserve
dir=""
keep=0
while (($#)); do
	case "$1" in
	--mode) mode="$2"; shift ;;
	--dir) dir="$2"; shift ;;
	--keep) keep=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "smoke.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
case "$mode" in
overreserve) resync=5 discard=false ;;
passthrough) resync=0 discard=false ;;
discard) resync=0 discard=true ;;
*) echo "smoke.sh: unknown mode $mode" >&2; exit 2 ;;
esac
if [[ -z "$dir" ]]; then
	dir="$(mktemp -d "${TMPDIR:-/tmp}/topo-sched-smoke.XXXXXX")"
else
	mkdir -p "$dir"
fi

log() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

sched_pid=""
cluster_up=0
cleanup() {
	local rc=$?
	if [[ -n "$sched_pid" ]] && kill -0 "$sched_pid" 2>/dev/null; then
		kill "$sched_pid" 2>/dev/null || true
		wait "$sched_pid" 2>/dev/null || true
	fi
	if ((cluster_up)); then
		"$root/tests/cluster/topodra-cluster.sh" down --dir "$dir/cluster" >&2 || true
	fi
	if ((keep)); then
		log "kept $dir"
	else
		rm -rf "$dir"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

sched_bin="$("$root/tests/tools/build.sh" --print-path topo-sched)/topology-aware-scheduler"
helm_bin="$("$root/tests/tools/build.sh" --print-path helm)/helm"
"$sched_bin" --version >&2

log "starting the cluster in $dir/cluster"
cluster_up=1
eval "$(TOPODRA_TOOLS="kube etcd" "$root/tests/cluster/topodra-cluster.sh" up --dir "$dir/cluster")"

log "installing the NodeResourceTopology CRD"
"$helm_bin" template t "$root/deploy/helm/topodra" --set nodeResourceTopology.installCRD=true \
	--show-only templates/nrt-crd.yaml --kube-version 1.37.0 | kubectl apply -f - >&2
kubectl wait --for condition=Established --timeout=60s crd/noderesourcetopologies.topology.node.k8s.io >&2

log "creating Node gpu-node-0 and its NodeResourceTopology"
kubectl apply -f - >&2 <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-0
  labels:
    kubernetes.io/hostname: gpu-node-0
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
EOF
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
kubectl patch node gpu-node-0 --subresource=status --type=merge -p "$(cat <<EOF
{"status": {
  "capacity":    {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
  "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "smoke test", "lastHeartbeatTime": "$now", "lastTransitionTime": "$now"}]
}}
EOF
)" >&2
kubectl apply -f - >&2 <<'EOF'
apiVersion: topology.node.k8s.io/v1alpha2
kind: NodeResourceTopology
metadata:
  name: gpu-node-0
attributes:
  - {name: topologyManagerPolicy, value: single-numa-node}
  - {name: topologyManagerScope, value: pod}
zones:
  - name: node-0
    type: Node
    costs: [{name: node-0, value: 10}, {name: node-1, value: 20}]
    resources:
      - {name: cpu, capacity: "32", allocatable: "32", available: "32"}
      - {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}
      - {name: nvidia.com/gpu, capacity: "4", allocatable: "4", available: "4"}
  - name: node-1
    type: Node
    costs: [{name: node-0, value: 20}, {name: node-1, value: 10}]
    resources:
      - {name: cpu, capacity: "32", allocatable: "32", available: "32"}
      - {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}
      - {name: nvidia.com/gpu, capacity: "4", allocatable: "4", available: "4"}
EOF

# A loopback port nothing listens on.
port=""
for _ in $(seq 50); do
	p=$((20000 + RANDOM % 40000))
	if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[[ -n "$port" ]] || { log "no free port"; exit 1; }

cfg="$dir/topology-aware-scheduler.yaml"
sed -e "s|@KUBECONFIG@|$KUBECONFIG|" -e "s|@CACHE_RESYNC_PERIOD_SECONDS@|$resync|" \
	-e "s|@DISCARD_RESERVED_NODES@|$discard|" "$here/scheduler-config.yaml.in" >"$cfg"
sched_log="$dir/topology-aware-scheduler.log"
log "starting topology-aware-scheduler (mode $mode) on 127.0.0.1:$port, log $sched_log"
"$sched_bin" --config="$cfg" \
	--authentication-kubeconfig="$KUBECONFIG" --authorization-kubeconfig="$KUBECONFIG" \
	--bind-address=127.0.0.1 --secure-port="$port" --cert-dir="$dir/certs" \
	--profiling=false --v=2 >"$sched_log" 2>&1 &
sched_pid=$!
start=$SECONDS
until [[ "$(curl -ks "https://127.0.0.1:$port/healthz" 2>/dev/null)" == ok ]]; do
	if ! kill -0 "$sched_pid" 2>/dev/null; then
		log "topology-aware-scheduler exited; log tail:"; tail -25 "$sched_log" >&2; exit 1
	fi
	((SECONDS - start < 60)) || { log "not healthy after 60 s; log tail:"; tail -25 "$sched_log" >&2; exit 1; }
	sleep 0.5
done
log "topology-aware-scheduler healthy after $((SECONDS - start)) s"

gpu_pod() {
	kubectl apply -f - >&2 <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
spec:
  schedulerName: topology-aware-scheduler
  # No kubelet heartbeats: the node-lifecycle controller taints the node.
  tolerations:
    - {key: node.kubernetes.io/not-ready, operator: Exists}
    - {key: node.kubernetes.io/unreachable, operator: Exists}
  containers:
    - name: cuda
      image: registry.invalid/cuda:none
      resources:
        limits: {cpu: "4", memory: 8Gi, nvidia.com/gpu: "$2"}
        requests: {cpu: "4", memory: 8Gi, nvidia.com/gpu: "$2"}
EOF
}
# event POD REASON: the newest message of that reason, waiting up to 30 s.
event() {
	local msg="" i
	for i in $(seq 60); do
		msg="$(kubectl get events --field-selector "involvedObject.name=$1,reason=$2" \
			-o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | tail -1)"
		[[ -n "$msg" ]] && break
		sleep 0.5
	done
	echo "$msg"
}

fail=0
gpu_pod gpu5 5
msg5="$(event gpu5 FailedScheduling)"
log "gpu5 (5 GPUs): FailedScheduling: ${msg5:-<no event in 30 s>}"
[[ "$msg5" == *"cannot align pod"* ]] || { log "FAIL: gpu5 was not refused by NUMA alignment"; fail=1; }

gpu_pod gpu4 4
msg4="$(event gpu4 Scheduled)"
log "gpu4 (4 GPUs): Scheduled: ${msg4:-<no event in 30 s>}"
[[ "$(kubectl get pod gpu4 -o jsonpath='{.spec.nodeName}')" == gpu-node-0 ]] ||
	{ log "FAIL: gpu4 was not bound to gpu-node-0"; fail=1; }

# A second 4-GPU pod: the NRT object still says 4+4 available (no updater runs),
# so what happens shows the cache mode.
gpu_pod gpu4b 4
sleep 8
node="$(kubectl get pod gpu4b -o jsonpath='{.spec.nodeName}')"
if [[ -n "$node" ]]; then
	log "gpu4b (4 more GPUs, mode $mode): bound to $node"
else
	log "gpu4b (4 more GPUs, mode $mode): pending: $(event gpu4b FailedScheduling)"
fi

kubectl get pods -o wide >&2
errs="$(grep -c '^E' "$sched_log" || true)"
log "scheduler log: $errs error lines"
((errs == 0)) || grep '^E' "$sched_log" | sort -u -k5 | head -5 >&2
if ((fail)); then
	log "FAILED (mode $mode)"
	exit 1
fi
log "PASS (mode $mode)"
