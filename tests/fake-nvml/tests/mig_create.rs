//! Creating and destroying MIG instances through the raw NVML calls (which
//! nvml-wrapper 0.13 does not wrap), as a driver that carves GPUs on demand
//! makes them: NVML's rules on placements and resources, the state kept in a
//! file across processes and "reboots", injected faults, and the capability
//! files the driver's procfs mirrors.

mod common;

use std::path::Path;

use common::{SUCCESS, builtin_yaml, instance_ids, open, setup};
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use topodra_fake_nvml::ffi::mig::state::{self, DriverState, Faults, STATE_FILE_NAME};
use topodra_fake_nvml::profile::mig::{ci_access_minor, gi_access_minor};

const INVALID_ARGUMENT: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const INSUFFICIENT_RESOURCES: sys::nvmlReturn_t =
    sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
const IN_USE: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_IN_USE;
const NOT_FOUND: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const NOT_SUPPORTED: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const UNKNOWN: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// H100 80GB profile ids (`nvidia-smi mig -lgip`).
const P_1G: u32 = 19;
const P_1G_20: u32 = 15;
const P_2G: u32 = 14;
const P_3G: u32 = 9;
const P_4G: u32 = 5;
const P_7G: u32 = 0;

/// The dgx-h100 machine with every GPU in MIG mode and no instances.
fn h100_mig_yaml() -> String {
    builtin_yaml("dgx-h100-mig")
}

fn gpu(nvml: &Nvml, i: u32) -> sys::nvmlDevice_t {
    let d = nvml.device_by_index(i).expect("gpu");
    // SAFETY: only passed back to the library it came from.
    unsafe { d.handle() }
}

fn rc(r: sys::nvmlReturn_t) -> Result<(), sys::nvmlReturn_t> {
    if r == SUCCESS { Ok(()) } else { Err(r) }
}

fn create_gi(
    nvml: &Nvml,
    dev: sys::nvmlDevice_t,
    profile: u32,
    start: u32,
    size: u32,
) -> Result<sys::nvmlGpuInstance_t, sys::nvmlReturn_t> {
    let p = sys::nvmlGpuInstancePlacement_t { start, size };
    let mut gi = std::ptr::null_mut();
    // SAFETY: valid handle and pointers.
    rc(unsafe {
        nvml.lib()
            .nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile, &p, &mut gi)
    })?;
    Ok(gi)
}

fn gi_info(
    nvml: &Nvml,
    gi: sys::nvmlGpuInstance_t,
) -> Result<(u32, u32, u32, u32), sys::nvmlReturn_t> {
    // SAFETY: plain integers and pointers.
    let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a handle of this library and a valid out pointer.
    rc(unsafe { nvml.lib().nvmlGpuInstanceGetInfo(gi, &mut info) })?;
    Ok((
        info.id,
        info.profileId,
        info.placement.start,
        info.placement.size,
    ))
}

/// The compute instance taking the whole GPU instance (the CI profile of its
/// slice count), as a driver makes one per partition.
fn create_ci(
    nvml: &Nvml,
    gi: sys::nvmlGpuInstance_t,
    ci_profile: u32,
) -> Result<sys::nvmlComputeInstance_t, sys::nvmlReturn_t> {
    let mut ci = std::ptr::null_mut();
    // SAFETY: valid handle and pointer.
    rc(unsafe {
        nvml.lib()
            .nvmlGpuInstanceCreateComputeInstance(gi, ci_profile, &mut ci)
    })?;
    Ok(ci)
}

fn destroy_gi(nvml: &Nvml, gi: sys::nvmlGpuInstance_t) -> Result<(), sys::nvmlReturn_t> {
    // SAFETY: a handle of this library.
    rc(unsafe { nvml.lib().nvmlGpuInstanceDestroy(gi) })
}

fn destroy_ci(nvml: &Nvml, ci: sys::nvmlComputeInstance_t) -> Result<(), sys::nvmlReturn_t> {
    // SAFETY: a handle of this library.
    rc(unsafe { nvml.lib().nvmlComputeInstanceDestroy(ci) })
}

