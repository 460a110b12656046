use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};

use super::*;
use crate::slice::fixtures::{counter_sets, devices, dgx_h100, dgx_h100_mig, many, string};
use crate::slice::{DynamicMig, SliceError, build_slices};

fn time_sliced(node: &str) -> SliceOptions {
    SliceOptions {
        sharing: Sharing {
            time_slicing: Some(TimeSlicing::default()),
            mps: None,
            ..Default::default()
        },
        ..SliceOptions::new(node)
    }
}

fn device<'a>(slices: &'a [ResourceSlice], name: &str) -> &'a Device {
    devices(slices)
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

#[test]
fn each_gpu_publishes_a_time_sliced_device_beside_its_exclusive_one() {
    let slices = build_slices(&dgx_h100(), &time_sliced("n")).unwrap();
    let names: Vec<&str> = devices(&slices).iter().map(|d| d.name.as_str()).collect();
    // Whole GPUs in allocation order, then shares from the end of the pool: a
    // share goes to the GPU published last, and whole-GPU claims fill from the start.
    let want: Vec<String> = (0..8)
        .map(|i| format!("gpu-{i}"))
        .chain((0..8).rev().map(|i| format!("gpu-{i}-ts")))
        .collect();
    assert_eq!(names, want);

    let sets = counter_sets(&slices);
    assert_eq!(sets.len(), 8);
    for i in 0..8 {
        let set = sets.iter().find(|s| s.name == format!("gpu-{i}")).unwrap();
        assert_eq!(set.counters.len(), 1);
        assert_eq!(set.counters[GPU_COUNTER].value.0, "1");
        // The exclusive device and the shared one each take the whole set: the
        // scheduler hands out one of them, never both.
        for name in [format!("gpu-{i}"), format!("gpu-{i}-ts")] {
            let consumes = device(&slices, &name).consumes_counters.as_ref().unwrap();
            assert_eq!(consumes.len(), 1);
            assert_eq!(consumes[0].counter_set, set.name);
            assert_eq!(consumes[0].counters, set.counters);
        }
    }
}

#[test]
fn a_time_sliced_device_is_a_shareable_copy_of_its_gpu() {
    let slices = build_slices(&dgx_h100(), &time_sliced("n")).unwrap();
    let whole = device(&slices, "gpu-5");
    let ts = device(&slices, "gpu-5-ts");
    assert_eq!(ts.allow_multiple_allocations, Some(true));
    assert_eq!(whole.allow_multiple_allocations, None);

    let wa = whole.attributes.as_ref().unwrap();
    let ta = ts.attributes.as_ref().unwrap();
    assert_eq!(ta["type"], string("shared"));
    assert_eq!(ta["sharing"], string("TimeSlicing"));
    assert_eq!(ta["timeSliceInterval"], string("Default"));
    // Every other attribute is the GPU's, topology included, so matchAttribute
    // and the aligned class treat a share as its GPU.
    for (k, v) in wa.iter().filter(|(k, _)| k.as_str() != "type") {
        assert_eq!(ta.get(k), Some(v), "{k}");
    }
    assert_eq!(ta.len(), wa.len() + 2);

    let memory = &ts.capacity.as_ref().unwrap()["memory"];
    assert_eq!(memory.value.0, "81559Mi");
    let policy = memory.request_policy.as_ref().unwrap();
    // 81559 MiB / 4 replicas = 20389 MiB, 19 whole GiB.
    assert_eq!(policy.default.as_ref().unwrap().0, "19Gi");
    let range = policy.valid_range.as_ref().unwrap();
    assert_eq!(range.min.0, "1Gi");
    assert_eq!(range.step.as_ref().unwrap().0, "1Gi");
    assert_eq!(range.max, None);
    // The exclusive device's capacity stays a plain value: a request policy on a
    // device that does not allow multiple allocations is refused by the API.
    assert!(
        whole.capacity.as_ref().unwrap()["memory"]
            .request_policy
            .is_none()
    );
}

