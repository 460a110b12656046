//! The checkpoint file: atomic saves, and loads that quarantine what they cannot trust.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use topodra_model::checkpoint::{Checkpoint, CorruptReason, MAX_CHECKPOINT_BYTES, encode, parse};

/// Current time in unix seconds, for the `now` of the checkpoint's transitions.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// File name of the checkpoint inside the store's directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

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
#[non_exhaustive]
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
    /// The save that carried this change together with others failed (group commit).
    #[error("checkpoint: the save carrying this change failed: {0}")]
    SavedWithOthers(String),
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
    /// [`after_reboot`](topodra_model::checkpoint::after_reboot) and save.
    pub(crate) rebooted: bool,
}

/// The checkpoint file `checkpoint.json` in a directory.
///
/// `save` must not run concurrently with another `save` or a `load` of the same
/// directory (they share a temp file name, and load may move the file aside); the
/// prepare state machine serializes them. The store itself holds no state, so it is
/// `Send + Sync` and cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
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

    /// Reads the checkpoint and changes nothing on disk: no temp file removed, no
    /// corrupt file moved aside. For a process that may not write the directory (it
    /// could not take ownership of it) and serves what it finds, read-only. A
    /// missing, unreadable or corrupt file gives an empty checkpoint, with why.
    pub(crate) fn read_only(&self, current_boot_id: &str) -> (Checkpoint, Option<String>) {
        let parsed = match fs::symlink_metadata(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return (Checkpoint::new(current_boot_id), None);
            }
            Err(e) => Err(format!("cannot inspect {}: {e}", self.path.display())),
            Ok(meta) if !meta.is_file() => {
                Err(CorruptReason::NotAFile(file_kind(&meta)).to_string())
            }
            Ok(_) => read_capped(&self.path)
                .map_err(|e| format!("cannot read {}: {e}", self.path.display()))
                .and_then(|bytes| parse(&bytes).map_err(|r| r.to_string())),
        };
        match parsed {
            Ok(checkpoint) => (checkpoint, None),
            Err(why) => (Checkpoint::new(current_boot_id), Some(why)),
        }
    }

    /// The device names any claim of the checkpoint records, whatever its state,
    /// read as [`Self::read_only`] does; `Err(why)` when the file cannot be read or
    /// trusted, since then any device may be held.
    pub fn prepared_devices(state_dir: &Path) -> Result<BTreeSet<String>, String> {
        let (checkpoint, why) = CheckpointStore::new(state_dir).read_only("");
        if let Some(why) = why {
            return Err(why);
        }
        Ok(checkpoint
            .claims
            .values()
            .flat_map(|r| r.devices.iter().map(|d| d.device.clone()))
            .collect())
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
mod tests;
