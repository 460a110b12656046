//! MIG device handles: enumeration under a parent GPU and the queries only
//! MIG handles answer. Return codes follow nvml.h's documentation of each
//! call; where nvml.h leaves the choice open the comment says so.
//!
//! A MIG handle points at a `FakeMig` inside the leaked machine, so it is as
//! stable as a GPU handle and never aliases one.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;

use super::{
    Dev, FakeGpu, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, Ret, fill, guard, handle_of, live,
    live_gpu, mig_handle, put, read_version, resolve, struct_version,
};

mod gi_profiles;
pub mod instances;
pub mod state;

use gi_profiles::GiProfile;

/// nvml.h: "Returns zero if MIG is not supported or enabled"; otherwise the
/// GPU's maximum (profile `mig.max_devices`, 7 by default per the MIG User
/// Guide's "Supported GPUs" table). On a MIG handle: NOT_SUPPORTED (choice).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = live_gpu(device)?;
        let n = if instances::mig_enabled(m, g)? {
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
        let (m, g) = live_gpu(device)?;
        if !instances::mig_enabled(m, g)? {
            return Err(NOT_SUPPORTED);
        }
        if index >= g.gpu.max_mig_devices() {
            return Err(INVALID_ARGUMENT);
        }
        let devices = instances::mig_devices(m, g)?;
        let d = devices.get(index as usize).ok_or(NOT_FOUND)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(mig_device, mig_handle(g, d)) }
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

/// The GPU instance profile table of a MIG-capable GPU ([`gi_profiles`]). A GPU
/// without MIG (profile `mig` unset) answers NOT_SUPPORTED (nvml.h: "If device
/// doesn't support MIG"), and so does a MIG-capable GPU whose product has no
/// table here: nothing is known of its profiles.
fn gi_table(g: &FakeGpu) -> Ret<&'static [GiProfile]> {
    g.gpu.mig.ok_or(NOT_SUPPORTED)?;
    gi_profiles::table(&g.gpu.name).ok_or(NOT_SUPPORTED)
}

/// The row of an `NVML_GPU_INSTANCE_PROFILE_*` index. nvml.h: INVALID_ARGUMENT
/// "if device, profile or info are invalid", and profiles are enumerated
/// "starting from 0, until the API returns NVML_ERROR_INVALID_ARGUMENT": an
/// index at or past `NVML_GPU_INSTANCE_PROFILE_COUNT` is invalid on any GPU. A
/// known index the GPU has no such profile for is NOT_SUPPORTED ("profile isn't
/// supported").
fn gi_profile(g: &FakeGpu, profile: c_uint) -> Ret<&'static GiProfile> {
    if profile >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    gi_table(g)?
        .iter()
        .find(|r| r.profile == profile)
        .ok_or(NOT_SUPPORTED)
}

