//! The production [`EventSourceOpener`]: XID and double-bit ECC events from NVML, through
//! `nvml-wrapper`, and probes by device handle lookup.

use std::path::PathBuf;
use std::time::Duration;

use crate::discovery::NvmlSource;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::{Device, EventSet, Nvml};
use nvml_wrapper_sys::bindings::nvmlEventData_t;
use topodra_model::health::{
    DeviceRef, EventDevice, InstanceScope, Probe, ScopePlacement, UNKNOWN_XID, XidEvent,
};
use tracing::{info, warn};

use super::source::{EventSource, EventSourceOpener, SourceError};

/// XID 48 is the driver's own report of a double-bit ECC error.
const DOUBLE_BIT_ECC_XID: u64 = 48;

/// Opens NVML from `lib` (the default `libnvidia-ml.so.1` when `None`) each time
/// the monitor asks, so a driver installed after the plugin started is picked up.
#[derive(Debug, Clone, Default)]
pub struct NvmlOpener {
    lib: Option<PathBuf>,
}

impl NvmlOpener {
    pub fn new(lib: Option<PathBuf>) -> Self {
        Self { lib }
    }
}

impl EventSourceOpener for NvmlOpener {
    fn with_source(
        &mut self,
        devices: &[DeviceRef],
        body: &mut dyn FnMut(&mut dyn EventSource),
    ) -> Result<(), SourceError> {
        let nvml = NvmlSource::new(self.lib.clone())
            .open()
            .map_err(|e| SourceError::Unavailable(e.to_string()))?;
        let mut events = NvmlEvents::register(&nvml, devices);
        body(&mut events);
        Ok(())
    }
}

/// Events we act on. Single-bit ECC errors are corrected by the hardware and are
/// left out: a GPU with too many of them reports XID 92, which is in the table.
fn wanted() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR
}

struct Watched<'n> {
    device: Device<'n>,
    mask: EventTypes,
    id: EventDevice,
}

struct NvmlEvents<'n> {
    nvml: &'n Nvml,
    /// `None` when no GPU could be registered: the monitor then relies on probes.
    set: Option<EventSet<'n>>,
    watched: Vec<Watched<'n>>,
}

impl<'n> NvmlEvents<'n> {
    fn register(nvml: &'n Nvml, devices: &[DeviceRef]) -> Self {
        let mut watched = Vec::new();
        for d in devices {
            let device = match open_device(nvml, d) {
                Ok(device) => device,
                Err(e) => {
                    warn!(device = %d.name, error = %e, "cannot open GPU for events; probing it instead");
                    continue;
                }
            };
            let mask = match device.supported_event_types() {
                Ok(supported) => supported & wanted(),
                Err(e) => {
                    info!(device = %d.name, error = %e, "GPU does not report events; probing it instead");
                    continue;
                }
            };
            if mask.is_empty() {
                info!(device = %d.name, "GPU does not report XID events; probing it instead");
                continue;
            }
            let id = match &d.uuid {
                Some(uuid) => EventDevice::Uuid(uuid.clone()),
                None => EventDevice::BusId(d.bus_id),
            };
            // The MIG devices of one GPU share it: register the GPU once.
            if watched.iter().any(|w: &Watched<'_>| w.id == id) {
                continue;
            }
            watched.push(Watched { device, mask, id });
        }
        // Registering consumes the set and frees it on failure, so a GPU that
        // refuses costs one rebuild of the set without it.
        loop {
            if watched.is_empty() {
                return Self {
                    nvml,
                    set: None,
                    watched,
                };
            }
            match build_set(nvml, &watched) {
                Ok(set) => {
                    return Self {
                        nvml,
                        set: Some(set),
                        watched,
                    };
                }
                Err((Some(i), e)) => {
                    warn!(device = ?watched[i].id, error = %e, "cannot register for events; probing it instead");
                    watched.remove(i);
                }
                Err((None, e)) => {
                    warn!(error = %e, "cannot create an NVML event set; probing GPUs instead");
                    watched.clear();
                }
            }
        }
    }

