//! CDI specs for prepared claims: what a container runtime injects into a container
//! that uses one of our GPUs.
//!
//! Prepare builds one spec per claim with [`claim_spec`] and writes it with
//! [`SpecWriter`]; the kubelet gets back the `CdiKind::device_id`s and passes them to the
//! runtime, which looks them up in the spec directory. Unprepare removes the file;
//! `SpecWriter::list_owned` finds files no claim owns any more.
//!
//! - `spec`: the CDI document model (JSON field names of the CDI specification).
//! - `version`: the lowest `cdiVersion` a spec's fields require; every generated
//!   spec carries exactly that.
//! - `nodes`: device numbers of `/dev/nvidia*`, behind the [`DeviceNodes`] trait.
//! - `nvidia_files`: the driver's libraries, tools, firmware and sockets to
//!   bind-mount, discovered under a driver root or adopted from an NVIDIA Container
//!   Toolkit spec.
//! - `hooks`: the `nvidia-cdi-hook` hooks that make them usable in any image.
//! - `capabilities`: which classes of driver files (compute, video, ...) a claim gets.
//! - `elf`: the soname of a driver library.
//! - `claim`: the spec of one claim.
//! - `writer`: atomic files in the spec directory.
//! - `validate`: the rules runtimes apply when loading a spec.
//!
//! Typical use:
//!
//! ```no_run
//! # fn main() -> Result<(), topodra_node::cdi::CdiError> {
//! use topodra_node::cdi::*;
//! let config = CdiConfig::default();
//! let driver = NvidiaFiles::load(&config)?; // once at startup, or on driver change
//! let nodes = config.device_nodes();
//! let kind = CdiKind::for_driver("gpu.topodra.dev");
//! let writer = SpecWriter::new(&config.spec_dir, kind.clone());
//! # let gpus = vec![];
//! let req = ClaimSpecRequest {
//!     claim_uid: "0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c".into(),
//!     claim_namespace: "team-a".into(),
//!     claim_name: "train".into(),
//!     gpus, // ClaimGpu::from_gpu(&inventory_gpu)? for each allocated device
//!     env_hints: true,
//!     kind,
//!     capabilities: DriverCapabilities::all(), // or the claim's config's
//! };
//! let spec = claim_spec(&req, &nodes, &driver)?;
//! writer.write(&req.claim_uid, &spec)?;
//! let cdi_ids = req.cdi_device_ids(); // returned to the kubelet
//! # let _ = cdi_ids; Ok(()) }
//! ```

pub(crate) mod capabilities;
pub(crate) mod claim;
pub(crate) mod elf;
pub(crate) mod hooks;
pub(crate) mod host_check;
pub(crate) mod nodes;
pub(crate) mod nvidia_files;
pub(crate) mod spec;
pub(crate) mod validate;
pub(crate) mod version;
pub(crate) mod writer;

use std::io;
use std::path::PathBuf;

pub use capabilities::{DriverCapabilities, DriverCapability};
pub use claim::{ClaimGpu, ClaimSpecRequest, claim_spec, timeslice_value};
pub use host_check::{HostNodeProblem, host_node_problems};
pub use nodes::{
    DEFAULT_CAPABILITIES_DIR, DeviceNodes, DriNodes, HostDeviceNodes, NodeInfo, NodeKind,
    NodeOwner, TableDeviceNodes,
};
pub use nvidia_files::{DriverFiles, NvidiaFiles, NvidiaFilesSource};
pub use spec::{ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
pub use validate::Problems;
pub use writer::{DEFAULT_SPEC_DIR, SpecWriter};

pub(crate) use claim::{
    ANNOTATION_CLAIM_NAME, ANNOTATION_CLAIM_NAMESPACE, ANNOTATION_COMPUTE_PERCENT,
    ANNOTATION_GPU_UUID, ANNOTATION_MEMORY_BYTES, ANNOTATION_MPS_PIPE_DIR,
    ANNOTATION_PRIOR_COMPUTE_MODE, ANNOTATION_REQUESTS, ANNOTATION_SHARE_ID, ANNOTATION_SHARED_GPU,
    ANNOTATION_SHARING, ANNOTATION_TIMESLICE,
};
#[cfg(test)]
pub(crate) use nodes::TABLE_CAPS_MAJOR;
pub(crate) use nvidia_files::NvidiaRoot;
pub(crate) use validate::validate;

/// The CDI kind of one installation's claim specs: `k8s.<driver name>/claim`.
///
/// Derived from the DRA driver name, so two installations with different driver
/// names on one node (a canary beside the stable one, say) write specs of different
/// kinds under different file names, and each one's cleanup only ever sees its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiKind {
    vendor: String,
}

