//! The model on a DGX H100 with dynamic MIG: counters keep a GPU and its partitions
//! apart, each profile's figures by NUMA node, and the fragmentation reason.

use super::*;
use crate::slice::DynamicMig;
use crate::slice::fixtures::dgx_h100_mig;

fn mig_cluster(node: &str) -> Cluster {
    let opts = SliceOptions {
        dynamic_mig: DynamicMig::All,
        ..SliceOptions::new(node)
    };
    let mut c = Cluster::new(DRIVER);
    for s in build_slices(&dgx_h100_mig(), &opts).unwrap() {
        c.apply_slice(&s);
    }
    c
}

/// A claim allocated the named devices of `node`.
fn holding(name: &str, node: &str, devices: &[&str]) -> ResourceClaim {
    let mut c = claim(name, node, &[]);
    let results = devices
        .iter()
        .map(|d| DeviceRequestAllocationResult {
            driver: DRIVER.to_owned(),
            pool: node.to_owned(),
            device: (*d).to_owned(),
            request: "gpus".to_owned(),
            ..Default::default()
        })
        .collect();
    if let Some(r) = c
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
    {
        r.results = Some(results);
    }
    c
}

fn profile<'a>(s: &'a NodeSummary, p: &str, numa: &str) -> &'a ProfileGroup {
    s.profile(p)
        .find(|g| g.numa_node.as_deref() == Some(numa))
        .unwrap()
}

/// A claim of `count` devices of a class with the given selectors.
fn mig_spec(class: &str, selector: Option<&str>, count: i64, numa: bool) -> ResourceClaimSpec {
    let mut spec = aligned_spec(count, numa.then_some(NUMA));
    if let Some(e) = spec
        .devices
        .as_mut()
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
    {
        e.device_class_name = class.to_owned();
        e.selectors = selector.map(|x| {
            vec![k8s_openapi::api::resource::v1::DeviceSelector {
                cel: Some(k8s_openapi::api::resource::v1::CELDeviceSelector {
                    expression: x.to_owned(),
                }),
            }]
        });
    }
    spec
}

/// How the chart's classes read: whole GPUs, MIG devices, one profile.
fn classify(class: &str) -> Option<ClassKind> {
    match class {
        "gpu.topodra.dev" => Some(ClassKind::Gpus),
        "mig.topodra.dev" => Some(ClassKind::Mig { profile: None }),
        "mig-7g.80gb.topodra.dev" => Some(ClassKind::Mig {
            profile: Some("7g.80gb".to_owned()),
        }),
        _ => None,
    }
}

/// The demand of [`mig_spec`]'s claim, read with the chart's classes.
fn mig_demand(class: &str, selector: Option<&str>, count: i64, numa: bool) -> Demand {
    Demand::of_claim_classified(
        &mig_spec(class, selector, count, numa),
        DRIVER,
        &[],
        classify,
    )
    .unwrap()
}

#[test]
fn an_uncarved_dgx_h100_offers_every_profile_on_every_gpu() {
    let c = mig_cluster("node-a");
    let s = c.node("node-a").unwrap();
    assert_eq!((s.gpus.total, s.gpus.free, s.gpus.blocked), (8, 8, 0));
    let g = profile(s, "1g.10gb", "0");
    assert_eq!(
        (g.available, g.gpus, g.carved, g.whole_allocated),
        (28, 4, 0, 0)
    );
    assert_eq!(profile(s, "7g.80gb", "1").available, 4);
    assert_eq!(profile(s, "3g.40gb", "1").available, 8);
    // One OFA engine per GPU: one +me instance each.
    assert_eq!(profile(s, "1g.10gb+me", "0").available, 4);
}

