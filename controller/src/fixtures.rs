//! Objects for the tests of the NodeResourceTopology builder and of the controller's
//! state.

use crate::nrt::NrtOptions;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};
use topodra_model::slice::attributes::NUMA_NODE;

/// What the controller writes by default.
pub(crate) fn nrt_options() -> NrtOptions {
    NrtOptions {
        resource_name: "nvidia.com/gpu".into(),
        policy: "single-numa-node".into(),
        scope: "pod".into(),
    }
}

/// A DGX-like node's slice: `gpu-0` to `gpu-7`, four on each of NUMA nodes 0 and 1.
pub(crate) fn gpu_slice(node: &str) -> ResourceSlice {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"}, NUMA_NODE: {"int": i / 4}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu")},
        "spec": {"driver": "gpu.topodra.dev", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap()
}
