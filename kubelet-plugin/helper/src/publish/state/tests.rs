use super::*;
use crate::publish::tests::pool_slices;

/// The pool of `devices` devices on node `n`, two per slice.
fn pool(devices: u32) -> Vec<ResourceSlice> {
    pool_slices("n", devices, Some(2), &BTreeMap::new())
}

fn at(devices: u32, generation: i64) -> Vec<ResourceSlice> {
    at_generation(&pool(devices), generation)
}

/// The names of written or deleted slices, in order.
fn names_of(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

fn stored(mut s: ResourceSlice, rv: u32) -> ResourceSlice {
    s.metadata.resource_version = Some(rv.to_string());
    s.metadata.uid = Some(format!("uid-{}", s.metadata.name.as_deref().unwrap()));
    s
}

fn synced_with(slices: Vec<ResourceSlice>) -> PoolState {
    let mut st = PoolState::new("gpu.topodra.dev", "n");
    st.on_event(&watcher::Event::Init);
    for (i, s) in slices.into_iter().enumerate() {
        st.on_event(&watcher::Event::InitApply(stored(s, i as u32 + 1)));
    }
    assert!(!st.is_synced());
    assert!(st.on_event(&watcher::Event::InitDone));
    assert!(st.is_synced());
    st
}

#[test]
fn nothing_observed_starts_at_generation_one() {
    let st = synced_with(vec![]);
    let Decision::Write(plan) = st.decide(&pool(3), Instant::now()) else {
        panic!("expected a write");
    };
    assert_eq!(plan.generation, 1);
    assert!(plan.apply.is_empty());
    assert_eq!(plan.create.len(), 2);
    for s in &plan.create {
        assert_eq!(s.metadata.name, None);
        assert_eq!(
            s.metadata.generate_name.as_deref(),
            Some("n-gpu.topodra.dev-")
        );
    }
    assert!(plan.delete.is_empty());
}

#[test]
fn an_identical_pool_keeps_its_generation() {
    let st = synced_with(at(3, 7));
    assert_eq!(
        st.decide(&pool(3), Instant::now()),
        Decision::InSync { generation: 7 }
    );
}

#[test]
fn a_shrunk_pool_bumps_and_deletes_the_extra_slice() {
    let st = synced_with(at(5, 7));
    let Decision::Write(plan) = st.decide(&pool(3), Instant::now()) else {
        panic!("expected a write");
    };
    assert_eq!(plan.generation, 8);
    assert_eq!(plan.apply.len(), 2);
    assert!(plan.apply.iter().all(|s| s.spec.pool.generation == 8));
    let deleted = names_of(&plan.delete);
    assert_eq!(deleted, ["n-gpu.topodra.dev-2"]);
}

#[test]
fn generations_never_go_back_after_a_wipe() {
    let now = Instant::now();
    let mut st = synced_with(at(1, 4));
    let Decision::Write(plan) = st.decide(&pool(2), now) else {
        panic!("expected a write");
    };
    assert_eq!(plan.generation, 5);
    let response = stored(plan.apply[0].clone(), 10);
    st.applied(&plan.apply[0], response.clone(), now);
    // Before the echo arrives, the response stands in for it.
    assert_eq!(st.decide(&pool(2), now), Decision::InSync { generation: 5 });
    st.on_event(&watcher::Event::Apply(response.clone()));
    // The kubelet wipes the pool: it comes back one generation higher.
    st.on_event(&watcher::Event::Delete(response));
    let Decision::Write(plan) = st.decide(&pool(2), now) else {
        panic!("expected a write");
    };
    assert_eq!(plan.generation, 6);
}

#[test]
fn stale_events_do_not_override_a_pending_write() {
    let now = Instant::now();
    let old = at(1, 1);
    let mut st = synced_with(old.clone());
    let Decision::Write(plan) = st.decide(&pool(2), now) else {
        panic!("expected a write");
    };
    st.applied(&plan.apply[0], stored(plan.apply[0].clone(), 20), now);
    // An event from before our write arrives late.
    st.on_event(&watcher::Event::Apply(stored(old[0].clone(), 15)));
    assert_eq!(st.decide(&pool(2), now), Decision::InSync { generation: 2 });
    // Without the echo, the watch is believed again after the grace period.
    let later = now + ECHO_GRACE;
    assert!(matches!(st.decide(&pool(2), later), Decision::Write(_)));
}

#[test]
fn a_server_normalization_does_not_cause_a_write_loop() {
    let now = Instant::now();
    let mut st = synced_with(vec![]);
    let Decision::Write(plan) = st.decide(&pool(1), now) else {
        panic!("expected a write");
    };
    // The server names the slice it creates.
    let mut response = plan.create[0].clone();
    response.metadata.name = Some("n-gpu.topodra.dev-bcdfg".to_owned());
    let mut response = stored(response, 3);
    response.spec.pool.name = "normalized".to_owned();
    st.applied(&plan.create[0], response.clone(), now);
    st.on_event(&watcher::Event::Apply(response.clone()));
    assert_eq!(st.decide(&pool(1), now), Decision::InSync { generation: 1 });
    // Someone else changing it afterwards is a difference again.
    response.spec.pool.name = "edited".to_owned();
    response.metadata.resource_version = Some("4".to_owned());
    st.on_event(&watcher::Event::Apply(response));
    assert!(matches!(st.decide(&pool(1), now), Decision::Write(_)));
}

#[test]
fn slices_are_matched_by_devices_whatever_their_names() {
    let now = Instant::now();
    // Two of ours, under names the server made, listed in the other order.
    let mut observed = at(4, 3);
    observed[0].metadata.name = Some("n-gpu.topodra.dev-zzzzz".to_owned());
    observed[1].metadata.name = Some("n-gpu.topodra.dev-bbbbb".to_owned());
    let st = synced_with(observed);
    assert_eq!(st.decide(&pool(4), now), Decision::InSync { generation: 3 });

    // gpu-3 is gone: the new generation goes on both slices, each under its name.
    let Decision::Write(plan) = st.decide(&pool(3), now) else {
        panic!("expected a write");
    };
    let names = names_of(&plan.apply);
    assert_eq!(
        names,
        ["n-gpu.topodra.dev-zzzzz", "n-gpu.topodra.dev-bbbbb"]
    );
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    // A pool that grew by a slice creates one and keeps the others.
    let Decision::Write(plan) = st.decide(&pool(6), now) else {
        panic!("expected a write");
    };
    assert_eq!(
        (plan.apply.len(), plan.create.len(), plan.delete.len()),
        (2, 1, 0)
    );
}

#[test]
fn other_drivers_and_nodes_are_not_ours() {
    let mut foreign = at(1, 9).remove(0);
    foreign.spec.driver = "other.example.com".to_owned();
    foreign.metadata.name = Some("foreign".to_owned());
    let st = synced_with(vec![foreign]);
    let Decision::Write(plan) = st.decide(&pool(1), Instant::now()) else {
        panic!("expected a write");
    };
    assert_eq!(plan.generation, 1);
    assert!(plan.delete.is_empty());
}

fn ordered_synced_with(node: &str, slices: Vec<ResourceSlice>) -> PoolState {
    let mut st = PoolState::new("gpu.topodra.dev", node).with_ordered_names(true);
    st.on_event(&watcher::Event::Init);
    for (i, s) in slices.into_iter().enumerate() {
        st.on_event(&watcher::Event::InitApply(stored(s, i as u32 + 1)));
    }
    assert!(st.on_event(&watcher::Event::InitDone));
    st
}

fn plan_of(d: Decision) -> Plan {
    match d {
        Decision::Write(plan) => plan,
        other => panic!("expected a write, got {other:?}"),
    }
}

#[test]
fn ordered_names_carry_the_index_so_names_sort_in_pool_order() {
    let st = ordered_synced_with("n", vec![]);
    let plan = plan_of(st.decide(&pool(5), Instant::now()));
    let prefixes: Vec<_> = plan
        .create
        .iter()
        .map(|s| s.metadata.generate_name.clone().unwrap())
        .collect();
    assert_eq!(
        prefixes,
        [
            "n-gpu.topodra.dev-00-",
            "n-gpu.topodra.dev-01-",
            "n-gpu.topodra.dev-02-"
        ]
    );
}

#[test]
fn ordered_names_are_kept_for_their_index_only() {
    let now = Instant::now();
    // Ours, named by the server from ordered prefixes, listed out of order.
    let mut observed = at(6, 3);
    for (s, name) in observed.iter_mut().zip([
        "n-gpu.topodra.dev-01-bbbbb",
        "n-gpu.topodra.dev-00-zzzzz",
        "n-gpu.topodra.dev-02-ccccc",
    ]) {
        s.metadata.name = Some(name.to_owned());
    }
    // Slice 0's devices under the name of index 1 and the other way round: the
    // devices move to the slices whose names keep the pool's order.
    let st = ordered_synced_with("n", observed);
    let plan = plan_of(st.decide(&pool(6), now));
    let names = names_of(&plan.apply);
    assert_eq!(
        names,
        [
            "n-gpu.topodra.dev-00-zzzzz",
            "n-gpu.topodra.dev-01-bbbbb",
            "n-gpu.topodra.dev-02-ccccc"
        ]
    );
    assert!(plan.create.is_empty() && plan.delete.is_empty());

    // Once in order, an unchanged pool writes nothing; a shrunk one drops the last.
    let mut in_order = at(6, 4);
    for (i, s) in in_order.iter_mut().enumerate() {
        s.metadata.name = Some(format!("n-gpu.topodra.dev-0{i}-abcde"));
    }
    let st = ordered_synced_with("n", in_order);
    assert_eq!(st.decide(&pool(6), now), Decision::InSync { generation: 4 });
    let plan = plan_of(st.decide(&pool(4), now));
    let deleted = names_of(&plan.delete);
    assert_eq!(deleted, ["n-gpu.topodra.dev-02-abcde"]);
}

#[test]
fn unordered_names_of_several_slices_are_replaced_once_and_one_slice_keeps_its_name() {
    let now = Instant::now();
    let mut legacy = at(4, 2);
    legacy[0].metadata.name = Some("n-gpu.topodra.dev-zzzzz".to_owned());
    legacy[1].metadata.name = Some("n-gpu.topodra.dev-bbbbb".to_owned());
    let st = ordered_synced_with("n", legacy);
    let plan = plan_of(st.decide(&pool(4), now));
    assert_eq!(
        (plan.apply.len(), plan.create.len(), plan.delete.len()),
        (0, 2, 2)
    );

    // A pool of one slice: order cannot matter, the name stays.
    let mut one = at(2, 2);
    one[0].metadata.name = Some("n-gpu.topodra.dev-zzzzz".to_owned());
    let st = ordered_synced_with("n", one);
    assert_eq!(st.decide(&pool(2), now), Decision::InSync { generation: 2 });
}

#[test]
fn a_long_node_name_puts_the_index_first_where_the_server_would_cut_it_off() {
    let node = format!("{}.example.com", "a".repeat(60));
    let st = PoolState::new("gpu.topodra.dev", node.as_str()).with_ordered_names(true);
    let p = st.ordered_prefix(3, 12);
    assert!(p.len() <= MAX_GENERATE_NAME, "{p}");
    assert!(p.starts_with("03-aaaa"), "{p}");
    assert!(
        p.ends_with('-') && !p.ends_with(".-") && !p.ends_with("--"),
        "{p}"
    );
    assert_eq!(st.ordered_prefix(3, 120), {
        let mut q = format!("003-{node}-gpu.topodra.dev");
        q.truncate(MAX_GENERATE_NAME - 1);
        format!("{}-", q.trim_end_matches(['-', '.']))
    });
}

/// A slice of shared counters and a slice of devices: each reused only for its own
/// kind. Here the counter slice moves from index 1 to index 2 (the pool grew a
/// device slice, as dynamic MIG does when GPUs enter MIG mode): the slice at index 1
/// is created anew and the old counter slice deleted after the writes, since the
/// server refuses an apply that gives a counter slice devices.
#[test]
fn a_counter_slice_is_never_reused_for_devices() {
    use k8s_openapi::api::resource::v1::{Counter, CounterSet};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let now = Instant::now();
    let with_counters = |mut s: ResourceSlice| {
        s.spec.devices = None;
        s.spec.shared_counters = Some(vec![CounterSet {
            name: "gpu-0".into(),
            counters: BTreeMap::from([(
                "memory-slice-0".to_owned(),
                Counter {
                    value: Quantity("1".into()),
                },
            )]),
        }]);
        s
    };
    // Observed: devices at index 0, counters at index 1.
    let mut observed = at(2, 3);
    observed.push(with_counters(observed[0].clone()));
    for (s, name) in observed
        .iter_mut()
        .zip(["n-gpu.topodra.dev-00-aaaaa", "n-gpu.topodra.dev-01-bbbbb"])
    {
        s.metadata.name = Some(name.to_owned());
    }
    let st = ordered_synced_with("n", observed);
    // Desired: devices at 0 and 1, counters at 2.
    let mut desired = pool(4);
    desired.push(with_counters(desired[0].clone()));
    let plan = plan_of(st.decide(&desired, now));
    assert_eq!(names_of(&plan.apply), ["n-gpu.topodra.dev-00-aaaaa"]);
    let created: Vec<_> = plan
        .create
        .iter()
        .map(|s| {
            (
                s.metadata.generate_name.clone().unwrap(),
                s.spec.shared_counters.is_some(),
            )
        })
        .collect();
    assert_eq!(
        created,
        [
            ("n-gpu.topodra.dev-01-".to_owned(), false),
            ("n-gpu.topodra.dev-02-".to_owned(), true)
        ]
    );
    assert_eq!(names_of(&plan.delete), ["n-gpu.topodra.dev-01-bbbbb"]);
}
