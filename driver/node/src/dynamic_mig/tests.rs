//! The carver on the fake NVML, whose placement rules and instance state follow
//! real NVML's (tests/fake-nvml).

use nvml_wrapper::Nvml;
use topodra_fake_nvml::Profile;
use topodra_fake_nvml::ffi::mig::state::{self, STATE_FILE_NAME};

use super::*;

/// A DGX H100 with MIG on and no instances; returns the library's directory,
/// where its state file lives.
fn h100() -> (tempfile::TempDir, Carver, String) {
    let (dir, carver, p) = carver_on("dgx-h100-mig");
    (dir, carver, p.gpus[0].uuid.clone())
}

/// A carver on the fake NVML with the builtin `profile`, installed in a temporary
/// directory (where its state file lives), and the profile.
pub(super) fn carver_on(profile: &str) -> (tempfile::TempDir, Carver, Profile) {
    let p = Profile::builtin(profile).expect("builtin");
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = topodra_fake_nvml::install(dir.path(), &p.to_yaml());
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("init");
    (dir, Carver::new(nvml), p)
}

fn intent(parent: &str, profile_id: u32, start: u32, size: u32) -> MigIntent {
    MigIntent {
        parent_uuid: parent.into(),
        profile_id,
        start,
        size,
    }
}

fn instances(dir: &tempfile::TempDir, parent: &str) -> Vec<(u32, u32, usize)> {
    state::read(&dir.path().join(STATE_FILE_NAME))
        .expect("state")
        .spans_of(parent)
}

#[test]
fn makes_and_removes_an_instance_at_its_placement() {
    let (dir, carver, gpu) = h100();
    let one = intent(&gpu, 19, 6, 1);
    let gi = carver.create_gpu_instance(&one, false).expect("gi");
    assert_eq!(instances(&dir, &gpu), [(6, 1, 0)]);
    let made = carver.create_compute_instance(&one).expect("ci");
    assert_eq!(made.gpu_instance, gi);
    assert!(made.uuid.starts_with("MIG-"), "{made:?}");
    assert_eq!(instances(&dir, &gpu), [(6, 1, 1)]);

    // Every step again, for the claim that made it: nothing new, the same
    // instance. For anyone else, the placement is taken.
    assert_eq!(carver.create_gpu_instance(&one, true).expect("gi"), gi);
    let err = carver
        .create_gpu_instance(&one, false)
        .expect_err("not ours");
    assert!(err.is_conflict(), "{err}");
    assert_eq!(carver.create_compute_instance(&one).expect("ci"), made);
    assert_eq!(instances(&dir, &gpu), [(6, 1, 1)]);

    assert!(carver.destroy(&one).expect("destroy"));
    assert!(instances(&dir, &gpu).is_empty());
    assert!(!carver.destroy(&one).expect("nothing left"));
}

#[test]
fn a_taken_placement_is_a_conflict_naming_what_holds_it() {
    let (_dir, carver, gpu) = h100();
    carver
        .create_gpu_instance(&intent(&gpu, 5, 0, 4), false)
        .expect("4g");
    let err = carver
        .create_gpu_instance(&intent(&gpu, 14, 2, 2), false)
        .expect_err("overlaps the 4g");
    assert!(err.is_conflict(), "{err}");
    assert!(
        matches!(
            err,
            CarveError::PlacementTaken {
                start: 0,
                size: 4,
                found: 5,
                wanted: 14,
                ..
            }
        ),
        "{err}"
    );
    // Removing at a placement where another profile sits removes nothing.
    assert!(!carver.destroy(&intent(&gpu, 14, 0, 2)).expect("not ours"));
}

/// A GPU instance whose compute instance failed stays until it is destroyed:
/// the half-made state a prepare rolls back.
#[test]
fn a_failed_compute_instance_leaves_the_gpu_instance_to_destroy() {
    let (dir, carver, gpu) = h100();
    state::update::<(), ()>(&dir.path().join(STATE_FILE_NAME), |s| {
        s.faults.fail_compute_instance_creates = 1;
        Ok(())
    })
    .expect("io")
    .expect("edit");
    let big = intent(&gpu, 0, 0, 8);
    carver.create_gpu_instance(&big, false).expect("gi");
    let err = carver.create_compute_instance(&big).expect_err("injected");
    assert!(!err.is_conflict(), "{err}");
    assert_eq!(instances(&dir, &gpu), [(0, 8, 0)]);
    assert!(carver.destroy(&big).expect("rollback"));
    assert!(instances(&dir, &gpu).is_empty());
}

#[test]
fn an_unknown_gpu_is_an_error() {
    let (_dir, carver, _) = h100();
    let err = carver
        .create_gpu_instance(&intent("GPU-not-here", 19, 0, 1), false)
        .expect_err("no such GPU");
    assert!(err.to_string().contains("GPU-not-here"), "{err}");
}
