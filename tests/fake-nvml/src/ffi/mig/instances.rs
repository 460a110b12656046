//! Creating and destroying GPU and compute instances: the calls a driver that
//! carves GPUs on demand makes. What exists lives in the state file
//! ([`super::state`]); a handle names an instance by (GPU, id) and is checked
//! against that file on every use, so an instance destroyed by another process
//! turns its handles invalid, as a destroyed instance does under real NVML.
//!
//! Return codes are nvml.h's for each call (quoted at each function). Choices
//! where nvml.h leaves one open:
//! - a handle whose instance no longer exists: INVALID_ARGUMENT;
//! - creation without a placement takes the free placement with the lowest
//!   start, which public output shows for the first of two 3g.20gb instances
//!   (0:4; see the state module);
//! - compute instance profiles: every `NVML_COMPUTE_INSTANCE_PROFILE_*` of 1,
//!   2, 3, 4 or 7 slices that fits the GPU instance (what `nvidia-smi mig -lcip`
//!   lists on a 7g instance of A100 and H100, cut to the instance's size); CI
//!   profile ids equal the index, as `-lcip` prints them (1c 0, 2c 1, 3c 2,
//!   4c 3, 7g 4). A compute instance takes the lowest free compute slices.
//!   Its SMs are the GPU instance's in proportion to its slices.
//! - faults ([`super::state::Faults`]) fail creations with NVML_ERROR_UNKNOWN.

use std::ffi::c_uint;
use std::path::Path;
use std::sync::Mutex;

use nvml_wrapper_sys::bindings::*;

use super::super::{
    Dev, FakeGpu, INVALID_ARGUMENT, Machine, NOT_FOUND, NOT_SUPPORTED, Ret, UNKNOWN, fill, guard,
    handle_of, live, lock, machine, put, read_version, struct_version,
};
use super::gi_profiles::{self, GiProfile};
use super::state::{self, ComputeInstance, DriverState, GpuInstance, GpuState, StateError};
use crate::profile::MigDevice;
use crate::profile::mig::{ci_access_minor, gi_access_minor};

const IN_USE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_IN_USE;
const INSUFFICIENT_RESOURCES: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;

/// Compute instance sizes this library offers (module docs).
const COMPUTE_SIZES: [u32; 5] = [1, 2, 3, 4, 7];

/// Reports a broken or unwritable state file once, as a broken profile is.
fn report(e: StateError) -> nvmlReturn_t {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("topodra-fake-nvml: state: {}", e.0);
    }
    UNKNOWN
}

fn state_path(m: &Machine) -> Ret<&Path> {
    m.state_path.as_deref().ok_or(UNKNOWN)
}

fn table(g: &FakeGpu) -> Option<&'static [GiProfile]> {
    gi_profiles::table(&g.gpu.name)
}

/// The instances of `g` right now.
pub(in crate::ffi) fn instances(m: &Machine, g: &FakeGpu) -> Ret<Vec<GpuInstance>> {
    let s = state::read(state_path(m)?).map_err(report)?;
    Ok(current(&s, g).instances)
}

fn current(s: &DriverState, g: &FakeGpu) -> GpuState {
    s.gpus
        .get(&g.gpu.uuid)
        .cloned()
        .unwrap_or_else(|| GpuState {
            mig_mode: None,
            instances: state::boot_instances(&g.gpu, table(g)),
            uuids_made: 0,
            compute_mode: None,
        })
}

/// The GPU's MIG mode now: the profile's, or what `nvmlDeviceSetMigMode` made it.
/// `None` for a GPU without MIG.
pub(in crate::ffi) fn mig_mode(m: &Machine, g: &FakeGpu) -> Ret<Option<state::ModeState>> {
    let Some(boot) = g.gpu.mig else {
        return Ok(None);
    };
    let s = state::read(state_path(m)?).map_err(report)?;
    Ok(Some(
        s.gpus
            .get(&g.gpu.uuid)
            .and_then(|gs| gs.mig_mode)
            .unwrap_or(state::ModeState {
                current: boot.current,
                pending: boot.pending,
            }),
    ))
}

/// Whether MIG mode is on now (`current`).
pub(in crate::ffi) fn mig_enabled(m: &Machine, g: &FakeGpu) -> Ret<bool> {
    Ok(mig_mode(m, g)?.is_some_and(|mode| mode.current))
}

