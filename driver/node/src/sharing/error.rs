//! Why a shared GPU's setting could not be changed.

use std::path::PathBuf;
use std::time::Duration;

/// Why a GPU's sharing setting could not be changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharingError {
    #[error(
        "no nvidia-smi in the driver root {root} (looked for usr/bin/nvidia-smi and bin/nvidia-smi): \
         time-slicing at an interval other than Default needs the driver's tools"
    )]
    NoNvidiaSmi { root: PathBuf },
    #[error("running {program}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {output}")]
    Failed {
        command: String,
        status: String,
        output: String,
    },
    #[error("`{command}` did not finish within {timeout:?}; killed")]
    TimedOut { command: String, timeout: Duration },
    #[error(
        "no nvidia-cuda-mps-control in the driver root {root} (looked for usr/bin and bin): \
         MPS sharing needs the driver's MPS tools"
    )]
    NoMpsControl { root: PathBuf },
    #[error("{path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not under the driver root {root}, so the host cannot run it by its host path"
    )]
    NotUnderRoot { path: PathBuf, root: PathBuf },
    #[error("GPU {gpu}: {mode} is no compute mode (nvml.h numbers them 0 to 3)")]
    BadComputeMode { gpu: String, mode: u32 },
    #[error("GPU {gpu}: {step}: {source}")]
    Nvml {
        gpu: String,
        step: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}

impl SharingError {
    pub(crate) fn nvml(
        gpu: &str,
        step: &'static str,
        source: nvml_wrapper::error::NvmlError,
    ) -> Self {
        Self::Nvml {
            gpu: gpu.to_owned(),
            step,
            source,
        }
    }
}
