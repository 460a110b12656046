//! Runs an [`EventSourceOpener`] on a dedicated thread and keeps a [`HealthState`] current.
//!
//! NVML's event wait blocks, so it gets a thread of its own rather than a slot in
//! tokio's blocking pool; the thread also makes the periodic probes, because NVML
//! handles borrowed from one initialization are simplest kept on one thread. What
//! it learns goes to an async task that owns the [`Tracker`] and publishes through
//! a `watch` channel.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use topodra_model::{Gpu, Inventory};
use tracing::{debug, error, info, warn};

use topodra_model::health::{
    DeviceRef, EventDevice, HealthPolicy, HealthState, InstanceScope, Probe, Status, Tracker,
    XidEvent,
};

use super::source::{EventSource, EventSourceOpener};

#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MonitorConfig {
    pub policy: HealthPolicy,
    /// How often every GPU is probed: finds lost GPUs, GPUs without event support,
    /// and lets recovered GPUs become healthy again.
    pub probe_interval: Duration,
    /// Longest single blocking wait in NVML; bounds how long shutdown takes.
    pub wait_slice: Duration,
    /// Pause before trying again to open NVML after it could not be opened.
    pub reopen_interval: Duration,
    /// Consecutive failed event waits after which NVML is closed and reopened.
    pub max_wait_errors: u32,
    /// Dynamic MIG: watch each GPU in MIG mode itself too, whose name its
    /// partitions take their taints from ([`DeviceRef::with_mig_gpus`]).
    pub mig_gpus: bool,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            policy: HealthPolicy::default(),
            probe_interval: Duration::from_secs(30),
            wait_slice: Duration::from_secs(1),
            reopen_interval: Duration::from_secs(60),
            max_wait_errors: 60,
            mig_gpus: false,
        }
    }
}

/// What the monitor saw, for metrics: every XID (fatal or not under the policy) and
/// every failed NVML call it depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    Xid {
        xid: u64,
        fatal: bool,
    },
    /// NVML could not be opened (retried after `reopen_interval`).
    NvmlOpenFailed,
    /// One wait for NVML events failed.
    NvmlWaitFailed,
    /// NVML was opened, and the monitor receives events for this many GPUs (the
    /// others it only probes); 0 again when NVML is closed.
    EventGpus(usize),
}

/// Called from the monitor's task and its NVML thread.
pub type Observer = Arc<dyn Fn(Observed) + Send + Sync>;

#[derive(Debug)]
enum Msg {
    Opened,
    Unavailable(String),
    Xid(XidEvent),
    Probed(String, Probe),
}

/// Starts the monitor; see [`HealthMonitor::spawn_observed`].
#[derive(Debug)]
pub struct HealthMonitor;

impl HealthMonitor {
    /// [`Self::spawn_observed`] with no observer, for tests that watch no metrics.
    #[cfg(test)]
    pub fn spawn(
        inventory: &Inventory,
        source: impl EventSourceOpener,
        config: MonitorConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
        Self::spawn_observed(inventory, source, config, Arc::new(|_| {}), shutdown)
    }

    /// Starts monitoring the inventory's GPUs until `shutdown` completes, telling
    /// `observer` each XID and NVML failure. The receiver starts with every GPU
    /// Unknown. The task ends after the event thread has closed NVML; dropping its
    /// sender ends every health stream.
    pub fn spawn_observed(
        inventory: &Inventory,
        source: impl EventSourceOpener,
        config: MonitorConfig,
        observer: Observer,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
        let devices = if config.mig_gpus {
            DeviceRef::with_mig_gpus(inventory)
        } else {
            DeviceRef::all(inventory)
        };
        let gpus = inventory.gpus.clone();
        let mut tracker = Tracker::new(
            config.policy.clone(),
            devices.iter().map(|d| d.name.clone()),
            SystemTime::now(),
        );
        let (state_tx, state_rx) = watch::channel(tracker.state());
        let (msg_tx, mut msg_rx) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));

        let thread = {
            let devices = devices.clone();
            let stop = Arc::clone(&stop);
            let config = config.clone();
            let observer = Arc::clone(&observer);
            std::thread::Builder::new()
                .name("nvml-events".to_owned())
                .spawn(move || run_source(source, &devices, &config, &stop, &msg_tx, &observer))
        };
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                error!(error = %e, "cannot start the GPU health thread; health stays unknown");
                tracker.on_unavailable(&format!("no monitor thread: {e}"), SystemTime::now());
                state_tx.send_replace(tracker.state());
                None
            }
        };

        let task = tokio::spawn(async move {
            let mut shutdown = pin!(shutdown);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    msg = msg_rx.recv() => match msg {
                        Some(msg) => {
                            if let Msg::Xid(ev) = &msg {
                                let fatal = tracker.policy().is_fatal(ev.xid);
                                observer(Observed::Xid { xid: ev.xid, fatal });
                            }
                            if apply(&mut tracker, &devices, &gpus, msg) {
                                state_tx.send_replace(tracker.state());
                            }
                        }
                        None => {
                            if thread.is_some() {
                                error!("GPU health thread ended unexpectedly");
                            }
                            // Keep the last state until shutdown rather than end
                            // every stream and leave the kubelet guessing.
                            shutdown.as_mut().await;
                            break;
                        }
                    },
                }
            }
            stop.store(true, Ordering::Relaxed);
            drop(msg_rx);
            if let Some(thread) = thread {
                // So NVML is shut down before the caller moves on.
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
        });
        (task, state_rx)
    }
}

