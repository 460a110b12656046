use super::fixtures::{claim, device, sample};
use super::*;

#[test]
fn holder_of_finds_the_claim_holding_a_device() {
    let cp = sample();
    assert_eq!(cp.holder_of("node-1", "gpu-1").unwrap().uid, "u1");
    assert_eq!(cp.holder_of("node-1", "gpu-3").unwrap().uid, "u2");
    assert!(cp.holder_of("node-1", "gpu-2").is_none());
    assert!(cp.holder_of("node-2", "gpu-0").is_none());
}

#[test]
fn insert_replaces_and_remove_releases() {
    let mut cp = sample();
    let mut r = cp.get("u1").unwrap().clone();
    r.devices.truncate(1);
    let old = cp.insert(r).unwrap();
    assert_eq!(old.devices.len(), 2);
    assert!(cp.holder_of("node-1", "gpu-1").is_none());
    assert_eq!(cp.remove("u1").unwrap().uid, "u1");
    assert!(cp.holder_of("node-1", "gpu-0").is_none());
    assert!(cp.remove("u1").is_none());
}

#[test]
fn begin_prepare_refuses_a_device_of_another_claim() {
    let mut cp = sample();
    let err = begin_prepare(
        &mut cp,
        claim("u3"),
        vec![
            device("node-1", "gpu-2", "u3"),
            device("node-1", "gpu-1", "u3"),
        ],
        None,
        200,
    )
    .unwrap_err();
    assert_eq!(
        err,
        TransitionError::DeviceInUse(Box::new(DeviceInUse {
            pool: "node-1".into(),
            device: "gpu-1".into(),
            holder: claim("u1"),
        }))
    );
    assert!(cp.get("u3").is_none(), "a refused prepare records nothing");
}

#[test]
fn begin_prepare_again_for_the_same_claim_restarts_it() {
    let mut cp = sample();
    let r = begin_prepare(
        &mut cp,
        claim("u1"),
        vec![device("node-1", "gpu-0", "u1")],
        None,
        300,
    )
    .unwrap();
    assert_eq!(r.state, ClaimState::PrepareStarted);
    assert_eq!(r.updated_at, 300);
    assert!(cp.holder_of("node-1", "gpu-1").is_none());
}

#[test]
fn complete_prepare_transitions() {
    let mut cp = sample();
    let r = complete_prepare(&mut cp, "u2", 400).unwrap();
    assert_eq!((r.state, r.updated_at), (ClaimState::PrepareCompleted, 400));
    // Idempotent: the timestamp of the real completion is kept.
    let r = complete_prepare(&mut cp, "u2", 500).unwrap();
    assert_eq!((r.state, r.updated_at), (ClaimState::PrepareCompleted, 400));
    assert_eq!(
        complete_prepare(&mut cp, "nope", 1).unwrap_err(),
        TransitionError::UnknownClaim("nope".into())
    );
    after_reboot(&mut cp, "boot-b");
    assert_eq!(
        complete_prepare(&mut cp, "u1", 1).unwrap_err(),
        TransitionError::NotStarted {
            uid: "u1".into(),
            state: ClaimState::NeedsReprepare
        }
    );
}

#[test]
fn rollback_candidates_are_the_started_claims() {
    let cp = sample();
    let uids: Vec<_> = rollback_candidates(&cp)
        .into_iter()
        .map(|r| r.uid)
        .collect();
    assert_eq!(uids, ["u2"]);
}

#[test]
fn after_reboot_keeps_records_and_asks_for_reprepare() {
    let mut cp = sample();
    assert!(after_reboot(&mut cp, "boot-a").is_empty(), "same boot");
    assert_eq!(cp.get("u1").unwrap().state, ClaimState::PrepareCompleted);

    assert_eq!(after_reboot(&mut cp, "boot-b"), ["u1", "u2"]);
    assert_eq!(cp.boot_id, "boot-b");
    assert_eq!(cp.get("u1").unwrap().state, ClaimState::NeedsReprepare);
    // A started prepare may have been answered (its completion is saved lazily), and
    // a power loss leaves no evidence either way: it keeps its devices too.
    assert_eq!(cp.get("u2").unwrap().state, ClaimState::NeedsReprepare);
    assert_eq!(cp.holder_of("node-1", "gpu-0").unwrap().uid, "u1");
    assert_eq!(cp.holder_of("node-1", "gpu-3").unwrap().uid, "u2");
    assert!(rollback_candidates(&cp).is_empty());
    assert!(after_reboot(&mut cp, "boot-b").is_empty(), "idempotent");

    // The kubelet's next prepare redoes the work.
    let devices = cp.get("u1").unwrap().devices.clone();
    begin_prepare(&mut cp, claim("u1"), devices, None, 600).unwrap();
    let r = complete_prepare(&mut cp, "u1", 601).unwrap();
    assert_eq!(r.state, ClaimState::PrepareCompleted);
}

fn partition(name: &str, claim: &str, parent: &str, start: u32, size: u32) -> PreparedGpu {
    PreparedGpu {
        mig: Some(MigIntent {
            parent_uuid: parent.into(),
            profile_id: 19,
            start,
            size,
        }),
        ..device("node-1", name, claim)
    }
}

