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
//! for another architecture, or one whose C library is missing, fails that check,
//! and the plugin does not start: a spec whose hooks cannot run would fail every
//! container that uses the claim, far from the cause.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

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
/// What of the hook's `--version` output is read.
const OUTPUT_LIMIT: u64 = 64 * 1024;

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
            check(source, Role::Source, timeout)?;
            let bytes =
                fs::read(source).map_err(|e| unusable(Role::Source, source, read_problem(&e)))?;
            let (path, action) = install(&bytes, plugin_dir)?;
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

/// Runs `<path> --version` with an empty environment (the runtime gives a hook
/// only what the spec says) and returns the first non-empty line of its output.
fn run_version(path: &Path, timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(path)
        .arg("--version")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_problem(&e))?;
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "did not answer `--version` within {} ms (killed)",
                    timeout.as_millis()
                ));
            }
            Err(e) => return Err(format!("could not be waited for ({e})")),
        }
    };
    // A child of the hook that keeps the pipes open must not hold the start up.
    let collect = |rx: mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(Duration::from_secs(1))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let (out, err) = (collect(stdout), collect(stderr));
    if !status.success() {
        return Err(format!(
            "failed to run `--version` ({}){}",
            describe_status(status),
            excerpt(&err, &out)
        ));
    }
    out.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "printed nothing for `--version` (is it nvidia-cdi-hook?){}",
                excerpt(&err, "")
            )
        })
}

fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.take(OUTPUT_LIMIT).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    rx
}

/// Why the kernel refused to start it, in the terms of the likely cause.
fn spawn_problem(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOEXEC) => {
            format!("is not a program this machine can run ({e}): built for another architecture?")
        }
        // The file exists (checked before), so what is missing is its program
        // interpreter: the dynamic loader of another architecture or C library.
        Some(libc::ENOENT) => format!(
            "cannot be started ({e}): its dynamic loader is missing, so it is built for \
             another architecture or C library"
        ),
        Some(libc::EACCES) => {
            format!("cannot be started ({e}): is its file system mounted noexec?")
        }
        _ => format!("cannot be started ({e})"),
    }
}

fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// ": <the first lines of what it printed>", preferring stderr.
fn excerpt(stderr: &str, stdout: &str) -> String {
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(3)
        .collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(": {}", lines.join(" / "))
    }
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
mod tests {
    //! The hook here is a stand-in: a tiny shell script that answers `--version` the
    //! way NVIDIA's does (one line), so that the copy and check logic is tested
    //! without the real binary. The real one is exercised by the integration and
    //! end-to-end tests (TOPODRA_NVIDIA_CDI_HOOK).

    use std::os::unix::fs::symlink;

    use super::*;