/// Applies one message; returns whether the published state must change.
fn apply(tracker: &mut Tracker, devices: &[DeviceRef], gpus: &[Gpu], msg: Msg) -> bool {
    let now = SystemTime::now();
    match msg {
        Msg::Opened => tracker.on_available(now),
        Msg::Unavailable(why) => tracker.on_unavailable(&why, now),
        Msg::Probed(name, probe) => {
            let changed = tracker.on_probe(&name, &probe, now);
            if changed {
                log_transition(tracker, &name);
            }
            changed
        }
        Msg::Xid(ev) => {
            let of_gpu: Vec<&DeviceRef> = devices.iter().filter(|d| ev.device.matches(d)).collect();
            if of_gpu.is_empty() {
                warn!(xid = ev.xid, device = ?ev.device, "XID for a GPU not in the inventory");
                return false;
            }
            if let Some(scope) = ev.instance {
                // NVML attributes the error to one MIG instance: that device alone,
                // a MIG device the monitor watches or a dynamic partition.
                let mine: Vec<&DeviceRef> = of_gpu
                    .iter()
                    .copied()
                    .filter(|d| d.gpu_instance == Some(scope.gpu_instance))
                    .collect();
                if !mine.is_empty() {
                    return mark(tracker, &mine, ev.xid, now);
                }
                if let Some(name) = partition_of(gpus, &of_gpu, scope) {
                    let gpu = of_gpu
                        .iter()
                        .find(|d| d.gpu_instance.is_none())
                        .map_or("", |d| d.name.as_str());
                    log_xid(tracker, &name, ev.xid);
                    let changed = tracker.on_partition_xid(&name, gpu, ev.xid, now);
                    if changed {
                        log_transition(tracker, &name);
                    }
                    return changed;
                }
                warn!(
                    xid = ev.xid,
                    gpu_instance = scope.gpu_instance,
                    "XID of a MIG instance the plugin cannot name; counting it against the whole GPU"
                );
            }
            // Every device of that GPU: the GPU itself, or all its MIG devices.
            let hit = of_gpu;
            let mut changed = false;
            changed |= mark(tracker, &hit, ev.xid, now);
            changed
        }
    }
}

/// Applies an XID to each of `hit`; returns whether any health changed.
fn mark(tracker: &mut Tracker, hit: &[&DeviceRef], xid: u64, now: SystemTime) -> bool {
    let mut changed = false;
    for device in hit {
        log_xid(tracker, &device.name, xid);
        if tracker.on_xid(&device.name, xid, now) {
            log_transition(tracker, &device.name);
            changed = true;
        }
    }
    changed
}

fn log_xid(tracker: &Tracker, device: &str, xid: u64) {
    if tracker.policy().is_fatal(xid) {
        warn!(device = %device, xid, "critical XID");
    } else {
        info!(device = %device, xid, "XID ignored by policy");
    }
}

/// The dynamic partition an instance-scoped error belongs to: on the GPU the event
/// names, the profile and start NVML gave for the instance.
fn partition_of(gpus: &[Gpu], of_gpu: &[&DeviceRef], scope: InstanceScope) -> Option<String> {
    let at = scope.placement?;
    let parent = of_gpu.iter().find(|d| d.gpu_instance.is_none())?;
    let gpu = gpus.iter().find(|g| g.pci_bus_id == parent.bus_id)?;
    topodra_model::slice::partition_device_name(gpu, at.profile_id, at.start)
}

