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

pub mod attributes;
mod order;
mod quantity;
mod split;
pub(crate) mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    Device, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};

pub(crate) use attributes::{allocatable_attributes, allocatable_capacity};
pub(crate) use validate::validate_pool;

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
pub struct SliceOptions {
    pub driver_name: String,
    pub node_name: String,
    pub numa_node_format: NumaNodeFormat,
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
}

impl SliceOptions {
    /// Defaults for everything but the node: the default driver name, int NUMA nodes,
    /// generation 1, no owner.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            node_name: node_name.into(),
            numa_node_format: NumaNodeFormat::Int,
            pool_generation: 1,
            node_uid: None,
            max_devices_per_slice: None,
            device_taints: BTreeMap::new(),
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
    #[error("max_devices_per_slice must be at least 1")]
    ZeroDevicesPerSlice,
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

    let devices = order::in_allocation_order(inv)
        .into_iter()
        .map(|d| build_device(&d, inv, opts))
        .collect();
    let chunks = split::into_chunks(devices, opts.max_devices_per_slice);
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);

    let slices: Vec<ResourceSlice> = chunks
        .into_iter()
        .enumerate()
        .map(|(i, devices)| ResourceSlice {
            metadata: slice_metadata(opts, i),
            spec: ResourceSliceSpec {
                driver: opts.driver_name.clone(),
                node_name: Some(opts.node_name.clone()),
                pool: ResourcePool {
                    name: opts.node_name.clone(),
                    generation: opts.pool_generation,
                    resource_slice_count: count,
                },
                // Omitted rather than `[]` when empty: that is how the server returns
                // it, so a read-back compares equal.
                devices: (!devices.is_empty()).then_some(devices),
                ..Default::default()
            },
        })
        .collect();
    validate_pool(&slices)?;
    Ok(slices)
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
    if base.len() + suffix.len() <= validate::MAX_SUBDOMAIN_LEN {
        return base + &suffix;
    }
    let hash = format!("-{:016x}", fnv1a(base.as_bytes()));
    let keep = validate::MAX_SUBDOMAIN_LEN - hash.len() - suffix.len();
    // Valid names are ASCII; the boundary check only keeps an invalid one from
    // panicking here, so validation can report it.
    let mut cut = keep.min(base.len());
    while !base.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = base[..cut].trim_end_matches(['-', '.']);
    format!("{prefix}{hash}{suffix}")
}

