//! Discovery of every shipped machine profile through the real `nvml-wrapper` on the
//! fake NVML library and the real `hwlocality` on the profile's hwloc topology.
//!
//! Expectations are written from the machines' public layouts (which GPU sits on
//! which NUMA node and socket, which GPUs share a PCIe switch or an NVLink fabric),
//! not read back from the profiles, so a wrong profile fails here too.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use topodra_fake_nvml::{Profile, hwloc_xml, install, profiles_dir};
use topodra_model::{Inventory, NumaKind};
use topodra_node::discovery::{self, DiscoveryConfig, DiscoveryError, NvmlPolicy, TopologyInput};

/// Installs the fake NVML with the named profile in a temp dir and discovers the machine.
fn discover_profile(
    name: &str,
    policy: NvmlPolicy,
) -> (tempfile::TempDir, Result<Inventory, DiscoveryError>) {
    let yaml = std::fs::read_to_string(profiles_dir().join(format!("{name}.yaml"))).unwrap();
    discover_yaml(&yaml, policy)
}

fn discover_yaml(
    yaml: &str,
    policy: NvmlPolicy,
) -> (tempfile::TempDir, Result<Inventory, DiscoveryError>) {
    let dir = tempfile::tempdir().unwrap();
    let lib = install(dir.path(), yaml);
    let xml = dir.path().join("topology.xml");
    let profile = Profile::from_yaml_str(yaml).unwrap();
    std::fs::write(&xml, hwloc_xml::render(&profile)).unwrap();
    let mut config = DiscoveryConfig::default();
    config.nvml_lib = Some(lib);
    config.nvml = policy;
    config.topology = TopologyInput::HwlocXml(xml);
    config.sysfs_root = PathBuf::from("/nonexistent");
    let result = discovery::discover(&config);
    (dir, result)
}

fn inventory(name: &str) -> Inventory {
    let (_dir, inv) = discover_profile(name, NvmlPolicy::Required);
    inv.unwrap()
}

/// Per GPU in index order: (NUMA node, same-socket NUMA list, socket).
fn numa_layout(inv: &Inventory) -> Vec<(Option<u32>, Vec<u32>, Option<u32>)> {
    let mut gpus = inv.gpus.clone();
    gpus.sort_by_key(|g| g.index);
    gpus.iter()
        .map(|g| (g.numa_node, g.same_socket_numa_nodes.clone(), g.socket))
        .collect()
}

fn by_index(inv: &Inventory, index: u32) -> &topodra_model::Gpu {
    inv.gpus.iter().find(|g| g.index == Some(index)).unwrap()
}

