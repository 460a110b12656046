//! MIG device handles of the `dgx-a100-mig` profile, through nvml-wrapper and,
//! for the calls it does not wrap, the raw bindings.

mod common;

use common::{SUCCESS, builtin_yaml, instance_ids, open, setup, struct_version};
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

const INVALID_ARGUMENT: sys::nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;

/// `nvmlDeviceGetGpuInstanceProfileInfo`, raw.
fn profile_info(
    nvml: &nvml_wrapper::Nvml,
    gpu: &nvml_wrapper::Device<'_>,
    profile: u32,
) -> Result<sys::nvmlGpuInstanceProfileInfo_t, sys::nvmlReturn_t> {
    // SAFETY: plain integers.
    let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid handle of this library and a valid out pointer.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceProfileInfo(handle(gpu), profile, &mut info)
    };
    if rc == SUCCESS { Ok(info) } else { Err(rc) }
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` with the v2 struct and `version`.
fn profile_info_v(
    nvml: &nvml_wrapper::Nvml,
    gpu: &nvml_wrapper::Device<'_>,
    profile: u32,
    version: u32,
) -> Result<sys::nvmlGpuInstanceProfileInfo_v2_t, sys::nvmlReturn_t> {
    // SAFETY: plain integers and a char array.
    let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = version;
    // SAFETY: valid handle of this library and a valid out pointer.
    let rc = unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV(handle(gpu), profile, &mut info)
    };
    if rc == SUCCESS { Ok(info) } else { Err(rc) }
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`, count first, as (start, size).
fn placements(
    nvml: &nvml_wrapper::Nvml,
    gpu: &nvml_wrapper::Device<'_>,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, sys::nvmlReturn_t> {
    let f = |p: *mut sys::nvmlGpuInstancePlacement_t, n: &mut u32| {
        // SAFETY: valid handle of this library; `p` is null or holds `n` entries.
        unsafe {
            nvml.lib()
                .nvmlDeviceGetGpuInstancePossiblePlacements_v2(handle(gpu), profile_id, p, n)
        }
    };
    let mut count = 0;
    let rc = f(std::ptr::null_mut(), &mut count);
    if rc != SUCCESS {
        return Err(rc);
    }
    let mut buf = vec![
        sys::nvmlGpuInstancePlacement_t {
            start: 99,
            size: 99
        };
        count as usize
    ];
    let mut written = count;
    let rc = f(buf.as_mut_ptr(), &mut written);
    if rc != SUCCESS {
        return Err(rc);
    }
    assert_eq!(written, count);
    Ok(buf.iter().map(|p| (p.start, p.size)).collect())
}

fn name_of(info: &sys::nvmlGpuInstanceProfileInfo_v2_t) -> String {
    let bytes: Vec<u8> = info
        .name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8(bytes).expect("a UTF-8 profile name")
}

