//! ResourceSlice content: how this node's GPUs are published to the scheduler.
//!
//! Pure logic, no I/O: [`build_slices`] turns an [`Inventory`] into the ResourceSlice
//! objects of this node's pool, exactly as the publisher sends them with server-side
//! apply, after checking them against the API server's rules (`validate`).
//!
//! - One pool per node, named after the node, holding one device per GPU
//!   (`Gpu::device_name`), with the attributes of [`attributes`] and its memory as
//!   capacity.
//! - Devices appear in allocation order (socket, NUMA node, PCIe switch, root, bus id)
//!   because the scheduler allocates first-fit.
//! - The pool is split into as few slices as the API's per-slice device limits allow;
//!   every slice carries the pool generation and the total slice count.
//! - A node without GPUs still publishes one empty slice, so the scheduler knows the
//!   pool is complete and empty rather than not yet published.

pub mod aliases;
pub mod attributes;
mod order;
mod partitions;
pub(crate) mod quantity;
pub(crate) mod sharing;
mod split;
pub(crate) mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};

pub use aliases::{
    MAX_NUMA_NODE_ALIASES, NumaNodeAlias, NumaNodeAliasError, check_numa_node_aliases,
};
pub use attributes::{AttributeSet, AttributeSetError};
pub(crate) use attributes::{allocatable_attributes, allocatable_capacity};
pub use partitions::{DynamicDevice, DynamicMig, dynamic_devices, partition_device_name};
pub use sharing::{
    MEMORY_STEP, Mps, SharedDevice, SharedPartition, Sharing, SharingMode, TimeSlicing,
    interval_name, shared_devices,
};
pub(crate) use validate::validate_pool;

use crate::IdList;
use crate::inventory::{AllocatableDevice, Inventory};

/// The driver name unless the operator picks another.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.topodra.dev";

/// Label on every slice we publish, so `kubectl get resourceslices -l` finds them.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "topodra";
/// Label with the node name. `spec.nodeName` already supports field selectors; the
/// label is for tools that only select by label. Left off when the node name is not a
/// valid label value (over 63 characters).
pub(crate) const NODE_LABEL: &str = "topodra.dev/node";

/// Annotation on each of a node's slices: the node's NUMA node ids, as a list
/// (`0-1`, `0,2-3`). The controller takes another driver's NUMA ids for the node
/// (the CPU driver's) only where they are among these, so a slice of that driver
/// cannot give a two-NUMA node a zone for each id up to 1023.
pub const NUMA_NODES_ANNOTATION: &str = "topodra.dev/numa-nodes";

/// How `resource.kubernetes.io/numaNode` is published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NumaNodeFormat {
    /// A single int, the GPU's own NUMA node: what every consumer understands.
    #[default]
    Int,
    /// KEP-6072 list form: the own node first, then the same-socket nodes at the
    /// minimum distance, so a CPU or NIC on a neighbouring sub-NUMA node still aligns.
    /// A list-typed attribute halves the devices a slice may hold (128 to 64).
    List,
}

impl NumaNodeFormat {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Int => "int",
            Self::List => "list",
        }
    }
}

impl fmt::Display for NumaNodeFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A NUMA node format other than `int` or `list`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NUMA node format {0:?}: expected \"int\" or \"list\"")]
pub struct NumaNodeFormatError(pub String);

impl FromStr for NumaNodeFormat {
    type Err = NumaNodeFormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "int" => Ok(Self::Int),
            "list" => Ok(Self::List),
            _ => Err(NumaNodeFormatError(s.to_owned())),
        }
    }
}