/// The spec class: one spec per prepared claim.
const CDI_CLASS: &str = "claim";

impl CdiKind {
    pub fn for_driver(driver_name: &str) -> Self {
        Self {
            vendor: format!("k8s.{driver_name}"),
        }
    }

    /// `vendor/class`, as the spec's `kind` field and the CDI ids spell it.
    pub(crate) fn kind(&self) -> String {
        format!("{}/{CDI_CLASS}", self.vendor)
    }

    /// The fully qualified CDI id the kubelet passes to the runtime:
    /// `k8s.gpu.topodra.dev/claim=<claimUID>-<deviceName>`.
    pub(crate) fn device_id(&self, claim_uid: &str, device: &str) -> String {
        format!("{}={}", self.kind(), cdi_device_name(claim_uid, device))
    }

    /// `<vendor>-<class>_`: the CDI convention's file name prefix for transient specs.
    pub(crate) fn file_prefix(&self) -> String {
        format!("{}-{CDI_CLASS}_", self.vendor)
    }
}

impl Default for CdiKind {
    /// The kind of the default driver name, `gpu.topodra.dev`.
    fn default() -> Self {
        Self::for_driver(topodra_model::slice::DEFAULT_DRIVER_NAME)
    }
}

/// The CDI device name of one allocated device: `<claimUID>-<deviceName>`.
pub(crate) fn cdi_device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// Where specs go and where the driver's files and device nodes are.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CdiConfig {
    /// The CDI spec directory runtimes read (default `/var/run/cdi`).
    pub spec_dir: PathBuf,
    /// The driver root as the host sees it: `/`, or `/run/nvidia/driver` for a
    /// containerized driver. Mount sources in specs are under it.
    pub driver_root: PathBuf,
    /// Where this process sees `driver_root`, when the plugin runs in a container
    /// that mounts it elsewhere (e.g. `/driver-root`); `None` means the same path.
    pub driver_root_local: Option<PathBuf>,
    /// A toolkit-generated CDI spec (e.g. `/var/run/cdi/nvidia.yaml`) whose mounts,
    /// hooks and env replace our own file discovery when the file exists.
    pub toolkit_spec: Option<PathBuf>,
    /// The directory holding the host's `dev/` as this process sees it (default `/`).
    pub dev_root: PathBuf,
    /// Where the driver lists MIG capability minors
    /// (`/proc/driver/nvidia/capabilities`).
    pub capabilities_dir: PathBuf,
    /// sysfs as this process sees it, where the GPUs' DRM devices are listed.
    pub sysfs_root: PathBuf,
    /// The `nvidia-cdi-hook` binary the runtime runs for the spec's hooks, as a path
    /// on the host (the runtime runs it, not this process).
    pub hook_path: PathBuf,
}

/// Where the NVIDIA Container Toolkit installs `nvidia-cdi-hook` on a host.
pub const DEFAULT_HOOK_PATH: &str = "/usr/bin/nvidia-cdi-hook";

impl Default for CdiConfig {
    fn default() -> Self {
        Self {
            spec_dir: PathBuf::from(DEFAULT_SPEC_DIR),
            driver_root: PathBuf::from("/"),
            driver_root_local: None,
            toolkit_spec: None,
            dev_root: PathBuf::from("/"),
            capabilities_dir: PathBuf::from(nodes::DEFAULT_CAPABILITIES_DIR),
            hook_path: PathBuf::from(DEFAULT_HOOK_PATH),
            sysfs_root: PathBuf::from("/sys"),
        }
    }
}

impl CdiConfig {
    pub(crate) fn driver_root(&self) -> NvidiaRoot {
        NvidiaRoot {
            host: self.driver_root.clone(),
            local: self
                .driver_root_local
                .clone()
                .unwrap_or_else(|| self.driver_root.clone()),
        }
    }

