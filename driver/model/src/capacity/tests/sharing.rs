//! The model on a time-sliced DGX H100: shared devices are no GPUs of their own, a
//! GPU that holds shares is not free for a whole-GPU claim, each NUMA node's shared
//! GPUs keep their memory figures, and a share that fits nowhere is explained.

use k8s_openapi::api::resource::v1::{CapacityRequirements, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::slice::{Sharing, TimeSlicing};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;
/// One H100 80GB's memory as the fixture's NVML reports it.
const H100: u64 = 81559 * MI;

fn time_sliced(node: &str, tainted: &[&str]) -> Vec<ResourceSlice> {
    let mut opts = SliceOptions {
        sharing: Sharing {
            time_slicing: Some(TimeSlicing::default()),
            ..Default::default()
        },
        ..SliceOptions::new(node)
    };
    opts.device_taints = tainted
        .iter()
        .map(|d| {
            let taint = DeviceTaint {
                key: "gpu.topodra.dev/unhealthy".to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Default::default()
            };
            ((*d).to_owned(), vec![taint])
        })
        .collect();
    build_slices(&dgx_h100(), &opts).unwrap()
}

fn shared_cluster(node: &str) -> Cluster {
    let mut c = Cluster::new(DRIVER);
    for s in time_sliced(node, &[]) {
        c.apply_slice(&s);
    }
    c
}

/// A claim holding one share of `device`, as the scheduler writes it: a share id
/// and, when given, the memory the share consumes.
fn share_of(name: &str, node: &str, device: &str, memory: Option<&str>) -> ResourceClaim {
    let mut c = claim(name, node, &[]);
    if let Some(r) = c
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
    {
        r.results = Some(vec![DeviceRequestAllocationResult {
            driver: DRIVER.to_owned(),
            pool: node.to_owned(),
            device: device.to_owned(),
            request: "gpus".to_owned(),
            share_id: Some(format!("{name}-share")),
            consumed_capacity: memory
                .map(|m| BTreeMap::from([("memory".to_owned(), Quantity(m.to_owned()))])),
            ..Default::default()
        }]);
    }
    c
}

fn key(name: &str) -> ClaimKey {
    ClaimKey {
        namespace: "default".to_owned(),
        name: name.to_owned(),
    }
}

fn group<'a>(s: &'a NodeSummary, numa: &str) -> &'a SharedGroup {
    s.shared_groups(Some("TimeSlicing"))
        .find(|g| g.numa_node.as_deref() == Some(numa))
        .unwrap()
}

/// The chart's time-sliced class, read as the controller reads it.
fn classify(class: &str) -> Option<ClassKind> {
    match class {
        "time-sliced.topodra.dev" => Some(
            ClassKind::of_selectors(
                [
                    r#"device.driver == "gpu.topodra.dev""#,
                    r#"device.attributes["gpu.topodra.dev"].type == "shared""#,
                    r#"device.attributes["gpu.topodra.dev"].sharing == "TimeSlicing""#,
                ],
                DRIVER,
            )
            .0,
        ),
        "gpu.topodra.dev" => Some(ClassKind::Gpus),
        _ => None,
    }
}

/// A claim for `count` shares of the time-sliced class, each with `memory` (the
/// default when `None`), on one NUMA node when `numa`.
fn share_demand(memory: Option<&str>, count: i64, numa: bool) -> Demand {
    let mut spec = aligned_spec(count, numa.then_some(NUMA));
    if let Some(e) = spec
        .devices
        .as_mut()
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
    {
        e.device_class_name = "time-sliced.topodra.dev".to_owned();
        e.capacity = memory.map(|m| CapacityRequirements {
            requests: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(m.to_owned()),
            )])),
        });
    }
    Demand::of_claim_classified(&spec, DRIVER, &[], classify).unwrap()
}

#[test]
fn time_sliced_devices_are_not_counted_as_gpus() {
    let c = shared_cluster("node-a");
    let s = c.node("node-a").unwrap();
    assert_eq!((s.gpus.total, s.gpus.free, s.gpus.blocked), (8, 8, 0));
    assert_eq!(s.mig_devices.total, 0);
}

