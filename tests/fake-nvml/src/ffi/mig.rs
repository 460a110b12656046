//! MIG device handles: enumeration under a parent GPU and the queries only
//! MIG handles answer. Return codes follow nvml.h's documentation of each
//! call; where nvml.h leaves the choice open the comment says so.
//!
//! A MIG handle points at a `FakeMig` inside the leaked machine, so it is as
//! stable as a GPU handle and never aliases one.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;

use super::{
    Dev, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, guard, handle_of, live, live_gpu, put, resolve,
};

/// nvml.h: "Returns zero if MIG is not supported or enabled"; otherwise the
/// GPU's maximum (profile `mig.max_devices`, 7 by default per the MIG User
/// Guide's "Supported GPUs" table). On a MIG handle: NOT_SUPPORTED (choice).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = live_gpu(device)?;
        let n = if g.mig_enabled() {
            g.gpu.max_mig_devices()
        } else {
            0
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n) }
    })
}

/// nvml.h: NOT_FOUND "if no valid MIG device was found at index",
/// INVALID_ARGUMENT "if device, index or migDevice reference is invalid",
/// NOT_SUPPORTED "if this query is not supported by the device". Here: a GPU
/// not in MIG mode is NOT_SUPPORTED, an index at or past the maximum count
/// INVALID_ARGUMENT, an empty slot below it NOT_FOUND (consumers such as
/// go-nvlib walk 0..max and skip NOT_FOUND).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = live_gpu(device)?;
        if !g.mig_enabled() {
            return Err(NOT_SUPPORTED);
        }
        if index >= g.gpu.max_mig_devices() {
            return Err(INVALID_ARGUMENT);
        }
        let m = g.migs.iter().find(|m| m.index == index).ok_or(NOT_FOUND)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(mig_device, handle_of(m)) }
    })
}

/// 1 for MIG handles, 0 for whole GPUs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let v = match resolve(device)?.1 {
            Dev::Gpu(_) => 0,
            Dev::Mig(..) => 1,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(is_mig, v) }
    })
}

/// nvml.h: INVALID_ARGUMENT "if migDevice or device is invalid"; a whole-GPU
/// handle is not a valid `migDevice`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let Dev::Mig(parent, _) = resolve(mig_device)?.1 else {
            return Err(INVALID_ARGUMENT);
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(device, handle_of(parent)) }
    })
}

/// Runs a query only MIG handles answer; whole GPUs get NOT_SUPPORTED (nvml.h:
/// the target is a "MIG device handle"; NOT_SUPPORTED "if this query is not
/// supported by the device").
fn mig_only<T>(
    handle: nvmlDevice_t,
    out: *mut T,
    f: impl FnOnce(&crate::profile::MigDevice) -> T,
) -> nvmlReturn_t {
    guard(|| {
        let Dev::Mig(_, m) = resolve(handle)?.1 else {
            return Err(NOT_SUPPORTED);
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(out, f(&m.dev)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    mig_only(device, id, |d| d.gpu_instance_id)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    mig_only(device, id, |d| d.compute_instance_id)
}

/// nvml.h: "This API currently only supports MIG device handles".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    guard(|| {
        let d = resolve(device)?.1;
        let Dev::Mig(_, m) = d else {
            return Err(NOT_SUPPORTED);
        };
        live(d)?;
        let a = &m.dev;
        let v = nvmlDeviceAttributes_t {
            multiprocessorCount: a.multiprocessors,
            sharedCopyEngineCount: a.copy_engines,
            sharedDecoderCount: a.decoders,
            sharedEncoderCount: a.encoders,
            sharedJpegCount: a.jpeg_engines,
            sharedOfaCount: a.ofa_engines,
            gpuInstanceSliceCount: a.gpu_instance_slices,
            computeInstanceSliceCount: a.compute_instance_slices,
            memorySizeMB: a.memory_mib,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(attributes, v) }
    })
}

/// nvml.h: NOT_SUPPORTED "if device doesn't support MIG or profile isn't
/// supported", INVALID_ARGUMENT "if device, profile or info are invalid", and
/// profiles are enumerated "starting from 0, until the API returns
/// NVML_ERROR_INVALID_ARGUMENT". This library carries no GPU instance profile
/// table: a GPU without MIG (profile `mig` unset) and every profile of a
/// MIG-capable one answer NOT_SUPPORTED, a profile id at or past
/// `NVML_GPU_INSTANCE_PROFILE_COUNT` INVALID_ARGUMENT. NVIDIA's GPU kubelet
/// plugin asks for every profile of every GPU at start-up and skips both codes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        live_gpu(device)?;
        if profile >= NVML_GPU_INSTANCE_PROFILE_COUNT || info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        Err(NOT_SUPPORTED)
    })
}