/// The GPU's compute mode now (`NVML_COMPUTEMODE_*`): DEFAULT until
/// `nvmlDeviceSetComputeMode` changed it, kept in the state file like the MIG
/// mode, since it is the driver's, not one process's.
pub(in crate::ffi) fn compute_mode(m: &Machine, g: &FakeGpu) -> Ret<u32> {
    let s = state::read(state_path(m)?).map_err(report)?;
    Ok(s.compute_mode(&g.gpu.uuid))
}

/// Makes `mode` the GPU's compute mode; DEFAULT is kept as no entry, the boot
/// state.
pub(in crate::ffi) fn set_compute_mode(m: &Machine, g: &FakeGpu, mode: u32) -> Ret<()> {
    change(m, g, |c| {
        c.gpu.compute_mode =
            (mode != nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT).then_some(mode);
        Ok(())
    })
}

/// What a change sees: the GPU's state, the faults, the capabilities mirror.
struct Change<'a> {
    gpu: &'a mut GpuState,
    faults: &'a mut state::Faults,
    caps: Option<&'a Path>,
}

/// Runs `f` on `g`'s state under the file lock. `f` must not change anything
/// before it fails, except the fault counters it consumes, which are kept.
fn change<T>(m: &Machine, g: &FakeGpu, f: impl FnOnce(Change<'_>) -> Ret<T>) -> Ret<T> {
    let out = state::update(state_path(m)?, |s: &mut DriverState| {
        let seeded = current(s, g);
        let DriverState {
            gpus,
            capabilities_dir,
            faults,
        } = s;
        let gpu = gpus.entry(g.gpu.uuid.clone()).or_insert(seeded);
        Ok::<_, std::convert::Infallible>(f(Change {
            gpu,
            faults,
            caps: capabilities_dir.as_deref(),
        }))
    });
    match out {
        Ok(Ok(r)) => r,
        Ok(Err(never)) => match never {},
        Err(e) => Err(report(e)),
    }
}

/// Sleeps for the injected delay and consumes one injected failure.
fn creation_faults(delay_ms: u64, failures: &mut u32) -> Ret<()> {
    if delay_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    }
    if *failures > 0 {
        *failures -= 1;
        return Err(UNKNOWN);
    }
    Ok(())
}

/// The capability file of a GPU or compute instance, as the kernel module
/// makes it when the instance appears (world-readable, per the MIG User Guide's
/// listings) and removes when it goes.
fn write_capability(caps: Option<&Path>, rel: &Path, minor: u32) {
    let Some(dir) = caps else { return };
    let d = dir.join(rel);
    // A mirror that cannot be written is the test's problem, not NVML's: the
    // call still succeeds, as the driver's own procfs never fails it.
    let _ = std::fs::create_dir_all(&d)
        .and_then(|()| std::fs::write(d.join("access"), crate::sim::capability_file(minor, 0o444)));
}

fn remove_capability(caps: Option<&Path>, rel: &Path) {
    if let Some(dir) = caps {
        let _ = std::fs::remove_dir_all(dir.join(rel));
    }
}

fn gi_rel(g: &FakeGpu, gi: u32) -> std::path::PathBuf {
    Path::new(&format!("gpu{}", g.gpu.minor))
        .join("mig")
        .join(format!("gi{gi}"))
}

/// Writes `items` into the caller's array and their number into `count`.
///
/// # Safety
/// `out` must have room for every item; `count` null or valid for a write.
unsafe fn put_list<T: Copy>(out: *mut T, items: &[T], count: *mut c_uint) -> Ret<()> {
    let n = c_uint::try_from(items.len()).map_err(|_| INVALID_ARGUMENT)?;
    for (i, item) in items.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { out.add(i).write_unaligned(*item) };
    }
    // SAFETY: forwarded caller contract.
    unsafe { put(count, n) }
}

// --- handles ---------------------------------------------------------------

#[derive(Debug)]
struct GiKey {
    gpu: &'static FakeGpu,
    id: u32,
}

#[derive(Debug)]
struct CiKey {
    gpu: &'static FakeGpu,
    gi: u32,
    id: u32,
}

static GI_KEYS: Mutex<Vec<&'static GiKey>> = Mutex::new(Vec::new());
static CI_KEYS: Mutex<Vec<&'static CiKey>> = Mutex::new(Vec::new());

