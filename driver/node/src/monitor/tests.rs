//! The monitor over the real `nvml-wrapper`, loading the fake NVML library with a
//! small two-GPU profile.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use topodra_fake_nvml::{Profile, install};
use topodra_model::health::{Cause, HealthState, Status, TaintEffect, device_taints};
use topodra_model::{Gpu, Inventory, PciAddress};

use super::nvml::NvmlOpener;
use super::{HealthMonitor, MonitorConfig};

/// Two PCIe GPUs on one socket. `extra` is appended to the profile and `lost1`
/// makes GPU 1 fall off the bus.
fn profile(extra: &str, lost1: bool) -> String {
    format!(
        r#"
name: health-2gpu
description: two GPUs for the health monitor tests
sources: made up
driver_version: "550.90.07"
cuda_driver_version: 12040
packages:
  - {{os_index: 0}}
numa_nodes:
  - {{os_index: 0, package: 0, cpus: "0-7", memory_gib: 64}}
distances:
  - [10]
pci:
  - bus: "0000:15"
    numa_node: 0
    children:
      - bridge:
          bus_id: "0000:15:01.0"
          role: root-port
          vendor: 0x8086
          children:
            - gpu: "0000:16:00.0"
      - bridge:
          bus_id: "0000:15:02.0"
          role: root-port
          vendor: 0x8086
          children:
            - gpu: "0000:17:00.0"
gpus:
  - index: 0
    minor: 0
    uuid: GPU-00000000-0000-4000-8000-000000000000
    name: "NVIDIA L40S"
    brand: NVIDIA
    architecture: ada
    compute_capability: "8.9"
    memory_mib: 46068
    bus_id: "0000:16:00.0"
    pci_device_id: 0x26b910de
  - index: 1
    minor: 1
    uuid: GPU-00000000-0000-4000-8000-000000000001
    name: "NVIDIA L40S"
    brand: NVIDIA
    architecture: ada
    compute_capability: "8.9"
    memory_mib: 46068
    bus_id: "0000:17:00.0"
    pci_device_id: 0x26b910de
    lost: {lost1}
{extra}
"#
    )
}

/// The inventory discovery would build, written from the profile.
fn inventory(yaml: &str) -> Inventory {
    let profile = Profile::from_yaml_str(yaml).unwrap();
    let gpus = profile
        .gpus
        .iter()
        .map(|g| {
            let mut gpu = Gpu::at(g.bus_id.parse::<PciAddress>().unwrap());
            gpu.index = Some(g.index);
            gpu.minor = Some(g.minor);
            gpu.uuid = Some(g.uuid.clone());
            gpu
        })
        .collect();
    Inventory {
        gpus,
        ..Inventory::default()
    }
}

