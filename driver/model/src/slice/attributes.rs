//! The attribute schema: what one GPU says about itself in a ResourceSlice.
//!
//! An attribute is published only when the inventory knows its value; a selector that
//! tests a missing attribute fails to match, which is the honest answer, whereas a
//! made-up default would let the scheduler align devices that are not aligned.
//!
//! Which attributes a whole GPU carries is the operator's choice of [`AttributeSet`]:
//! the lean default leaves out the three of [`FULL_ONLY`], whose values follow from
//! attributes it keeps, because every byte of a device is stored in etcd, held by the
//! API server and sent to every watcher of ResourceSlices, once per GPU of the fleet.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

use super::quantity;
use super::validate::{MAX_VALUE_LEN, check_version};
use super::{NumaNodeFormat, SliceOptions};
use crate::inventory::{AllocatableDevice, Gpu, Inventory, MigProfile};

// Standard names, shared with other drivers so that a claim can align a GPU with a NIC
// or CPU from another driver through `matchAttribute`.
pub(crate) const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
pub(crate) const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

// Driver-domain names are unqualified: the API reads them as `<driver>/<name>`, so they
// follow the driver name an operator configures. The first group matches NVIDIA's
// driver so that CEL selectors written for it keep working.
pub(crate) const TYPE: &str = "type";
pub(crate) const UUID: &str = "uuid";
pub(crate) const MINOR: &str = "minor";
pub(crate) const PRODUCT_NAME: &str = "productName";
pub(crate) const BRAND: &str = "brand";
pub(crate) const ARCHITECTURE: &str = "architecture";
pub(crate) const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
pub(crate) const DRIVER_VERSION: &str = "driverVersion";
pub(crate) const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";

// Topology no other driver publishes.
pub(crate) const SOCKET: &str = "socket";
pub(crate) const PCIE_SWITCH: &str = "pcieSwitch";
pub(crate) const NVLINK_DOMAIN: &str = "nvlinkDomain";
pub(crate) const MEMORY_NUMA_NODE: &str = "memoryNumaNode";
pub(crate) const NVLINK_CLIQUE: &str = "nvlinkClique";

// MIG devices: which GPU they are part of and which slice of it, named as NVIDIA's
// driver names them so selectors port.
pub(crate) const PROFILE: &str = "profile";
pub(crate) const PARENT_UUID: &str = "parentUUID";
pub(crate) const PARENT_MINOR: &str = "parentMinor";
pub(crate) const GPU_INSTANCE: &str = "gpuInstance";
pub(crate) const COMPUTE_INSTANCE: &str = "computeInstance";

/// Capacity name for the device's memory.
pub(crate) const MEMORY: &str = "memory";
/// Capacity name for a MIG device's streaming multiprocessors.
pub(crate) const MULTIPROCESSORS: &str = "multiprocessors";

/// The attributes only [`AttributeSet::Full`] publishes. Each follows from one the lean
/// set keeps, and no class, policy, example, document or the controller selects on it:
/// - `brand`: on every data-centre GPU NVML reports `NVIDIA`, and where it does not
///   (`Tesla`, `GeForce`, `Quadro`) `productName` names the line too;
/// - `architecture`: a function of `cudaComputeCapability` (8.0 and 8.6 Ampere, 8.9
///   Ada, 9.0 Hopper, 10.0 and 12.0 Blackwell, …), which a selector compares as a
///   version (`isGreaterThan(semver("8.9.0"))`) instead of listing names;
/// - `cudaDriverVersion`: the highest CUDA version of the kernel driver, fixed by its
///   branch, so `driverVersion` (the same for every GPU of the node) decides it.
///
/// NVIDIA's DRA driver publishes all three, so selectors ported from it that read them
/// need [`AttributeSet::Full`] or a rewrite onto the attributes above.
pub const FULL_ONLY: [&str; 3] = [BRAND, ARCHITECTURE, CUDA_DRIVER_VERSION];

