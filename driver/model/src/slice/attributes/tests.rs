use super::*;
use crate::slice::fixtures::{addr, dgx_h100, int, snc, string, version};

fn opts(format: NumaNodeFormat) -> SliceOptions {
    SliceOptions {
        numa_node_format: format,
        ..SliceOptions::new("node-a")
    }
}

#[test]
fn every_attribute_of_a_known_gpu() {
    let inv = dgx_h100();
    let gpu = &inv.gpus[5];
    let got = device_attributes(gpu, &inv, &opts(NumaNodeFormat::Int));
    let want: BTreeMap<String, DeviceAttribute> = [
        (PCI_BUS_ID, string("0000:ab:00.0")),
        (PCIE_ROOT, string("pci0000:a8")),
        (NUMA_NODE, int(1)),
        (TYPE, string("gpu")),
        (UUID, string("GPU-7f1c2b3a-0000-4e5f-8a9b-000000000005")),
        (MINOR, int(5)),
        (PRODUCT_NAME, string("NVIDIA H100 80GB HBM3")),
        (BRAND, string("Nvidia")),
        (ARCHITECTURE, string("Hopper")),
        (CUDA_COMPUTE_CAPABILITY, version("9.0.0")),
        (DRIVER_VERSION, version("550.90.7")),
        (CUDA_DRIVER_VERSION, version("12.4.0")),
        (SOCKET, int(1)),
        (PCIE_SWITCH, string("0000:a9:00.0")),
        (NVLINK_DOMAIN, string("nvls-0")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(got, want);

    let cap = device_capacity(gpu);
    assert_eq!(cap.len(), 1);
    assert_eq!(cap[MEMORY].value.0, "81559Mi");
    assert!(cap[MEMORY].request_policy.is_none());
}

#[test]
fn memory_numa_node_is_published_for_c2c_gpus() {
    let mut inv = dgx_h100();
    inv.gpus[0].memory_numa_node = Some(4);
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[MEMORY_NUMA_NODE], int(4));
}

#[test]
fn unknown_values_are_omitted() {
    let inv = Inventory::default();
    let gpu = Gpu::at(addr("0000:18:00.0"));
    for format in [NumaNodeFormat::Int, NumaNodeFormat::List] {
        let got = device_attributes(&gpu, &inv, &opts(format));
        let names: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(names, [PCI_BUS_ID, TYPE]);
    }
    assert!(device_capacity(&gpu).is_empty());
}

#[test]
fn socket_falls_back_to_the_numa_nodes_socket() {
    let mut inv = dgx_h100();
    inv.gpus[6].socket = None;
    let got = device_attributes(&inv.gpus[6], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[SOCKET], int(1));

    inv.gpus[6].numa_node = None;
    let got = device_attributes(&inv.gpus[6], &inv, &opts(NumaNodeFormat::Int));
    assert!(!got.contains_key(SOCKET));
    assert!(!got.contains_key(NUMA_NODE));
}

#[test]
fn list_form_puts_the_own_node_first() {
    let inv = snc();
    let ints = |g: &Gpu| {
        device_attributes(g, &inv, &opts(NumaNodeFormat::List))
            .remove(NUMA_NODE)
            .unwrap()
    };
    let list = |v: &[i64]| DeviceAttribute {
        ints: Some(v.to_vec()),
        ..Default::default()
    };
    assert_eq!(ints(&inv.gpus[1]), list(&[1, 0, 2, 3]));
    assert_eq!(ints(&inv.gpus[6]), list(&[6, 4, 5, 7]));

    // Discovery's order is not trusted to lead with the own node.
    let mut g = inv.gpus[2].clone();
    g.same_socket_numa_nodes = vec![0, 1, 2, 3];
    assert_eq!(ints(&g), list(&[2, 0, 1, 3]));

    g.same_socket_numa_nodes.clear();
    assert_eq!(ints(&g), list(&[2]));

    // The int form ignores the list.
    let got = device_attributes(&inv.gpus[1], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[NUMA_NODE], int(1));
}

#[test]
fn driver_versions_normalize_to_semver() {
    for (raw, want) in [
        ("550.90.07", "550.90.7"),
        ("560.35", "560.35.0"),
        ("535", "535.0.0"),
        (" 570.124.06\n", "570.124.6"),
        ("0.0.0", "0.0.0"),
        ("00.01.000", "0.1.0"),
    ] {
        assert_eq!(normalize_version(raw).as_deref(), Some(want), "{raw:?}");
    }
    for bad in [
        "",
        "550.90.07.1",
        "550..1",
        "r550",
        "550.90.07-beta",
        "5 50",
        "abc",
        "99999999999999999999.1",
    ] {
        assert_eq!(normalize_version(bad), None, "{bad:?}");
    }
}

#[test]
fn a_driver_version_that_cannot_be_normalized_is_omitted() {
    let mut inv = dgx_h100();
    inv.driver_version = Some("550.90.07-custom".to_owned());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert!(!got.contains_key(DRIVER_VERSION));
    inv.driver_version = Some("560.35".to_owned());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[DRIVER_VERSION], version("560.35.0"));
}