/// The A100-SXM4-40GB's GPU instance profiles, as the MIG User Guide lists them:
/// the unversioned call answers by `NVML_GPU_INSTANCE_PROFILE_*` index with the
/// profile's own id, the placements call takes that id, and the enumeration stops
/// at `NVML_GPU_INSTANCE_PROFILE_COUNT` with INVALID_ARGUMENT.
#[test]
fn a100_gpu_instance_profiles_and_placements() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-a100-mig"));
    let nvml = open(&lib).expect("init");
    let gpu0 = nvml.device_by_index(0).expect("gpu 0");

    let one = profile_info(&nvml, &gpu0, sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE).unwrap();
    assert_eq!(
        (
            one.id,
            one.sliceCount,
            one.instanceCount,
            one.multiprocessorCount
        ),
        (19, 1, 7, 14)
    );
    assert_eq!(
        (one.memorySizeMB, one.copyEngineCount, one.decoderCount),
        (4864, 1, 0)
    );
    let whole = profile_info(&nvml, &gpu0, sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE).unwrap();
    assert_eq!(
        (whole.id, whole.sliceCount, whole.memorySizeMB),
        (0, 7, 40192)
    );
    assert_eq!((whole.jpegCount, whole.ofaCount), (1, 1));
    let ids: Vec<u32> = (0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|p| profile_info(&nvml, &gpu0, p).ok().map(|i| i.id))
        .collect();
    // 1_SLICE, 2_SLICE, 3_SLICE, 4_SLICE, 7_SLICE, 1_SLICE_REV1 (+me), 1_SLICE_REV2.
    assert_eq!(ids, [19, 14, 9, 5, 0, 20, 15]);
    assert_eq!(
        profile_info(&nvml, &gpu0, sys::NVML_GPU_INSTANCE_PROFILE_8_SLICE).err(),
        Some(NOT_SUPPORTED)
    );
    assert_eq!(
        profile_info(&nvml, &gpu0, sys::NVML_GPU_INSTANCE_PROFILE_COUNT).err(),
        Some(INVALID_ARGUMENT)
    );

    // `nvidia-smi mig -lgipp` in the guide, by profile id.
    let ones: Vec<(u32, u32)> = (0..7).map(|s| (s, 1)).collect();
    assert_eq!(placements(&nvml, &gpu0, 19).unwrap(), ones);
    assert_eq!(placements(&nvml, &gpu0, 20).unwrap(), ones);
    assert_eq!(
        placements(&nvml, &gpu0, 15).unwrap(),
        [(0, 2), (2, 2), (4, 2), (6, 2)]
    );
    assert_eq!(
        placements(&nvml, &gpu0, 14).unwrap(),
        [(0, 2), (2, 2), (4, 2)]
    );
    assert_eq!(placements(&nvml, &gpu0, 9).unwrap(), [(0, 4), (4, 4)]);
    assert_eq!(placements(&nvml, &gpu0, 5).unwrap(), [(0, 4)]);
    assert_eq!(placements(&nvml, &gpu0, 0).unwrap(), [(0, 8)]);
    assert_eq!(placements(&nvml, &gpu0, 1), Err(NOT_SUPPORTED));
    // SAFETY: valid handle; a null count is the documented INVALID_ARGUMENT.
    let rc = unsafe {
        nvml.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle(&gpu0),
            19,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, INVALID_ARGUMENT);

    // MIG disabled (GPU 3): the unversioned call and the placements still answer
    // (nvml.h: placements "regardless of whether MIG is enabled or not").
    let gpu3 = nvml.device_by_index(3).expect("gpu 3");
    assert_eq!(gpu3.mig_mode().expect("mode").current, 0);
    assert_eq!(profile_info(&nvml, &gpu3, 0).map(|i| i.id), Ok(19));
    assert_eq!(placements(&nvml, &gpu3, 9).unwrap(), [(0, 4), (4, 4)]);

    // MIG handles are not GPUs.
    let mig = gpu0.mig_device_by_index(0).expect("mig");
    assert_eq!(profile_info(&nvml, &mig, 0).err(), Some(NOT_SUPPORTED));
    assert_eq!(placements(&nvml, &mig, 19), Err(NOT_SUPPORTED));
}

