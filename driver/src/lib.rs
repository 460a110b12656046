//! topodra's core: what a GPU node has and how it is published.
//!
//! This crate holds no gRPC server and talks to no API server. It discovers GPUs and
//! their topology ([`discovery`]), keeps them in an [`inventory`], and turns that into
//! ResourceSlice content ([`slice`]), and decides GPU health from the events a monitor
//! feeds in ([`health`]). Binaries wire it to the kubelet, NVML and the API.

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
pub mod cpuset;
pub mod discovery;
pub mod health;
pub mod inventory;
pub mod pci;
pub mod prepare;
pub mod slice;
pub mod topology;

pub use cpuset::IdList;
pub use inventory::{AllocatableDevice, Gpu, Inventory, MigDevice, NumaKind, NumaNode, Offer};
pub use pci::{PciAddress, PcieRoot};
