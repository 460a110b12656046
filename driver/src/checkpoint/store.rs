//! The checkpoint file: atomic saves, and loads that quarantine what they cannot trust.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Checkpoint;
use super::format::{CorruptReason, MAX_CHECKPOINT_BYTES, encode, parse};

/// File name of the checkpoint inside the store's directory.
pub(crate) const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Where Linux exposes the id of the running boot.
pub const DEFAULT_BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// How many quarantined files are kept; older ones are deleted. Enough to debug a
/// repeating corruption without letting it fill the disk.
pub(crate) const MAX_QUARANTINED: usize = 5;

/// Temp files are `checkpoint.json.tmp-<pid>`: unique per process, so two processes
/// that ever wrote at once (the ownership lock of the kubelet plugin prevents it)
/// would never write into each other's temp file or rename it from under each other.
const TEMP_PREFIX: &str = "checkpoint.json.tmp";
const QUARANTINE_PREFIX: &str = "checkpoint.json.corrupt-";

/// A failure that leaves the checkpoint unusable: only real I/O problems, never the
/// file's content (that is quarantined instead, see `CheckpointStore::load`).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint: cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("checkpoint: cannot encode: {0}")]
    Encode(#[from] serde_json::Error),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    move |source| CheckpointError::Io {
        action,
        path,
        source,
    }
}

/// A corrupt checkpoint moved aside by `CheckpointStore::load`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// Where the original bytes now are.
    pub path: PathBuf,
    pub reason: CorruptReason,
}

/// The result of [`CheckpointStore::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// The stored checkpoint, or an empty one for the current boot when there was none
    /// or it was quarantined.
    pub(crate) checkpoint: Checkpoint,
    /// Set when the file was corrupt. The caller should raise an Event and rebuild
    /// what it can (e.g. from the CDI specs on disk): the claims it held are unknown.
    pub(crate) quarantined: Option<Quarantined>,
    /// The stored boot id differs from the current one; apply
    /// [`after_reboot`](super::after_reboot) and save.
    pub(crate) rebooted: bool,
}

/// The checkpoint file `checkpoint.json` in a directory.
///
/// `save` must not run concurrently with another `save` or a `load` of the same
/// directory (they share a temp file name, and load may move the file aside); the
/// prepare state machine serializes them. The store itself holds no state, so it is
/// `Send + Sync` and cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointStore {
    dir: PathBuf,
    path: PathBuf,
}

impl CheckpointStore {
    pub(crate) fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let path = dir.join(CHECKPOINT_FILE);
        Self { dir, path }
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the checkpoint atomically: after a crash at any point the file holds
    /// either the old or the new content, never a mix. Creates the directory if needed.
    pub(crate) fn save(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let bytes = encode(checkpoint)?;
        fs::create_dir_all(&self.dir).map_err(io_err("create directory", &self.dir))?;
        let tmp = self.temp_path();
        if let Err(e) = write_synced(&tmp, &bytes) {
            // A leftover we did not create (e.g. a directory) makes the create fail and
            // is not ours to delete; removing a file is harmless either way.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if let Err(e) = fs::rename(&tmp, &self.path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("rename temp file over", &self.path)(e));
        }
        // Without this the rename itself may be lost on power failure.
        sync_dir(&self.dir)
    }

