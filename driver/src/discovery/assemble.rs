//! Joins NVML identity and hwloc/sysfs topology by PCI bus id.

use std::collections::BTreeMap;

use super::{DiscoveryError, GpuIdentity, HostTopology, IdentitySnapshot, PciGpu};
use crate::inventory::{Gpu, Inventory, NumaKind, Offer, Sources};
use crate::topology;

/// Builds the inventory from what each source saw.
///
/// A GPU that NVML reports and the topology lacks is still published, with identity
/// and without topology attributes: it stays usable, and a `matchAttribute` on
/// `numaNode` simply never picks it. A GPU the topology shows but a working NVML does
/// not report is left out, since the driver could not prepare it. Without NVML at all
/// every NVIDIA GPU of the topology is listed, without identity. Each case warns.
pub fn assemble(
    identity: Option<IdentitySnapshot>,
    topology: HostTopology,
) -> Result<Inventory, DiscoveryError> {
    let mut warnings = topology.warnings.clone();
    let mut unjoined = Vec::new();
    let by_bus: BTreeMap<_, &PciGpu> = topology.gpus.iter().map(|g| (g.pci_bus_id, g)).collect();

    let mut gpus: Vec<Gpu> = match &identity {
        Some(snapshot) => {
            for reason in &snapshot.unusable {
                warnings.push(format!(
                    "NVML reports a GPU it cannot describe, not published: {reason}"
                ));
            }
            for lost in &snapshot.lost {
                warnings.push(format!(
                    "{lost} is lost (NVML_ERROR_GPU_IS_LOST: it fell off the bus; the kernel \
                     log shows XID 79); not published until NVML sees it again"
                ));
            }
            let is_lost = |bus| snapshot.lost.iter().any(|l| l.pci_bus_id == Some(bus));
            // NVML refuses even a handle to a GPU lost before it was opened, so such
            // a GPU has no address; the topology's NVIDIA devices that NVML does
            // not describe are then most likely those, and are named as such.
            let nameless_lost = snapshot
                .lost
                .iter()
                .filter(|l| l.pci_bus_id.is_none())
                .count();
            for pci in &topology.gpus {
                if snapshot.gpus.iter().any(|g| g.pci_bus_id == pci.pci_bus_id)
                    || is_lost(pci.pci_bus_id)
                {
                    continue;
                }
                if nameless_lost > 0 {
                    warnings.push(format!(
                        "NVIDIA PCI device {} is in the {} topology but NVML does not describe \
                         it; NVML reports {nameless_lost} lost GPU(s) without an address, likely \
                         this one; not published",
                        pci.pci_bus_id, topology.source
                    ));
                    continue;
                }
                unjoined.push(pci.pci_bus_id);
                warnings.push(format!(
                    "NVIDIA PCI device {} is in the {} topology but NVML does not report it \
                     (no driver bound, or the GPU is lost); not published",
                    pci.pci_bus_id, topology.source
                ));
            }
            let missing: Vec<&GpuIdentity> = snapshot
                .gpus
                .iter()
                .filter(|id| !by_bus.contains_key(&id.pci_bus_id))
                .collect();
            warnings.extend(missing_from_topology(
                &missing,
                snapshot.gpus.len(),
                &topology.source,
            ));
            unjoined.extend(missing.iter().map(|id| id.pci_bus_id));
            snapshot.gpus.iter().map(from_identity).collect()
        }
        None => {
            if topology.gpus.is_empty() {
                return Err(DiscoveryError::NoGpus {
                    source_name: topology.source.clone(),
                });
            }
            warnings.push(format!(
                "no NVML: {} NVIDIA GPU(s) listed from the {} topology without identity \
                 (uuid, minor, product name, memory); device names are derived from PCI addresses",
                topology.gpus.len(),
                topology.source
            ));
            topology
                .gpus
                .iter()
                .map(|p| Gpu::at(p.pci_bus_id))
                .collect()
        }
    };

    let chains = topology
        .gpus
        .iter()
        .map(|g| (g.pci_bus_id, g.upstream_bridges.clone()))
        .collect();
    let switches = topology::shared_pcie_switches(&chains);

    for gpu in &mut gpus {
        let Some(pci) = by_bus.get(&gpu.pci_bus_id) else {
            // Nothing to check a memory node against: leave it out with the rest.
            gpu.memory_numa_node = None;
            continue;
        };
        gpu.numa_node = attached_numa_node(pci, &topology, &mut warnings);
        gpu.socket = pci.socket.or_else(|| {
            gpu.numa_node
                .and_then(|n| topology.numa_nodes.iter().find(|x| x.id == n))
                .and_then(|n| n.socket)
        });
        if let Some(own) = gpu.numa_node {
            gpu.same_socket_numa_nodes = topology::same_socket_numa_nodes(
                own,
                &topology.numa_nodes,
                topology.distances.as_ref(),
            );
        }
        gpu.local_cpus = pci.local_cpus.clone();
        gpu.pcie_root = pci.pcie_root;
        gpu.pcie_switch = switches.get(&gpu.pci_bus_id).copied();
    }
    check_memory_numa_nodes(&mut gpus, &by_bus, &topology);

    if let Some(snapshot) = &identity {
        let links = snapshot
            .gpus
            .iter()
            .map(|g| (g.pci_bus_id, g.nvlink_remotes.clone()))
            .collect();
        let cliques = snapshot
            .gpus
            .iter()
            .filter_map(|g| Some((g.pci_bus_id, g.nvlink_clique.clone()?)))
            .collect();
        let domains = topology::nvlink_domains(&links, &cliques);
        for gpu in &mut gpus {
            gpu.nvlink_domain = domains.domain_of.get(&gpu.pci_bus_id).cloned();
            gpu.nvlink_peers = domains
                .peers_of
                .get(&gpu.pci_bus_id)
                .cloned()
                .unwrap_or_default();
        }
    }

    for gpu in &gpus {
        warnings.extend(mig_warning(gpu));
    }

    gpus.sort_by_key(|g| g.pci_bus_id);
    unjoined.sort();
    let (driver_version, cuda_driver_version) = identity
        .as_ref()
        .map(|s| (s.driver_version.clone(), s.cuda_driver_version))
        .unwrap_or_default();
    Ok(Inventory {
        sources: Sources {
            identity: identity.as_ref().map(|_| "nvml".to_owned()),
            topology: Some(topology.source.clone()),
        },
        driver_version,
        cuda_driver_version,
        numa_nodes: topology.numa_nodes,
        distances: topology.distances,
        gpus,
        unjoined,
        warnings,
    })
}