fn slice_metadata(opts: &SliceOptions, index: usize) -> ObjectMeta {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
    if opts.node_name.len() <= 63 {
        // A valid node name of this length is also a valid label value.
        labels.insert(NODE_LABEL.to_owned(), opts.node_name.clone());
    }
    ObjectMeta {
        name: Some(slice_name(&opts.node_name, &opts.driver_name, index)),
        labels: Some(labels),
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

#[cfg(test)]
pub(crate) mod fixtures;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fixtures::{dgx_h100, many, snc};

    fn device_names(s: &ResourceSlice) -> Vec<&str> {
        s.spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.as_str())
            .collect()
    }

    fn sizes(slices: &[ResourceSlice]) -> Vec<usize> {
        slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .collect()
    }

    fn assert_consistent_pool(slices: &[ResourceSlice], opts: &SliceOptions) {
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(s.spec.pool.generation, opts.pool_generation);
            assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
            assert_eq!(s.spec.pool.name, opts.node_name);
            assert_eq!(s.spec.node_name.as_deref(), Some(opts.node_name.as_str()));
            assert_eq!(s.spec.driver, opts.driver_name);
            assert_eq!(
                s.metadata.name.as_deref(),
                Some(format!("{}-{}-{i}", opts.node_name, opts.driver_name).as_str())
            );
        }
    }

    #[test]
    fn a_dgx_is_one_slice_in_allocation_order() {
        let opts = SliceOptions {
            pool_generation: 7,
            node_uid: Some("6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f".to_owned()),
            ..SliceOptions::new("dgx-01")
        };
        let slices = build_slices(&dgx_h100(), &opts).unwrap();
        assert_eq!(slices.len(), 1);
        assert_consistent_pool(&slices, &opts);
        let s = &slices[0];
        assert_eq!(s.metadata.name.as_deref(), Some("dgx-01-gpu.topodra.dev-0"));
        assert_eq!(
            device_names(s),
            [
                "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
            ]
        );
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[MANAGED_BY_LABEL], "topodra");
        assert_eq!(labels[NODE_LABEL], "dgx-01");
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str()
            ),
            ("v1", "Node", "dgx-01")
        );
        assert_eq!(owner.uid, "6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f");
        assert!(s.spec.all_nodes.is_none() && s.spec.node_selector.is_none());
    }

    #[test]
    fn taints_go_to_their_device_and_shrink_the_slice_limit() {
        let taint = DeviceTaint {
            key: "gpu.topodra.dev/unhealthy".to_owned(),
            value: Some("xid-79".to_owned()),
            effect: "NoSchedule".to_owned(),
            ..Default::default()
        };
        let opts = SliceOptions {
            device_taints: BTreeMap::from([
                ("gpu-3".to_owned(), vec![taint.clone()]),
                // An empty list is no taint, and an unknown device is ignored.
                ("gpu-4".to_owned(), vec![]),
                ("gpu-99".to_owned(), vec![taint.clone()]),
            ]),
            ..SliceOptions::new("dgx-01")
        };
        let slices = build_slices(&dgx_h100(), &opts).unwrap();
        let devices = slices[0].spec.devices.as_ref().unwrap();
        let gpu3 = devices.iter().find(|d| d.name == "gpu-3").unwrap();
        assert_eq!(gpu3.taints.as_deref(), Some(&[taint][..]));
        assert!(
            devices
                .iter()
                .filter(|d| d.name != "gpu-3")
                .all(|d| d.taints.is_none())
        );

        // 100 GPUs with one tainted: its slice holds 64 at most.
        let mut opts = SliceOptions::new("big");
        opts.device_taints
            .insert("gpu-0".to_owned(), vec![DeviceTaint::default()]);
        assert_eq!(sizes(&build_slices(&many(100), &opts).unwrap()), [64, 36]);
    }

    #[test]
    fn no_owner_without_a_node_uid() {
        let slices = build_slices(&dgx_h100(), &SliceOptions::new("dgx-01")).unwrap();
        assert!(slices[0].metadata.owner_references.is_none());
    }

    #[test]
    fn building_is_deterministic() {
        let mut scrambled = snc();
        scrambled.gpus.reverse();
        let opts = SliceOptions::new("n");
        assert_eq!(
            build_slices(&snc(), &opts).unwrap(),
            build_slices(&scrambled, &opts).unwrap()
        );
    }

    #[test]
    fn three_hundred_gpus_split_by_attribute_form() {
        let inv = many(300);
        let opts = SliceOptions::new("big");
        let slices = build_slices(&inv, &opts).unwrap();
        assert_eq!(sizes(&slices), [128, 128, 44]);
        assert_consistent_pool(&slices, &opts);

        let opts = SliceOptions {
            numa_node_format: NumaNodeFormat::List,
            ..opts
        };
        let slices = build_slices(&inv, &opts).unwrap();
        assert_eq!(sizes(&slices), [64, 64, 64, 64, 44]);
        assert_consistent_pool(&slices, &opts);

        // Every GPU exactly once, NUMA node 0 before NUMA node 1.
        let names: Vec<&str> = slices.iter().flat_map(device_names).collect();
        assert_eq!(names.len(), 300);
        assert_eq!(names[0], "gpu-0");
        assert_eq!(names[149], "gpu-298");
        assert_eq!(names[150], "gpu-1");
    }

    #[test]
    fn a_cap_forces_smaller_slices() {
        let opts = SliceOptions {
            max_devices_per_slice: Some(3),
            pool_generation: 42,
            ..SliceOptions::new("dgx-01")
        };
        let slices = build_slices(&dgx_h100(), &opts).unwrap();
        assert_eq!(sizes(&slices), [3, 3, 2]);
        assert_consistent_pool(&slices, &opts);
        assert_eq!(device_names(&slices[1]), ["gpu-3", "gpu-4", "gpu-5"]);

        let opts = SliceOptions {
            max_devices_per_slice: Some(0),
            ..opts
        };
        assert_eq!(
            build_slices(&dgx_h100(), &opts).unwrap_err(),
            SliceError::ZeroDevicesPerSlice
        );
    }

    #[test]
    fn no_gpus_is_one_empty_slice() {
        let opts = SliceOptions::new("cpu-only");
        let slices = build_slices(&Inventory::default(), &opts).unwrap();
        assert_eq!(slices.len(), 1);
        assert_consistent_pool(&slices, &opts);
        assert!(slices[0].spec.devices.is_none());
        let json = serde_json::to_value(&slices[0]).unwrap();
        assert!(json["spec"].get("devices").is_none(), "{json}");
        assert_eq!(json["spec"]["pool"]["resourceSliceCount"], 1);
    }

    #[test]
    fn to_list_is_a_kubernetes_list() {
        let opts = SliceOptions {
            max_devices_per_slice: Some(5),
            ..SliceOptions::new("dgx-01")
        };
        let slices = build_slices(&dgx_h100(), &opts).unwrap();
        let list = to_list(&slices);
        assert_eq!(list["apiVersion"], "v1");
        assert_eq!(list["kind"], "List");
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 2);
        for item in items {
            assert_eq!(item["apiVersion"], "resource.k8s.io/v1");
            assert_eq!(item["kind"], "ResourceSlice");
            assert_eq!(item["spec"]["driver"], "gpu.topodra.dev");
            assert_eq!(item["spec"]["nodeName"], "dgx-01");
            assert_eq!(item["spec"]["pool"]["name"], "dgx-01");
            assert_eq!(item["spec"]["pool"]["resourceSliceCount"], 2);
        }
        let gpu0 = &items[0]["spec"]["devices"][0];
        assert_eq!(gpu0["name"], "gpu-0");
        assert_eq!(
            gpu0["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            "0000:18:00.0"
        );
        assert_eq!(
            gpu0["attributes"]["resource.kubernetes.io/numaNode"]["int"],
            0
        );
        assert_eq!(gpu0["attributes"]["driverVersion"]["version"], "550.90.7");
        assert_eq!(gpu0["capacity"]["memory"]["value"], "81559Mi");

        // Items round-trip through k8s-openapi unchanged.
        let back: ResourceSlice = serde_json::from_value(items[1].clone()).unwrap();
        assert_eq!(back, slices[1]);
    }

    #[test]
    fn serialized_size_per_device_stays_small() {
        let opts = SliceOptions {
            node_uid: Some("6f1e0c1a-8d2b-4b5e-9c4f-0a1b2c3d4e5f".to_owned()),
            ..SliceOptions::new("dgx-01")
        };
        for format in [NumaNodeFormat::Int, NumaNodeFormat::List] {
            let opts = SliceOptions {
                numa_node_format: format,
                ..opts.clone()
            };
            let slices = build_slices(&dgx_h100(), &opts).unwrap();
            let bytes = serde_json::to_vec(&slices[0]).unwrap().len();
            let per_device = bytes / 8;
            println!("{format}: {bytes} bytes for 8 devices, {per_device} per device");
            assert!(per_device < 1024, "{per_device} bytes per device");
        }
    }

    #[test]
    fn long_names_are_truncated_with_a_stable_hash() {
        let node = format!("{}.example.com", "n".repeat(240));
        let a = slice_name(&node, DEFAULT_DRIVER_NAME, 0);
        let b = slice_name(&node, DEFAULT_DRIVER_NAME, 1);
        assert_eq!(a.len(), 253);
        assert!(a.ends_with("-0") && b.ends_with("-1"));
        assert_eq!(a[..a.len() - 2], b[..b.len() - 2]);
        assert_eq!(a, slice_name(&node, DEFAULT_DRIVER_NAME, 0));
        // Same prefix, different node: different names.
        let other = format!("{}.example.org", "n".repeat(240));
        assert_ne!(a, slice_name(&other, DEFAULT_DRIVER_NAME, 0));

        let opts = SliceOptions::new(node);
        let slices = build_slices(&dgx_h100(), &opts).unwrap();
        assert_eq!(slices[0].metadata.name.as_deref(), Some(a.as_str()));
        // Too long for a label value, so only the managed-by label remains.
        assert_eq!(slices[0].metadata.labels.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn numa_node_format_parses_prints_and_serializes() {
        assert_eq!("int".parse::<NumaNodeFormat>(), Ok(NumaNodeFormat::Int));
        assert_eq!("List".parse::<NumaNodeFormat>(), Ok(NumaNodeFormat::List));
        assert!("ints".parse::<NumaNodeFormat>().is_err());
        assert_eq!(NumaNodeFormat::default(), NumaNodeFormat::Int);
        for f in [NumaNodeFormat::Int, NumaNodeFormat::List] {
            assert_eq!(f.to_string().parse::<NumaNodeFormat>(), Ok(f));
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{f}\""));
            assert_eq!(serde_json::from_str::<NumaNodeFormat>(&json).unwrap(), f);
        }
    }
}
