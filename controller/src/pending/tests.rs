use k8s_openapi::api::core::v1::{
    Container, PodCondition, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    ResourceRequirements,
};
use serde_json::json;

use super::*;

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

fn unschedulable() -> PodStatus {
    PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

#[test]
fn only_pods_the_scheduler_gave_up_on_are_unschedulable() {
    let mut p = Pod {
        status: Some(unschedulable()),
        ..Default::default()
    };
    assert!(is_unschedulable(&p));
    p.spec = Some(PodSpec {
        node_name: Some("n".into()),
        ..Default::default()
    });
    assert!(!is_unschedulable(&p), "bound");
    assert!(!is_unschedulable(&Pod::default()), "not tried yet");
}

#[test]
fn claims_come_from_names_and_generated_templates() {
    let p = Pod {
        spec: Some(PodSpec {
            resource_claims: Some(vec![
                PodResourceClaim {
                    name: "a".into(),
                    resource_claim_name: Some("shared".into()),
                    ..Default::default()
                },
                PodResourceClaim {
                    name: "b".into(),
                    resource_claim_template_name: Some("t".into()),
                    ..Default::default()
                },
                PodResourceClaim {
                    name: "c".into(),
                    resource_claim_template_name: Some("t".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "b".into(),
                resource_claim_name: Some("p-b-x7k2".into()),
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(claim_names(&p), ["shared", "p-b-x7k2"]);
}

#[test]
fn extended_resources_of_our_classes_are_demands() {
    let classes: Vec<k8s_openapi::api::resource::v1::DeviceClass> =
        vec![serde_json::from_value(json!({
            "metadata": {"name": "gpu.topodra.dev"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.topodra.dev\""}}],
                     "extendedResourceName": "nvidia.com/gpu"}
        })).unwrap()];
    let ours = OurClasses::from_classes(&classes, "gpu.topodra.dev", &[]);
    let limits = |n: &str| ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_owned(),
            Quantity(n.to_owned()),
        )])),
        ..Default::default()
    };
    let p = Pod {
        spec: Some(PodSpec {
            containers: vec![
                Container {
                    name: "a".into(),
                    resources: Some(limits("2")),
                    ..Default::default()
                },
                Container {
                    name: "b".into(),
                    resources: Some(limits("1")),
                    ..Default::default()
                },
            ],
            init_containers: Some(vec![Container {
                name: "i".into(),
                resources: Some(limits("4")),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(unschedulable()),
        ..Default::default()
    };
    let d = demands(&p, |_| None, &ours, "gpu.topodra.dev", &CpuSide::none());
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].0, Source::ExtendedResource("nvidia.com/gpu".into()));
    assert_eq!((d[0].1.count, d[0].1.level), (4, None));
}

#[test]
fn a_waiting_claim_gets_the_models_message() {
    let ours = OurClasses::from_classes([], "gpu.topodra.dev", &["gpu.topodra.dev".to_owned()]);
    let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "four", "namespace": "default"},
            "spec": {"devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.topodra.dev", "count": 4}}],
                "constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}]
            }}
        }))
        .unwrap();
    let p = pod(json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [], "resourceClaims": [{"name": "gpus", "resourceClaimName": "four"}]},
    }));
    let cluster = Cluster::new("gpu.topodra.dev");
    let v = verdict(
        &cluster,
        &CpuSide::none(),
        &p,
        |n| (n == "four").then(|| claim.clone()),
        &ours,
    )
    .unwrap();
    assert_eq!(
        v.message,
        "needs 4 GPUs on one NUMA node; no node has 4 free GPUs; no GPU is free"
    );
    // Once allocated, the claim waits for nothing of ours.
    let mut allocated = claim.clone();
    allocated.status =
        serde_json::from_value(json!({"allocation": {"devices": {"results": []}}})).unwrap();
    assert!(
        verdict(
            &cluster,
            &CpuSide::none(),
            &p,
            |_| Some(allocated.clone()),
            &ours
        )
        .is_none()
    );
}

#[test]
fn long_messages_are_cut_to_what_the_api_server_takes() {
    let m = limit("é".repeat(1000));
    assert!(m.len() <= MAX_MESSAGE);
    assert!(m.ends_with("..."));
}

