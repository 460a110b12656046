//! Fault injection for crash tests, compiled only with the `crash-points` feature so
//! that a release binary cannot be told to abort in the middle of a prepare.

use std::sync::Arc;

use super::{ClaimError, Preparer};

/// Points where fault-injection tests stop a prepare as a crash would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// The started record is on disk; no CDI spec yet.
    AfterStartedRecord,
    /// A share's GPU runs at the node's time slice; no CDI spec yet.
    AfterTimeSlice,
    /// An MPS share's GPU is in EXCLUSIVE_PROCESS; no daemon yet.
    AfterComputeMode,
    /// An MPS share's GPU has its control daemon; no CDI spec yet.
    AfterMpsDaemon,
    /// A dynamic MIG partition's GPU instance exists, its compute instance not yet.
    AfterGpuInstance,
    /// A dynamic MIG partition's compute instance exists too.
    AfterComputeInstance,
    /// Every instance is made and the spec built; the spec is not written.
    BeforeSpec,
    /// The CDI spec is written; the claim is still recorded as started.
    AfterCdiWrite,
    /// The claim is completed in memory (on disk it is still started, with its
    /// spec); the kubelet never got the answer.
    BeforeAnswer,
}

impl std::str::FromStr for CrashPoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "after-started-record" => Ok(Self::AfterStartedRecord),
            "after-time-slice" => Ok(Self::AfterTimeSlice),
            "after-compute-mode" => Ok(Self::AfterComputeMode),
            "after-mps-daemon" => Ok(Self::AfterMpsDaemon),
            "after-gpu-instance" => Ok(Self::AfterGpuInstance),
            "after-compute-instance" => Ok(Self::AfterComputeInstance),
            "before-spec" => Ok(Self::BeforeSpec),
            "after-cdi-write" => Ok(Self::AfterCdiWrite),
            "before-answer" => Ok(Self::BeforeAnswer),
            other => Err(format!(
                "unknown crash point {other:?}: after-started-record, after-time-slice, after-compute-mode, \
                 after-mps-daemon, after-gpu-instance, \
                 after-compute-instance, before-spec, after-cdi-write, before-answer"
            )),
        }
    }
}

/// Called at each [`CrashPoint`]; returning `true` stops the prepare there without any
/// cleanup. The kubelet plugin's hook aborts the process instead of returning.
pub type CrashHook = Arc<dyn Fn(CrashPoint) -> bool + Send + Sync>;

impl Preparer {
    /// Installs a fault-injection hook; see [`CrashPoint`].
    pub fn with_crash_hook(mut self, hook: CrashHook) -> Self {
        self.crash_hook = Some(hook);
        self
    }

    pub(super) fn crash(&self, point: CrashPoint) -> Result<(), ClaimError> {
        match &self.crash_hook {
            Some(hook) if hook(point) => Err(ClaimError::Crashed(point)),
            _ => Ok(()),
        }
    }
}
