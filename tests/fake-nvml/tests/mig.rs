//! MIG device handles of the `dgx-a100-mig` profile, through nvml-wrapper and,
//! for the calls it does not wrap, the raw bindings.

mod common;

use common::{builtin_yaml, instance_ids, open, setup};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use topodra_fake_nvml::Profile;

const NOT_SUPPORTED: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;

fn handle(d: &nvml_wrapper::Device<'_>) -> sys::nvmlDevice_t {
    // SAFETY: only compared, or passed back to the library it came from.
    unsafe { d.handle() }
}

/// The devices the profile documents: names, ids, memory, SMs.
#[test]
fn documented_geometry() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-a100-mig"));
    let nvml = open(&lib).expect("init");

    let gpu0 = nvml.device_by_index(0).expect("gpu 0");
    assert_eq!(gpu0.mig_device_count().expect("max"), 7);
    for i in 0..7 {
        let m = gpu0.mig_device_by_index(i).expect("1g.5gb");
        assert_eq!(m.name().expect("name"), "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
        assert_eq!(instance_ids(&nvml, &m), Ok((7 + i, 0)));
        assert_eq!(m.memory_info().expect("memory").total, 4864 << 20);
        assert_eq!(m.attributes().expect("attrs").multiprocessor_count, 14);
    }

    let gpu1 = nvml.device_by_index(1).expect("gpu 1");
    let want = [
        ("3g.20gb", 2, 42, 20096, 3),
        ("2g.10gb", 4, 28, 9984, 2),
        ("1g.5gb", 7, 14, 4864, 1),
    ];
    for (i, (profile, gi, sms, mib, slices)) in (0..).zip(want) {
        let m = gpu1.mig_device_by_index(i).expect("mig");
        assert_eq!(
            m.name().expect("name"),
            format!("NVIDIA A100-SXM4-40GB MIG {profile}")
        );
        assert_eq!(instance_ids(&nvml, &m), Ok((gi, 0)));
        let a = m.attributes().expect("attrs");
        assert_eq!(a.multiprocessor_count, sms);
        assert_eq!(a.memory_size_mb, mib);
        assert_eq!(a.gpu_instance_slice_count, slices);
        assert_eq!(a.compute_instance_slice_count, slices);
        assert_eq!(m.memory_info().expect("memory").total, mib << 20);
    }
    assert!(matches!(
        gpu1.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        gpu1.mig_device_by_index(6),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        gpu1.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));

    // MIG enable pending: not in MIG mode yet.
    let gpu2 = nvml.device_by_index(2).expect("gpu 2");
    let mode = gpu2.mig_mode().expect("mode");
    assert_eq!((mode.current, mode.pending), (0, 1));
    assert_eq!(gpu2.mig_device_count().expect("max"), 0);
    assert!(matches!(
        gpu2.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
}

/// MIG handles are stable pointers that never alias GPU handles, and the
/// whole-GPU lookups keep answering whole GPUs.
#[test]
fn handles_are_stable_and_distinct() {
    let p = Profile::builtin("dgx-a100-mig").expect("builtin");
    let (_dir, lib) = setup(&p.to_yaml());
    let nvml = open(&lib).expect("init");
    let gpu0 = nvml.device_by_index(0).expect("gpu 0");
    let a = gpu0.mig_device_by_index(3).expect("mig");
    let b = gpu0.mig_device_by_index(3).expect("mig again");
    assert_eq!(handle(&a), handle(&b));
    let mut all = vec![handle(&gpu0)];
    for i in 0..7 {
        all.push(handle(&gpu0.mig_device_by_index(i).expect("mig")));
    }
    for i in 0..8 {
        all.push(handle(&nvml.device_by_index(i).expect("gpu")));
    }
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        1 + 7 + 7,
        "gpu 0 twice, everything else distinct"
    );

    // The UUID lookup finds MIG devices too (nvml.h: "GPU or MIG instance").
    let want = &p.gpus[1].mig_devices[1];
    let m = nvml
        .device_by_uuid(want.uuid.as_str())
        .expect("mig by uuid");
    assert!(m.mig_is_mig_device_handle().expect("is mig"));
    assert_eq!(instance_ids(&nvml, &m), Ok((4, 0)));
    let gpu1 = nvml
        .device_by_uuid(p.gpus[1].uuid.as_str())
        .expect("gpu by uuid");
    assert!(!gpu1.mig_is_mig_device_handle().expect("is mig"));
    assert_eq!(gpu1.index().expect("index"), 1);
    assert_eq!(
        handle(&m.mig_parent_device().expect("parent")),
        handle(&gpu1)
    );
}

/// What whole-GPU and MIG handles answer for the queries meant for the
/// other kind.
#[test]
fn queries_for_the_other_kind_of_handle() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-a100-mig"));
    let nvml = open(&lib).expect("init");
    let gpu = nvml.device_by_index(0).expect("gpu");
    let mig = gpu.mig_device_by_index(0).expect("mig");

    // Whole GPU: MIG-only queries.
    assert_eq!(instance_ids(&nvml, &gpu), Err(NOT_SUPPORTED));
    assert!(matches!(gpu.attributes(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        gpu.mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));
    // The parent's memory stays the whole GPU's.
    assert_eq!(gpu.memory_info().expect("memory").total, 40960 << 20);

    // MIG handle: per-GPU queries.
    assert!(matches!(mig.minor_number(), Err(NvmlError::NotSupported)));
    assert!(matches!(mig.pci_info(), Err(NvmlError::NotSupported)));
    assert!(matches!(mig.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        mig.mig_device_count(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        mig.cuda_compute_capability(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        mig.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(mig.index().expect("mig index"), 0);

    // A GPU without MIG support: no MIG devices, max count zero.
    let (_dir2, lib2) = setup(&builtin_yaml("l40s-pcie"));
    let nvml2 = open(&lib2).expect("init");
    let l40s = nvml2.device_by_index(0).expect("gpu");
    assert_eq!(l40s.mig_device_count().expect("max"), 0);
    assert!(matches!(
        l40s.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
    assert!(!l40s.mig_is_mig_device_handle().expect("is mig"));
}

/// A MIG device of a GPU that fell off the bus: identity answers, memory and
/// attributes do not.
#[test]
fn mig_devices_of_a_lost_gpu() {
    let mut p = Profile::builtin("dgx-a100-mig").expect("builtin");
    p.gpus[1].lost_after_ms = Some(300);
    let (_dir, lib) = setup(&p.to_yaml());
    let t0 = std::time::Instant::now();
    let nvml = open(&lib).expect("init");
    let mig = nvml
        .device_by_index(1)
        .and_then(|g| g.mig_device_by_index(0))
        .expect("mig before the loss");
    if t0.elapsed().as_millis() >= 300 {
        eprintln!("starved past lost_after_ms; skipping");
        return;
    }
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(mig.uuid().expect("uuid"), p.gpus[1].mig_devices[0].uuid);
    assert!(matches!(mig.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(mig.attributes(), Err(NvmlError::GpuLost)));
}

/// GPU instance profiles: this library models none, so every id below
/// `NVML_GPU_INSTANCE_PROFILE_COUNT` reads as not supported (with MIG or
/// without) and the enumeration stops at the count with INVALID_ARGUMENT,
/// the way nvml.h tells callers to walk them.
#[test]
fn gpu_instance_profiles_are_not_modelled() {
    let query = |yaml: &str, profile: u32| {
        let (_dir, lib) = setup(yaml);
        let nvml = open(&lib).expect("init");
        let gpu = nvml.device_by_index(0).expect("gpu");
        // SAFETY: plain integers.
        let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid handle of this library and a valid out pointer.
        unsafe {
            nvml.lib()
                .nvmlDeviceGetGpuInstanceProfileInfo(handle(&gpu), profile, &mut info)
        }
    };
    let invalid = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    let last = sys::NVML_GPU_INSTANCE_PROFILE_COUNT;
    for yaml in [builtin_yaml("dgx-a100-mig"), builtin_yaml("l40s-pcie")] {
        assert_eq!(query(&yaml, 0), NOT_SUPPORTED);
        assert_eq!(query(&yaml, last - 1), NOT_SUPPORTED);
        assert_eq!(query(&yaml, last), invalid);
    }
}
