//! Where this instance is in its life, for the liveness and readiness endpoints.
//!
//! The HTTP endpoint comes up before the instance owns the node's state, and stays
//! up after it handed the state over, so that a pod waiting for, or done with, the
//! state is never restarted by its liveness probe: a restarted old pod would ask
//! for the state back.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use dra_kubeletplugin::publish::PublishStatus;
use topodra_ops::http::Check;

#[derive(Debug, Clone)]
enum Phase {
    /// Waiting for another instance to hand over the node's state.
    Waiting,
    Serving {
        registration: PathBuf,
        dra: PathBuf,
        registered: Arc<AtomicBool>,
        published: watch::Receiver<PublishStatus>,
        /// Why it serves read-only, when it does.
        read_only: Option<String>,
    },
    /// Gave the state to another instance; idles until its pod is deleted.
    HandedOver { to: String },
}

/// Shared between the serving code (which moves it on) and the HTTP checks.
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    phase: Arc<Mutex<Phase>>,
}

impl Lifecycle {
    pub(crate) fn waiting() -> Self {
        Self {
            phase: Arc::new(Mutex::new(Phase::Waiting)),
        }
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = phase;
    }

    fn get(&self) -> Phase {
        self.phase
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn serving(
        &self,
        registration: PathBuf,
        dra: PathBuf,
        registered: Arc<AtomicBool>,
        published: watch::Receiver<PublishStatus>,
        read_only: Option<String>,
    ) {
        self.set(Phase::Serving {
            registration,
            dra,
            registered,
            published,
            read_only,
        });
    }

    pub(crate) fn handed_over(&self, to: &str) {
        self.set(Phase::HandedOver { to: to.to_owned() });
    }

    /// Live while waiting and after a handover; while serving, when both sockets
    /// answer.
    pub(crate) fn live_check(&self) -> Check {
        let me = self.clone();
        Arc::new(move || {
            let phase = me.get();
            Box::pin(async move {
                match phase {
                    Phase::Serving {
                        registration, dra, ..
                    } => crate::liveness::check(&registration, &dra).await,
                    Phase::Waiting | Phase::HandedOver { .. } => Ok(()),
                }
            })
        })
    }

    /// Ready once registered with the kubelet and the slices are in sync, and not
    /// while serving read-only: such a pod cannot prepare, and a rolling update
    /// must not go on as if it could.
    pub(crate) fn ready_check(&self) -> Check {
        let me = self.clone();
        Arc::new(move || {
            let phase = me.get();
            Box::pin(async move {
                match phase {
                    Phase::Waiting => {
                        Err("waiting for another instance to hand over the node state".to_owned())
                    }
                    Phase::HandedOver { to } => Err(format!("handed the node state over to {to}")),
                    Phase::Serving {
                        registered,
                        published,
                        read_only,
                        ..
                    } => {
                        if let Some(reason) = read_only {
                            return Err(format!("serving read-only: {reason}"));
                        }
                        if !registered.load(Ordering::SeqCst) {
                            return Err("not registered with the kubelet yet".to_owned());
                        }
                        let status = published.borrow().clone();
                        if !status.is_in_sync() {
                            return Err(format!("ResourceSlices not published: {status:?}"));
                        }
                        Ok(())
                    }
                }
            })
        })
    }
}