/// Which attributes a whole GPU carries (`--attributes`, chart
/// `kubeletPlugin.attributes`). MIG devices and shared devices take their GPU's, so
/// the choice holds for them too; dynamic MIG partitions carry only topology and
/// identity either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttributeSet {
    /// Everything but [`FULL_ONLY`]: topology (`resource.kubernetes.io/numaNode`,
    /// `pcieRoot`, `pciBusID`, `socket`, `pcieSwitch`, `nvlinkDomain`, `nvlinkClique`,
    /// `memoryNumaNode`), identity (`type`, `uuid`, `minor`) and what selectors pick a
    /// GPU by (`productName`, `cudaComputeCapability`, `driverVersion`). A DGX H100's
    /// GPU takes 540 bytes of slice spec, under the 568 of NVIDIA's attribute set.
    #[default]
    Lean,
    /// Every attribute topodra knows, the set before lean slices.
    Full,
}

impl AttributeSet {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Lean => "lean",
            Self::Full => "full",
        }
    }

    /// Whether a whole GPU's attribute `name` is published under this set.
    pub fn publishes(self, name: &str) -> bool {
        self == Self::Full || !FULL_ONLY.contains(&name)
    }
}

impl fmt::Display for AttributeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An attribute set other than `lean` or `full`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid attribute set {0:?}: expected \"lean\" or \"full\"")]
pub struct AttributeSetError(pub String);

impl FromStr for AttributeSet {
    type Err = AttributeSetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lean" => Ok(Self::Lean),
            "full" => Ok(Self::Full),
            _ => Err(AttributeSetError(s.to_owned())),
        }
    }
}

/// Value of [`TYPE`] for a whole GPU.
pub(crate) const TYPE_GPU: &str = "gpu";
/// Value of [`TYPE`] for a MIG device.
pub(crate) const TYPE_MIG: &str = "mig";

/// The attributes of one GPU, keyed by attribute name.
///
/// A string the API would refuse (over 64 bytes) is left out with a warning rather than
/// cut short: a truncated product name or domain id would be a value nobody reported,
/// and refusing the whole slice would hide every GPU of the node over one label.
pub(crate) fn device_attributes(
    gpu: &Gpu,
    inv: &Inventory,
    opts: &SliceOptions,
) -> BTreeMap<String, DeviceAttribute> {
    let mut a = Attributes::new(gpu);

    a.string(PCI_BUS_ID, Some(gpu.pci_bus_id.to_string()));
    a.string(PCIE_ROOT, gpu.pcie_root.map(|r| r.to_string()));
    // The aliases carry the same value in the same form, so a constraint over any of
    // the names aligns exactly as one over the standard name would.
    let aliases = opts.numa_node_aliases.iter().map(|a| a.as_str());
    for name in std::iter::once(NUMA_NODE).chain(aliases) {
        match opts.numa_node_format {
            NumaNodeFormat::Int => a.int(name, gpu.numa_node),
            NumaNodeFormat::List => a.ints(name, numa_node_list(gpu)),
        }
    }

    a.string(TYPE, Some(TYPE_GPU.to_owned()));
    a.string(UUID, gpu.uuid.clone());
    a.int(MINOR, gpu.minor);
    a.string(PRODUCT_NAME, gpu.product_name.clone());
    a.version(
        CUDA_COMPUTE_CAPABILITY,
        gpu.cuda_compute_capability
            .map(|c| format!("{}.{}.0", c.major, c.minor)),
    );
    a.version(
        DRIVER_VERSION,
        inv.driver_version.as_deref().and_then(normalize_version),
    );
    // Not computed at all under the lean set, so a value the API would refuse is not
    // warned about for an attribute nobody asked for.
    if opts.attributes == AttributeSet::Full {
        a.string(BRAND, gpu.brand.clone());
        a.string(ARCHITECTURE, gpu.architecture.clone());
        a.version(
            CUDA_DRIVER_VERSION,
            inv.cuda_driver_version
                .map(|v| format!("{}.{}.0", v.major, v.minor)),
        );
    }

    a.int(SOCKET, socket(gpu, inv));
    a.string(PCIE_SWITCH, gpu.pcie_switch.map(|s| s.to_string()));
    a.string(NVLINK_DOMAIN, gpu.nvlink_domain.clone());
    a.int(MEMORY_NUMA_NODE, gpu.memory_numa_node);
    a.string(NVLINK_CLIQUE, gpu.nvlink_clique.clone());

    a.map
}

