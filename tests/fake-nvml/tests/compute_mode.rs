//! The compute mode through nvml-wrapper's own `Device::compute_mode` and
//! `Device::set_compute_mode`, as a plugin that turns on MPS sets it: kept in
//! the driver's state file across processes, gone with a reboot, refused for the
//! values nvml.h does not take and on a GPU in MIG mode.

mod common;

use common::{SUCCESS, builtin_yaml, open, setup};
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use topodra_fake_nvml::ffi::mig::state::{self, STATE_FILE_NAME};

const INVALID_ARGUMENT: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;

fn mode(nvml: &Nvml, i: u32) -> ComputeMode {
    nvml.device_by_index(i)
        .expect("gpu")
        .compute_mode()
        .expect("compute mode")
}

fn set(nvml: &Nvml, i: u32, m: ComputeMode) -> Result<(), NvmlError> {
    nvml.device_by_index(i).expect("gpu").set_compute_mode(m)
}

/// `nvmlDeviceSetComputeMode` with a raw value, which the wrapper's enum
/// cannot carry.
fn set_raw(nvml: &Nvml, d: &Device<'_>, m: sys::nvmlComputeMode_t) -> sys::nvmlReturn_t {
    // SAFETY: a handle of this library, passed back to it.
    unsafe { nvml.lib().nvmlDeviceSetComputeMode(d.handle(), m) }
}

/// Every GPU starts in DEFAULT; EXCLUSIVE_PROCESS set through one copy of the
/// library is what another copy sharing the state (another process) reads, and
/// what the state file says, until DEFAULT is set again or the node reboots.
#[test]
fn set_mode_outlives_the_process_and_not_the_boot() {
    let yaml = builtin_yaml("dgx-h100");
    let (dir, lib) = setup(&yaml);
    let other = tempfile::tempdir().expect("tempdir");
    let lib2 = topodra_fake_nvml::install(other.path(), &yaml);
    let state_file = dir.path().join(STATE_FILE_NAME);
    std::os::unix::fs::symlink(&state_file, other.path().join(STATE_FILE_NAME)).expect("symlink");

    let nvml = open(&lib).expect("init");
    let count = nvml.device_count().expect("count");
    assert!(count >= 2);
    for i in 0..count {
        assert_eq!(mode(&nvml, i), ComputeMode::Default, "gpu {i} at boot");
    }
    let uuid0 = nvml.device_by_index(0).expect("gpu").uuid().expect("uuid");
    let uuid1 = nvml.device_by_index(1).expect("gpu").uuid().expect("uuid");
    assert_eq!(
        state::compute_mode(&state_file, &uuid0).expect("state"),
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
        "no file yet: the boot state"
    );

    set(&nvml, 0, ComputeMode::ExclusiveProcess).expect("set");
    assert_eq!(mode(&nvml, 0), ComputeMode::ExclusiveProcess);
    assert_eq!(mode(&nvml, 1), ComputeMode::Default, "per GPU");
    drop(nvml);

    // A separate copy of the library: a separate "process" for the loader.
    let nvml2 = open(&lib2).expect("init");
    assert_eq!(mode(&nvml2, 0), ComputeMode::ExclusiveProcess);
    assert_eq!(mode(&nvml2, 1), ComputeMode::Default);
    let s = state::read(&state_file).expect("state");
    assert_eq!(
        s.compute_mode(&uuid0),
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    );
    assert_eq!(
        s.compute_mode(&uuid1),
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT
    );

    // Back to what it was: DEFAULT is no entry, as before anything was set.
    set(&nvml2, 0, ComputeMode::Default).expect("reset");
    assert_eq!(mode(&nvml2, 0), ComputeMode::Default);
    assert!(
        !std::fs::read_to_string(&state_file)
            .expect("state text")
            .contains("compute_mode"),
        "DEFAULT leaves no entry"
    );

    set(&nvml2, 1, ComputeMode::Prohibited).expect("prohibited");
    assert_eq!(
        state::compute_mode(&state_file, &uuid1).expect("state"),
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED
    );
    std::fs::remove_file(&state_file).expect("reboot");
    assert_eq!(mode(&nvml2, 1), ComputeMode::Default, "after a reboot");
}

/// Values nvml.h does not take change nothing: past the enum, INVALID_ARGUMENT;
/// EXCLUSIVE_THREAD ("Support Removed"), NOT_SUPPORTED; a null out pointer,
/// INVALID_ARGUMENT.
#[test]
fn invalid_modes_are_refused() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    let nvml = open(&lib).expect("init");
    set(&nvml, 0, ComputeMode::ExclusiveProcess).expect("set");
    let d = nvml.device_by_index(0).expect("gpu");
    for bad in [
        sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_COUNT,
        99,
        u32::MAX,
    ] {
        assert_eq!(set_raw(&nvml, &d, bad), INVALID_ARGUMENT, "{bad}");
    }
    assert!(matches!(
        set(&nvml, 0, ComputeMode::ExclusiveThread),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(mode(&nvml, 0), ComputeMode::ExclusiveProcess, "unchanged");
    assert_eq!(
        set_raw(
            &nvml,
            &d,
            sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED
        ),
        SUCCESS
    );
    assert_eq!(mode(&nvml, 0), ComputeMode::Prohibited);
    // SAFETY: a handle of this library; the null pointer is the point.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetComputeMode(d.handle(), std::ptr::null_mut())
    };
    assert_eq!(rc, INVALID_ARGUMENT);
}

/// A GPU in MIG mode stays in DEFAULT (`nvidia-smi -c 3` on one: "Not
/// Supported"); its MIG devices answer NOT_SUPPORTED, as other whole-GPU
/// queries on MIG handles do here.
#[test]
fn mig_enabled_gpus_stay_default() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-a100-mig"));
    let nvml = open(&lib).expect("init");
    assert_eq!(mode(&nvml, 0), ComputeMode::Default);
    for m in [ComputeMode::ExclusiveProcess, ComputeMode::Prohibited] {
        assert!(
            matches!(set(&nvml, 0, m), Err(NvmlError::NotSupported)),
            "{m:?}"
        );
    }
    set(&nvml, 0, ComputeMode::Default).expect("DEFAULT is allowed");
    assert_eq!(mode(&nvml, 0), ComputeMode::Default);

    let gpu = nvml.device_by_index(0).expect("gpu");
    let mut mig = gpu.mig_device_by_index(0).expect("mig device");
    assert!(matches!(mig.compute_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        mig.set_compute_mode(ComputeMode::ExclusiveProcess),
        Err(NvmlError::NotSupported)
    ));
}
