//! topodra's core: what a GPU node has, how it is published, and what preparing a
//! claim on it means.
//!
//! This crate holds no gRPC server and talks to no API server: the kubelet plugin
//! (`topodra-kubelet-plugin`) wires it to the kubelet, NVML and the API, and the
//! controller (`topodra-controller`, with `kubectl topodra`) reads the published slices
//! back into [`capacity`]. The public modules, from the node upwards:
//!
//! - [`discovery`]: finds the GPUs (NVML) and their topology (hwloc, or sysfs as a
//!   fallback) and joins them into an [`Inventory`].
//! - [`inventory`]: the node model discovery produces: NUMA nodes, GPUs, MIG devices
//!   and what each offers; its main types are re-exported here.
//! - [`slice`](mod@slice): the ResourceSlices that publish an [`Inventory`] to the
//!   scheduler, with the attribute names and values in [`slice::attributes`].
//! - [`config`]: the opaque device config API (`gpu.topodra.dev`) and its strict
//!   decoder.
//! - [`cdi`]: the CDI specs a container runtime reads for a prepared claim.
//! - [`checkpoint`]: the on-disk record of what is prepared, which survives plugin
//!   restarts and reboots.
//! - [`prepare`]: the prepare/unprepare state machine behind the kubelet's DRA calls
//!   ([`prepare::Preparer`]), on top of [`cdi`] and [`checkpoint`].
//! - [`health`]: GPU health verdicts from XID events and probes, and the device
//!   taints they call for.
//! - [`capacity`]: the cluster capacity model (free, used and stranded GPUs by
//!   topology level) that the controller and `kubectl topodra` report.
//!
//! At the root: the inventory's types ([`Gpu`], [`Inventory`], [`MigDevice`], ...),
//! [`PciAddress`] and [`PcieRoot`] (PCI addresses as NVML, hwloc and sysfs spell
//! them), and [`IdList`] (CPU and NUMA node lists such as `0-55,112-167`). Everything
//! else (topology rules, the CDI and checkpoint internals) is private to the crate.

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

pub mod capacity;
pub mod cdi;
pub mod checkpoint;
pub mod config;
mod cpuset;
pub mod discovery;
pub mod health;
pub mod inventory;
mod pci;
pub mod prepare;
pub mod slice;
mod topology;

pub use cpuset::{IdList, IdListError};
pub use inventory::{AllocatableDevice, Gpu, Inventory, MigDevice, NumaKind, NumaNode, Offer};
pub use pci::{PciAddress, PciAddressError, PcieRoot};