/// The attributes of one allocatable device: a whole GPU's, or for a MIG device its
/// parent's topology and identity with the MIG device's own UUID, type and profile.
/// The parent's minor becomes `parentMinor`, so a selector on `minor` never
/// matches a slice of a GPU by mistake.
pub(crate) fn allocatable_attributes(
    dev: &AllocatableDevice,
    inv: &Inventory,
    opts: &SliceOptions,
) -> BTreeMap<String, DeviceAttribute> {
    let gpu = &dev.gpu;
    let mut map = device_attributes(gpu, inv, opts);
    let Some(mig) = &dev.mig else {
        return map;
    };
    map.remove(MINOR);
    let mut a = Attributes::new(gpu);
    a.string(TYPE, Some(TYPE_MIG.to_owned()));
    a.string(UUID, Some(mig.uuid.clone()));
    a.string(PROFILE, mig.profile.clone());
    a.string(PARENT_UUID, gpu.uuid.clone());
    a.int(PARENT_MINOR, gpu.minor);
    a.int(GPU_INSTANCE, Some(mig.gpu_instance));
    a.int(COMPUTE_INSTANCE, Some(mig.compute_instance));
    map.extend(a.map);
    map
}

/// What every dynamic MIG partition of a GPU says alike: what selectors,
/// constraints and the controller use, and nothing else, since a GPU has about
/// twenty partitions and every byte is stored and sent to every watcher that many
/// times. The parent's topology (so `matchAttribute` and GPU + CPU alignment work
/// for partitions), its UUID and the type. Identity a selector wants (product,
/// driver version) is on the whole GPU device of the same parent. Built once per
/// GPU; [`partition_attributes`] adds each partition's profile.
pub(crate) fn partition_shared_attributes(
    gpu: &Gpu,
    inv: &Inventory,
    opts: &SliceOptions,
) -> BTreeMap<String, DeviceAttribute> {
    let mut map = device_attributes(gpu, inv, opts);
    let aliases: Vec<&str> = opts.numa_node_aliases.iter().map(|a| a.as_str()).collect();
    map.retain(|name, _| {
        [NUMA_NODE, PCIE_ROOT, SOCKET, PCIE_SWITCH, NVLINK_DOMAIN].contains(&name.as_str())
            || aliases.contains(&name.as_str())
    });
    let mut a = Attributes::new(gpu);
    a.string(TYPE, Some(TYPE_MIG.to_owned()));
    a.string(PARENT_UUID, gpu.uuid.clone());
    map.extend(a.map);
    map
}

/// The attributes of one partition: its GPU's shared ones and its profile.
pub(crate) fn partition_attributes(
    gpu: &Gpu,
    shared: &BTreeMap<String, DeviceAttribute>,
    profile: &str,
) -> BTreeMap<String, DeviceAttribute> {
    let mut a = Attributes::new(gpu);
    a.string(PROFILE, Some(profile.to_owned()));
    let mut map = shared.clone();
    map.extend(a.map);
    map
}

/// A partition's capacities: its profile's memory and multiprocessors.
pub(crate) fn partition_capacity(p: &MigProfile) -> BTreeMap<String, DeviceCapacity> {
    BTreeMap::from([
        (
            MEMORY.to_owned(),
            capacity(quantity::bytes(p.memory_mib.saturating_mul(1 << 20))),
        ),
        (
            MULTIPROCESSORS.to_owned(),
            capacity(Quantity(p.multiprocessors.to_string())),
        ),
    ])
}

/// The capacities of one GPU: its memory, when NVML reported it.
pub(crate) fn device_capacity(gpu: &Gpu) -> BTreeMap<String, DeviceCapacity> {
    gpu.memory_bytes
        .map(|b| (MEMORY.to_owned(), capacity(quantity::bytes(b))))
        .into_iter()
        .collect()
}

