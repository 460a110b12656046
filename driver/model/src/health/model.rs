//! The health picture shared by the monitor, the gRPC stream and the taint builder.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::{Gpu, Inventory, PciAddress};

/// Health of one device, in the terms of the kubelet's DRA health API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Healthy,
    Unhealthy,
    /// Not determined (yet): NVML unavailable, or no probe has answered.
    Unknown,
}

/// Why a device is unhealthy, in a form short enough for a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A critical XID (double-bit ECC events count as XID 48).
    Xid(u64),
    /// NVML answers GPU_IS_LOST, or no longer knows the device.
    Lost,
}

impl Cause {
    /// `xid-79`, `lost`: valid as a Kubernetes label value.
    pub fn label(&self) -> String {
        match self {
            Self::Xid(xid) => format!("xid-{xid}"),
            Self::Lost => "lost".to_owned(),
        }
    }
}

/// The policy's verdict on one device: healthy or not, since when and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    /// When `status` (or `cause`) last changed.
    pub since: SystemTime,
    /// For operators, e.g. "XID 79: GPU has fallen off the bus".
    pub reason: String,
    /// Set exactly when `status` is Unhealthy.
    pub cause: Option<Cause>,
}

/// Health of every device of the node, keyed by ResourceSlice device name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthState {
    pub devices: BTreeMap<String, Verdict>,
}

impl HealthState {
    pub(crate) fn unhealthy(&self) -> impl Iterator<Item = (&String, &Verdict)> {
        self.devices
            .iter()
            .filter(|(_, h)| h.status == Status::Unhealthy)
    }
}

/// What the monitor needs to know about a device to match NVML's answers to it.
///
/// A MIG device is watched through its parent GPU: XIDs, loss and recovery are
/// events of the physical GPU, so `uuid`, `bus_id` and `index` are the parent's and
/// every MIG device of a GPU shares its fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRef {
    /// The ResourceSlice device name (`gpu-<minor>`, `gpu-<minor>-mig-<gi>-<ci>`).
    pub name: String,
    pub uuid: Option<String>,
    pub bus_id: PciAddress,
    pub index: Option<u32>,
    /// A MIG device's GPU instance id: an error NVML attributes to that instance is
    /// this device's alone.
    pub gpu_instance: Option<u32>,
}

impl DeviceRef {
    pub(crate) fn from_gpu(gpu: &Gpu) -> Self {
        Self {
            name: gpu.device_name(),
            uuid: gpu.uuid.clone(),
            bus_id: gpu.pci_bus_id,
            index: gpu.index,
            gpu_instance: None,
        }
    }

    /// One per allocatable device of the inventory.
    pub fn all(inventory: &Inventory) -> Vec<Self> {
        inventory
            .allocatable()
            .iter()
            .map(|d| Self {
                name: d.name(),
                gpu_instance: d.mig.as_ref().map(|m| m.gpu_instance),
                ..Self::from_gpu(&d.gpu)
            })
            .collect()
    }

    /// [`Self::all`], and each GPU in MIG mode itself: with dynamic MIG its
    /// partitions take their taints from its name, and a GPU in MIG mode without
    /// instances has no allocatable device to watch it by.
    pub fn with_mig_gpus(inventory: &Inventory) -> Vec<Self> {
        let mut out = Self::all(inventory);
        for gpu in &inventory.gpus {
            let in_mig_mode = gpu.mig_mode.is_some_and(|m| m.current);
            if (in_mig_mode || !gpu.mig_devices.is_empty())
                && !out.iter().any(|d| d.name == gpu.device_name())
            {
                out.push(Self::from_gpu(gpu));
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}