fn gi_by_id(
    nvml: &Nvml,
    dev: sys::nvmlDevice_t,
    id: u32,
) -> Result<sys::nvmlGpuInstance_t, sys::nvmlReturn_t> {
    let mut gi = std::ptr::null_mut();
    // SAFETY: valid handle and pointer.
    rc(unsafe { nvml.lib().nvmlDeviceGetGpuInstanceById(dev, id, &mut gi) })?;
    Ok(gi)
}

fn remaining(nvml: &Nvml, dev: sys::nvmlDevice_t, profile: u32) -> u32 {
    let mut n = 0;
    // SAFETY: valid handle and pointer.
    let r = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceRemainingCapacity(dev, profile, &mut n)
    };
    assert_eq!(r, SUCCESS);
    n
}

fn edit_state(dir: &Path, f: impl FnOnce(&mut DriverState)) {
    state::update::<(), ()>(&dir.join(STATE_FILE_NAME), |s| {
        f(s);
        Ok(())
    })
    .expect("state file")
    .expect("edit");
}

/// A partition's life: a 1g.10gb at the highest start, its MIG device, the
/// rules NVML enforces around it, and its teardown in NVML's order.
#[test]
fn create_query_destroy() {
    let (_dir, lib) = setup(&h100_mig_yaml());
    let nvml = open(&lib).expect("init");
    let dev = gpu(&nvml, 0);
    assert_eq!(remaining(&nvml, dev, P_1G), 7);

    let gi = create_gi(&nvml, dev, P_1G, 6, 1).expect("1g.10gb at 6");
    let (id, profile, start, size) = gi_info(&nvml, gi).expect("info");
    assert_eq!((profile, start, size), (P_1G, 6, 1));
    assert_eq!(Some(id), state::slot_id(6, 1));
    assert_eq!(remaining(&nvml, dev, P_1G), 6);
    // Its slice is taken, for any profile; the 7g needs all eight.
    assert_eq!(
        create_gi(&nvml, dev, P_1G, 6, 1).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        create_gi(&nvml, dev, P_1G_20, 6, 2).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        create_gi(&nvml, dev, P_7G, 0, 8).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(remaining(&nvml, dev, P_7G), 0);
    // A placement the profile does not list is invalid, free or not.
    assert_eq!(
        create_gi(&nvml, dev, P_2G, 6, 2).err(),
        Some(INVALID_ARGUMENT)
    );
    assert_eq!(
        create_gi(&nvml, dev, P_4G, 4, 4).err(),
        Some(INVALID_ARGUMENT)
    );
    assert_eq!(
        create_gi(&nvml, dev, 99, 0, 1).err(),
        Some(INVALID_ARGUMENT)
    );

    // No MIG device until the compute instance exists.
    let gpu0 = nvml.device_by_index(0).expect("gpu");
    assert!(matches!(
        gpu0.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    let ci = create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE).expect("ci");
    let mig = gpu0.mig_device_by_index(0).expect("mig device");
    assert_eq!(
        mig.name().expect("name"),
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    );
    assert_eq!(instance_ids(&nvml, &mig), Ok((id, 0)));
    assert_eq!(mig.memory_info().expect("memory").total, 9984 << 20);
    let uuid = mig.uuid().expect("uuid");
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str())
            .expect("by uuid")
            .uuid()
            .expect("uuid"),
        uuid
    );
    // The instance's one compute slice is taken.
    assert_eq!(
        create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE).err(),
        Some(NOT_SUPPORTED)
    );

    // NVML's order: compute instance first.
    assert_eq!(destroy_gi(&nvml, gi), Err(IN_USE));
    destroy_ci(&nvml, ci).expect("destroy ci");
    assert!(
        matches!(mig.uuid(), Err(NvmlError::InvalidArg)),
        "a destroyed MIG device's handle is stale"
    );
    destroy_gi(&nvml, gi).expect("destroy gi");
    assert_eq!(gi_info(&nvml, gi).err(), Some(INVALID_ARGUMENT));
    assert_eq!(gi_by_id(&nvml, dev, id).err(), Some(NOT_FOUND));
    assert_eq!(remaining(&nvml, dev, P_7G), 1);
    create_gi(&nvml, dev, P_7G, 0, 8).expect("the whole GPU again");
}

