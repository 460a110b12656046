//! Discovery: what the GPUs are (NVML) and where they sit (hwloc, or sysfs as a
//! fallback), joined by PCI bus id into an [`Inventory`].
//!
//! Each backend sits behind a trait (`IdentitySource`, [`TopologySource`]) that
//! returns plain data, and [`assemble`] joins that data with no I/O, so the joining
//! rules are tested without a machine. [`discover`] picks the backends from a
//! [`DiscoveryConfig`] and applies the fallbacks an operator would expect.
//! [`nvml_record`] instead keeps everything NVML answers, failures and the MIG
//! geometry included, for fixtures of real machines and for MIG planning.

mod assemble;
mod error;
pub(crate) mod hwloc;
pub(crate) mod nvml;
pub mod nvml_record;
pub(crate) mod sysfs;

use std::path::PathBuf;

pub use assemble::assemble;
pub use assemble::mig_warning;
pub use error::DiscoveryError;
pub use hwloc::HwlocSource;
pub(crate) use nvml::gpu_instance_info;
pub use nvml::{DEFAULT_NVML_LIB, NvmlSource};
pub use nvml_record::NvmlRecord;
pub use topodra_model::topology::NvlinkRemote;

use topodra_model::IdList;
use topodra_model::inventory::{
    ComputeCapability, CudaVersion, DistanceMatrix, Inventory, MigDevice, MigMode, MigProfile,
    NumaNode,
};
use topodra_model::{PciAddress, PcieRoot};

/// What NVML says about the node's GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdentitySnapshot {
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<CudaVersion>,
    pub gpus: Vec<GpuIdentity>,
    /// GPUs NVML counted but could not describe.
    pub unusable: Vec<String>,
    /// GPUs NVML reports as lost (`NVML_ERROR_GPU_IS_LOST`: fallen off the bus).
    pub lost: Vec<LostGpu>,
}

/// A GPU that answered `NVML_ERROR_GPU_IS_LOST` while being described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostGpu {
    pub index: u32,
    /// NVML keeps a lost GPU's PCI address and UUID; either may still be missing.
    pub pci_bus_id: Option<PciAddress>,
    pub uuid: Option<String>,
}

impl std::fmt::Display for LostGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pci_bus_id {
            Some(bus) => write!(f, "GPU {bus}")?,
            None => write!(f, "GPU index {}", self.index)?,
        }
        if let Some(uuid) = &self.uuid {
            write!(f, " ({uuid})")?;
        }
        Ok(())
    }
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuIdentity {
    pub pci_bus_id: PciAddress,
    pub index: u32,
    pub minor: Option<u32>,
    pub uuid: String,
    pub product_name: Option<String>,
    pub brand: Option<String>,
    pub architecture: Option<String>,
    pub cuda_compute_capability: Option<ComputeCapability>,
    pub memory_bytes: Option<u64>,
    pub mig_mode: Option<MigMode>,
    /// `nvmlDeviceGetNumaNodeId`, unchecked: only kept when the topology shows it
    /// as this GPU's own memory node.
    pub memory_numa_node: Option<u32>,
    /// What each active NVLink ends at.
    pub nvlink_remotes: Vec<NvlinkRemote>,
    /// `<clusterUUID>.<cliqueId>` when the GPU is registered in a multi-node NVLink
    /// fabric (GB200 NVL72).
    pub nvlink_clique: Option<String>,
    /// The MIG devices of a GPU whose MIG mode is on.
    pub mig_devices: Vec<MigDevice>,
    /// The GPU instance profiles and their placements, of a GPU whose MIG mode is on.
    pub mig_profiles: Vec<MigProfile>,
}

/// What hwloc or sysfs says about the node's layout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostTopology {
    /// `hwloc` or `sysfs`, for the inventory's `sources`.
    pub source: String,
    pub numa_nodes: Vec<NumaNode>,
    pub distances: Option<DistanceMatrix>,
    /// NVIDIA display/3D-class PCI functions found in the PCI tree.
    pub gpus: Vec<PciGpu>,
    /// Anything the backend wants an operator to see.
    pub warnings: Vec<String>,
}

/// An NVIDIA GPU's place in the PCI tree.
#[derive(Debug, Clone, PartialEq)]
pub struct PciGpu {
    pub pci_bus_id: PciAddress,
    /// The NUMA nodes of the GPU's locality; one on most machines.
    pub locality_numa_nodes: IdList,
    pub socket: Option<u32>,
    pub local_cpus: IdList,
    pub pcie_root: Option<PcieRoot>,
    /// Upstream PCI-to-PCI bridges, nearest first, root port last.
    pub upstream_bridges: Vec<PciAddress>,
}

/// Supplies GPU identity; NVML in production, fixtures in unit tests.
pub(crate) trait IdentitySource {
    fn identity(&self) -> Result<IdentitySnapshot, DiscoveryError>;
}

/// Supplies the host layout; hwloc or sysfs in production, fixtures in unit tests.
pub trait TopologySource {
    fn topology(&self) -> Result<HostTopology, DiscoveryError>;
}

/// Where topology comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologyInput {
    /// The running machine through hwloc, falling back to sysfs when hwloc fails.
    Live,
    /// A topology exported by `lstopo --of xml`; no fallback, the file was asked for.
    HwlocXml(PathBuf),
    /// Only sysfs, rooted at the given directory (`/sys` on a real node).
    Sysfs(PathBuf),
}

/// Whether NVML must be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmlPolicy {
    /// NVML must load: the kubelet plugin cannot prepare GPUs it cannot identify.
    Required,
    /// Without NVML, list the GPUs the topology shows, without identity, and warn.
    Optional,
    /// Do not try NVML at all.
    Disabled,
}

/// How to discover a node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscoveryConfig {
    /// NVML library to load; `None` uses the system's `libnvidia-ml.so.1`.
    pub nvml_lib: Option<PathBuf>,
    pub nvml: NvmlPolicy,
    pub topology: TopologyInput,
    /// sysfs root for the live fallback.
    pub sysfs_root: PathBuf,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            nvml_lib: None,
            nvml: NvmlPolicy::Required,
            topology: TopologyInput::Live,
            sysfs_root: PathBuf::from("/sys"),
        }
    }
}

/// Discovers the node described by `config`.
pub fn discover(config: &DiscoveryConfig) -> Result<Inventory, DiscoveryError> {
    let mut warnings = Vec::new();

    let identity = match config.nvml {
        NvmlPolicy::Disabled => None,
        policy => match nvml::NvmlSource::new(config.nvml_lib.clone()).identity() {
            Ok(snapshot) => Some(snapshot),
            Err(e) if policy == NvmlPolicy::Optional => {
                warnings.push(format!(
                    "{e}; listing GPUs from the topology only, without identity attributes"
                ));
                None
            }
            Err(e) => return Err(e),
        },
    };

    let topology = match &config.topology {
        TopologyInput::HwlocXml(path) => hwloc::HwlocSource::from_xml(path).topology()?,
        TopologyInput::Sysfs(root) => sysfs::SysfsSource::new(root).topology()?,
        TopologyInput::Live => match hwloc::HwlocSource::live().topology() {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!(
                    "{e}; falling back to sysfs for NUMA and PCIe topology"
                ));
                sysfs::SysfsSource::new(&config.sysfs_root).topology()?
            }
        },
    };

    let mut inventory = assemble(identity, topology)?;
    warnings.append(&mut inventory.warnings);
    inventory.warnings = warnings;
    for w in &inventory.warnings {
        tracing::warn!("{w}");
    }
    Ok(inventory)
}
