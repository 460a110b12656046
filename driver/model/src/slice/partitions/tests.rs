use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::*;
use crate::inventory::MigMode;
use crate::slice::fixtures::{
    counter_sets, devices, dgx_h100, dgx_h100_mig, h100_mig_profiles, int, string,
};
use crate::slice::{AttributeSet, SliceError, build_slices, validate};

fn dynamic(node: &str) -> SliceOptions {
    SliceOptions {
        dynamic_mig: DynamicMig::All,
        ..SliceOptions::new(node)
    }
}

fn value<'a>(counters: &'a BTreeMap<String, Counter>, name: &str) -> &'a str {
    counters[name].value.0.as_str()
}

#[test]
fn an_h100_counts_its_memory_slices_and_its_one_ofa_engine() {
    let gpu = &dgx_h100_mig().gpus[0];
    let g = geometry(gpu).unwrap();
    assert_eq!(g.counter_set.name, "gpu-0");
    let c = &g.counter_set.counters;
    let names: Vec<&str> = c.keys().map(String::as_str).collect();
    // The guide's tables never let memory-legal placements exceed the 7g
    // profile's SMs, copy engines, decoders, JPEG engines or memory; seven
    // `+me` placements could exceed its one OFA engine.
    assert_eq!(
        names,
        [
            "memory-slice-0",
            "memory-slice-1",
            "memory-slice-2",
            "memory-slice-3",
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7",
            "ofa-engines",
        ]
    );
    assert_eq!(value(c, "ofa-engines"), "1");
    assert_eq!(value(c, "memory-slice-7"), "1");
    assert_eq!(g.whole.counter_set, "gpu-0");
    assert_eq!(&g.whole.counters, c, "the whole GPU consumes all of it");
    // 7 + 3 + 2 + 1 + 1 + 7 + 4 placements in the guide's -lgipp output.
    assert_eq!(g.partitions.len(), 25);
}

#[test]
fn the_most_that_fits_is_found_over_the_memory_slices() {
    let profiles = h100_mig_profiles();
    let refs: Vec<&MigProfile> = profiles.iter().collect();
    let most = |f: &dyn Fn(&MigProfile) -> u64| most_placed(&refs, 8, f);
    assert_eq!(most(&|p| u64::from(p.slice_count)), 7);
    // The 7g profile itself; the best split, 4g.40gb at 0 and 3g.40gb at 4, has 124.
    assert_eq!(most(&|p| u64::from(p.multiprocessors)), 132);
    assert_eq!(most(&|p| u64::from(p.ofa_engines)), 7);
    assert_eq!(most(&|p| u64::from(p.name == "1g.20gb")), 4);
    assert_eq!(most(&|p| p.memory_mib), 81152);
    let split: Vec<&MigProfile> = refs.iter().copied().filter(|p| p.slice_count < 7).collect();
    assert_eq!(
        most_placed(&split, 8, |p: &MigProfile| u64::from(p.multiprocessors)),
        124
    );
}

#[test]
fn an_instance_count_nothing_else_enforces_gets_its_own_counter() {
    let mut gpu = dgx_h100_mig().gpus[0].clone();
    // Without OFA engines nothing would keep `+me` instances to one.
    for p in &mut gpu.mig_profiles {
        p.ofa_engines = 0;
    }
    let g = geometry(&gpu).unwrap();
    let c = &g.counter_set.counters;
    assert_eq!(value(c, "instances-1g-10gb-me"), "1");
    assert!(!c.contains_key("ofa-engines"));
    let me = g
        .partitions
        .iter()
        .find(|p| p.profile.name == "1g.10gb+me")
        .unwrap();
    assert_eq!(value(&me.consumes.counters, "instances-1g-10gb-me"), "1");
    let plain = g
        .partitions
        .iter()
        .find(|p| p.profile.name == "1g.10gb")
        .unwrap();
    assert_eq!(plain.consumes.counters.len(), 1, "its memory slice only");
}

