//! The facts a health source reports about GPUs.

use crate::PciAddress;

use super::model::DeviceRef;

/// How an event names its GPU; NVML may be unable to answer a UUID query for a GPU
/// that just failed, so the source uses whatever it could learn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventDevice {
    Uuid(String),
    BusId(PciAddress),
    /// The source could not tell which GPU; the monitor probes them all.
    Unknown,
}

impl EventDevice {
    pub fn matches(&self, device: &DeviceRef) -> bool {
        match self {
            Self::Uuid(uuid) => device.uuid.as_deref() == Some(uuid.as_str()),
            Self::BusId(bus_id) => device.bus_id == *bus_id,
            Self::Unknown => false,
        }
    }
}

/// A critical error report. Double-bit ECC events arrive as XID 48, the XID the
/// driver logs for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    pub device: EventDevice,
    pub xid: u64,
    /// The MIG instance the error is attributable to, when NVML says so
    /// (`nvmlEventData_t.gpuInstanceId` other than 0xFFFFFFFF); `None` for an error
    /// of the whole GPU.
    pub instance: Option<InstanceScope>,
}

/// Which MIG instance of its GPU an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceScope {
    pub gpu_instance: u32,
    /// Where the instance sits and its GPU-instance profile, when NVML still
    /// answered for it (`nvmlGpuInstanceGetInfo`): what names a dynamic partition.
    pub placement: Option<ScopePlacement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopePlacement {
    pub profile_id: u32,
    pub start: u32,
}

/// The answer to "does NVML still reach this GPU?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Ok,
    Lost,
    /// Any other failure; says nothing either way about the GPU.
    Error(String),
}