/// What the operator and the publisher decide; the inventory says the rest.
// Not `Eq`: k8s-openapi's `DeviceTaint` is only `PartialEq`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SliceOptions {
    pub driver_name: String,
    pub node_name: String,
    pub numa_node_format: NumaNodeFormat,
    /// Other drivers' names for the NUMA node, published with the same value
    /// (see [`aliases`]).
    pub numa_node_aliases: Vec<NumaNodeAlias>,
    /// Which attributes a GPU carries: the lean default, or every one
    /// ([`AttributeSet`]).
    pub attributes: AttributeSet,
    /// Bumped by the publisher whenever the pool's content changes.
    pub pool_generation: i64,
    /// UID of the core/v1 Node; when known, slices are owned by the Node and are
    /// garbage-collected with it.
    pub node_uid: Option<String>,
    /// Fewer devices per slice than the API allows; for tests that need splitting.
    pub max_devices_per_slice: Option<usize>,
    /// Taints by device name, from health checks: a GPU that went bad stays in the
    /// pool, so claims already on it keep a device to refer to, while the scheduler
    /// stops placing new claims there. A tainted device halves its slice's limit.
    pub device_taints: BTreeMap<String, Vec<DeviceTaint>>,
    /// Which GPUs publish their possible MIG partitions beside the whole GPU,
    /// with a counter set that keeps the two apart ([`partitions`]).
    pub dynamic_mig: DynamicMig,
    /// The MIG instances this plugin made for prepared claims, by parent GPU UUID
    /// and memory slices (start, size): allocated partitions, where every other
    /// instance on a GPU is someone else's and takes its slices for good.
    pub own_mig_instances: BTreeSet<(String, u32, u32)>,
    /// Which shared devices each GPU publishes beside its exclusive one
    /// ([`sharing`]).
    pub sharing: Sharing,
}

impl SliceOptions {
    /// Defaults for everything but the node: the default driver name, int NUMA nodes,
    /// the lean attribute set, generation 1, no owner.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            node_name: node_name.into(),
            numa_node_format: NumaNodeFormat::Int,
            numa_node_aliases: Vec::new(),
            attributes: AttributeSet::Lean,
            pool_generation: 1,
            node_uid: None,
            max_devices_per_slice: None,
            device_taints: BTreeMap::new(),
            dynamic_mig: DynamicMig::Off,
            own_mig_instances: BTreeSet::new(),
            sharing: Sharing::default(),
        }
    }
}

