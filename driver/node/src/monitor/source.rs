//! Where health facts come from, behind traits so the monitor runs against NVML in
//! production and against scripted sources in tests.

use std::time::Duration;

use topodra_model::health::{DeviceRef, Probe, XidEvent};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// NVML cannot be loaded or initialized.
    #[error("NVML unavailable: {0}")]
    Unavailable(String),
    /// Waiting for events failed; the source stays usable.
    #[error("waiting for NVML events: {0}")]
    Wait(String),
}

/// An opened event source. Calls block; the monitor makes them on a thread of its
/// own.
pub trait EventSource {
    /// Waits up to `timeout` for the next event; `Ok(None)` when none came.
    fn wait(&mut self, timeout: Duration) -> Result<Option<XidEvent>, SourceError>;

    /// Checks that the GPU still answers.
    fn probe(&mut self, device: &DeviceRef) -> Probe;

    /// How many GPUs this source receives events for; the others are only probed.
    fn event_gpus(&self) -> usize;
}

/// Opens an [`EventSource`] and lends it to `body` on the calling thread.
///
/// A callback rather than a returned value because a real source borrows from the
/// NVML handle it was opened with: both live on the opener's stack for exactly as
/// long as `body` runs.
pub trait EventSourceOpener: Send + 'static {
    /// Fails when the source cannot be opened; otherwise returns once `body` does.
    fn with_source(
        &mut self,
        devices: &[DeviceRef],
        body: &mut dyn FnMut(&mut dyn EventSource),
    ) -> Result<(), SourceError>;
}
