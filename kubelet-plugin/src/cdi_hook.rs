//! NVIDIA's `nvidia-cdi-hook`: every claim's CDI spec names it in its hooks
//! (`update-ldcache`, `create-symlinks`, `enable-cuda-compat`, ...), and the container
//! runtime runs it on the host, by the host path the spec gives. So before the
//! plugin writes a spec there must be a working hook on the host, and the specs must
//! name where it is.
//!
//! Two ways to get one, as the flags of [`crate::args::CdiFlags`] choose:
//!
//! - **Install** (the default): the plugin's image carries the hook at
//!   `/usr/bin/nvidia-cdi-hook`; the plugin copies it into its own directory under
//!   the kubelet's plugins directory (`<plugins-dir>/<driver>/nvidia-cdi-hook`),
//!   which the chart mounts from the host at the same path, so the path this process
//!   writes is the path the runtime runs. The copy is written only when its bytes or
//!   mode differ from the source, atomically (a temporary file in the same
//!   directory, fsync, mode 0755, rename, fsync of the directory): a runtime that
//!   starts the hook at that moment runs either the old or the new binary, never
//!   half of one. NVIDIA's own DRA driver does the same.
//! - **Host**: a hook already on the host (the NVIDIA Container Toolkit's package
//!   installs `/usr/bin/nvidia-cdi-hook`) is named as it is; nothing is written.
//!
//! Either way the hook is checked before any spec can name it: it must exist, be a
//! regular, executable file, and answer `--version` within a few seconds. A binary
//! for another architecture, or one whose C library is missing, fails that check:
//! a spec whose hooks cannot run would fail every container that uses the claim,
//! far from the cause.
//!
//! What a failure does depends on whose it is ([`HookError::stops_the_start`]). A
//! source or host hook that does not work is the image's or the flags' mistake,
//! which nothing on the node can fix, and the plugin does not start. The plugin's
//! directory that cannot take the copy (read-only, full, a directory in the way,
//! mounted noexec) is the node's condition, which an operator fixes while the
//! plugin runs. Then a copy already there that prints the same `--version` as the
//! source (the same release, installed by an earlier start) is named instead
//! ([`Action::Kept`]): what the specs need is that release's hooks, not these very
//! bytes. Without one the plugin serves read-only, since no spec can be written,
//! and tries again with the state directory.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

mod version;

use version::run_version;

/// Name of the installed copy in the plugin's directory.
pub(crate) const INSTALLED_NAME: &str = "nvidia-cdi-hook";
/// How long `<hook> --version` may take before the hook counts as unusable.
pub(crate) const VERSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Mode of the installed copy: the runtime runs it as root; anyone may read it.
const INSTALLED_MODE: u32 = 0o755;
/// Temporary files of an install are `.nvidia-cdi-hook.<unique>.tmp`.
const TEMP_PREFIX: &str = ".nvidia-cdi-hook.";
const TEMP_SUFFIX: &str = ".tmp";
/// A temporary file this old is what an instance killed while installing left.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Where the hook that the specs name comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HookSetup {
    /// Copy `source` into `plugin_dir` as [`INSTALLED_NAME`] and name the copy.
    Install {
        source: PathBuf,
        plugin_dir: PathBuf,
    },
    /// Name `path`, a hook already on the host; install nothing.
    Host { path: PathBuf },
}

/// What [`prepare`] did to the plugin directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// No copy was there; one was written.
    Installed,
    /// A copy with other bytes or another mode was there; it was replaced.
    Replaced,
    /// The copy there was the source already; nothing was written.
    Unchanged,
    /// A hook on the host is named; nothing is installed.
    HostHook,
    /// The copy could not be written, and the one there, of the same version as
    /// the source, is named as it is.
    Kept,
}

/// A checked hook, ready to be named by the specs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hook {
    /// The path the specs name (`CdiConfig::hook_path`): a host path.
    pub(crate) path: PathBuf,
    /// The first line the hook printed for `--version`.
    pub(crate) version: String,
    /// SHA-256 of the file, hex.
    pub(crate) sha256: String,
    pub(crate) action: Action,
}

impl Hook {
    pub(crate) fn log_ready(&self) {
        tracing::info!(
            path = %self.path.display(),
            version = %self.version,
            sha256 = %self.sha256,
            action = ?self.action,
            "nvidia-cdi-hook ready; the CDI specs' hooks name this path"
        );
    }
}

