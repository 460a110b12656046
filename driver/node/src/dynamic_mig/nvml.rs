//! The NVML calls that make and remove MIG instances, which nvml-wrapper 0.13 does
//! not wrap: through its loaded library, as the discovery's raw calls are.
//!
//! Buffers for instance lists hold [`MAX_INSTANCES`]: nvml.h asks for room for the
//! profile's instance count, which the mig-minors file bounds at 15 GPU instances
//! and 8 compute instances per GPU instance.

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

/// Room for any list of instances of one profile.
const MAX_INSTANCES: usize = 16;

/// A GPU instance as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GpuInstance {
    pub(super) handle: nvmlGpuInstance_t,
    pub(super) id: u32,
    pub(super) profile_id: u32,
    pub(super) start: u32,
    pub(super) size: u32,
}

pub(super) fn create_gpu_instance(
    nvml: &Nvml,
    gpu: &Device<'_>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<GpuInstance, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut handle = std::ptr::null_mut();
    // SAFETY: a GPU handle of this NVML instance and valid pointers.
    nvml_try(unsafe { f(gpu.handle(), profile_id, &placement, &mut handle) })?;
    gpu_instance_info(nvml, handle)
}

fn gpu_instance_info(nvml: &Nvml, handle: nvmlGpuInstance_t) -> Result<GpuInstance, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    // SAFETY: plain integers and pointers; all-zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a GPU instance handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { f(handle, &mut info) })?;
    Ok(GpuInstance {
        handle,
        id: info.id,
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
    })
}

/// The GPU instances of `profile_id` on `gpu`.
pub(super) fn gpu_instances(
    nvml: &Nvml,
    gpu: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<GpuInstance>, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    let mut handles = [std::ptr::null_mut(); MAX_INSTANCES];
    let mut count = 0;
    // SAFETY: a GPU handle of this NVML instance; the array has room for any
    // profile's instances (module docs).
    nvml_try(unsafe { f(gpu.handle(), profile_id, handles.as_mut_ptr(), &mut count) })?;
    handles
        .iter()
        .take(count as usize)
        .map(|h| gpu_instance_info(nvml, *h))
        .collect()
}

/// The ids of the GPU instance profiles the GPU has, asked by index
/// (`NVML_GPU_INSTANCE_PROFILE_*`) as discovery asks them.
pub(super) fn profile_ids(nvml: &Nvml, gpu: &Device<'_>) -> Vec<u32> {
    let Ok(f) = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceProfileInfo.as_ref()) else {
        return Vec::new();
    };
    (0..NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|index| {
            // SAFETY: plain integers; all-zero is a valid value.
            let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: a GPU handle of this NVML instance and a valid out pointer.
            nvml_try(unsafe { f(gpu.handle(), index, &mut info) }).ok()?;
            Some(info.id)
        })
        .collect()
}

pub(super) fn destroy_gpu_instance(nvml: &Nvml, gi: &GpuInstance) -> Result<(), NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    // SAFETY: a GPU instance handle of this NVML instance.
    nvml_try(unsafe { f(gi.handle) })
}

/// The compute instance profile that spans the whole GPU instance: of the
/// profiles the instance answers for, the one with the most slices. nvml.h
/// numbers compute profiles by index (`NVML_COMPUTE_INSTANCE_PROFILE_*`), the
/// largest not always last (`8_SLICE` comes before `6_SLICE`).
pub(super) fn full_compute_profile(nvml: &Nvml, gi: &GpuInstance) -> Result<u32, NvmlError> {
    let f = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let mut best: Option<(u32, u32)> = None;
    for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: plain integers; all-zero is a valid value.
        let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a GPU instance handle of this NVML instance and a valid out pointer.
        let r = nvml_try(unsafe {
            f(
                gi.handle,
                index,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        });
        match r {
            Ok(()) if best.is_none_or(|(slices, _)| info.sliceCount > slices) => {
                best = Some((info.sliceCount, info.id));
            }
            Ok(()) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(e) => return Err(e),
        }
    }
    best.map(|(_, id)| id).ok_or(NvmlError::NotSupported)
}

/// A compute instance as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ComputeInstance {
    pub(super) handle: nvmlComputeInstance_t,
    pub(super) id: u32,
}

pub(super) fn create_compute_instance(
    nvml: &Nvml,
    gi: &GpuInstance,
    profile_id: u32,
) -> Result<ComputeInstance, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: a GPU instance handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { f(gi.handle, profile_id, &mut handle) })?;
    compute_instance_info(nvml, handle)
}

fn compute_instance_info(
    nvml: &Nvml,
    handle: nvmlComputeInstance_t,
) -> Result<ComputeInstance, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    // SAFETY: plain integers and pointers; all-zero is a valid value.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a compute instance handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { f(handle, &mut info) })?;
    Ok(ComputeInstance {
        handle,
        id: info.id,
    })
}

/// Every compute instance of a GPU instance, of any profile.
pub(super) fn compute_instances(
    nvml: &Nvml,
    gi: &GpuInstance,
) -> Result<Vec<ComputeInstance>, NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let mut out = Vec::new();
    for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let mut handles = [std::ptr::null_mut(); MAX_INSTANCES];
        let mut count = 0;
        // SAFETY: a GPU instance handle of this NVML instance; room for any
        // profile's instances (module docs).
        let r = nvml_try(unsafe { f(gi.handle, index, handles.as_mut_ptr(), &mut count) });
        match r {
            Ok(()) => {
                for h in handles.iter().take(count as usize) {
                    out.push(compute_instance_info(nvml, *h)?);
                }
            }
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

pub(super) fn destroy_compute_instance(nvml: &Nvml, ci: &ComputeInstance) -> Result<(), NvmlError> {
    let f = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    // SAFETY: a compute instance handle of this NVML instance.
    nvml_try(unsafe { f(ci.handle) })
}

/// The UUID of the MIG device of compute instance `ci` in GPU instance `gi`:
/// NVML hands MIG devices out by index, so the slots are searched for the ids.
pub(super) fn mig_uuid(
    nvml: &Nvml,
    gpu: &Device<'_>,
    gi: u32,
    ci: u32,
) -> Result<Option<String>, NvmlError> {
    let lib = nvml.lib();
    let gi_of = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?;
    let ci_of = nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?;
    for index in 0..gpu.mig_device_count()? {
        let m = match gpu.mig_device_by_index(index) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(e),
        };
        let (mut g, mut c) = (0, 0);
        // SAFETY: a MIG handle of this NVML instance and valid out pointers.
        unsafe {
            nvml_try(gi_of(m.handle(), &mut g))?;
            nvml_try(ci_of(m.handle(), &mut c))?;
        }
        if (g, c) == (gi, ci) {
            return m.uuid().map(Some);
        }
    }
    Ok(None)
}
