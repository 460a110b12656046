//! topodra's model: what a GPU node has, how it is published, what a claim may ask
//! for, and what the cluster's GPUs are doing, as plain data and pure functions.
//!
//! This crate does no I/O and links no C library: the node crate (`topodra-node`)
//! fills it from NVML, hwloc and sysfs and keeps its checkpoint on disk, and the
//! controller and `kubectl topodra` read published slices back into [`capacity`].
//! The public modules:
//!
//! - [`inventory`]: the node model: NUMA nodes, GPUs, MIG devices and what each
//!   offers; its main types are re-exported here.
//! - [`slice`](mod@slice): the ResourceSlices that publish an [`Inventory`] to the
//!   scheduler, with the attribute names and values in [`slice::attributes`].
//! - [`topology`]: facts derived from raw topology (NVLink domains, a GPU's
//!   same-socket NUMA nodes, PCIe switches).
//! - [`config`]: the opaque device config API (`gpu.topodra.dev`) and its strict
//!   decoder; [`capabilities`]: the driver capabilities a container may ask for.
//! - [`checkpoint`]: what the kubelet plugin has prepared, and its on-disk encoding.
//! - [`health`]: GPU health verdicts from XID events and probes, and the device
//!   taints they call for.
//! - [`capacity`]: the cluster capacity model (free, used and stranded GPUs by
//!   topology level) that the controller and `kubectl topodra` report.
//!
//! At the root: the inventory's types ([`Gpu`], [`Inventory`], [`MigDevice`], ...),
//! [`PciAddress`] and [`PcieRoot`] (PCI addresses as NVML, hwloc and sysfs spell
//! them), and [`IdList`] (CPU and NUMA node lists such as `0-55,112-167`).

#![forbid(unsafe_code)]
// Every number the model adds up can come from the API server (capacities of
// another driver's slices, consumed capacities, pod requests up to 2^64-1), and an
// overflow panics the controller in a debug build and publishes a wrapped figure in
// a release build. So arithmetic here is checked or saturating, and the lint makes
// a new `+` a build error. Tests and their fixtures compute on their own values.
#![deny(clippy::arithmetic_side_effects)]
#![cfg_attr(test, allow(clippy::arithmetic_side_effects))]

/// Serializes a type as its `Display` string and deserializes it with `FromStr`: the
/// form operators read in JSON and YAML (`0000:18:00.0`, `pci0000:15`, `0-55,112-167`).
macro_rules! serde_as_string {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub mod capabilities;
pub mod capacity;
pub mod checkpoint;
pub mod config;
mod cpuset;
pub mod health;
pub mod inventory;
mod pci;
pub mod slice;
pub mod topology;

pub use cpuset::{IdList, IdListError};
pub use inventory::{
    AllocatableDevice, Gpu, Inventory, MigDevice, MigPlacement, MigProfile, NumaKind, NumaNode,
    Offer,
};
pub use pci::{PciAddress, PciAddressError, PcieRoot};
