//! topodra's core: what a GPU node has and how it is published.
//!
//! This crate holds no gRPC server and talks to no API server. It discovers GPUs and
//! their topology ([`discovery`]), keeps them in an [`inventory`], and turns that into
//! ResourceSlice content ([`slice`]). Binaries wire it to the kubelet and the API.

pub mod cdi;
pub mod checkpoint;
pub mod config;
pub mod cpuset;
pub mod discovery;
pub mod inventory;
pub mod pci;
pub mod prepare;
pub mod slice;
pub mod topology;

pub use cpuset::IdList;
pub use inventory::{Gpu, Inventory, NumaKind, NumaNode};
pub use pci::{PciAddress, PcieRoot};
