//! The `nvidia-cdi-hook` a simulated node gives the plugin (`--cdi-hook-source`).
//!
//! In the image the plugin installs NVIDIA's hook from `/usr/bin/nvidia-cdi-hook`.
//! Outside it (tests, `make demo`) there is no such file, so the plugin is pointed at
//! one: NVIDIA's real hook where one is built (`make test` and `make e2e` build it
//! with `tests/tools/build.sh nvidia-ctk` and export its path as
//! [`REAL_HOOK_ENV`]), else a stand-in written here.
//!
//! The stand-in is a shell script, clearly not NVIDIA's: it answers `--version` with
//! [`STAND_IN_VERSION`] (enough for the plugin's start-up check), and for any other
//! arguments (a runtime running a spec's hook) it does nothing but append them, one
//! call a line, to `<script>.calls`, and exit 0. Tests that need the hook to do its
//! work use [`real_hook`] and skip without it.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The environment variable naming NVIDIA's built `nvidia-cdi-hook`.
pub const REAL_HOOK_ENV: &str = "TOPODRA_NVIDIA_CDI_HOOK";
/// The environment variable naming NVIDIA's built `nvidia-ctk`, beside the hook.
pub const REAL_CTK_ENV: &str = "TOPODRA_NVIDIA_CTK";
/// File name of the stand-in in the directory it is written to.
pub const STAND_IN_NAME: &str = "stand-in-nvidia-cdi-hook";
/// What the stand-in prints for `--version`.
pub const STAND_IN_VERSION: &str =
    "topodra test stand-in for nvidia-cdi-hook (not the NVIDIA hook; runs no hook)";

/// NVIDIA's hook named by [`REAL_HOOK_ENV`], when that is set and not empty.
pub fn real_hook() -> Option<PathBuf> {
    std::env::var_os(REAL_HOOK_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Which hook a simulated node was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// NVIDIA's `nvidia-cdi-hook`.
    Real,
    /// The shell script of [`write_stand_in`].
    StandIn,
}

/// Writes the stand-in into `dir` (created if needed) and returns its path.
pub fn write_stand_in(dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(STAND_IN_NAME);
    let script = format!(
        "#!/bin/sh\n\
         # A stand-in for NVIDIA's nvidia-cdi-hook, written by topodra's test support\n\
         # (tests/fake-nvml/src/cdi_hook.rs) where the real hook is not built. It is\n\
         # not NVIDIA's hook and does none of its work: it answers --version, and\n\
         # records any other call in \"$0.calls\".\n\
         if [ \"$1\" = --version ]; then\n\
         \techo '{STAND_IN_VERSION}'\n\
         \texit 0\n\
         fi\n\
         echo \"$*\" >>\"$0.calls\"\n\
         exit 0\n"
    );
    std::fs::write(&path, script)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// NVIDIA's hook when [`REAL_HOOK_ENV`] names one, else the stand-in written into
/// `dir`.
pub fn real_or_stand_in(dir: &Path) -> io::Result<(PathBuf, HookKind)> {
    match real_hook() {
        Some(path) => Ok((path, HookKind::Real)),
        None => Ok((write_stand_in(dir)?, HookKind::StandIn)),
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn the_stand_in_answers_version_and_records_other_calls() {
        let dir = tempfile::tempdir().unwrap();
        let hook = write_stand_in(&dir.path().join("hook")).unwrap();
        let out = Command::new(&hook).arg("--version").output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            STAND_IN_VERSION
        );

        let status = Command::new(&hook)
            .args(["update-ldcache", "--folder", "/usr/lib64"])
            .status()
            .unwrap();
        assert!(status.success());
        let calls =
            std::fs::read_to_string(hook.with_file_name(format!("{STAND_IN_NAME}.calls"))).unwrap();
        assert_eq!(calls, "update-ldcache --folder /usr/lib64\n");
    }

    #[test]
    fn a_simulated_node_passes_its_hook_to_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libtopodra_fake_nvml.so");
        std::fs::write(&lib, b"not a library: materialize only copies it").unwrap();
        let yaml = std::fs::read_to_string(crate::profiles_dir().join("dgx-h100.yaml")).unwrap();
        let sim = crate::sim::materialize(&dir.path().join("sim"), &yaml, &lib).unwrap();
        assert!(
            !sim.plugin_args()
                .iter()
                .any(|a| a.starts_with("--cdi-hook-source="))
        );
        let hook = write_stand_in(dir.path()).unwrap();
        let sim = sim.with_cdi_hook(&hook);
        assert!(
            sim.plugin_args()
                .contains(&format!("--cdi-hook-source={}", hook.display()))
        );
    }
}
