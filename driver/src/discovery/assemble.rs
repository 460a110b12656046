//! Joins NVML identity and hwloc/sysfs topology by PCI bus id.

use std::collections::BTreeMap;

use super::{DiscoveryError, HostTopology, IdentitySnapshot, PciGpu};
use crate::inventory::{Gpu, Inventory, NumaKind, Sources};
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
    let by_bus: BTreeMap<_, &PciGpu> = topology.gpus.iter().map(|g| (g.pci_bus_id, g)).collect();

    let mut gpus: Vec<Gpu> = match &identity {
        Some(snapshot) => {
            for reason in &snapshot.unusable {
                warnings.push(format!(
                    "NVML reports a GPU it cannot describe, not published: {reason}"
                ));
            }
            for pci in &topology.gpus {
                if !snapshot.gpus.iter().any(|g| g.pci_bus_id == pci.pci_bus_id) {
                    warnings.push(format!(
                        "NVIDIA PCI device {} is in the {} topology but NVML does not report it \
                         (no driver bound, or the GPU is lost); not published",
                        pci.pci_bus_id, topology.source
                    ));
                }
            }
            snapshot
                .gpus
                .iter()
                .map(|id| {
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
                    if !by_bus.contains_key(&id.pci_bus_id) {
                        warnings.push(format!(
                            "GPU {} ({}) is visible to NVML but not in the {} topology; \
                             published without NUMA and PCIe attributes",
                            id.pci_bus_id, id.uuid, topology.source
                        ));
                    }
                    gpu
                })
                .collect()
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

    if let Some(snapshot) = &identity {
        let links = snapshot
            .gpus
            .iter()
            .map(|g| (g.pci_bus_id, g.nvlink_remotes.clone()))
            .collect();
        let domains = topology::nvlink_domains(&links);
        for gpu in &mut gpus {
            gpu.nvlink_domain = domains.domain_of.get(&gpu.pci_bus_id).cloned();
            gpu.nvlink_peers = domains
                .peers_of
                .get(&gpu.pci_bus_id)
                .cloned()
                .unwrap_or_default();
        }
    }

    gpus.sort_by_key(|g| g.pci_bus_id);
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
        warnings,
    })
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::discovery::GpuIdentity;
    use crate::inventory::{DistanceMatrix, NumaNode};
    use crate::pci::PciAddress;

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
            nvlink_remotes: links.iter().map(|l| addr(l)).collect(),
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
}