#[test]
fn the_interval_is_the_nodes_and_published() {
    let mut opts = time_sliced("n");
    opts.sharing.time_slicing = Some(TimeSlicing {
        interval: TimeSliceInterval::Long,
        replicas: 2,
    });
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    let ts = device(&slices, "gpu-0-ts");
    assert_eq!(
        ts.attributes.as_ref().unwrap()["timeSliceInterval"],
        string("Long")
    );
    let policy = ts.capacity.as_ref().unwrap()["memory"]
        .request_policy
        .clone()
        .unwrap();
    assert_eq!(policy.default.unwrap().0, "39Gi");
    let devs = shared_devices(&dgx_h100(), &opts);
    assert_eq!(devs.len(), 8);
    assert!(
        devs.iter()
            .all(|d| d.interval == TimeSliceInterval::Long && d.mode == SharingMode::TimeSlicing)
    );
}

#[test]
fn without_sharing_nothing_changes() {
    let plain = build_slices(&dgx_h100(), &SliceOptions::new("n")).unwrap();
    assert!(counter_sets(&plain).is_empty());
    assert!(
        devices(&plain)
            .iter()
            .all(|d| d.consumes_counters.is_none())
    );
    assert!(shared_devices(&dgx_h100(), &SliceOptions::new("n")).is_empty());
}

#[test]
fn gpus_in_mig_mode_or_under_dynamic_mig_are_not_time_sliced() {
    // Static MIG: a GPU in MIG mode runs CUDA only inside its instances.
    let opts = time_sliced("n");
    assert!(shared_devices(&dgx_h100_mig(), &opts).is_empty());
    let slices = build_slices(&dgx_h100_mig(), &opts).unwrap();
    assert!(counter_sets(&slices).is_empty());

    // Dynamic MIG: the counter set is the partitions'.
    let mut opts = time_sliced("n");
    opts.dynamic_mig = DynamicMig::All;
    assert!(shared_devices(&dgx_h100_mig(), &opts).is_empty());
    let slices = build_slices(&dgx_h100_mig(), &opts).unwrap();
    assert!(devices(&slices).iter().all(|d| !d.name.ends_with("-ts")));
}

#[test]
fn a_gpu_without_room_for_two_shares_is_not_shared() {
    let mut inv = dgx_h100();
    inv.gpus[0].memory_bytes = None;
    inv.gpus[1].memory_bytes = Some(MEMORY_STEP * 2 - 1);
    inv.gpus[2].memory_bytes = Some(MEMORY_STEP * 2);
    let names: Vec<String> = shared_devices(&inv, &time_sliced("n"))
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert!(!names.contains(&"gpu-0-ts".to_owned()));
    assert!(!names.contains(&"gpu-1-ts".to_owned()));
    assert!(names.contains(&"gpu-2-ts".to_owned()));
    // A GPU that is not shared keeps its exclusive device without counters.
    let slices = build_slices(&inv, &time_sliced("n")).unwrap();
    assert!(device(&slices, "gpu-0").consumes_counters.is_none());
    assert!(device(&slices, "gpu-2").consumes_counters.is_some());
}

#[test]
fn a_tainted_gpu_taints_its_shares() {
    let mut opts = time_sliced("n");
    let taint = DeviceTaint {
        key: "gpu.topodra.dev/xid".to_owned(),
        effect: "NoSchedule".to_owned(),
        value: Some("79".to_owned()),
        ..Default::default()
    };
    opts.device_taints
        .insert("gpu-3".to_owned(), vec![taint.clone()]);
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    assert_eq!(
        device(&slices, "gpu-3-ts").taints.as_deref(),
        Some(&[taint][..])
    );
    assert_eq!(device(&slices, "gpu-2-ts").taints, None);
}

#[test]
fn the_memory_policy_passes_the_api_rules_for_any_memory_and_replicas() {
    for memory in [
        MEMORY_STEP * 2,
        MEMORY_STEP * 2 + 1,
        15_360 << 20,
        81_559 << 20,
        144_384 << 20,
        196 << 30,
    ] {
        for replicas in [0, 1, 2, 3, 4, 7, 10, 48, 1000] {
            let c = memory_capacity(memory, replicas);
            let d = Device {
                name: "gpu-0-ts".to_owned(),
                capacity: Some(BTreeMap::from([("memory".to_owned(), c.clone())])),
                allow_multiple_allocations: Some(true),
                ..Default::default()
            };
            crate::slice::validate::check_device_for_tests(&d)
                .unwrap_or_else(|e| panic!("{memory} bytes, {replicas} replicas: {e}"));
            // The default share fits `replicas` times (at least once).
            let default: u64 = c.request_policy.unwrap().default.unwrap().0[..]
                .trim_end_matches("Gi")
                .parse::<u64>()
                .unwrap()
                * MEMORY_STEP;
            assert!(default * u64::from(replicas.max(1)) <= memory || default == MEMORY_STEP);
        }
    }
}