/// The versioned call: v2 and v3 structs with the profile's name, only while MIG
/// is enabled (nvml.h: NOT_SUPPORTED "If device doesn't have MIG mode enabled"),
/// and INVALID_ARGUMENT for any other struct version.
#[test]
fn versioned_profile_info() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-a100-mig"));
    let nvml = open(&lib).expect("init");
    let gpu0 = nvml.device_by_index(0).expect("gpu 0");
    let v2 = struct_version::<sys::nvmlGpuInstanceProfileInfo_v2_t>(2);
    let v3 = struct_version::<sys::nvmlGpuInstanceProfileInfo_v3_t>(3);

    let info = profile_info_v(&nvml, &gpu0, sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE, v2).unwrap();
    assert_eq!((info.version, info.id, info.memorySizeMB), (v2, 9, 19968));
    assert_eq!(name_of(&info), "MIG 3g.20gb");
    let me = profile_info_v(
        &nvml,
        &gpu0,
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
        v2,
    )
    .unwrap();
    assert_eq!((me.id, name_of(&me)), (20, "MIG 1g.5gb+me".to_owned()));

    // SAFETY: plain integers and a char array.
    let mut info3: sys::nvmlGpuInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
    info3.version = v3;
    // SAFETY: valid handle; a v3 struct announced by its version.
    let rc = unsafe {
        nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV(
            handle(&gpu0),
            sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE,
            std::ptr::from_mut(&mut info3).cast(),
        )
    };
    assert_eq!(rc, SUCCESS);
    assert_eq!((info3.id, info3.sliceCount, info3.capabilities), (0, 7, 0));

    assert_eq!(
        profile_info_v(&nvml, &gpu0, 0, 1 << 24).err(),
        Some(INVALID_ARGUMENT)
    );
    assert_eq!(
        profile_info_v(&nvml, &gpu0, sys::NVML_GPU_INSTANCE_PROFILE_COUNT, v2).err(),
        Some(INVALID_ARGUMENT)
    );
    let gpu3 = nvml.device_by_index(3).expect("gpu 3");
    assert_eq!(
        profile_info_v(&nvml, &gpu3, 0, v2).err(),
        Some(NOT_SUPPORTED)
    );
    // MIG enable pending is not enabled.
    let gpu2 = nvml.device_by_index(2).expect("gpu 2");
    assert_eq!(
        profile_info_v(&nvml, &gpu2, 0, v2).err(),
        Some(NOT_SUPPORTED)
    );
}

/// The H100 80GB table (MIG User Guide Table 7, public `-lgip` output), and GPUs
/// without one: no MIG (L40S) or a MIG-capable product this library has no table
/// for (H100 PCIe) answer NOT_SUPPORTED below the count, INVALID_ARGUMENT at it.
#[test]
fn h100_table_and_gpus_without_one() {
    let (_dir, lib) = setup(&builtin_yaml("dgx-h100"));
    let nvml = open(&lib).expect("init");
    let gpu = nvml.device_by_index(0).expect("gpu");
    let rows: Vec<(u32, u32, u32, u64)> = (0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|p| profile_info(&nvml, &gpu, p).ok())
        .map(|i| (i.id, i.sliceCount, i.multiprocessorCount, i.memorySizeMB))
        .collect();
    assert_eq!(
        rows,
        [
            (19, 1, 16, 9984),
            (14, 2, 32, 20096),
            (9, 3, 60, 40448),
            (5, 4, 64, 40448),
            (0, 7, 132, 81152),
            (20, 1, 16, 9984),
            (15, 1, 26, 20096),
        ]
    );
    assert_eq!(
        placements(&nvml, &gpu, 15).unwrap(),
        [(0, 2), (2, 2), (4, 2), (6, 2)]
    );
    assert_eq!(placements(&nvml, &gpu, 0).unwrap(), [(0, 8)]);

    let last = sys::NVML_GPU_INSTANCE_PROFILE_COUNT;
    for yaml in [builtin_yaml("l40s-pcie"), builtin_yaml("snc4-xeon")] {
        let (_dir, lib) = setup(&yaml);
        let nvml = open(&lib).expect("init");
        let gpu = nvml.device_by_index(0).expect("gpu");
        assert_eq!(profile_info(&nvml, &gpu, 0).err(), Some(NOT_SUPPORTED));
        assert_eq!(
            profile_info(&nvml, &gpu, last - 1).err(),
            Some(NOT_SUPPORTED)
        );
        assert_eq!(
            profile_info(&nvml, &gpu, last).err(),
            Some(INVALID_ARGUMENT)
        );
        assert_eq!(placements(&nvml, &gpu, 19), Err(NOT_SUPPORTED));
    }
}
