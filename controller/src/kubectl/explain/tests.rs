use serde_json::json;

use super::*;
use crate::kubectl::fixtures::{DRIVER, pending_claim, two_dgx};

fn classes() -> OurClasses {
    OurClasses::from_classes([], DRIVER, &[DRIVER.to_owned()])
}

fn pod(name: &str, claims: serde_json::Value, statuses: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main"}], "resourceClaims": claims},
        "status": {
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 cannot allocate all claims."
            }],
            "resourceClaimStatuses": statuses,
        },
    }))
    .unwrap()
}

fn nic_claim(name: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {
            "deviceClassName": "rdma.example.com"}}]}},
    }))
    .unwrap()
}

fn by_name(claims: &[ResourceClaim]) -> BTreeMap<String, ResourceClaim> {
    claims
        .iter()
        .map(|c| (c.metadata.name.clone().unwrap(), c.clone()))
        .collect()
}

#[test]
fn pod_arguments() {
    assert_eq!(pod_name("pod/a"), Ok("a"));
    assert_eq!(pod_name("pods/a"), Ok("a"));
    assert_eq!(pod_name("a"), Ok("a"));
    assert!(pod_name("deploy/a").is_err());
    assert!(pod_name("pod/").is_err());
}

#[test]
fn a_claim_that_fits_nowhere_gets_the_events_message() {
    let p = pod(
        "train-0",
        json!([{"name": "gpus", "resourceClaimTemplateName": "four-gpus-one-numa-node"},
                   {"name": "nic", "resourceClaimTemplateName": "rdma-nic"}]),
        json!([{"name": "gpus", "resourceClaimName": "train-0-gpus-x7k2p"},
                   {"name": "nic", "resourceClaimName": "train-0-nic-5rq8d"}]),
    );
    let claims = by_name(&[
        pending_claim("train-0-gpus-x7k2p", 4),
        nic_claim("train-0-nic-5rq8d"),
    ]);
    let cluster = two_dgx();
    let text = explain_pod(&cluster, &pending::CpuSide::none(), &p, &claims, &classes());
    let v = pending::verdict(
        &cluster,
        &pending::CpuSide::none(),
        &p,
        |n| claims.get(n).cloned(),
        &classes(),
    )
    .unwrap();
    assert!(
        text.contains(&format!("Message:     {}\n", v.message)),
        "{text}"
    );
    assert_eq!(
        text,
        "\
Pod:         default/train-0
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Reason:      WaitingForGPUs
Message:     needs 4 GPUs on one NUMA node; 1 node has 4 free GPUs, none on one NUMA node; \
largest aligned free set: 3 (dgx-h100-b, NUMA 1); 1 GPU unhealthy or tainted

Claim train-0-gpus-x7k2p: 4 GPUs on one NUMA node
  Fits now on no node.
  Largest aligned free set: 3 (dgx-h100-b, NUMA 1)
  Nodes with 4 free GPUs, aligned or not: 1

Other claims:
  CLAIM               STATE
  train-0-nic-5rq8d   asks for no device class of gpu.topodra.dev
"
    );
}

#[test]
fn a_claim_that_fits_lists_its_candidates() {
    let p = pod(
        "train-1",
        json!([{"name": "gpus", "resourceClaimTemplateName": "two-gpus-one-numa-node"}]),
        json!([{"name": "gpus", "resourceClaimName": "train-1-gpus-b6w4n"}]),
    );
    let claims = by_name(&[pending_claim("train-1-gpus-b6w4n", 2)]);
    assert_eq!(
        explain_pod(
            &two_dgx(),
            &pending::CpuSide::none(),
            &p,
            &claims,
            &classes()
        ),
        "\
Pod:         default/train-1
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Reason:      WaitingForGPUs
Message:     needs 2 GPUs on one NUMA node; fits now on 2 nodes (dgx-h100-b, NUMA 1; \
dgx-h100-a, NUMA 1): the scheduler has not retried yet, or something else keeps the pod off \
them (node selector or affinity, node taints, device selectors, its other claims); 1 GPU \
unhealthy or tainted

Claim train-1-gpus-b6w4n: 2 GPUs on one NUMA node
  Fits now on 2 nodes:
    NODE         GROUP    FREE
    dgx-h100-b   NUMA 1   3
    dgx-h100-a   NUMA 1   2
"
    );
}

