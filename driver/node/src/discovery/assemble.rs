//! Joins NVML identity and hwloc/sysfs topology by PCI bus id.

use std::collections::BTreeMap;

use super::{DiscoveryError, GpuIdentity, HostTopology, IdentitySnapshot, PciGpu};
use topodra_model::inventory::{Gpu, Inventory, NumaKind, Offer, Sources};
use topodra_model::topology;

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
    gpu.mig_profiles = id.mig_profiles.clone();
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
    by_bus: &BTreeMap<topodra_model::PciAddress, &PciGpu>,
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
mod tests;
