//! GPU identity and NVLink wiring from NVML, through `nvml-wrapper`.
//!
//! The library is loaded at run time, so a node without the NVIDIA driver gets a
//! clear error instead of a binary that fails to start.

use std::ffi::OsStr;
use std::path::PathBuf;

use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{DiscoveryError, GpuIdentity, IdentitySnapshot, IdentitySource};
use crate::inventory::{ComputeCapability, CudaVersion, MigMode};
use crate::pci::PciAddress;

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
                other => DiscoveryError::NvmlInit(other.to_string()),
            })
    }
}

impl IdentitySource for NvmlSource {
    fn identity(&self) -> Result<IdentitySnapshot, DiscoveryError> {
        snapshot(&self.open()?)
    }
}

fn call_error(call: &str) -> impl FnOnce(NvmlError) -> DiscoveryError + '_ {
    move |e| DiscoveryError::Nvml {
        call: call.to_owned(),
        reason: e.to_string(),
    }
}

/// Describes every GPU an initialized NVML reports. A GPU that cannot be opened or
/// has no readable address or UUID is listed in `unusable` rather than failing the
/// whole node: the other GPUs are still worth publishing.
pub fn snapshot(nvml: &Nvml) -> Result<IdentitySnapshot, DiscoveryError> {
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
        let described = nvml
            .device_by_index(index)
            .map_err(|e| e.to_string())
            .and_then(|d| describe(index, &d));
        match described {
            Ok(gpu) => out.gpus.push(gpu),
            Err(e) => out.unusable.push(format!("GPU index {index}: {e}")),
        }
    }
    Ok(out)
}

fn describe(index: u32, device: &Device<'_>) -> Result<GpuIdentity, String> {
    let pci = device
        .pci_info()
        .map_err(|e| format!("nvmlDeviceGetPciInfo: {e}"))?;
    let pci_bus_id: PciAddress = pci.bus_id.parse().map_err(|e| format!("{e}"))?;
    let uuid = device
        .uuid()
        .map_err(|e| format!("{pci_bus_id}: nvmlDeviceGetUUID: {e}"))?;
    Ok(GpuIdentity {
        pci_bus_id,
        index: device.index().unwrap_or(index),
        minor: device.minor_number().ok(),
        uuid,
        product_name: device.name().ok(),
        brand: device.brand().ok().map(brand_name),
        architecture: device.architecture().ok().map(|a| a.to_string()),
        cuda_compute_capability: device.cuda_compute_capability().ok().and_then(|c| {
            Some(ComputeCapability {
                major: u32::try_from(c.major).ok()?,
                minor: u32::try_from(c.minor).ok()?,
            })
        }),
        memory_bytes: device.memory_info().ok().map(|m| m.total),
        mig_mode: device.mig_mode().ok().map(|m| MigMode {
            current: m.current != 0,
            pending: m.pending != 0,
        }),
        memory_numa_node: device.numa_node_id().ok(),
        nvlink_remotes: nvlink_remotes(device),
    })
}

/// Remote PCI addresses of the active NVLinks. Links a GPU does not have answer
/// NotSupported or InvalidArg, which simply means "no link here".
fn nvlink_remotes(device: &Device<'_>) -> Vec<PciAddress> {
    (0..MAX_NVLINKS)
        .filter_map(|link| {
            let link = device.link_wrapper_for(link);
            if !link.is_active().unwrap_or(false) {
                return None;
            }
            link.remote_pci_info().ok()?.bus_id.parse().ok()
        })
        .collect()
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
