//! `nvml_record::record` against the fake NVML: every answer is kept, failures
//! included, and the MIG geometry comes out as the profile's GPU implies.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use nvml_wrapper::Nvml;
use topodra_fake_nvml::{Profile, install};
use topodra_node::discovery::nvml_record::{self, Answer, NvmlRecord, Placement};

fn record(profile: &str) -> (NvmlRecord, Nvml, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let lib = install(dir.path(), &Profile::builtin(profile).unwrap().to_yaml());
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    (nvml_record::record(&nvml), nvml, dir)
}

fn profile_of(name: &str) -> Profile {
    Profile::builtin(name).unwrap()
}

fn placements(starts: &[u32], size: u32) -> Vec<Placement> {
    starts
        .iter()
        .map(|&start| Placement { start, size })
        .collect()
}

/// dgx-a100-mig's GPU 0 (A100-SXM4-40GB, MIG on): each profile's info from the
/// versioned call, with its name, and exactly the placements the MIG User Guide's
/// `nvidia-smi mig -lgipp` lists for its id.
#[test]
fn a100_mig_gpu_records_profiles_and_their_placements() {
    let (rec, nvml, _dir) = record("dgx-a100-mig");
    assert_eq!(rec.device_count, Answer::Value(8));
    assert_eq!(rec.devices.len(), 8);
    let gpu = rec.devices[0].answers.value().unwrap();
    assert_eq!(gpu.name.value().unwrap(), "NVIDIA A100-SXM4-40GB");
    assert_eq!(
        gpu.mig_mode.value().map(|m| (m.current, m.pending)),
        Some((1, 1))
    );
    assert_eq!(gpu.max_mig_device_count, Answer::Value(7));

    // Index, id, name, placements.
    let want: [(u32, u32, &str, Vec<Placement>); 7] = [
        (0, 19, "MIG 1g.5gb", placements(&[0, 1, 2, 3, 4, 5, 6], 1)),
        (1, 14, "MIG 2g.10gb", placements(&[0, 2, 4], 2)),
        (2, 9, "MIG 3g.20gb", placements(&[0, 4], 4)),
        (3, 5, "MIG 4g.20gb", placements(&[0], 4)),
        (4, 0, "MIG 7g.40gb", placements(&[0], 8)),
        (
            7,
            20,
            "MIG 1g.5gb+me",
            placements(&[0, 1, 2, 3, 4, 5, 6], 1),
        ),
        (9, 15, "MIG 1g.10gb", placements(&[0, 2, 4, 6], 2)),
    ];
    let got: Vec<_> = gpu
        .gpu_instance_profiles
        .iter()
        .filter_map(|p| {
            let info = p.info.value()?;
            let placements = p.possible_placements.as_ref()?.value()?.clone();
            Some((p.profile, info.id, info.name.clone()?, placements))
        })
        .collect();
    let want: Vec<_> = want
        .into_iter()
        .map(|(p, id, name, pl)| (p, id, name.to_owned(), pl))
        .collect();
    assert_eq!(got, want);
    let one = gpu.gpu_instance_profiles[0].info.value().unwrap();
    assert_eq!(
        (
            one.slice_count,
            one.instance_count,
            one.multiprocessor_count
        ),
        (1, 7, 14)
    );
    assert_eq!(one.memory_size_mb, 4864);

    // The other indices below the count are NOT_SUPPORTED, recorded as such, with
    // no placements asked; the first index past the count ends the enumeration
    // with INVALID_ARGUMENT (nvml.h).
    let count = nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT;
    let profiles = &gpu.gpu_instance_profiles;
    assert_eq!(profiles.len(), count as usize + 1);
    let eight = &profiles[5];
    assert_eq!(eight.profile, 5);
    let Answer::Failed(f) = &eight.info else {
        panic!("8_SLICE answered on an A100: {eight:?}")
    };
    assert_eq!(f.code.as_deref(), Some("NVML_ERROR_NOT_SUPPORTED"));
    assert!(eight.possible_placements.is_none());
    let past = profiles.last().unwrap();
    assert_eq!(past.profile, count);
    let Answer::Failed(f) = &past.info else {
        panic!("{past:?}")
    };
    assert_eq!(f.code.as_deref(), Some("NVML_ERROR_INVALID_ARGUMENT"));

    // nvml-wrapper 0.13's own call returns an empty list for a profile NVML gives
    // seven placements (it never sets the vector's length); the record goes
    // through the raw binding instead. When this fails, the wrapper was fixed and
    // the record could use it.
    let device = nvml.device_by_index(0).unwrap();
    assert_eq!(device.possible_placements(19).unwrap(), []);
}

/// A GPU with MIG disabled (dgx-a100-mig's GPU 3): the versioned call answers
/// NOT_SUPPORTED there (nvml.h: "If device doesn't have MIG mode enabled"), so the
/// record falls back to the unversioned call (no name) and keeps the versioned
/// call's failure; placements answer "regardless of whether MIG is enabled".
#[test]
fn mig_disabled_gpu_falls_back_to_the_unversioned_call() {
    let (rec, _nvml, _dir) = record("dgx-a100-mig");
    let gpu = rec.devices[3].answers.value().unwrap();
    assert_eq!(gpu.mig_mode.value().map(|m| m.current), Some(0));
    assert_eq!(gpu.max_mig_device_count, Answer::Value(0));
    let p = &gpu.gpu_instance_profiles[2];
    let info = p.info.value().unwrap();
    assert_eq!((info.id, info.name.as_deref()), (9, None));
    assert_eq!(
        p.info_v_failure.as_ref().and_then(|f| f.code.as_deref()),
        Some("NVML_ERROR_NOT_SUPPORTED")
    );
    assert_eq!(
        p.possible_placements.as_ref().unwrap(),
        &Answer::Value(placements(&[0, 4], 4))
    );
}

/// A GPU without MIG (L40S): every profile and the failures are recorded, and
/// the JSON keeps nvml.h's field names and the failures' return codes.
#[test]
fn gpu_without_mig_records_the_failures() {
    let (rec, _nvml, _dir) = record("l40s-pcie");
    let gpu = rec.devices[0].answers.value().unwrap();
    assert!(matches!(gpu.mig_mode, Answer::Failed(_)));
    assert!(
        gpu.gpu_instance_profiles
            .iter()
            .all(|p| matches!(p.info, Answer::Failed(_)) && p.possible_placements.is_none())
    );
    let json = serde_json::to_value(&rec).unwrap();
    let d = &json["devices"][0];
    assert_eq!(d["index"], 0);
    assert_eq!(d["name"], "NVIDIA L40S");
    assert_eq!(d["migMode"]["code"], "NVML_ERROR_NOT_SUPPORTED");
    let device_id = format!("{:#x}", profile_of("l40s-pcie").gpus[0].pci_device_id);
    assert_eq!(d["pci"]["pciDeviceId"], device_id.as_str());
    assert_eq!(
        d["gpuInstanceProfiles"][0]["infoVFailure"]["code"],
        "NVML_ERROR_NOT_SUPPORTED"
    );
    let profile = profile_of("l40s-pcie");
    assert_eq!(json["system"]["driverVersion"], profile.driver_version);
    assert_eq!(
        json["system"]["cudaDriverVersion"],
        profile.cuda_driver_version
    );
}
