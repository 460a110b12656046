use std::collections::VecDeque;
use std::sync::Mutex;

use topodra_model::{Gpu, PciAddress};

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

    fn event_gpus(&self) -> usize {
        3
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

/// Starts the monitor; the sender stops it ([`stop`]).
fn start(
    inv: &Inventory,
    src: Scripted,
    config: MonitorConfig,
) -> (
    tokio::sync::oneshot::Sender<()>,
    JoinHandle<()>,
    watch::Receiver<HealthState>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (task, rx) = HealthMonitor::spawn(inv, src, config, async {
        let _ = stop_rx.await;
    });
    (stop_tx, task, rx)
}

async fn all_healthy(rx: &mut watch::Receiver<HealthState>) {
    until(rx, |s| {
        s.devices.values().all(|h| h.status == Status::Healthy)
    })
    .await;
}

/// The devices the monitor reports on.
fn names(rx: &watch::Receiver<HealthState>) -> Vec<String> {
    rx.borrow().devices.keys().cloned().collect()
}

fn in_mig_mode(gpu: &mut Gpu) {
    gpu.mig_mode = Some(topodra_model::inventory::MigMode {
        current: true,
        pending: true,
    });
}

/// Ends the monitor and waits for its task.
async fn stop(stop_tx: tokio::sync::oneshot::Sender<()>, task: JoinHandle<()>) {
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
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
    in_mig_mode(&mut inv.gpus[0]);
    inv.gpus[0].mig_devices = (1..=2)
        .map(|gi| topodra_model::MigDevice {
            uuid: format!("MIG-{gi}"),
            gpu_instance: gi,
            compute_instance: 0,
            profile: None,
            memory_bytes: None,
            multiprocessors: None,
            placement: None,
            profile_id: None,
        })
        .collect();
    let src = Scripted::default();
    let (stop_tx, task, mut rx) = start(&inv, src.clone(), fast());
    assert_eq!(names(&rx), ["gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-1"]);
    all_healthy(&mut rx).await;
    // XIDs name the physical GPU, never a MIG device.
    src.events.lock().unwrap().push_back(XidEvent {
        device: EventDevice::Uuid("GPU-0".into()),
        xid: 79,
        instance: None,
    });
    until(&mut rx, |s| {
        status(s, "gpu-0-mig-1-0") == Status::Unhealthy
            && status(s, "gpu-0-mig-2-0") == Status::Unhealthy
    })
    .await;
    assert_eq!(status(&rx.borrow(), "gpu-1"), Status::Healthy);
    stop(stop_tx, task).await;
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
    all_healthy(&mut rx).await;

    src.events.lock().unwrap().extend([
        XidEvent {
            device: EventDevice::Uuid("GPU-1".into()),
            xid: 13,
            instance: None,
        },
        XidEvent {
            device: EventDevice::BusId(PciAddress::new(0, 0x19, 0, 0)),
            xid: 94,
            instance: None,
        },
    ]);
    until(&mut rx, |s| status(s, "gpu-1") == Status::Unhealthy).await;
    assert_eq!(
        rx.borrow().devices["gpu-1"].reason,
        "XID 94: contained ECC error"
    );
    // The GPUs that get events, then both XIDs reach the observer, the
    // application error as not fatal.
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Observed::EventGpus(3),
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

    stop(stop_tx, task).await;
    // The sender is gone with the task, which ends the health streams.
    assert!(rx.changed().await.is_err());
}

#[tokio::test]
async fn unavailable_nvml_is_unknown_and_does_not_crash() {
    let src = Scripted {
        fail_open: true,
        ..Scripted::default()
    };
    let (stop_tx, task, mut rx) = start(&inventory(1), src, fast());
    until(&mut rx, |s| s.devices["gpu-0"].reason.contains("no driver")).await;
    assert_eq!(status(&rx.borrow(), "gpu-0"), Status::Unknown);
    // Several reopen attempts later the task is still alive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished());
    stop(stop_tx, task).await;
}

/// With dynamic MIG, an XID NVML attributes to one GPU instance whose placement it
/// gave names the partition there: that partition becomes unhealthy, its GPU and
/// the other GPUs stay healthy. After the quiet period, the GPU's next successful
/// probe lets it recover.
#[tokio::test]
async fn an_xid_of_one_instance_marks_its_partition_alone() {
    use topodra_model::health::{InstanceScope, ScopePlacement};
    let mut inv = inventory(2);
    in_mig_mode(&mut inv.gpus[0]);
    inv.gpus[0].mig_profiles = topodra_model::slice::fixtures::h100_mig_profiles();
    let one_g = inv.gpus[0]
        .mig_profiles
        .iter()
        .find(|p| p.name == "1g.10gb")
        .unwrap()
        .id;
    let src = Scripted::default();
    let config = MonitorConfig {
        policy: HealthPolicy {
            quiet_period: Duration::from_millis(300),
            ..HealthPolicy::default()
        },
        mig_gpus: true,
        ..fast()
    };
    let (stop_tx, task, mut rx) = start(&inv, src.clone(), config);
    all_healthy(&mut rx).await;
    src.events.lock().unwrap().push_back(XidEvent {
        device: EventDevice::Uuid("GPU-0".into()),
        xid: 94,
        instance: Some(InstanceScope {
            gpu_instance: 13,
            placement: Some(ScopePlacement {
                profile_id: one_g,
                start: 6,
            }),
        }),
    });
    until(&mut rx, |s| {
        s.devices
            .get("gpu-0-mig-1g-10gb-6")
            .is_some_and(|h| h.status == Status::Unhealthy)
    })
    .await;
    assert_eq!(status(&rx.borrow(), "gpu-0"), Status::Healthy);
    assert_eq!(status(&rx.borrow(), "gpu-1"), Status::Healthy);
    // An instance NVML could not place counts against the whole GPU.
    src.events.lock().unwrap().push_back(XidEvent {
        device: EventDevice::Uuid("GPU-1".into()),
        xid: 94,
        instance: Some(InstanceScope {
            gpu_instance: 3,
            placement: None,
        }),
    });
    until(&mut rx, |s| status(s, "gpu-1") == Status::Unhealthy).await;
    until(&mut rx, |s| {
        status(s, "gpu-0-mig-1g-10gb-6") == Status::Healthy
    })
    .await;
    stop(stop_tx, task).await;
}

/// With dynamic MIG a GPU in MIG mode without instances has no allocatable device,
/// yet an XID of it must make it unhealthy: its partitions take their taints from
/// its name. Without dynamic MIG the monitor watches the published devices only.
#[tokio::test]
async fn with_dynamic_mig_a_gpu_in_mig_mode_is_watched_itself() {
    let mut inv = inventory(2);
    in_mig_mode(&mut inv.gpus[0]);
    let src = Scripted::default();
    let config = MonitorConfig {
        mig_gpus: true,
        ..fast()
    };
    let (stop_tx, task, mut rx) = start(&inv, src.clone(), config);
    assert_eq!(names(&rx), ["gpu-0", "gpu-1"]);
    all_healthy(&mut rx).await;
    src.events.lock().unwrap().push_back(XidEvent {
        device: EventDevice::Uuid("GPU-0".into()),
        xid: 79,
        instance: None,
    });
    until(&mut rx, |s| status(s, "gpu-0") == Status::Unhealthy).await;
    stop(stop_tx, task).await;
    let (_task, rx) = HealthMonitor::spawn(&inv, Scripted::default(), fast(), async {});
    assert_eq!(names(&rx), ["gpu-1"]);
}
