//! Hand-built inventories, attribute values and a claim helper, for the library's
//! tests and, with the feature `test-fixtures`, for the node crate's.

// Fixtures panic on bad test data, as the tests that use them would.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::resource::v1::DeviceAttribute;

use crate::cpuset::IdList;
use crate::inventory::{
    ComputeCapability, CudaVersion, DistanceMatrix, Gpu, Inventory, NumaKind, NumaNode,
};
use crate::pci::{PciAddress, PcieRoot};

pub fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn numa(id: u32, socket: u32, cpus: &str) -> NumaNode {
    NumaNode {
        id,
        socket: Some(socket),
        cpus: cpus.parse().unwrap(),
        memory_bytes: 1 << 40,
        kind: NumaKind::Cpu,
    }
}

/// A fully described H100 SXM: every identity field set, topology left to the caller.
pub fn h100(bus: &str, minor: u32) -> Gpu {
    let mut g = Gpu::at(addr(bus));
    g.index = Some(minor);
    g.minor = Some(minor);
    g.uuid = Some(format!("GPU-7f1c2b3a-0000-4e5f-8a9b-{minor:012x}"));
    g.product_name = Some("NVIDIA H100 80GB HBM3".to_owned());
    g.brand = Some("Nvidia".to_owned());
    g.architecture = Some("Hopper".to_owned());
    g.cuda_compute_capability = Some(ComputeCapability { major: 9, minor: 0 });
    g.memory_bytes = Some(81559 << 20);
    g.nvlink_domain = Some("nvls-0".to_owned());
    g
}

/// A DGX H100: two sockets, one NUMA node each, eight GPUs in bus order, four per
/// node, each behind its own root complex and PCIe switch.
pub fn dgx_h100() -> Inventory {
    let buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"];
    let gpus = buses
        .iter()
        .enumerate()
        .map(|(i, bus)| {
            let b = u8::from_str_radix(bus, 16).unwrap();
            let node = u32::from(i >= 4);
            let mut g = h100(&format!("0000:{bus}:00.0"), i as u32);
            g.numa_node = Some(node);
            g.same_socket_numa_nodes = vec![node];
            g.socket = Some(node);
            g.local_cpus = if node == 0 {
                "0-55,112-167"
            } else {
                "56-111,168-223"
            }
            .parse::<IdList>()
            .unwrap();
            g.pcie_root = Some(PcieRoot {
                domain: 0,
                bus: b - 3,
            });
            g.pcie_switch = Some(PciAddress::new(0, b - 2, 0, 0));
            g
        })
        .collect();
    Inventory {
        driver_version: Some("550.90.07".to_owned()),
        cuda_driver_version: Some(CudaVersion {
            major: 12,
            minor: 4,
        }),
        numa_nodes: vec![numa(0, 0, "0-55,112-167"), numa(1, 1, "56-111,168-223")],
        distances: DistanceMatrix::new(vec![0, 1], vec![10, 21, 21, 10]),
        gpus,
        ..Default::default()
    }
}

/// Sub-NUMA clustering: two sockets of four NUMA nodes each, one GPU per node. Nodes
/// of one socket are 12 apart, of different sockets 21.
pub fn snc() -> Inventory {
    let numa_nodes = (0..8)
        .map(|id| numa(id, id / 4, &format!("{}-{}", id * 14, id * 14 + 13)))
        .collect();
    let ids: Vec<u32> = (0..8).collect();
    let values = ids
        .iter()
        .flat_map(|a| {
            ids.iter().map(move |b| match (a, b) {
                _ if a == b => 10,
                _ if a / 4 == b / 4 => 12,
                _ => 21,
            })
        })
        .collect();
    let gpus = (0..8u32)
        .map(|i| {
            let bus = 0x10 + 0x20 * i as u8;
            let mut g = h100(&format!("0000:{bus:02x}:00.0"), i);
            g.numa_node = Some(i);
            let socket = i / 4;
            g.socket = Some(socket);
            g.same_socket_numa_nodes = std::iter::once(i)
                .chain((socket * 4..socket * 4 + 4).filter(|n| *n != i))
                .collect();
            g.pcie_root = Some(PcieRoot {
                domain: 0,
                bus: bus - 1,
            });
            g
        })
        .collect();
    Inventory {
        driver_version: Some("560.35".to_owned()),
        cuda_driver_version: Some(CudaVersion {
            major: 12,
            minor: 6,
        }),
        numa_nodes,
        distances: DistanceMatrix::new(ids, values),
        gpus,
        ..Default::default()
    }
}

/// `n` GPUs, one per PCI domain-bus pair, spread over two NUMA nodes.
pub fn many(n: u32) -> Inventory {
    let gpus = (0..n)
        .map(|i| {
            let mut g = h100(&format!("{:04x}:{:02x}:00.0", i / 256, i % 256), i);
            g.numa_node = Some(i % 2);
            g.same_socket_numa_nodes = vec![i % 2];
            g.socket = Some(i % 2);
            g
        })
        .collect();
    Inventory {
        numa_nodes: vec![numa(0, 0, "0-63"), numa(1, 1, "64-127")],
        gpus,
        ..Default::default()
    }
}

/// The allocation results of an allocated claim, to edit in a test.
pub fn allocation_results_mut(
    claim: &mut k8s_openapi::api::resource::v1::ResourceClaim,
) -> &mut Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    claim
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .expect("an allocated claim")
}

/// An int attribute, as a slice carries it.
pub fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

/// A string attribute.
pub fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.to_owned()),
        ..Default::default()
    }
}

/// A version attribute.
pub fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v.to_owned()),
        ..Default::default()
    }
}