#[test]
fn an_engine_that_memory_legal_placements_can_exceed_is_counted() {
    let mut gpu = dgx_h100_mig().gpus[0].clone();
    // Suppose the 7g profile had 6 decoders: seven 1g instances would need 7.
    for p in &mut gpu.mig_profiles {
        if p.name == "7g.80gb" {
            p.decoders = 6;
        }
    }
    let g = geometry(&gpu).unwrap();
    assert_eq!(value(&g.counter_set.counters, "decoders"), "6");
    let one = g
        .partitions
        .iter()
        .find(|p| p.profile.name == "1g.10gb")
        .unwrap();
    assert_eq!(value(&one.consumes.counters, "decoders"), "1");
}

#[test]
fn a_partition_consumes_its_memory_slices_and_the_counters_that_bind() {
    let inv = dgx_h100_mig();
    let slices = build_slices(&inv, &dynamic("dgx")).unwrap();
    let all = devices(&slices);
    let find = |name: &str| *all.iter().find(|d| d.name == name).unwrap();

    let p = find("gpu-3-mig-2g-20gb-2");
    let c = &p.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(c.counter_set, "gpu-3");
    let consumed: Vec<&str> = c.counters.keys().map(String::as_str).collect();
    assert_eq!(consumed, ["memory-slice-2", "memory-slice-3"]);

    let me = find("gpu-3-mig-1g-10gb-me-6");
    let c = &me.consumes_counters.as_ref().unwrap()[0].counters;
    let consumed: Vec<&str> = c.keys().map(String::as_str).collect();
    assert_eq!(consumed, ["memory-slice-6", "ofa-engines"]);

    let seven = find("gpu-3-mig-7g-80gb-0");
    let c = &seven.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(
        c.counters.len(),
        9,
        "all eight memory slices and the OFA engine"
    );

    let whole = find("gpu-3");
    let c = &whole.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(c.counters.len(), 9);
}

#[test]
fn partitions_carry_the_parents_topology_and_uuid_and_little_else() {
    let inv = dgx_h100_mig();
    let slices = build_slices(&inv, &dynamic("dgx")).unwrap();
    let all = devices(&slices);
    let p = all
        .iter()
        .find(|d| d.name == "gpu-5-mig-3g-40gb-4")
        .unwrap();
    let a = p.attributes.as_ref().unwrap();
    let names: BTreeSet<&str> = a.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "resource.kubernetes.io/numaNode",
            "resource.kubernetes.io/pcieRoot",
            "socket",
            "pcieSwitch",
            "nvlinkDomain",
            "type",
            "profile",
            "parentUUID",
        ])
    );
    let parent = all.iter().find(|d| d.name == "gpu-5").unwrap();
    let pa = parent.attributes.as_ref().unwrap();
    for shared in [
        "resource.kubernetes.io/numaNode",
        "resource.kubernetes.io/pcieRoot",
        "socket",
        "pcieSwitch",
        "nvlinkDomain",
    ] {
        assert_eq!(a[shared], pa[shared], "{shared}");
    }
    assert_eq!(a["type"], string("mig"));
    assert_eq!(a["profile"], string("3g.40gb"));
    assert_eq!(a["parentUUID"], pa["uuid"]);
    assert_eq!(a["resource.kubernetes.io/numaNode"], int(1));
    let cap = p.capacity.as_ref().unwrap();
    assert_eq!(cap["memory"].value.0, "40448Mi");
    assert_eq!(cap["multiprocessors"].value.0, "60");
}

#[test]
fn whole_gpus_come_first_and_partitions_from_the_last_gpu_small_and_high_first() {
    let slices = build_slices(&dgx_h100_mig(), &dynamic("dgx")).unwrap();
    let names: Vec<&str> = devices(&slices).iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names[..8],
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    assert_eq!(
        names[8..17],
        [
            "gpu-7-mig-1g-10gb-6",
            "gpu-7-mig-1g-10gb-5",
            "gpu-7-mig-1g-10gb-4",
            "gpu-7-mig-1g-10gb-3",
            "gpu-7-mig-1g-10gb-2",
            "gpu-7-mig-1g-10gb-1",
            "gpu-7-mig-1g-10gb-0",
            "gpu-7-mig-1g-10gb-me-6",
            "gpu-7-mig-1g-10gb-me-5",
        ]
    );
    let gpu7_last = 8 + 25 - 1;
    assert_eq!(names[gpu7_last], "gpu-7-mig-7g-80gb-0");
    assert_eq!(names[gpu7_last + 1], "gpu-6-mig-1g-10gb-6");
    assert_eq!(names.last(), Some(&"gpu-0-mig-7g-80gb-0"));
}

