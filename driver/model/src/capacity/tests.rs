//! The model against slices built by our own slice builder, claims as the scheduler
//! writes them, and taints as the plugin and DeviceTaintRules set them.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceConstraint, DeviceRequest,
    DeviceRequestAllocationResult, DeviceSubRequest, DeviceTaint, DeviceTaintRule,
    DeviceTaintRuleSpec, DeviceTaintSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

use super::*;
use crate::slice::fixtures::{dgx_h100, snc};
use crate::slice::{DEFAULT_DRIVER_NAME as DRIVER, SliceOptions, build_slices};

fn slices(node: &str, per_slice: Option<usize>, generation: i64) -> Vec<ResourceSlice> {
    let mut opts = SliceOptions::new(node);
    opts.max_devices_per_slice = per_slice;
    opts.pool_generation = generation;
    build_slices(&dgx_h100(), &opts).unwrap()
}

fn cluster(nodes: &[&str]) -> Cluster {
    let mut c = Cluster::new(DRIVER);
    for n in nodes {
        for s in slices(n, None, 1) {
            c.apply_slice(&s);
        }
    }
    c
}

fn claim(name: &str, node: &str, gpus: &[u32]) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        gpus.iter()
                            .map(|g| DeviceRequestAllocationResult {
                                driver: DRIVER.to_owned(),
                                pool: node.to_owned(),
                                device: format!("gpu-{g}"),
                                request: "gpus".to_owned(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn aligned_spec(count: i64, attribute: Option<&str>) -> ResourceClaimSpec {
    ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![DeviceRequest {
                name: "gpus".to_owned(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: DRIVER.to_owned(),
                    count: Some(count),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            constraints: attribute.map(|a| {
                vec![DeviceConstraint {
                    match_attribute: Some(a.to_owned()),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
    }
}

fn demand(count: i64, attribute: Option<&str>) -> Demand {
    Demand::of_claim(&aligned_spec(count, attribute), DRIVER, |c| c == DRIVER).unwrap()
}

const NUMA: &str = "resource.kubernetes.io/numaNode";

#[test]
fn a_dgx_h100_has_two_numa_nodes_of_four() {
    let c = cluster(&["node-a"]);
    let s = c.node("node-a").unwrap();
    assert_eq!(
        s.gpus,
        Counts {
            total: 8,
            allocated: 0,
            unhealthy: 0,
            blocked: 0,
            shared: 0,
            free: 8
        }
    );
    let numa: Vec<(&str, u32)> = s
        .groups(Level::NumaNode)
        .iter()
        .map(|g| (g.key.as_str(), g.counts.free))
        .collect();
    assert_eq!(numa, [("0", 4), ("1", 4)]);
    assert_eq!(s.groups(Level::PcieSwitch).len(), 8);
    assert_eq!(s.groups(Level::NvlinkDomain).len(), 1);
    assert_eq!(s.largest_free(Some(Level::NumaNode)), 4);
    assert!(s.fits(8, Some(Level::NvlinkDomain)));
    assert!(!s.fits(5, Some(Level::NumaNode)));
}

#[test]
fn allocations_move_gpus_from_free_to_allocated() {
    let mut c = cluster(&["node-a"]);
    let touched = c.apply_claim(&claim("one", "node-a", &[0, 1, 2, 3]));
    assert_eq!(touched.into_iter().collect::<Vec<_>>(), ["node-a"]);
    let s = c.node("node-a").unwrap();
    assert_eq!(s.gpus.allocated, 4);
    assert_eq!(s.largest_aligned(Level::NumaNode).unwrap().key, "1");

    c.apply_claim(&claim("two", "node-a", &[4]));
    let s = c.node("node-a").unwrap();
    assert_eq!(s.largest_free(Some(Level::NumaNode)), 3);
    // Three free GPUs, all on NUMA 1: a pair fits there, a set of four nowhere.
    assert_eq!(s.stranded(2, Level::NumaNode), 0);
    assert_eq!(s.stranded(4, Level::NumaNode), 3);
    assert_eq!(
        c.stranded(Level::NumaNode),
        BTreeMap::from([(2, 0), (4, 3), (8, 3)])
    );

    // The same claim again changes nothing and touches no node.
    assert!(c.apply_claim(&claim("two", "node-a", &[4])).is_empty());
    c.delete_claim(&ClaimKey {
        namespace: "default".into(),
        name: "one".into(),
    });
    assert_eq!(c.node("node-a").unwrap().gpus.free, 7);
}

#[test]
fn claims_of_other_drivers_are_ignored() {
    let mut c = cluster(&["node-a"]);
    let mut other = claim("nic", "node-a", &[0]);
    for r in crate::slice::fixtures::allocation_results_mut(&mut other) {
        r.driver = "nic.example.com".to_owned();
    }
    assert!(c.apply_claim(&other).is_empty());
    assert_eq!(c.node("node-a").unwrap().gpus.free, 8);
}

#[test]
fn an_incomplete_pool_keeps_its_last_complete_devices() {
    let mut c = Cluster::new(DRIVER);
    let gen1 = slices("node-a", Some(4), 1);
    assert_eq!(gen1.len(), 2);
    assert!(
        c.apply_slice(&gen1[0]).is_empty(),
        "half a pool is not shown"
    );
    assert!(c.node("node-a").is_none());
    c.apply_slice(&gen1[1]);
    assert_eq!(c.node("node-a").unwrap().gpus.total, 8);

    // Generation 2 taints gpu-0; until both of its slices are there, generation 1 holds.
    let mut opts = SliceOptions::new("node-a");
    opts.max_devices_per_slice = Some(4);
    opts.pool_generation = 2;
    opts.device_taints
        .insert("gpu-0".to_owned(), vec![taint("NoSchedule")]);
    let gen2 = build_slices(&dgx_h100(), &opts).unwrap();
    c.apply_slice(&gen2[0]);
    assert_eq!(c.node("node-a").unwrap().gpus.unhealthy, 0);
    c.apply_slice(&gen2[1]);
    assert_eq!(c.node("node-a").unwrap().gpus.unhealthy, 1);

    for s in &gen2 {
        c.delete_slice(s.metadata.name.as_deref().unwrap());
    }
    assert!(
        c.node("node-a").is_none(),
        "a node whose slices are gone is gone"
    );
}

fn taint(effect: &str) -> DeviceTaint {
    DeviceTaint {
        key: "gpu.topodra.dev/unhealthy".to_owned(),
        effect: effect.to_owned(),
        ..Default::default()
    }
}

fn rule(name: &str, pool: Option<&str>, device: Option<&str>, effect: &str) -> DeviceTaintRule {
    DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(DRIVER.to_owned()),
                pool: pool.map(str::to_owned),
                device: device.map(str::to_owned),
            }),
            taint: taint(effect),
        },
        status: None,
    }
}

#[test]
fn taint_rules_make_gpus_unavailable_on_the_nodes_they_select() {
    let mut c = cluster(&["node-a", "node-b"]);
    let touched = c.apply_taint_rule(&rule("drain-a", Some("node-a"), None, "NoSchedule"));
    assert_eq!(touched.into_iter().collect::<Vec<_>>(), ["node-a"]);
    assert_eq!(c.node("node-a").unwrap().gpus.unhealthy, 8);
    assert_eq!(c.node("node-b").unwrap().gpus.free, 8);

    // An informational taint keeps nothing off; changing the rule to it lifts the drain.
    c.apply_taint_rule(&rule("drain-a", Some("node-a"), None, "None"));
    assert_eq!(c.node("node-a").unwrap().gpus.free, 8);

    // Without a pool the rule reaches every node.
    let touched = c.apply_taint_rule(&rule("gpu-3-everywhere", None, Some("gpu-3"), "NoExecute"));
    assert_eq!(touched.len(), 2);
    assert_eq!(c.totals().unhealthy, 2);
    c.delete_taint_rule("gpu-3-everywhere");
    assert_eq!(c.totals().unhealthy, 0);
}

#[test]
fn an_allocated_gpu_that_is_tainted_counts_as_allocated() {
    let mut c = cluster(&["node-a"]);
    c.apply_claim(&claim("busy", "node-a", &[0]));
    c.apply_taint_rule(&rule("gpu-0", Some("node-a"), Some("gpu-0"), "NoSchedule"));
    let s = c.node("node-a").unwrap();
    assert_eq!((s.gpus.allocated, s.gpus.unhealthy, s.gpus.free), (1, 0, 7));
}

#[test]
fn numa_groups_of_a_list_form_slice_are_the_own_nodes() {
    let mut opts = SliceOptions::new("snc");
    opts.numa_node_format = crate::slice::NumaNodeFormat::List;
    let mut c = Cluster::new(DRIVER);
    for s in build_slices(&snc(), &opts).unwrap() {
        c.apply_slice(&s);
    }
    let s = c.node("snc").unwrap();
    assert_eq!(s.groups(Level::NumaNode).len(), 8);
    assert_eq!(s.groups(Level::Socket).len(), 2);
    assert_eq!(s.largest_free(Some(Level::NumaNode)), 1);
    assert_eq!(s.largest_free(Some(Level::Socket)), 4);
}

#[test]
fn demand_reads_count_class_and_constraint() {
    let d = demand(4, Some(NUMA));
    assert_eq!((d.count, d.level), (4, Some(Level::NumaNode)));
    assert_eq!(d.describe(), "4 GPUs on one NUMA node");
    let d = demand(2, Some("gpu.topodra.dev/nvlinkDomain"));
    assert_eq!(d.level, Some(Level::NvlinkDomain));
    assert_eq!(demand(1, None).describe(), "1 GPU");
    // A constraint on an attribute that is not a topology level aligns nothing here.
    assert_eq!(demand(2, Some("gpu.topodra.dev/productName")).level, None);
    // Another driver's class: not our claim.
    assert!(Demand::of_claim(&aligned_spec(2, None), DRIVER, |c| c == "nic.example.com").is_none());
}

#[test]
fn demand_of_first_available_is_its_smallest_alternative() {
    let sub = |name: &str, count| DeviceSubRequest {
        name: name.to_owned(),
        device_class_name: DRIVER.to_owned(),
        count: Some(count),
        ..Default::default()
    };
    let mut spec = aligned_spec(0, Some(NUMA));
    let req = &mut spec.devices.as_mut().unwrap().requests.as_mut().unwrap()[0];
    req.exactly = None;
    req.first_available = Some(vec![sub("eight", 8), sub("four", 4)]);
    let d = Demand::of_claim(&spec, DRIVER, |c| c == DRIVER).unwrap();
    assert_eq!((d.count, d.level), (4, Some(Level::NumaNode)));
}

#[test]
fn demand_lists_what_it_cannot_judge() {
    let mut spec = aligned_spec(2, None);
    let e = spec.devices.as_mut().unwrap().requests.as_mut().unwrap()[0]
        .exactly
        .as_mut()
        .unwrap();
    e.selectors = Some(vec![Default::default()]);
    let d = Demand::of_claim(&spec, DRIVER, |c| c == DRIVER).unwrap();
    assert_eq!(d.unjudged, ["selectors of request gpus"]);
    let e = spec.devices.as_mut().unwrap().requests.as_mut().unwrap()[0]
        .exactly
        .as_mut()
        .unwrap();
    e.allocation_mode = Some("All".to_owned());
    let d = Demand::of_claim(&spec, DRIVER, |c| c == DRIVER).unwrap();
    assert_eq!(d.count, 0);
    assert!(d.unjudged[0].contains("all matching devices"));
}

#[test]
fn the_third_four_gpu_claim_on_a_two_by_four_node_is_explained() {
    let mut c = cluster(&["node-a"]);
    c.apply_claim(&claim("one", "node-a", &[0, 1, 2, 3]));
    c.apply_claim(&claim("two", "node-a", &[4, 5, 6, 7]));
    let e = explain(&c, &demand(4, Some(NUMA)));
    assert_eq!(
        e.message,
        "needs 4 GPUs on one NUMA node; no node has 4 free GPUs; no GPU is free"
    );
    assert!(e.fits.is_empty());
}

#[test]
fn free_gpus_on_the_wrong_numa_nodes_are_named() {
    let nodes: Vec<String> = (0..12).map(|i| format!("node-{i:02}")).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut c = cluster(&names);
    // Every node: two GPUs busy on each NUMA node; node-05 has one more free on NUMA 1.
    for n in &nodes {
        let busy: &[u32] = if n == "node-05" {
            &[0, 1, 4]
        } else {
            &[0, 1, 4, 5]
        };
        c.apply_claim(&claim(&format!("{n}-busy"), n, busy));
    }
    let e = explain(&c, &demand(4, Some(NUMA)));
    assert_eq!(
        e.message,
        "needs 4 GPUs on one NUMA node; 12 nodes have 4 free GPUs, none on one NUMA node; \
         largest aligned free set: 3 (node-05, NUMA 1)"
    );
    assert_eq!(e.nodes_with_enough_free, 12);
}

#[test]
fn a_claim_that_fits_says_where() {
    let mut c = cluster(&["node-a", "node-b"]);
    c.apply_claim(&claim("one", "node-a", &[0]));
    c.apply_taint_rule(&rule("b-7", Some("node-b"), Some("gpu-7"), "NoSchedule"));
    let e = explain(&c, &demand(4, Some(NUMA)));
    assert_eq!(e.fits.len(), 2);
    assert_eq!(
        e.fits[0],
        Candidate {
            node: "node-a".into(),
            group: Some("NUMA 1".into()),
            free: 4,
            free_cpus: None,
            largest_free: None,
        }
    );
    assert!(
        e.message.starts_with(
            "needs 4 GPUs on one NUMA node; fits now on 2 nodes (node-a, NUMA 1; node-b, NUMA 0)"
        ),
        "{}",
        e.message
    );
    assert!(
        e.message.ends_with("; 1 GPU unhealthy or tainted"),
        "{}",
        e.message
    );
}

#[test]
fn nodes_fitting_counts_per_level() {
    let mut c = cluster(&["node-a", "node-b"]);
    c.apply_claim(&claim("one", "node-a", &[0, 4]));
    assert_eq!(c.nodes_fitting(4, Some(Level::NumaNode)), 1);
    assert_eq!(c.nodes_fitting(3, Some(Level::NumaNode)), 2);
    assert_eq!(c.nodes_fitting(6, None), 2);
    assert_eq!(c.nodes_fitting(8, Some(Level::NvlinkDomain)), 1);
}

/// One watch event, for the property test.
#[derive(Clone, Debug)]
enum Event {
    Slices {
        node: usize,
        per_slice: Option<usize>,
        generation: i64,
    },
    DeleteSlices {
        node: usize,
    },
    Claim {
        name: usize,
        node: usize,
        gpus: Vec<u32>,
    },
    DeleteClaim {
        name: usize,
    },
    Rule {
        name: usize,
        node: Option<usize>,
        device: Option<u32>,
        effect: &'static str,
    },
    DeleteRule {
        name: usize,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..3usize, prop::option::of(1..9usize), 1..4i64).prop_map(
            |(node, per_slice, generation)| Event::Slices {
                node,
                per_slice,
                generation
            }
        ),
        (0..3usize).prop_map(|node| Event::DeleteSlices { node }),
        (
            0..6usize,
            0..3usize,
            prop::collection::btree_set(0..8u32, 0..5)
        )
            .prop_map(|(name, node, gpus)| Event::Claim {
                name,
                node,
                gpus: gpus.into_iter().collect()
            }),
        (0..6usize).prop_map(|name| Event::DeleteClaim { name }),
        (
            0..3usize,
            prop::option::of(0..3usize),
            prop::option::of(0..8u32),
            prop::sample::select(vec!["NoSchedule", "None"])
        )
            .prop_map(|(name, node, device, effect)| Event::Rule {
                name,
                node,
                device,
                effect
            }),
        (0..3usize).prop_map(|name| Event::DeleteRule { name }),
    ]
}

/// The objects the API server holds after the events: what a fresh LIST would give.
#[derive(Default)]
struct World {
    slices: BTreeMap<String, ResourceSlice>,
    claims: BTreeMap<usize, ResourceClaim>,
    rules: BTreeMap<usize, DeviceTaintRule>,
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

proptest! {
    /// Updating the model one event at a time gives what building it from the final
    /// objects gives, whatever the order, and every node's counts add up.
    #[test]
    fn incremental_updates_match_a_rebuild(events in prop::collection::vec(event(), 1..40)) {
        let mut live = Cluster::new(DRIVER);
        let mut world = World::default();
        for e in events {
            match e {
                Event::Slices { node, per_slice, generation } => {
                    let name = node_name(node);
                    for old in world.slices.keys().filter(|k| k.starts_with(&name)).cloned().collect::<Vec<_>>() {
                        world.slices.remove(&old);
                        live.delete_slice(&old);
                    }
                    for s in slices(&name, per_slice, generation) {
                        live.apply_slice(&s);
                        world.slices.insert(s.metadata.name.clone().unwrap(), s);
                    }
                }
                Event::DeleteSlices { node } => {
                    let name = node_name(node);
                    for old in world.slices.keys().filter(|k| k.starts_with(&name)).cloned().collect::<Vec<_>>() {
                        world.slices.remove(&old);
                        live.delete_slice(&old);
                    }
                }
                Event::Claim { name, node, gpus } => {
                    let c = claim(&format!("c{name}"), &node_name(node), &gpus);
                    live.apply_claim(&c);
                    world.claims.insert(name, c);
                }
                Event::DeleteClaim { name } => {
                    live.delete_claim(&ClaimKey { namespace: "default".into(), name: format!("c{name}") });
                    world.claims.remove(&name);
                }
                Event::Rule { name, node, device, effect } => {
                    let pool = node.map(node_name);
                    let dev = device.map(|d| format!("gpu-{d}"));
                    let r = rule(&format!("r{name}"), pool.as_deref(), dev.as_deref(), effect);
                    live.apply_taint_rule(&r);
                    world.rules.insert(name, r);
                }
                Event::DeleteRule { name } => {
                    live.delete_taint_rule(&format!("r{name}"));
                    world.rules.remove(&name);
                }
            }
        }
        // Rebuild in another order: claims and rules first, slices last.
        let mut fresh = Cluster::new(DRIVER);
        for r in world.rules.values() {
            fresh.apply_taint_rule(r);
        }
        for c in world.claims.values().rev() {
            fresh.apply_claim(c);
        }
        for s in world.slices.values().rev() {
            fresh.apply_slice(s);
        }
        let live_nodes: Vec<&NodeSummary> = live.nodes().collect();
        let fresh_nodes: Vec<&NodeSummary> = fresh.nodes().collect();
        prop_assert_eq!(live_nodes, fresh_nodes);
        for s in live.nodes() {
            let g = s.gpus;
            prop_assert_eq!(g.total, g.allocated + g.unhealthy + g.free);
            for level in Level::ALL {
                let sum: u32 = s.groups(level).iter().map(|g| g.counts.total).sum();
                prop_assert!(sum <= g.total);
            }
        }
    }
}

mod malformed;
mod mig;
mod mixed;
mod sharing;
