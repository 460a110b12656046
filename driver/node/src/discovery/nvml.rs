//! GPU identity and NVLink wiring from NVML, through `nvml-wrapper`.
//!
//! The library is loaded at run time, so a node without the NVIDIA driver gets a
//! clear error instead of a binary that fails to start.

use std::ffi::OsStr;
use std::path::PathBuf;

use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};

use super::{DiscoveryError, GpuIdentity, IdentitySnapshot, IdentitySource, LostGpu};
use topodra_model::PciAddress;
use topodra_model::inventory::{ComputeCapability, CudaVersion, MigMode};
use topodra_model::topology::NvlinkRemote;

mod fabric;
mod mig;
pub(crate) use mig::gpu_instance_info;

/// The runtime name of the NVML library. nvml-wrapper defaults to the unversioned
/// `libnvidia-ml.so`, which only the development package installs; driver-only nodes
/// (and the NVIDIA container toolkit's mounts) have just the `.so.1`.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// NVML's limit on links per GPU (`NVML_NVLINK_MAX_LINKS` in nvml.h of CUDA 12).
const MAX_NVLINKS: u32 = 18;

/// Reads identity from NVML; each call initializes and shuts NVML down again.
#[derive(Debug, Clone, Default)]
pub struct NvmlSource {
    lib: Option<PathBuf>,
}

impl NvmlSource {
    pub fn new(lib: Option<PathBuf>) -> Self {
        Self { lib }
    }

    /// Loads and initializes NVML, mapping each failure to what an operator must fix.
    pub fn open(&self) -> Result<Nvml, DiscoveryError> {
        let lib = self
            .lib
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_NVML_LIB));
        let lib_os: &OsStr = lib.as_os_str();
        Nvml::builder()
            .lib_path(lib_os)
            .init()
            .map_err(|e| match e {
                NvmlError::LibloadingError(err) => DiscoveryError::NvmlLibraryMissing {
                    lib: lib.display().to_string(),
                    reason: err.to_string(),
                },
                NvmlError::FailedToLoadSymbol(sym) => DiscoveryError::NvmlLibraryMissing {
                    lib: lib.display().to_string(),
                    reason: format!("it does not export the NVML API ({sym})"),
                },
                other => DiscoveryError::NvmlInit(other),
            })
    }
}

impl IdentitySource for NvmlSource {
    fn identity(&self) -> Result<IdentitySnapshot, DiscoveryError> {
        snapshot(&self.open()?)
    }
}

fn call_error(call: &str) -> impl FnOnce(NvmlError) -> DiscoveryError + '_ {
    move |source| DiscoveryError::Nvml {
        call: call.to_owned(),
        source,
    }
}

/// Describes every GPU an initialized NVML reports. A GPU that cannot be opened or
/// has no readable address or UUID is listed in `unusable`, and one NVML reports lost
/// in `lost`, rather than failing the whole node: the other GPUs are still worth
/// publishing.
pub(crate) fn snapshot(nvml: &Nvml) -> Result<IdentitySnapshot, DiscoveryError> {
    let count = nvml
        .device_count()
        .map_err(call_error("nvmlDeviceGetCount"))?;
    let mut out = IdentitySnapshot {
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .and_then(CudaVersion::from_nvml),
        ..Default::default()
    };
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(NvmlError::GpuLost) => {
                out.lost.push(LostGpu {
                    index,
                    pci_bus_id: None,
                    uuid: None,
                });
                continue;
            }
            Err(e) => {
                out.unusable.push(format!("GPU index {index}: {e}"));
                continue;
            }
        };
        match describe(nvml, index, &device) {
            Ok(gpu) => out.gpus.push(gpu),
            Err(Undescribed::Lost(lost)) => out.lost.push(lost),
            Err(Undescribed::Broken(e)) => out.unusable.push(format!("GPU index {index}: {e}")),
        }
    }
    Ok(out)
}

enum Undescribed {
    Lost(LostGpu),
    Broken(String),
}

/// Turns optional queries into `Option`s while remembering whether any of them
/// answered GPU_IS_LOST. A lost GPU still answers what NVML caches (PCI address,
/// UUID, name) and fails every live query, so a single lost answer condemns it.
#[derive(Default)]
struct Answers {
    lost: bool,
}

impl Answers {
    fn ok<T>(&mut self, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::GpuLost) => {
                self.lost = true;
                None
            }
            Err(_) => None,
        }
    }
}

