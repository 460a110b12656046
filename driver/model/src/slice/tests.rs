use super::*;
use fixtures::{dgx_h100, many, snc};

fn device_names(s: &ResourceSlice) -> Vec<&str> {
    s.spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect()
}

fn sizes(slices: &[ResourceSlice]) -> Vec<usize> {
    slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .collect()
}

fn assert_consistent_pool(slices: &[ResourceSlice], opts: &SliceOptions) {
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(s.spec.pool.generation, opts.pool_generation);
        assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
        assert_eq!(s.spec.pool.name, opts.node_name);
        assert_eq!(s.spec.node_name.as_deref(), Some(opts.node_name.as_str()));
        assert_eq!(s.spec.driver, opts.driver_name);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some(format!("{}-{}-{i}", opts.node_name, opts.driver_name).as_str())
        );
    }
}

#[test]
fn a_dgx_is_one_slice_in_allocation_order() {
    let opts = SliceOptions {
        pool_generation: 7,
        node_uid: Some("6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f".to_owned()),
        ..SliceOptions::new("dgx-01")
    };
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    assert_eq!(slices.len(), 1);
    assert_consistent_pool(&slices, &opts);
    let s = &slices[0];
    assert_eq!(s.metadata.name.as_deref(), Some("dgx-01-gpu.topodra.dev-0"));
    assert_eq!(
        device_names(s),
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[MANAGED_BY_LABEL], "topodra");
    assert_eq!(labels[NODE_LABEL], "dgx-01");
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("v1", "Node", "dgx-01")
    );
    assert_eq!(owner.uid, "6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f");
    assert!(s.spec.all_nodes.is_none() && s.spec.node_selector.is_none());
}

#[test]
fn taints_go_to_their_device_and_shrink_the_slice_limit() {
    let taint = DeviceTaint {
        key: "gpu.topodra.dev/unhealthy".to_owned(),
        value: Some("xid-79".to_owned()),
        effect: "NoSchedule".to_owned(),
        ..Default::default()
    };
    let opts = SliceOptions {
        device_taints: BTreeMap::from([
            ("gpu-3".to_owned(), vec![taint.clone()]),
            // An empty list is no taint, and an unknown device is ignored.
            ("gpu-4".to_owned(), vec![]),
            ("gpu-99".to_owned(), vec![taint.clone()]),
        ]),
        ..SliceOptions::new("dgx-01")
    };
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    let devices = slices[0].spec.devices.as_ref().unwrap();
    let gpu3 = devices.iter().find(|d| d.name == "gpu-3").unwrap();
    assert_eq!(gpu3.taints.as_deref(), Some(&[taint][..]));
    assert!(
        devices
            .iter()
            .filter(|d| d.name != "gpu-3")
            .all(|d| d.taints.is_none())
    );

    // 100 GPUs with one tainted: its slice holds 64 at most.
    let mut opts = SliceOptions::new("big");
    opts.device_taints
        .insert("gpu-0".to_owned(), vec![DeviceTaint::default()]);
    assert_eq!(sizes(&build_slices(&many(100), &opts).unwrap()), [64, 36]);
}

#[test]
fn no_owner_without_a_node_uid() {
    let slices = build_slices(&dgx_h100(), &SliceOptions::new("dgx-01")).unwrap();
    assert!(slices[0].metadata.owner_references.is_none());
}

#[test]
fn building_is_deterministic() {
    let mut scrambled = snc();
    scrambled.gpus.reverse();
    let opts = SliceOptions::new("n");
    assert_eq!(
        build_slices(&snc(), &opts).unwrap(),
        build_slices(&scrambled, &opts).unwrap()
    );
}

#[test]
fn three_hundred_gpus_split_by_attribute_form() {
    let inv = many(300);
    let opts = SliceOptions::new("big");
    let slices = build_slices(&inv, &opts).unwrap();
    assert_eq!(sizes(&slices), [128, 128, 44]);
    assert_consistent_pool(&slices, &opts);

    let opts = SliceOptions {
        numa_node_format: NumaNodeFormat::List,
        ..opts
    };
    let slices = build_slices(&inv, &opts).unwrap();
    assert_eq!(sizes(&slices), [64, 64, 64, 64, 44]);
    assert_consistent_pool(&slices, &opts);

    // Every GPU exactly once, NUMA node 0 before NUMA node 1.
    let names: Vec<&str> = slices.iter().flat_map(device_names).collect();
    assert_eq!(names.len(), 300);
    assert_eq!(names[0], "gpu-0");
    assert_eq!(names[149], "gpu-298");
    assert_eq!(names[150], "gpu-1");
}

#[test]
fn a_cap_forces_smaller_slices() {
    let opts = SliceOptions {
        max_devices_per_slice: Some(3),
        pool_generation: 42,
        ..SliceOptions::new("dgx-01")
    };
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    assert_eq!(sizes(&slices), [3, 3, 2]);
    assert_consistent_pool(&slices, &opts);
    assert_eq!(device_names(&slices[1]), ["gpu-3", "gpu-4", "gpu-5"]);

    let opts = SliceOptions {
        max_devices_per_slice: Some(0),
        ..opts
    };
    assert_eq!(
        build_slices(&dgx_h100(), &opts).unwrap_err(),
        SliceError::ZeroDevicesPerSlice
    );
}

