//! Running the driver's tools with a time limit.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use super::SharingError;

/// Waits for `child` (`command`, run from `program`) to exit, for at most
/// `timeout`: a tool that hangs (a GPU falling off the bus) must not hold a prepare
/// forever. Past the limit it is killed and reaped, so no zombie is left behind.
pub(super) fn wait_within(
    child: &mut Child,
    program: &Path,
    command: &str,
    timeout: Duration,
) -> Result<ExitStatus, SharingError> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if started.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SharingError::TimedOut {
                    command: command.to_owned(),
                    timeout,
                });
            }
            Err(source) => {
                return Err(SharingError::Spawn {
                    program: program.to_owned(),
                    source,
                });
            }
        }
    }
}

/// The directory of `nvml_lib` when it is a path
/// (`/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`); `None` for a bare
/// soname the dynamic loader finds on its own (the chart's default, which sets
/// `LD_LIBRARY_PATH` for the plugin instead).
pub(super) fn lib_dir_of(nvml_lib: Option<&Path>) -> Option<PathBuf> {
    nvml_lib
        .and_then(Path::parent)
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_owned)
}

/// `LD_LIBRARY_PATH` for a tool run in this process's namespaces: `dir` first,
/// then this process's own, so the driver's libraries are found as they are for
/// the plugin; `None` when there is neither.
pub(super) fn library_path(dir: Option<&Path>) -> Option<OsString> {
    let own = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty());
    match (dir, own) {
        (Some(d), Some(own)) => {
            let mut path = OsString::from(d);
            path.push(":");
            path.push(own);
            Some(path)
        }
        (Some(d), None) => Some(d.into()),
        (None, own) => own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_soname_has_no_directory() {
        assert_eq!(lib_dir_of(Some(Path::new("libnvidia-ml.so.1"))), None);
        assert_eq!(lib_dir_of(None), None);
        assert_eq!(
            lib_dir_of(Some(Path::new("/driver-root/usr/lib/libnvidia-ml.so.1"))),
            Some(PathBuf::from("/driver-root/usr/lib"))
        );
    }
}