fn from_identity(id: &GpuIdentity) -> Gpu {
    let mut gpu = Gpu::at(id.pci_bus_id);
    gpu.index = Some(id.index);
    gpu.minor = id.minor;
    gpu.uuid = Some(id.uuid.clone());
    gpu.product_name = id.product_name.clone();
    gpu.brand = id.brand.clone();
    gpu.architecture = id.architecture.clone();
    gpu.cuda_compute_capability = id.cuda_compute_capability;
    gpu.memory_bytes = id.memory_bytes;
    gpu.mig_mode = id.mig_mode;
    gpu.memory_numa_node = id.memory_numa_node;
    gpu.nvlink_clique = id.nvlink_clique.clone();
    gpu.mig_devices = id.mig_devices.clone();
    gpu
}

/// Warnings for GPUs NVML reports and the topology lacks: one per GPU when few are
/// missing, one summary when most are, which means the topology is not this
/// machine's (a wrong `--hwloc-xml`) or hwloc cannot see the GPUs at all.
fn missing_from_topology(missing: &[&GpuIdentity], total: usize, source: &str) -> Vec<String> {
    const EFFECT: &str = "published without NUMA, socket, PCIe and memory-node attributes";
    if missing.len() >= 2 && missing.len() * 2 > total {
        let buses: Vec<String> = missing.iter().map(|g| g.pci_bus_id.to_string()).collect();
        return vec![format!(
            "{} of {total} GPUs that NVML reports are not in the {source} topology ({}); they are \
             {EFFECT}. Is the topology from this machine, and does hwloc see its PCI devices?",
            missing.len(),
            buses.join(", ")
        )];
    }
    missing
        .iter()
        .map(|id| {
            format!(
                "GPU {} ({}) is visible to NVML but not in the {source} topology; {EFFECT}",
                id.pci_bus_id, id.uuid
            )
        })
        .collect()
}

