//! Helpers shared by the NVML integration tests: installing a private copy of
//! the library, and the raw calls nvml-wrapper does not wrap (or wraps
//! wrongly) through `Nvml::lib()`.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use topodra_fake_nvml::{Profile, install};

pub const SUCCESS: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;

pub fn setup(yaml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = install(dir.path(), yaml);
    (dir, lib)
}

pub fn open(lib: &Path) -> Result<Nvml, NvmlError> {
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

pub fn builtin_yaml(name: &str) -> String {
    Profile::builtin(name).expect("builtin").to_yaml()
}

fn handle(d: &Device<'_>) -> sys::nvmlDevice_t {
    // SAFETY: the handle is passed back to the library it came from only.
    unsafe { d.handle() }
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`; nvml-wrapper 0.13's wrapper
/// discards the value it reads.
pub fn remote_type(
    nvml: &Nvml,
    d: &Device<'_>,
    link: u32,
) -> Result<sys::nvmlIntNvLinkDeviceType_t, sys::nvmlReturn_t> {
    let mut kind = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: valid handle of this library and a valid out pointer.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType(handle(d), link, &mut kind)
    };
    if rc == SUCCESS { Ok(kind) } else { Err(rc) }
}

/// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId`.
pub fn instance_ids(nvml: &Nvml, d: &Device<'_>) -> Result<(u32, u32), sys::nvmlReturn_t> {
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: valid handle of this library and valid out pointers.
    let (a, b) = unsafe {
        (
            nvml.lib().nvmlDeviceGetGpuInstanceId(handle(d), &mut gi),
            nvml.lib()
                .nvmlDeviceGetComputeInstanceId(handle(d), &mut ci),
        )
    };
    match (a, b) {
        (SUCCESS, SUCCESS) => Ok((gi, ci)),
        (SUCCESS, e) | (e, _) => Err(e),
    }
}

/// `nvmlDeviceGetGpuFabricInfoV` with the current (v3) struct.
pub fn fabric_v3(
    nvml: &Nvml,
    d: &Device<'_>,
) -> Result<sys::nvmlGpuFabricInfoV_t, sys::nvmlReturn_t> {
    // SAFETY: plain integers and byte arrays.
    let mut info: sys::nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
    info.version = struct_version::<sys::nvmlGpuFabricInfo_v3_t>(3);
    // SAFETY: valid handle of this library and a valid out pointer.
    let rc = unsafe { nvml.lib().nvmlDeviceGetGpuFabricInfoV(handle(d), &mut info) };
    if rc == SUCCESS { Ok(info) } else { Err(rc) }
}

/// nvml.h's NVML_STRUCT_VERSION.
pub fn struct_version<T>(ver: u32) -> u32 {
    u32::try_from(std::mem::size_of::<T>()).expect("small struct") | (ver << 24)
}

/// Canonical text of 16 UUID bytes.
pub fn uuid_text(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}
