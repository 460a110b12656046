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
    /// Waiting for another instance to hand over the node's state; with the reason
    /// when this one does not ask for it (it could not use it).
    Waiting { unusable: Option<String> },
    Serving {
        /// The sockets the kubelet reaches it on, or why they could not be bound.
        kubelet: Result<KubeletSockets, String>,
        published: watch::Receiver<PublishStatus>,
        /// Why it serves read-only, when it does.
        read_only: Option<String>,
    },
    /// Gave the state to another instance (or found another holding it); idles
    /// until its pod is deleted.
    HandedOver { to: String },
}

/// The sockets an instance serves the kubelet on.
#[derive(Debug, Clone)]
pub(crate) struct KubeletSockets {
    pub(crate) registration: PathBuf,
    pub(crate) dra: PathBuf,
    /// The kubelet's last word on the registration.
    pub(crate) registered: Arc<AtomicBool>,
}

/// Shared between the serving code (which moves it on) and the HTTP checks.
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    phase: Arc<Mutex<Phase>>,
}

impl Lifecycle {
    pub(crate) fn waiting() -> Self {
        Self {
            phase: Arc::new(Mutex::new(Phase::Waiting { unusable: None })),
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

    /// Waiting for the owner of the node state to hand it over, having asked.
    pub(crate) fn waiting_for_handover(&self) {
        self.set(Phase::Waiting { unusable: None });
    }

    /// Another instance owns the node state, and this one does not ask for it
    /// while it could not use it, for `reason`.
    pub(crate) fn waiting_unusable(&self, reason: &str) {
        self.set(Phase::Waiting {
            unusable: Some(reason.to_owned()),
        });
    }

    pub(crate) fn serving(
        &self,
        kubelet: Result<KubeletSockets, String>,
        published: watch::Receiver<PublishStatus>,
        read_only: Option<String>,
    ) {
        self.set(Phase::Serving {
            kubelet,
            published,
            read_only,
        });
    }

    pub(crate) fn handed_over(&self, to: &str) {
        self.set(Phase::HandedOver { to: to.to_owned() });
    }

    /// Live while waiting and after a handover; while serving, when both sockets
    /// answer, or when they could not be bound (binding is tried again; a restart
    /// would find the same directory).
    pub(crate) fn live_check(&self) -> Check {
        let me = self.clone();
        Arc::new(move || {
            let phase = me.get();
            Box::pin(async move {
                match phase {
                    Phase::Serving {
                        kubelet: Ok(sockets),
                        ..
                    } => crate::liveness::check(&sockets.registration, &sockets.dra).await,
                    Phase::Serving {
                        kubelet: Err(_), ..
                    }
                    | Phase::Waiting { .. }
                    | Phase::HandedOver { .. } => Ok(()),
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
                    Phase::Waiting { unusable: None } => {
                        Err("waiting for another instance to hand over the node state".to_owned())
                    }
                    Phase::Waiting {
                        unusable: Some(reason),
                    } => Err(format!(
                        "another instance owns the node state; this one does not ask for it \
                         while it could not use it: {reason}"
                    )),
                    Phase::HandedOver { to } => Err(format!("handed the node state over to {to}")),
                    Phase::Serving {
                        kubelet,
                        published,
                        read_only,
                    } => {
                        let problems: Vec<String> = [
                            read_only.map(|r| format!("serving read-only: {r}")),
                            kubelet
                                .as_ref()
                                .err()
                                .map(|r| format!("cannot serve the kubelet: {r}")),
                        ]
                        .into_iter()
                        .flatten()
                        .collect();
                        if !problems.is_empty() {
                            return Err(problems.join("; "));
                        }
                        let registered = kubelet.map(|s| s.registered).unwrap_or_default();
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