#[test]
fn a_dgx_fills_four_device_slices_of_64_and_one_of_counters() {
    let opts = dynamic("dgx");
    let slices = build_slices(&dgx_h100_mig(), &opts).unwrap();
    let shape: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| {
            (
                s.spec.devices.as_ref().map_or(0, Vec::len),
                s.spec.shared_counters.as_ref().map_or(0, Vec::len),
            )
        })
        .collect();
    // 8 whole GPUs and 8 x 25 partitions: 208 devices that consume counters.
    assert_eq!(shape, [(64, 0), (64, 0), (64, 0), (16, 0), (0, 8)]);
    for s in &slices {
        assert_eq!(s.spec.pool.resource_slice_count, 5);
    }
    let sets: Vec<&str> = counter_sets(&slices)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        sets,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
}

#[test]
fn nine_gpus_need_a_second_counter_slice() {
    let mut inv = dgx_h100_mig();
    let mut ninth = inv.gpus[7].clone();
    ninth.pci_bus_id = "0000:dc:00.0".parse().unwrap();
    ninth.minor = Some(8);
    ninth.index = Some(8);
    ninth.uuid = Some("GPU-7f1c2b3a-0000-4e5f-8a9b-000000000008".to_owned());
    inv.gpus.push(ninth);
    let slices = build_slices(&inv, &dynamic("dgx")).unwrap();
    let sets: Vec<usize> = slices
        .iter()
        .filter_map(|s| s.spec.shared_counters.as_ref().map(Vec::len))
        .collect();
    assert_eq!(sets, [8, 1]);
}

#[test]
fn dynamic_mig_off_or_no_profiles_publishes_no_counters() {
    let off = build_slices(&dgx_h100_mig(), &SliceOptions::new("dgx")).unwrap();
    assert!(counter_sets(&off).is_empty());
    // MIG on with no MIG devices and dynamic MIG off: nothing to offer.
    assert!(devices(&off).is_empty());

    let plain = build_slices(&dgx_h100(), &dynamic("dgx")).unwrap();
    assert!(
        counter_sets(&plain).is_empty(),
        "no empty counter set, ever"
    );
    assert_eq!(devices(&plain).len(), 8);
    assert!(
        devices(&plain)
            .iter()
            .all(|d| d.consumes_counters.is_none())
    );
}

#[test]
fn some_gpus_dynamic_and_some_not_share_one_valid_pool() {
    let mut inv = dgx_h100_mig();
    // A GPU with MIG off and no profiles (a GPU without MIG), and one waiting for
    // a mode change, which is offered as nothing.
    inv.gpus[0].mig_mode = None;
    inv.gpus[0].mig_profiles.clear();
    inv.gpus[1].mig_mode = Some(MigMode {
        current: false,
        pending: true,
    });
    let slices = build_slices(&inv, &dynamic("dgx")).unwrap();
    let all = devices(&slices);
    let gpu0 = all.iter().find(|d| d.name == "gpu-0").unwrap();
    assert!(gpu0.consumes_counters.is_none());
    assert!(!all.iter().any(|d| d.name.starts_with("gpu-1")));
    assert!(!all.iter().any(|d| d.name.starts_with("gpu-0-mig")));
    assert_eq!(counter_sets(&slices).len(), 6);
    assert_eq!(all.len(), 1 + 6 * 26);
}

/// A 3g.40gb at memory slices 4..8 of an H100, as discovery reports it.
fn half_of_an_h100() -> crate::inventory::MigDevice {
    crate::inventory::MigDevice {
        uuid: "MIG-11111111-2222-3333-4444-555555555555".to_owned(),
        gpu_instance: 1,
        compute_instance: 0,
        profile: Some("3g.40gb".to_owned()),
        memory_bytes: Some(40448 << 20),
        multiprocessors: Some(60),
        placement: Some(MigPlacement { start: 4, size: 4 }),
        profile_id: Some(9),
    }
}