fn gi_handle(gpu: &'static FakeGpu, id: u32) -> nvmlGpuInstance_t {
    let mut keys = lock(&GI_KEYS);
    let key = match keys.iter().find(|k| std::ptr::eq(k.gpu, gpu) && k.id == id) {
        Some(k) => *k,
        None => {
            let k: &'static GiKey = Box::leak(Box::new(GiKey { gpu, id }));
            keys.push(k);
            k
        }
    };
    std::ptr::from_ref(key).cast_mut().cast()
}

fn ci_handle(gpu: &'static FakeGpu, gi: u32, id: u32) -> nvmlComputeInstance_t {
    let mut keys = lock(&CI_KEYS);
    let key = match keys
        .iter()
        .find(|k| std::ptr::eq(k.gpu, gpu) && k.gi == gi && k.id == id)
    {
        Some(k) => *k,
        None => {
            let k: &'static CiKey = Box::leak(Box::new(CiKey { gpu, gi, id }));
            keys.push(k);
            k
        }
    };
    std::ptr::from_ref(key).cast_mut().cast()
}

/// The GPU of a key, if it belongs to the machine now loaded and is on the bus.
fn own_gpu(m: &'static Machine, gpu: &'static FakeGpu) -> Ret<&'static FakeGpu> {
    if !m.gpus.iter().any(|g| std::ptr::eq(g, gpu)) {
        return Err(INVALID_ARGUMENT);
    }
    live(Dev::Gpu(gpu))?;
    Ok(gpu)
}

/// A GPU instance handle: its machine, GPU and instance as they are now.
fn resolve_gi(h: nvmlGpuInstance_t) -> Ret<(&'static Machine, &'static FakeGpu, GpuInstance)> {
    let m = machine()?;
    let key = *lock(&GI_KEYS)
        .iter()
        .find(|k| std::ptr::eq(std::ptr::from_ref(**k).cast(), h.cast_const()))
        .ok_or(INVALID_ARGUMENT)?;
    let g = own_gpu(m, key.gpu)?;
    let gi = instances(m, g)?
        .into_iter()
        .find(|gi| gi.id == key.id)
        .ok_or(INVALID_ARGUMENT)?;
    Ok((m, g, gi))
}

/// A compute instance handle, with its GPU instance.
fn resolve_ci(
    h: nvmlComputeInstance_t,
) -> Ret<(
    &'static Machine,
    &'static FakeGpu,
    GpuInstance,
    ComputeInstance,
)> {
    let m = machine()?;
    let key = *lock(&CI_KEYS)
        .iter()
        .find(|k| std::ptr::eq(std::ptr::from_ref(**k).cast(), h.cast_const()))
        .ok_or(INVALID_ARGUMENT)?;
    let g = own_gpu(m, key.gpu)?;
    let gi = instances(m, g)?
        .into_iter()
        .find(|gi| gi.id == key.gi)
        .ok_or(INVALID_ARGUMENT)?;
    let ci = gi
        .compute
        .iter()
        .find(|c| c.id == key.id)
        .cloned()
        .ok_or(INVALID_ARGUMENT)?;
    Ok((m, g, gi, ci))
}

// --- GPU instances -----------------------------------------------------------

/// A GPU in MIG mode, on the bus, with a profile table, and the row of `id`.
fn gi_row(
    device: nvmlDevice_t,
    profile_id: c_uint,
) -> Ret<(&'static Machine, &'static FakeGpu, &'static GiProfile)> {
    let (m, g) = super::super::live_gpu(device)?;
    if !mig_enabled(m, g)? {
        return Err(NOT_SUPPORTED);
    }
    let row = table(g)
        .ok_or(NOT_SUPPORTED)?
        .iter()
        .find(|r| r.id == profile_id)
        .ok_or(INVALID_ARGUMENT)?;
    Ok((m, g, row))
}

/// Whether a `row` instance fits at `start..start + size` beside `existing`,
/// within the GPU's `max` compute slices.
fn fits(existing: &[GpuInstance], row: &GiProfile, (start, size): (u32, u32), max: u32) -> bool {
    let same = existing
        .iter()
        .filter(|gi| gi.profile_id == Some(row.id))
        .count();
    let compute: u32 = existing.iter().map(|gi| gi.slices).sum();
    same < row.instances as usize
        && compute + row.slices <= max
        && !existing.iter().any(|gi| gi.overlaps(start, size))
}