/// Why slices cannot be built or would be refused by the API server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SliceError {
    #[error(
        "driver name {name:?} is invalid ({reason}): it must be a DNS subdomain of at most 63 characters"
    )]
    DriverName { name: String, reason: &'static str },
    #[error(
        "node name {name:?} is invalid ({reason}): it must be a DNS subdomain of at most 253 characters"
    )]
    NodeName { name: String, reason: &'static str },
    #[error(
        "pool name {name:?} is invalid ({reason}): it must be a DNS subdomain of at most 253 characters"
    )]
    PoolName { name: String, reason: &'static str },
    #[error(
        "ResourceSlice name {name:?} is invalid ({reason}): it must be a DNS subdomain of at most 253 characters"
    )]
    SliceName { name: String, reason: &'static str },
    #[error(
        "device name {device:?} is invalid ({reason}): it must be a DNS label of at most 63 characters"
    )]
    DeviceName {
        device: String,
        reason: &'static str,
    },
    #[error("device {device:?} appears more than once in pool {pool:?}")]
    DuplicateDevice { pool: String, device: String },
    #[error("ResourceSlice {slice:?} appears more than once in the pool")]
    DuplicateSlice { slice: String },
    #[error("device {device:?}: attribute or capacity name {attribute:?} is invalid: {reason}")]
    AttributeName {
        device: String,
        attribute: String,
        reason: &'static str,
    },
    #[error("device {device:?}: attribute or capacity {attribute:?} is given twice")]
    DuplicateAttribute { device: String, attribute: String },
    #[error("device {device:?} has {count} attributes and capacities, over the limit of {max}")]
    TooManyAttributes {
        device: String,
        count: usize,
        max: usize,
    },
    #[error("device {device:?}: attribute {attribute:?} must set exactly one value, sets {count}")]
    ValueCount {
        device: String,
        attribute: String,
        count: usize,
    },
    #[error("device {device:?}: attribute {attribute:?} is an empty list; lists must not be empty")]
    EmptyList { device: String, attribute: String },
    #[error(
        "device {device:?}: attribute {attribute:?} value {value:?} is {len} bytes, over the limit of {max}"
    )]
    ValueTooLong {
        device: String,
        attribute: String,
        value: String,
        len: usize,
        max: usize,
    },
    #[error(
        "device {device:?}: attribute {attribute:?} value {value:?} is not a semver 2.0.0 version: {reason}"
    )]
    InvalidVersion {
        device: String,
        attribute: String,
        value: String,
        reason: &'static str,
    },
    #[error(
        "ResourceSlice {slice:?} has {count} devices, over the limit of {max} \
         (128, or 64 when a device has taints, counters or list-typed attributes)"
    )]
    TooManyDevices {
        slice: String,
        count: usize,
        max: usize,
    },
    #[error("ResourceSlice {slice:?}: pool generation {generation} is negative")]
    NegativeGeneration { slice: String, generation: i64 },
    #[error(
        "ResourceSlice {slice:?}: resourceSliceCount is {declared} but the pool has {}",
        actual.map_or_else(|| "at least 1 slice".to_owned(), |n| format!("{n} slices"))
    )]
    SliceCount {
        slice: String,
        declared: i64,
        actual: Option<usize>,
    },
    #[error(
        "ResourceSlice {slice:?}: {field} is {found:?}, but other slices of the pool say {expected:?}"
    )]
    MixedPool {
        slice: String,
        field: &'static str,
        expected: String,
        found: String,
    },
    #[error(
        "ResourceSlice {slice:?} holds both devices and shared counters; the API allows one or the other"
    )]
    CountersAndDevices { slice: String },
    #[error("ResourceSlice {slice:?} has {count} counter sets, over the limit of {max}")]
    TooManyCounterSets {
        slice: String,
        count: usize,
        max: usize,
    },
    #[error("counter set {set:?} appears more than once in pool {pool:?}")]
    DuplicateCounterSet { pool: String, set: String },
    #[error("counter set {set:?}: name {name:?} is invalid ({reason}): it must be a DNS label")]
    CounterName {
        set: String,
        name: String,
        reason: &'static str,
    },
    #[error("{owner}: {count} counters, over the limit of {max}")]
    TooManyCounters {
        owner: String,
        count: usize,
        max: usize,
    },
    #[error("{owner}: no counters; the API refuses an empty counter set or consumption")]
    NoCounters { owner: String },
    #[error("device {device:?} consumes from {count} counter sets, over the limit of {max}")]
    TooManyConsumptions {
        device: String,
        count: usize,
        max: usize,
    },
    #[error("device {device:?} consumes from counter set {set:?} twice")]
    DuplicateConsumption { device: String, set: String },
    #[error("device {device:?} consumes from counter set {set:?}, which the pool does not have")]
    UnknownCounterSet { device: String, set: String },
    #[error(
        "device {device:?} consumes counter {counter:?}, which counter set {set:?} does not have"
    )]
    UnknownCounter {
        device: String,
        set: String,
        counter: String,
    },
    #[error("device {device:?}: capacity {capacity:?}: {reason}")]
    RequestPolicy {
        device: String,
        capacity: String,
        reason: String,
    },
    #[error("max_devices_per_slice must be at least 1")]
    ZeroDevicesPerSlice,
    #[error(transparent)]
    NumaNodeAlias(#[from] NumaNodeAliasError),
}

/// One device: its name, attributes and capacity.
pub(crate) fn build_device(
    dev: &AllocatableDevice,
    inv: &Inventory,
    opts: &SliceOptions,
) -> Device {
    let attributes = allocatable_attributes(dev, inv, opts);
    let capacity = allocatable_capacity(dev);
    let name = dev.name();
    let taints = opts
        .device_taints
        .get(&name)
        .filter(|t| !t.is_empty())
        .cloned();
    Device {
        name,
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        taints,
        ..Default::default()
    }
}

