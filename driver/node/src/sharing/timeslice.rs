//! The time-slice interval of a GPU, set with the driver's own `nvidia-smi`.
//!
//! NVML has no public call for it; `nvidia-smi compute-policy -i <uuid>
//! --set-timeslice <0-3>` is the interface NVIDIA's tools use (NVIDIA's DRA driver
//! runs exactly this command line). 0 is the driver's default. The setting lives
//! in the kernel driver: it outlives the process that made it and is gone after a
//! reboot or a GPU reset.
//!
//! The `nvidia-smi` is the driver root's: its libraries must be the same driver
//! release as the kernel module, so it runs with the directory of the NVML library
//! the plugin loads on its library path, as on the host.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::SharingError;
use super::process::{lib_dir_of, library_path, wait_within};

/// Where a driver root keeps `nvidia-smi`: `/usr/bin` in the driver packages and
/// the GPU Operator's driver container, `/bin` in a root without merged `/usr`.
const CANDIDATES: &[&str] = &["usr/bin/nvidia-smi", "bin/nvidia-smi"];

/// `nvidia-smi` returns in well under a second on a healthy GPU; one that hangs
/// (a GPU falling off the bus) must not hold a prepare forever.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Sets and resets GPUs' time-slice intervals through the driver root's
/// `nvidia-smi`.
#[derive(Debug, Clone)]
pub struct TimeSlicer {
    program: PathBuf,
    lib_dir: Option<PathBuf>,
    timeout: Duration,
}

impl TimeSlicer {
    /// The `nvidia-smi` of the driver root that this process sees at `root`, run
    /// with `nvml_lib`'s directory on its library path.
    pub fn find(root: &Path, nvml_lib: Option<&Path>) -> Result<Self, SharingError> {
        let program = CANDIDATES
            .iter()
            .map(|c| root.join(c))
            .find(|p| p.is_file())
            .ok_or_else(|| SharingError::NoNvidiaSmi {
                root: root.to_owned(),
            })?;
        Ok(Self::at(program, lib_dir_of(nvml_lib)))
    }

    /// This program as `nvidia-smi`.
    pub fn at(program: PathBuf, lib_dir: Option<PathBuf>) -> Self {
        Self {
            program,
            lib_dir,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same with another time limit per call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets GPU `uuid`'s time slice to `value` (0 = the driver's default).
    pub fn set(&self, uuid: &str, value: u8) -> Result<(), SharingError> {
        let value = value.to_string();
        self.run(&["compute-policy", "-i", uuid, "--set-timeslice", &value])
    }

    fn run(&self, args: &[&str]) -> Result<(), SharingError> {
        let command = format!("nvidia-smi {}", args.join(" "));
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(path) = library_path(self.lib_dir.as_deref()) {
            cmd.env("LD_LIBRARY_PATH", path);
        }
        let mut child = cmd.spawn().map_err(|source| SharingError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        let status = wait_within(&mut child, &self.program, &command, self.timeout)?;
        if status.success() {
            tracing::info!(command = %command, "GPU setting changed");
            return Ok(());
        }
        // The output is small (one line or two): read after exit, no pipe fills.
        let mut output = String::new();
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read>),
        ]
        .into_iter()
        .flatten()
        {
            let mut text = String::new();
            let _ = pipe.take(4096).read_to_string(&mut text);
            output.push_str(text.trim());
            output.push(' ');
        }
        Err(SharingError::Failed {
            command,
            status: status.to_string(),
            output: output.trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests;