#[test]
fn dgx_h100_four_gpus_per_socket_one_nvswitch_fabric() {
    let inv = inventory("dgx-h100");
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    assert_eq!(inv.gpus.len(), 8);
    let want: Vec<_> = (0..8u32)
        .map(|i| (Some(i / 4), vec![i / 4], Some(i / 4)))
        .collect();
    assert_eq!(numa_layout(&inv), want);
    let buses: Vec<String> = (0..8)
        .map(|i| by_index(&inv, i).pci_bus_id.to_string())
        .collect();
    assert_eq!(
        buses,
        [
            "0000:18:00.0",
            "0000:2a:00.0",
            "0000:3a:00.0",
            "0000:5d:00.0",
            "0000:9a:00.0",
            "0000:ab:00.0",
            "0000:ba:00.0",
            "0000:db:00.0"
        ]
    );
    for gpu in &inv.gpus {
        assert_eq!(gpu.product_name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(gpu.architecture.as_deref(), Some("Hopper"));
        assert_eq!(gpu.cuda_compute_capability.unwrap().to_string(), "9.0");
        assert_eq!(gpu.memory_bytes, Some(81559 << 20));
        assert_eq!(gpu.minor, gpu.index);
        // Every GPU has its own PCIe switch (shared with its NIC, not with a GPU).
        assert_eq!(gpu.pcie_switch, None);
        assert_eq!(gpu.nvlink_domain.as_deref(), Some("nvl0"));
        assert_eq!(gpu.nvlink_peers.len(), 7);
        assert!(gpu.pcie_root.is_some());
    }
    let roots: std::collections::BTreeSet<_> = inv.gpus.iter().map(|g| g.pcie_root).collect();
    assert_eq!(roots.len(), 8, "each GPU under its own root complex");
    assert_eq!(inv.driver_version.as_deref(), Some("550.90.07"));
}

#[test]
fn dgx_a100_nps4_pairs_share_switches() {
    let inv = inventory("dgx-a100");
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let numa: Vec<Option<u32>> = numa_layout(&inv).into_iter().map(|l| l.0).collect();
    let want = [3, 3, 1, 1, 7, 7, 5, 5].map(Some);
    assert_eq!(numa, want, "NUMA affinity of the DGX A100 user guide");
    // NPS4: the three other nodes of the socket are equally near.
    assert_eq!(by_index(&inv, 0).same_socket_numa_nodes, vec![3, 0, 1, 2]);
    assert_eq!(by_index(&inv, 6).same_socket_numa_nodes, vec![5, 4, 6, 7]);
    for pair in [[0, 1], [2, 3], [4, 5], [6, 7]] {
        let a = by_index(&inv, pair[0]);
        let b = by_index(&inv, pair[1]);
        assert!(a.pcie_switch.is_some());
        assert_eq!(a.pcie_switch, b.pcie_switch, "GPUs {pair:?} share a switch");
        assert_eq!(a.pcie_root, b.pcie_root);
    }
    assert_ne!(by_index(&inv, 0).pcie_switch, by_index(&inv, 2).pcie_switch);
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.nvlink_domain.as_deref() == Some("nvl0"))
    );
    assert_eq!(inv.numa_nodes.len(), 8);
}

#[test]
fn l40s_pcie_switches_and_no_nvlink() {
    let inv = inventory("l40s-pcie");
    assert_eq!(
        numa_layout(&inv).iter().filter(|l| l.0 == Some(0)).count(),
        4
    );
    for pair in [[0, 1], [2, 3], [4, 5], [6, 7]] {
        let (a, b) = (by_index(&inv, pair[0]), by_index(&inv, pair[1]));
        assert!(a.pcie_switch.is_some());
        assert_eq!(a.pcie_switch, b.pcie_switch);
        assert_eq!(a.socket, b.socket);
    }
    let switches: std::collections::BTreeSet<_> = inv.gpus.iter().map(|g| g.pcie_switch).collect();
    assert_eq!(switches.len(), 4, "two switches per socket");
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.nvlink_domain.is_none() && g.nvlink_peers.is_empty())
    );
    assert_eq!(by_index(&inv, 0).architecture.as_deref(), Some("Ada"));
}

#[test]
fn snc4_lists_the_whole_socket_and_nvlink_bridges_pair_gpus() {
    let inv = inventory("snc4-xeon");
    let layout = numa_layout(&inv);
    for (i, (numa, list, socket)) in layout.iter().enumerate() {
        let i = i as u32;
        assert_eq!(*numa, Some(i), "one GPU per sub-NUMA cluster");
        assert_eq!(*socket, Some(i / 4));
        let mut siblings: Vec<u32> = (i / 4 * 4..i / 4 * 4 + 4).filter(|n| *n != i).collect();
        siblings.insert(0, i);
        assert_eq!(
            list, &siblings,
            "own node first, then the socket's other clusters"
        );
    }
    let domains: Vec<Option<String>> = (0..8)
        .map(|i| by_index(&inv, i).nvlink_domain.clone())
        .collect();
    assert_eq!(domains[0], domains[1]);
    assert_eq!(domains[2], domains[3]);
    assert_ne!(domains[0], domains[2]);
    assert_ne!(domains[5], domains[6]);
    assert_eq!(
        by_index(&inv, 0).nvlink_peers,
        vec![by_index(&inv, 1).pci_bus_id]
    );
}

