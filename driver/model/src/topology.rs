//! Topology facts derived from raw source data: the KEP-6072 same-socket NUMA list,
//! the nearest PCIe switch two GPUs share, and NVLink domains.
//!
//! Pure functions over plain data, so each rule is tested without a machine.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::inventory::{DistanceMatrix, NumaKind, NumaNode};
use crate::pci::PciAddress;

/// The list form of `resource.kubernetes.io/numaNode` (KEP-6072): the device's own
/// node first, then the other CPU-bearing nodes of the same socket that sit at the
/// minimum SLIT distance from it, in id order.
///
/// On SNC/NPS machines a socket holds several NUMA nodes; listing the nearest ones
/// lets a constraint match a CPU or NIC on a sibling sub-NUMA cluster, while nodes
/// further away (or on the other socket) stay out. Without distances only the own
/// node is listed, since "nearest" is then unknown.
pub fn same_socket_numa_nodes(
    own: u32,
    nodes: &[NumaNode],
    distances: Option<&DistanceMatrix>,
) -> Vec<u32> {
    let mut list = vec![own];
    let Some(socket) = nodes.iter().find(|n| n.id == own).and_then(|n| n.socket) else {
        return list;
    };
    let Some(distances) = distances else {
        return list;
    };
    let siblings: Vec<(u32, u64)> = nodes
        .iter()
        .filter(|n| n.id != own && n.socket == Some(socket) && n.kind == NumaKind::Cpu)
        .filter_map(|n| distances.get(own, n.id).map(|d| (n.id, d)))
        .collect();
    if let Some(min) = siblings.iter().map(|(_, d)| *d).min() {
        let mut nearest: Vec<u32> = siblings
            .iter()
            .filter(|(_, d)| *d == min)
            .map(|(id, _)| *id)
            .collect();
        nearest.sort_unstable();
        list.extend(nearest);
    }
    list
}

/// For each GPU, the upstream port of the nearest PCIe switch that also has another
/// GPU below it.
///
/// `chains` maps each GPU to its upstream PCI-to-PCI bridges, nearest first (root
/// ports included, host bridges not). A switch shows up as an upstream port bridge
/// above its downstream port bridges, so the first bridge in a chain that two GPUs
/// share is the switch that joins them. Root ports are shared only when a switch
/// below them is, so they never win over the switch itself.
pub fn shared_pcie_switches(
    chains: &BTreeMap<PciAddress, Vec<PciAddress>>,
) -> BTreeMap<PciAddress, PciAddress> {
    let mut gpus_below: HashMap<PciAddress, usize> = HashMap::new();
    for chain in chains.values() {
        for bridge in chain.iter().collect::<BTreeSet<_>>() {
            let n = gpus_below.entry(*bridge).or_default();
            *n = n.saturating_add(1);
        }
    }
    chains
        .iter()
        .filter_map(|(gpu, chain)| {
            chain
                .iter()
                .find(|b| gpus_below.get(b).copied().unwrap_or(0) > 1)
                .map(|b| (*gpu, *b))
        })
        .collect()
}

/// What one active NVLink of a GPU ends at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum NvlinkRemote {
    /// Another GPU, by its PCI address.
    Gpu(PciAddress),
    /// An NVSwitch. Its PCI address is not kept: depending on platform and driver,
    /// NVML reports the switch's own address or a placeholder, and switches of a
    /// rack's switch trays are not on this node's PCI bus at all.
    Switch,
    /// A CPU (IBM POWER's NVLink-attached processors): no GPU is reached through it.
    Cpu,
    /// NVML could not say what the link ends at (a driver without
    /// `nvmlDeviceGetNvLinkRemoteDeviceType`), only where: joined by address.
    Other(PciAddress),
}

/// NVLink connectivity of the node's GPUs, as computed by [`nvlink_domains`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvlinkDomains {
    /// Domain name per GPU that shares NVLink with at least one other GPU.
    pub domain_of: BTreeMap<PciAddress, String>,
    /// The other GPUs in the same domain, per GPU.
    pub peers_of: BTreeMap<PciAddress, Vec<PciAddress>>,
}

/// A vertex of the NVLink graph: a PCI endpoint, or the NVSwitch fabric a group of
/// GPUs is attached to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Endpoint {
    Pci(PciAddress),
    Fabric(String),
}

