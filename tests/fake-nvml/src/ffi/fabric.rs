//! `nvmlDeviceGetGpuFabricInfo` and its versioned form, from the profile's
//! per-GPU `fabric` (semantics in [`crate::profile::fabric`]).

use nvml_wrapper_sys::bindings::*;

use crate::profile::{FabricHealth, FabricState, GpuFabric};

use super::{
    NOT_SUPPORTED, Ret, UNKNOWN, VERSION_MISMATCH, guard, live_gpu, put, read_version,
    struct_version, whole_gpu,
};

/// The fields every struct version shares.
struct Answer {
    uuid: [u8; 16],
    status: nvmlReturn_t,
    clique: u32,
    state: nvmlGpuFabricState_t,
    summary: u8,
}

/// A GPU without `fabric` answers NOT_SUPPORTED: nvml.h's "If device doesn't
/// support gpu fabric", what PCIe GPUs and GPUs outside an NVLink fabric
/// report.
fn answer(device: nvmlDevice_t) -> Ret<Answer> {
    let (_, g) = live_gpu(device)?;
    let f: &GpuFabric = g.gpu.fabric.as_ref().ok_or(NOT_SUPPORTED)?;
    let state = match f.state {
        FabricState::NotSupported => NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
        FabricState::NotStarted => NVML_GPU_FABRIC_STATE_NOT_STARTED,
        FabricState::InProgress => NVML_GPU_FABRIC_STATE_IN_PROGRESS,
        FabricState::Completed => NVML_GPU_FABRIC_STATE_COMPLETED,
    };
    let summary = match f.health_summary {
        FabricHealth::NotSupported => NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED,
        FabricHealth::Healthy => NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
        FabricHealth::Unhealthy => NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
        FabricHealth::LimitedCapacity => NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
    };
    Ok(Answer {
        uuid: f.cluster_uuid_bytes().map_err(|_| UNKNOWN)?,
        status: crate::profile::return_code_from_name(&f.status).ok_or(UNKNOWN)?,
        clique: f.clique_id,
        state: u8::try_from(state).map_err(|_| UNKNOWN)?,
        summary: u8::try_from(summary).map_err(|_| UNKNOWN)?,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let a = answer(device)?;
        let v = nvmlGpuFabricInfo_t {
            clusterUuid: a.uuid,
            status: a.status,
            cliqueId: a.clique,
            state: a.state,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// nvml.h: the caller sets `version` to `nvmlGpuFabricInfo_v2` or
/// `nvmlGpuFabricInfo_v3` (NVML_STRUCT_VERSION(GpuFabricInfo, 2|3));
/// anything else is ARGUMENT_VERSION_MISMATCH. A v2 caller's buffer is only
/// as large as `nvmlGpuFabricInfo_v2_t`, so v2 gets that struct and no
/// `healthSummary`. `healthMask` is 0: every health field
/// NVML_GPU_FABRIC_HEALTH_MASK_*_NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    info: *mut nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    guard(|| {
        whole_gpu(device)?;
        // SAFETY: forwarded caller contract.
        let version = unsafe { read_version(info) }?;
        let v2 = struct_version::<nvmlGpuFabricInfo_v2_t>(2);
        let v3 = struct_version::<nvmlGpuFabricInfo_v3_t>(3);
        if version != v2 && version != v3 {
            return Err(VERSION_MISMATCH);
        }
        let a = answer(device)?;
        if version == v2 {
            let v = nvmlGpuFabricInfo_v2_t {
                version,
                clusterUuid: a.uuid,
                status: a.status,
                cliqueId: a.clique,
                state: a.state,
                healthMask: 0,
            };
            // SAFETY: a v2 caller passed a buffer of at least the v2 size.
            return unsafe { put(info.cast::<nvmlGpuFabricInfo_v2_t>(), v) };
        }
        let v = nvmlGpuFabricInfo_v3_t {
            version,
            clusterUuid: a.uuid,
            status: a.status,
            cliqueId: a.clique,
            state: a.state,
            healthMask: 0,
            healthSummary: a.summary,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}