struct Running {
    _dir: tempfile::TempDir,
    rx: watch::Receiver<HealthState>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn until(&mut self, what: &str, f: impl Fn(&HealthState) -> bool) -> HealthState {
        let reached = tokio::time::timeout(Duration::from_secs(20), self.rx.wait_for(|s| f(s)))
            .await
            .map(|r| r.map(|state| state.clone()));
        match reached {
            Ok(Ok(state)) => state,
            _ => panic!("{what}: last state {:#?}", *self.rx.borrow()),
        }
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

fn config() -> MonitorConfig {
    MonitorConfig {
        probe_interval: Duration::from_millis(50),
        wait_slice: Duration::from_millis(20),
        reopen_interval: Duration::from_millis(100),
        ..MonitorConfig::default()
    }
}

fn start(yaml: &str, lib: Option<PathBuf>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let lib = lib.unwrap_or_else(|| install(dir.path(), yaml));
    let (stop, stop_rx) = oneshot::channel::<()>();
    let (task, rx) = HealthMonitor::spawn(
        &inventory(yaml),
        NvmlOpener::new(Some(lib)),
        config(),
        async {
            let _ = stop_rx.await;
        },
    );
    Running {
        _dir: dir,
        rx,
        stop,
        task,
    }
}

fn status(s: &HealthState, dev: &str) -> Status {
    s.devices[dev].status
}

#[tokio::test]
async fn critical_xid_marks_only_its_gpu_unhealthy() {
    let yaml = profile(
        "xid_events:\n  - {gpu_index: 0, xid: 13, after_ms: 50}\n  - {gpu_index: 1, xid: 79, after_ms: 100}",
        false,
    );
    let mut m = start(&yaml, None);
    m.until("both healthy", |s| {
        s.devices.values().all(|h| h.status == Status::Healthy)
    })
    .await;
    let s = m
        .until("gpu-1 unhealthy", |s| {
            status(s, "gpu-1") == Status::Unhealthy
        })
        .await;
    let h = &s.devices["gpu-1"];
    assert!(h.reason.contains("XID 79"), "{}", h.reason);
    assert_eq!(h.cause, Some(Cause::Xid(79)));
    // XID 13 came first, on GPU 0, and is an application error.
    assert_eq!(status(&s, "gpu-0"), Status::Healthy);
    let taints = device_taints(&s, std::time::SystemTime::now(), TaintEffect::NoSchedule);
    assert_eq!(taints.keys().collect::<Vec<_>>(), ["gpu-1"]);
    assert_eq!(taints["gpu-1"][0].value.as_deref(), Some("xid-79"));
    // The quiet period (5 minutes) has not passed: probes keep it unhealthy.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(status(&m.rx.borrow(), "gpu-1"), Status::Unhealthy);
    m.stop().await;
}

#[tokio::test]
async fn ignored_xid_changes_nothing() {
    let yaml = profile(
        "xid_events:\n  - {gpu_index: 1, xid: 13, after_ms: 10}\n  - {gpu_index: 1, xid: 31, after_ms: 20}",
        false,
    );
    let mut m = start(&yaml, None);
    let before = m
        .until("both healthy", |s| {
            s.devices.values().all(|h| h.status == Status::Healthy)
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*m.rx.borrow(), before);
    m.stop().await;
}

#[tokio::test]
async fn lost_gpu_is_unhealthy() {
    let yaml = profile("", true);
    let mut m = start(&yaml, None);
    let s = m
        .until("gpu-1 lost, gpu-0 healthy", |s| {
            status(s, "gpu-1") == Status::Unhealthy && status(s, "gpu-0") == Status::Healthy
        })
        .await;
    assert_eq!(s.devices["gpu-1"].cause, Some(Cause::Lost));
    assert!(s.devices["gpu-1"].reason.contains("lost"));
    m.stop().await;
}

#[tokio::test]
async fn nvml_that_cannot_start_leaves_health_unknown() {
    let yaml = profile("init_error: DRIVER_NOT_LOADED", false);
    let mut m = start(&yaml, None);
    let s = m
        .until("unavailable", |s| {
            s.devices["gpu-0"].reason.starts_with("NVML unavailable")
        })
        .await;
    assert!(s.devices.values().all(|h| h.status == Status::Unknown));
    // Retries do not end the monitor.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!m.task.is_finished());
    m.stop().await;

    let missing = start(&yaml, Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1")));
    let mut missing = missing;
    missing
        .until("library missing", |s| {
            s.devices["gpu-0"].reason.starts_with("NVML unavailable")
        })
        .await;
    missing.stop().await;
}

#[tokio::test]
async fn a_gpu_lost_after_start_is_unhealthy_until_nvml_sees_it_again() {
    // GPU 0 falls off the bus 300 ms after NVML starts and answers again at 1.5 s.
    // It is the first GPU, so a UUID lookup of GPU 1 would pass it and answer
    // GPU_IS_LOST too (nvml.h); probes look GPUs up by bus id, so GPU 1 stays healthy.
    let yaml = profile("", false).replacen(
        "    pci_device_id: 0x26b910de\n",
        "    pci_device_id: 0x26b910de\n    lost_after_ms: 300\n    recovered_after_ms: 1500\n",
        1,
    );
    let mut m = start(&yaml, None);
    let s = m
        .until("gpu-0 lost", |s| status(s, "gpu-0") == Status::Unhealthy)
        .await;
    assert_eq!(s.devices["gpu-0"].cause, Some(Cause::Lost));
    assert_eq!(status(&s, "gpu-1"), Status::Healthy);
    let taints = device_taints(&s, std::time::SystemTime::now(), TaintEffect::NoSchedule);
    assert_eq!(taints["gpu-0"][0].value.as_deref(), Some("lost"));
    let s = m
        .until("gpu-0 back", |s| status(s, "gpu-0") == Status::Healthy)
        .await;
    assert_eq!(status(&s, "gpu-1"), Status::Healthy);
    m.stop().await;
}

/// An XID that NVML attributes to one GPU instance (`gpuInstanceId` in the event,
/// read past nvml-wrapper, which drops it) marks that MIG device alone: on the
/// simulated DGX A100 GPU 0 holds seven 1g.5gb instances (GPU instances 7 to 13);
/// an XID 94 (a contained ECC error) of instance 8 leaves the other six and the GPU
/// healthy.
#[tokio::test]
async fn an_xid_of_one_mig_instance_marks_that_device_alone() {
    let mut profile = Profile::builtin("dgx-a100-mig").unwrap();
    profile
        .xid_events
        .push(topodra_fake_nvml::profile::XidEvent {
            gpu_index: 0,
            xid: 94,
            after_ms: 100,
            gpu_instance: Some(8),
        });
    let yaml = profile.to_yaml();
    let mut inv = inventory(&yaml);
    inv.gpus[0].mig_mode = Some(topodra_model::inventory::MigMode {
        current: true,
        pending: true,
    });
    inv.gpus[0].mig_devices = profile.gpus[0]
        .mig_devices
        .iter()
        .map(|m| topodra_model::MigDevice {
            uuid: m.uuid.clone(),
            gpu_instance: m.gpu_instance_id,
            compute_instance: m.compute_instance_id,
            profile: Some(m.profile.clone()),
            memory_bytes: None,
            multiprocessors: None,
            placement: None,
            profile_id: None,
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let lib = install(dir.path(), &yaml);
    let (stop, stop_rx) = oneshot::channel::<()>();
    let (task, rx) = HealthMonitor::spawn(&inv, NvmlOpener::new(Some(lib)), config(), async {
        let _ = stop_rx.await;
    });
    let mut m = Running {
        _dir: dir,
        rx,
        stop,
        task,
    };
    let s = m
        .until("gpu-0-mig-8-0 unhealthy", |s| {
            s.devices
                .get("gpu-0-mig-8-0")
                .is_some_and(|h| h.status == Status::Unhealthy)
        })
        .await;
    assert_eq!(s.devices["gpu-0-mig-8-0"].cause, Some(Cause::Xid(94)));
    for other in ["gpu-0-mig-7-0", "gpu-0-mig-13-0", "gpu-1"] {
        assert_ne!(
            status(&s, other),
            Status::Unhealthy,
            "{other}: {:?}",
            s.devices[other]
        );
    }
    m.stop().await;
}
