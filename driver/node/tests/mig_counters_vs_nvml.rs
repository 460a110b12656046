//! The two models of a MIG GPU held together: the counters the slices publish
//! (what the scheduler admits; `tests/e2e/partitions_test.go` holds them to the
//! real 1.37.2 allocator) and the placement rules of the fake NVML (what NVML
//! creates; cited from the MIG User Guide in `tests/fake-nvml`).
//!
//! 1,200 random claims and releases on a simulated DGX H100: after each, the
//! partition is created in the fake NVML if and only if its counters fit beside the
//! partitions held. A set the scheduler would admit that NVML refuses would fail a
//! prepare; one NVML allows that the counters refuse would waste a GPU.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::resource::v1::Device;
use nvml_wrapper::Nvml;
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};
use topodra_fake_nvml::{cdylib_path, sim};
use topodra_model::checkpoint::MigIntent;
use topodra_model::slice::{DynamicMig, SliceOptions, build_slices, dynamic_devices};
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_node::dynamic_mig::Carver;

/// A counter's value as a whole number: the H100's counters are slices and
/// engines, plain counts.
fn count(q: &str) -> u64 {
    q.parse()
        .unwrap_or_else(|_| panic!("counter value {q:?} is not a plain count"))
}

/// A fixed sequence for every run: proptest's deterministic generator.
fn below(rng: &mut TestRng, n: usize) -> usize {
    usize::try_from(rng.next_u64() % n as u64).unwrap()
}

#[test]
fn counters_admit_exactly_what_nvml_creates() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join("dgx-h100-mig.yaml"))
        .unwrap();
    let node = sim::materialize(dir.path(), &yaml, &cdylib_path()).unwrap();
    let mut config = DiscoveryConfig::default();
    config.nvml_lib = Some(node.nvml_lib.clone());
    config.nvml = NvmlPolicy::Required;
    config.topology = TopologyInput::HwlocXml(node.hwloc_xml.clone());
    config.sysfs_root = PathBuf::from("/nonexistent");
    let inventory = discovery::discover(&config).unwrap();

    let mut opts = SliceOptions::new("node-a");
    opts.dynamic_mig = DynamicMig::All;
    let slices = build_slices(&inventory, &opts).unwrap();
    let capacity: BTreeMap<(String, String), u64> = slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .flat_map(|set| {
            set.counters
                .iter()
                .map(|(k, c)| ((set.name.clone(), k.clone()), count(&c.value.0)))
        })
        .collect();
    let devices: BTreeMap<String, Device> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| d.consumes_counters.is_some())
        .map(|d| (d.name.clone(), d.clone()))
        .collect();
    let dynamic = dynamic_devices(&inventory, &opts);
    assert_eq!(dynamic.len(), devices.len());
    let uses = |name: &str| -> BTreeMap<(String, String), u64> {
        devices[name]
            .consumes_counters
            .iter()
            .flatten()
            .flat_map(|c| {
                c.counters
                    .iter()
                    .map(|(k, v)| ((c.counter_set.clone(), k.clone()), count(&v.value.0)))
            })
            .collect()
    };

    let nvml = Nvml::builder()
        .lib_path(node.nvml_lib.as_os_str())
        .init()
        .unwrap();
    let carver = Carver::new(nvml);
    let intent = |i: usize| MigIntent {
        parent_uuid: dynamic[i].gpu.uuid.clone().unwrap(),
        profile_id: dynamic[i].profile.id,
        start: dynamic[i].placement.start,
        size: dynamic[i].placement.size,
    };

    let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut held: Vec<usize> = Vec::new();
    let (mut admitted, mut refused) = (0, 0);
    for step in 0..1200 {
        if !held.is_empty() && below(&mut rng, 3) == 0 {
            let i = held.swap_remove(below(&mut rng, held.len()));
            assert!(carver.destroy(&intent(i)).unwrap(), "step {step}");
            continue;
        }
        let i = below(&mut rng, dynamic.len());
        let mut used: BTreeMap<(String, String), u64> = BTreeMap::new();
        for h in held.iter().chain([&i]) {
            for (k, v) in uses(&dynamic[*h].name) {
                *used.entry(k).or_default() += v;
            }
        }
        let fits = used.iter().all(|(k, v)| *v <= capacity[k]);
        let made = carver
            .create_gpu_instance(&intent(i), false)
            .and_then(|_| carver.create_compute_instance(&intent(i)));
        let held_names: Vec<&str> = held.iter().map(|h| dynamic[*h].name.as_str()).collect();
        match (fits, &made) {
            (true, Ok(_)) => {
                admitted += 1;
                held.push(i);
            }
            (false, Err(e)) if e.is_conflict() => refused += 1,
            _ => panic!(
                "step {step}: {} beside {held_names:?}: counters fit {fits}, NVML {made:?}",
                dynamic[i].name
            ),
        }
    }
    // Both answers must have come up often for the test to mean anything.
    assert!(
        admitted > 300 && refused > 300,
        "{admitted} admitted, {refused} refused"
    );
}
