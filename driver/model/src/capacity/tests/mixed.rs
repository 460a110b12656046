//! Claims that couple our GPUs with the CPU driver's CPUs on one NUMA node.

use k8s_openapi::api::resource::v1::CapacityRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::*;

const ALIAS: &str = "dra.net/numaNode";

/// dra-driver-cpu v0.2.0's grouped slice: one device per NUMA node with its CPUs.
fn cpu_slice(node: &str, cpus: &[u64]) -> ResourceSlice {
    super::super::cpus::fixtures::grouped(node, 1, cpus)
}

fn cpu_claim(name: &str, node: &str, numa: u32, cpus: u64) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [{
            "request": "cpus", "driver": "dra.cpu", "pool": node,
            "device": format!("cpudevnuma{numa:03}"),
            "consumedCapacity": {"dra.cpu/cpu": cpus.to_string()}
        }]}}}
    }))
    .unwrap()
}

fn pools() -> CpuPools {
    CpuPools::new("dra.cpu", vec![NUMA.to_owned(), ALIAS.to_owned()])
}

/// 4 GPUs and `cpus` CPUs (class dra.cpu), with one constraint on `attribute` over
/// `over` (all requests when empty).
fn mixed_spec(cpus: &str, attribute: &str, over: &[&str]) -> ResourceClaimSpec {
    let mut spec = aligned_spec(4, Some(attribute));
    let devices = spec.devices.as_mut().unwrap();
    devices.requests.as_mut().unwrap().push(DeviceRequest {
        name: "cpus".to_owned(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: "dra.cpu".to_owned(),
            capacity: Some(CapacityRequirements {
                requests: Some(BTreeMap::from([(
                    "dra.cpu/cpu".to_owned(),
                    Quantity(cpus.to_owned()),
                )])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    if !over.is_empty() {
        devices.constraints.as_mut().unwrap()[0].requests =
            Some(over.iter().map(|s| (*s).to_owned()).collect());
    }
    spec
}

fn mixed_demand(spec: &ResourceClaimSpec, p: &CpuPools) -> Demand {
    let names = [NUMA.to_owned(), ALIAS.to_owned()];
    let mut d =
        Demand::of_claim_with_aliases(spec, DRIVER, &[ALIAS.to_owned()], |c| c == DRIVER).unwrap();
    d.cpus = CpuDemand::of_claim(spec, &d, p, &names, |c| c == "dra.cpu");
    d
}

#[test]
fn one_constraint_over_both_kinds_couples_them() {
    let p = pools();
    let d = mixed_demand(&mixed_spec("32", ALIAS, &[]), &p);
    assert_eq!(
        d.level,
        Some(Level::NumaNode),
        "the alias aligns on the NUMA node"
    );
    assert_eq!(d.cpus.as_ref().map(|c| c.count), Some(32));
    assert_eq!(d.describe(), "4 GPUs and 32 CPUs on one NUMA node");

    let named = mixed_demand(&mixed_spec("32", ALIAS, &["gpus", "cpus"]), &p);
    assert!(named.cpus.is_some());
    // A constraint over the GPUs alone, or on a name that is not the NUMA node,
    // couples nothing.
    assert!(
        mixed_demand(&mixed_spec("32", ALIAS, &["gpus"]), &p)
            .cpus
            .is_none()
    );
    let pcie = mixed_spec("32", "resource.kubernetes.io/pcieRoot", &[]);
    assert!(mixed_demand(&pcie, &p).cpus.is_none());
}

#[test]
fn the_explanation_names_the_gpus_and_cpus_free_on_each_numa_node() {
    // dgx-h100: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1; 56 CPUs on each.
    let mut c = cluster(&["node-a"]);
    let mut p = pools();
    p.apply_slice(&cpu_slice("node-a", &[56, 56]));
    c.apply_claim(&claim("first", "node-a", &[0, 1, 2, 3]));
    p.apply_claim(&cpu_claim("first", "node-a", 0, 32));
    p.apply_claim(&cpu_claim("other", "node-a", 1, 44));

    let d = mixed_demand(&mixed_spec("32", ALIAS, &[]), &p);
    let e = explain_mixed(&c, &p, &d);
    assert!(e.fits.is_empty());
    assert_eq!(
        e.message,
        "needs 4 GPUs and 32 CPUs on one NUMA node; no NUMA node has 4 free GPUs and 32 \
         free CPUs; node-a NUMA 1 has 4 GPUs and 12 CPUs free; node-a NUMA 0 has 0 GPUs \
         and 24 CPUs free"
    );
    let best = e.best.unwrap();
    assert_eq!((best.free, best.free_cpus), (4, Some(12)));

    // The other claim goes: NUMA 1 fits.
    p.delete_claim(&ClaimKey {
        namespace: "default".into(),
        name: "other".into(),
    });
    let e = explain_mixed(&c, &p, &d);
    assert_eq!(e.fits.len(), 1);
    assert!(
        e.message.starts_with(
            "needs 4 GPUs and 32 CPUs on one NUMA node; fits now on 1 NUMA node \
             (node-a NUMA 1 has 4 GPUs and 56 CPUs free)"
        ),
        "{}",
        e.message
    );
}

#[test]
fn without_the_cpu_driver_the_message_says_so() {
    let c = cluster(&["node-a"]);
    let p = pools();
    let d = mixed_demand(&mixed_spec("8", ALIAS, &[]), &p);
    let e = explain_mixed(&c, &p, &d);
    assert!(
        e.message
            .ends_with("; no node publishes CPUs of driver dra.cpu"),
        "{}",
        e.message
    );
    // A demand without CPUs is explained as before.
    let gpus_only = demand(4, Some(NUMA));
    assert_eq!(explain_mixed(&c, &p, &gpus_only), explain(&c, &gpus_only));
}

#[test]
fn a_cpu_request_without_capacity_takes_a_whole_numa_node() {
    let mut c = cluster(&["node-a"]);
    let mut p = pools();
    p.apply_slice(&cpu_slice("node-a", &[56, 56]));
    let mut spec = mixed_spec("1", ALIAS, &[]);
    let cpus = &mut spec.devices.as_mut().unwrap().requests.as_mut().unwrap()[1];
    cpus.exactly.as_mut().unwrap().capacity = None;
    let d = mixed_demand(&spec, &p);
    assert_eq!(d.describe(), "4 GPUs and a whole NUMA node's CPUs");
    assert_eq!(explain_mixed(&c, &p, &d).fits.len(), 2);

    // One CPU taken on NUMA 1, four GPUs on NUMA 0: neither node is whole.
    p.apply_claim(&cpu_claim("one-cpu", "node-a", 1, 1));
    c.apply_claim(&claim("gpus", "node-a", &[0, 1, 2, 3]));
    let e = explain_mixed(&c, &p, &d);
    assert!(e.fits.is_empty());
    assert!(
        e.message.starts_with(
            "needs 4 GPUs and a whole NUMA node's CPUs; no NUMA node has 4 free GPUs and \
             all its CPUs free; node-a NUMA 1 has 4 GPUs and 55 CPUs free"
        ),
        "{}",
        e.message
    );
}
