//! Hand-built inventories, attribute values and a claim helper, for the library's
//! tests and, with the feature `test-fixtures`, for the node crate's.

// Fixtures panic on bad test data, as the tests that use them would.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::resource::v1::DeviceAttribute;

use crate::cpuset::IdList;
use crate::inventory::{
    ComputeCapability, CudaVersion, DistanceMatrix, Gpu, Inventory, MigMode, MigPlacement,
    MigProfile, NumaKind, NumaNode,
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

/// The GPU instance profiles of an H100 80GB HBM3 as NVML reports them: NVIDIA's
/// MIG User Guide (r580), Table 7, with ids, SMs and memory from `nvidia-smi mig
/// -lgip` and placements from `-lgipp` (the fake NVML's table cites the same).
/// Engines are `[copy engines, decoders, encoders, JPEG, OFA]`.
pub fn h100_mig_profiles() -> Vec<MigProfile> {
    let ones: Vec<(u32, u32)> = (0..7).map(|s| (s, 1)).collect();
    type Row = (
        u32,
        &'static str,
        u32,
        u32,
        u32,
        [u32; 5],
        u64,
        Vec<(u32, u32)>,
    );
    let rows: [Row; 7] = [
        (19, "1g.10gb", 1, 7, 16, [1, 1, 0, 1, 0], 9984, ones.clone()),
        (
            14,
            "2g.20gb",
            2,
            3,
            32,
            [2, 2, 0, 2, 0],
            20096,
            vec![(0, 2), (2, 2), (4, 2)],
        ),
        (
            9,
            "3g.40gb",
            3,
            2,
            60,
            [3, 3, 0, 3, 0],
            40448,
            vec![(0, 4), (4, 4)],
        ),
        (5, "4g.40gb", 4, 1, 64, [4, 4, 0, 4, 0], 40448, vec![(0, 4)]),
        (
            0,
            "7g.80gb",
            7,
            1,
            132,
            [8, 7, 0, 7, 1],
            81152,
            vec![(0, 8)],
        ),
        (20, "1g.10gb+me", 1, 1, 16, [1, 1, 0, 1, 1], 9984, ones),
        (
            15,
            "1g.20gb",
            1,
            4,
            26,
            [1, 1, 0, 1, 0],
            20096,
            vec![(0, 2), (2, 2), (4, 2), (6, 2)],
        ),
    ];
    rows.into_iter()
        .map(
            |(id, name, slices, instances, sms, e, mib, placements)| MigProfile {
                id,
                name: name.to_owned(),
                slice_count: slices,
                instance_count: instances,
                memory_mib: mib,
                multiprocessors: sms,
                copy_engines: e[0],
                decoders: e[1],
                encoders: e[2],
                jpeg_engines: e[3],
                ofa_engines: e[4],
                placements: placements
                    .into_iter()
                    .map(|(start, size)| MigPlacement { start, size })
                    .collect(),
            },
        )
        .collect()
}

/// A DGX H100 whose GPUs are in MIG mode with no MIG devices, each with its
/// profiles: what dynamic MIG carves.
pub fn dgx_h100_mig() -> Inventory {
    let mut inv = dgx_h100();
    for g in &mut inv.gpus {
        g.mig_mode = Some(MigMode {
            current: true,
            pending: true,
        });
        g.mig_profiles = h100_mig_profiles();
    }
    inv
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

/// Every device of `slices`, in publishing order.
pub fn devices(
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
) -> Vec<&k8s_openapi::api::resource::v1::Device> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}

/// Every counter set of `slices`, in publishing order.
pub fn counter_sets(
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
) -> Vec<&k8s_openapi::api::resource::v1::CounterSet> {
    slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .collect()
}
