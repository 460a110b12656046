//! What a node has: its NUMA nodes and its GPUs, with identity (from NVML) and
//! topology (from hwloc or sysfs) joined by PCI bus id.
//!
//! Every field a source may fail to provide is an `Option`, so a GPU that only one
//! source sees is still described as far as it is known, and nothing is invented.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cpuset::IdList;
use crate::pci::{PciAddress, PcieRoot};

/// The whole picture of one node, ready to be turned into ResourceSlices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// Which backends produced this picture, e.g. `nvml` and `hwloc`.
    pub sources: Sources,
    /// NVIDIA kernel driver version as NVML reports it (`550.90.07`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports, as `major.minor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<CudaVersion>,
    pub numa_nodes: Vec<NumaNode>,
    /// NUMA distances (ACPI SLIT), when the topology source has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distances: Option<DistanceMatrix>,
    /// GPUs sorted by PCI bus id.
    pub gpus: Vec<Gpu>,
    /// GPUs that only one of the two sources saw (`discover --strict` fails on them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unjoined: Vec<PciAddress>,
    /// Things an operator should know: a source missing, a GPU only one source saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

/// A CUDA driver API version (NVML encodes it as `major * 1000 + minor * 10`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub fn from_nvml(v: i32) -> Option<Self> {
        let v = u32::try_from(v).ok().filter(|v| *v > 0)?;
        Some(Self {
            major: v / 1000,
            minor: (v % 1000) / 10,
        })
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What kind of memory a NUMA node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NumaKind {
    /// A node with CPUs.
    Cpu,
    /// Memory without CPUs (CXL, HBM, or unknown).
    CpuLess,
    /// A GPU's own memory exposed as a NUMA node (GH200, GB200).
    GpuMemory,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaNode {
    /// The OS index, as in `/sys/devices/system/node/nodeN`; ids may be sparse.
    pub id: u32,
    /// Package (socket) OS index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<u32>,
    pub cpus: IdList,
    pub memory_bytes: u64,
    pub kind: NumaKind,
}

/// A square NUMA distance matrix keyed by NUMA node id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistanceMatrix {
    /// Node ids in row order.
    pub nodes: Vec<u32>,
    /// Row-major distances, `nodes.len()` squared.
    pub values: Vec<u64>,
}

impl DistanceMatrix {
    /// Returns `None` when the value count does not match the node count.
    pub fn new(nodes: Vec<u32>, values: Vec<u64>) -> Option<Self> {
        (Some(values.len()) == nodes.len().checked_mul(nodes.len()))
            .then_some(Self { nodes, values })
    }

    pub fn get(&self, from: u32, to: u32) -> Option<u64> {
        let i = self.nodes.iter().position(|n| *n == from)?;
        let j = self.nodes.iter().position(|n| *n == to)?;
        // In range by construction (`new` checks the length); checked all the same.
        let at = i.checked_mul(self.nodes.len())?.checked_add(j)?;
        self.values.get(at).copied()
    }

    pub fn rows(&self) -> BTreeMap<u32, Vec<u64>> {
        let n = self.nodes.len().max(1);
        self.nodes
            .iter()
            .zip(self.values.chunks(n))
            .map(|(id, row)| (*id, row.to_vec()))
            .collect()
    }
}

/// CUDA compute capability (`9.0` for Hopper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// MIG mode as NVML reports it: what is in force, and what applies after a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// One physical GPU. Identity fields come from NVML, topology fields from hwloc or
/// sysfs; either group is empty when its source did not see this GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// The join key between sources, in sysfs spelling.
    pub pci_bus_id: PciAddress,

    // Identity (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Minor number of `/dev/nvidiaN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brand: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_compute_capability: Option<ComputeCapability>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigMode>,
    /// The NUMA node that holds this GPU's own memory (coherent C2C systems).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_numa_node: Option<u32>,

    // Topology (hwloc or sysfs).
    /// The NUMA node the GPU is attached to; `None` when unknown or ambiguous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// KEP-6072 list form: own node first, then same-socket nodes at minimum distance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_socket_numa_nodes: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<u32>,
    #[serde(default, skip_serializing_if = "IdList::is_empty")]
    pub local_cpus: IdList,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<PcieRoot>,
    /// Upstream port of the nearest PCIe switch that also has another GPU below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<PciAddress>,

    // Interconnect (NVML).
    /// Other GPUs of this node reachable over NVLink, directly or through NVSwitch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<PciAddress>,
    /// Shared by all GPUs of one NVLink-connected group on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    /// The multi-node NVLink clique (GB200 NVL72) this GPU belongs to, as
    /// `<clusterUUID>.<cliqueId>`, when the fabric manager has registered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_clique: Option<String>,

    /// The MIG devices of a GPU in MIG mode; such a GPU is offered only as these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
    /// The GPU instance profiles NVML offers for this GPU and where each may be
    /// placed: what dynamic MIG publishes as partitions. Empty for a GPU without MIG.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_profiles: Vec<MigProfile>,
}

/// One GPU instance profile (`nvmlGpuInstanceProfileInfo_v2_t`) and its possible
/// placements (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigProfile {
    /// nvml.h: "Unique profile ID within the device"; what GPU instance creation
    /// takes.
    pub id: u32,
    /// `1g.10gb`, `1g.10gb+me`: NVML's name without the `MIG ` in front.
    pub name: String,
    /// Compute slices (the `7` of `7g.80gb`); placements count memory slices.
    pub slice_count: u32,
    /// How many instances of it the GPU holds at most.
    pub instance_count: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub placements: Vec<MigPlacement>,
}

