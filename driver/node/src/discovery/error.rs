use std::path::PathBuf;

use nvml_wrapper::error::NvmlError;

/// Why discovery could not produce an inventory. Each variant names what is missing
/// or wrong so that an operator can act on the message alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    #[error(
        "NVML library {lib} could not be loaded ({reason}); is the NVIDIA driver installed, \
         and is the library path (--nvml-lib) right?"
    )]
    NvmlLibraryMissing { lib: String, reason: String },

    #[error("NVML failed to initialize: {0}; is the NVIDIA kernel module loaded?")]
    NvmlInit(#[source] NvmlError),

    #[error("NVML {call} failed: {source}")]
    Nvml {
        call: String,
        #[source]
        source: NvmlError,
    },

    #[error("hwloc topology file {}: {reason}", path.display())]
    HwlocXml { path: PathBuf, reason: String },

    /// Boxed because each hwloc call has an error type of its own.
    #[error("hwloc could not load the topology: {0}")]
    Hwloc(#[source] Box<dyn std::error::Error + Send + Sync>),

    #[error("sysfs at {}: {reason}", path.display())]
    Sysfs { path: PathBuf, reason: String },

    #[error(
        "the topology ({source_name}) names no NVIDIA GPUs and NVML is not available, so there is nothing to list"
    )]
    NoGpus { source_name: String },
}