    pub fn device_nodes(&self) -> HostDeviceNodes {
        HostDeviceNodes::new(&self.dev_root)
            .with_capabilities_dir(&self.capabilities_dir)
            .with_sysfs_root(&self.sysfs_root)
    }
}

/// Why a claim's spec could not be built, written or removed. Paths are included so
/// the message alone says where to look.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiError {
    #[error(
        "claim UID {uid:?} cannot name a CDI spec: expected letters, digits and dashes, \
         starting and ending with a letter or digit"
    )]
    InvalidClaimUid { uid: String },

    #[error("claim {claim_uid} has no devices to put in a CDI spec")]
    NoDevices { claim_uid: String },

    #[error("device {device} appears twice in one claim")]
    DuplicateDevice { device: String },

    #[error(
        "GPU {device} has no device minor (NVML did not describe it), so it has no /dev/nvidia node to hand out"
    )]
    GpuWithoutMinor { device: String },

    #[error(
        "device node {path} does not exist and its driver is not registered in /proc/devices: \
         the NVIDIA kernel module{} is not loaded. On the host, `nvidia-modprobe -u -c=0` loads \
         nvidia and nvidia-uvm and creates their nodes (`modprobe nvidia-uvm` loads it only)",
        if path.contains("uvm") { " nvidia-uvm" } else { "" }
    )]
    MissingDeviceNode { path: String },

    #[error("device node {}: {source}", path.display())]
    DeviceNode { path: PathBuf, source: io::Error },

    #[error("{} is not a device node", path.display())]
    NotADeviceNode { path: PathBuf },

    #[error("driver root {}: {source}", path.display())]
    NvidiaRoot { path: PathBuf, source: io::Error },

    #[error(
        "no NVIDIA driver libraries {} under driver root {}; is the driver root right?",
        missing.join(", "), root.display()
    )]
    NvidiaFilesMissing { root: PathBuf, missing: Vec<String> },

    /// `source` is the read or parse error, when there is one (`reason` already says
    /// it, without a parser's source snippet).
    #[error("toolkit CDI spec {}: {reason}", path.display())]
    ToolkitSpec {
        path: PathBuf,
        reason: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    #[error("the CDI spec for claim {claim_uid} would be refused by runtimes: {problems}")]
    InvalidSpec {
        claim_uid: String,
        problems: Problems,
    },

    #[error("cannot serialize CDI spec: {0}")]
    Serialize(serde_json::Error),

    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// A claim UID goes into a file name and device names, so only the characters of a
/// Kubernetes UID are accepted: nothing that could leave the spec directory or break
/// a CDI name.
pub(crate) fn check_claim_uid(uid: &str) -> Result<(), CdiError> {
    let ok = !uid.is_empty()
        && uid.len() <= 128
        && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && uid.starts_with(|c: char| c.is_ascii_alphanumeric())
        && uid.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(CdiError::InvalidClaimUid {
            uid: uid.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids() {
        let uid = "0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c";
        assert_eq!(
            CdiKind::default().device_id(uid, "gpu-3"),
            "k8s.gpu.topodra.dev/claim=0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c-gpu-3"
        );
        assert_eq!(
            SpecWriter::new("/var/run/cdi", CdiKind::default()).path_for(uid),
            PathBuf::from(
                "/var/run/cdi/k8s.gpu.topodra.dev-claim_0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c.json"
            )
        );
        let canary = CdiKind::for_driver("canary.gpu.example.com");
        assert_eq!(canary.kind(), "k8s.canary.gpu.example.com/claim");
        assert_eq!(canary.file_prefix(), "k8s.canary.gpu.example.com-claim_");
        assert!(check_claim_uid(uid).is_ok());
        assert!(check_claim_uid(&"a".repeat(129)).is_err());
    }

    #[test]
    fn config_defaults_and_driver_root_views() {
        let c = CdiConfig::default();
        assert_eq!(c.spec_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(c.driver_root(), NvidiaRoot::new("/"));
        let c = CdiConfig {
            driver_root: "/run/nvidia/driver".into(),
            driver_root_local: Some("/driver-root".into()),
            ..CdiConfig::default()
        };
        let r = c.driver_root();
        assert_eq!(r.host, PathBuf::from("/run/nvidia/driver"));
        assert_eq!(r.local, PathBuf::from("/driver-root"));
    }
}
