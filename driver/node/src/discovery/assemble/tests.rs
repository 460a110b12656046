use super::*;
use crate::discovery::LostGpu;
use topodra_model::PciAddress;
use topodra_model::inventory::{DistanceMatrix, MigMode, NumaNode};
use topodra_model::topology::NvlinkRemote;

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn numa(id: u32, socket: u32) -> NumaNode {
    NumaNode {
        id,
        socket: Some(socket),
        cpus: if id == 0 {
            "0-3".parse().unwrap()
        } else {
            "4-7".parse().unwrap()
        },
        memory_bytes: 1 << 30,
        kind: NumaKind::Cpu,
    }
}

fn pci(bus: &str, numa_nodes: &str, switch: Option<&str>) -> PciGpu {
    let a = addr(bus);
    let mut bridges = vec![];
    if let Some(sw) = switch {
        bridges.push(PciAddress::new(0, a.bus - 1, 0, 0));
        bridges.push(addr(sw));
    }
    // Each GPU on a root port of its own, as on real machines.
    bridges.push(PciAddress::new(1, a.bus, 0, 0));
    PciGpu {
        pci_bus_id: a,
        locality_numa_nodes: numa_nodes.parse().unwrap(),
        socket: None,
        local_cpus: "0-3".parse().unwrap(),
        pcie_root: Some(a.root()),
        upstream_bridges: bridges,
    }
}

fn ident(bus: &str, index: u32, links: &[&str]) -> GpuIdentity {
    GpuIdentity {
        pci_bus_id: addr(bus),
        index,
        minor: Some(index),
        uuid: format!("GPU-{index}"),
        product_name: Some("NVIDIA H100 80GB HBM3".into()),
        brand: Some("NVIDIA".into()),
        architecture: Some("Hopper".into()),
        cuda_compute_capability: None,
        memory_bytes: Some(80 << 30),
        mig_mode: None,
        memory_numa_node: None,
        nvlink_remotes: links.iter().map(|l| NvlinkRemote::Other(addr(l))).collect(),
        nvlink_clique: None,
        mig_devices: vec![],
        mig_profiles: vec![],
    }
}

fn host(gpus: Vec<PciGpu>) -> HostTopology {
    HostTopology {
        source: "hwloc".into(),
        numa_nodes: vec![numa(0, 0), numa(1, 1)],
        distances: DistanceMatrix::new(vec![0, 1], vec![10, 21, 21, 10]),
        gpus,
        warnings: vec![],
    }
}

#[test]
fn joins_by_bus_id_and_derives_topology() {
    let topo = host(vec![
        pci("0000:18:00.0", "0", Some("0000:16:00.0")),
        pci("0000:1a:00.0", "0", Some("0000:16:00.0")),
        pci("0000:9a:00.0", "1", None),
    ]);
    let id = IdentitySnapshot {
        driver_version: Some("550.90.07".into()),
        gpus: vec![
            ident("00000000:9A:00.0", 2, &["0000:c0:00.0"]),
            ident("00000000:18:00.0", 0, &["0000:c0:00.0"]),
            ident("00000000:1A:00.0", 1, &[]),
        ],
        ..Default::default()
    };
    let inv = assemble(Some(id), topo).unwrap();
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let g0 = inv.gpu(addr("0000:18:00.0")).unwrap();
    assert_eq!(g0.numa_node, Some(0));
    assert_eq!(g0.socket, Some(0));
    assert_eq!(g0.same_socket_numa_nodes, vec![0]);
    assert_eq!(g0.pcie_switch, Some(addr("0000:16:00.0")));
    assert_eq!(g0.nvlink_domain.as_deref(), Some("nvl0"));
    assert_eq!(g0.nvlink_peers, vec![addr("0000:9a:00.0")]);
    let g2 = inv.gpu(addr("0000:9a:00.0")).unwrap();
    assert_eq!((g2.numa_node, g2.pcie_switch), (Some(1), None));
    assert_eq!(
        inv.gpus[0].pci_bus_id,
        addr("0000:18:00.0"),
        "sorted by bus id"
    );
    assert_eq!(inv.sources.identity.as_deref(), Some("nvml"));
}