/// nvml.h: "Information provided by this API is immutable throughout the
/// lifetime of a MIG mode"; NOT_SUPPORTED "if device doesn't support MIG or
/// profile isn't supported", which this library reads as answering whatever the
/// MIG mode (unlike the V call below). Errors as in [`gi_profile`]; a null `info`
/// is INVALID_ARGUMENT. NVIDIA's GPU kubelet plugin (and go-nvlib's
/// `VisitMigProfiles`) asks for every profile of every GPU at start-up and skips
/// both error codes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = live_gpu(device)?;
        if info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let r = gi_profile(g, profile)?;
        let v = nvmlGpuInstanceProfileInfo_t {
            id: r.id,
            isP2pSupported: 0,
            sliceCount: r.slices,
            instanceCount: r.instances,
            multiprocessorCount: r.multiprocessors,
            copyEngineCount: r.copy_engines,
            decoderCount: r.decoders,
            encoderCount: r.encoders,
            jpegCount: r.jpeg,
            ofaCount: r.ofa,
            memorySizeMB: r.memory_mib,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// The versioned call: the caller sets `version` to `nvmlGpuInstanceProfileInfo_v2`
/// or `_v3` (NVML_STRUCT_VERSION: `sizeof | ver << 24`); nvml.h answers
/// INVALID_ARGUMENT "if device, profile, info, or info->version are invalid" (not
/// ARGUMENT_VERSION_MISMATCH, which the fabric call uses). Version 2 adds `name`
/// to the unversioned struct; version 3 drops `isP2pSupported` for `capabilities`
/// (NVML_GPU_INSTANCE_PROFILE_CAPS_*; 0 here: no P2P, no graphics). A v2 caller's
/// buffer is only as large as the v2 struct, so it gets that struct.
///
/// Unlike the unversioned call, nvml.h documents NOT_SUPPORTED "if device doesn't
/// have MIG mode enabled": this library answers only while MIG is enabled
/// (`mig.current`), as documented; whether real NVML does is not known here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = live_gpu(device)?;
        // SAFETY: forwarded caller contract.
        let version = unsafe { read_version(info) }?;
        let v2 = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
        let v3 = struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3);
        if version != v2 && version != v3 {
            return Err(INVALID_ARGUMENT);
        }
        let r = gi_profile(g, profile)?;
        if !instances::mig_enabled(m, g)? {
            return Err(NOT_SUPPORTED);
        }
        let mut name = [0; NVML_DEVICE_NAME_V2_BUFFER_SIZE as usize];
        fill(&mut name, &format!("MIG {}", r.name));
        if version == v2 {
            let v = nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: r.id,
                isP2pSupported: 0,
                sliceCount: r.slices,
                instanceCount: r.instances,
                multiprocessorCount: r.multiprocessors,
                copyEngineCount: r.copy_engines,
                decoderCount: r.decoders,
                encoderCount: r.encoders,
                jpegCount: r.jpeg,
                ofaCount: r.ofa,
                memorySizeMB: r.memory_mib,
                name,
            };
            // SAFETY: forwarded caller contract.
            return unsafe { put(info, v) };
        }
        let v = nvmlGpuInstanceProfileInfo_v3_t {
            version,
            id: r.id,
            sliceCount: r.slices,
            instanceCount: r.instances,
            multiprocessorCount: r.multiprocessors,
            copyEngineCount: r.copy_engines,
            decoderCount: r.decoders,
            encoderCount: r.encoders,
            jpegCount: r.jpeg,
            ofaCount: r.ofa,
            memorySizeMB: r.memory_mib,
            name,
            capabilities: 0,
        };
        // SAFETY: a v3 caller passed a buffer of the v3 size.
        unsafe { put(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), v) }
    })
}

/// nvml.h: "returns all the possible placements for the given profile regardless
/// of whether MIG is enabled or not", for a `profileId` as
/// `nvmlDeviceGetGpuInstanceProfileInfo` reports it in `id` (19 for an A100's
/// 1g.5gb, not the `NVML_GPU_INSTANCE_PROFILE_*` index). `placements` "Can be
/// NULL to discover number of allowed placements for this profile. If non-NULL
/// must be large enough to accommodate the placements supported by the
/// profile"; `count` "Returns number of allowed placemenets for the profile".
/// So `*count` is only written, never read as the array's size: with a non-null
/// array every placement is written (the two-call protocol go-nvml and
/// nvml-wrapper follow passes the count the first call returned). Errors:
/// INVALID_ARGUMENT "if device, profileId or count are invalid" (a null `count`
/// here), NOT_SUPPORTED "if device doesn't support MIG or profileId isn't
/// supported" (an id the GPU's table does not list; this library's reading, as
/// nvml.h also allows INVALID_ARGUMENT for it). nvml.h also says "Requires
/// privileged user": this library does not model permissions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g) = live_gpu(device)?;
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let r = gi_table(g)?
            .iter()
            .find(|r| r.id == profile_id)
            .ok_or(NOT_SUPPORTED)?;
        let n = c_uint::try_from(r.placements.len()).map_err(|_| INVALID_ARGUMENT)?;
        if !placements.is_null() {
            for (i, &(start, size)) in r.placements.iter().enumerate() {
                // SAFETY: per nvml.h the caller's array holds every placement of
                // the profile, `n` of them.
                unsafe {
                    placements
                        .add(i)
                        .write_unaligned(nvmlGpuInstancePlacement_t { start, size });
                }
            }
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n) }
    })
}