#[test]
fn each_numa_node_has_its_time_sliced_gpus_and_their_memory() {
    let c = shared_cluster("node-a");
    let s = c.node("node-a").unwrap();
    assert_eq!(s.shared.len(), 2);
    for numa in ["0", "1"] {
        let g = group(s, numa);
        assert_eq!(
            (g.gpus, g.usable, g.in_use, g.shares, g.whole_allocated),
            (4, 4, 0, 0, 0)
        );
        assert_eq!(
            g.capacity["memory"],
            CapacityFigures {
                total: 4 * H100,
                allocated: 0,
                free: 4 * H100,
                largest_free: H100,
            }
        );
        assert_eq!(g.capacity.len(), 1, "no compute on a time-sliced device");
    }
    // In JSON beside the GPUs; no figure of a node without sharing changes.
    let v = serde_json::to_value(s).unwrap();
    assert_eq!(v["shared"][1]["numaNode"], "1");
    assert_eq!(v["shared"][1]["capacity"]["memory"]["largestFree"], H100);
    assert!(v["gpus"].get("shared").is_none());
    let plain = serde_json::to_value(cluster(&["node-a"]).node("node-a").unwrap()).unwrap();
    assert!(plain.get("shared").is_none());
}

#[test]
fn a_shared_gpu_is_blocked_for_whole_gpu_claims_until_its_last_share_goes() {
    let mut c = shared_cluster("node-a");
    let fresh = c.node("node-a").unwrap().clone();
    c.apply_claim(&share_of("a", "node-a", "gpu-7-ts", Some("20Gi")));
    c.apply_claim(&share_of("b", "node-a", "gpu-7-ts", Some("30Gi")));
    let s = c.node("node-a").unwrap();
    assert_eq!(
        (s.gpus.free, s.gpus.blocked, s.gpus.allocated),
        (7, 1, 0),
        "gpu-7 holds shares: blocked, not free"
    );
    assert_eq!(
        (s.gpus.shared, s.gpus.carved()),
        (1, 0),
        "shared, not carved"
    );
    assert_eq!(s.groups(Level::NumaNode)[1].counts.shared, 1);
    let g = group(s, "1");
    assert_eq!((g.usable, g.in_use, g.shares), (4, 1, 2));
    assert_eq!(
        g.capacity["memory"],
        CapacityFigures {
            total: 4 * H100,
            allocated: 50 * GI,
            free: 4 * H100 - 50 * GI,
            largest_free: H100,
        }
    );
    c.delete_claim(&key("a"));
    let s = c.node("node-a").unwrap();
    assert_eq!(s.gpus.free, 7, "one share is left");
    assert_eq!(group(s, "1").capacity["memory"].allocated, 30 * GI);
    c.delete_claim(&key("b"));
    assert_eq!(c.node("node-a"), Some(&fresh), "everything is back");
}

#[test]
fn gpus_allocated_whole_or_tainted_take_no_share() {
    let mut c = Cluster::new(DRIVER);
    for s in time_sliced("node-a", &["gpu-5"]) {
        c.apply_slice(&s);
    }
    c.apply_claim(&claim("whole", "node-a", &[3]));
    let s = c.node("node-a").unwrap();
    let zero = group(s, "0");
    assert_eq!((zero.usable, zero.whole_allocated), (3, 1));
    assert_eq!(zero.capacity["memory"].free, 3 * H100);
    assert_eq!(zero.capacity["memory"].total, 4 * H100);
    // The plugin taints a GPU's shared device with the GPU.
    let one = group(s, "1");
    assert_eq!((one.usable, one.unhealthy), (3, 1));
    assert_eq!(
        one.usable + one.unhealthy + one.whole_allocated + one.blocked,
        one.gpus
    );
}

