//! Dynamic MIG end to end on a simulated node: discovery through the real
//! nvml-wrapper on the fake NVML, the prepare state machine making and removing
//! the instances, the CDI spec with the capability nodes the instance got, and
//! crashes, reboots and instances made by others.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nvml_wrapper::Nvml;
use topodra_fake_nvml::ffi::mig::state;
use topodra_fake_nvml::profile::mig::gi_access_minor;
use topodra_fake_nvml::sim::{self, SimNode};
use topodra_fake_nvml::{Profile, cdylib_path};
use topodra_model::Inventory;
use topodra_model::checkpoint::{ClaimIdentity, ClaimState};
use topodra_model::slice::{DynamicMig, SliceOptions, build_slices};
use topodra_node::cdi::{CdiConfig, ContainerEdits, NvidiaFiles, NvidiaFilesSource, Spec};
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_node::dynamic_mig::Carver;
use topodra_node::prepare::{ClaimError, ClaimErrorKind, CrashPoint, Preparer, PreparerConfig};

const DRIVER: &str = "gpu.topodra.dev";
const NODE: &str = "node-a";

/// A DGX H100 with every GPU in MIG mode and no instances.
fn yaml() -> String {
    Profile::builtin("dgx-h100-mig").unwrap().to_yaml()
}

struct Node {
    dir: tempfile::TempDir,
    sim: SimNode,
    inventory: Inventory,
}

fn discover(sim: &SimNode) -> Inventory {
    let mut config = DiscoveryConfig::default();
    config.nvml_lib = Some(sim.nvml_lib.clone());
    config.nvml = NvmlPolicy::Required;
    config.topology = TopologyInput::HwlocXml(sim.hwloc_xml.clone());
    config.sysfs_root = PathBuf::from("/nonexistent");
    discovery::discover(&config).unwrap()
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sim = sim::materialize(&dir.path().join("sim"), &yaml(), &cdylib_path()).unwrap();
        let inventory = discover(&sim);
        Self {
            dir,
            sim,
            inventory,
        }
    }

    fn start(&self, boot_id: &str) -> (Preparer, topodra_node::prepare::StartupReport) {
        let nvml = Nvml::builder()
            .lib_path(self.sim.nvml_lib.as_os_str())
            .init()
            .unwrap();
        let config = PreparerConfig {
            driver_name: DRIVER.into(),
            node_name: NODE.into(),
            state_dir: self.dir.path().join("state"),
            boot_id: boot_id.into(),
            cdi_spec_dir: self.dir.path().join("cdi"),
            dynamic_mig: true,
            carver: Some(Arc::new(Carver::new(nvml))),
            sharing: Default::default(),
            time_slicer: None,
            mps: None,
        };
        let mut cdi = CdiConfig::default();
        cdi.dev_root.clone_from(&self.sim.dev_root);
        cdi.capabilities_dir.clone_from(&self.sim.capabilities_dir);
        let nodes = cdi.device_nodes().with_proc_devices(&self.sim.proc_devices);
        let files = NvidiaFiles::fixed(
            NvidiaFilesSource::Discovered { root: "/".into() },
            ContainerEdits::default(),
        );
        Preparer::start(&config, &self.inventory, Box::new(nodes), files).unwrap()
    }

    /// (start, size, compute instances) of every instance on GPU `index`.
    fn instances(&self, index: usize) -> Vec<(u32, u32, usize)> {
        let uuid = self.inventory.gpus[index].uuid.clone().unwrap();
        state::read(&self.sim.nvml_state).unwrap().spans_of(&uuid)
    }

    fn spec(&self, uid: &str) -> Option<Spec> {
        let path = self
            .dir
            .path()
            .join(format!("cdi/k8s.gpu.topodra.dev-claim_{uid}.json"));
        let bytes = std::fs::read(path).ok()?;
        Some(serde_json::from_slice(&bytes).unwrap())
    }

    fn inject(&self, f: impl FnOnce(&mut state::Faults)) {
        state::update::<(), ()>(&self.sim.nvml_state, |s| {
            f(&mut s.faults);
            Ok(())
        })
        .unwrap()
        .unwrap();
    }
}