#[test]
fn gpu_missing_from_topology_is_published_without_topology() {
    let id = IdentitySnapshot {
        gpus: vec![ident("0000:18:00.0", 0, &[])],
        ..Default::default()
    };
    let inv = assemble(Some(id), host(vec![])).unwrap();
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.gpus[0].numa_node, None);
    assert!(inv.warnings[0].contains("visible to NVML but not in the hwloc topology"));
}

#[test]
fn gpu_missing_from_nvml_is_not_published() {
    let id = IdentitySnapshot {
        gpus: vec![ident("0000:18:00.0", 0, &[])],
        ..Default::default()
    };
    let topo = two_gpu_host();
    let inv = assemble(Some(id), topo).unwrap();
    assert_eq!(inv.gpus.len(), 1);
    assert!(
        inv.warnings[0]
            .contains("0000:9a:00.0 is in the hwloc topology but NVML does not report it")
    );
}

#[test]
fn without_nvml_topology_gpus_are_listed_bare() {
    let inv = assemble(None, host(vec![pci("0000:18:00.0", "0", None)])).unwrap();
    assert_eq!(inv.gpus[0].uuid, None);
    assert_eq!(inv.gpus[0].numa_node, Some(0));
    assert_eq!(inv.gpus[0].device_name(), "gpu-pci-0000-18-00-0");
    assert!(inv.warnings[0].starts_with("no NVML"));
    assert!(matches!(
        assemble(None, host(vec![])),
        Err(DiscoveryError::NoGpus { .. })
    ));
}

#[test]
fn zero_gpus_with_nvml_is_an_empty_inventory() {
    let inv = assemble(Some(IdentitySnapshot::default()), host(vec![])).unwrap();
    assert!(inv.gpus.is_empty());
    assert!(inv.warnings.is_empty());
}

#[test]
fn ambiguous_locality_leaves_numa_out() {
    let inv = assemble(None, host(vec![pci("0000:18:00.0", "0-1", None)])).unwrap();
    assert_eq!(inv.gpus[0].numa_node, None);
    assert!(
        inv.warnings
            .iter()
            .any(|w| w.contains("local to NUMA nodes 0-1"))
    );
}

#[test]
fn lost_gpus_are_named_and_not_published() {
    let id = IdentitySnapshot {
        gpus: vec![ident("0000:18:00.0", 0, &[])],
        lost: vec![LostGpu {
            index: 1,
            pci_bus_id: Some(addr("0000:9a:00.0")),
            uuid: Some("GPU-1".into()),
        }],
        ..Default::default()
    };
    let topo = two_gpu_host();
    let inv = assemble(Some(id), topo).unwrap();
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.warnings.len(), 1, "{:?}", inv.warnings);
    assert!(inv.warnings[0].starts_with("GPU 0000:9a:00.0 (GPU-1) is lost"));
    assert!(inv.unjoined.is_empty(), "a lost GPU is not a join failure");
}

#[test]
fn most_gpus_missing_from_topology_gives_one_summary() {
    let id = IdentitySnapshot {
        gpus: vec![
            ident("0000:18:00.0", 0, &[]),
            ident("0000:2a:00.0", 1, &[]),
            ident("0000:9a:00.0", 2, &[]),
        ],
        ..Default::default()
    };
    let mut ids = id.clone();
    ids.gpus[0].memory_numa_node = Some(0);
    let inv = assemble(Some(ids), host(vec![pci("0000:18:00.0", "0", None)])).unwrap();
    assert_eq!(inv.warnings.len(), 1, "{:?}", inv.warnings);
    assert!(inv.warnings[0].starts_with("2 of 3 GPUs that NVML reports are not in the hwloc"));
    assert!(inv.warnings[0].contains("0000:2a:00.0, 0000:9a:00.0"));
    assert_eq!(
        inv.unjoined,
        vec![addr("0000:2a:00.0"), addr("0000:9a:00.0")]
    );

    let mut lone = id;
    lone.gpus[1].memory_numa_node = Some(3);
    lone.gpus.truncate(2);
    let inv = assemble(Some(lone), host(vec![pci("0000:18:00.0", "0", None)])).unwrap();
    assert!(inv.warnings[0].contains("visible to NVML but not in the hwloc topology"));
    assert!(inv.warnings[0].contains("memory-node attributes"));
    assert_eq!(
        inv.gpus[1].memory_numa_node, None,
        "warning and content agree"
    );
}