/// The capacities of one allocatable device: a MIG device's own memory and
/// multiprocessors rather than its parent's.
pub(crate) fn allocatable_capacity(dev: &AllocatableDevice) -> BTreeMap<String, DeviceCapacity> {
    let Some(mig) = &dev.mig else {
        return device_capacity(&dev.gpu);
    };
    let mut out = BTreeMap::new();
    if let Some(b) = mig.memory_bytes {
        out.insert(MEMORY.to_owned(), capacity(quantity::bytes(b)));
    }
    if let Some(sm) = mig.multiprocessors {
        out.insert(
            MULTIPROCESSORS.to_owned(),
            capacity(Quantity(sm.to_string())),
        );
    }
    out
}

fn capacity(value: Quantity) -> DeviceCapacity {
    DeviceCapacity {
        value,
        ..Default::default()
    }
}

/// A dotted numeric version as semver 2.0.0 (`550.90.07` → `550.90.7`, `560.35` →
/// `560.35.0`), or `None` when it is not one to three numbers.
///
/// NVIDIA pads driver versions with zeros, which semver forbids; the number is what
/// matters, so a selector like `>= 550.90.7` compares the way an operator means it.
pub(crate) fn normalize_version(raw: &str) -> Option<String> {
    let parts: Vec<&str> = raw.trim().split('.').collect();
    if parts.len() > 3 {
        return None;
    }
    let mut nums = parts
        .iter()
        .map(|p| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse::<u64>().ok()
        })
        .collect::<Option<Vec<u64>>>()?;
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// The GPU's socket, or that of its NUMA node when discovery only placed it there.
pub(crate) fn socket(gpu: &Gpu, inv: &Inventory) -> Option<u32> {
    gpu.socket
        .or_else(|| inv.numa_node(gpu.numa_node?).and_then(|n| n.socket))
}

/// KEP-6072 list form: the own node first, whatever order discovery produced.
fn numa_node_list(gpu: &Gpu) -> Option<Vec<u32>> {
    let own = gpu.numa_node?;
    let mut list = vec![own];
    list.extend(gpu.same_socket_numa_nodes.iter().filter(|n| **n != own));
    Some(list)
}

struct Attributes<'a> {
    gpu: &'a Gpu,
    map: BTreeMap<String, DeviceAttribute>,
}

impl<'a> Attributes<'a> {
    fn new(gpu: &'a Gpu) -> Self {
        Self {
            gpu,
            map: BTreeMap::new(),
        }
    }

    fn string(&mut self, name: &str, value: Option<String>) {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return;
        };
        if value.len() > MAX_VALUE_LEN {
            self.skip(name, &value, "longer than 64 bytes");
            return;
        }
        self.map.insert(
            name.to_owned(),
            DeviceAttribute {
                string: Some(value),
                ..Default::default()
            },
        );
    }

    fn version(&mut self, name: &str, value: Option<String>) {
        let Some(value) = value else { return };
        if let Err(reason) = check_version(&value) {
            self.skip(name, &value, reason);
            return;
        }
        self.map.insert(
            name.to_owned(),
            DeviceAttribute {
                version: Some(value),
                ..Default::default()
            },
        );
    }

    fn int(&mut self, name: &str, value: Option<u32>) {
        if let Some(v) = value {
            self.map.insert(
                name.to_owned(),
                DeviceAttribute {
                    int: Some(i64::from(v)),
                    ..Default::default()
                },
            );
        }
    }

    fn ints(&mut self, name: &str, values: Option<Vec<u32>>) {
        if let Some(v) = values.filter(|v| !v.is_empty()) {
            self.map.insert(
                name.to_owned(),
                DeviceAttribute {
                    ints: Some(v.into_iter().map(i64::from).collect()),
                    ..Default::default()
                },
            );
        }
    }

    fn skip(&self, name: &str, value: &str, reason: &str) {
        tracing::warn!(
            device = %self.gpu.device_name(),
            attribute = name,
            value,
            reason,
            "attribute not published: the API would refuse its value"
        );
    }
}

#[cfg(test)]
mod tests;
