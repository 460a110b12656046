//! Whatever slices and claims the API server hands the controller, the capacity model
//! (our GPUs and the CPU driver's CPUs) must not panic: any writer of a ResourceSlice
//! or a ResourceClaim chooses these values, up to 2^64-1 for a capacity. The input is
//! a JSON array of objects, each a ResourceSlice (it has `spec.driver`) or a
//! ResourceClaim (anything else that decodes as one).
#![no_main]

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use libfuzzer_sys::fuzz_target;
use topodra_model::capacity::{Cluster, CpuPools, Level};

fuzz_target!(|bytes: &[u8]| {
    let Ok(objects) = serde_json::from_slice::<Vec<serde_json::Value>>(bytes) else {
        return;
    };
    let mut gpus = Cluster::new("gpu.topodra.dev");
    let mut cpus = CpuPools::new(
        "dra.cpu",
        vec![
            "resource.kubernetes.io/numaNode".to_owned(),
            "dra.net/numaNode".to_owned(),
        ],
    );
    let mut nodes = Vec::new();
    for object in objects {
        if object.pointer("/spec/driver").is_some() {
            if let Ok(slice) = serde_json::from_value::<ResourceSlice>(object) {
                nodes.extend(gpus.apply_slice(&slice));
                nodes.extend(cpus.apply_slice(&slice));
            }
        } else if let Ok(claim) = serde_json::from_value::<ResourceClaim>(object) {
            nodes.extend(gpus.apply_claim(&claim));
            nodes.extend(cpus.apply_claim(&claim));
        }
    }
    for node in &nodes {
        for counts in cpus.numa(node).values() {
            assert!(counts.free() <= counts.total);
        }
    }
    let totals = gpus.totals();
    assert!(totals.allocated <= totals.total);
    for level in [Level::NumaNode, Level::Socket, Level::PcieRoot] {
        let _ = gpus.stranded(level);
    }
});