#[test]
fn the_time_sliced_class_asks_for_shares_with_their_memory() {
    assert_eq!(
        classify("time-sliced.topodra.dev"),
        Some(ClassKind::Shared {
            sharing: Some("TimeSlicing".to_owned())
        })
    );
    let (kind, understood) = ClassKind::of_selectors(
        [r#"device.attributes["gpu.topodra.dev"].type == 'shared'"#],
        DRIVER,
    );
    assert_eq!(
        (kind, understood),
        (ClassKind::Shared { sharing: None }, true)
    );

    let d = share_demand(Some("20Gi"), 1, true);
    assert_eq!((d.count, d.unjudged.len()), (0, 0));
    assert_eq!(
        d.shares,
        [ShareWant {
            sharing: Some("TimeSlicing".to_owned()),
            count: 1,
            capacity: BTreeMap::from([("memory".to_owned(), 20 * GI)]),
        }]
    );
    assert_eq!(
        d.describe(),
        "1 time-sliced share (20Gi memory) on one NUMA node"
    );
    assert_eq!(
        share_demand(None, 2, false).describe(),
        "2 time-sliced shares (of the default size)"
    );
    let mut spec = aligned_spec(1, None);
    if let Some(e) = spec
        .devices
        .as_mut()
        .and_then(|d| d.requests.as_mut())
        .and_then(|r| r.first_mut())
        .and_then(|r| r.exactly.as_mut())
    {
        e.device_class_name = "time-sliced.topodra.dev".to_owned();
        e.capacity = Some(CapacityRequirements {
            requests: Some(BTreeMap::from([
                (
                    "gpu.topodra.dev/memory".to_owned(),
                    Quantity("8Gi".to_owned()),
                ),
                (
                    "gpu.topodra.dev/compute".to_owned(),
                    Quantity("lots".to_owned()),
                ),
            ])),
        });
    }
    let d = Demand::of_claim_classified(&spec, DRIVER, &[], classify).unwrap();
    assert_eq!(
        d.shares[0].capacity,
        BTreeMap::from([("memory".to_owned(), 8 * GI)])
    );
    assert_eq!(
        d.unjudged,
        ["capacity gpu.topodra.dev/compute of request gpus (lots)"]
    );
}

#[test]
fn a_share_that_fits_names_where() {
    let mut c = shared_cluster("node-a");
    for s in time_sliced("node-b", &[]) {
        c.apply_slice(&s);
    }
    c.apply_claim(&share_of("a", "node-b", "gpu-7-ts", Some("70Gi")));
    let e = explain(&c, &share_demand(Some("20Gi"), 1, true));
    assert_eq!(e.fits.len(), 4);
    // Three 20Gi shares fit in each GPU's 81559Mi; gpu-7 of node-b has 9879Mi left.
    assert_eq!(
        e.fits.iter().map(|f| f.free).collect::<Vec<_>>(),
        [12, 12, 12, 9]
    );
    assert_eq!(
        e.fits[3].largest_free,
        Some(BTreeMap::from([("memory".to_owned(), H100)]))
    );
    assert_eq!(
        e.message,
        "needs 1 time-sliced share (20Gi memory) on one NUMA node; fits now on 4 NUMA \
         nodes (node-a, NUMA 0: room for 12; node-a, NUMA 1: room for 12; node-b, NUMA 0: \
         room for 12; and 1 more): the scheduler has not retried yet, or something else \
         keeps the pod off them (node selector or affinity, node taints, device selectors, \
         its other claims)"
    );
}

#[test]
fn a_share_larger_than_any_gpu_has_left_names_the_most_on_one() {
    let mut c = shared_cluster("node-a");
    c.apply_claim(&claim("whole", "node-a", &[0, 1]));
    for g in 2..8 {
        c.apply_claim(&share_of(
            &format!("s{g}"),
            "node-a",
            &format!("gpu-{g}-ts"),
            Some("40Gi"),
        ));
    }
    let e = explain(&c, &share_demand(Some("50Gi"), 1, false));
    assert!(e.fits.is_empty());
    assert_eq!(
        e.message,
        "needs 1 time-sliced share (50Gi memory); no time-sliced GPU has 50Gi memory free: \
         the most memory free on one is 40599Mi (node-a, NUMA 0); of the 8 time-sliced \
         GPUs, 6 hold 6 shares and 2 are allocated whole"
    );
    let best = e.best.unwrap();
    assert_eq!((best.node.as_str(), best.free), ("node-a", 0));
    assert_eq!(
        best.largest_free,
        Some(BTreeMap::from([("memory".to_owned(), 40599 * MI)]))
    );
    // 39Gi still fits beside each 40Gi share.
    assert_eq!(
        explain(&c, &share_demand(Some("39Gi"), 1, false)).fits[0].free,
        6
    );
}

#[test]
fn two_shares_on_one_numa_node_judge_each_numa_node() {
    let mut c = shared_cluster("node-a");
    c.apply_claim(&claim("whole", "node-a", &[0, 1, 2, 4, 5, 6]));
    for g in [3, 7] {
        c.apply_claim(&share_of(
            &format!("s{g}"),
            "node-a",
            &format!("gpu-{g}-ts"),
            Some("40Gi"),
        ));
    }
    // gpu-3 (NUMA 0) and gpu-7 (NUMA 1) have room for one 30Gi share each.
    let e = explain(&c, &share_demand(Some("30Gi"), 2, true));
    assert!(e.fits.is_empty());
    assert_eq!(e.nodes_with_enough_free, 1);
    assert_eq!(
        e.message,
        "needs 2 time-sliced shares (30Gi memory each) on one NUMA node; 1 node can take \
         them, none on one NUMA node; no NUMA node has room for 2 such shares; most: 1 \
         (node-a, NUMA 0); of the 8 time-sliced GPUs, 2 hold 2 shares and 6 are allocated \
         whole"
    );
    let anywhere = explain(&c, &share_demand(Some("30Gi"), 2, false));
    assert!(
        anywhere.message.starts_with(
            "needs 2 time-sliced shares (30Gi memory each); fits now on 1 node (node-a: room for 2)"
        ),
        "{}",
        anywhere.message
    );
    let mut socket = share_demand(Some("30Gi"), 1, false);
    socket.level = Some(Level::Socket);
    assert!(
        explain(&c, &socket)
            .message
            .ends_with(" (not checked: shares on one socket; judged per node)")
    );
}

#[test]
fn a_share_without_a_memory_request_takes_the_slices_default() {
    let mut c = shared_cluster("node-a");
    // 61Gi of each GPU's 81559Mi shared out: 19095Mi left, less than the default
    // share (81559Mi / 4 replicas, rounded down to 19Gi).
    for g in 0..8 {
        c.apply_claim(&share_of(
            &format!("s{g}"),
            "node-a",
            &format!("gpu-{g}-ts"),
            Some("61Gi"),
        ));
    }
    let default = share_demand(None, 1, false);
    let e = explain(&c, &default);
    assert!(e.fits.is_empty());
    assert_eq!(
        e.message,
        "needs 1 time-sliced share (of the default size); no time-sliced GPU has room for a \
         share of the default size: the most memory free on one is 19095Mi (node-a, NUMA 0); \
         of the 8 time-sliced GPUs, 8 hold 8 shares"
    );
    assert_eq!(
        explain(&c, &share_demand(Some("18Gi"), 1, false)).fits[0].free,
        8
    );
    c.delete_claim(&key("s5"));
    let e = explain(&c, &default);
    assert_eq!(
        e.fits.iter().map(|f| f.free).collect::<Vec<_>>(),
        [4],
        "gpu-5 takes four 19Gi shares"
    );
}

#[test]
fn a_request_between_steps_takes_the_next_whole_gib() {
    let mut c = shared_cluster("node-a");
    c.apply_claim(&claim("whole", "node-a", &[0, 1, 2, 3, 4, 5, 6]));
    // 81559Mi holds three 26Gi shares (79872Mi) but two 27Gi ones: 26.5Gi is
    // charged as 27Gi, as the request policy's 1Gi step rounds it.
    let e = explain(&c, &share_demand(Some("26.5Gi"), 1, false));
    assert_eq!(e.fits[0].free, 2);
    let e = explain(&c, &share_demand(Some("26Gi"), 1, false));
    assert_eq!(e.fits[0].free, 3);
    // Below the 1Gi minimum: charged 1Gi.
    let e = explain(&c, &share_demand(Some("1Mi"), 1, false));
    assert_eq!(e.fits[0].free, 79);
}

/// The time-sliced slices turned into MPS-like ones: `sharing: MPS` and a `compute`
/// capacity of 100 (whole percent, 25 by default) beside the memory. Nothing in the
/// model names a mode or a capacity, so they are counted and explained alike.
fn mps_cluster(node: &str) -> Cluster {
    let mut c = Cluster::new(DRIVER);
    for mut s in time_sliced(node, &[]) {
        for d in s.spec.devices.iter_mut().flatten() {
            let Some(gpu) = d.name.strip_suffix("-ts") else {
                continue;
            };
            d.name = format!("{gpu}-mps");
            if let Some(a) = d.attributes.as_mut() {
                a.insert("sharing".to_owned(), crate::slice::fixtures::string("MPS"));
            }
            let compute: DeviceCapacity = serde_json::from_value(serde_json::json!({
                "value": "100",
                "requestPolicy": {"default": "25", "validRange": {"min": "1", "step": "1"}},
            }))
            .unwrap();
            d.capacity
                .get_or_insert_with(BTreeMap::new)
                .insert("compute".to_owned(), compute);
        }
        c.apply_slice(&s);
    }
    c
}

#[test]
fn compute_is_counted_and_explained_where_devices_publish_it() {
    let mut c = mps_cluster("node-a");
    c.apply_claim(&claim("whole", "node-a", &[0, 1, 2, 3, 4, 5, 6]));
    let mut held = share_of("a", "node-a", "gpu-7-mps", Some("10Gi"));
    if let Some(r) = held
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
    {
        r[0].consumed_capacity
            .get_or_insert_with(BTreeMap::new)
            .insert("compute".to_owned(), Quantity("60".to_owned()));
    }
    c.apply_claim(&held);
    let s = c.node("node-a").unwrap();
    let g = s
        .shared_groups(Some("MPS"))
        .find(|g| g.numa_node.as_deref() == Some("1"))
        .unwrap();
    assert_eq!(
        g.capacity["compute"],
        CapacityFigures {
            total: 400,
            allocated: 60,
            free: 40,
            largest_free: 40,
        }
    );
    let want = ShareWant {
        sharing: Some("MPS".to_owned()),
        count: 1,
        capacity: BTreeMap::from([("memory".to_owned(), 10 * GI), ("compute".to_owned(), 50)]),
    };
    let mut d = share_demand(None, 1, false);
    d.shares = vec![want.clone()];
    assert_eq!(
        explain(&c, &d).message,
        "needs 1 MPS share (10Gi memory, 50 compute); no MPS GPU has 10Gi memory and 50 \
         compute free: the most compute free on one is 40 (node-a, NUMA 1); of the 8 MPS \
         GPUs, 1 holds 1 share and 7 are allocated whole"
    );
    d.shares[0].capacity.insert("compute".to_owned(), 40);
    assert_eq!(explain(&c, &d).fits[0].free, 1);
    // Without a compute request a share takes the default 25: one fits in 40.
    d.shares[0].capacity.remove("compute");
    assert_eq!(explain(&c, &d).fits[0].free, 1);
    // A time-sliced share finds no time-sliced GPU there.
    assert!(
        explain(&c, &share_demand(Some("1Gi"), 1, false))
            .message
            .contains("; no node offers time-sliced GPUs")
    );
}

#[test]
fn the_figures_do_not_depend_on_the_order_objects_arrive() {
    let claims = [
        claim("whole", "node-a", &[1]),
        share_of("a", "node-a", "gpu-7-ts", Some("20Gi")),
        share_of("b", "node-a", "gpu-7-ts", Some("30Gi")),
        share_of("c", "node-a", "gpu-2-ts", Some("8Gi")),
    ];
    let mut slices_first = shared_cluster("node-a");
    for c in &claims {
        slices_first.apply_claim(c);
    }
    let mut claims_first = Cluster::new(DRIVER);
    for c in claims.iter().rev() {
        claims_first.apply_claim(c);
    }
    for s in time_sliced("node-a", &[]) {
        claims_first.apply_slice(&s);
    }
    assert_eq!(slices_first.node("node-a"), claims_first.node("node-a"));

    // A share whose consumption changes (a rewritten allocation) moves the figures.
    let mut bigger = claims[3].clone();
    if let Some(r) = bigger
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
    {
        r[0].consumed_capacity = Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("10Gi".to_owned()),
        )]));
    }
    assert_eq!(
        slices_first.apply_claim(&bigger),
        std::collections::BTreeSet::from(["node-a".to_owned()])
    );
    let zero = group(slices_first.node("node-a").unwrap(), "0");
    assert_eq!(zero.capacity["memory"].allocated, 10 * GI);
    assert!(slices_first.apply_claim(&bigger).is_empty(), "unchanged");
}