/// Groups GPUs that reach each other over NVLink, directly or through NVSwitches.
///
/// `links` gives, per GPU, what each active link ends at. Direct GPU links and links
/// to a shared address join their ends. Every GPU with a link to an NVSwitch joins
/// the node's NVSwitch fabric, whatever address the switch reported: on NVSwitch
/// boards (HGX, GB200 trays) every GPU is wired to every switch, so all
/// switch-attached GPUs of a node reach each other. `fabric_of` splits that fabric
/// where the fabric manager says GPUs belong to different cliques (keyed by
/// `<clusterUUID>.<cliqueId>`); GPUs without fabric info share one fabric.
///
/// A component with two or more GPUs is a domain, named `nvl<N>` with N counted in
/// the order of each domain's lowest GPU address, so names are stable across
/// restarts. A link to an endpoint that is not a GPU of this node and that no other
/// GPU shares joins nothing on its own.
pub fn nvlink_domains(
    links: &BTreeMap<PciAddress, Vec<NvlinkRemote>>,
    fabric_of: &BTreeMap<PciAddress, String>,
) -> NvlinkDomains {
    let mut parent: BTreeMap<Endpoint, Endpoint> = BTreeMap::new();
    fn find(parent: &mut BTreeMap<Endpoint, Endpoint>, x: &Endpoint) -> Endpoint {
        let p = parent.entry(x.clone()).or_insert_with(|| x.clone()).clone();
        if &p == x {
            return p;
        }
        let root = find(parent, &p);
        parent.insert(x.clone(), root.clone());
        root
    }
    fn union(parent: &mut BTreeMap<Endpoint, Endpoint>, x: &Endpoint, y: &Endpoint) {
        let a = find(parent, x);
        let b = find(parent, y);
        if a != b {
            // Keep the smaller endpoint as the root so components are deterministic.
            let (root, child) = if a < b { (a, b) } else { (b, a) };
            parent.insert(child, root);
        }
    }
    for (gpu, remotes) in links {
        let me = Endpoint::Pci(*gpu);
        find(&mut parent, &me);
        for remote in remotes {
            let other = match remote {
                NvlinkRemote::Gpu(a) | NvlinkRemote::Other(a) => Endpoint::Pci(*a),
                NvlinkRemote::Switch => {
                    Endpoint::Fabric(fabric_of.get(gpu).cloned().unwrap_or_default())
                }
                NvlinkRemote::Cpu => continue,
            };
            union(&mut parent, &me, &other);
        }
    }
    let mut members: BTreeMap<Endpoint, Vec<PciAddress>> = BTreeMap::new();
    for gpu in links.keys() {
        let root = find(&mut parent, &Endpoint::Pci(*gpu));
        members.entry(root).or_default().push(*gpu);
    }
    let mut groups: Vec<Vec<PciAddress>> = members.into_values().filter(|m| m.len() > 1).collect();
    groups.sort_by_key(|m| m[0]);
    let mut out = NvlinkDomains::default();
    for (n, group) in groups.iter().enumerate() {
        for gpu in group {
            out.domain_of.insert(*gpu, format!("nvl{n}"));
            out.peers_of
                .insert(*gpu, group.iter().filter(|p| *p != gpu).copied().collect());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::IdList;

    fn addr(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    fn node(id: u32, socket: u32, kind: NumaKind) -> NumaNode {
        NumaNode {
            id,
            socket: Some(socket),
            cpus: IdList::new(),
            memory_bytes: 0,
            kind,
        }
    }

    #[test]
    fn two_socket_machine_lists_only_own_node() {
        let nodes = [node(0, 0, NumaKind::Cpu), node(1, 1, NumaKind::Cpu)];
        let d = DistanceMatrix::new(vec![0, 1], vec![10, 21, 21, 10]).unwrap();
        assert_eq!(same_socket_numa_nodes(1, &nodes, Some(&d)), vec![1]);
    }

    #[test]
    fn snc4_lists_nearest_siblings_of_same_socket() {
        // Socket 0 holds nodes 0-3, socket 1 nodes 4-7; node 2 is nearer to 3 than to 0, 1.
        let nodes: Vec<NumaNode> = (0..8).map(|i| node(i, i / 4, NumaKind::Cpu)).collect();
        let mut values = vec![];
        for i in 0..8u32 {
            for j in 0..8u32 {
                values.push(match (i, j) {
                    _ if i == j => 10,
                    _ if i / 4 != j / 4 => 21,
                    (2, 3) | (3, 2) => 11,
                    _ => 12,
                });
            }
        }
        let d = DistanceMatrix::new((0..8).collect(), values).unwrap();
        assert_eq!(
            same_socket_numa_nodes(0, &nodes, Some(&d)),
            vec![0, 1, 2, 3]
        );
        assert_eq!(same_socket_numa_nodes(2, &nodes, Some(&d)), vec![2, 3]);
        assert_eq!(
            same_socket_numa_nodes(5, &nodes, Some(&d)),
            vec![5, 4, 6, 7]
        );
        assert_eq!(same_socket_numa_nodes(5, &nodes, None), vec![5]);
    }

    #[test]
    fn gpu_memory_nodes_are_not_siblings() {
        let nodes = [
            node(0, 0, NumaKind::Cpu),
            node(2, 0, NumaKind::GpuMemory),
            node(1, 1, NumaKind::Cpu),
        ];
        let d =
            DistanceMatrix::new(vec![0, 1, 2], vec![10, 40, 80, 40, 10, 120, 80, 120, 10]).unwrap();
        assert_eq!(same_socket_numa_nodes(0, &nodes, Some(&d)), vec![0]);
    }

    #[test]
    fn switch_is_the_first_bridge_two_gpus_share() {
        // Two GPUs behind one switch (upstream 0000:16:00.0), a third alone on a root port.
        let chains = BTreeMap::from([
            (
                addr("0000:18:00.0"),
                vec![
                    addr("0000:17:00.0"),
                    addr("0000:16:00.0"),
                    addr("0000:15:01.0"),
                ],
            ),
            (
                addr("0000:19:00.0"),
                vec![
                    addr("0000:17:04.0"),
                    addr("0000:16:00.0"),
                    addr("0000:15:01.0"),
                ],
            ),
            (addr("0000:40:00.0"), vec![addr("0000:3f:01.0")]),
        ]);
        let sw = shared_pcie_switches(&chains);
        assert_eq!(sw.get(&addr("0000:18:00.0")), Some(&addr("0000:16:00.0")));
        assert_eq!(sw.get(&addr("0000:19:00.0")), Some(&addr("0000:16:00.0")));
        assert_eq!(sw.get(&addr("0000:40:00.0")), None);
    }

    #[test]
    fn nvswitch_joins_all_gpus_and_pairs_make_separate_domains() {
        let links: BTreeMap<_, _> = ["0000:18:00.0", "0000:2a:00.0", "0000:9a:00.0"]
            .iter()
            .map(|g| (addr(g), vec![NvlinkRemote::Switch; 18]))
            .collect();
        let d = nvlink_domains(&links, &BTreeMap::new());
        assert_eq!(d.domain_of.len(), 3);
        assert!(d.domain_of.values().all(|v| v == "nvl0"));
        assert_eq!(d.peers_of[&addr("0000:18:00.0")].len(), 2);

        let gpu = |a: &str| vec![NvlinkRemote::Gpu(addr(a))];
        let pairs = BTreeMap::from([
            (addr("0000:01:00.0"), gpu("0000:02:00.0")),
            (addr("0000:02:00.0"), gpu("0000:01:00.0")),
            (addr("0000:81:00.0"), gpu("0000:82:00.0")),
            (addr("0000:82:00.0"), gpu("0000:81:00.0")),
            (addr("0000:90:00.0"), vec![NvlinkRemote::Cpu]),
        ]);
        let d = nvlink_domains(&pairs, &BTreeMap::new());
        assert_eq!(d.domain_of[&addr("0000:02:00.0")], "nvl0");
        assert_eq!(d.domain_of[&addr("0000:81:00.0")], "nvl1");
        assert!(!d.domain_of.contains_key(&addr("0000:90:00.0")));
        assert_eq!(
            d.peers_of[&addr("0000:82:00.0")],
            vec![addr("0000:81:00.0")]
        );
    }

    #[test]
    fn cliques_split_a_switch_fabric() {
        let links: BTreeMap<_, _> = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
            .iter()
            .map(|g| (addr(g), vec![NvlinkRemote::Switch]))
            .collect();
        let fabric = BTreeMap::from([
            (addr("0000:01:00.0"), "c.1".to_owned()),
            (addr("0000:02:00.0"), "c.1".to_owned()),
            (addr("0000:03:00.0"), "c.2".to_owned()),
        ]);
        let d = nvlink_domains(&links, &fabric);
        assert_eq!(d.domain_of.len(), 2, "the lone GPU of clique 2 has no peer");
        assert_eq!(
            d.peers_of[&addr("0000:01:00.0")],
            vec![addr("0000:02:00.0")]
        );
    }

    #[test]
    fn links_of_unknown_kind_join_by_address() {
        let links = BTreeMap::from([
            (
                addr("0000:01:00.0"),
                vec![NvlinkRemote::Other(addr("0000:f0:00.0"))],
            ),
            (
                addr("0000:02:00.0"),
                vec![NvlinkRemote::Other(addr("0000:f0:00.0"))],
            ),
            (
                addr("0000:03:00.0"),
                vec![NvlinkRemote::Other(addr("0000:f1:00.0"))],
            ),
        ]);
        let d = nvlink_domains(&links, &BTreeMap::new());
        assert_eq!(d.domain_of.len(), 2);
        assert!(!d.domain_of.contains_key(&addr("0000:03:00.0")));
    }
}