/// Someone else's instance takes its memory slices out of the GPU's counter set
/// for good: no partition over them, no whole GPU, and the instance itself
/// offered as a MIG device of its own.
#[test]
fn someone_elses_instance_takes_its_slices_for_good() {
    let mut inv = dgx_h100_mig();
    inv.gpus[0].mig_devices = vec![half_of_an_h100()];
    let slices = build_slices(&inv, &dynamic("dgx")).unwrap();
    for slice in &slices {
        validate::validate_slice(slice).unwrap();
    }
    let set = counter_sets(&slices)
        .into_iter()
        .find(|s| s.name == "gpu-0")
        .unwrap();
    let free: Vec<&str> = (0..8)
        .map(|i| value(&set.counters, &format!("memory-slice-{i}")))
        .collect();
    assert_eq!(free, ["1", "1", "1", "1", "0", "0", "0", "0"]);
    let all = devices(&slices);
    let of_gpu0: Vec<&&Device> = all
        .iter()
        .filter(|d| d.name == "gpu-0" || d.name.starts_with("gpu-0-"))
        .collect();
    assert!(!of_gpu0.iter().any(|d| d.name == "gpu-0"), "no whole GPU");
    let theirs = of_gpu0.iter().find(|d| d.name == "gpu-0-mig-1-0").unwrap();
    assert!(theirs.consumes_counters.is_none());
    for d in of_gpu0
        .iter()
        .filter(|d| d.name.starts_with("gpu-0-mig-") && d.name != "gpu-0-mig-1-0")
    {
        let slices: Vec<&String> = d.consumes_counters.as_ref().unwrap()[0]
            .counters
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .collect();
        assert!(
            slices.iter().all(|k| k.as_str() < "memory-slice-4"),
            "{} uses {slices:?}",
            d.name
        );
    }
    // The 3g.40gb and the 4g.40gb at 0 still fit beside it.
    assert!(of_gpu0.iter().any(|d| d.name == "gpu-0-mig-3g-40gb-0"));
    assert!(of_gpu0.iter().any(|d| d.name == "gpu-0-mig-4g-40gb-0"));
    let dynamic = dynamic_devices(&inv, &dynamic("dgx"));
    assert!(!dynamic.iter().any(|d| d.name == "gpu-0"));
    assert!(dynamic.iter().any(|d| d.name == "gpu-0-mig-3g-40gb-0"));
}

/// The plugin's own instances are allocated partitions: the slices are as if
/// the GPU held none.
#[test]
fn own_instances_leave_the_slices_as_they_were() {
    let inv = dgx_h100_mig();
    let before = build_slices(&inv, &dynamic("dgx")).unwrap();
    let mut carved = inv.clone();
    carved.gpus[0].mig_devices = vec![half_of_an_h100()];
    let mut opts = dynamic("dgx");
    opts.own_mig_instances
        .insert((inv.gpus[0].uuid.clone().unwrap(), 4, 4));
    assert_eq!(build_slices(&carved, &opts).unwrap(), before);
    let names = |inv: &crate::inventory::Inventory, opts: &SliceOptions| -> Vec<String> {
        dynamic_devices(inv, opts)
            .into_iter()
            .map(|d| d.name)
            .collect()
    };
    assert_eq!(names(&carved, &opts), names(&inv, &dynamic("dgx")));
}

#[test]
fn a_gpu_holding_mig_devices_is_offered_as_them() {
    let mut inv = dgx_h100_mig();
    inv.gpus[2].mig_devices = vec![crate::inventory::MigDevice {
        uuid: "MIG-11111111-2222-3333-4444-555555555555".to_owned(),
        gpu_instance: 1,
        compute_instance: 0,
        profile: Some("7g.80gb".to_owned()),
        memory_bytes: Some(81152 << 20),
        multiprocessors: Some(132),
        placement: None,
        profile_id: None,
    }];
    let slices = build_slices(&inv, &dynamic("dgx")).unwrap();
    let all = devices(&slices);
    let names: Vec<&str> = all
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| n.starts_with("gpu-2"))
        .collect();
    assert_eq!(names, ["gpu-2-mig-1-0"]);
    assert!(!counter_sets(&slices).iter().any(|s| s.name == "gpu-2"));
}

