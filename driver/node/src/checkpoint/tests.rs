use super::*;
use proptest::prelude::*;
use std::time::Duration;
use topodra_model::checkpoint::fixtures::{V1_FIXTURE, arb_checkpoint, envelope, sample};
use topodra_model::checkpoint::{ClaimState, after_reboot};

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<CheckpointStore>();
}

#[test]
fn missing_file_is_an_empty_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path().join("not-yet"));
    let loaded = store.load("boot-a").unwrap();
    assert_eq!(loaded.checkpoint, Checkpoint::new("boot-a"));
    assert_eq!((loaded.quarantined, loaded.rebooted), (None, false));
}

#[test]
fn save_then_load_round_trips_without_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    let cp = sample();
    store.save(&cp).unwrap();
    assert_eq!(listing(dir.path()), [CHECKPOINT_FILE]);
    let loaded = store.load("boot-a").unwrap();
    assert_eq!(loaded.checkpoint, cp);
    assert_eq!((loaded.quarantined, loaded.rebooted), (None, false));

    let mut cp = loaded.checkpoint;
    cp.remove("u2");
    store.save(&cp).unwrap();
    assert_eq!(listing(dir.path()), [CHECKPOINT_FILE]);
    assert_eq!(store.load("boot-a").unwrap().checkpoint, cp);
    let mode = fs::metadata(store.path()).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
}

#[test]
fn failed_temp_write_keeps_the_old_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    let old = sample();
    store.save(&old).unwrap();
    // A directory where the temp file goes makes creating it fail.
    fs::create_dir(store.temp_path()).unwrap();
    let err = store.save(&Checkpoint::new("boot-b")).unwrap_err();
    assert!(err.to_string().contains("cannot create"), "{err}");
    assert_eq!(fs::read(store.path()).unwrap(), encode(&old).unwrap());

    fs::remove_dir(store.temp_path()).unwrap();
    store.save(&Checkpoint::new("boot-b")).unwrap();
    assert_eq!(
        store.load("boot-b").unwrap().checkpoint,
        Checkpoint::new("boot-b")
    );
}

#[test]
fn read_only_directory_fails_save_and_keeps_the_old_checkpoint() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root ignores directory permissions; the temp-dir test covers the logic.
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    store.save(&sample()).unwrap();
    let perms = |mode| std::os::unix::fs::PermissionsExt::from_mode(mode);
    fs::set_permissions(dir.path(), perms(0o500)).unwrap();
    let result = store.save(&Checkpoint::new("boot-b"));
    fs::set_permissions(dir.path(), perms(0o700)).unwrap();
    assert!(result.is_err());
    assert_eq!(store.load("boot-a").unwrap().checkpoint, sample());
}

#[test]
fn stale_temp_file_is_cleaned_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    store.save(&sample()).unwrap();
    // Left by this process, by another (pid 1) and by an older version.
    for tmp in [
        store.temp_path(),
        dir.path().join("checkpoint.json.tmp-1"),
        dir.path().join("checkpoint.json.tmp"),
    ] {
        fs::write(tmp, b"{\"version\":1,\"chec").unwrap();
    }
    assert_eq!(store.load("boot-a").unwrap().checkpoint, sample());
    assert_eq!(listing(dir.path()), [CHECKPOINT_FILE]);
}

#[test]
fn corrupt_files_are_quarantined_with_their_bytes() {
    let good = encode(&sample()).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "empty"),
        ("truncated", good[..good.len() / 3].to_vec(), "truncated"),
        ("garbage", b"\x7fELF\x02\x01\x01\x00garbage".to_vec(), "not valid JSON"),
        (
            "bad checksum",
            String::from_utf8(good.clone())
                .unwrap()
                .replace("gpu-3", "gpu-4")
                .into_bytes(),
            "checksum mismatch",
        ),
        (
            "future version",
            envelope(2, r#"{"bootId":"boot-a"}"#).into_bytes(),
            "version 2 is not supported",
        ),
        (
            "wrong type",
            envelope(1, r#"{"bootId":"boot-a","claims":{"u":{"uid":"u","state":"PrepareStarted","updatedAt":"yesterday"}}}"#)
                .into_bytes(),
            "invalid type: string \"yesterday\", expected u64",
        ),
    ];
    for (name, bytes, reason_text) in cases {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        fs::write(store.path(), &bytes).unwrap();

        let loaded = store.load("boot-a").unwrap();
        assert_eq!(loaded.checkpoint, Checkpoint::new("boot-a"), "{name}");
        assert!(!loaded.rebooted, "{name}");
        let q = loaded.quarantined.expect(name);
        let reason = q.reason.to_string();
        assert!(reason.contains(reason_text), "{name}: {reason}");
        assert_eq!(
            fs::read(&q.path).unwrap(),
            bytes,
            "{name}: original bytes kept"
        );
        let qname = q.path.file_name().unwrap().to_str().unwrap();
        assert!(qname.starts_with(QUARANTINE_PREFIX), "{qname}");
        assert!(!store.path().exists(), "{name}");

        // The plugin carries on: the next save and load work normally.
        store.save(&sample()).unwrap();
        let again = store.load("boot-a").unwrap();
        assert_eq!((again.checkpoint, again.quarantined), (sample(), None));
    }
}

