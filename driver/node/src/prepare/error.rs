use crate::cdi::CdiError;
use crate::checkpoint::CheckpointError;
use crate::dynamic_mig::CarveError;
use topodra_model::checkpoint::{ClaimIdentity, DeviceInUse, TransitionError};
use topodra_model::config::ConfigError;

/// Why one claim could not be prepared or unprepared. The message goes into that
/// claim's answer to the kubelet (and from there into the pod's events), so each
/// variant says what is wrong with which object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    #[error(
        "claim {namespace}/{name}: UID is {found}, the kubelet asked for {expected}; the claim was replaced"
    )]
    UidMismatch {
        namespace: String,
        name: String,
        expected: String,
        found: String,
    },

    #[error("claim {namespace}/{name} is not allocated")]
    NotAllocated { namespace: String, name: String },

    #[error("claim {namespace}/{name} has no device of driver {driver}")]
    NoDevicesForDriver {
        namespace: String,
        name: String,
        driver: String,
    },

    #[error(
        "claim {namespace}/{name}: device {device} is allocated from pool {pool}, but this is node {node}; \
         the claim belongs to another node"
    )]
    WrongPool {
        namespace: String,
        name: String,
        pool: String,
        device: String,
        node: String,
    },

    #[error(
        "claim {namespace}/{name}: device {device} is not a GPU of this node (lost, or removed since the slice was published)"
    )]
    UnknownDevice {
        namespace: String,
        name: String,
        device: String,
    },

    #[error("claim {namespace}/{name}: invalid device config: {source}")]
    Config {
        namespace: String,
        name: String,
        #[source]
        source: ConfigError,
    },

    #[error("claim {namespace}/{name}: {what} is not supported by this version of the plugin")]
    Unsupported {
        namespace: String,
        name: String,
        what: String,
    },

    #[error(
        "claim {namespace}/{name}: config requires NUMA-aligned GPUs, but the allocation spans NUMA nodes {nodes}; \
         add a matchAttribute constraint on resource.kubernetes.io/numaNode"
    )]
    NotAligned {
        namespace: String,
        name: String,
        nodes: String,
    },

    /// Another claim's record holds one of the devices; the message names it.
    #[error(transparent)]
    DeviceInUse(Box<DeviceInUse>),

    /// A fault of the plugin itself (a checkpoint transition its own code should
    /// never ask for), not of the claim: the user can only retry and report it.
    #[error(
        "claim {namespace}/{name}: internal error of the plugin: {source}; \
         retry by recreating the pod, and report this with the plugin's logs"
    )]
    Internal {
        namespace: String,
        name: String,
        #[source]
        source: TransitionError,
    },

    #[error("writing the CDI spec: {0}")]
    Cdi(#[from] CdiError),

    /// Making or removing a dynamic MIG instance failed; a prepare rolled back
    /// what it had made.
    #[error("claim {namespace}/{name}: MIG instance of {device}: {source}")]
    Mig {
        namespace: String,
        name: String,
        device: String,
        /// Boxed: NVML's errors are large, and this variant is rare.
        #[source]
        source: Box<CarveError>,
    },

    #[error(
        "claim {namespace}/{name}: device {device} is a dynamic MIG partition, but this plugin has no NVML to make or remove its instance"
    )]
    NoCarver {
        namespace: String,
        name: String,
        device: String,
    },

    #[error(
        "claim {namespace}/{name}: device {device} is shared, but its allocation has no shareID; \
         the scheduler sets one for every share (DRAConsumableCapacity), so the claim was allocated without it"
    )]
    NoShareId {
        namespace: String,
        name: String,
        device: String,
    },

    /// Setting or resetting a shared GPU's time slice failed; a prepare rolled
    /// back, an unprepare keeps the record for the kubelet's retry.
    #[error("claim {namespace}/{name}: time slice of {device}: {source}")]
    Sharing {
        namespace: String,
        name: String,
        device: String,
        /// Boxed: the error carries the command's output, and this variant is rare.
        #[source]
        source: Box<crate::sharing::SharingError>,
    },

    #[error(
        "claim {namespace}/{name}: device {device} runs at time slice {interval}, but this plugin has no nvidia-smi to set it ({why})"
    )]
    NoTimeSlicer {
        namespace: String,
        name: String,
        device: String,
        interval: String,
        why: String,
    },

    #[error(
        "claim {namespace}/{name}: device {device} is an MPS share, but this plugin has no MPS control \
         (nvidia-cuda-mps-control in the driver root, and NVML) to run its daemon"
    )]
    NoMpsControl {
        namespace: String,
        name: String,
        device: String,
    },

    #[error("recording the claim in the checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),

    /// This process gave the node's state to another instance (a rolling update):
    /// it may no longer write it. The kubelet retries, and reaches the new owner.
    #[error(
        "this plugin instance handed the node state over to {to}; retry reaches the new instance"
    )]
    HandedOver { to: String },

    /// The plugin could not take ownership of its state directory and serves
    /// read-only: known claims can be unprepared, nothing new prepared.
    #[error(
        "the plugin's state directory is unusable ({reason}); no claim can be prepared on this node until it is fixed"
    )]
    StateUnusable { reason: String },

    /// Only from a crash point set for fault-injection tests: the process stopped
    /// here on purpose, leaving state as a crash would.
    #[cfg(feature = "crash-points")]
    #[error("stopped at crash point {0:?}")]
    Crashed(super::CrashPoint),
}