fn identity(uid: &str) -> ClaimIdentity {
    ClaimIdentity {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

fn claim(uid: &str, devices: &[&str]) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            namespace: Some("team-a".into()),
            name: Some(format!("claim-{uid}")),
            ..Default::default()
        },
        spec: Some(Default::default()),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        devices
                            .iter()
                            .map(|d| DeviceRequestAllocationResult {
                                request: "mig".into(),
                                driver: DRIVER.into(),
                                pool: NODE.into(),
                                device: (*d).into(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn prepare(p: &Preparer, uid: &str, devices: &[&str]) -> Result<(), Box<ClaimError>> {
    p.prepare(&identity(uid), &claim(uid, devices))
        .map(|_| ())
        .map_err(Box::new)
}

#[test]
fn partitions_are_made_at_prepare_and_removed_at_unprepare() {
    let node = Node::new();
    let (p, _) = node.start("boot-1");

    prepare(&p, "small", &["gpu-0-mig-1g-10gb-6"]).unwrap();
    prepare(&p, "half", &["gpu-0-mig-3g-40gb-0"]).unwrap();
    assert_eq!(node.instances(0), [(0, 4, 1), (6, 1, 1)]);

    // The spec hands out the parent's node and the instance's two capability
    // nodes, whose minors the fake driver gave the instance it made.
    let spec = node.spec("small").unwrap();
    let device = &spec.devices[0];
    assert_eq!(device.name, "small-gpu-0-mig-1g-10gb-6");
    let uuid = &device.annotations["topodra.dev/gpu-uuid"];
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    let gi = state::slot_id(6, 1).unwrap();
    let caps: Vec<(String, Option<i64>)> = device
        .container_edits
        .device_nodes
        .iter()
        .map(|n| (n.path.clone(), n.major))
        .collect();
    assert_eq!(caps[0].0, "/dev/nvidia0");
    let minor = gi_access_minor(0, gi);
    assert_eq!(
        caps[1],
        (
            format!("/dev/nvidia-caps/nvidia-cap{minor}"),
            Some(i64::from(sim::NVIDIA_CAPS_MAJOR))
        )
    );

    // The whole GPU is its full-size instance: it overlaps both partitions,
    // which the checkpoint refuses before NVML is asked.
    let err = prepare(&p, "whole", &["gpu-0"]).unwrap_err();
    assert_eq!(err.kind(), ClaimErrorKind::DeviceInUse, "{err}");
    assert_eq!(node.instances(0).len(), 2);

    p.unprepare("small").unwrap();
    p.unprepare("half").unwrap();
    assert!(node.instances(0).is_empty());
    prepare(&p, "whole", &["gpu-0"]).unwrap();
    assert_eq!(node.instances(0), [(0, 8, 1)]);
    // A retried prepare answers from the record; the instance stays one. One
    // whose spec went missing is prepared again, on the instance it made.
    prepare(&p, "whole", &["gpu-0"]).unwrap();
    let spec = node
        .dir
        .path()
        .join("cdi/k8s.gpu.topodra.dev-claim_whole.json");
    std::fs::remove_file(&spec).unwrap();
    prepare(&p, "whole", &["gpu-0"]).unwrap();
    assert!(spec.exists());
    assert_eq!(node.instances(0), [(0, 8, 1)]);
    p.unprepare("whole").unwrap();
    p.unprepare("whole").unwrap();
    assert!(node.instances(0).is_empty());
    assert!(p.checkpoint().claims.is_empty());
}

#[test]
fn a_failed_compute_instance_is_rolled_back_and_a_retry_succeeds() {
    let node = Node::new();
    let (p, _) = node.start("boot-1");
    node.inject(|f| f.fail_compute_instance_creates = 1);
    let err = prepare(&p, "u1", &["gpu-1-mig-2g-20gb-4"]).unwrap_err();
    assert_eq!(err.kind(), ClaimErrorKind::Mig, "{err}");
    assert!(node.instances(1).is_empty(), "the GPU instance went too");
    assert!(p.checkpoint().claims.is_empty());
    assert!(node.spec("u1").is_none());
    prepare(&p, "u1", &["gpu-1-mig-2g-20gb-4"]).unwrap();
    assert_eq!(node.instances(1), [(4, 2, 1)]);
}

/// A crash at each step of a prepare: a restart in the same boot removes what
/// was made before the spec and keeps what was finished.
#[test]
fn a_restart_after_a_crash_rolls_each_step_back_or_forward() {
    for point in [
        CrashPoint::AfterStartedRecord,
        CrashPoint::AfterGpuInstance,
        CrashPoint::AfterComputeInstance,
        CrashPoint::BeforeSpec,
        CrashPoint::AfterCdiWrite,
    ] {
        let mut node = Node::new();
        let armed = Arc::new(AtomicBool::new(true));
        let hook = Arc::clone(&armed);
        let (p, _) = node.start("boot-1");
        let p = p.with_crash_hook(Arc::new(move |at| {
            at == point && hook.swap(false, Ordering::SeqCst)
        }));
        let err = prepare(&p, "u1", &["gpu-2-mig-1g-10gb-5"]).unwrap_err();
        assert!(
            matches!(*err, ClaimError::Crashed(at) if at == point),
            "{err}"
        );
        drop(p);

        // As a restarted plugin does: discovery first, which may find the
        // half-made instance, then recovery, which removes it.
        node.inventory = discover(&node.sim);
        let (restarted, report) = node.start("boot-1");
        if point == CrashPoint::AfterCdiWrite {
            assert_eq!(report.rolled_forward, ["u1"], "{point:?}");
            assert_eq!(node.instances(2), [(5, 1, 1)], "{point:?}");
            restarted.unprepare("u1").unwrap();
        } else {
            assert_eq!(report.rolled_back, ["u1"], "{point:?}");
            assert!(report.rollback_pending.is_empty(), "{point:?}");
        }
        assert!(node.instances(2).is_empty(), "{point:?}");
        assert!(restarted.checkpoint().claims.is_empty(), "{point:?}");
        // The slices it took are free again: the kubelet's retry gets them.
        prepare(&restarted, "u2", &["gpu-2-mig-1g-10gb-5"]).unwrap();
        restarted.unprepare("u2").unwrap();
    }
}

/// After a reboot the driver has none of the instances; the kubelet prepares
/// its claims again and gets them back at the same placements.
#[test]
fn a_reboot_makes_the_instances_of_prepared_claims_again() {
    let node = Node::new();
    let (p, _) = node.start("boot-1");
    prepare(&p, "u1", &["gpu-3-mig-1g-20gb-6", "gpu-4-mig-4g-40gb-0"]).unwrap();
    drop(p);
    node.sim.reboot(&yaml()).unwrap();
    assert!(node.instances(3).is_empty());

    let (p, report) = node.start("boot-2");
    assert!(report.rebooted);
    assert_eq!(
        p.checkpoint().get("u1").unwrap().state,
        ClaimState::NeedsReprepare
    );
    prepare(&p, "u1", &["gpu-3-mig-1g-20gb-6", "gpu-4-mig-4g-40gb-0"]).unwrap();
    assert_eq!(node.instances(3), [(6, 2, 1)]);
    assert_eq!(node.instances(4), [(0, 4, 1)]);
    assert!(node.spec("u1").is_some());
}

/// An instance someone else made is never used or removed: a claim for a
/// placement it overlaps fails with what holds it, and nothing is recorded.
#[test]
fn instances_made_by_others_are_left_alone() {
    let node = Node::new();
    let nvml = Nvml::builder()
        .lib_path(node.sim.nvml_lib.as_os_str())
        .init()
        .unwrap();
    let operator = Carver::new(nvml);
    let theirs = topodra_model::checkpoint::MigIntent {
        parent_uuid: node.inventory.gpus[5].uuid.clone().unwrap(),
        profile_id: 9,
        start: 4,
        size: 4,
    };
    operator.create_gpu_instance(&theirs, false).unwrap();
    operator.create_compute_instance(&theirs).unwrap();

    let (p, report) = node.start("boot-1");
    assert!(report.rolled_back.is_empty());
    let err = prepare(&p, "u1", &["gpu-5-mig-1g-10gb-4"]).unwrap_err();
    assert_eq!(err.kind(), ClaimErrorKind::MigConflict, "{err}");
    assert!(err.to_string().contains("left alone"), "{err}");
    // Not even one of the very profile and placement a partition names.
    let err = prepare(&p, "u1", &["gpu-5-mig-3g-40gb-4"]).unwrap_err();
    assert_eq!(err.kind(), ClaimErrorKind::MigConflict, "{err}");
    assert_eq!(node.instances(5), [(4, 4, 1)]);
    assert!(p.checkpoint().claims.is_empty());
    // Beside it, the GPU is still usable.
    prepare(&p, "u2", &["gpu-5-mig-1g-10gb-3"]).unwrap();
    assert_eq!(node.instances(5), [(3, 1, 1), (4, 4, 1)]);
}

/// A plugin restart discovers the instances it made and someone else's: its
/// own stay allocated partitions, the other's slices leave the counter set.
#[test]
fn a_restart_tells_its_own_instances_from_someone_elses() {
    let mut node = Node::new();
    let (p, _) = node.start("boot-1");
    prepare(&p, "u1", &["gpu-0-mig-1g-10gb-6"]).unwrap();
    drop(p);
    let nvml = Nvml::builder()
        .lib_path(node.sim.nvml_lib.as_os_str())
        .init()
        .unwrap();
    let theirs = topodra_model::checkpoint::MigIntent {
        parent_uuid: node.inventory.gpus[0].uuid.clone().unwrap(),
        profile_id: 9,
        start: 0,
        size: 4,
    };
    let operator = Carver::new(nvml);
    operator.create_gpu_instance(&theirs, false).unwrap();
    operator.create_compute_instance(&theirs).unwrap();

    node.inventory = discover(&node.sim);
    let found: Vec<_> = node.inventory.gpus[0]
        .mig_devices
        .iter()
        .map(|m| m.placement.map(|pl| (pl.start, pl.size)))
        .collect();
    assert_eq!(found.len(), 2);
    assert!(
        found.contains(&Some((6, 1))) && found.contains(&Some((0, 4))),
        "{found:?}"
    );

    let (p, _) = node.start("boot-1");
    let uuid = theirs.parent_uuid.clone();
    assert_eq!(
        p.own_mig_instances().iter().collect::<Vec<_>>(),
        [&(uuid, 6, 1)]
    );
    let mut opts = SliceOptions::new(NODE);
    opts.dynamic_mig = DynamicMig::All;
    opts.own_mig_instances = p.own_mig_instances().clone();
    let slices = build_slices(&node.inventory, &opts).unwrap();
    let names: Vec<&str> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.as_str())
        .filter(|n| *n == "gpu-0" || n.starts_with("gpu-0-"))
        .collect();
    assert!(names.contains(&"gpu-0-mig-1g-10gb-6"), "{names:?}");
    assert!(!names.contains(&"gpu-0"), "{names:?}");
    assert!(!names.contains(&"gpu-0-mig-3g-40gb-0"), "{names:?}");
    // Someone else's, as a MIG device of its own (named by its instance ids).
    let gi = state::slot_id(0, 4).unwrap();
    assert!(
        names.contains(&format!("gpu-0-mig-{gi}-0").as_str()),
        "{names:?}"
    );

    // Its own instance is unprepared as ever; someone else's stays.
    p.unprepare("u1").unwrap();
    assert_eq!(node.instances(0), [(0, 4, 1)]);
}