#[test]
fn quarantine_keeps_only_the_newest_few() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    let mut kept = Vec::new();
    for i in 0..MAX_QUARANTINED + 3 {
        fs::write(store.path(), format!("corrupt {i}")).unwrap();
        kept.push(store.load("b").unwrap().quarantined.unwrap().path);
    }
    let names = listing(dir.path());
    assert_eq!(names.len(), MAX_QUARANTINED);
    for (i, path) in kept.iter().enumerate() {
        let expect = i >= 3;
        assert_eq!(path.exists(), expect, "quarantine #{i} {}", path.display());
    }
    let newest = fs::read(kept.last().unwrap()).unwrap();
    assert_eq!(
        newest,
        format!("corrupt {}", MAX_QUARANTINED + 2).into_bytes()
    );
}

#[test]
fn unknown_fields_and_the_v1_fixture_load() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    fs::write(store.path(), V1_FIXTURE).unwrap();
    assert_eq!(store.load("boot-a").unwrap().checkpoint, sample());

    let data = r#"{"bootId":"boot-a","newTopLevel":1,"claims":{"u":{"uid":"u","state":"PrepareCompleted","extra":[{}],"devices":[{"pool":"p","device":"gpu-0","futureField":"1g.10gb"}]}}}"#;
    fs::write(store.path(), envelope(1, data)).unwrap();
    let loaded = store.load("boot-a").unwrap();
    assert_eq!(loaded.quarantined, None);
    assert_eq!(loaded.checkpoint.holder_of("p", "gpu-0").unwrap().uid, "u");
}

#[test]
fn boot_id_change_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(dir.path());
    store.save(&sample()).unwrap();
    assert!(!store.load("boot-a").unwrap().rebooted);
    let loaded = store.load("boot-b").unwrap();
    assert!(loaded.rebooted);

    let mut cp = loaded.checkpoint;
    assert_eq!(after_reboot(&mut cp, "boot-b"), ["u1", "u2"]);
    store.save(&cp).unwrap();
    let loaded = store.load("boot-b").unwrap();
    assert!(!loaded.rebooted);
    assert_eq!(
        loaded.checkpoint.get("u1").unwrap().state,
        ClaimState::NeedsReprepare
    );
}

#[test]
fn read_boot_id_trims_and_rejects_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boot_id");
    fs::write(&path, "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab\n").unwrap();
    assert_eq!(
        read_boot_id(&path).unwrap(),
        "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"
    );
    fs::write(&path, "\n").unwrap();
    assert!(read_boot_id(&path).is_err());
    assert!(read_boot_id(dir.path().join("missing")).is_err());
    if Path::new(DEFAULT_BOOT_ID_PATH).exists() {
        assert_eq!(read_boot_id(DEFAULT_BOOT_ID_PATH).unwrap().len(), 36);
    }
}

#[test]
fn utc_stamps() {
    let at = |s| UNIX_EPOCH + Duration::new(s, 7);
    assert_eq!(utc_stamp(at(0)), "19700101T000000.000000007Z");
    // 2000-02-29 and 2024-12-31 23:59:59: leap day and year end.
    assert_eq!(utc_stamp(at(951_782_400)), "20000229T000000.000000007Z");
    assert_eq!(utc_stamp(at(1_735_689_599)), "20241231T235959.000000007Z");
    assert_eq!(utc_stamp(at(1_709_210_096)), "20240229T123456.000000007Z");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_checkpoints_survive_save_and_load(cp in arb_checkpoint()) {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        store.save(&cp).unwrap();
        let loaded = store.load(&cp.boot_id).unwrap();
        prop_assert_eq!(loaded.quarantined, None);
        prop_assert!(!loaded.rebooted);
        prop_assert_eq!(loaded.checkpoint, cp);
    }

    #[test]
    fn arbitrary_files_load_or_quarantine(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path());
        fs::write(store.path(), &bytes).unwrap();
        let loaded = store.load("b").unwrap();
        match loaded.quarantined {
            Some(q) => prop_assert_eq!(fs::read(q.path).unwrap(), bytes),
            None => prop_assert!(store.path().exists()),
        }
    }
}