/// The H100's largest mixes fit and nothing more: 4g + 3g, or seven 1g, or
/// four 1g.20gb; the profile's instance count holds (one 1g.10gb+me).
#[test]
fn geometry_limits() {
    let (_dir, lib) = setup(&h100_mig_yaml());
    let nvml = open(&lib).expect("init");
    let dev = gpu(&nvml, 0);
    create_gi(&nvml, dev, P_4G, 0, 4).expect("4g");
    create_gi(&nvml, dev, P_3G, 4, 4).expect("3g");
    for p in [P_1G, P_1G_20, P_2G, P_3G, P_4G, P_7G] {
        assert_eq!(remaining(&nvml, dev, p), 0, "profile {p}");
    }

    let dev = gpu(&nvml, 1);
    for start in 0..7 {
        create_gi(&nvml, dev, P_1G, start, 1).expect("1g");
    }
    // Slice 7 is free but no 1g placement uses it, and the GPU's seven
    // compute slices are all taken.
    assert_eq!(remaining(&nvml, dev, P_1G), 0);

    let dev = gpu(&nvml, 2);
    for start in [0, 2, 4, 6] {
        create_gi(&nvml, dev, P_1G_20, start, 2).expect("1g.20gb");
    }
    assert_eq!(remaining(&nvml, dev, P_1G), 0);

    let dev = gpu(&nvml, 3);
    create_gi(&nvml, dev, 20, 0, 1).expect("1g.10gb+me");
    assert_eq!(
        create_gi(&nvml, dev, 20, 1, 1).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    create_gi(&nvml, dev, P_1G, 1, 1).expect("a plain 1g beside it");
}

/// Instances live in the driver, not the process: another copy of the
/// library sharing the state sees them; removing the file is a reboot.
#[test]
fn state_outlives_the_process_and_not_the_boot() {
    let (dir, lib) = setup(&h100_mig_yaml());
    let other = tempfile::tempdir().expect("tempdir");
    let lib2 = topodra_fake_nvml::install(other.path(), &h100_mig_yaml());
    std::os::unix::fs::symlink(
        dir.path().join(STATE_FILE_NAME),
        other.path().join(STATE_FILE_NAME),
    )
    .expect("symlink");

    let nvml = open(&lib).expect("init");
    let gi = create_gi(&nvml, gpu(&nvml, 0), P_3G, 4, 4).expect("3g");
    create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE).expect("ci");
    let id = gi_info(&nvml, gi).expect("info").0;
    drop(nvml);

    // A separate copy of the library: a separate "process" for the loader.
    let nvml2 = open(&lib2).expect("init");
    let gi2 = gi_by_id(&nvml2, gpu(&nvml2, 0), id).expect("made by the other copy");
    assert_eq!(gi_info(&nvml2, gi2).expect("info"), (id, P_3G, 4, 4));
    let m = nvml2
        .device_by_index(0)
        .expect("gpu")
        .mig_device_by_index(0)
        .expect("mig");
    assert_eq!(m.name().expect("name"), "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
    assert!(!other.path().join("nvml-state.yaml.tmp").exists());

    std::fs::remove_file(dir.path().join(STATE_FILE_NAME)).expect("reboot");
    assert_eq!(gi_by_id(&nvml2, gpu(&nvml2, 0), id).err(), Some(NOT_FOUND));
}

/// A compute instance that fails to come up leaves its GPU instance behind,
/// the half-made state a driver must roll back; slow creations are slow.
#[test]
fn injected_faults() {
    let (dir, lib) = setup(&h100_mig_yaml());
    let nvml = open(&lib).expect("init");
    let dev = gpu(&nvml, 0);
    edit_state(dir.path(), |s| {
        s.faults = Faults {
            fail_gpu_instance_creates: 1,
            fail_compute_instance_creates: 1,
            create_delay_ms: 0,
        };
    });
    assert_eq!(create_gi(&nvml, dev, P_2G, 0, 2).err(), Some(UNKNOWN));
    assert_eq!(
        remaining(&nvml, dev, P_2G),
        3,
        "a failed creation makes nothing"
    );
    let gi = create_gi(&nvml, dev, P_2G, 0, 2).expect("second try");
    assert_eq!(
        create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE).err(),
        Some(UNKNOWN)
    );
    let id = gi_info(&nvml, gi).expect("still there").0;
    assert!(gi_by_id(&nvml, dev, id).is_ok());
    create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE).expect("second try");
    assert_eq!(
        state::read(&dir.path().join(STATE_FILE_NAME))
            .expect("read")
            .faults,
        Faults::default(),
        "each fault is consumed once"
    );

    edit_state(dir.path(), |s| s.faults.create_delay_ms = 200);
    let t = std::time::Instant::now();
    create_gi(&nvml, dev, P_2G, 2, 2).expect("slow");
    assert!(t.elapsed() >= std::time::Duration::from_millis(200));
}

