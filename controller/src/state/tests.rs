//! The state's decisions driven by plain watch events: NodeResourceTopology writes,
//! relists, Events for waiting pods, readiness.

use serde_json::json;
use topodra_model::slice::attributes::NUMA_NODE;

use super::*;
use crate::fixtures::{gpu_slice, nrt_options};

fn node(name: &str) -> PartialObjectMeta<Node> {
    serde_json::from_value(
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": name, "uid": format!("uid-{name}")}}),
    )
    .unwrap()
}

fn claim(name: &str, node: &str, gpus: &[u32], count: u32) -> ResourceClaim {
    let results: Vec<Value> = gpus
        .iter()
        .map(|g| json!({"driver": "gpu.topodra.dev", "pool": node, "device": format!("gpu-{g}"), "request": "gpus"}))
        .collect();
    let mut c = json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.topodra.dev", "count": count}}],
            "constraints": [{"matchAttribute": NUMA_NODE}]}},
    });
    if !gpus.is_empty() {
        c["status"] = json!({"allocation": {"devices": {"results": results}}});
    }
    serde_json::from_value(c).unwrap()
}

fn waiting_pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [], "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    }))
    .unwrap()
}

/// A synced state with one DGX-like node, its Node and the class.
fn synced() -> State {
    let mut s = State::new("gpu.topodra.dev", vec!["gpu.topodra.dev".into()]);
    for input in [
        Input::Slice(Event::Init),
        Input::Slice(Event::InitApply(gpu_slice("node-a"))),
        Input::Slice(Event::InitDone),
        Input::Node(Event::Init),
        Input::Node(Event::InitApply(node("node-a"))),
        Input::Node(Event::InitDone),
        Input::Nrt(Event::Init),
        Input::Nrt(Event::InitDone),
    ] {
        let _ = s.apply(input);
    }
    s
}