#[test]
fn gb200_gpu_memory_is_its_own_numa_node() {
    let inv = inventory("gb200");
    assert_eq!(inv.gpus.len(), 4);
    let gpu_mem: Vec<_> = inv
        .numa_nodes
        .iter()
        .filter(|n| n.kind == NumaKind::GpuMemory)
        .collect();
    assert_eq!(gpu_mem.len(), 4);
    assert!(gpu_mem.iter().all(|n| n.cpus.is_empty()));
    for gpu in &inv.gpus {
        let own = gpu.memory_numa_node.unwrap();
        assert!(gpu_mem.iter().any(|n| n.id == own));
        // Attached to its Grace's CPU node; GPU memory nodes are never siblings.
        assert_eq!(gpu.numa_node, gpu.socket);
        assert_eq!(gpu.same_socket_numa_nodes, vec![gpu.numa_node.unwrap()]);
        assert_ne!(
            gpu.pci_bus_id.domain, 0,
            "Grace root complexes have their own domains"
        );
        assert_eq!(gpu.nvlink_domain.as_deref(), Some("nvl0"));
    }
}

#[test]
fn empty_node_publishes_an_empty_pool() {
    let inv = inventory("empty");
    assert!(inv.gpus.is_empty());
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
}

#[test]
fn nvml_init_failure_is_a_clear_error_or_a_documented_fallback() {
    let (_dir, result) = discover_profile("init-failure", NvmlPolicy::Required);
    let err = result.unwrap_err();
    assert!(matches!(err, DiscoveryError::NvmlInit(_)), "{err:?}");
    assert!(err.to_string().contains("kernel module"), "{err}");

    // A DGX H100 whose kernel module is not loaded: without NVML the GPUs are still
    // listed from the topology, bare.
    let yaml = std::fs::read_to_string(profiles_dir().join("dgx-h100.yaml")).unwrap();
    let (_dir, result) = discover_yaml(
        &format!("{yaml}\ninit_error: DRIVER_NOT_LOADED\n"),
        NvmlPolicy::Optional,
    );
    let inv = result.unwrap();
    assert_eq!(inv.gpus.len(), 8);
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.uuid.is_none() && g.numa_node.is_some())
    );
    assert!(
        inv.warnings[0].contains("NVML failed to initialize"),
        "{:?}",
        inv.warnings
    );
}

/// The DGX H100 topology with NVML required from `lib`.
fn discover_h100_with_nvml(lib: PathBuf) -> Result<Inventory, DiscoveryError> {
    let mut config = DiscoveryConfig::default();
    config.nvml_lib = Some(lib);
    config.nvml = NvmlPolicy::Required;
    config.topology = TopologyInput::HwlocXml(profiles_dir().join("dgx-h100.hwloc.xml"));
    config.sysfs_root = PathBuf::from("/nonexistent");
    discovery::discover(&config)
}