/// Which file a problem is about; it decides what the error suggests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The hook to install (`--cdi-hook-source`).
    Source,
    /// The copy in the plugin's directory.
    Installed,
    /// The host's hook (`--cdi-hook-host-path`).
    Host,
}

impl Role {
    fn describe(self) -> &'static str {
        match self {
            Role::Source => "the nvidia-cdi-hook to install (--cdi-hook-source)",
            Role::Installed => "the installed nvidia-cdi-hook",
            Role::Host => "the host's nvidia-cdi-hook (--cdi-hook-host-path)",
        }
    }

    fn fix(self) -> &'static str {
        match self {
            Role::Source => {
                "the plugin's image carries NVIDIA's hook at /usr/bin/nvidia-cdi-hook; outside \
                 the image pass --cdi-hook-source (TOPODRA_CDI_HOOK_SOURCE) naming a working \
                 nvidia-cdi-hook for this machine (tests/tools/build.sh nvidia-ctk builds one), \
                 or name a hook installed on the host with --cdi-hook-host-path (chart: \
                 kubeletPlugin.cdiHook.hostPath)"
            }
            Role::Installed => {
                "the plugin's directory under the kubelet's plugins directory must be a \
                 writable host directory that allows running programs (not mounted noexec), \
                 because the container runtime runs the hook from there"
            }
            Role::Host => {
                "install the NVIDIA Container Toolkit on the node (its package puts the hook at \
                 /usr/bin/nvidia-cdi-hook) or correct the path; or leave --cdi-hook-host-path \
                 (chart: kubeletPlugin.cdiHook.hostPath) unset to install the hook that comes \
                 with the plugin"
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum HookError {
    /// The hook at `path` cannot be used; `fix` says what to do.
    #[error("{} {} {problem}; {}", role.describe(), path.display(), role.fix())]
    Unusable {
        role: Role,
        path: PathBuf,
        problem: String,
    },
    #[error(
        "cannot install nvidia-cdi-hook into {}: cannot {action} {}: {source}; {}",
        dir.display(),
        path.display(),
        Role::Installed.fix()
    )]
    Install {
        dir: PathBuf,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl HookSetup {
    /// The host path the specs name, whether or not a hook is there yet.
    pub(crate) fn path(&self) -> PathBuf {
        match self {
            HookSetup::Install { plugin_dir, .. } => plugin_dir.join(INSTALLED_NAME),
            HookSetup::Host { path } => path.clone(),
        }
    }
}

impl HookError {
    /// Whether the plugin must not start: the hook it was given (the image's
    /// source, the host's hook) does not work, which no change on the node fixes
    /// while it runs. The plugin's directory that cannot take or run the copy is
    /// not such a reason: the plugin serves read-only and tries again.
    pub(crate) fn stops_the_start(&self) -> bool {
        match self {
            HookError::Unusable { role, .. } => *role != Role::Installed,
            HookError::Install { .. } => false,
        }
    }
}

/// Checks the hook `setup` names, installing it first where it says so, and
/// returns the host path the specs must name.
pub(crate) fn prepare(setup: &HookSetup) -> Result<Hook, HookError> {
    prepare_with_timeout(setup, VERSION_TIMEOUT)
}

fn prepare_with_timeout(setup: &HookSetup, timeout: Duration) -> Result<Hook, HookError> {
    match setup {
        HookSetup::Host { path } => {
            let version = check(path, Role::Host, timeout)?;
            let bytes = fs::read(path).map_err(|e| unusable(Role::Host, path, read_problem(&e)))?;
            Ok(Hook {
                path: path.clone(),
                version,
                sha256: sha256_hex(&bytes),
                action: Action::HostHook,
            })
        }
        HookSetup::Install { source, plugin_dir } => {
            // The source first: a broken one must not replace a working copy that
            // the specs of a running instance (a rolling update's old pod) name.
            let source_version = check(source, Role::Source, timeout)?;
            let bytes =
                fs::read(source).map_err(|e| unusable(Role::Source, source, read_problem(&e)))?;
            let (path, action) = match install(&bytes, plugin_dir) {
                Ok(installed) => installed,
                Err(e) => return keep_installed(plugin_dir, &source_version, timeout, e),
            };
            // Then the copy, where the runtime will run it: a noexec mount fails here.
            let version = check(&path, Role::Installed, timeout)?;
            Ok(Hook {
                path,
                version,
                sha256: sha256_hex(&bytes),
                action,
            })
        }
    }
}

/// After `failed` (the copy could not be written): the copy already in
/// `plugin_dir` when it works and prints `source_version`, else `failed`.
fn keep_installed(
    plugin_dir: &Path,
    source_version: &str,
    timeout: Duration,
    failed: HookError,
) -> Result<Hook, HookError> {
    let path = plugin_dir.join(INSTALLED_NAME);
    let kept = check(&path, Role::Installed, timeout)
        .ok()
        .filter(|version| version == source_version)
        .and_then(|version| Some((version, fs::read(&path).ok()?)));
    let Some((version, bytes)) = kept else {
        return Err(failed);
    };
    tracing::warn!(
        error = %failed,
        path = %path.display(),
        version,
        "cannot write the image's nvidia-cdi-hook; the copy already there is the same version and is named instead"
    );
    Ok(Hook {
        path,
        version,
        sha256: sha256_hex(&bytes),
        action: Action::Kept,
    })
}

fn unusable(role: Role, path: &Path, problem: impl Into<String>) -> HookError {
    HookError::Unusable {
        role,
        path: path.to_owned(),
        problem: problem.into(),
    }
}

fn read_problem(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::NotFound {
        "does not exist".to_owned()
    } else {
        format!("cannot be read ({e})")
    }
}

/// The hook at `path` is a regular, executable file that answers `--version`;
/// returns the first line it printed.
pub(crate) fn check(path: &Path, role: Role, timeout: Duration) -> Result<String, HookError> {
    let meta = fs::metadata(path).map_err(|e| unusable(role, path, read_problem(&e)))?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "a device, socket or pipe"
        };
        return Err(unusable(
            role,
            path,
            format!("is not a regular file (it is {kind})"),
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o111 == 0 {
        return Err(unusable(
            role,
            path,
            format!("is not executable (mode {mode:04o})"),
        ));
    }
    run_version(path, timeout).map_err(|problem| unusable(role, path, problem))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Puts `bytes` into `dir` as [`INSTALLED_NAME`], mode 0755, unless that file is
/// exactly that already.
fn install(bytes: &[u8], dir: &Path) -> Result<(PathBuf, Action), HookError> {
    let err = |action, path: &Path| {
        let (dir, path) = (dir.to_owned(), path.to_owned());
        move |source| HookError::Install {
            dir,
            action,
            path,
            source,
        }
    };
    fs::create_dir_all(dir).map_err(err("create", dir))?;
    remove_stale_temps(dir);
    let dest = dir.join(INSTALLED_NAME);
    let existed = match fs::symlink_metadata(&dest) {
        Ok(meta) => {
            if meta.is_file()
                && meta.mode() & 0o7777 == INSTALLED_MODE
                && meta.len() == bytes.len() as u64
                && fs::read(&dest).is_ok_and(|have| have == bytes)
            {
                return Ok((dest, Action::Unchanged));
            }
            true
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(err("inspect", &dest)(e)),
    };
    let tmp = dir.join(temp_name());
    let written = write_synced(&tmp, bytes).map_err(err("write", &tmp));
    let renamed = written.and_then(|()| fs::rename(&tmp, &dest).map_err(err("rename into", &dest)));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("sync", dir))?;
    Ok((
        dest,
        if existed {
            Action::Replaced
        } else {
            Action::Installed
        },
    ))
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(INSTALLED_MODE)
        .open(path)?;
    // The umask may have narrowed the mode given at creation.
    file.set_permissions(Permissions::from_mode(INSTALLED_MODE))?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Unique across processes and pod restarts (in a container the plugin is often
/// pid 1 in every pod, so the pid alone is not).
fn temp_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{TEMP_PREFIX}{}-{nanos}{TEMP_SUFFIX}", std::process::id())
}

/// Removes temporary files that an instance killed while installing left; a
/// recent one may belong to an install in progress (another pod), and stays.
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX)) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if old && fs::remove_file(entry.path()).is_ok() {
            tracing::info!(file = %entry.path().display(), "removed a temporary file a killed install left");
        }
    }
}

#[cfg(test)]
mod tests;