fn applied(writes: &[Write]) -> Vec<(&str, Value)> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::ApplyNrt { node, object } => Some((node.as_str(), object["zones"].clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_node_gets_its_object_once_and_no_write_when_nothing_changed() {
    let mut s = synced();
    let mut skipped = 0;
    let writes = s.plan_nrt(&nrt_options(), &mut skipped);
    assert_eq!(applied(&writes).len(), 1);
    let Write::ApplyNrt { object, .. } = &writes[0] else {
        panic!()
    };

    // The server echoes our apply back through the watch: nothing more to write.
    let echoed: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    let _ = s.apply(Input::Nrt(Event::Apply(echoed)));
    assert!(s.plan_nrt(&nrt_options(), &mut skipped).is_empty());
    assert_eq!(skipped, 1);

    // The same claim event twice changes the model once.
    assert!(
        s.apply(Input::Claim(Event::Apply(claim("c", "node-a", &[0, 1], 2))))
            .model
    );
    let writes = s.plan_nrt(&nrt_options(), &mut skipped);
    assert_eq!(applied(&writes)[0].1[0]["resources"][0]["available"], "2");
    assert!(
        !s.apply(Input::Claim(Event::Apply(claim("c", "node-a", &[0, 1], 2))))
            .model
    );
}

/// [`synced`], with node-a's object written and echoed back by the server.
fn written() -> State {
    let mut s = synced();
    let mut skipped = 0;
    let Write::ApplyNrt { object, .. } = s.plan_nrt(&nrt_options(), &mut skipped).remove(0) else {
        panic!()
    };
    let _ = s.apply(Input::Nrt(Event::Apply(
        serde_json::from_value(object).unwrap(),
    )));
    s.plan_nrt(&nrt_options(), &mut skipped);
    s
}

#[test]
fn a_deleted_nodes_object_is_left_to_the_garbage_collector() {
    let mut s = written();
    let mut skipped = 0;
    // The object names the Node as its owner: the garbage collector deletes it with
    // the Node, and there is no Node left to reconcile.
    let _ = s.apply(Input::Node(Event::Delete(node("node-a"))));
    assert_eq!(s.nodes_waiting(), 0);
    assert!(s.take_triggers().is_empty());
    assert!(s.plan_nrt(&nrt_options(), &mut skipped).is_empty());
}

#[test]
fn a_node_whose_gpus_go_loses_its_object() {
    let mut s = written();
    let _ = s.apply(Input::Slice(Event::Delete(gpu_slice("node-a"))));
    assert_eq!(s.take_triggers(), ["node-a"]);
    assert_eq!(s.take_nrt_plan("node-a", &nrt_options()).0, NrtPlan::Delete);
}

#[test]
fn a_node_is_handed_to_the_reconciler_once_per_wait() {
    let mut s = synced();
    assert_eq!(s.take_triggers(), ["node-a"]);
    // More changes while it waits ask for no second look: the look takes them all.
    for (i, gpus) in [[0, 1], [2, 3]].iter().enumerate() {
        let _ = s.apply(Input::Claim(Event::Apply(claim(
            &format!("c{i}"),
            "node-a",
            gpus,
            2,
        ))));
    }
    assert!(s.take_triggers().is_empty());
    let (NrtPlan::Apply(object), Some(_since)) = s.take_nrt_plan("node-a", &nrt_options()) else {
        panic!("a node that waited gets an apply, with the time it began to wait")
    };
    assert_eq!(object["zones"][0]["resources"][0]["available"], "0");
    // The server echoes the apply: the node waits again, and its look finds the
    // object up to date.
    let _ = s.apply(Input::Nrt(Event::Apply(
        serde_json::from_value(object).unwrap(),
    )));
    assert_eq!(s.take_triggers(), ["node-a"]);
    assert_eq!(s.nrt_plan("node-a", &nrt_options()), NrtPlan::UpToDate);
    s.settled("node-a");
    assert_eq!(s.nodes_waiting(), 0);

    // A failed write waits again, from when it first waited, with no new look asked
    // for (the reconciler's requeue is that look).
    let _ = s.apply(Input::Claim(Event::Delete(claim(
        "c0",
        "node-a",
        &[0, 1],
        2,
    ))));
    assert_eq!(s.take_triggers(), ["node-a"]);
    let (_, since) = s.take_nrt_plan("node-a", &nrt_options());
    s.write_failed("node-a", since);
    assert_eq!(s.nodes_waiting(), 1);
    assert!(s.take_triggers().is_empty());
}

#[test]
fn a_node_seen_before_its_node_object_is_handed_over_when_the_node_arrives() {
    let mut s = State::new("gpu.topodra.dev", vec!["gpu.topodra.dev".into()]);
    for input in [
        Input::Slice(Event::Init),
        Input::Slice(Event::InitApply(gpu_slice("node-a"))),
        Input::Slice(Event::InitDone),
    ] {
        let _ = s.apply(input);
    }
    // The reconciler finds no Node for this one and drops it.
    assert_eq!(s.take_triggers(), ["node-a"]);
    let _ = s.apply(Input::Node(Event::Apply(node("node-a"))));
    assert_eq!(s.take_triggers(), ["node-a"]);
}

#[test]
fn a_new_leader_looks_at_every_node_again() {
    let mut s = synced();
    let _ = s.take_triggers();
    s.mark_all_dirty();
    assert_eq!(s.take_triggers(), ["node-a"]);
}

#[test]
fn a_relist_drops_what_went_while_the_watch_was_away() {
    let mut s = synced();
    let _ = s.apply(Input::Claim(Event::Apply(claim(
        "c",
        "node-a",
        &[0, 1, 2, 3],
        4,
    ))));
    assert_eq!(s.cluster.node("node-a").unwrap().gpus.allocated, 4);
    // The claim was deleted during a watch outage; the relist does not bring it.
    let _ = s.apply(Input::Claim(Event::Init));
    let _ = s.apply(Input::Claim(Event::InitDone));
    assert_eq!(s.cluster.node("node-a").unwrap().gpus.allocated, 0);
}

#[test]
fn a_waiting_pod_is_explained_once_per_answer() {
    let mut s = synced();
    for (i, gpus) in [[0, 1, 2, 3], [4, 5, 6, 7]].iter().enumerate() {
        let _ = s.apply(Input::Claim(Event::Apply(claim(
            &format!("full-{i}"),
            "node-a",
            gpus,
            4,
        ))));
    }
    let _ = s.apply(Input::Claim(Event::Apply(claim("third", "node-a", &[], 4))));
    let _ = s.apply(Input::Pod(Event::Apply(waiting_pod("p", "third"))));
    let t0 = Instant::now();
    let events = s.plan_events(t0, Duration::from_secs(30));
    let [Write::PodEvent { name, message, .. }] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(name, "p");
    assert_eq!(
        message,
        "needs 4 GPUs on one NUMA node; no node has 4 free GPUs; no GPU is free"
    );
    assert_eq!(s.pending_pods(), 1);

    // Nothing changed: no second Event.
    let _ = s.apply(Input::Pod(Event::Apply(waiting_pod("p", "third"))));
    assert!(
        s.plan_events(t0 + Duration::from_secs(60), Duration::from_secs(30))
            .is_empty()
    );

    // A claim goes: the answer changes, but not before the minimum interval.
    let _ = s.apply(Input::Claim(Event::Delete(claim(
        "full-0",
        "node-a",
        &[0, 1, 2, 3],
        4,
    ))));
    assert!(
        s.plan_events(t0 + Duration::from_secs(10), Duration::from_secs(30))
            .is_empty()
    );
    assert!(s.pods_dirty(), "looked at again later");
    let later = s.plan_events(t0 + Duration::from_secs(31), Duration::from_secs(30));
    let [Write::PodEvent { message, .. }] = later.as_slice() else {
        panic!("{later:?}")
    };
    assert!(
        message.contains("fits now on 1 node (node-a, NUMA 0)"),
        "{message}"
    );

    // Scheduled pods leave the watch (it selects unscheduled pods) and are forgotten.
    let _ = s.apply(Input::Pod(Event::Delete(waiting_pod("p", "third"))));
    s.plan_events(t0 + Duration::from_secs(90), Duration::from_secs(30));
    assert_eq!(s.pending_pods(), 0);
}

#[test]
fn readiness_waits_for_every_watched_resource() {
    let s = synced();
    let watched = BTreeSet::from([Kind::Slices, Kind::Nodes, Kind::Pods]);
    assert_eq!(s.unsynced(&watched), [Kind::Pods]);
}

/// The run loop wakes for a write pass only when an event changed something a pass
/// acts on.
#[test]
fn an_event_that_changes_nothing_asks_for_no_pass() {
    let mut s = synced();
    let again = s.apply(Input::Node(Event::Apply(node("node-a"))));
    assert!(!again.model);
    assert!(!again.pass_due);
    let allocated = s.apply(Input::Claim(Event::Apply(claim("c", "node-a", &[0], 1))));
    assert!(allocated.model);
    assert!(allocated.pass_due);
}

mod malformed;

/// The CPU driver's grouped slice (dra-driver-cpu v0.2.0): 56 CPUs on each NUMA node.
fn cpu_slice(node: &str) -> ResourceSlice {
    let devices: Vec<Value> = (0..2)
        .map(|i| {
            json!({"name": format!("cpudevnuma{i:03}"),
                   "attributes": {"dra.net/numaNode": {"int": i}},
                   "capacity": {"dra.cpu/cpu": {"value": "56"}},
                   "allowMultipleAllocations": true})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-dra.cpu")},
        "spec": {"driver": "dra.cpu", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap()
}

#[test]
fn a_claim_of_gpus_and_cpus_is_explained_and_zones_count_the_cpus() {
    let mut s = synced().with_cpu_driver("dra.cpu", &["dra.net/numaNode".to_owned()]);
    let cpu_class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "dra.cpu"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"dra.cpu\""}}]}
    }))
    .unwrap();
    for input in [
        Input::Class(Event::Apply(cpu_class)),
        Input::CpuSlice(Event::Init),
        Input::CpuSlice(Event::InitApply(cpu_slice("node-a"))),
        Input::CpuSlice(Event::InitDone),
    ] {
        let _ = s.apply(input);
    }
    // NUMA 0: GPUs 0-3 and 40 CPUs taken by one claim; NUMA 1: all free.
    let mut first = claim("first", "node-a", &[0, 1, 2, 3], 4);
    first.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap()
        .results.as_mut().unwrap()
        .push(serde_json::from_value(json!({"driver": "dra.cpu", "pool": "node-a",
            "device": "cpudevnuma000", "request": "cpus", "consumedCapacity": {"dra.cpu/cpu": "40"}}))
        .unwrap());
    let _ = s.apply(Input::Claim(Event::Apply(first)));

    let mut skipped = 0;
    let writes = s.plan_nrt(&nrt_options(), &mut skipped);
    let zones = &applied(&writes)[0].1;
    assert_eq!(
        zones[0]["resources"][1],
        json!({"name": "cpu", "capacity": "56", "allocatable": "56", "available": "16"})
    );

    // Waiting: 4 GPUs and 60 CPUs on one NUMA node, more than either has.
    let waiting: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "mixed", "namespace": "default"},
        "spec": {"devices": {
            "requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.topodra.dev", "count": 4}},
                {"name": "cpus", "exactly": {"deviceClassName": "dra.cpu",
                    "capacity": {"requests": {"dra.cpu/cpu": "60"}}}}],
            "constraints": [{"matchAttribute": "dra.net/numaNode"}]}},
    }))
    .unwrap();
    let _ = s.apply(Input::Claim(Event::Apply(waiting)));
    let _ = s.apply(Input::Pod(Event::Apply(waiting_pod("p", "mixed"))));
    let events = s.plan_events(Instant::now(), Duration::ZERO);
    let [Write::PodEvent { message, .. }] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(
        message,
        "needs 4 GPUs and 60 CPUs on one NUMA node; no NUMA node has 4 free GPUs and 60 \
         free CPUs; node-a NUMA 1 has 4 GPUs and 56 CPUs free; node-a NUMA 0 has 0 GPUs \
         and 16 CPUs free"
    );
}