#[test]
fn a_request_policy_without_multiple_allocations_is_refused() {
    let d = Device {
        name: "gpu-0".to_owned(),
        capacity: Some(BTreeMap::from([(
            "memory".to_owned(),
            memory_capacity(80 << 30, 4),
        )])),
        ..Default::default()
    };
    let err = crate::slice::validate::check_device_for_tests(&d).unwrap_err();
    assert!(
        matches!(&err, SliceError::RequestPolicy { reason, .. } if reason.contains("allowMultipleAllocations")),
        "{err}"
    );
}

#[test]
fn a_request_policy_off_its_grid_is_refused() {
    let mut c = memory_capacity(80 << 30, 4);
    c.request_policy.as_mut().unwrap().default = Some(Quantity("1500Mi".to_owned()));
    let d = Device {
        name: "gpu-0-ts".to_owned(),
        capacity: Some(BTreeMap::from([("memory".to_owned(), c)])),
        allow_multiple_allocations: Some(true),
        ..Default::default()
    };
    let err = crate::slice::validate::check_device_for_tests(&d).unwrap_err();
    assert!(err.to_string().contains("grid"), "{err}");
}

#[test]
fn a_large_node_splits_shared_devices_at_the_counter_limit() {
    // 40 GPUs: 80 devices that consume counters, 64 to a slice; 40 counter sets,
    // 8 to a slice.
    let slices = build_slices(&many(40), &time_sliced("n")).unwrap();
    let device_slices: Vec<usize> = slices
        .iter()
        .filter_map(|s| s.spec.devices.as_ref().map(Vec::len))
        .collect();
    assert_eq!(device_slices, vec![64, 16]);
    assert_eq!(counter_sets(&slices).len(), 40);
    assert_eq!(
        slices
            .iter()
            .filter(|s| s.spec.shared_counters.is_some())
            .count(),
        5
    );
}

fn with_mps(node: &str) -> SliceOptions {
    SliceOptions {
        sharing: Sharing {
            time_slicing: Some(TimeSlicing::default()),
            mps: Some(Mps { replicas: 8 }),
            ..Default::default()
        },
        ..SliceOptions::new(node)
    }
}

#[test]
fn an_mps_device_shares_memory_and_sms_and_excludes_the_other_modes() {
    let slices = build_slices(&dgx_h100(), &with_mps("n")).unwrap();
    let mps = device(&slices, "gpu-4-mps");
    let ts = device(&slices, "gpu-4-ts");
    let whole = device(&slices, "gpu-4");
    assert_eq!(mps.allow_multiple_allocations, Some(true));
    let a = mps.attributes.as_ref().unwrap();
    assert_eq!(a["type"], string("shared"));
    assert_eq!(a["sharing"], string("MPS"));
    assert!(!a.contains_key("timeSliceInterval"), "MPS has no interval");
    let capacity = mps.capacity.as_ref().unwrap();
    // 81559 MiB / 8 replicas = 10194 MiB: 9 whole GiB; 100 % / 8 = 12 %.
    assert_eq!(
        capacity["memory"].request_policy.as_ref().unwrap().default,
        Some(Quantity("9Gi".to_owned()))
    );
    let compute = &capacity["compute"];
    assert_eq!(compute.value.0, "100");
    let policy = compute.request_policy.as_ref().unwrap();
    assert_eq!(policy.default, Some(Quantity("12".to_owned())));
    let range = policy.valid_range.as_ref().unwrap();
    assert_eq!(
        (
            range.min.0.as_str(),
            range.step.as_ref().map(|q| q.0.as_str())
        ),
        ("1", Some("1"))
    );
    // The GPU, its time-sliced device and its MPS device all take the whole set:
    // one mode per GPU at a time.
    for d in [whole, ts, mps] {
        assert_eq!(d.consumes_counters, whole.consumes_counters, "{}", d.name);
    }
    let devs = shared_devices(&dgx_h100(), &with_mps("n"));
    assert_eq!(devs.len(), 16);
    assert_eq!(
        devs.iter().filter(|d| d.mode == SharingMode::Mps).count(),
        8
    );
}