#[test]
fn pods_that_wait_for_no_gpu_say_so() {
    let mut p = pod(
        "eval-3",
        json!([{"name": "gpus", "resourceClaimTemplateName": "four-gpus-one-numa-node"},
                   {"name": "shared", "resourceClaimName": "infer-b"},
                   {"name": "gone", "resourceClaimName": "deleted"}]),
        json!([]),
    );
    let claims = by_name(&[crate::kubectl::fixtures::allocated_claim(
        "infer-b",
        "dgx-h100-b",
        &["gpu-0"],
    )]);
    assert_eq!(
        explain_pod(
            &two_dgx(),
            &pending::CpuSide::none(),
            &p,
            &claims,
            &classes()
        ),
        "\
Pod default/eval-3 waits for no GPU of gpu.topodra.dev that can be judged yet.
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Claims:
  CLAIM                                          STATE
  gpus (from template four-gpus-one-numa-node)   not created yet
  infer-b                                        allocated
  deleted                                        not found
"
    );
    p.spec.as_mut().unwrap().node_name = Some("dgx-h100-b".to_owned());
    assert_eq!(
        explain_pod(
            &two_dgx(),
            &pending::CpuSide::none(),
            &p,
            &claims,
            &classes()
        ),
        "Pod default/eval-3 is scheduled on node dgx-h100-b: it waits for no GPU.\n"
    );
}

#[test]
fn values_from_objects_cannot_forge_lines() {
    let mut p = pod(
        "p",
        json!([{"name": "gpus", "resourceClaimName": "c"},
                   {"name": "x", "resourceClaimName": "nic\nforged   allocated"}]),
        json!([]),
    );
    let status = p.status.as_mut().unwrap();
    status.conditions.as_mut().unwrap()[0].message =
        Some("busy\nReason:      Forged\u{1b}[31m".to_owned());
    let claims = by_name(&[pending_claim("c", 4), nic_claim("nic\nforged   allocated")]);
    let text = explain_pod(
        &two_dgx(),
        &pending::CpuSide::none(),
        &p,
        &claims,
        &classes(),
    );
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(
        text.contains("Scheduling:  unschedulable: busy\\nReason:      Forged\\u{1b}[31m\n"),
        "{text}"
    );
    assert!(
        text.contains("  nic\\nforged   allocated   asks for"),
        "{text}"
    );
    assert_eq!(text.lines().filter(|l| l.starts_with("Reason:")).count(), 1);

    p.spec.as_mut().unwrap().node_name = Some("n\r\u{1b}[1A".to_owned());
    assert_eq!(
        scheduled(&p).unwrap(),
        "Pod default/p is scheduled on node n\\r\\u{1b}[1A: it waits for no GPU.\n"
    );
}

mod mixed_tests {
    use serde_json::json;
    use topodra_model::capacity::CpuPools;

    use super::*;
    use crate::kubectl::fixtures::{DRIVER, two_dgx};

    const ALIAS: &str = "dra.net/numaNode";