/// Issue 42, case 5: the CPU driver's NUMA ids count only where the node's own
/// slices announce them. One dra.cpu slice with 128 devices on NUMA 896-1023 once
/// gave a two-NUMA node 130 zones; a NUMA node with CPUs and no GPUs (announced)
/// keeps its zone.
#[test]
fn the_cpu_drivers_numa_ids_are_bounded_by_the_nodes_own() {
    let mut s = synced().with_cpu_driver("dra.cpu", &["dra.net/numaNode".to_owned()]);
    let mut ours = gpu_slice("node-a");
    ours.metadata.annotations = Some(
        [(
            topodra_model::slice::NUMA_NODES_ANNOTATION.to_owned(),
            "0-2".to_owned(),
        )]
        .into(),
    );
    let _ = s.apply(Input::Slice(Event::Apply(ours)));
    let devices: Vec<Value> = (0..3)
        .chain(896..1024)
        .map(|i| {
            json!({"name": format!("cpudevnuma{i:04}"),
                   "attributes": {"dra.net/numaNode": {"int": i}},
                   "capacity": {"dra.cpu/cpu": {"value": "8"}}})
        })
        .collect();
    let hostile: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "node-a-dra.cpu"},
        "spec": {"driver": "dra.cpu", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap();
    for input in [
        Input::CpuSlice(Event::Init),
        Input::CpuSlice(Event::InitApply(hostile)),
        Input::CpuSlice(Event::InitDone),
    ] {
        let _ = s.apply(input);
    }
    let mut skipped = 0;
    let writes = s.plan_nrt(&nrt_options(), &mut skipped);
    let zones = &applied(&writes)[0].1;
    let names: Vec<&str> = zones
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["node-0", "node-1", "node-2"]);
    assert_eq!(
        zones[2]["resources"],
        json!([{"name": "cpu", "capacity": "8", "allocatable": "8", "available": "8"}])
    );
    assert_eq!(s.ignored_cpu_numa_nodes(), 128);

    // A plugin that announces nothing (an older one): any id a kernel can have.
    let mut plain = synced().with_cpu_driver("dra.cpu", &["dra.net/numaNode".to_owned()]);
    let _ = plain.apply(Input::CpuSlice(Event::Apply(cpu_slice("node-a"))));
    let writes = plain.plan_nrt(&nrt_options(), &mut skipped);
    assert_eq!(applied(&writes)[0].1.as_array().unwrap().len(), 2);
    assert_eq!(plain.ignored_cpu_numa_nodes(), 0);
}