/// Creates a GPU instance of `row` at `placement`, or at the free placement
/// with the lowest start; returns its id.
fn create_gi(
    m: &'static Machine,
    g: &'static FakeGpu,
    row: &'static GiProfile,
    placement: Option<(u32, u32)>,
) -> Ret<u32> {
    if let Some(p) = placement
        && !row.placements.contains(&p)
    {
        return Err(INVALID_ARGUMENT);
    }
    let max = g.gpu.max_mig_devices();
    change(m, g, |c| {
        creation_faults(
            c.faults.create_delay_ms,
            &mut c.faults.fail_gpu_instance_creates,
        )?;
        let existing = &c.gpu.instances;
        let (start, size) = match placement {
            Some(p) if fits(existing, row, p, max) => p,
            Some(_) => return Err(INSUFFICIENT_RESOURCES),
            None => *row
                .placements
                .iter()
                .filter(|&&p| fits(existing, row, p, max))
                .min_by_key(|p| p.0)
                .ok_or(INSUFFICIENT_RESOURCES)?,
        };
        let id = state::slot_id(start, size).ok_or(INVALID_ARGUMENT)?;
        c.gpu.instances.push(GpuInstance {
            id,
            profile_id: Some(row.id),
            start,
            size,
            slices: row.slices,
            name: row.name.to_owned(),
            memory_mib: row.memory_mib,
            multiprocessors: row.multiprocessors,
            engines: [
                row.copy_engines,
                row.decoders,
                row.encoders,
                row.jpeg,
                row.ofa,
            ],
            cap_minor: None,
            compute: Vec::new(),
        });
        write_capability(c.caps, &gi_rel(g, id), gi_access_minor(g.gpu.minor, id));
        Ok(id)
    })
}

/// nvml.h: INVALID_ARGUMENT "If device, profile, profile->placement or
/// gpuInstance are invalid" (a placement the profile does not list is
/// invalid), NOT_SUPPORTED "If device doesn't have MIG mode enabled",
/// INSUFFICIENT_RESOURCES "If the requested GPU instance could not be
/// created" (taken slices, the profile's instance count, or the GPU's compute
/// slices).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        if placement.is_null() || gpu_instance.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, per the caller's contract a placement.
        let p = unsafe { placement.read_unaligned() };
        let (m, g, row) = gi_row(device, profile_id)?;
        let id = create_gi(m, g, row, Some((p.start, p.size)))?;
        // SAFETY: forwarded caller contract.
        unsafe { put(gpu_instance, gi_handle(g, id)) }
    })
}

/// As [`nvmlDeviceCreateGpuInstanceWithPlacement`], NVML choosing the placement.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        if gpu_instance.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (m, g, row) = gi_row(device, profile_id)?;
        let id = create_gi(m, g, row, None)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(gpu_instance, gi_handle(g, id)) }
    })
}

/// nvml.h: "Get GPU instance profile capacity": how many more instances of
/// the profile could be created now. Counted by creating them one after the
/// other at the lowest free start, as [`nvmlDeviceCreateGpuInstance`] would.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g, row) = gi_row(device, profile_id)?;
        let mut existing = instances(m, g)?;
        let max = g.gpu.max_mig_devices();
        let mut n = 0;
        while let Some(&(start, size)) = row
            .placements
            .iter()
            .filter(|&&p| fits(&existing, row, p, max))
            .min_by_key(|p| p.0)
        {
            existing.push(GpuInstance {
                id: u32::MAX,
                profile_id: Some(row.id),
                start,
                size,
                slices: row.slices,
                name: String::new(),
                memory_mib: 0,
                multiprocessors: 0,
                engines: [0; 5],
                cap_minor: None,
                compute: Vec::new(),
            });
            n += 1;
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n) }
    })
}

/// nvml.h: "gpuInstances: An array of instance handles ... must be large
/// enough to accommodate the instances supported by the profile"; `count`
/// "The count of returned GPU instances".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if gpu_instances.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (m, g, row) = gi_row(device, profile_id)?;
        let ids: Vec<u32> = instances(m, g)?
            .iter()
            .filter(|gi| gi.profile_id == Some(row.id))
            .map(|gi| gi.id)
            .collect();
        let handles: Vec<_> = ids.iter().map(|id| gi_handle(g, *id)).collect();
        // SAFETY: per nvml.h the array holds the profile's instance count, which
        // `fits` never lets the instances exceed.
        unsafe { put_list(gpu_instances, &handles, count) }
    })
}

