//! Regression fixtures from real GPU machines (`tests/fake-nvml/real/<machine>/`):
//! what the release `topodra-kubelet-plugin discover` printed there, against what
//! discovery gives here from the same machine's hwloc export (`lstopo.xml`, taken
//! on it) with the fake NVML answering as that machine's NVML did (`nvml.yaml`,
//! written from its `nvidia-smi -q -x`). Each machine's README says how the files
//! were taken. A difference is a change of behaviour on real hardware (or a fake
//! NVML answer that drifted from the real one), so it fails.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use serde_json::Value;
use topodra_fake_nvml::install;
use topodra_model::slice::{self, SliceOptions};
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};

fn real_dir(machine: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fake-nvml/real")
        .join(machine)
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The inventory and the slices (int `numaNode`, default driver name, every
/// attribute) discovery gives for the machine, as JSON. The recordings predate the
/// lean attribute set, so the full set is what reproduces them.
fn discover(machine: &str, node_name: &str) -> (Value, Value) {
    let dir = real_dir(machine);
    let nvml = std::fs::read_to_string(dir.join("nvml.yaml")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let lib = install(tmp.path(), &nvml);
    let mut config = DiscoveryConfig::default();
    config.nvml_lib = Some(lib);
    config.nvml = NvmlPolicy::Required;
    config.topology = TopologyInput::HwlocXml(dir.join("lstopo.xml"));
    config.sysfs_root = PathBuf::from("/nonexistent");
    let inventory = discovery::discover(&config).unwrap();
    let mut opts = SliceOptions::new(node_name.to_owned());
    opts.attributes = slice::AttributeSet::Full;
    let slices = slice::build_slices(&inventory, &opts).unwrap();
    (
        serde_json::to_value(&inventory).unwrap(),
        serde_json::to_value(slice::to_list(&slices)).unwrap(),
    )
}

/// An H200 passed through to a one-node KVM guest: no NUMA proximity from the
/// firmware (sysfs `numa_node` -1), the GPU on the guest's root bus, no NVLink.
#[test]
fn h200_vm_discovers_as_on_the_machine() {
    let dir = real_dir("h200-vm");
    let (inventory, mut slices) = discover("h200-vm", "h200-probe");
    // The NUMA-nodes annotation came after the recording: it is checked against the
    // machine's NUMA node here, and left out of the comparison with what the release
    // binary published there.
    for item in slices["items"].as_array_mut().unwrap() {
        let meta = item["metadata"].as_object_mut().unwrap();
        let annotations = meta.remove("annotations").unwrap();
        assert_eq!(
            annotations,
            serde_json::json!({ slice::NUMA_NODES_ANNOTATION: "0" })
        );
    }
    assert_eq!(
        inventory,
        read_json(&dir.join("inventory.json")),
        "inventory differs from the real machine's"
    );
    assert_eq!(
        slices,
        read_json(&dir.join("slices.json")),
        "slices differ from the real machine's"
    );
}
