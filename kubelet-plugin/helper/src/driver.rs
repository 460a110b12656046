//! The one trait a plugin implements: what preparing and unpreparing a claim means
//! for its devices, and, optionally, how healthy they are.

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;

use crate::health::NodeHealth;

/// A claim as the kubelet names it in a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// A device prepared for a claim, as the kubelet hands it to the container runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's requests this device was allocated for.
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    /// Fully qualified CDI device ids (`vendor.com/class=name`).
    pub cdi_device_ids: Vec<String>,
    /// Set when the device is shared under this id (DRA v1 only).
    pub share_id: Option<String>,
}

/// Why one claim could not be prepared or unprepared. The kubelet shows `message`
/// for the claim and retries it; `kind` labels the `claim_errors` metric, so keep
/// it to a few fixed values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ClaimError {
    pub kind: &'static str,
    pub message: String,
}

impl ClaimError {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// A DRA driver's node side.
///
/// `prepare` and `unprepare` are called for one claim at a time, on a blocking
/// thread (`tokio::task::spawn_blocking`), so they may write files and fsync; an
/// async driver can use `tokio::runtime::Handle::block_on`. Calls for different
/// claims run concurrently, within the plugin's bounds. The kubelet retries a claim
/// whose answer is an error, so both must be idempotent.
pub trait Driver: Send + Sync + 'static {
    /// Prepares the devices `object` (the claim as the API server has it now,
    /// allocation included) was allocated on this node.
    fn prepare(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError>;

    /// Undoes `prepare`; a claim never prepared is no error.
    fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError>;

    /// Devices held by prepared claims, for the `prepared_devices` gauge; `None`
    /// leaves the gauge alone.
    fn prepared_devices(&self) -> Option<usize> {
        None
    }

    /// The devices' health, for the kubelet's health stream; `None` serves no
    /// health service. Asked once, at start; the streams end when the sender of
    /// the channel is dropped.
    fn health(&self) -> Option<watch::Receiver<NodeHealth>> {
        None
    }
}