#[test]
fn a_partition_blocks_its_gpu_and_the_placements_it_overlaps() {
    let mut c = mig_cluster("node-a");
    c.apply_claim(&holding("small", "node-a", &["gpu-7-mig-1g-10gb-6"]));
    let s = c.node("node-a").unwrap();
    assert_eq!(
        (s.gpus.free, s.gpus.blocked, s.gpus.allocated),
        (7, 1, 0),
        "gpu-7 is carved: blocked, not free"
    );
    assert_eq!(s.mig_devices.allocated, 1);
    let one = profile(s, "1g.10gb", "1");
    assert_eq!((one.available, one.carved), (27, 1));
    // gpu-7 keeps room for a 3g.40gb in its first half, not for a 4g or a 7g.
    assert_eq!(profile(s, "3g.40gb", "1").available, 7);
    assert_eq!(profile(s, "7g.80gb", "1").available, 3);

    c.apply_claim(&holding("whole", "node-a", &["gpu-6"]));
    let s = c.node("node-a").unwrap();
    let seven = profile(s, "7g.80gb", "1");
    assert_eq!(
        (seven.available, seven.carved, seven.whole_allocated),
        (2, 1, 1)
    );
    assert_eq!(s.mig_devices.allocated, 1);

    // Released: the counters come back.
    c.delete_claim(&ClaimKey {
        namespace: "default".to_owned(),
        name: "small".to_owned(),
    });
    let s = c.node("node-a").unwrap();
    assert_eq!(
        (s.gpus.blocked, profile(s, "7g.80gb", "1").available),
        (0, 3)
    );
}

#[test]
fn classes_and_selectors_say_which_profile_a_claim_wants() {
    let d = mig_demand(
        "mig.topodra.dev",
        Some(r#"device.attributes["gpu.topodra.dev"].profile == "7g.80gb""#),
        2,
        false,
    );
    assert_eq!((d.count, d.unjudged.len()), (0, 0));
    assert_eq!(
        d.mig,
        [MigWant {
            profile: "7g.80gb".to_owned(),
            count: 2
        }]
    );
    let by_class = mig_demand("mig-7g.80gb.topodra.dev", None, 1, false);
    assert_eq!(by_class.mig[0].profile, "7g.80gb");
    let any = mig_demand("mig.topodra.dev", None, 1, false);
    assert!(any.mig.is_empty());
    assert_eq!(
        any.unjudged,
        ["request gpus asks for MIG devices of any profile"]
    );
    let other = mig_demand(
        "mig.topodra.dev",
        Some(
            r#"device.attributes["gpu.topodra.dev"].profile == '1g.10gb' && device.attributes["gpu.topodra.dev"].memory.compareTo(quantity("10Gi")) >= 0"#,
        ),
        1,
        false,
    );
    assert_eq!(other.mig[0].profile, "1g.10gb");
    assert_eq!(other.unjudged, ["selectors of request gpus"]);
    let whole = mig_demand(
        "gpu.topodra.dev",
        Some(r#"device.attributes["gpu.topodra.dev"].type == "gpu""#),
        1,
        false,
    );
    assert_eq!((whole.count, whole.unjudged.len()), (1, 0));
}

#[test]
fn a_7g_that_fits_nowhere_is_explained_by_carved_gpus() {
    let mut c = mig_cluster("node-a");
    // Every GPU carved by one 1g.10gb.
    for g in 0..8 {
        c.apply_claim(&holding(
            &format!("small-{g}"),
            "node-a",
            &[&format!("gpu-{g}-mig-1g-10gb-6")],
        ));
    }
    let seven = mig_demand("mig-7g.80gb.topodra.dev", None, 1, false);
    let e = explain(&c, &seven);
    assert!(e.fits.is_empty());
    assert_eq!(
        e.message,
        "needs 1 MIG device 7g.80gb; no node can hand them out now; of the 8 GPUs that offer \
         7g.80gb, 8 are carved into other partitions (node-a NUMA 0: 4 of 4 carved; \
         node-a NUMA 1: 4 of 4 carved)"
    );
    // A 1g.10gb still fits, and the message says where.
    let small = mig_demand(
        "mig.topodra.dev",
        Some(r#"device.attributes["gpu.topodra.dev"].profile == "1g.10gb""#),
        4,
        true,
    );
    let e = explain(&c, &small);
    assert_eq!(e.fits.len(), 2);
    assert!(
        e.message.starts_with(
            "needs 4 MIG devices 1g.10gb on one NUMA node; fits now on 2 NUMA nodes \
             (node-a, NUMA 0 can hand out 24; node-a, NUMA 1 can hand out 24)"
        ),
        "{}",
        e.message
    );
}

#[test]
fn a_profile_no_node_offers_is_named() {
    let c = mig_cluster("node-a");
    let mut d = demand(1, None);
    d.count = 0;
    d.mig = vec![MigWant {
        profile: "1g.12gb".to_owned(),
        count: 1,
    }];
    assert_eq!(
        explain(&c, &d).message,
        "needs 1 MIG device 1g.12gb; no node can hand them out now; no node offers 1g.12gb"
    );
}