fn describe(nvml: &Nvml, index: u32, device: &Device<'_>) -> Result<GpuIdentity, Undescribed> {
    let lost = |pci_bus_id, uuid| {
        Undescribed::Lost(LostGpu {
            index,
            pci_bus_id,
            uuid,
        })
    };
    let pci = match device.pci_info() {
        Ok(p) => p,
        Err(NvmlError::GpuLost) => return Err(lost(None, None)),
        Err(e) => return Err(Undescribed::Broken(format!("nvmlDeviceGetPciInfo: {e}"))),
    };
    let pci_bus_id: PciAddress = pci
        .bus_id
        .parse()
        .map_err(|e| Undescribed::Broken(format!("{e}")))?;
    let uuid = match device.uuid() {
        Ok(u) => u,
        Err(NvmlError::GpuLost) => return Err(lost(Some(pci_bus_id), None)),
        Err(e) => {
            return Err(Undescribed::Broken(format!(
                "{pci_bus_id}: nvmlDeviceGetUUID: {e}"
            )));
        }
    };
    let mut a = Answers::default();
    let mig_mode = a.ok(device.mig_mode()).map(|m| MigMode {
        current: m.current != 0,
        pending: m.pending != 0,
    });
    let gpu = GpuIdentity {
        pci_bus_id,
        index: a.ok(device.index()).unwrap_or(index),
        minor: a.ok(device.minor_number()),
        product_name: a.ok(device.name()),
        brand: a.ok(device.brand()).map(brand_name),
        architecture: a.ok(device.architecture()).map(|a| a.to_string()),
        cuda_compute_capability: a.ok(device.cuda_compute_capability()).and_then(|c| {
            Some(ComputeCapability {
                major: u32::try_from(c.major).ok()?,
                minor: u32::try_from(c.minor).ok()?,
            })
        }),
        memory_bytes: a.ok(device.memory_info()).map(|m| m.total),
        mig_mode,
        memory_numa_node: a.ok(device.numa_node_id()),
        nvlink_remotes: nvlink_remotes(nvml, device, &mut a),
        nvlink_clique: a.ok(fabric::clique(nvml, device)).flatten(),
        mig_devices: match mig_mode {
            Some(MigMode { current: true, .. }) => mig::devices(nvml, device, &mut a),
            _ => Vec::new(),
        },
        mig_profiles: match mig_mode {
            Some(MigMode { current: true, .. }) => mig::profiles(nvml, device, &mut a),
            _ => Vec::new(),
        },
        uuid,
    };
    if a.lost {
        return Err(lost(Some(gpu.pci_bus_id), Some(gpu.uuid)));
    }
    Ok(gpu)
}

/// What each active NVLink ends at. Links a GPU does not have answer NotSupported
/// or InvalidArg, which simply means "no link here".
///
/// The kind of the far end comes from `nvmlDeviceGetNvLinkRemoteDeviceType`, as
/// hwloc's NVML backend does, because the remote PCI address alone cannot tell an
/// NVSwitch from anything else: depending on platform and driver a switch reports
/// its own address or a placeholder (`FFFFFFFF:FF:FF.0`). nvml-wrapper's wrapper of
/// that call always answers Unknown, so it goes through the raw binding.
fn nvlink_remotes(nvml: &Nvml, device: &Device<'_>, a: &mut Answers) -> Vec<NvlinkRemote> {
    let mut out = Vec::new();
    for n in 0..MAX_NVLINKS {
        let link = device.link_wrapper_for(n);
        match link.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                a.ok::<()>(Err(e));
                continue;
            }
        }
        let address = link
            .remote_pci_info()
            .ok()
            .and_then(|p| p.bus_id.parse::<PciAddress>().ok());
        let remote = match (remote_type(nvml, device, n), address) {
            (Some(RemoteKind::Gpu), Some(addr)) => NvlinkRemote::Gpu(addr),
            (Some(RemoteKind::Switch), _) => NvlinkRemote::Switch,
            (Some(RemoteKind::Cpu), _) => NvlinkRemote::Cpu,
            (_, Some(addr)) => NvlinkRemote::Other(addr),
            (Some(RemoteKind::Gpu) | None, None) => {
                tracing::debug!(link = n, "NVLink to an endpoint NVML cannot name; ignored");
                continue;
            }
        };
        out.push(remote);
    }
    out
}

enum RemoteKind {
    Gpu,
    Switch,
    Cpu,
}

// Matching on bindgen's constant names keeps the mapping readable against nvml.h.
#[allow(non_upper_case_globals)]
fn remote_type(nvml: &Nvml, device: &Device<'_>, link: u32) -> Option<RemoteKind> {
    use nvml_wrapper_sys::bindings::*;
    let f = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref()).ok()?;
    let mut kind: nvmlIntNvLinkDeviceType_t =
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: the handle comes from this NVML instance and `kind` is a valid out
    // pointer of the type nvml.h declares.
    nvml_try(unsafe { f(device.handle(), link, &mut kind) }).ok()?;
    match kind {
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => Some(RemoteKind::Gpu),
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => Some(RemoteKind::Switch),
        nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU => Some(RemoteKind::Cpu),
        _ => None,
    }
}

/// Brand names as NVIDIA spells them in `nvidia-smi -q`, so CEL selectors read naturally.
fn brand_name(brand: Brand) -> String {
    match brand {
        Brand::Nvidia => "NVIDIA".to_owned(),
        Brand::GeForce => "GeForce".to_owned(),
        Brand::Tesla => "Tesla".to_owned(),
        Brand::Quadro => "Quadro".to_owned(),
        Brand::Titan => "Titan".to_owned(),
        Brand::NvidiaRTX => "NVIDIA RTX".to_owned(),
        other => format!("{other:?}"),
    }
}