#[test]
fn strings_the_api_would_refuse_are_omitted() {
    let mut inv = dgx_h100();
    inv.gpus[0].product_name = Some("N".repeat(65));
    inv.gpus[0].brand = Some(String::new());
    inv.gpus[0].nvlink_domain = Some("d".repeat(64));
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert!(!got.contains_key(PRODUCT_NAME));
    assert!(!got.contains_key(BRAND));
    assert_eq!(got[NVLINK_DOMAIN], string(&"d".repeat(64)));
}

fn mig_of(gpu: &Gpu) -> AllocatableDevice {
    AllocatableDevice {
        gpu: gpu.clone(),
        mig: Some(crate::inventory::MigDevice {
            uuid: "MIG-6b8c3a9e-5c47-5d2b-9d5b-6f0e8a3c1d20".into(),
            gpu_instance: 1,
            compute_instance: 0,
            profile: Some("3g.40gb".into()),
            memory_bytes: Some(40_192 << 20),
            multiprocessors: Some(60),
            placement: None,
            profile_id: None,
        }),
    }
}

#[test]
fn schema_stays_within_the_per_device_limit() {
    let inv = dgx_h100();
    let mut gpu = inv.gpus[0].clone();
    gpu.memory_numa_node = Some(2);
    gpu.nvlink_clique = Some(format!("{}.{}", "c".repeat(36), u32::MAX));
    let n = device_attributes(&gpu, &inv, &opts(NumaNodeFormat::List)).len()
        + device_capacity(&gpu).len();
    assert_eq!(n, 18);
    let mig = mig_of(&gpu);
    let m = allocatable_attributes(&mig, &inv, &opts(NumaNodeFormat::List)).len()
        + allocatable_capacity(&mig).len();
    assert_eq!(m, 23);
    assert_eq!(
        n.max(m),
        crate::slice::aliases::MAX_OWN_ENTRIES,
        "the alias budget counts the fullest device"
    );

    // With every alias that fits, the fullest device is at the limit, not over it.
    let o = SliceOptions {
        numa_node_aliases: (0..crate::slice::MAX_NUMA_NODE_ALIASES)
            .map(|i| format!("example.com/numa{i}").parse().unwrap())
            .collect(),
        ..opts(NumaNodeFormat::List)
    };
    let full = allocatable_attributes(&mig, &inv, &o).len() + allocatable_capacity(&mig).len();
    assert_eq!(full, crate::slice::validate::MAX_ATTRIBUTES);
}

#[test]
fn aliases_carry_the_numa_node_in_the_same_form() {
    let inv = snc();
    for format in [NumaNodeFormat::Int, NumaNodeFormat::List] {
        let o = SliceOptions {
            numa_node_aliases: vec!["dra.net/numaNode".parse().unwrap()],
            ..opts(format)
        };
        let got = device_attributes(&inv.gpus[0], &inv, &o);
        assert_eq!(got["dra.net/numaNode"], got[NUMA_NODE], "{format}");
    }
    // A GPU whose NUMA node is unknown gets neither name.
    let mut gpu = inv.gpus[0].clone();
    gpu.numa_node = None;
    let o = SliceOptions {
        numa_node_aliases: vec!["dra.net/numaNode".parse().unwrap()],
        ..opts(NumaNodeFormat::Int)
    };
    let got = device_attributes(&gpu, &inv, &o);
    assert!(!got.contains_key(NUMA_NODE) && !got.contains_key("dra.net/numaNode"));
}

#[test]
fn mig_devices_carry_their_own_identity_and_the_parents_topology() {
    let inv = dgx_h100();
    let gpu = &inv.gpus[0];
    let whole = device_attributes(gpu, &inv, &opts(NumaNodeFormat::Int));
    let got = allocatable_attributes(&mig_of(gpu), &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(got[TYPE], string("mig"));
    assert_eq!(
        got[UUID],
        string("MIG-6b8c3a9e-5c47-5d2b-9d5b-6f0e8a3c1d20")
    );
    assert_eq!(got[PROFILE], string("3g.40gb"));
    assert_eq!(got[PARENT_UUID], whole[UUID]);
    assert_eq!(got[PARENT_MINOR], whole[MINOR]);
    assert_eq!(got[GPU_INSTANCE].int, Some(1));
    assert_eq!(got[COMPUTE_INSTANCE].int, Some(0));
    assert!(!got.contains_key(MINOR));
    for topo in [
        NUMA_NODE,
        PCIE_ROOT,
        PCI_BUS_ID,
        SOCKET,
        PRODUCT_NAME,
        DRIVER_VERSION,
    ] {
        assert_eq!(got.get(topo), whole.get(topo), "{topo}");
    }
    let cap = allocatable_capacity(&mig_of(gpu));
    assert_eq!(cap[MEMORY].value.0, "40192Mi");
    assert_eq!(cap[MULTIPROCESSORS].value.0, "60");
}

#[test]
fn clique_is_published_when_known() {
    let mut inv = dgx_h100();
    inv.gpus[0].nvlink_clique = Some("9d3c0b8e-3d0c-4c1e-9a46-2b1f0c7e5a11.4".into());
    let got = device_attributes(&inv.gpus[0], &inv, &opts(NumaNodeFormat::Int));
    assert_eq!(
        got[NVLINK_CLIQUE],
        string("9d3c0b8e-3d0c-4c1e-9a46-2b1f0c7e5a11.4")
    );
    let other = device_attributes(&inv.gpus[1], &inv, &opts(NumaNodeFormat::Int));
    assert!(!other.contains_key(NVLINK_CLIQUE));
}
