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
            *gpus_below.entry(*bridge).or_default() += 1;
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

/// NVLink connectivity of the node's GPUs, as computed by [`nvlink_domains`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvlinkDomains {
    /// Domain name per GPU that shares NVLink with at least one other GPU.
    pub domain_of: BTreeMap<PciAddress, String>,
    /// The other GPUs in the same domain, per GPU.
    pub peers_of: BTreeMap<PciAddress, Vec<PciAddress>>,
}

/// Groups GPUs that reach each other over NVLink, directly or through NVSwitches.
///
/// `links` gives, per GPU, the remote endpoint of each active link: another GPU's
/// address or an NVSwitch's. GPUs and switches are joined into connected components;
/// a component with two or more GPUs is a domain, named `nvl<N>` with N counted in the
/// order of each domain's lowest GPU address, so names are stable across restarts.
/// A link to an endpoint that is not a GPU of this node and that no other GPU shares
/// (a switch tray port of a multi-node fabric, say) joins nothing on its own.
pub fn nvlink_domains(links: &BTreeMap<PciAddress, Vec<PciAddress>>) -> NvlinkDomains {
    let mut parent: BTreeMap<PciAddress, PciAddress> = BTreeMap::new();
    fn find(parent: &mut BTreeMap<PciAddress, PciAddress>, x: PciAddress) -> PciAddress {
        let p = *parent.entry(x).or_insert(x);
        if p == x {
            return x;
        }
        let root = find(parent, p);
        parent.insert(x, root);
        root
    }
    for (gpu, remotes) in links {
        find(&mut parent, *gpu);
        for remote in remotes {
            let a = find(&mut parent, *gpu);
            let b = find(&mut parent, *remote);
            if a != b {
                // Keep the smaller address as the root so components are deterministic.
                let (root, child) = if a < b { (a, b) } else { (b, a) };
                parent.insert(child, root);
            }
        }
    }
    let mut members: BTreeMap<PciAddress, Vec<PciAddress>> = BTreeMap::new();
    for gpu in links.keys() {
        let root = find(&mut parent, *gpu);
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
#[allow(clippy::unwrap_used)]
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
        let sw = [addr("0000:c1:00.0"), addr("0000:c2:00.0")];
        let links: BTreeMap<_, _> = ["0000:18:00.0", "0000:2a:00.0", "0000:9a:00.0"]
            .iter()
            .map(|g| (addr(g), sw.to_vec()))
            .collect();
        let d = nvlink_domains(&links);
        assert!(d.domain_of.values().all(|v| v == "nvl0"));
        assert_eq!(d.peers_of[&addr("0000:18:00.0")].len(), 2);

        let pairs = BTreeMap::from([
            (addr("0000:01:00.0"), vec![addr("0000:02:00.0")]),
            (addr("0000:02:00.0"), vec![addr("0000:01:00.0")]),
            (addr("0000:81:00.0"), vec![addr("0000:82:00.0")]),
            (addr("0000:82:00.0"), vec![addr("0000:81:00.0")]),
            (addr("0000:90:00.0"), vec![]),
        ]);
        let d = nvlink_domains(&pairs);
        assert_eq!(d.domain_of[&addr("0000:02:00.0")], "nvl0");
        assert_eq!(d.domain_of[&addr("0000:81:00.0")], "nvl1");
        assert!(!d.domain_of.contains_key(&addr("0000:90:00.0")));
        assert_eq!(
            d.peers_of[&addr("0000:82:00.0")],
            vec![addr("0000:81:00.0")]
        );
    }

    #[test]
    fn a_link_to_an_unshared_endpoint_joins_nothing() {
        let links = BTreeMap::from([
            (addr("0000:01:00.0"), vec![addr("0000:f0:00.0")]),
            (addr("0000:02:00.0"), vec![addr("0000:f1:00.0")]),
        ]);
        assert!(nvlink_domains(&links).domain_of.is_empty());
    }
}
