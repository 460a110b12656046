//! Driver capabilities: which of the driver's user-space files a container gets.
//!
//! The classes are the ones `NVIDIA_DRIVER_CAPABILITIES` names (NVIDIA Container
//! Toolkit, "Driver Capabilities"), with the files libnvidia-container assigns to
//! each. A claim gets every class unless its opaque config lists some; files of no
//! class (firmware, the driver's IPC sockets, a library this table does not know)
//! always go in, because leaving out a file a workload needs breaks it while an extra
//! read-only file costs nothing.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One class of driver files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverCapability {
    /// CUDA and OpenCL.
    Compute,
    /// NVML and `nvidia-smi`.
    Utility,
    /// Video encode and decode (NVENC, NVDEC, VDPAU, optical flow).
    Video,
    /// OpenGL, EGL, Vulkan, OptiX.
    Graphics,
    /// DLSS (NGX).
    Ngx,
}

impl DriverCapability {
    pub const ALL: [DriverCapability; 5] = [
        DriverCapability::Compute,
        DriverCapability::Utility,
        DriverCapability::Video,
        DriverCapability::Graphics,
        DriverCapability::Ngx,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DriverCapability::Compute => "compute",
            DriverCapability::Utility => "utility",
            DriverCapability::Video => "video",
            DriverCapability::Graphics => "graphics",
            DriverCapability::Ngx => "ngx",
        }
    }
}

impl fmt::Display for DriverCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The classes a claim's containers get. Never empty: a config that lists none is
/// refused when it is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverCapabilities(BTreeSet<DriverCapability>);

impl Default for DriverCapabilities {
    /// Everything, as the toolkit's generated spec has it.
    fn default() -> Self {
        Self::all()
    }
}

impl DriverCapabilities {
    pub fn all() -> Self {
        Self(DriverCapability::ALL.into_iter().collect())
    }

    /// `None` when `caps` is empty.
    pub fn new(caps: impl IntoIterator<Item = DriverCapability>) -> Option<Self> {
        let set: BTreeSet<_> = caps.into_iter().collect();
        (!set.is_empty()).then_some(Self(set))
    }

    pub fn is_all(&self) -> bool {
        self.0.len() == DriverCapability::ALL.len()
    }

    pub fn contains(&self, cap: DriverCapability) -> bool {
        self.0.contains(&cap)
    }

    /// Whether a file of `class` goes in: always for files of no class.
    pub fn admits(&self, class: Option<DriverCapability>) -> bool {
        class.is_none_or(|c| self.contains(c))
    }

    /// The union of two claims' requests (CDI edits are claim-wide).
    pub fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).copied().collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = DriverCapability> + '_ {
        self.0.iter().copied()
    }
}

impl fmt::Display for DriverCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(DriverCapability::as_str).collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_admit_files_of_no_class() {
        let compute = DriverCapabilities::new([DriverCapability::Compute]).unwrap();
        assert!(compute.admits(Some(DriverCapability::Compute)));
        assert!(!compute.admits(Some(DriverCapability::Graphics)));
        assert!(compute.admits(None));
        assert!(DriverCapabilities::new([]).is_none());
        assert!(DriverCapabilities::default().is_all());
        let both = compute.union(&DriverCapabilities::new([DriverCapability::Utility]).unwrap());
        assert_eq!(both.to_string(), "compute,utility");
    }
}
