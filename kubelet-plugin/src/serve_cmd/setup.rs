//! What a serving round needs from the start of the process: its inputs, the
//! preparer's configuration, the host device check, the health monitor and the
//! status exporter.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use topodra_model::health::{HealthPolicy, HealthState};
use topodra_node::cdi::{CdiConfig, DriverFiles, HostNodeProblem, host_node_problems};
use topodra_node::dynamic_mig::{Carver, ModeOutcome};
use topodra_node::prepare::{Preparer, PreparerConfig};

pub(crate) use crate::args::ServeArgs;
use crate::events;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::node_state::NotAsking;
use topodra_node::monitor::nvml::NvmlOpener;
use topodra_node::monitor::{HealthMonitor, MonitorConfig};

/// What every serving round needs, from the start of the process.
pub(super) struct Setup<'a> {
    pub(super) args: &'a ServeArgs,
    /// What discovery found: at start, and again when this instance turned MIG
    /// mode on or takes the node state back (`--enable-mig-mode`).
    pub(super) inventory: Mutex<Arc<topodra_model::Inventory>>,
    pub(super) discovery: &'a topodra_node::discovery::DiscoveryConfig,
    pub(super) cdi: &'a CdiConfig,
    pub(super) files: &'a DriverFiles,
    pub(super) boot_id: &'a str,
    /// What makes and removes the partitions' instances (with `--dynamic-mig`),
    /// and removes those the checkpoint names (without it too).
    pub(super) carver: &'a Arc<Carver>,
    /// The driver root's nvidia-smi, for shared GPUs' time slices; `None` where
    /// the root has none (then only the Default interval can be served).
    pub(super) time_slicer: Option<Arc<topodra_node::sharing::TimeSlicer>>,
    /// Compute modes and MPS control daemons, for MPS shares; `None` where the
    /// driver root has no MPS control program (then no MPS share can be served).
    pub(super) mps: Option<Arc<topodra_node::sharing::MpsControl>>,
    pub(super) client: &'a kube::Client,
    pub(super) metrics: &'a Arc<Metrics>,
    pub(super) lifecycle: &'a Lifecycle,
}