/// A pod written for the device plugin's mixed MIG strategy waits for a 7g.80gb on a
/// DGX H100 whose every GPU is carved by one 1g.10gb: the Event names the carving.
#[test]
fn a_mig_profile_by_extended_resource_is_explained_by_fragmentation() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use topodra_model::slice::{DynamicMig, SliceOptions, build_slices, fixtures};

    let mut cluster = Cluster::new("gpu.topodra.dev");
    let mut opts = SliceOptions::new("node-a");
    opts.dynamic_mig = DynamicMig::All;
    for s in build_slices(&fixtures::dgx_h100_mig(), &opts).unwrap() {
        cluster.apply_slice(&s);
    }
    for g in 0..8 {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("small-{g}"), "namespace": "default"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [{
                "driver": "gpu.topodra.dev", "pool": "node-a",
                "device": format!("gpu-{g}-mig-1g-10gb-6"), "request": "gpus"}]}}}
        }))
        .unwrap();
        cluster.apply_claim(&claim);
    }
    let classes: Vec<k8s_openapi::api::resource::v1::DeviceClass> =
        vec![serde_json::from_value(json!({
            "metadata": {"name": "mig-7g.80gb.topodra.dev"},
            "spec": {"selectors": [
                {"cel": {"expression": "device.driver == \"gpu.topodra.dev\""}},
                {"cel": {"expression": "device.attributes[\"gpu.topodra.dev\"].type == \"mig\""}},
                {"cel": {"expression": "device.attributes[\"gpu.topodra.dev\"].profile == \"7g.80gb\""}}],
                     "extendedResourceName": "nvidia.com/mig-7g.80gb"}
        })).unwrap()];
    let ours = OurClasses::from_classes(&classes, "gpu.topodra.dev", &[]);
    let p = pod(json!({
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {"containers": [{"name": "main",
            "resources": {"limits": {"nvidia.com/mig-7g.80gb": "1"}}}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    }));
    let v = verdict(&cluster, &CpuSide::none(), &p, |_| None, &ours).unwrap();
    assert_eq!(
        v.message,
        "nvidia.com/mig-7g.80gb: needs 1 MIG device 7g.80gb; no node can hand them out now; \
         of the 8 GPUs that offer 7g.80gb, 8 are carved into other partitions \
         (node-a NUMA 0: 4 of 4 carved; node-a NUMA 1: 4 of 4 carved)"
    );
}

/// A pod waits for a 90Gi share of a time-sliced GPU, more than any GPU has, and for
/// two shares of the default size through the time-sliced class's extended
/// resource, which fit: the Event says which is which.
#[test]
fn a_share_is_explained_by_the_most_one_gpu_has_left() {
    let cluster = crate::kubectl::fixtures::time_sliced_dgx();
    let classes: Vec<k8s_openapi::api::resource::v1::DeviceClass> =
        vec![serde_json::from_value(json!({
            "metadata": {"name": "time-sliced.topodra.dev"},
            "spec": {"selectors": [
                {"cel": {"expression": "device.driver == \"gpu.topodra.dev\""}},
                {"cel": {"expression": "device.attributes[\"gpu.topodra.dev\"].type == \"shared\""}},
                {"cel": {"expression": "device.attributes[\"gpu.topodra.dev\"].sharing == \"TimeSlicing\""}}],
                     "extendedResourceName": "nvidia.com/gpu.shared"}
        }))
        .unwrap()];
    let ours = OurClasses::from_classes(&classes, "gpu.topodra.dev", &[]);
    let mut big = crate::kubectl::fixtures::share_claim("big", "dgx-h100-t", "gpu-4-ts", "90Gi");
    big.status = None;
    let p = pod(json!({
        "metadata": {"name": "notebook", "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "big"}],
            "containers": [{"name": "main",
                "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    }));
    let v = verdict(&cluster, &CpuSide::none(), &p, |_| Some(big.clone()), &ours).unwrap();
    assert_eq!(
        v.message,
        "claim big: needs 1 time-sliced share (90Gi memory); no time-sliced GPU has 90Gi \
         memory free: the most memory free on one is 81559Mi (dgx-h100-t, NUMA 0); of the 8 \
         time-sliced GPUs, 3 hold 4 shares and 2 are allocated whole | nvidia.com/gpu.shared: \
         needs 2 time-sliced shares (of the default size); fits now on 1 node (dgx-h100-t: \
         room for 17): the scheduler has not retried yet, or something else keeps the pod off \
         them (node selector or affinity, node taints, device selectors, its other claims)"
    );
}