/// Where a GPU instance lies, in memory slices (nvml.h: `start` "Index of first
/// occupied memory slice", `size` "Number of memory slices occupied").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MigPlacement {
    pub start: u32,
    pub size: u32,
}

/// One existing MIG device (a compute instance inside a GPU instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    /// `MIG-<uuid>`, what CUDA_VISIBLE_DEVICES and `nvidia-smi -L` name it by.
    pub uuid: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// The MIG profile, e.g. `1g.10gb` or `1c.2g.20gb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiprocessors: Option<u32>,
    /// Its GPU instance's memory slices, as NVML reports them: what dynamic MIG
    /// counts as taken on the GPU. `None` where NVML did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<MigPlacement>,
    /// Its GPU instance's profile id (`nvmlGpuInstanceInfo_t.profileId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<u32>,
}

/// How a GPU is offered, from its MIG mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// As one whole device (no MIG, or MIG off and staying off).
    Whole,
    /// As its MIG devices (MIG on and staying on).
    Mig,
    /// Not at all: a MIG mode change waits for a GPU reset, and until then the GPU
    /// can run neither a whole-GPU workload reliably nor a MIG one.
    MigChangePending,
}

/// One device of the node as the ResourceSlice offers it: a whole GPU, or one MIG
/// device of it. The parent GPU carries the topology both share.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatableDevice {
    pub gpu: Gpu,
    pub mig: Option<MigDevice>,
}

impl AllocatableDevice {
    /// `gpu-<minor>` for a whole GPU, `gpu-<minor>-mig-<gi>-<ci>` for a MIG device.
    pub fn name(&self) -> String {
        match &self.mig {
            None => self.gpu.device_name(),
            Some(m) => format!(
                "{}-mig-{}-{}",
                self.gpu.device_name(),
                m.gpu_instance,
                m.compute_instance
            ),
        }
    }

    /// The UUID a workload sees: the MIG device's, or the GPU's.
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn uuid(&self) -> Option<&str> {
        match &self.mig {
            Some(m) => Some(&m.uuid),
            None => self.gpu.uuid.as_deref(),
        }
    }

    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn memory_bytes(&self) -> Option<u64> {
        match &self.mig {
            Some(m) => m.memory_bytes,
            None => self.gpu.memory_bytes,
        }
    }
}

impl Gpu {
    /// A GPU known only by its address, to be filled in by the sources.
    pub fn at(pci_bus_id: PciAddress) -> Self {
        Self {
            pci_bus_id,
            index: None,
            minor: None,
            uuid: None,
            product_name: None,
            brand: None,
            architecture: None,
            cuda_compute_capability: None,
            memory_bytes: None,
            mig_mode: None,
            memory_numa_node: None,
            numa_node: None,
            same_socket_numa_nodes: Vec::new(),
            socket: None,
            local_cpus: IdList::new(),
            pcie_root: None,
            pcie_switch: None,
            nvlink_peers: Vec::new(),
            nvlink_domain: None,
            nvlink_clique: None,
            mig_devices: Vec::new(),
            mig_profiles: Vec::new(),
        }
    }

    /// How this GPU is offered, from its MIG mode (no MIG support means whole).
    pub fn offer(&self) -> Offer {
        match self.mig_mode {
            None
            | Some(MigMode {
                current: false,
                pending: false,
            }) => Offer::Whole,
            Some(MigMode {
                current: true,
                pending: true,
            }) => Offer::Mig,
            Some(_) => Offer::MigChangePending,
        }
    }

    /// The devices this GPU is offered as, from its MIG mode: itself, its MIG
    /// devices, or nothing while a MIG mode change waits for a reset.
    pub fn allocatable(&self) -> Vec<AllocatableDevice> {
        match self.offer() {
            Offer::Whole => vec![AllocatableDevice {
                gpu: self.clone(),
                mig: None,
            }],
            Offer::Mig => self
                .mig_devices
                .iter()
                .map(|m| AllocatableDevice {
                    gpu: self.clone(),
                    mig: Some(m.clone()),
                })
                .collect(),
            Offer::MigChangePending => Vec::new(),
        }
    }

    /// The device name in the ResourceSlice: `gpu-<minor>`, or, for a GPU NVML did not
    /// describe, one derived from its PCI address so it is still a stable DNS label.
    pub fn device_name(&self) -> String {
        match self.minor {
            Some(minor) => format!("gpu-{minor}"),
            None => format!("gpu-pci-{}", self.pci_bus_id.to_label()),
        }
    }
}

impl Inventory {
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn gpu(&self, bus_id: PciAddress) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.pci_bus_id == bus_id)
    }

    pub(crate) fn numa_node(&self, id: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.id == id)
    }

    /// Every device the node offers, GPU by GPU in bus order: whole GPUs, the MIG
    /// devices of GPUs in MIG mode, nothing for a GPU waiting for a MIG mode change.
    pub fn allocatable(&self) -> Vec<AllocatableDevice> {
        self.gpus.iter().flat_map(Gpu::allocatable).collect()
    }
}

#[cfg(test)]
mod tests;