    fn to_event(&self, data: &EventData<'n>) -> Option<XidEvent> {
        let xid = if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            match data.event_data {
                Some(XidError::Value(xid)) => xid,
                Some(XidError::Unknown) | None => UNKNOWN_XID,
            }
        } else if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            DOUBLE_BIT_ECC_XID
        } else {
            return None;
        };
        // Matched by handle, not by asking the GPU: right after an XID 79 the GPU
        // may no longer answer even a UUID query.
        let handle = raw_handle(&data.device);
        let device = self
            .watched
            .iter()
            .find(|w| raw_handle(&w.device) == handle)
            .map(|w| w.id.clone())
            .or_else(|| data.device.uuid().ok().map(EventDevice::Uuid))
            .unwrap_or(EventDevice::Unknown);
        Some(XidEvent {
            device,
            xid,
            instance: None,
        })
    }

    /// The MIG instance an event belongs to: nvml.h sets `gpuInstanceId` when the
    /// error is attributable to a GPU instance, and 0xFFFFFFFF otherwise. Where the
    /// instance sits is asked at once, while it exists; a GPU that no longer
    /// answers leaves the placement unknown.
    fn scope(&self, device: &Device<'n>, gpu_instance: u32) -> Option<InstanceScope> {
        if gpu_instance == u32::MAX {
            return None;
        }
        let placement = crate::discovery::gpu_instance_info(self.nvml, device, gpu_instance)
            .ok()
            .map(|info| ScopePlacement {
                profile_id: info.profileId,
                start: info.placement.start,
            });
        Some(InstanceScope {
            gpu_instance,
            placement,
        })
    }
}

/// `nvmlEventSetWait_v2`, keeping what nvml-wrapper 0.13's `EventSet::wait` drops:
/// its `EventData` has no `gpuInstanceId` or `computeInstanceId`.
fn wait_raw(nvml: &Nvml, set: &EventSet<'_>, ms: u32) -> Result<nvmlEventData_t, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    // SAFETY: plain integers and a pointer NVML fills; all-zero is a valid value.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: an event set of this NVML instance and a valid out pointer.
    nvml_try(unsafe { f(set.handle(), &mut data, ms) })?;
    Ok(data)
}

fn build_set<'n>(
    nvml: &'n Nvml,
    watched: &[Watched<'n>],
) -> Result<EventSet<'n>, (Option<usize>, NvmlError)> {
    let mut set = nvml.create_event_set().map_err(|e| (None, e))?;
    for (i, w) in watched.iter().enumerate() {
        set = w
            .device
            .register_events(w.mask, set)
            .map_err(|e| (Some(i), e.error))?;
    }
    Ok(set)
}

fn raw_handle(device: &Device<'_>) -> usize {
    // SAFETY: the handle is only compared as a number, never dereferenced or
    // passed back to NVML.
    (unsafe { device.handle() }) as usize
}

/// By PCI bus id, never by UUID: nvml.h documents that a UUID lookup may visit
/// other GPUs on its way and answer GPU_IS_LOST when any of them fell off the bus,
/// which would mark a healthy GPU lost along with the one that is.
fn open_device<'n>(nvml: &'n Nvml, d: &DeviceRef) -> Result<Device<'n>, NvmlError> {
    nvml.device_by_pci_bus_id(d.bus_id.to_string())
}

impl EventSource for NvmlEvents<'_> {
    fn wait(&mut self, timeout: Duration) -> Result<Option<XidEvent>, SourceError> {
        let Some(set) = &self.set else {
            std::thread::sleep(timeout);
            return Ok(None);
        };
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        match wait_raw(self.nvml, set, ms) {
            Ok(raw) => {
                // SAFETY: NVML filled `raw` for this NVML instance just now.
                let data = unsafe { EventData::new(raw, self.nvml) };
                let mut event = self.to_event(&data);
                if let Some(ev) = event.as_mut() {
                    ev.instance = self.scope(&data.device, raw.gpuInstanceId);
                }
                Ok(event)
            }
            Err(NvmlError::Timeout) => Ok(None),
            Err(e) => Err(SourceError::Wait(e.to_string())),
        }
    }

    fn event_gpus(&self) -> usize {
        if self.set.is_some() {
            self.watched.len()
        } else {
            0
        }
    }

    fn probe(&mut self, device: &DeviceRef) -> Probe {
        // A handle lookup and one live query. Not the UUID: NVML keeps answering
        // what it cached (PCI info, UUID) for a GPU that fell off the bus, while a
        // query that reaches the GPU, like its memory, answers GPU_IS_LOST.
        match open_device(self.nvml, device).and_then(|d| d.memory_info()) {
            Ok(_) => Probe::Ok,
            // A GPU NVML no longer finds is as gone as one it reports lost.
            Err(NvmlError::GpuLost | NvmlError::NotFound) => Probe::Lost,
            Err(e) => Probe::Error(e.to_string()),
        }
    }
}