#[test]
fn no_gpus_is_one_empty_slice() {
    let opts = SliceOptions::new("cpu-only");
    let slices = build_slices(&Inventory::default(), &opts).unwrap();
    assert_eq!(slices.len(), 1);
    assert_consistent_pool(&slices, &opts);
    assert!(slices[0].spec.devices.is_none());
    let json = serde_json::to_value(&slices[0]).unwrap();
    assert!(json["spec"].get("devices").is_none(), "{json}");
    assert_eq!(json["spec"]["pool"]["resourceSliceCount"], 1);
}

#[test]
fn to_list_is_a_kubernetes_list() {
    let opts = SliceOptions {
        max_devices_per_slice: Some(5),
        ..SliceOptions::new("dgx-01")
    };
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    let list = to_list(&slices);
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    for item in items {
        assert_eq!(item["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(item["kind"], "ResourceSlice");
        assert_eq!(item["spec"]["driver"], "gpu.topodra.dev");
        assert_eq!(item["spec"]["nodeName"], "dgx-01");
        assert_eq!(item["spec"]["pool"]["name"], "dgx-01");
        assert_eq!(item["spec"]["pool"]["resourceSliceCount"], 2);
    }
    let gpu0 = &items[0]["spec"]["devices"][0];
    assert_eq!(gpu0["name"], "gpu-0");
    assert_eq!(
        gpu0["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
        "0000:18:00.0"
    );
    assert_eq!(
        gpu0["attributes"]["resource.kubernetes.io/numaNode"]["int"],
        0
    );
    assert_eq!(gpu0["attributes"]["driverVersion"]["version"], "550.90.7");
    assert_eq!(gpu0["capacity"]["memory"]["value"], "81559Mi");

    // Items round-trip through k8s-openapi unchanged.
    let back: ResourceSlice = serde_json::from_value(items[1].clone()).unwrap();
    assert_eq!(back, slices[1]);
}

#[test]
fn serialized_size_per_device_stays_small() {
    let opts = SliceOptions {
        node_uid: Some("6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f".to_owned()),
        ..SliceOptions::new("dgx-01")
    };
    for format in [NumaNodeFormat::Int, NumaNodeFormat::List] {
        let opts = SliceOptions {
            numa_node_format: format,
            ..opts.clone()
        };
        let slices = build_slices(&dgx_h100(), &opts).unwrap();
        let bytes = serde_json::to_vec(&slices[0]).unwrap().len();
        let per_device = bytes / 8;
        println!("{format}: {bytes} bytes for 8 devices, {per_device} per device");
        assert!(per_device < 1024, "{per_device} bytes per device");
    }
}

#[test]
fn long_names_are_truncated_with_a_stable_hash() {
    let node = format!("{}.example.com", "n".repeat(240));
    let a = slice_name(&node, DEFAULT_DRIVER_NAME, 0);
    let b = slice_name(&node, DEFAULT_DRIVER_NAME, 1);
    assert_eq!(a.len(), 253);
    assert!(a.ends_with("-0") && b.ends_with("-1"));
    assert_eq!(a[..a.len() - 2], b[..b.len() - 2]);
    assert_eq!(a, slice_name(&node, DEFAULT_DRIVER_NAME, 0));
    // Same prefix, different node: different names.
    let other = format!("{}.example.org", "n".repeat(240));
    assert_ne!(a, slice_name(&other, DEFAULT_DRIVER_NAME, 0));

    let opts = SliceOptions::new(node);
    let slices = build_slices(&dgx_h100(), &opts).unwrap();
    assert_eq!(slices[0].metadata.name.as_deref(), Some(a.as_str()));
    // Too long for a label value, so only the managed-by label remains.
    assert_eq!(slices[0].metadata.labels.as_ref().unwrap().len(), 1);
}

#[test]
fn numa_node_format_parses_prints_and_serializes() {
    assert_eq!("int".parse::<NumaNodeFormat>(), Ok(NumaNodeFormat::Int));
    assert_eq!("List".parse::<NumaNodeFormat>(), Ok(NumaNodeFormat::List));
    assert!("ints".parse::<NumaNodeFormat>().is_err());
    assert_eq!(NumaNodeFormat::default(), NumaNodeFormat::Int);
    for f in [NumaNodeFormat::Int, NumaNodeFormat::List] {
        assert_eq!(f.to_string().parse::<NumaNodeFormat>(), Ok(f));
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(json, format!("\"{f}\""));
        assert_eq!(serde_json::from_str::<NumaNodeFormat>(&json).unwrap(), f);
    }
}

#[test]
fn an_alias_in_the_drivers_own_domain_refuses_the_pool() {
    let opts = SliceOptions {
        numa_node_aliases: vec!["gpu.topodra.dev/numaNode".parse().unwrap()],
        ..SliceOptions::new("dgx-01")
    };
    assert!(matches!(
        build_slices(&dgx_h100(), &opts),
        Err(SliceError::NumaNodeAlias(
            NumaNodeAliasError::OwnDomain { .. }
        ))
    ));
}
