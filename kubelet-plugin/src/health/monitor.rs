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
use topodra_driver::Inventory;
use tracing::{debug, error, info, warn};

use topodra_driver::health::{
    DeviceRef, EventDevice, HealthPolicy, HealthState, Probe, Status, Tracker, XidEvent,
};

use super::source::{EventSource, EventSourceOpener};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MonitorConfig {
    pub(crate) policy: HealthPolicy,
    /// How often every GPU is probed: finds lost GPUs, GPUs without event support,
    /// and lets recovered GPUs become healthy again.
    pub(crate) probe_interval: Duration,
    /// Longest single blocking wait in NVML; bounds how long shutdown takes.
    pub(crate) wait_slice: Duration,
    /// Pause before trying again to open NVML after it could not be opened.
    pub(crate) reopen_interval: Duration,
    /// Consecutive failed event waits after which NVML is closed and reopened.
    pub(crate) max_wait_errors: u32,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            policy: HealthPolicy::default(),
            probe_interval: Duration::from_secs(30),
            wait_slice: Duration::from_secs(1),
            reopen_interval: Duration::from_secs(60),
            max_wait_errors: 60,
        }
    }
}

/// What the monitor saw, for metrics: every XID (fatal or not under the policy) and
/// every failed NVML call it depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    Xid {
        xid: u64,
        fatal: bool,
    },
    /// NVML could not be opened (retried after `reopen_interval`).
    NvmlOpenFailed,
    /// One wait for NVML events failed.
    NvmlWaitFailed,
}

/// Called from the monitor's task and its NVML thread.
pub(crate) type Observer = Arc<dyn Fn(Observed) + Send + Sync>;

#[derive(Debug)]
enum Msg {
    Opened,
    Unavailable(String),
    Xid(XidEvent),
    Probed(String, Probe),
}

/// Starts the monitor; see [`HealthMonitor::spawn`].
#[derive(Debug)]
pub(crate) struct HealthMonitor;

impl HealthMonitor {
    /// Starts monitoring the inventory's GPUs until `shutdown` completes. The
    /// receiver starts with every GPU Unknown. The task ends after the event thread
    /// has closed NVML; dropping its sender ends every health stream. (The plugin
    /// uses [`Self::spawn_observed`]; tests that watch no metrics use this.)
    #[cfg(test)]
    pub(crate) fn spawn(
        inventory: &Inventory,
        source: impl EventSourceOpener,
        config: MonitorConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
        Self::spawn_observed(inventory, source, config, Arc::new(|_| {}), shutdown)
    }