impl Setup<'_> {
    /// The inventory this round serves.
    pub(super) fn inventory(&self) -> Arc<topodra_model::Inventory> {
        Arc::clone(
            &self
                .inventory
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// `--enable-mig-mode`, as this instance takes the node state and before it
    /// serves: turns MIG mode on where that is safe (the checkpoint says which GPUs
    /// prepared claims hold), then discovers again if anything changed. `again`:
    /// discover first, because the state was held by another instance meanwhile,
    /// which may have changed MIG modes.
    pub(super) fn enable_mig_mode(&self, again: bool) {
        if again {
            self.rediscover();
        }
        let held = match topodra_node::checkpoint::CheckpointStore::prepared_devices(
            &self.args.state_dir(),
        ) {
            Ok(held) => held,
            Err(why) => {
                tracing::warn!(
                    reason = %why,
                    "not changing any GPU's MIG mode: the checkpoint cannot be read, so any GPU may be held"
                );
                return;
            }
        };
        let mut changed = false;
        for (gpu, outcome) in self.carver.enable_mig_mode(&self.inventory(), &held) {
            match outcome {
                ModeOutcome::Enabled => {
                    tracing::info!(gpu = %gpu, "MIG mode enabled");
                    changed = true;
                }
                ModeOutcome::Skipped(why) => {
                    tracing::info!(gpu = %gpu, reason = %why, "MIG mode left off");
                }
                ModeOutcome::Failed(why) => {
                    tracing::warn!(gpu = %gpu, reason = %why, "MIG mode could not be enabled");
                }
            }
        }
        if changed {
            self.rediscover();
        }
    }

    fn rediscover(&self) {
        match topodra_node::discovery::discover(self.discovery) {
            Ok(inv) => {
                *self
                    .inventory
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Arc::new(inv);
            }
            // The last inventory stays: better what was true a moment ago than
            // nothing, and the next start tries again.
            Err(e) => tracing::error!(error = %e, "discovering GPUs again failed"),
        }
    }

    pub(super) fn preparer_config(&self) -> PreparerConfig {
        PreparerConfig {
            driver_name: self.args.discovery.driver_name.clone(),
            node_name: self.args.node_name.clone(),
            state_dir: self.args.state_dir(),
            boot_id: self.boot_id.to_owned(),
            cdi_spec_dir: self.args.cdi.cdi_dir.clone(),
            dynamic_mig: self.args.dynamic_mig,
            carver: Some(Arc::clone(self.carver)),
            sharing: self.args.sharing.sharing(),
            time_slicer: self.time_slicer.clone(),
            mps: self.mps.clone(),
        }
    }

    pub(super) fn device_nodes(&self) -> Box<dyn topodra_node::cdi::DeviceNodes + Send + Sync> {
        Box::new(
            self.cdi
                .device_nodes()
                .with_proc_devices(&self.args.cdi.proc_devices),
        )
    }

    /// Says why this instance waits without asking the owner for the node state:
    /// in `/readyz`, and in an Event on the Node; or, with `None`, that it asks now.
    pub(super) fn waiting(&self, not_asking: Option<NotAsking<'_>>) {
        let Some(NotAsking { owner, reason }) = not_asking else {
            self.lifecycle.waiting_for_handover();
            return;
        };
        self.lifecycle.waiting_unusable(reason);
        let (client, node) = (self.client.clone(), self.args.node_name.clone());
        let note = format!(
            "a new plugin instance cannot use the state directory {} ({reason}); it leaves the \
             node state with {owner}, which keeps serving, and does not become ready until it \
             can, which it checks every {} s",
            self.args.state_dir().display(),
            self.args.kubelet.state_retry_seconds
        );
        tokio::spawn(async move {
            events::node_event(client, &node, "StateDirUnusable", "Takeover", note).await;
        });
    }

    /// Serves read-only: an Event on the Node, and a state machine that writes
    /// nothing to the state directory.
    pub(super) fn start_read_only(&self, reason: &str) -> Arc<Preparer> {
        tracing::error!(
            reason,
            "serving read-only: the node state directory is unusable; no claim can be prepared until it is fixed"
        );
        let (client, node) = (self.client.clone(), self.args.node_name.clone());
        let note = format!(
            "the plugin cannot use its state directory {} or write what it needs there \
             ({reason}); it serves read-only: prepared claims can be unprepared, no claim can be \
             prepared until this is fixed, which it checks every {} s",
            self.args.state_dir().display(),
            self.args.kubelet.state_retry_seconds
        );
        tokio::spawn(async move {
            events::node_event(client, &node, "StateDirUnusable", "Start", note).await;
        });
        Arc::new(Preparer::start_read_only(
            &self.preparer_config(),
            &self.inventory(),
            self.device_nodes(),
            self.files.clone(),
            reason.to_owned(),
        ))
    }

    /// Recovers the prepared claims from the checkpoint and CDI specs, and records
    /// on the Node what recovery and discovery found wrong.
    pub(super) fn start_preparer(&self) -> Result<Arc<Preparer>> {
        let (preparer, report) = Preparer::start(
            &self.preparer_config(),
            &self.inventory(),
            self.device_nodes(),
            self.files.clone(),
        )
        .context("starting the prepare state machine")?;
        tracing::info!(
            rebooted = report.rebooted,
            rolled_back = report.rolled_back.len(),
            rolled_forward = report.rolled_forward.len(),
            stale_specs_removed = report.stale_specs_removed.len(),
            orphan_specs_removed = report.orphan_specs_removed.len(),
            quarantined = report.quarantined.is_some(),
            bad_records = report.bad_records.len(),
            save_failed = report.save_failed.is_some(),
            "recovered prepared claims"
        );
        #[cfg(feature = "crash-points")]
        let preparer = crate::crash::with_test_crash_at(preparer, &self.args.crash)?;
        let (client, node, inventory) = (
            self.client.clone(),
            self.args.node_name.clone(),
            self.inventory(),
        );
        tokio::spawn(async move {
            events::recovery_events(client.clone(), &node, &report).await;
            events::mig_events(client, &node, &inventory).await;
        });
        Ok(Arc::new(preparer))
    }
}

/// Warns, in the log and on the Node, about host device nodes that containers would
/// get wrong (see `topodra_node::cdi::host_node_problems`); each with its fix.
pub(super) fn host_node_check(
    cdi: &CdiConfig,
    inventory: &topodra_model::Inventory,
    client: &kube::Client,
    node: &str,
) {
    let mut names: Vec<String> = inventory
        .gpus
        .iter()
        .filter_map(|g| g.minor)
        .map(|m| format!("nvidia{m}"))
        .collect();
    names.extend(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"].map(String::from));
    let problems = host_node_problems(&cdi.device_nodes(), &cdi.dev_root, &names);
    if problems.is_empty() {
        return;
    }
    for p in &problems {
        tracing::warn!(problem = %p.message(), "host device node");
    }
    let note = problems
        .iter()
        .map(HostNodeProblem::message)
        .collect::<Vec<_>>()
        .join("; ");
    let (client, node) = (client.clone(), node.to_owned());
    tokio::spawn(async move {
        events::node_event(client, &node, "DeviceNodesIncomplete", "Start", note).await;
    });
}

/// Keeps the metrics of device health and publishing current from the monitor's and
/// the publisher's status; ends when both are gone.
pub(super) async fn export_status(
    metrics: Arc<Metrics>,
    mut health: watch::Receiver<HealthState>,
    mut published: watch::Receiver<dra_kubeletplugin::publish::PublishStatus>,
) {
    let mut last = published.borrow_and_update().clone();
    metrics.set_publish(&dra_kubeletplugin::publish::PublishStatus::Starting, &last);
    metrics.set_health(&health.borrow_and_update());
    let (mut health_open, mut published_open) = (true, true);
    while health_open || published_open {
        tokio::select! {
            r = health.changed(), if health_open => match r {
                Ok(()) => metrics.set_health(&health.borrow_and_update()),
                Err(_) => health_open = false,
            },
            r = published.changed(), if published_open => match r {
                Ok(()) => {
                    let now = published.borrow_and_update().clone();
                    metrics.set_publish(&last, &now);
                    last = now;
                }
                Err(_) => published_open = false,
            },
        }
    }
}

/// Starts the health monitor: NVML events and probes, under the flags' policy.
pub(super) fn start_health(
    args: &ServeArgs,
    inventory: &topodra_model::Inventory,
    metrics: &Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
    let mut policy = HealthPolicy::default();
    policy
        .ignored_xids
        .extend(args.health.ignored_xids.iter().copied());
    policy.quiet_period = Duration::from_secs(args.health.health_quiet_period_seconds);
    let metrics = Arc::clone(metrics);
    HealthMonitor::spawn_observed(
        inventory,
        NvmlOpener::new(Some(args.discovery.nvml_lib.clone())),
        {
            let mut config = MonitorConfig::default();
            config.policy = policy;
            config.mig_gpus = args.dynamic_mig;
            config
        },
        Arc::new(move |seen| metrics.observe_health(seen)),
        shutdown,
    )
}