/// All ResourceSlices of this node's pool, validated, in publishing order.
pub fn build_slices(
    inv: &Inventory,
    opts: &SliceOptions,
) -> Result<Vec<ResourceSlice>, SliceError> {
    validate::validate_driver_name(&opts.driver_name)?;
    validate::validate_node_name(&opts.node_name)?;
    if opts.max_devices_per_slice == Some(0) {
        return Err(SliceError::ZeroDevicesPerSlice);
    }
    check_numa_node_aliases(&opts.numa_node_aliases, &opts.driver_name)?;

    let (devices, counter_sets) = devices_and_counters(inv, opts);
    let mut chunks: Vec<Chunk> = split::into_chunks(devices, opts.max_devices_per_slice)
        .into_iter()
        .map(Chunk::Devices)
        .collect();
    chunks.extend(
        split::counter_set_chunks(counter_sets)
            .into_iter()
            .map(Chunk::Counters),
    );
    let numa_nodes: IdList = inv.numa_nodes.iter().map(|n| n.id).collect();
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);

    let slices: Vec<ResourceSlice> = chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let (devices, shared_counters) = match chunk {
                // Omitted rather than `[]` when empty: that is how the server
                // returns it, so a read-back compares equal.
                Chunk::Devices(d) => ((!d.is_empty()).then_some(d), None),
                Chunk::Counters(c) => (None, Some(c)),
            };
            ResourceSlice {
                metadata: slice_metadata(opts, i, &numa_nodes),
                spec: ResourceSliceSpec {
                    driver: opts.driver_name.clone(),
                    node_name: Some(opts.node_name.clone()),
                    pool: ResourcePool {
                        name: opts.node_name.clone(),
                        generation: opts.pool_generation,
                        resource_slice_count: count,
                    },
                    devices,
                    shared_counters,
                    ..Default::default()
                },
            }
        })
        .collect();
    validate_pool(&slices)?;
    Ok(slices)
}

/// What one slice carries: the API allows devices or shared counters, never both.
enum Chunk {
    Devices(Vec<Device>),
    Counters(Vec<CounterSet>),
}

/// Every device of the pool in publishing order, and the counter sets of the GPUs
/// with dynamic MIG or shared devices.
///
/// Whole GPUs and static MIG devices come first, in allocation order; partitions
/// follow, the GPU published last first. The scheduler takes the first device
/// that fits, so whole-GPU claims fill the pool from its start and partitions
/// from its end, and a GPU that already holds a partition takes the next one
/// before an uncarved GPU is touched.
fn devices_and_counters(inv: &Inventory, opts: &SliceOptions) -> (Vec<Device>, Vec<CounterSet>) {
    let mut geometries = BTreeMap::new();
    // GPUs shared without dynamic MIG: their own counter set, what each of their
    // devices consumes of it, and their shared devices.
    let mut shared = BTreeMap::new();
    let mut allocatable = Vec::new();
    for gpu in &inv.gpus {
        let devices = sharing::shared_of(gpu, opts);
        if !devices.is_empty() {
            let (set, consumes) = sharing::counter_set(gpu);
            shared.insert(gpu.pci_bus_id, (set, consumes, devices));
        }
        match partitions::geometry_of(gpu, opts) {
            Some(g) => {
                if g.whole_free {
                    allocatable.push(AllocatableDevice {
                        gpu: gpu.clone(),
                        mig: None,
                    });
                }
                // Someone else's instances are offered as they are, as static
                // MIG devices; the counter set has their slices taken already.
                allocatable.extend(g.foreign.iter().map(|m| AllocatableDevice {
                    gpu: gpu.clone(),
                    mig: Some(m.clone()),
                }));
                geometries.insert(gpu.pci_bus_id, g);
            }
            None => allocatable.extend(gpu.allocatable()),
        }
    }
    let ordered = order::in_allocation_order(inv, allocatable);
    let mut devices: Vec<Device> = ordered
        .iter()
        .map(|d| {
            let mut device = build_device(d, inv, opts);
            if let (None, Some(g)) = (&d.mig, geometries.get(&d.gpu.pci_bus_id)) {
                device.consumes_counters = Some(vec![g.whole.clone()]);
            }
            if let (None, Some((_, consumes, _))) = (&d.mig, shared.get(&d.gpu.pci_bus_id)) {
                device.consumes_counters = Some(vec![consumes.clone()]);
            }
            device
        })
        .collect();
    // One entry per carved GPU, where it first comes in the order: a GPU may
    // come as its whole device or as someone else's instances on it.
    let mut seen = BTreeSet::new();
    let carved: Vec<&AllocatableDevice> = ordered
        .iter()
        .filter(|d| geometries.contains_key(&d.gpu.pci_bus_id) && seen.insert(d.gpu.pci_bus_id))
        .collect();
    for d in carved.iter().rev() {
        if let Some(g) = geometries.get(&d.gpu.pci_bus_id) {
            let shared = attributes::partition_shared_attributes(&d.gpu, inv, opts);
            devices.extend(
                g.partitions
                    .iter()
                    .map(|p| partitions::partition_device(&d.gpu, p, &shared, opts)),
            );
            // Shares of the partitions of the profiles the operator named, after
            // the partitions, consuming what each partition consumes.
            for p in &g.partitions {
                devices.extend(
                    sharing::partition_shares(&d.gpu, p, opts)
                        .iter()
                        .map(|s| sharing::shared_device(s, inv, opts, p.consumes.clone())),
                );
            }
        }
    }
    let mut counter_sets: Vec<CounterSet> = carved
        .iter()
        .filter_map(|d| geometries.get(&d.gpu.pci_bus_id))
        .map(|g| g.counter_set.clone())
        .collect();
    // Shared devices last, the GPU published last first, as partitions: shares
    // fill the pool from its end and a GPU already shared takes the next share.
    for d in ordered.iter().rev() {
        if let (None, Some((set, consumes, shared_devices))) =
            (&d.mig, shared.get(&d.gpu.pci_bus_id))
        {
            devices.extend(
                shared_devices
                    .iter()
                    .map(|s| sharing::shared_device(s, inv, opts, consumes.clone())),
            );
            counter_sets.push(set.clone());
        }
    }
    (devices, counter_sets)
}