/// Keeps `memoryNumaNode` only where the topology confirms it: a memory-only NUMA
/// node (no CPUs) local to that GPU, claimed by no other GPU. NVML answers
/// `nvmlDeviceGetNumaNodeId` on more than the coherent systems (GH200, GB200) where
/// a GPU's memory is a NUMA node of its own; elsewhere the id names a CPU node or
/// nothing, and publishing it would contradict `numaNode`.
fn check_memory_numa_nodes(
    gpus: &mut [Gpu],
    by_bus: &BTreeMap<crate::pci::PciAddress, &PciGpu>,
    topology: &HostTopology,
) {
    let mut claims: BTreeMap<u32, usize> = BTreeMap::new();
    for id in gpus.iter().filter_map(|g| g.memory_numa_node) {
        *claims.entry(id).or_default() += 1;
    }
    for gpu in gpus.iter_mut() {
        let Some(id) = gpu.memory_numa_node else {
            continue;
        };
        let node = topology.numa_nodes.iter().find(|n| n.id == id);
        let local = by_bus.get(&gpu.pci_bus_id).is_some_and(|pci| {
            pci.locality_numa_nodes.contains(id)
                || node.is_some_and(|n| n.socket.is_some() && n.socket == gpu.socket)
        });
        let why = match node {
            None => Some("the topology has no such NUMA node"),
            Some(n) if n.kind == NumaKind::Cpu => Some("it is a NUMA node with CPUs"),
            Some(_) if !local => Some("it is not local to this GPU"),
            Some(_) if claims.get(&id).copied().unwrap_or(0) > 1 => {
                Some("other GPUs report the same node")
            }
            Some(_) => None,
        };
        if let Some(why) = why {
            tracing::debug!(gpu = %gpu.pci_bus_id, numa_node = id, why, "memoryNumaNode dropped");
            gpu.memory_numa_node = None;
        }
    }
}

/// What an operator must know about a GPU that MIG keeps from being offered whole.
pub fn mig_warning(gpu: &Gpu) -> Option<String> {
    let who = match &gpu.uuid {
        Some(uuid) => format!("GPU {} ({uuid})", gpu.pci_bus_id),
        None => format!("GPU {}", gpu.pci_bus_id),
    };
    let on_off = |b: bool| if b { "enabled" } else { "disabled" };
    match (gpu.offer(), gpu.mig_mode) {
        (Offer::MigChangePending, Some(m)) => Some(format!(
            "{who} has a MIG mode change pending (now {}, {} after a GPU reset); not \
             published until the GPU is reset",
            on_off(m.current),
            on_off(m.pending)
        )),
        (Offer::Mig, _) if gpu.mig_devices.is_empty() => Some(format!(
            "{who} is in MIG mode with no MIG devices; nothing is published for it until GPU \
             and compute instances exist"
        )),
        _ => None,
    }
}

/// The one NUMA node a GPU is attached to. hwloc attaches a PCI device to the
/// smallest object covering its locality; when that covers several CPU nodes (a
/// whole SNC socket, say) the attachment is ambiguous and no node is claimed.
fn attached_numa_node(
    pci: &PciGpu,
    topology: &HostTopology,
    warnings: &mut Vec<String>,
) -> Option<u32> {
    let nodes: Vec<u32> = pci.locality_numa_nodes.iter().collect();
    if nodes.len() <= 1 {
        return nodes.first().copied();
    }
    let cpu_nodes: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|id| {
            topology
                .numa_nodes
                .iter()
                .any(|n| n.id == *id && n.kind == NumaKind::Cpu)
        })
        .collect();
    if let [only] = cpu_nodes[..] {
        return Some(only);
    }
    warnings.push(format!(
        "GPU {} is local to NUMA nodes {} at once; numaNode is left out for it",
        pci.pci_bus_id, pci.locality_numa_nodes
    ));
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::LostGpu;
    use crate::inventory::{DistanceMatrix, MigMode, NumaNode};
    use crate::pci::PciAddress;
    use crate::topology::NvlinkRemote;

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
        let topo = host(vec![
            pci("0000:18:00.0", "0", None),
            pci("0000:9a:00.0", "1", None),
        ]);
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
        let topo = host(vec![
            pci("0000:18:00.0", "0", None),
            pci("0000:9a:00.0", "1", None),
        ]);
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
                cpus: crate::IdList::new(),
                memory_bytes: 96 << 30,
                kind: NumaKind::GpuMemory,
            });
        }
        let mut id = IdentitySnapshot {
            gpus: vec![
                ident("0000:18:00.0", 0, &[]),
                ident("0000:1a:00.0", 1, &[]),
                ident("0000:9a:00.0", 2, &[]),
            ],
            ..Default::default()
        };
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
        let mut id = IdentitySnapshot {
            gpus: vec![
                ident("0000:18:00.0", 0, &[]),
                ident("0000:1a:00.0", 1, &[]),
                ident("0000:9a:00.0", 2, &[]),
            ],
            ..Default::default()
        };
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
            inv.warnings[0].contains(
                "has a MIG mode change pending (now disabled, enabled after a GPU reset)"
            )
        );
        assert!(inv.warnings[1].contains("is in MIG mode with no MIG devices"));
        let offered: Vec<String> = inv.allocatable().iter().map(|d| d.name()).collect();
        assert_eq!(offered, ["gpu-2"]);
    }
}
