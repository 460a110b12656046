//! A fake `libnvidia-ml.so` for tests on machines without NVIDIA GPUs.
//!
//! Built as a `cdylib`, it exports the NVML C functions topodra uses with
//! the real ABI, so the unmodified `nvml-wrapper` crate can load it with
//! `Nvml::builder().lib_path(..)`. What it reports comes from a machine
//! profile (YAML, see [`profile`]); the same profile renders the matching
//! hwloc XML ([`hwloc_xml::render`]) so NVML and hwloc describe one machine.
//!
//! Which profile a loaded copy uses: the file named by the
//! `TOPODRA_FAKE_NVML_PROFILE` env var if set, else `nvml-profile.yaml` next
//! to the loaded library. Tests use [`install`] to give each test its own
//! copy of the library and profile: separate files are separate instances
//! under the dynamic loader, so tests stay parallel and isolated.

pub mod cdi_hook;
pub mod cpu_sysfs;
pub mod driver_root;
pub mod ffi;
pub mod hwloc_xml;
pub mod profile;
pub mod sim;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

pub use profile::{BusId, Profile, ProfileError, builtin_names, profiles_dir};

/// File name of the built library inside the target directory.
pub const CDYLIB_NAME: &str = "libtopodra_fake_nvml.so";
/// Name [`install`] gives the copy, the soname real NVML is loaded by.
pub const INSTALLED_NAME: &str = "libnvidia-ml.so.1";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_relative() {
                workspace_root().join(d)
            } else {
                d
            }
        }
        _ => workspace_root().join("target"),
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Newest modification time of the sources the library is built from.
fn newest_source() -> Option<SystemTime> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut newest = mtime(&root.join("Cargo.toml")).max(mtime(&root.join("build.rs")));
    let mut stack = vec![root.join("src")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                newest = newest.max(mtime(&p));
            }
        }
    }
    newest
}

/// Path of the built `libtopodra_fake_nvml.so` (debug profile, in
/// `CARGO_TARGET_DIR` or the workspace's `target/`), building it first with
/// `cargo build -p topodra-fake-nvml` when missing or older than the sources.
///
/// # Panics
/// When the build fails: this is test support and there is nothing to fall
/// back to.
pub fn cdylib_path() -> PathBuf {
    // One build per process even when many tests ask at once.
    static BUILD: Mutex<()> = Mutex::new(());
    let _guard = BUILD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);

    let target = target_dir();
    let lib = target.join("debug").join(CDYLIB_NAME);
    let fresh = match (mtime(&lib), newest_source()) {
        (Some(built), Some(src)) => built >= src,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if !fresh {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .arg("build")
            .arg("-p")
            .arg("topodra-fake-nvml")
            .arg("--manifest-path")
            .arg(workspace_root().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!("building topodra-fake-nvml failed: {other:?}"),
        }
        if !lib.exists() {
            panic!(
                "cargo built topodra-fake-nvml but {} is missing",
                lib.display()
            );
        }
    }
    lib
}

/// Copies the library into `dir` as `libnvidia-ml.so.1` and writes
/// `profile_yaml` beside it as `nvml-profile.yaml`; returns the library path
/// to hand to `Nvml::builder().lib_path(..)`.
///
/// # Panics
/// On I/O errors (test support).
pub fn install(dir: &Path, profile_yaml: &str) -> PathBuf {
    let src = cdylib_path();
    let dst = dir.join(INSTALLED_NAME);
    if let Err(e) = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::copy(&src, &dst).map(|_| ()))
        .and_then(|()| std::fs::write(dir.join(ffi::PROFILE_FILE_NAME), profile_yaml))
    {
        panic!("installing fake NVML into {}: {e}", dir.display());
    }
    dst
}