/// The slices as one Kubernetes `List`, the form `kubectl apply -f` and
/// `kubectl create --dry-run=server -f` accept, each item exactly as it is sent.
pub fn to_list(slices: &[ResourceSlice]) -> serde_json::Value {
    // k8s-openapi's Serialize writes apiVersion and kind for each ResourceSlice. It
    // cannot fail: every map in these types has string keys.
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": slices,
    })
}

/// `<node>-<driver>-<index>`, stable so server-side apply updates the same objects.
///
/// A name over the API's 253 characters keeps a prefix plus a hash of the whole, so
/// that two long node names sharing a prefix still get distinct slices.
pub(crate) fn slice_name(node_name: &str, driver_name: &str, index: usize) -> String {
    let base = format!("{node_name}-{driver_name}");
    let suffix = format!("-{index}");
    if base.len().saturating_add(suffix.len()) <= validate::MAX_SUBDOMAIN_LEN {
        return base + &suffix;
    }
    let hash = format!("-{:016x}", fnv1a(base.as_bytes()));
    let keep = validate::MAX_SUBDOMAIN_LEN
        .saturating_sub(hash.len())
        .saturating_sub(suffix.len());
    // Valid names are ASCII; the boundary check only keeps an invalid one from
    // panicking here, so validation can report it.
    let mut cut = keep.min(base.len());
    while !base.is_char_boundary(cut) {
        cut = cut.saturating_sub(1);
    }
    let prefix = base[..cut].trim_end_matches(['-', '.']);
    format!("{prefix}{hash}{suffix}")
}

fn slice_metadata(opts: &SliceOptions, index: usize, numa_nodes: &IdList) -> ObjectMeta {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
    if opts.node_name.len() <= 63 {
        // A valid node name of this length is also a valid label value.
        labels.insert(NODE_LABEL.to_owned(), opts.node_name.clone());
    }
    ObjectMeta {
        name: Some(slice_name(&opts.node_name, &opts.driver_name, index)),
        labels: Some(labels),
        annotations: (!numa_nodes.is_empty())
            .then(|| BTreeMap::from([(NUMA_NODES_ANNOTATION.to_owned(), numa_nodes.to_string())])),
        owner_references: opts.node_uid.as_ref().map(|uid| {
            vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: opts.node_name.clone(),
                uid: uid.clone(),
                // The Node's lifetime bounds the slices'. blockOwnerDeletion stays
                // unset: it would need RBAC on nodes/finalizers for no benefit, since
                // nothing waits on a Node's foreground deletion.
                controller: Some(true),
                block_owner_deletion: None,
            }]
        }),
        ..Default::default()
    }
}

/// FNV-1a, 64 bits: tiny, and unlike std's hasher guaranteed stable across releases,
/// which stable names need.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(any(test, feature = "test-fixtures"))]
#[allow(clippy::arithmetic_side_effects)] // fixtures compute on their own values
pub mod fixtures;

#[cfg(test)]
mod tests;