    /// Reads the checkpoint.
    ///
    /// A missing file gives an empty checkpoint. A file that cannot be trusted
    /// (unparsable, truncated, checksum mismatch, unknown version, wrong types) is
    /// renamed to `checkpoint.json.corrupt-<UTC timestamp>` with its bytes untouched,
    /// and an empty checkpoint is returned with the reason: a bad file must not keep
    /// the plugin in a crash loop. Only I/O failures (e.g. an unreadable directory)
    /// are errors.
    pub(crate) fn load(&self, current_boot_id: &str) -> Result<Loaded, CheckpointError> {
        self.remove_stale_temp();
        let empty = || Checkpoint::new(current_boot_id);
        let parsed = match fs::symlink_metadata(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    checkpoint: empty(),
                    quarantined: None,
                    rebooted: false,
                });
            }
            Err(e) => return Err(io_err("inspect", &self.path)(e)),
            // A directory, socket or link where the file should be is no checkpoint;
            // moving it aside beats failing every start.
            Ok(meta) if !meta.is_file() => Err(CorruptReason::NotAFile(file_kind(&meta))),
            Ok(_) => parse(&read_capped(&self.path).map_err(io_err("read", &self.path))?),
        };
        match parsed {
            Ok(checkpoint) => Ok(Loaded {
                rebooted: checkpoint.boot_id != current_boot_id,
                checkpoint,
                quarantined: None,
            }),
            Err(reason) => {
                let path = self.quarantine()?;
                tracing::warn!(
                    quarantined = %path.display(),
                    %reason,
                    "checkpoint is corrupt; starting from an empty one"
                );
                Ok(Loaded {
                    checkpoint: empty(),
                    quarantined: Some(Quarantined { path, reason }),
                    // Unknowable; the claims it would apply to are gone anyway.
                    rebooted: false,
                })
            }
        }
    }

    /// This process's temp file.
    pub(crate) fn temp_path(&self) -> PathBuf {
        self.dir
            .join(format!("{TEMP_PREFIX}-{}", std::process::id()))
    }

    /// A temp file is left only by a crash during save, before the rename: the old
    /// checkpoint is intact and the temp's content was never committed. Called at
    /// load, by the owner of the directory, so every temp file there is stale.
    fn remove_stale_temp(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_temp = name
                .to_str()
                .is_some_and(|n| n == TEMP_PREFIX || n.starts_with(&format!("{TEMP_PREFIX}-")));
            if !is_temp || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let tmp = entry.path();
            match fs::remove_file(&tmp) {
                Ok(()) => {
                    tracing::info!(path = %tmp.display(), "removed an interrupted checkpoint save")
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(
                        path = %tmp.display(),
                        error = %e,
                        "cannot remove stale checkpoint temp file"
                    );
                }
            }
        }
    }

    fn quarantine(&self) -> Result<PathBuf, CheckpointError> {
        let stamp = utc_stamp(SystemTime::now());
        let mut target = self.dir.join(format!("{QUARANTINE_PREFIX}{stamp}"));
        // Two corruptions within a clock tick must not overwrite each other.
        let mut n = 1;
        while fs::symlink_metadata(&target).is_ok() {
            target = self.dir.join(format!("{QUARANTINE_PREFIX}{stamp}-{n}"));
            n += 1;
        }
        fs::rename(&self.path, &target).map_err(io_err("quarantine", &self.path))?;
        sync_dir(&self.dir)?;
        self.prune_quarantine();
        Ok(target)
    }

    fn prune_quarantine(&self) {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(
                    dir = %self.dir.display(),
                    error = %e,
                    "cannot list quarantined checkpoints"
                );
                return;
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(QUARANTINE_PREFIX))
            .collect();
        // Fixed-width stamps sort chronologically; a `-n` suffix sorts after its base.
        names.sort();
        let excess = names.len().saturating_sub(MAX_QUARANTINED);
        for name in &names[..excess] {
            let path = self.dir.join(name);
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "cannot delete old quarantined checkpoint"
                );
            }
        }
    }
}

/// Reads the kernel boot id (normally from [`DEFAULT_BOOT_ID_PATH`]).
pub fn read_boot_id(path: impl AsRef<Path>) -> Result<String, CheckpointError> {
    let path = path.as_ref();
    let id = fs::read_to_string(path).map_err(io_err("read boot id", path))?;
    let id = id.trim();
    if id.is_empty() {
        return Err(io_err("read boot id", path)(io::Error::new(
            io::ErrorKind::InvalidData,
            "empty",
        )));
    }
    Ok(id.to_owned())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    // create_new (O_EXCL) never follows a symlink planted at the temp name.
    let _ = fs::remove_file(path);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    file.write_all(bytes).map_err(io_err("write", path))?;
    file.sync_all().map_err(io_err("sync", path))
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync directory", dir))
}

/// Reads at most one byte past the limit, so `parse` can reject an oversized file
/// without it ever being held in memory whole.
fn file_kind(meta: &fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

fn read_capped(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)?
        .take(MAX_CHECKPOINT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `YYYYMMDDTHHMMSS.nnnnnnnnnZ` in UTC: readable, and sorts as it reads.
fn utc_stamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::checkpoint::format::tests::{V1_FIXTURE, envelope};
    use crate::checkpoint::tests::{arb_checkpoint, sample};
    use crate::checkpoint::{ClaimState, after_reboot};
    use proptest::prelude::*;
    use std::time::Duration;

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

        let data = r#"{"bootId":"boot-a","newTopLevel":1,"claims":{"u":{"uid":"u","state":"PrepareCompleted","extra":[{}],"devices":[{"pool":"p","device":"gpu-0","mig":"1g.10gb"}]}}}"#;
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
        assert_eq!(after_reboot(&mut cp, "boot-b"), ["u1"]);
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
}