/// nvml.h: NOT_FOUND "If the GPU instance is not found".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = super::super::live_gpu(device)?;
        if !mig_enabled(m, g)? {
            return Err(NOT_SUPPORTED);
        }
        if !instances(m, g)?.iter().any(|gi| gi.id == id) {
            return Err(NOT_FOUND);
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(gpu_instance, gi_handle(g, id)) }
    })
}

/// The parent device, id, profile id and placement. An instance from the
/// machine profile on a GPU without a table here reports profile id
/// `u32::MAX`: nothing is known of its profile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g, gi) = resolve_gi(gpu_instance)?;
        let v = nvmlGpuInstanceInfo_t {
            device: handle_of(g),
            id: gi.id,
            profileId: gi.profile_id.unwrap_or(u32::MAX),
            placement: nvmlGpuInstancePlacement_t {
                start: gi.start,
                size: gi.size,
            },
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// nvml.h: IN_USE "If the GPU instance is in use. This error would be
/// returned if processes (e.g. CUDA application) or compute instances are
/// active on the GPU instance." This library has no processes: compute
/// instances make it in use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| {
        let (m, g, gi) = resolve_gi(gpu_instance)?;
        change(m, g, |c| {
            let pos = c
                .gpu
                .instances
                .iter()
                .position(|x| x.id == gi.id)
                .ok_or(INVALID_ARGUMENT)?;
            if !c.gpu.instances[pos].compute.is_empty() {
                return Err(IN_USE);
            }
            c.gpu.instances.remove(pos);
            remove_capability(c.caps, &gi_rel(g, gi.id));
            Ok(())
        })
    })
}

// --- compute instances -------------------------------------------------------

/// Compute slices of CI profile `profile` in `gi`: NOT_SUPPORTED for a size
/// the instance does not offer, INVALID_ARGUMENT past the profile count.
fn ci_slices(gi: &GpuInstance, profile: c_uint) -> Ret<u32> {
    if profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    state::compute_slices_of(profile)
        .filter(|s| COMPUTE_SIZES.contains(s) && *s <= gi.slices)
        .ok_or(NOT_SUPPORTED)
}

fn ci_name(gi: &GpuInstance, slices: u32) -> String {
    if slices == gi.slices {
        gi.name.clone()
    } else {
        format!("{slices}c.{}", gi.name)
    }
}

fn ci_multiprocessors(gi: &GpuInstance, slices: u32) -> u32 {
    gi.multiprocessors * slices / gi.slices.max(1)
}

struct CiInfo {
    id: u32,
    slices: u32,
    instances: u32,
    multiprocessors: u32,
    engines: [u32; 5],
    name: [std::ffi::c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE as usize],
}

fn ci_info(gpu_instance: nvmlGpuInstance_t, profile: c_uint, eng: c_uint) -> Ret<CiInfo> {
    let (_, _, gi) = resolve_gi(gpu_instance)?;
    if eng >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    let slices = ci_slices(&gi, profile)?;
    let mut name = [0; NVML_DEVICE_NAME_V2_BUFFER_SIZE as usize];
    fill(&mut name, &format!("MIG {}", ci_name(&gi, slices)));
    Ok(CiInfo {
        id: profile,
        slices,
        instances: gi.slices / slices,
        multiprocessors: ci_multiprocessors(&gi, slices),
        engines: gi.engines,
        name,
    })
}