#[test]
fn profiles_that_cannot_be_published_are_left_out_and_the_rest_kept() {
    let mut gpu = dgx_h100_mig().gpus[0].clone();
    gpu.mig_profiles[1].name = "2g/20gb".to_owned(); // no device name
    gpu.mig_profiles[2].multiprocessors = 200; // more than the 7g profile
    gpu.mig_profiles[3].placements[0].start = 6; // 6 + 4 past 8 slices
    let g = geometry(&gpu).unwrap();
    let profiles: BTreeSet<&str> = g
        .partitions
        .iter()
        .map(|p| p.profile.name.as_str())
        .collect();
    assert_eq!(
        profiles,
        BTreeSet::from(["1g.10gb", "7g.80gb", "1g.10gb+me", "1g.20gb"])
    );

    let mut bare = gpu.clone();
    bare.mig_profiles
        .iter_mut()
        .for_each(|p| p.placements.clear());
    assert!(geometry(&bare).is_none(), "no placement, no counter set");
}

#[test]
fn profile_names_become_dns_label_parts() {
    assert_eq!(profile_label("1g.10gb").as_deref(), Some("1g-10gb"));
    assert_eq!(profile_label("1g.10gb+me").as_deref(), Some("1g-10gb-me"));
    assert_eq!(profile_label("1c.2g.20gb").as_deref(), Some("1c-2g-20gb"));
    assert_eq!(profile_label("7G.80GB").as_deref(), Some("7g-80gb"));
    assert_eq!(profile_label(""), None);
    assert_eq!(profile_label("+"), None);
    assert_eq!(profile_label("1g..5gb"), None);
    assert_eq!(profile_label("1g 5gb"), None);
}

#[test]
fn the_h100s_profiles_are_the_guides() {
    // A guard on the fixture the other tests rest on: 25 placements, and every
    // placement aligned to its size inside eight memory slices.
    let profiles = h100_mig_profiles();
    let placements: usize = profiles.iter().map(|p| p.placements.len()).sum();
    assert_eq!(placements, 25);
    for p in &profiles {
        for pl in &p.placements {
            assert!(
                pl.start % pl.size == 0 && pl.start + pl.size <= 8,
                "{}",
                p.name
            );
        }
    }
}

// The API's limits, each at the limit and one past it, on slices as sent.

fn counter_slice(sets: usize, counters: usize) -> ResourceSlice {
    let mut slices = build_slices(&dgx_h100_mig(), &dynamic("dgx")).unwrap();
    let mut s = slices.pop().unwrap();
    let set = |i: usize| CounterSet {
        name: format!("set-{i}"),
        counters: (0..counters)
            .map(|c| (format!("c-{c}"), count(1)))
            .collect(),
    };
    s.spec.shared_counters = Some((0..sets).map(set).collect());
    s
}

#[test]
fn counter_sets_at_and_past_the_apis_limits() {
    validate::validate_slice(&counter_slice(8, 32)).unwrap();
    assert!(matches!(
        validate::validate_slice(&counter_slice(9, 1)),
        Err(SliceError::TooManyCounterSets {
            count: 9,
            max: 8,
            ..
        })
    ));
    assert!(matches!(
        validate::validate_slice(&counter_slice(1, 33)),
        Err(SliceError::TooManyCounters {
            count: 33,
            max: 32,
            ..
        })
    ));
    assert!(matches!(
        validate::validate_slice(&counter_slice(1, 0)),
        Err(SliceError::NoCounters { .. })
    ));
    let mut bad = counter_slice(1, 1);
    bad.spec.shared_counters.as_mut().unwrap()[0].name = "GPU_0".to_owned();
    assert!(matches!(
        validate::validate_slice(&bad),
        Err(SliceError::CounterName { .. })
    ));
}