fn log_transition(tracker: &Tracker, name: &str) {
    if let Some(h) = tracker.health(name) {
        match h.status {
            Status::Unhealthy => warn!(device = %name, reason = %h.reason, "GPU unhealthy"),
            Status::Healthy => info!(device = %name, "GPU healthy"),
            Status::Unknown => info!(device = %name, reason = %h.reason, "GPU health unknown"),
        }
    }
}

/// The event thread: opens the source, pumps it, and reopens it after failures,
/// until `stop` is set or the async side is gone.
fn run_source(
    mut source: impl EventSourceOpener,
    devices: &[DeviceRef],
    config: &MonitorConfig,
    stop: &AtomicBool,
    tx: &mpsc::UnboundedSender<Msg>,
    observer: &Observer,
) {
    let mut reported_unavailable = false;
    while !stop.load(Ordering::Relaxed) && !tx.is_closed() {
        let opened = source.with_source(devices, &mut |src| {
            reported_unavailable = false;
            let gpus = src.event_gpus();
            info!(
                gpus,
                of = devices.len(),
                "NVML opened; receiving its events"
            );
            observer(Observed::EventGpus(gpus));
            if tx.send(Msg::Opened).is_ok() {
                pump(src, devices, config, stop, tx, observer);
            }
            observer(Observed::EventGpus(0));
        });
        if let Err(e) = opened {
            observer(Observed::NvmlOpenFailed);
            // Once at warn: a node without the driver would otherwise log forever.
            if reported_unavailable {
                debug!(error = %e, "NVML still unavailable");
            } else {
                warn!(error = %e, retry_in = ?config.reopen_interval, "GPU health monitoring needs NVML; retrying");
                reported_unavailable = true;
            }
            if tx.send(Msg::Unavailable(e.to_string())).is_err() {
                return;
            }
            let until = Instant::now() + config.reopen_interval;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) && !tx.is_closed() {
                std::thread::sleep(config.wait_slice.min(until - Instant::now()));
            }
        }
    }
}

/// Waits for events and probes on schedule; returns to have the source reopened
/// after too many failed waits, or to stop.
fn pump(
    src: &mut dyn EventSource,
    devices: &[DeviceRef],
    config: &MonitorConfig,
    stop: &AtomicBool,
    tx: &mpsc::UnboundedSender<Msg>,
    observer: &Observer,
) {
    let mut next_probe = Instant::now();
    let mut wait_errors = 0u32;
    loop {
        if stop.load(Ordering::Relaxed) || tx.is_closed() {
            return;
        }
        if Instant::now() >= next_probe {
            for d in devices {
                if tx.send(Msg::Probed(d.name.clone(), src.probe(d))).is_err() {
                    return;
                }
            }
            next_probe = Instant::now() + config.probe_interval;
        }
        let timeout = config
            .wait_slice
            .min(next_probe.saturating_duration_since(Instant::now()));
        match src.wait(timeout) {
            Ok(Some(ev)) => {
                wait_errors = 0;
                if ev.device == EventDevice::Unknown {
                    // Whichever GPU it was, a probe shows whether it is still there.
                    warn!(xid = ev.xid, "XID from an unidentified GPU; probing all");
                    next_probe = Instant::now();
                }
                if tx.send(Msg::Xid(ev)).is_err() {
                    return;
                }
            }
            Ok(None) => wait_errors = 0,
            Err(e) => {
                observer(Observed::NvmlWaitFailed);
                wait_errors += 1;
                if wait_errors == 1 {
                    // Often a GPU that fell off the bus; a probe finds which.
                    warn!(error = %e, "NVML event wait failed; probing all GPUs");
                    next_probe = Instant::now();
                } else {
                    debug!(error = %e, failures = wait_errors, "NVML event wait failed");
                }
                if wait_errors >= config.max_wait_errors {
                    warn!(
                        failures = wait_errors,
                        "NVML event wait keeps failing; reopening NVML"
                    );
                    return;
                }
                std::thread::sleep(config.wait_slice);
            }
        }
    }
}

#[cfg(test)]
mod tests;