#[test]
fn mps_alone_publishes_no_time_sliced_device() {
    let opts = SliceOptions {
        sharing: Sharing {
            time_slicing: None,
            mps: Some(Mps::default()),
            ..Default::default()
        },
        ..SliceOptions::new("n")
    };
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    let names: Vec<&str> = devices(&slices).iter().map(|d| d.name.as_str()).collect();
    assert!(names.contains(&"gpu-0-mps"));
    assert!(!names.iter().any(|n| n.ends_with("-ts")));
}

#[test]
fn the_compute_policy_passes_the_api_rules_for_any_replicas() {
    for replicas in [0, 1, 2, 3, 7, 100, 101, 1000] {
        let d = Device {
            name: "gpu-0-mps".to_owned(),
            capacity: Some(BTreeMap::from([(
                "compute".to_owned(),
                compute_capacity(replicas),
            )])),
            allow_multiple_allocations: Some(true),
            ..Default::default()
        };
        crate::slice::validate::check_device_for_tests(&d)
            .unwrap_or_else(|e| panic!("{replicas} replicas: {e}"));
    }
}

fn mig_shared(profiles: &[&str]) -> SliceOptions {
    SliceOptions {
        dynamic_mig: DynamicMig::All,
        sharing: Sharing {
            time_slicing: Some(TimeSlicing::default()),
            mps: Some(Mps::default()),
            mig_profiles: profiles.iter().map(|p| (*p).to_owned()).collect(),
        },
        ..SliceOptions::new("n")
    }
}

#[test]
fn partitions_of_the_named_profiles_publish_shared_devices_consuming_what_they_do() {
    let slices = build_slices(&dgx_h100_mig(), &mig_shared(&["3g.40gb"])).unwrap();
    let part = device(&slices, "gpu-7-mig-3g-40gb-4");
    for mode in ["ts", "mps"] {
        let d = device(&slices, &format!("gpu-7-mig-3g-40gb-4-{mode}"));
        assert_eq!(d.allow_multiple_allocations, Some(true));
        assert_eq!(d.consumes_counters, part.consumes_counters, "{mode}");
        let a = d.attributes.as_ref().unwrap();
        assert_eq!(a["type"], string("shared"));
        assert_eq!(a["profile"], string("3g.40gb"));
        assert_eq!(
            a.get("resource.kubernetes.io/numaNode"),
            part.attributes
                .as_ref()
                .unwrap()
                .get("resource.kubernetes.io/numaNode")
        );
        // The partition's memory, not the GPU's.
        let memory = &d.capacity.as_ref().unwrap()["memory"];
        assert_eq!(
            memory.value,
            part.capacity.as_ref().unwrap()["memory"].value
        );
    }
    // Other profiles' partitions are not shared, and neither is a whole GPU under
    // dynamic MIG.
    let names: Vec<&str> = devices(&slices).iter().map(|d| d.name.as_str()).collect();
    assert!(
        !names
            .iter()
            .any(|n| n.contains("1g-10gb") && n.ends_with("-ts"))
    );
    assert!(!names.contains(&"gpu-7-ts"));
    let shared = shared_devices(&dgx_h100_mig(), &mig_shared(&["3g.40gb"]));
    // Two 3g.40gb placements per GPU, two modes, eight GPUs.
    assert_eq!(shared.len(), 2 * 2 * 8);
    let one = shared
        .iter()
        .find(|s| s.name == "gpu-7-mig-3g-40gb-4-mps")
        .unwrap();
    let m = one.mig.as_ref().unwrap();
    assert_eq!(m.device, "gpu-7-mig-3g-40gb-4");
    assert_eq!((m.placement.start, m.placement.size), (4, 4));
}

#[test]
fn no_named_profile_publishes_no_partition_share() {
    let slices = build_slices(&dgx_h100_mig(), &mig_shared(&[])).unwrap();
    assert!(
        devices(&slices)
            .iter()
            .all(|d| d.allow_multiple_allocations.is_none())
    );
}