#[test]
fn devices_and_counters_never_share_a_slice() {
    let slices = build_slices(&dgx_h100_mig(), &dynamic("dgx")).unwrap();
    let mut mixed = slices[0].clone();
    mixed.spec.shared_counters = slices.last().unwrap().spec.shared_counters.clone();
    assert!(matches!(
        validate::validate_slice(&mixed),
        Err(SliceError::CountersAndDevices { .. })
    ));
}

#[test]
fn consumptions_at_and_past_the_apis_limits() {
    let slices = build_slices(&dgx_h100_mig(), &dynamic("dgx")).unwrap();
    let with = |edit: &dyn Fn(&mut Device)| {
        let mut s = slices.clone();
        edit(&mut s[0].spec.devices.as_mut().unwrap()[0]);
        validate::validate_pool(&s)
    };
    let consumption = |set: &str, n: usize| DeviceCounterConsumption {
        counter_set: set.to_owned(),
        counters: (0..n).map(|i| (memory_slice(i as u32), count(1))).collect(),
        ..Default::default()
    };
    // Two sets, 8 counters each: within the limits.
    with(&|d| {
        d.consumes_counters = Some(vec![consumption("gpu-0", 8), consumption("gpu-1", 8)]);
    })
    .unwrap();
    assert!(matches!(
        with(&|d| {
            d.consumes_counters = Some(vec![
                consumption("gpu-0", 1),
                consumption("gpu-1", 1),
                consumption("gpu-2", 1),
            ]);
        }),
        Err(SliceError::TooManyConsumptions {
            count: 3,
            max: 2,
            ..
        })
    ));
    assert!(matches!(
        with(&|d| {
            d.consumes_counters = Some(vec![consumption("gpu-0", 1), consumption("gpu-0", 2)]);
        }),
        Err(SliceError::DuplicateConsumption { .. })
    ));
    assert!(matches!(
        with(&|d| d.consumes_counters = Some(vec![consumption("gpu-9", 1)])),
        Err(SliceError::UnknownCounterSet { .. })
    ));
    assert!(matches!(
        with(&|d| {
            let mut c = consumption("gpu-0", 1);
            c.counters.insert("encoders".to_owned(), count(1));
            d.consumes_counters = Some(vec![c]);
        }),
        Err(SliceError::UnknownCounter { .. })
    ));
    assert!(matches!(
        with(&|d| {
            let mut c = consumption("gpu-0", 0);
            c.counters = (0..33).map(|i| (format!("c-{i}"), count(1))).collect();
            d.consumes_counters = Some(vec![c]);
        }),
        Err(SliceError::TooManyCounters { count: 33, .. })
    ));
}

#[test]
fn sixty_five_counting_devices_do_not_fit_one_slice() {
    let slices = build_slices(&dgx_h100_mig(), &dynamic("dgx")).unwrap();
    let mut over = slices[0].clone();
    over.spec
        .devices
        .as_mut()
        .unwrap()
        .push(slices[1].spec.devices.as_ref().unwrap()[0].clone());
    assert!(matches!(
        validate::validate_slice(&over),
        Err(SliceError::TooManyDevices {
            count: 65,
            max: 64,
            ..
        })
    ));
}

#[test]
fn a_counter_set_name_used_twice_in_the_pool_is_refused() {
    let mut slices = build_slices(&dgx_h100_mig(), &dynamic("dgx")).unwrap();
    let mut extra = slices.last().unwrap().clone();
    extra.metadata.name = Some("dgx-gpu.topodra.dev-5".to_owned());
    extra.spec.shared_counters.as_mut().unwrap().truncate(1);
    slices.push(extra);
    for s in &mut slices {
        s.spec.pool.resource_slice_count = 6;
    }
    assert!(matches!(
        validate::validate_pool(&slices),
        Err(SliceError::DuplicateCounterSet { .. })
    ));
}