    /// [`Self::spawn`], telling `observer` each XID and NVML failure.
    pub(crate) fn spawn_observed(
        inventory: &Inventory,
        source: impl EventSourceOpener,
        config: MonitorConfig,
        observer: Observer,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
        let devices = DeviceRef::all(inventory);
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
                            if apply(&mut tracker, &devices, msg) {
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
fn apply(tracker: &mut Tracker, devices: &[DeviceRef], msg: Msg) -> bool {
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
            // Every device of that GPU: the GPU itself, or all its MIG devices.
            let hit: Vec<&DeviceRef> = devices.iter().filter(|d| ev.device.matches(d)).collect();
            if hit.is_empty() {
                warn!(xid = ev.xid, device = ?ev.device, "XID for a GPU not in the inventory");
                return false;
            }
            let mut changed = false;
            for device in hit {
                if tracker.policy().is_fatal(ev.xid) {
                    warn!(device = %device.name, xid = ev.xid, "critical XID");
                } else {
                    info!(device = %device.name, xid = ev.xid, "XID ignored by policy");
                }
                if tracker.on_xid(&device.name, ev.xid, now) {
                    log_transition(tracker, &device.name);
                    changed = true;
                }
            }
            changed
        }
    }
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
            if tx.send(Msg::Opened).is_ok() {
                pump(src, devices, config, stop, tx, observer);
            }
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
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use topodra_driver::{Gpu, PciAddress};

    use super::super::source::SourceError;
    use super::*;

    fn inventory(n: u8) -> Inventory {
        let gpus = (0..n)
            .map(|i| {
                let mut g = Gpu::at(PciAddress::new(0, 0x18 + i, 0, 0));
                g.index = Some(u32::from(i));
                g.minor = Some(u32::from(i));
                g.uuid = Some(format!("GPU-{i}"));
                g
            })
            .collect();
        Inventory {
            gpus,
            ..Inventory::default()
        }
    }

    /// Scripted events; probes answer from a shared table, `Ok` by default.
    #[derive(Clone, Default)]
    struct Scripted {
        events: Arc<Mutex<VecDeque<XidEvent>>>,
        lost: Arc<Mutex<Vec<String>>>,
        fail_open: bool,
    }

    impl EventSource for Scripted {
        fn wait(&mut self, timeout: Duration) -> Result<Option<XidEvent>, SourceError> {
            if let Some(ev) = self.events.lock().unwrap().pop_front() {
                return Ok(Some(ev));
            }
            std::thread::sleep(timeout.min(Duration::from_millis(5)));
            Ok(None)
        }

        fn probe(&mut self, device: &DeviceRef) -> Probe {
            if self.lost.lock().unwrap().contains(&device.name) {
                Probe::Lost
            } else {
                Probe::Ok
            }
        }
    }

    impl EventSourceOpener for Scripted {
        fn with_source(
            &mut self,
            _devices: &[DeviceRef],
            body: &mut dyn FnMut(&mut dyn EventSource),
        ) -> Result<(), SourceError> {
            if self.fail_open {
                return Err(SourceError::Unavailable("no driver".into()));
            }
            let mut src = self.clone();
            body(&mut src);
            Ok(())
        }
    }

    fn fast() -> MonitorConfig {
        MonitorConfig {
            probe_interval: Duration::from_millis(20),
            wait_slice: Duration::from_millis(10),
            reopen_interval: Duration::from_millis(50),
            ..MonitorConfig::default()
        }
    }

    async fn until(rx: &mut watch::Receiver<HealthState>, f: impl Fn(&HealthState) -> bool) {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| f(s)))
            .await
            .expect("state not reached")
            .unwrap();
    }

    fn status(s: &HealthState, dev: &str) -> Status {
        s.devices[dev].status
    }

    #[tokio::test]
    async fn an_xid_of_a_mig_gpu_marks_each_of_its_mig_devices() {
        let mut inv = inventory(2);
        inv.gpus[0].mig_mode = Some(topodra_driver::inventory::MigMode {
            current: true,
            pending: true,
        });
        inv.gpus[0].mig_devices = (1..=2)
            .map(|gi| topodra_driver::MigDevice {
                uuid: format!("MIG-{gi}"),
                gpu_instance: gi,
                compute_instance: 0,
                profile: None,
                memory_bytes: None,
                multiprocessors: None,
            })
            .collect();
        let src = Scripted::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (task, mut rx) = HealthMonitor::spawn(&inv, src.clone(), fast(), async {
            let _ = stop_rx.await;
        });
        let names: Vec<String> = rx.borrow().devices.keys().cloned().collect();
        assert_eq!(names, ["gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-1"]);
        until(&mut rx, |s| {
            s.devices.values().all(|h| h.status == Status::Healthy)
        })
        .await;
        // XIDs name the physical GPU, never a MIG device.
        src.events.lock().unwrap().push_back(XidEvent {
            device: EventDevice::Uuid("GPU-0".into()),
            xid: 79,
        });
        until(&mut rx, |s| {
            status(s, "gpu-0-mig-1-0") == Status::Unhealthy
                && status(s, "gpu-0-mig-2-0") == Status::Unhealthy
        })
        .await;
        assert_eq!(status(&rx.borrow(), "gpu-1"), Status::Healthy);
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn xids_probes_and_shutdown() {
        let src = Scripted::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observer: Observer = {
            let seen = Arc::clone(&seen);
            Arc::new(move |o| seen.lock().unwrap().push(o))
        };
        let (task, mut rx) =
            HealthMonitor::spawn_observed(&inventory(3), src.clone(), fast(), observer, async {
                let _ = stop_rx.await;
            });
        assert!(
            rx.borrow()
                .devices
                .values()
                .all(|h| h.status == Status::Unknown)
        );
        until(&mut rx, |s| {
            s.devices.values().all(|h| h.status == Status::Healthy)
        })
        .await;

        src.events.lock().unwrap().extend([
            XidEvent {
                device: EventDevice::Uuid("GPU-1".into()),
                xid: 13,
            },
            XidEvent {
                device: EventDevice::BusId(PciAddress::new(0, 0x19, 0, 0)),
                xid: 94,
            },
        ]);
        until(&mut rx, |s| status(s, "gpu-1") == Status::Unhealthy).await;
        assert_eq!(
            rx.borrow().devices["gpu-1"].reason,
            "XID 94: contained ECC error"
        );
        // Both XIDs reach the observer, the application error as not fatal.
        assert_eq!(
            *seen.lock().unwrap(),
            [
                Observed::Xid {
                    xid: 13,
                    fatal: false
                },
                Observed::Xid {
                    xid: 94,
                    fatal: true
                }
            ]
        );

        src.lost.lock().unwrap().push("gpu-2".into());
        until(&mut rx, |s| status(s, "gpu-2") == Status::Unhealthy).await;
        src.lost.lock().unwrap().clear();
        until(&mut rx, |s| status(s, "gpu-2") == Status::Healthy).await;
        assert_eq!(status(&rx.borrow(), "gpu-0"), Status::Healthy);

        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        // The sender is gone with the task, which ends the health streams.
        assert!(rx.changed().await.is_err());
    }

    #[tokio::test]
    async fn unavailable_nvml_is_unknown_and_does_not_crash() {
        let src = Scripted {
            fail_open: true,
            ..Scripted::default()
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (task, mut rx) = HealthMonitor::spawn(&inventory(1), src, fast(), async {
            let _ = stop_rx.await;
        });
        until(&mut rx, |s| s.devices["gpu-0"].reason.contains("no driver")).await;
        assert_eq!(status(&rx.borrow(), "gpu-0"), Status::Unknown);
        // Several reopen attempts later the task is still alive.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!task.is_finished());
        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
    }
}