    const SHORT: Duration = Duration::from_secs(5);

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A stand-in for nvidia-cdi-hook (a shell script, not NVIDIA's binary).
    fn stand_in(dir: &Path, version: &str) -> PathBuf {
        script(
            dir,
            "stand-in-hook",
            &format!("[ \"$1\" = --version ] && echo 'stand-in hook version {version}'"),
        )
    }

    fn setup(source: &Path, plugin_dir: &Path) -> HookSetup {
        HookSetup::Install {
            source: source.to_owned(),
            plugin_dir: plugin_dir.to_owned(),
        }
    }

    fn prep(s: &HookSetup) -> Result<Hook, HookError> {
        prepare_with_timeout(s, SHORT)
    }

    fn unusable_problem(e: HookError) -> (Role, String) {
        match e {
            HookError::Unusable { role, problem, .. } => (role, problem),
            other => panic!("want Unusable, got {other:?}"),
        }
    }

    #[test]
    fn installs_a_copy_and_names_it() {
        let tmp = tempfile::tempdir().unwrap();
        let source = stand_in(tmp.path(), "1.0");
        let plugin_dir = tmp.path().join("plugins/gpu.topodra.dev");
        let hook = prep(&setup(&source, &plugin_dir)).unwrap();

        assert_eq!(hook.path, plugin_dir.join("nvidia-cdi-hook"));
        assert_eq!(hook.action, Action::Installed);
        assert_eq!(hook.version, "stand-in hook version 1.0");
        let bytes = fs::read(&source).unwrap();
        assert_eq!(fs::read(&hook.path).unwrap(), bytes);
        assert_eq!(hook.sha256, sha256_hex(&bytes));
        assert_eq!(hook.sha256.len(), 64);
        let mode = fs::metadata(&hook.path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        // Nothing but the hook is left in the directory.
        let names: Vec<_> = fs::read_dir(&plugin_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["nvidia-cdi-hook"]);
    }

    #[test]
    fn the_same_bytes_are_not_written_again() {
        let tmp = tempfile::tempdir().unwrap();
        let source = stand_in(tmp.path(), "1.0");
        let s = setup(&source, tmp.path());
        let first = prep(&s).unwrap();
        let inode = fs::metadata(&first.path).unwrap().ino();
        let again = prep(&s).unwrap();
        assert_eq!(again.action, Action::Unchanged);
        assert_eq!(again.sha256, first.sha256);
        assert_eq!(fs::metadata(&again.path).unwrap().ino(), inode);
    }

    #[test]
    fn other_bytes_or_another_mode_are_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let source = stand_in(tmp.path(), "1.0");
        let s = setup(&source, &tmp.path().join("p"));
        let first = prep(&s).unwrap();

        // A new image brings another hook.
        stand_in(tmp.path(), "2.0");
        let second = prep(&s).unwrap();
        assert_eq!(second.action, Action::Replaced);
        assert_eq!(second.version, "stand-in hook version 2.0");
        assert_ne!(second.sha256, first.sha256);
        assert_eq!(fs::read(&second.path).unwrap(), fs::read(&source).unwrap());

        // Same bytes, but someone made the copy writable by all.
        fs::set_permissions(&second.path, Permissions::from_mode(0o777)).unwrap();
        let third = prep(&s).unwrap();
        assert_eq!(third.action, Action::Replaced);
        let mode = fs::metadata(&third.path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
    }

    #[test]
    fn a_symlink_or_directory_in_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let source = stand_in(tmp.path(), "1.0");
        let dir = tmp.path().join("p");
        fs::create_dir_all(&dir).unwrap();
        // A link (to the very same bytes) is replaced by a file of our own.
        symlink(&source, dir.join(INSTALLED_NAME)).unwrap();
        let hook = prep(&setup(&source, &dir)).unwrap();
        assert_eq!(hook.action, Action::Replaced);
        assert!(fs::symlink_metadata(&hook.path).unwrap().is_file());

        // A directory cannot be renamed over: a clear error naming it.
        let dir2 = tmp.path().join("q");
        fs::create_dir_all(dir2.join(INSTALLED_NAME).join("x")).unwrap();
        let err = prep(&setup(&source, &dir2)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, HookError::Install { .. }), "{msg}");
        assert!(
            msg.contains(&dir2.join(INSTALLED_NAME).display().to_string()),
            "{msg}"
        );
        // And no temporary file is left behind.
        let left: Vec<_> = fs::read_dir(&dir2)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, [INSTALLED_NAME]);
    }

    #[test]
    fn a_missing_source_is_a_start_up_error_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope/nvidia-cdi-hook");
        let plugin_dir = tmp.path().join("p");
        let err = prep(&setup(&missing, &plugin_dir)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
        assert!(msg.contains("does not exist"), "{msg}");
        assert!(msg.contains("--cdi-hook-source"), "{msg}");
        assert!(msg.contains("kubeletPlugin.cdiHook.hostPath"), "{msg}");
        assert_eq!(unusable_problem(err).0, Role::Source);
        // Nothing was installed.
        assert!(!plugin_dir.join(INSTALLED_NAME).exists());
    }

    #[test]
    fn a_directory_or_a_non_executable_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (role, problem) =
            unusable_problem(prep(&setup(tmp.path(), &tmp.path().join("p"))).unwrap_err());
        assert_eq!(role, Role::Source);
        assert!(problem.contains("not a regular file"), "{problem}");

        let source = stand_in(tmp.path(), "1.0");
        fs::set_permissions(&source, Permissions::from_mode(0o644)).unwrap();
        let err = prep(&setup(&source, &tmp.path().join("p"))).unwrap_err();
        assert!(
            err.to_string().contains("not executable (mode 0644)"),
            "{err}"
        );
    }

    #[test]
    fn a_hook_that_fails_or_says_nothing_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let failing = script(
            tmp.path(),
            "failing",
            "echo 'version `GLIBC_2.34'\"'\"' not found' >&2; exit 127",
        );
        let err = prep(&setup(&failing, &tmp.path().join("p"))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("exit status 127"), "{msg}");
        assert!(msg.contains("GLIBC_2.34"), "{msg}");

        let silent = script(tmp.path(), "silent", "exit 0");
        let err = prep(&setup(&silent, &tmp.path().join("p"))).unwrap_err();
        assert!(err.to_string().contains("printed nothing"), "{err}");

        // A broken source does not replace a copy that works.
        let working = prep(&setup(&stand_in(tmp.path(), "1.0"), &tmp.path().join("w"))).unwrap();
        let before = fs::read(&working.path).unwrap();
        prep(&setup(&failing, &tmp.path().join("w"))).unwrap_err();
        assert_eq!(fs::read(&working.path).unwrap(), before);
    }

    #[test]
    fn a_hook_that_hangs_is_killed_after_the_timeout() {
        let tmp = tempfile::tempdir().unwrap();
        let hanging = script(tmp.path(), "hanging", "exec sleep 30");
        let started = Instant::now();
        let err = prepare_with_timeout(
            &setup(&hanging, &tmp.path().join("p")),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(err.to_string().contains("within 300 ms"), "{err}");
    }

    /// A binary for another architecture: this machine's /bin/sh with another ELF
    /// machine number, which the kernel refuses to load.
    #[test]
    fn a_binary_for_another_architecture_is_refused() {
        let Ok(mut elf) = fs::read("/bin/sh") else {
            return;
        };
        if elf.len() < 20 || &elf[..4] != b"\x7fELF" {
            return;
        }
        // e_machine (little-endian on both platforms we build for): x86-64 62,
        // AArch64 183; pick the one this machine is not.
        let other: u16 = if cfg!(target_arch = "aarch64") {
            62
        } else {
            183
        };
        elf[18..20].copy_from_slice(&other.to_le_bytes());
        let tmp = tempfile::tempdir().unwrap();
        let foreign = tmp.path().join("foreign-hook");
        fs::write(&foreign, &elf).unwrap();
        fs::set_permissions(&foreign, Permissions::from_mode(0o755)).unwrap();
        let err = prep(&setup(&foreign, &tmp.path().join("p"))).unwrap_err();
        let (role, problem) = unusable_problem(err);
        assert_eq!(role, Role::Source);
        // Refused by the kernel (ENOEXEC); a libc that retries such a file with
        // /bin/sh gets a failed run instead. Either way: not usable.
        assert!(
            problem.contains("another architecture") || problem.contains("failed to run"),
            "{problem}"
        );
    }

    #[test]
    fn a_host_hook_is_named_as_it_is_and_nothing_is_installed() {
        let tmp = tempfile::tempdir().unwrap();
        let host = stand_in(tmp.path(), "1.20.2");
        let hook = prep(&HookSetup::Host { path: host.clone() }).unwrap();
        assert_eq!(hook.path, host);
        assert_eq!(hook.action, Action::HostHook);
        assert_eq!(hook.version, "stand-in hook version 1.20.2");
        assert_eq!(hook.sha256, sha256_hex(&fs::read(&host).unwrap()));

        let missing = tmp.path().join("usr/bin/nvidia-cdi-hook");
        let err = prep(&HookSetup::Host {
            path: missing.clone(),
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
        assert!(msg.contains("NVIDIA Container Toolkit"), "{msg}");
        assert!(msg.contains("--cdi-hook-host-path"), "{msg}");
        assert_eq!(unusable_problem(err).0, Role::Host);
    }

    #[test]
    fn stale_temporary_files_are_removed_and_recent_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        fs::create_dir_all(&dir).unwrap();
        let stale = dir.join(".nvidia-cdi-hook.1-1.tmp");
        let recent = dir.join(".nvidia-cdi-hook.1-2.tmp");
        let other = dir.join("checkpoint.json.tmp");
        for p in [&stale, &recent, &other] {
            fs::write(p, b"x").unwrap();
        }
        let old = SystemTime::now() - Duration::from_secs(2 * 3600);
        File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(old)
            .unwrap();
        prep(&setup(&stand_in(tmp.path(), "1.0"), &dir)).unwrap();
        assert!(!stale.exists());
        assert!(recent.exists());
        assert!(other.exists());
    }
}