    /// The CPU driver's grouped slice on `node`: 112 CPUs on each NUMA node.
    fn cpu_slice(node: &str) -> k8s_openapi::api::resource::v1::ResourceSlice {
        let devices: Vec<_> = (0..2)
            .map(|i| {
                json!({"name": format!("cpudevnuma{i:03}"), "attributes": {ALIAS: {"int": i}},
                       "capacity": {"dra.cpu/cpu": {"value": "112"}}, "allowMultipleAllocations": true})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-dra.cpu")},
            "spec": {"driver": "dra.cpu", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_of_gpus_and_cpus_is_explained_in_both() {
        let names = vec![NUMA_NODE_NAME.to_owned(), ALIAS.to_owned()];
        let mut pools = CpuPools::new("dra.cpu", names.clone());
        for n in ["dgx-h100-a", "dgx-h100-b"] {
            pools.apply_slice(&cpu_slice(n));
        }
        let cpu_classes = OurClasses::from_classes([], "dra.cpu", &["dra.cpu".to_owned()]);
        let cpus = pending::CpuSide {
            pools: &pools,
            classes: &cpu_classes,
            numa_names: &names,
        };
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "train-2-devices", "namespace": "default"},
            "spec": {"devices": {
                "requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}},
                    {"name": "cpus", "exactly": {"deviceClassName": "dra.cpu",
                        "capacity": {"requests": {"dra.cpu/cpu": "32"}}}}],
                "constraints": [{"matchAttribute": ALIAS}]}},
        }))
        .unwrap();
        let claims = BTreeMap::from([("train-2-devices".to_owned(), claim)]);
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "train-2", "namespace": "default"},
            "spec": {"containers": [{"name": "main"}],
                     "resourceClaims": [{"name": "devices", "resourceClaimName": "train-2-devices"}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        }))
        .unwrap();
        let ours = OurClasses::from_classes([], DRIVER, &[DRIVER.to_owned()]);
        let text = explain_pod(&two_dgx(), &cpus, &p, &claims, &ours);
        for want in [
            "Message:     needs 4 GPUs and 32 CPUs on one NUMA node; no NUMA node has 4 free GPUs \
             and 32 free CPUs; dgx-h100-b NUMA 1 has 3 GPUs and 112 CPUs free; dgx-h100-a NUMA 1 \
             has 2 GPUs and 112 CPUs free",
            "Claim train-2-devices: 4 GPUs and 32 CPUs on one NUMA node",
            "  Nearest: dgx-h100-b, NUMA 1: 3 free GPUs, 112 free CPUs",
        ] {
            assert!(text.contains(want), "{want}\n---\n{text}");
        }
    }

    const NUMA_NODE_NAME: &str = topodra_model::slice::attributes::NUMA_NODE;
}

/// A notebook waits for a 90Gi share, more than any time-sliced GPU has; another
/// asks for 30Gi on one NUMA node, which fits on both.
#[test]
fn a_share_claim_lists_the_most_one_gpu_has_left() {
    use crate::kubectl::fixtures::time_sliced_dgx;

    let class: k8s_openapi::api::resource::v1::DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "time-sliced.topodra.dev"},
        "spec": {"selectors": [
            {"cel": {"expression": "device.driver == \"gpu.topodra.dev\""}},
            {"cel": {"expression": "device.attributes[\"gpu.topodra.dev\"].type == \"shared\""}},
            {"cel": {"expression": "device.attributes[\"gpu.topodra.dev\"].sharing == \"TimeSlicing\""}}]}
    }))
    .unwrap();
    let classes = OurClasses::from_classes([&class], DRIVER, &[]);
    let share = |name: &str, memory: &str, numa: bool| -> ResourceClaim {
        let mut devices = json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "time-sliced.topodra.dev",
            "capacity": {"requests": {"memory": memory}}}}]});
        if numa {
            devices["constraints"] = json!([{"matchAttribute": "resource.kubernetes.io/numaNode"}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": devices},
        }))
        .unwrap()
    };
    let claims = by_name(&[
        share("notebook-0-gpu", "90Gi", false),
        share("notebook-1-gpu", "30Gi", true),
    ]);
    let cluster = time_sliced_dgx();
    let explain = |pod_name: &str, claim: &str| {
        let p = pod(
            pod_name,
            json!([{"name": "gpu", "resourceClaimName": claim}]),
            json!([]),
        );
        explain_pod(&cluster, &pending::CpuSide::none(), &p, &claims, &classes)
    };
    assert_eq!(
        explain("notebook-0", "notebook-0-gpu"),
        "\
Pod:         default/notebook-0
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Reason:      WaitingForGPUs
Message:     needs 1 time-sliced share (90Gi memory); no time-sliced GPU has 90Gi memory free: the most memory free on one is 81559Mi (dgx-h100-t, NUMA 0); of the 8 time-sliced GPUs, 3 hold 4 shares and 2 are allocated whole

Claim notebook-0-gpu: 1 time-sliced share (90Gi memory)
  Fits now on no node.
  Most left on one GPU: 81559Mi memory (dgx-h100-t)
"
    );
    let text = explain("notebook-1", "notebook-1-gpu");
    assert!(
        text.ends_with(
            "\
Claim notebook-1-gpu: 1 time-sliced share (30Gi memory) on one NUMA node
  Fits now on 2 NUMA nodes:
    NODE         GROUP    SHARES   LARGEST MEMORY
    dgx-h100-t   NUMA 0   4        81559Mi
    dgx-h100-t   NUMA 1   4        81559Mi
"
        ),
        "{text}"
    );
}
