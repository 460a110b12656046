//! The order of devices in the pool.
//!
//! The scheduler walks a pool's devices in the order they are published and takes the
//! first that fit (first-fit). Publishing GPUs grouped by socket, then NUMA node, then
//! PCIe switch and root complex makes consecutive single-GPU claims fill one switch and
//! one NUMA node before touching the next, so whole NUMA nodes and sockets stay free
//! for the large aligned claims that need them. Within a group the PCI bus id keeps the
//! order stable across restarts, so an unchanged node republishes identical slices.
//! GPUs whose place is unknown go last: a claim lands on them only when everything
//! better placed is taken.

use crate::inventory::{AllocatableDevice, Inventory};

/// Known values first, in their natural order; unknown ones after all known ones.
fn known_first<T: Ord>(v: Option<T>) -> (bool, Option<T>) {
    (v.is_none(), v)
}

/// The node's allocatable devices in publishing order. The MIG devices of one GPU
/// stay together, by GPU and compute instance id, where the whole GPU would be.
pub(crate) fn in_allocation_order(
    inv: &Inventory,
    mut devices: Vec<AllocatableDevice>,
) -> Vec<AllocatableDevice> {
    devices.sort_by_cached_key(|d| {
        let g = &d.gpu;
        (
            known_first(super::attributes::socket(g, inv)),
            known_first(g.numa_node),
            known_first(g.pcie_switch),
            known_first(g.pcie_root),
            g.pci_bus_id,
            d.mig.as_ref().map(|m| (m.gpu_instance, m.compute_instance)),
        )
    });
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::PciAddress;
    use crate::slice::fixtures::{addr, dgx_h100, snc};

    fn buses(devices: &[AllocatableDevice]) -> Vec<String> {
        devices
            .iter()
            .map(|d| d.gpu.pci_bus_id.to_string())
            .collect()
    }

    #[test]
    fn scrambled_gpus_come_out_numa_node_first_and_switch_grouped() {
        let mut inv = dgx_h100();
        // NUMA 0: 0x18 and 0x5d share the switch at 0x10, 0x2a and 0x3a the one at 0x30,
        // so switch grouping, not bus order, decides within the node.
        for (bus, switch) in [("18", 0x30), ("5d", 0x30), ("2a", 0x10), ("3a", 0x10)] {
            let g = inv
                .gpus
                .iter_mut()
                .find(|g| g.pci_bus_id == addr(&format!("0000:{bus}:00.0")))
                .unwrap();
            g.pcie_switch = Some(PciAddress::new(0, switch, 0, 0));
            g.pcie_root = None;
        }
        inv.gpus.reverse();
        inv.gpus.swap(1, 6);
        let order = buses(&in_allocation_order(&inv, inv.allocatable()));
        assert_eq!(
            order,
            [
                "0000:2a:00.0",
                "0000:3a:00.0",
                "0000:18:00.0",
                "0000:5d:00.0", // NUMA 0
                "0000:9a:00.0",
                "0000:ab:00.0",
                "0000:ba:00.0",
                "0000:db:00.0", // NUMA 1
            ]
        );
    }

    #[test]
    fn socket_outranks_numa_node_id() {
        // NUMA ids need not follow sockets; the socket decides first.
        let mut inv = snc();
        inv.gpus[0].numa_node = Some(9);
        inv.gpus[0].socket = Some(0);
        inv.gpus[7].socket = Some(1);
        let order: Vec<u32> = in_allocation_order(&inv, inv.allocatable())
            .iter()
            .map(|d| d.gpu.minor.unwrap())
            .collect();
        assert_eq!(order, [1, 2, 3, 0, 4, 5, 6, 7]);
    }

    #[test]
    fn gpus_with_unknown_placement_go_last() {
        let mut inv = dgx_h100();
        inv.gpus[0].numa_node = None; // socket still known: last of socket 0
        inv.gpus[1].numa_node = None;
        inv.gpus[1].socket = None; // nothing known: last overall
        let order = buses(&in_allocation_order(&inv, inv.allocatable()));
        assert_eq!(
            order,
            [
                "0000:3a:00.0",
                "0000:5d:00.0",
                "0000:18:00.0",
                "0000:9a:00.0",
                "0000:ab:00.0",
                "0000:ba:00.0",
                "0000:db:00.0",
                "0000:2a:00.0",
            ]
        );
    }
}