#[test]
fn missing_nvml_library_names_the_path() {
    let err = discover_h100_with_nvml(PathBuf::from("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
    assert!(
        matches!(err, DiscoveryError::NvmlLibraryMissing { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
        "{err}"
    );
}

#[test]
fn a_library_that_is_not_nvml_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let not_nvml = dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&not_nvml, b"not an ELF file").unwrap();
    let err = discover_h100_with_nvml(not_nvml).unwrap_err();
    assert!(
        matches!(err, DiscoveryError::NvmlLibraryMissing { .. }),
        "{err:?}"
    );
}

#[test]
fn gpus_seen_by_only_one_source_follow_the_documented_rules() {
    let inv = inventory("mismatch");
    let (hwloc_hidden, nvml_hidden): (Vec<_>, Vec<_>) = (
        inv.warnings
            .iter()
            .filter(|w| w.contains("visible to NVML but not in the hwloc topology"))
            .collect(),
        inv.warnings
            .iter()
            .filter(|w| w.contains("NVML does not report it"))
            .collect(),
    );
    assert_eq!(hwloc_hidden.len(), 1, "{:?}", inv.warnings);
    assert_eq!(nvml_hidden.len(), 1, "{:?}", inv.warnings);
    // Published without topology, identity intact.
    let bare: Vec<_> = inv.gpus.iter().filter(|g| g.numa_node.is_none()).collect();
    assert_eq!(bare.len(), 1);
    assert!(bare[0].uuid.is_some() && bare[0].pcie_root.is_none());
    // The GPU NVML does not report is not published at all.
    assert!(inv.gpus.iter().all(|g| g.uuid.is_some()));
}

#[test]
fn nvswitch_placeholder_addresses_still_make_one_fabric() {
    // NVML reports FFFFFFFF:FF:FF.0 for every NVSwitch link on this board; the remote
    // device type says they are switches.
    let inv = inventory("hgx-h100-placeholder");
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    assert_eq!(inv.gpus.len(), 8);
    for gpu in &inv.gpus {
        assert_eq!(
            gpu.nvlink_domain.as_deref(),
            Some("nvl0"),
            "{}",
            gpu.pci_bus_id
        );
        assert_eq!(gpu.nvlink_peers.len(), 7);
    }
    // Same answer as the board whose switches report their own addresses.
    let real = inventory("dgx-h100");
    let domains = |inv: &Inventory| {
        inv.gpus
            .iter()
            .map(|g| g.nvlink_domain.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(domains(&inv), domains(&real));
}

#[test]
fn gb200_gpus_carry_their_nvl72_clique() {
    let inv = inventory("gb200");
    for gpu in &inv.gpus {
        assert_eq!(
            gpu.nvlink_clique.as_deref(),
            Some("6f1d2c3b-4a59-4e8d-9c7b-1a2b3c4d5e6f.32766"),
            "{}",
            gpu.pci_bus_id
        );
    }
    for name in ["dgx-h100", "dgx-a100", "l40s-pcie"] {
        assert!(
            inventory(name)
                .gpus
                .iter()
                .all(|g| g.nvlink_clique.is_none()),
            "{name} has no multi-node fabric"
        );
    }
}

#[test]
fn memory_numa_node_only_on_the_coherent_profile() {
    for name in ["dgx-h100", "dgx-a100", "l40s-pcie", "snc4-xeon"] {
        assert!(
            inventory(name)
                .gpus
                .iter()
                .all(|g| g.memory_numa_node.is_none()),
            "{name}"
        );
    }
    // NVML answering nvmlDeviceGetNumaNodeId with a CPU node on a PCIe machine does
    // not make it a memory node of the GPU.
    let yaml = std::fs::read_to_string(profiles_dir().join("dgx-h100.yaml"))
        .unwrap()
        .replace(
            "    mig: {current: false, pending: false}",
            "    mig: {current: false, pending: false}\n    numa_node_id: 0",
        );
    let (_dir, inv) = discover_yaml(&yaml, NvmlPolicy::Required);
    let inv = inv.unwrap();
    assert_eq!(inv.gpus.len(), 8);
    assert!(inv.gpus.iter().all(|g| g.memory_numa_node.is_none()));
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
}

#[test]
fn dgx_a100_mig_offers_mig_devices_and_nothing_for_the_pending_gpu() {
    let inv = inventory("dgx-a100-mig");
    assert_eq!(inv.gpus.len(), 8, "the inventory keeps every GPU");
    assert_eq!(inv.warnings.len(), 1, "{:?}", inv.warnings);
    assert!(
        inv.warnings[0]
            .contains("MIG mode change pending (now disabled, enabled after a GPU reset)"),
        "{}",
        inv.warnings[0]
    );
    let offered = inv.allocatable();
    let names: Vec<String> = offered.iter().map(|d| d.name()).collect();
    let gpu0: Vec<&String> = names.iter().filter(|n| n.starts_with("gpu-0-")).collect();
    let want: Vec<String> = (7..=13).map(|gi| format!("gpu-0-mig-{gi}-0")).collect();
    assert_eq!(
        gpu0,
        want.iter().collect::<Vec<_>>(),
        "7 x 1g.5gb in GPU instances 7-13"
    );
    let gpu1: Vec<(String, Option<String>, Option<u64>)> = offered
        .iter()
        .filter(|d| d.gpu.minor == Some(1))
        .map(|d| {
            let m = d.mig.as_ref().unwrap();
            (d.name(), m.profile.clone(), m.memory_bytes.map(|b| b >> 20))
        })
        .collect();
    assert_eq!(
        gpu1,
        [
            ("gpu-1-mig-2-0".into(), Some("3g.20gb".into()), Some(20096)),
            ("gpu-1-mig-4-0".into(), Some("2g.10gb".into()), Some(9984)),
            ("gpu-1-mig-7-0".into(), Some("1g.5gb".into()), Some(4864)),
        ]
    );
    assert!(
        !names.iter().any(|n| n.starts_with("gpu-2")),
        "pending GPU offered: {names:?}"
    );
    let whole: Vec<&String> = names.iter().filter(|n| !n.contains("-mig-")).collect();
    assert_eq!(
        whole,
        ["gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
    // MIG devices keep the parent's place in the machine.
    for d in offered.iter().filter(|d| d.mig.is_some()) {
        assert!(d.gpu.numa_node.is_some() && d.gpu.pcie_root.is_some());
        assert!(d.mig.as_ref().unwrap().uuid.starts_with("MIG-"));
        assert!(d.mig.as_ref().unwrap().multiprocessors.is_some());
    }
}

#[test]
fn lost_gpus_are_not_published_and_are_named() {
    // 0000:9b:00.0 is lost before NVML opens it; 0000:9a:00.0 only 1.5 s after init,
    // so a discovery right after start still sees it.
    let inv = inventory("lost-gpu");
    let buses: Vec<String> = inv.gpus.iter().map(|g| g.pci_bus_id.to_string()).collect();
    assert_eq!(buses, ["0000:18:00.0", "0000:19:00.0", "0000:9a:00.0"]);
    assert!(
        inv.warnings
            .iter()
            .any(|w| w.contains("is lost (NVML_ERROR_GPU_IS_LOST")),
        "{:?}",
        inv.warnings
    );
    assert!(
        inv.warnings
            .iter()
            .any(|w| w.contains("0000:9b:00.0") && w.contains("lost")),
        "the warning names the lost GPU's bus id: {:?}",
        inv.warnings
    );
    assert!(inv.unjoined.is_empty(), "a lost GPU is no join failure");
}

/// dgx-h100 with every GPU in MIG mode and no MIG devices yet: NVML's profile
/// table and placements reach the inventory exactly as the MIG User Guide lists
/// them for the H100 80GB (the model's fixture, from the same table), and dynamic
/// MIG publishes them as valid slices. With MIG off nothing is read.
#[test]
fn gpus_in_mig_mode_carry_their_profiles_and_placements() {
    use topodra_model::slice::{DynamicMig, SliceOptions, build_slices, fixtures};

    let off = std::fs::read_to_string(profiles_dir().join("dgx-h100.yaml")).unwrap();
    let on = off.replace(
        "    mig: {current: false, pending: false}",
        "    mig: {current: true, pending: true}",
    );
    assert_ne!(on, off);
    let (_dir, inv) = discover_yaml(&on, NvmlPolicy::Required);
    let inv = inv.unwrap();
    assert_eq!(inv.gpus.len(), 8);
    for g in &inv.gpus {
        assert_eq!(
            g.mig_profiles,
            fixtures::h100_mig_profiles(),
            "{}",
            g.pci_bus_id
        );
    }
    let mut opts = SliceOptions::new("dgx");
    opts.dynamic_mig = DynamicMig::All;
    let slices = build_slices(&inv, &opts).unwrap();
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(devices, 8 * 26);

    let (_dir, inv) = discover_yaml(&off, NvmlPolicy::Required);
    assert!(inv.unwrap().gpus.iter().all(|g| g.mig_profiles.is_empty()));
}