/// The instances a machine profile lists are there at boot, take their
/// slices, and can be destroyed (by an operator; topodra never does); a
/// reboot brings them back.
#[test]
fn boot_geometry_from_the_profile() {
    let (dir, lib) = setup(&builtin_yaml("dgx-a100-mig"));
    let nvml = open(&lib).expect("init");
    let dev = gpu(&nvml, 0);
    // Seven 1g.5gb: no slice left for anything but nothing.
    assert_eq!(remaining(&nvml, dev, P_1G), 0);
    assert_eq!(
        create_gi(&nvml, dev, P_7G, 0, 8).err(),
        Some(INSUFFICIENT_RESOURCES)
    );
    let gi = gi_by_id(&nvml, dev, 7).expect("GI 7 from the profile");
    assert_eq!(gi_info(&nvml, gi).expect("info").1, 19);

    let mut ci = std::ptr::null_mut();
    // SAFETY: valid handle and pointer.
    rc(unsafe {
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceById(gi, 0, &mut ci)
    })
    .expect("CI 0");
    destroy_ci(&nvml, ci).expect("ci");
    destroy_gi(&nvml, gi).expect("gi");
    let gpu0 = nvml.device_by_index(0).expect("gpu");
    assert!(matches!(
        gpu0.mig_device_by_index(6),
        Err(NvmlError::NotFound)
    ));
    assert!(gpu0.mig_device_by_index(5).is_ok());

    std::fs::remove_file(dir.path().join(STATE_FILE_NAME)).expect("reboot");
    assert!(gi_by_id(&nvml, dev, 7).is_ok());
    assert!(gpu0.mig_device_by_index(6).is_ok());
}

/// The driver's procfs grows and shrinks with the instances: the files the
/// plugin reads capability minors from.
#[test]
fn capability_files_follow_the_instances() {
    let (dir, lib) = setup(&h100_mig_yaml());
    let caps = dir.path().join("capabilities");
    edit_state(dir.path(), |s| s.capabilities_dir = Some(caps.clone()));
    let nvml = open(&lib).expect("init");
    let minor = nvml
        .device_by_index(1)
        .expect("gpu")
        .minor_number()
        .expect("minor");
    let gi = create_gi(&nvml, gpu(&nvml, 1), P_4G, 0, 4).expect("4g");
    let id = gi_info(&nvml, gi).expect("info").0;
    let gi_dir = caps.join(format!("gpu{minor}/mig/gi{id}"));
    let text = std::fs::read_to_string(gi_dir.join("access")).expect("gi access");
    assert!(
        text.contains(&format!(
            "DeviceFileMinor: {}\n",
            gi_access_minor(minor, id)
        )),
        "{text}"
    );
    let ci = create_ci(&nvml, gi, sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE).expect("ci");
    let text = std::fs::read_to_string(gi_dir.join("ci0/access")).expect("ci access");
    assert!(text.contains(&format!(
        "DeviceFileMinor: {}\n",
        ci_access_minor(minor, id, 0)
    )));
    destroy_ci(&nvml, ci).expect("ci");
    assert!(!gi_dir.join("ci0").exists());
    destroy_gi(&nvml, gi).expect("gi");
    assert!(!gi_dir.exists());
}