#[test]
fn bytes_per_gpu_with_and_without_partitions() {
    // How much one GPU's partitions add to what the API server stores and sends
    // to every watcher: the slices of the DGX H100 fixture as JSON, per GPU.
    let size = |slices: &[ResourceSlice]| serde_json::to_vec(slices).unwrap().len();
    let per_gpu = |set: AttributeSet| {
        let whole = SliceOptions {
            attributes: set,
            ..SliceOptions::new("dgx")
        };
        let carved = SliceOptions {
            attributes: set,
            ..dynamic("dgx")
        };
        let whole = size(&build_slices(&dgx_h100(), &whole).unwrap()) / 8;
        let carved = size(&build_slices(&dgx_h100_mig(), &carved).unwrap()) / 8;
        println!("{set}: bytes per GPU: whole only {whole}, with partitions {carved}");
        (whole, carved)
    };
    // docs/attributes.md quotes the default's figures ("Dynamic MIG"). Partitions
    // carry no attribute the sets differ in: only the whole GPU's device grows.
    assert_eq!(per_gpu(AttributeSet::Lean), (608, 15_540));
    assert_eq!(per_gpu(AttributeSet::Full), (712, 15_644));
}

#[test]
fn a_taint_on_a_gpu_taints_each_of_its_partitions() {
    let taint = |value: &str| k8s_openapi::api::resource::v1::DeviceTaint {
        key: "gpu.topodra.dev/unhealthy".to_owned(),
        value: Some(value.to_owned()),
        effect: "NoSchedule".to_owned(),
        ..Default::default()
    };
    let mut opts = dynamic("dgx");
    opts.device_taints
        .insert("gpu-3".to_owned(), vec![taint("xid-79")]);
    opts.device_taints
        .insert("gpu-5-mig-1g-10gb-6".to_owned(), vec![taint("own")]);
    let slices = build_slices(&dgx_h100_mig(), &opts).unwrap();
    let all = devices(&slices);
    let of = |prefix: &str| -> Vec<&&Device> {
        all.iter()
            .filter(|d| d.name == prefix || d.name.starts_with(&format!("{prefix}-mig-")))
            .collect()
    };
    let gpu3 = of("gpu-3");
    assert_eq!(gpu3.len(), 26);
    for d in gpu3 {
        let t = d.taints.as_ref().unwrap();
        assert_eq!(t.len(), 1, "{}", d.name);
        assert_eq!(t[0].value.as_deref(), Some("xid-79"), "{}", d.name);
    }
    for d in of("gpu-5") {
        let want = usize::from(d.name == "gpu-5-mig-1g-10gb-6");
        assert_eq!(d.taints.as_ref().map_or(0, Vec::len), want, "{}", d.name);
    }
    // Tainted devices halve no slice below what the counters already did (64).
    validate::validate_pool(&slices).unwrap();
}

/// What the plugin prepares is exactly what the slices publish with counters:
/// every counted device has its instance, whole GPUs their full-size one.
#[test]
fn dynamic_devices_are_the_counted_devices_of_the_slices() {
    let inv = dgx_h100_mig();
    let opts = dynamic("node-a");
    let slices = build_slices(&inv, &opts).unwrap();
    let published: BTreeSet<&str> = devices(&slices)
        .into_iter()
        .filter(|d| d.consumes_counters.is_some())
        .map(|d| d.name.as_str())
        .collect();
    let dynamic = dynamic_devices(&inv, &opts);
    let prepared: BTreeSet<&str> = dynamic.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(prepared, published);

    let whole = dynamic.iter().find(|d| d.name == "gpu-0").unwrap();
    assert_eq!(whole.profile.name, "7g.80gb");
    assert_eq!((whole.placement.start, whole.placement.size), (0, 8));
    let small = dynamic
        .iter()
        .find(|d| d.name == "gpu-0-mig-1g-10gb-6")
        .unwrap();
    assert_eq!(
        (
            small.profile.id,
            small.placement.start,
            small.placement.size
        ),
        (19, 6, 1)
    );
    assert_eq!(small.gpu.uuid, whole.gpu.uuid);

    assert!(dynamic_devices(&inv, &SliceOptions::new("node-a")).is_empty());
}