/// nvml.h: INVALID_ARGUMENT "If gpuInstance, profile, engProfile or info are
/// invalid", NOT_SUPPORTED "If profile isn't supported".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let i = ci_info(gpu_instance, profile, eng_profile)?;
        let [ce, dec, enc, jpeg, ofa] = i.engines;
        let v = nvmlComputeInstanceProfileInfo_t {
            id: i.id,
            sliceCount: i.slices,
            instanceCount: i.instances,
            multiprocessorCount: i.multiprocessors,
            sharedCopyEngineCount: ce,
            sharedDecoderCount: dec,
            sharedEncoderCount: enc,
            sharedJpegCount: jpeg,
            sharedOfaCount: ofa,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// The versioned call: `info->version` `_v2` or `_v3` (as the GPU instance
/// profile call; `_v3` adds `capabilities`, 0 here), else INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: forwarded caller contract.
        let version = unsafe { read_version(info) }?;
        let v2 = struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2);
        let v3 = struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3);
        if version != v2 && version != v3 {
            return Err(INVALID_ARGUMENT);
        }
        let i = ci_info(gpu_instance, profile, eng_profile)?;
        let [ce, dec, enc, jpeg, ofa] = i.engines;
        if version == v2 {
            let v = nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: i.id,
                sliceCount: i.slices,
                instanceCount: i.instances,
                multiprocessorCount: i.multiprocessors,
                sharedCopyEngineCount: ce,
                sharedDecoderCount: dec,
                sharedEncoderCount: enc,
                sharedJpegCount: jpeg,
                sharedOfaCount: ofa,
                name: i.name,
            };
            // SAFETY: forwarded caller contract.
            return unsafe { put(info, v) };
        }
        let v = nvmlComputeInstanceProfileInfo_v3_t {
            version,
            id: i.id,
            sliceCount: i.slices,
            instanceCount: i.instances,
            multiprocessorCount: i.multiprocessors,
            sharedCopyEngineCount: ce,
            sharedDecoderCount: dec,
            sharedEncoderCount: enc,
            sharedJpegCount: jpeg,
            sharedOfaCount: ofa,
            name: i.name,
            capabilities: 0,
        };
        // SAFETY: a v3 caller passed a buffer of the v3 size.
        unsafe { put(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), v) }
    })
}

/// nvml.h: INSUFFICIENT_RESOURCES "If the requested compute instance could
/// not be created" (the GPU instance's compute slices are taken).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        if compute_instance.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (m, g, gi) = resolve_gi(gpu_instance)?;
        let slices = ci_slices(&gi, profile_id)?;
        let id = change(m, g, |c| {
            creation_faults(
                c.faults.create_delay_ms,
                &mut c.faults.fail_compute_instance_creates,
            )?;
            let gpu_uuid = &g.gpu.uuid;
            let made = c.gpu.uuids_made;
            let gi = c
                .gpu
                .instances
                .iter_mut()
                .find(|x| x.id == gi.id)
                .ok_or(INVALID_ARGUMENT)?;
            let start = gi.used_compute_slices();
            if start + slices > gi.slices {
                return Err(INSUFFICIENT_RESOURCES);
            }
            let id = (0..8)
                .find(|i| !gi.compute.iter().any(|x| x.id == *i))
                .ok_or(INSUFFICIENT_RESOURCES)?;
            let [copy_engines, decoders, encoders, jpeg_engines, ofa_engines] = gi.engines;
            let device = MigDevice {
                gpu_instance_id: gi.id,
                compute_instance_id: id,
                profile: ci_name(gi, slices),
                gpu_instance_slices: gi.slices,
                compute_instance_slices: slices,
                memory_mib: gi.memory_mib,
                multiprocessors: ci_multiprocessors(gi, slices),
                copy_engines,
                decoders,
                encoders,
                jpeg_engines,
                ofa_engines,
                uuid: state::new_mig_uuid(gpu_uuid, made),
                gi_cap_minor: gi.cap_minor,
                ci_cap_minor: None,
            };
            gi.compute.push(ComputeInstance {
                id,
                profile_id,
                start,
                device,
            });
            let gi_id = gi.id;
            c.gpu.uuids_made += 1;
            write_capability(
                c.caps,
                &gi_rel(g, gi_id).join(format!("ci{id}")),
                ci_access_minor(g.gpu.minor, gi_id, id),
            );
            Ok(id)
        })?;
        // SAFETY: forwarded caller contract.
        unsafe { put(compute_instance, ci_handle(g, gi.id, id)) }
    })
}

/// As [`nvmlDeviceGetGpuInstances`], for the compute instances of a profile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if compute_instances.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let (_, g, gi) = resolve_gi(gpu_instance)?;
        ci_slices(&gi, profile_id)?;
        let ids: Vec<u32> = gi
            .compute
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .map(|c| c.id)
            .collect();
        let handles: Vec<_> = ids.iter().map(|id| ci_handle(g, gi.id, *id)).collect();
        // SAFETY: the caller's array holds the profile's instance count.
        unsafe { put_list(compute_instances, &handles, count) }
    })
}