impl ClaimError {
    /// What kind of failure this is, for metrics labels.
    pub fn kind(&self) -> ClaimErrorKind {
        match self {
            Self::UidMismatch { .. } => ClaimErrorKind::UidMismatch,
            Self::NotAllocated { .. } => ClaimErrorKind::NotAllocated,
            Self::NoDevicesForDriver { .. } => ClaimErrorKind::NoDevices,
            Self::WrongPool { .. } => ClaimErrorKind::WrongNode,
            Self::UnknownDevice { .. } => ClaimErrorKind::UnknownDevice,
            Self::Config { .. } => ClaimErrorKind::Config,
            Self::Unsupported { .. } => ClaimErrorKind::Unsupported,
            Self::NotAligned { .. } => ClaimErrorKind::NotAligned,
            Self::DeviceInUse(_) => ClaimErrorKind::DeviceInUse,
            Self::Internal { .. } => ClaimErrorKind::Internal,
            Self::Cdi(_) => ClaimErrorKind::Cdi,
            Self::Mig { source, .. } if source.is_conflict() => ClaimErrorKind::MigConflict,
            Self::Mig { .. } | Self::NoCarver { .. } => ClaimErrorKind::Mig,
            Self::NoShareId { .. } => ClaimErrorKind::Unsupported,
            Self::Sharing { .. } | Self::NoTimeSlicer { .. } | Self::NoMpsControl { .. } => {
                ClaimErrorKind::Sharing
            }
            Self::Checkpoint(_) => ClaimErrorKind::Checkpoint,
            Self::HandedOver { .. } => ClaimErrorKind::HandedOver,
            Self::StateUnusable { .. } => ClaimErrorKind::StateUnusable,
            #[cfg(feature = "crash-points")]
            Self::Crashed(_) => ClaimErrorKind::Crashed,
        }
    }

    /// A refused checkpoint transition of `claim`: in use is the claim's problem,
    /// anything else the plugin's.
    pub(crate) fn transition(claim: &ClaimIdentity, error: TransitionError) -> Self {
        match error {
            TransitionError::DeviceInUse(e) => Self::DeviceInUse(e),
            source => Self::Internal {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                source,
            },
        }
    }
}

/// The kinds of [`ClaimError`], named as the `claim_errors` metric labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimErrorKind {
    UidMismatch,
    NotAllocated,
    NoDevices,
    WrongNode,
    UnknownDevice,
    Config,
    Unsupported,
    NotAligned,
    DeviceInUse,
    Internal,
    Cdi,
    /// NVML could not make or remove a MIG instance.
    Mig,
    /// The instance's memory slices were taken (NVML or the record of another
    /// claim): the allocation no longer fits the GPU.
    MigConflict,
    /// A shared GPU's setting (its time slice) could not be changed.
    Sharing,
    Checkpoint,
    HandedOver,
    StateUnusable,
    /// A crash point of a crash test (feature `crash-points`).
    Crashed,
}

impl ClaimErrorKind {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UidMismatch => "uid_mismatch",
            Self::NotAllocated => "not_allocated",
            Self::NoDevices => "no_devices",
            Self::WrongNode => "wrong_node",
            Self::UnknownDevice => "unknown_device",
            Self::Config => "config",
            Self::Unsupported => "unsupported",
            Self::NotAligned => "not_aligned",
            Self::DeviceInUse => "device_in_use",
            Self::Internal => "internal",
            Self::Cdi => "cdi",
            Self::Mig => "mig",
            Self::MigConflict => "mig_conflict",
            Self::Sharing => "sharing",
            Self::Checkpoint => "checkpoint",
            Self::HandedOver => "handed_over",
            Self::StateUnusable => "state_unusable",
            Self::Crashed => "crashed",
        }
    }
}

/// Why the state machine could not start at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("CDI: {0}")]
    Cdi(#[from] CdiError),
}