#[test]
fn memory_numa_node_needs_a_local_memory_only_node() {
    let mut topo = host(vec![
        pci("0000:18:00.0", "0", None),
        pci("0000:1a:00.0", "0", None),
        pci("0000:9a:00.0", "1", None),
    ]);
    for (id, socket) in [(2, 0), (3, 0), (4, 1)] {
        topo.numa_nodes.push(NumaNode {
            id,
            socket: Some(socket),
            cpus: topodra_model::IdList::new(),
            memory_bytes: 96 << 30,
            kind: NumaKind::GpuMemory,
        });
    }
    let mut id = three_gpu_identity();
    let check = |id: &IdentitySnapshot, nodes: [Option<u32>; 3]| {
        let mut id = id.clone();
        for (g, n) in id.gpus.iter_mut().zip(nodes) {
            g.memory_numa_node = n;
        }
        let inv = assemble(Some(id), topo.clone()).unwrap();
        inv.gpus
            .iter()
            .map(|g| g.memory_numa_node)
            .collect::<Vec<_>>()
    };
    // The coherent case: each GPU its own memory-only node on its socket.
    assert_eq!(
        check(&id, [Some(2), Some(3), Some(4)]),
        [Some(2), Some(3), Some(4)]
    );
    // A CPU node, a node of the other socket, a node that does not exist.
    assert_eq!(check(&id, [Some(0), Some(4), Some(9)]), [None, None, None]);
    // Two GPUs naming one node: neither owns it.
    assert_eq!(check(&id, [Some(2), Some(2), None]), [None, None, None]);
    id.gpus.truncate(1);
    assert_eq!(check(&id, [Some(2), None, None]), [Some(2)]);
}

#[test]
fn mig_pending_and_empty_mig_gpus_warn() {
    let mut id = three_gpu_identity();
    id.gpus[0].mig_mode = Some(MigMode {
        current: false,
        pending: true,
    });
    id.gpus[1].mig_mode = Some(MigMode {
        current: true,
        pending: true,
    });
    let topo = host(vec![
        pci("0000:18:00.0", "0", None),
        pci("0000:1a:00.0", "0", None),
        pci("0000:9a:00.0", "1", None),
    ]);
    let inv = assemble(Some(id), topo).unwrap();
    assert_eq!(inv.warnings.len(), 2, "{:?}", inv.warnings);
    assert!(
        inv.warnings[0]
            .contains("has a MIG mode change pending (now disabled, enabled after a GPU reset)")
    );
    assert!(inv.warnings[1].contains("is in MIG mode with no MIG devices"));
    let offered: Vec<String> = inv.allocatable().iter().map(|d| d.name()).collect();
    assert_eq!(offered, ["gpu-2"]);
}

/// Two GPUs in the hwloc topology, on two NUMA nodes.
fn two_gpu_host() -> HostTopology {
    host(vec![
        pci("0000:18:00.0", "0", None),
        pci("0000:9a:00.0", "1", None),
    ])
}

/// NVML's view of three GPUs (minors 0 to 2), none of them in MIG mode.
fn three_gpu_identity() -> IdentitySnapshot {
    IdentitySnapshot {
        gpus: vec![
            ident("0000:18:00.0", 0, &[]),
            ident("0000:1a:00.0", 1, &[]),
            ident("0000:9a:00.0", 2, &[]),
        ],
        ..Default::default()
    }
}