/// nvml.h: NOT_FOUND "If the compute instance is not found".
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let (_, g, gi) = resolve_gi(gpu_instance)?;
        if !gi.compute.iter().any(|c| c.id == id) {
            return Err(NOT_FOUND);
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(compute_instance, ci_handle(g, gi.id, id)) }
    })
}

fn ci_info_struct(h: nvmlComputeInstance_t) -> Ret<nvmlComputeInstanceInfo_t> {
    let (_, g, gi, ci) = resolve_ci(h)?;
    Ok(nvmlComputeInstanceInfo_t {
        device: handle_of(g),
        gpuInstance: gi_handle(g, gi.id),
        id: ci.id,
        profileId: ci.profile_id,
        placement: nvmlComputeInstancePlacement_t {
            start: ci.start,
            size: ci.device.compute_instance_slices,
        },
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let v = ci_info_struct(compute_instance)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(info, v) }
    })
}

/// nvml.h maps `nvmlComputeInstanceGetInfo` to this symbol.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded caller contract.
    unsafe { nvmlComputeInstanceGetInfo(compute_instance, info) }
}

/// nvml.h: IN_USE if processes run on it; this library has none, so a live
/// compute instance is always destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    compute_instance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g, gi, ci) = resolve_ci(compute_instance)?;
        change(m, g, |c| {
            let x = c
                .gpu
                .instances
                .iter_mut()
                .find(|x| x.id == gi.id)
                .ok_or(INVALID_ARGUMENT)?;
            let before = x.compute.len();
            x.compute.retain(|c| c.id != ci.id);
            if x.compute.len() == before {
                return Err(INVALID_ARGUMENT);
            }
            remove_capability(c.caps, &gi_rel(g, gi.id).join(format!("ci{}", ci.id)));
            Ok(())
        })
    })
}

// --- MIG device handles ------------------------------------------------------

/// The MIG devices of `g` now: one per compute instance, in the order of their
/// GPU instances' creation (the machine profile's first), which is the MIG
/// device index order.
pub(in crate::ffi) fn mig_devices(m: &Machine, g: &FakeGpu) -> Ret<Vec<MigDevice>> {
    Ok(instances(m, g)?
        .into_iter()
        .flat_map(|gi| gi.compute.into_iter().map(|c| c.device))
        .collect())
}

// --- MIG mode ----------------------------------------------------------------

/// nvml.h: sets the mode, which "may unbind or reset the device to activate the
/// requested mode"; `activationStatus` "would return the appropriate error code
/// upon unsuccessful activation", e.g. IN_USE "if device unbind fails because the
/// device isn't idle", RESET_REQUIRED where a reset is needed and not done.
/// Returns INVALID_ARGUMENT "if device, mode or activationStatus are invalid" and
/// NOT_SUPPORTED "if device doesn't support MIG mode".
///
/// Modelled: on Ampere the new mode stays pending (`activationStatus`
/// RESET_REQUIRED): the MIG User Guide, "Deployment Considerations": "Setting MIG
/// mode on the A100/A30 requires a GPU reset"; this library never resets. On later
/// GPUs it takes effect at once. Leaving MIG mode while instances exist is
/// refused as a busy device: IN_USE, the mode left as it was but pending. A
/// reboot (removing the state file) brings back the profile's mode.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activation_status: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    guard(|| {
        let (m, g) = super::super::live_gpu(device)?;
        let on = match mode {
            NVML_DEVICE_MIG_ENABLE => true,
            NVML_DEVICE_MIG_DISABLE => false,
            _ => return Err(INVALID_ARGUMENT),
        };
        if activation_status.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let Some(now) = mig_mode(m, g)? else {
            return Err(NOT_SUPPORTED);
        };
        let needs_reset = g.gpu.architecture == crate::profile::Architecture::Ampere;
        let status = change(m, g, |c| {
            let (current, status) = if !on && now.current && !c.gpu.instances.is_empty() {
                (now.current, IN_USE)
            } else if needs_reset && now.current != on {
                (now.current, nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED)
            } else {
                (on, nvmlReturn_enum_NVML_SUCCESS)
            };
            c.gpu.mig_mode = Some(state::ModeState {
                current,
                pending: on,
            });
            Ok(status)
        })?;
        // SAFETY: forwarded caller contract.
        unsafe { put(activation_status, status) }
    })
}