/// Without MIG enabled, or on a product without a table, nothing is created.
#[test]
fn refused_without_mig() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    let nvml = open(&lib).expect("init");
    assert_eq!(
        create_gi(&nvml, gpu(&nvml, 0), P_1G, 0, 1).err(),
        Some(NOT_SUPPORTED)
    );
    let (_dir, lib) = setup(&builtin_yaml("l40s-pcie"));
    let nvml = open(&lib).expect("init");
    assert_eq!(
        create_gi(&nvml, gpu(&nvml, 0), P_1G, 0, 1).err(),
        Some(NOT_SUPPORTED)
    );
}

fn set_mig_mode(
    nvml: &Nvml,
    dev: sys::nvmlDevice_t,
    on: bool,
) -> Result<sys::nvmlReturn_t, sys::nvmlReturn_t> {
    let mode = if on {
        sys::NVML_DEVICE_MIG_ENABLE
    } else {
        sys::NVML_DEVICE_MIG_DISABLE
    };
    let mut status = SUCCESS;
    // SAFETY: valid handle and pointer.
    rc(unsafe { nvml.lib().nvmlDeviceSetMigMode(dev, mode, &mut status) })?;
    Ok(status)
}

fn mig_mode(nvml: &Nvml, dev: sys::nvmlDevice_t) -> (u32, u32) {
    let (mut current, mut pending) = (9, 9);
    // SAFETY: valid handle and pointers.
    let r = unsafe {
        nvml.lib()
            .nvmlDeviceGetMigMode(dev, &mut current, &mut pending)
    };
    assert_eq!(r, SUCCESS);
    (current, pending)
}

/// MIG mode changes: at once on Hopper; pending a reset on Ampere (the MIG User
/// Guide: "Setting MIG mode on the A100/A30 requires a GPU reset"), which this
/// library never does; refused while instances exist; gone with a reboot.
#[test]
fn mig_mode_changes() {
    let (dir, lib) = setup(&builtin_yaml("dgx-h100"));
    let nvml = open(&lib).expect("init");
    let dev = gpu(&nvml, 0);
    assert_eq!(mig_mode(&nvml, dev), (0, 0));
    assert_eq!(set_mig_mode(&nvml, dev, true), Ok(SUCCESS));
    assert_eq!(mig_mode(&nvml, dev), (1, 1));
    let gi = create_gi(&nvml, dev, P_1G, 3, 1).expect("MIG on: instances");
    let busy = sys::nvmlReturn_enum_NVML_ERROR_IN_USE;
    assert_eq!(set_mig_mode(&nvml, dev, false), Ok(busy));
    assert_eq!(mig_mode(&nvml, dev), (1, 0), "still on, off pending");
    destroy_gi(&nvml, gi).expect("gi");
    assert_eq!(set_mig_mode(&nvml, dev, false), Ok(SUCCESS));
    assert_eq!(mig_mode(&nvml, dev), (0, 0));
    assert_eq!(create_gi(&nvml, dev, P_1G, 3, 1).err(), Some(NOT_SUPPORTED));
    set_mig_mode(&nvml, dev, true).expect("on again");
    std::fs::remove_file(dir.path().join(STATE_FILE_NAME)).expect("reboot");
    assert_eq!(
        mig_mode(&nvml, dev),
        (0, 0),
        "the profile's mode after a reboot"
    );

    let (_dir, lib) = setup(&builtin_yaml("dgx-a100"));
    let nvml = open(&lib).expect("init");
    let dev = gpu(&nvml, 0);
    let reset = sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
    assert_eq!(set_mig_mode(&nvml, dev, true), Ok(reset));
    assert_eq!(mig_mode(&nvml, dev), (0, 1), "pending enable");
    assert_eq!(create_gi(&nvml, dev, P_1G, 0, 1).err(), Some(NOT_SUPPORTED));
    assert_eq!(
        set_mig_mode(&nvml, dev, false),
        Ok(SUCCESS),
        "back to what it is"
    );
    assert_eq!(mig_mode(&nvml, dev), (0, 0));

    let (_dir, lib) = setup(&builtin_yaml("l40s-pcie"));
    let nvml = open(&lib).expect("init");
    assert_eq!(set_mig_mode(&nvml, gpu(&nvml, 0), true), Err(NOT_SUPPORTED));
}
