//! The NodeResourceTopology objects planned from slices that no plugin of ours
//! publishes: hostile values, a pool split across nodes, a device named twice.

use std::collections::BTreeMap;

use serde_json::json;
use topodra_model::capacity::Finding;
use topodra_model::slice::attributes::NUMA_NODE;

use super::*;
use crate::fixtures::{gpu_slice, nrt_options};

/// A synced state with Nodes `node-a` and `node-b` and the given slices, and what
/// the events found on the way.
fn with_slices(slices: Vec<ResourceSlice>) -> (State, Vec<Finding>) {
    let mut s = State::new("gpu.topodra.dev", vec![]);
    let mut inputs = vec![Input::Slice(Event::Init)];
    inputs.extend(
        slices
            .into_iter()
            .map(|x| Input::Slice(Event::InitApply(x))),
    );
    inputs.push(Input::Slice(Event::InitDone));
    inputs.push(Input::Node(Event::Init));
    for name in ["node-a", "node-b"] {
        let meta = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "uid": format!("uid-{name}")}});
        inputs.push(Input::Node(Event::InitApply(
            serde_json::from_value(meta).unwrap(),
        )));
    }
    inputs.extend([
        Input::Node(Event::InitDone),
        Input::Nrt(Event::Init),
        Input::Nrt(Event::InitDone),
    ]);
    let findings = inputs
        .into_iter()
        .flat_map(|i| s.apply(i).findings)
        .collect();
    (s, findings)
}

/// The planned objects, by node, read back as the server would store them.
fn objects(s: &mut State) -> BTreeMap<String, Value> {
    let mut skipped = 0;
    s.plan_nrt(&nrt_options(), &mut skipped)
        .into_iter()
        .filter_map(|w| match w {
            Write::ApplyNrt { node, object } => Some((node, object)),
            _ => None,
        })
        .collect()
}

fn zone_names(object: &Value) -> Vec<String> {
    object["zones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn hostile_numa_values_make_no_zone() {
    let mut slice = gpu_slice("node-a");
    let hostile = [
        json!({"int": -1}),
        json!({"int": i64::MAX}),
        json!({"version": "0.0.0"}),
        json!({"string": "0\n\u{1b}[31mnode-9"}),
        json!({"string": "../../x"}),
    ];
    for (i, value) in hostile.into_iter().enumerate() {
        let dev = &mut slice.spec.devices.as_mut().unwrap()[i];
        dev.attributes
            .as_mut()
            .unwrap()
            .insert(NUMA_NODE.into(), serde_json::from_value(value).unwrap());
    }
    let (mut s, findings) = with_slices(vec![slice]);
    assert_eq!(findings.len(), 5);
    let objects = objects(&mut s);
    let object = &objects["node-a"];
    // gpu-0..3 were NUMA 0, gpu-4 NUMA 1: what is left are gpu-5..7 on NUMA 1.
    assert_eq!(zone_names(object), ["node-1"]);
    assert_eq!(object["zones"][0]["resources"][0]["capacity"], "3");
}

#[test]
fn a_pool_naming_two_nodes_gives_neither_an_object() {
    let mut a = gpu_slice("node-a");
    a.spec.pool.resource_slice_count = 2;
    a.spec.devices.as_mut().unwrap().truncate(4);
    let mut b = gpu_slice("node-a");
    b.metadata.name = Some("node-a-gpu-2".into());
    b.spec.node_name = Some("node-b".into());
    b.spec.pool.resource_slice_count = 2;
    b.spec.devices.as_mut().unwrap().drain(..4);
    let (mut s, findings) = with_slices(vec![a.clone(), b.clone()]);
    assert!(matches!(
        findings.as_slice(),
        [Finding::PoolSkipped { pool, .. }] if pool == "node-a"
    ));
    assert_eq!(objects(&mut s), BTreeMap::new());

    // The slice that completes the pool changes no node, and still brings the
    // finding (the controller reports findings from every event, not only from
    // those that change the model).
    let mut s = State::new("gpu.topodra.dev", vec![]);
    let first = s.apply(Input::Slice(Event::Apply(a)));
    assert_eq!(first.findings, []);
    let second = s.apply(Input::Slice(Event::Apply(b)));
    assert!(!second.model);
    assert!(matches!(
        second.findings.as_slice(),
        [Finding::PoolSkipped { pool, .. }] if pool == "node-a"
    ));
}

#[test]
fn a_device_named_twice_in_a_pool_gives_no_object() {
    let mut a = gpu_slice("node-a");
    a.spec.pool.resource_slice_count = 2;
    let mut b = gpu_slice("node-a");
    b.metadata.name = Some("node-a-gpu-2".into());
    b.spec.pool.resource_slice_count = 2;
    b.spec.devices.as_mut().unwrap().truncate(1);
    let (mut s, _) = with_slices(vec![gpu_slice("node-a"), gpu_slice("node-b")]);
    assert_eq!(zone_names(&objects(&mut s)["node-a"]), ["node-0", "node-1"]);
    let mut findings = s.apply(Input::Slice(Event::Apply(a))).findings;
    findings.extend(s.apply(Input::Slice(Event::Apply(b))).findings);
    assert!(matches!(
        findings.as_slice(),
        [Finding::PoolSkipped { pool, .. }] if pool == "node-a"
    ));
    // node-a's object goes (nothing is known about its GPUs); node-b is untouched.
    let mut skipped = 0;
    let _ = s.apply(Input::Nrt(Event::Apply(
        serde_json::from_value(json!({
            "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": "node-a"}, "zones": []}))
        .unwrap(),
    )));
    assert_eq!(
        s.plan_nrt(&nrt_options(), &mut skipped),
        [Write::DeleteNrt {
            node: "node-a".into()
        }]
    );
}
