//! Claim spec files in the CDI spec directory.
//!
//! Runtimes watch the directory and load every `*.json` and `*.yaml` file, so a file
//! must appear complete or not at all: it is written to a hidden temp name that
//! runtimes ignore and renamed over the final name. Any failure removes the temp file,
//! so a full disk leaves neither a partial spec nor litter behind.
//!
//! Nothing here is synced to disk. Within one boot the page cache is what every
//! reader sees, a crashed plugin included, so a spec is there or not as soon as the
//! rename returns; across a reboot no spec is trusted (recovery removes them all and
//! the kubelet prepares every claim again), so making one survive a power loss would
//! buy nothing. On real nodes the directory is `/var/run/cdi`, a tmpfs, where a sync
//! does nothing anyway. What must survive a power loss is the checkpoint, which is
//! synced (`checkpoint::store`).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::spec::Spec;
use super::{CdiError, CdiKind, check_claim_uid, validate};

/// Where runtimes look for transient specs; they also read `/etc/cdi`, which is for
/// static ones.
pub const DEFAULT_SPEC_DIR: &str = "/var/run/cdi";

const SPEC_FILE_SUFFIX: &str = ".json";
/// Temp files: a leading dot and no `.json` ending keep runtimes from loading them.
const TEMP_MARKER: &str = ".tmp-";

/// World-readable: runtimes may read specs as another user than the plugin's.
const SPEC_FILE_MODE: u32 = 0o644;

/// Writes, removes and lists one installation's claim specs in one directory.
///
/// Every file it owns starts with the kind's `<vendor>-<class>_` prefix (the CDI
/// convention for transient specs), so other vendors' files, and those of another
/// installation with another driver name, are never mistaken for its own.
#[derive(Debug, Clone)]
pub struct SpecWriter {
    dir: PathBuf,
    kind: CdiKind,
}

impl SpecWriter {
    pub fn new(dir: impl Into<PathBuf>, kind: CdiKind) -> Self {
        Self {
            dir: dir.into(),
            kind,
        }
    }

    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn kind(&self) -> &CdiKind {
        &self.kind
    }

    /// `<dir>/k8s.gpu.topodra.dev-claim_<claimUID>.json` for the default driver name.
    pub(crate) fn path_for(&self, claim_uid: &str) -> PathBuf {
        self.dir.join(format!(
            "{}{claim_uid}{SPEC_FILE_SUFFIX}",
            self.kind.file_prefix()
        ))
    }

    /// Validates `spec` and writes it atomically as the claim's file, replacing any
    /// earlier version (prepare is idempotent). Returns the file's path.
    pub fn write(&self, claim_uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
        self.write_with(claim_uid, spec, |f| Box::new(f))
    }

    /// [`Self::write`], with the temp file's writer wrapped, so tests can make the
    /// write fail midway.
    fn write_with(&self, claim_uid: &str, spec: &Spec, wrap: Wrap) -> Result<PathBuf, CdiError> {
        check_claim_uid(claim_uid)?;
        validate(spec).map_err(|problems| CdiError::InvalidSpec {
            claim_uid: claim_uid.to_owned(),
            problems,
        })?;
        let mut data = serde_json::to_vec_pretty(spec).map_err(CdiError::Serialize)?;
        data.push(b'\n');

        fs::create_dir_all(&self.dir).map_err(|source| CdiError::Io {
            op: "create spec directory",
            path: self.dir.clone(),
            source,
        })?;
        let path = self.path_for(claim_uid);
        let tmp = self.dir.join(self.temp_name(claim_uid));
        let result = write_file(&tmp, &data, wrap).and_then(|()| {
            fs::rename(&tmp, &path).map_err(|source| CdiError::Io {
                op: "rename spec into place",
                path: path.clone(),
                source,
            })
        });
        if result.is_err() {
            // The rename may already have happened; then this finds nothing.
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| path)
    }

    /// Removes the claim's spec. Succeeds when there is none, because unprepare is
    /// retried and may run after a restart that already cleaned up.
    pub(crate) fn remove(&self, claim_uid: &str) -> Result<(), CdiError> {
        check_claim_uid(claim_uid)?;
        let path = self.path_for(claim_uid);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CdiError::Io {
                op: "remove spec",
                path,
                source,
            }),
        }
    }

    /// Claim UIDs of the specs in the directory that this driver wrote, sorted, for
    /// garbage collection against the checkpoint. Other vendors' files, and names
    /// that only look like ours, are never listed. A missing directory owns nothing.
    pub(crate) fn list_owned(&self) -> Result<Vec<String>, CdiError> {
        let prefix = self.kind.file_prefix();
        let mut uids: Vec<String> = self
            .entries()?
            .into_iter()
            .filter_map(|name| {
                let uid = name.strip_prefix(&prefix)?.strip_suffix(SPEC_FILE_SUFFIX)?;
                check_claim_uid(uid).is_ok().then(|| uid.to_owned())
            })
            .collect();
        uids.sort();
        Ok(uids)
    }

    /// Removes temp files a crash left between create and rename. Returns how many.
    pub(crate) fn remove_stale_temp_files(&self) -> Result<usize, CdiError> {
        let mut removed = 0;
        for name in self.entries()? {
            if name.starts_with(&self.temp_prefix()) && name.contains(TEMP_MARKER) {
                let path = self.dir.join(&name);
                match fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(CdiError::Io {
                            op: "remove stale temp spec",
                            path,
                            source,
                        });
                    }
                }
            }
        }
        Ok(removed)
    }

    fn entries(&self) -> Result<Vec<String>, CdiError> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(CdiError::Io {
                    op: "list spec directory",
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|source| CdiError::Io {
                op: "list spec directory",
                path: self.dir.clone(),
                source,
            })?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// A leading dot and no `.json` ending: runtimes never load a temp file.
    fn temp_prefix(&self) -> String {
        format!(".{}", self.kind.file_prefix())
    }

    /// Unique per process and call, so concurrent prepares of one claim (retries)
    /// never share a temp file.
    fn temp_name(&self, claim_uid: &str) -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        format!(
            "{}{claim_uid}{TEMP_MARKER}{}-{n}",
            self.temp_prefix(),
            std::process::id()
        )
    }
}

/// Turns the temp file into the writer the spec bytes go through.
type Wrap = fn(&File) -> Box<dyn Write + '_>;

fn write_file(path: &Path, data: &[u8], wrap: Wrap) -> Result<(), CdiError> {
    let io_err = |op| {
        move |source| CdiError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(SPEC_FILE_MODE)
        .open(path)
        .map_err(io_err("create temp spec"))?;
    // The umask may have narrowed the mode given at creation.
    file.set_permissions(Permissions::from_mode(SPEC_FILE_MODE))
        .map_err(io_err("set spec file mode"))?;
    let mut w = wrap(&file);
    w.write_all(data).map_err(io_err("write spec"))?;
    w.flush().map_err(io_err("write spec"))?;
    Ok(())
}

#[cfg(test)]
mod tests;