/// Two claims never record MIG instances that share a memory slice of one GPU,
/// whatever their device names; beside each other, or on another GPU, they do.
#[test]
fn begin_prepare_refuses_an_overlapping_mig_instance() {
    let mut cp = Checkpoint::new("boot-a");
    begin_prepare(
        &mut cp,
        claim("a"),
        vec![partition("gpu-0-mig-2g-20gb-4", "a", "GPU-0", 4, 2)],
        None,
        1,
    )
    .unwrap();
    let err = begin_prepare(
        &mut cp,
        claim("b"),
        vec![partition("gpu-0", "b", "GPU-0", 0, 8)],
        None,
        2,
    )
    .unwrap_err();
    assert!(
        matches!(&err, TransitionError::DeviceInUse(d) if d.device == "gpu-0-mig-2g-20gb-4" && d.holder.uid == "a"),
        "{err:?}"
    );
    assert!(cp.get("b").is_none());
    for (name, parent, start, size) in [
        ("gpu-0-mig-1g-10gb-6", "GPU-0", 6, 1),
        ("gpu-0-mig-2g-20gb-2", "GPU-0", 2, 2),
        ("gpu-1-mig-1g-10gb-4", "GPU-1", 4, 1),
    ] {
        let uid = format!("c-{name}");
        begin_prepare(
            &mut cp,
            claim(&uid),
            vec![partition(name, &uid, parent, start, size)],
            None,
            3,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The same claim prepared again replaces its own record.
    begin_prepare(
        &mut cp,
        claim("a"),
        vec![partition("gpu-0-mig-2g-20gb-4", "a", "GPU-0", 4, 2)],
        None,
        4,
    )
    .unwrap();
}

fn share_of(name: &str, claim: &str, share_id: &str, gpu: &str, timeslice: u8) -> PreparedGpu {
    PreparedGpu {
        share_id: Some(share_id.into()),
        sharing: Some(ShareIntent {
            mode: ShareMode::TimeSlicing,
            gpu_device: gpu.into(),
            gpu_uuid: format!("GPU-{gpu}"),
            timeslice,
            memory_bytes: Some(1 << 30),
            compute_percent: None,
            pipe_dir: None,
            prior_compute_mode: None,
        }),
        ..device("node-1", name, claim)
    }
}

/// Distinct shares of one shared device are held together; one share id, the
/// GPU itself, or a plain device held twice are not.
#[test]
fn shares_of_a_device_are_held_together_and_exclude_their_gpu() {
    let mut cp = Checkpoint::new("b");
    begin_prepare(
        &mut cp,
        claim("u1"),
        vec![share_of("gpu-7-ts", "u1", "s1", "gpu-7", 3)],
        None,
        1,
    )
    .unwrap();
    begin_prepare(
        &mut cp,
        claim("u2"),
        vec![share_of("gpu-7-ts", "u2", "s2", "gpu-7", 3)],
        None,
        2,
    )
    .unwrap();
    let same_id = begin_prepare(
        &mut cp,
        claim("u3"),
        vec![share_of("gpu-7-ts", "u3", "s1", "gpu-7", 3)],
        None,
        3,
    );
    assert!(matches!(same_id, Err(TransitionError::DeviceInUse(_))));
    let whole = begin_prepare(
        &mut cp,
        claim("u3"),
        vec![device("node-1", "gpu-7", "u3")],
        None,
        3,
    )
    .unwrap_err();
    assert!(matches!(whole, TransitionError::DeviceInUse(e) if e.device == "gpu-7-ts"));
    // Another GPU's share, or another pool's, is no conflict.
    begin_prepare(
        &mut cp,
        claim("u4"),
        vec![share_of("gpu-6-ts", "u4", "s1", "gpu-6", 3)],
        None,
        4,
    )
    .unwrap();
    assert_eq!(cp.live_time_slices("GPU-gpu-7", "u1"), 1);
    assert_eq!(cp.live_time_slices("GPU-gpu-7", "nobody"), 2);
    // A record waiting to be prepared again after a reboot holds no setting.
    after_reboot(&mut cp, "b2");
    assert_eq!(cp.live_time_slices("GPU-gpu-7", "nobody"), 0);
}

/// A share recorded by this version reads back whole; the file of a version
/// without shares still loads (no field is required).
#[test]
fn a_share_survives_the_file() {
    let mut cp = Checkpoint::new("b");
    begin_prepare(
        &mut cp,
        claim("u1"),
        vec![share_of("gpu-7-ts", "u1", "s1", "gpu-7", 2)],
        None,
        1,
    )
    .unwrap();
    let bytes = encode(&cp).unwrap();
    assert_eq!(parse(&bytes).unwrap(), cp);
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.contains(r#""sharing":{"mode":"TimeSlicing","gpuDevice":"gpu-7","gpuUUID":"GPU-gpu-7","timeslice":2,"memoryBytes":1073741824}"#), "{text}");
}
