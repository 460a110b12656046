use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::*;
use crate::cdi::{ContainerEdits, Mount, NvidiaFiles, NvidiaFilesSource, TableDeviceNodes};
use topodra_model::checkpoint::ClaimState;
use topodra_model::inventory::{Gpu, MigDevice, MigMode};

const DRIVER: &str = "gpu.topodra.dev";
const NODE: &str = "node-a";

fn inventory(gpus: u32) -> Inventory {
    Inventory {
        gpus: (0..gpus)
            .map(|i| {
                let mut g = Gpu::at(topodra_model::PciAddress::new(0, 0x10 + i as u8, 0, 0));
                g.minor = Some(i);
                g.index = Some(i);
                g.uuid = Some(format!("GPU-{i:08}"));
                g.numa_node = Some(i / 4);
                g.local_cpus = if i < 4 {
                    "0-3".parse().unwrap()
                } else {
                    "4-7".parse().unwrap()
                };
                g
            })
            .collect(),
        ..Default::default()
    }
}

fn nvidia_files() -> NvidiaFiles {
    NvidiaFiles::fixed(
        NvidiaFilesSource::Discovered { root: "/".into() },
        ContainerEdits {
            mounts: vec![Mount {
                host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                kind: Some("bind".into()),
                options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "rbind".into()],
            }],
            ..Default::default()
        },
    )
}

struct Node {
    dir: tempfile::TempDir,
    gpus: u32,
}

impl Node {
    fn new(gpus: u32) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            gpus,
        }
    }

    fn config(&self, boot_id: &str) -> PreparerConfig {
        PreparerConfig {
            driver_name: DRIVER.into(),
            node_name: NODE.into(),
            state_dir: self.dir.path().join("state"),
            boot_id: boot_id.into(),
            cdi_spec_dir: self.cdi_dir(),
            dynamic_mig: false,
            carver: None,
            sharing: Default::default(),
            time_slicer: None,
            mps: None,
        }
    }

    fn cdi_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("cdi")
    }

    /// Starts (or restarts) the state machine on this node's directories.
    fn start_with_boot(&self, boot_id: &str) -> (Preparer, StartupReport) {
        Preparer::start(
            &self.config(boot_id),
            &inventory(self.gpus),
            Box::new(TableDeviceNodes::nvidia(0..self.gpus, 509)),
            nvidia_files(),
        )
        .unwrap()
    }

    fn start(&self) -> Preparer {
        self.start_with_boot("boot-1").0
    }

    fn spec_files(&self) -> Vec<String> {
        match std::fs::read_dir(self.cdi_dir()) {
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                names
            }
            Err(_) => vec![],
        }
    }
}

fn claim_ref(uid: &str) -> ClaimIdentity {
    ClaimIdentity {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

fn result(request: &str, device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.into(),
        driver: DRIVER.into(),
        pool: NODE.into(),
        device: device.into(),
        ..Default::default()
    }
}

fn claim_with(
    uid: &str,
    results: Vec<DeviceRequestAllocationResult>,
    config: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
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
                    results: Some(results),
                    config: (!config.is_empty()).then_some(config),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn claim(uid: &str, devices: &[u32]) -> ResourceClaim {
    claim_with(
        uid,
        devices
            .iter()
            .map(|d| result("gpus", &format!("gpu-{d}")))
            .collect(),
        vec![],
    )
}

fn opaque(parameters: serde_json::Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: "FromClaim".into(),
        requests: None,
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER.into(),
            parameters: RawExtension(parameters),
        }),
    }
}

/// Two whole GPUs and a third in MIG mode with two MIG devices.
fn mig_inventory() -> Inventory {
    let mut inv = inventory(3);
    let g = &mut inv.gpus[2];
    g.mig_mode = Some(MigMode {
        current: true,
        pending: true,
    });
    g.mig_devices = (1..=2)
        .map(|gi| MigDevice {
            uuid: format!("MIG-0000000{gi}-1111-2222-3333-444444444444"),
            gpu_instance: gi,
            compute_instance: 0,
            profile: Some("3g.20gb".into()),
            memory_bytes: Some(19_968 << 20),
            multiprocessors: Some(42),
            placement: None,
            profile_id: None,
        })
        .collect();
    inv
}

#[test]
fn mig_devices_are_prepared_with_their_capability_nodes() {
    let node = Node::new(3);
    let (p, _) = Preparer::start(
        &node.config("boot-1"),
        &mig_inventory(),
        Box::new(TableDeviceNodes::nvidia(0..3, 509).with_mig([(2, 1, 0), (2, 2, 0)])),
        nvidia_files(),
    )
    .unwrap();
    // The MIG GPU itself is not a device of the pool any more.
    let whole = p.prepare(&claim_ref("u0"), &claim("u0", &[2])).unwrap_err();
    assert!(matches!(whole, ClaimError::UnknownDevice { .. }), "{whole}");

    let c = claim_with("u1", vec![result("mig", "gpu-2-mig-1-0")], vec![]);
    let prepared = p.prepare(&claim_ref("u1"), &c).unwrap();
    assert_eq!(
        prepared[0].cdi_device_ids,
        vec!["k8s.gpu.topodra.dev/claim=u1-gpu-2-mig-1-0"]
    );
    let spec: crate::cdi::Spec = serde_json::from_slice(
        &std::fs::read(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json")).unwrap(),
    )
    .unwrap();
    let nodes: Vec<(&str, Option<i64>, Option<i64>)> = spec.devices[0]
        .container_edits
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor))
        .collect();
    let [gi, ci] = TableDeviceNodes::mig_minors(2, 1, 0).map(i64::from);
    let caps = i64::from(crate::cdi::TABLE_CAPS_MAJOR);
    assert_eq!(
        nodes,
        vec![
            ("/dev/nvidia2", Some(195), Some(2)),
            (
                &*format!("/dev/nvidia-caps/nvidia-cap{gi}"),
                Some(caps),
                Some(gi)
            ),
            (
                &*format!("/dev/nvidia-caps/nvidia-cap{ci}"),
                Some(caps),
                Some(ci)
            ),
        ]
    );
    assert_eq!(
        spec.devices[0].annotations["topodra.dev/gpu-uuid"],
        "MIG-00000001-1111-2222-3333-444444444444"
    );

    // The other MIG device of the same GPU is free for another claim.
    let other = claim_with("u2", vec![result("mig", "gpu-2-mig-2-0")], vec![]);
    p.prepare(&claim_ref("u2"), &other).unwrap();
    p.unprepare("u1").unwrap();
    p.unprepare("u2").unwrap();
    assert!(node.spec_files().is_empty());
}

#[test]
fn a_mig_device_without_capability_files_fails_only_its_claim() {
    let node = Node::new(3);
    let (p, _) = Preparer::start(
        &node.config("boot-1"),
        &mig_inventory(),
        Box::new(
            crate::cdi::HostDeviceNodes::new(node.dir.path())
                .with_capabilities_dir(node.dir.path().join("no-caps")),
        ),
        nvidia_files(),
    )
    .unwrap();
    let c = claim_with("u1", vec![result("mig", "gpu-2-mig-1-0")], vec![]);
    let err = p.prepare(&claim_ref("u1"), &c).unwrap_err().to_string();
    assert!(err.contains("gpu2/mig/gi1/access"), "{err}");
    assert!(node.spec_files().is_empty());
    assert!(p.checkpoint().claims.is_empty(), "nothing recorded");
}

#[test]
fn prepares_one_and_eight_gpu_claims() {
    let node = Node::new(8);
    let p = node.start();
    let one = p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(
        one[0].cdi_device_ids,
        vec!["k8s.gpu.topodra.dev/claim=u1-gpu-0"]
    );
    assert_eq!(one[0].requests, vec!["gpus"]);
    p.unprepare("u1").unwrap();

    let eight = p
        .prepare(&claim_ref("u8"), &claim("u8", &[0, 1, 2, 3, 4, 5, 6, 7]))
        .unwrap();
    assert_eq!(eight.len(), 8);
    assert_eq!(node.spec_files(), vec!["k8s.gpu.topodra.dev-claim_u8.json"]);
    let spec: crate::cdi::Spec = serde_json::from_slice(
        &std::fs::read(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u8.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(spec.devices.len(), 8);
    assert_eq!(
        p.checkpoint().get("u8").unwrap().state,
        ClaimState::PrepareCompleted
    );
    assert_eq!(p.prepared_devices(), 8);
}

#[test]
fn sub_requests_answer_with_base_request_names() {
    let node = Node::new(2);
    let p = node.start();
    let c = claim_with("u1", vec![result("gpus/large", "gpu-0")], vec![]);
    assert_eq!(
        p.prepare(&claim_ref("u1"), &c).unwrap()[0].requests,
        vec!["gpus"]
    );
}

#[test]
fn double_prepare_is_idempotent_and_rewrites_a_lost_spec() {
    let node = Node::new(2);
    let p = node.start();
    let first = p.prepare(&claim_ref("u1"), &claim("u1", &[1])).unwrap();
    assert_eq!(
        p.prepare(&claim_ref("u1"), &claim("u1", &[1])).unwrap(),
        first
    );
    std::fs::remove_file(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json")).unwrap();
    assert_eq!(
        p.prepare(&claim_ref("u1"), &claim("u1", &[1])).unwrap(),
        first
    );
    assert_eq!(node.spec_files().len(), 1);
}

#[test]
fn unprepare_is_idempotent_and_removes_the_spec() {
    let node = Node::new(2);
    let p = node.start();
    p.unprepare("never-prepared").unwrap();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    p.unprepare("u1").unwrap();
    p.unprepare("u1").unwrap();
    assert!(node.spec_files().is_empty());
    assert!(p.checkpoint().claims.is_empty());
}

/// The split brain of a slow handover: the old owner's prepare of A was waiting on
/// the API server while the new owner prepared B on the same GPU. When A's answer
/// finally comes, the old process must write nothing: neither its checkpoint (which
/// would drop B's record) nor a spec.
#[test]
fn after_the_fence_nothing_is_written_and_the_new_owner_keeps_its_claims() {
    let node = Node::new(4);
    let old = node.start();
    old.prepare(&claim_ref("u-kept"), &claim("u-kept", &[0]))
        .unwrap();
    old.fence("pod-new");
    assert!(old.is_fenced());
    let new = node.start();
    new.prepare(&claim_ref("u-b"), &claim("u-b", &[3])).unwrap();
    let before = std::fs::read(node.dir.path().join("state/checkpoint.json")).unwrap();

    let late = old.prepare(&claim_ref("u-a"), &claim("u-a", &[3]));
    assert!(
        matches!(&late, Err(ClaimError::HandedOver { to }) if to == "pod-new"),
        "{late:?}"
    );
    assert_eq!(late.unwrap_err().kind(), ClaimErrorKind::HandedOver);
    assert!(matches!(
        old.unprepare("u-kept"),
        Err(ClaimError::HandedOver { .. })
    ));
    assert_eq!(
        std::fs::read(node.dir.path().join("state/checkpoint.json")).unwrap(),
        before,
        "the fenced process saved nothing"
    );
    assert_eq!(
        node.spec_files(),
        [
            "k8s.gpu.topodra.dev-claim_u-b.json",
            "k8s.gpu.topodra.dev-claim_u-kept.json"
        ]
    );
    // The new owner's next start keeps B, and gpu-3 stays B's.
    let restarted = node.start();
    assert!(restarted.checkpoint().claims.contains_key("u-b"));
    assert!(matches!(
        restarted.prepare(&claim_ref("u-c"), &claim("u-c", &[3])),
        Err(ClaimError::DeviceInUse(_))
    ));
}

#[test]
fn the_fence_waits_for_calls_in_flight() {
    let node = Node::new(1);
    let p = Arc::new(node.start());
    // A call in flight holds the read side for as long as it may write.
    let in_flight = p.owned().unwrap();
    let fenced = Arc::new(AtomicBool::new(false));
    let fencer = {
        let (p, fenced) = (p.clone(), fenced.clone());
        std::thread::spawn(move || {
            p.fence("pod-new");
            fenced.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        !fenced.load(Ordering::SeqCst),
        "the fence went up under a call in flight"
    );
    drop(in_flight);
    fencer.join().unwrap();
    assert!(fenced.load(Ordering::SeqCst));
    // Idempotent: a second fence keeps the first owner's name.
    p.fence("pod-other");
    assert!(matches!(
        p.unprepare("u1"),
        Err(ClaimError::HandedOver { to }) if to == "pod-new"
    ));
}

#[test]
fn a_load_of_the_driver_files_that_does_not_return_holds_up_no_fence() {
    let node = Node::new(1);
    let p = Arc::new(node.start());
    // The files' lock held stands in for a read that does not return (a toolkit
    // spec on a stuck mount).
    let stuck = p.files.hold();
    let preparer = {
        let p = p.clone();
        std::thread::spawn(move || p.prepare(&claim_ref("u1"), &claim("u1", &[0])))
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (fenced, up) = std::sync::mpsc::channel();
    let fencer = {
        let p = p.clone();
        std::thread::spawn(move || {
            p.fence("pod-new");
            let _ = fenced.send(());
        })
    };
    let went_up = up.recv_timeout(std::time::Duration::from_secs(10)).is_ok();
    drop(stuck);
    fencer.join().unwrap();
    let result = preparer.join().unwrap();
    assert!(
        went_up,
        "a prepare waiting on the driver's files held the handover's fence"
    );
    // Once the read returns, the call finds the state handed over and writes nothing.
    assert!(
        matches!(&result, Err(ClaimError::HandedOver { to }) if to == "pod-new"),
        "{result:?}"
    );
    assert!(node.spec_files().is_empty());
}

#[test]
fn a_read_only_start_prepares_nothing_and_unprepares_known_claims() {
    let node = Node::new(2);
    let owner = node.start();
    owner.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    owner.fence("a read-only instance");
    drop(owner);
    // A leftover temp file and a stale spec stay: recovery is the next owner's.
    let state = node.dir.path().join("state");
    std::fs::write(state.join("checkpoint.json.tmp-1"), "half").unwrap();
    let before = std::fs::read(state.join("checkpoint.json")).unwrap();
    let p = Preparer::start_read_only(
        &node.config("boot-1"),
        &inventory(2),
        Box::new(TableDeviceNodes::nvidia(0..2, 509)),
        nvidia_files(),
        "cannot open owner.lock: Read-only file system".into(),
    );
    assert_eq!(
        p.read_only(),
        Some("cannot open owner.lock: Read-only file system")
    );
    assert!(
        p.checkpoint().claims.contains_key("u1"),
        "known claims are read"
    );

    let refused = p.prepare(&claim_ref("u2"), &claim("u2", &[1])).unwrap_err();
    assert_eq!(refused.kind(), ClaimErrorKind::StateUnusable);
    assert!(
        refused.to_string().contains("Read-only file system"),
        "{refused}"
    );
    assert_eq!(
        p.prepare(&claim_ref("u1"), &claim("u1", &[0]))
            .unwrap_err()
            .kind(),
        ClaimErrorKind::StateUnusable
    );

    p.unprepare("u1").unwrap();
    assert!(
        node.spec_files().is_empty(),
        "the container can no longer get the GPU"
    );
    assert!(p.checkpoint().claims.is_empty());
    assert_eq!(
        std::fs::read(state.join("checkpoint.json")).unwrap(),
        before,
        "nothing written to the state directory"
    );
    assert!(state.join("checkpoint.json.tmp-1").exists());
    // The next owner still holds the GPU for u1 until it learns the claim is gone.
    let owner = node.start();
    assert!(owner.checkpoint().claims.contains_key("u1"));
}

#[test]
fn a_read_only_start_leaves_a_corrupt_checkpoint_where_it_is() {
    let node = Node::new(1);
    let state = node.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("checkpoint.json"), "{not json").unwrap();
    let p = Preparer::start_read_only(
        &node.config("boot-1"),
        &inventory(1),
        Box::new(TableDeviceNodes::nvidia(0..1, 509)),
        nvidia_files(),
        "test".into(),
    );
    assert!(p.checkpoint().claims.is_empty());
    assert_eq!(
        std::fs::read(state.join("checkpoint.json")).unwrap(),
        b"{not json"
    );
    assert_eq!(
        std::fs::read_dir(&state).unwrap().count(),
        1,
        "no quarantine copy"
    );
}

#[test]
fn unprepare_after_restart_needs_only_the_checkpoint() {
    let node = Node::new(2);
    node.start()
        .prepare(&claim_ref("u1"), &claim("u1", &[0, 1]))
        .unwrap();
    let restarted = node.start();
    restarted.unprepare("u1").unwrap();
    assert!(node.spec_files().is_empty());
}

#[test]
fn a_device_prepared_for_another_live_claim_is_refused() {
    let node = Node::new(4);
    let p = node.start();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0, 1])).unwrap();
    let err = p
        .prepare(&claim_ref("u2"), &claim("u2", &[1, 2]))
        .unwrap_err();
    assert!(matches!(err, ClaimError::DeviceInUse(_)), "{err}");
    assert!(
        err.to_string().contains("gpu-1") && err.to_string().contains("u1"),
        "{err}"
    );
    assert!(
        p.checkpoint().get("u2").is_none(),
        "refusal changes nothing"
    );
    p.unprepare("u1").unwrap();
    p.prepare(&claim_ref("u2"), &claim("u2", &[1, 2])).unwrap();
}

#[test]
fn concurrent_prepares_disjoint_all_succeed_overlapping_exactly_one() {
    let node = Node::new(8);
    let p = Arc::new(node.start());
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8u32)
        .map(|i| {
            let (p, barrier) = (p.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let uid = format!("d{i}");
                p.prepare(&claim_ref(&uid), &claim(&uid, &[i])).is_ok()
            })
        })
        .collect();
    assert!(handles.into_iter().all(|h| h.join().unwrap()));
    assert_eq!(p.prepared_devices(), 8);
    for i in 0..8 {
        p.unprepare(&format!("d{i}")).unwrap();
    }

    let barrier = Arc::new(Barrier::new(6));
    let handles: Vec<_> = (0..6u32)
        .map(|i| {
            let (p, barrier) = (p.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let uid = format!("o{i}");
                p.prepare(&claim_ref(&uid), &claim(&uid, &[3, 4])).is_ok()
            })
        })
        .collect();
    let won = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|ok| *ok)
        .count();
    assert_eq!(won, 1);
    assert_eq!(node.spec_files().len(), 1);
}

#[test]
fn a_hundred_claims_prepare_and_unprepare() {
    let node = Node::new(100);
    let p = node.start();
    for i in 0..100u32 {
        let uid = format!("c{i}");
        p.prepare(&claim_ref(&uid), &claim(&uid, &[i])).unwrap();
    }
    assert_eq!(node.spec_files().len(), 100);
    let restarted = node.start();
    assert_eq!(restarted.prepared_devices(), 100);
    for i in 0..100 {
        restarted.unprepare(&format!("c{i}")).unwrap();
    }
    assert!(node.spec_files().is_empty());
}

#[test]
fn a_crash_at_any_step_then_a_restart_leaks_nothing_and_the_retry_succeeds() {
    for point in [
        CrashPoint::AfterStartedRecord,
        CrashPoint::AfterCdiWrite,
        CrashPoint::BeforeAnswer,
    ] {
        let node = Node::new(4);
        let armed = Arc::new(AtomicBool::new(true));
        let hook_armed = armed.clone();
        let p = node.start().with_crash_hook(Arc::new(move |at| {
            at == point && hook_armed.swap(false, Ordering::SeqCst)
        }));
        let err = p
            .prepare(&claim_ref("u1"), &claim("u1", &[0, 1]))
            .unwrap_err();
        assert!(matches!(err, ClaimError::Crashed(at) if at == point));
        drop(p);

        let (restarted, report) = node.start_with_boot("boot-1");
        // Once the spec is in place the prepare has finished: it is rolled
        // forward, whether or not the kubelet got the answer.
        let spec_written = point != CrashPoint::AfterStartedRecord;
        if spec_written {
            assert_eq!(report.rolled_forward, ["u1"], "{point:?}");
            assert!(report.rolled_back.is_empty(), "{point:?}");
            assert_eq!(
                restarted.checkpoint().get("u1").unwrap().state,
                ClaimState::PrepareCompleted
            );
        } else {
            assert_eq!(report.rolled_back, ["u1"], "{point:?}");
            assert!(report.rolled_forward.is_empty(), "{point:?}");
            assert!(restarted.checkpoint().claims.is_empty());
        }
        assert!(report.orphan_specs_removed.is_empty());
        assert_eq!(
            node.spec_files().len(),
            usize::from(spec_written),
            "{point:?}: {:?}",
            node.spec_files()
        );

        let again = restarted
            .prepare(&claim_ref("u1"), &claim("u1", &[0, 1]))
            .unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!(node.spec_files(), vec!["k8s.gpu.topodra.dev-claim_u1.json"]);
        restarted.unprepare("u1").unwrap();
        assert!(node.spec_files().is_empty(), "{point:?}");
        assert!(restarted.checkpoint().claims.is_empty());
    }
}

/// The checkpoint as the next start would read it.
fn on_disk(node: &Node) -> topodra_model::checkpoint::Checkpoint {
    crate::checkpoint::CheckpointStore::new(node.dir.path().join("state"))
        .load("boot-1")
        .unwrap()
        .checkpoint
}

#[test]
fn a_completion_reaches_disk_with_the_next_save_or_the_fence() {
    let node = Node::new(4);
    let p = node.start();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    assert_eq!(
        p.checkpoint().get("u1").unwrap().state,
        ClaimState::PrepareCompleted
    );
    // One synced save per prepare: the spec stands for the completion.
    assert_eq!(
        on_disk(&node).get("u1").unwrap().state,
        ClaimState::PrepareStarted
    );
    p.prepare(&claim_ref("u2"), &claim("u2", &[1])).unwrap();
    let disk = on_disk(&node);
    assert_eq!(disk.get("u1").unwrap().state, ClaimState::PrepareCompleted);
    assert_eq!(disk.get("u2").unwrap().state, ClaimState::PrepareStarted);
    // A handover (or a stop) leaves a checkpoint that says it all by itself, for
    // the next owner and for an older version after a rollback.
    p.fence("the next instance");
    assert_eq!(on_disk(&node), p.checkpoint());
}

#[test]
fn a_started_record_is_only_rolled_forward_to_a_whole_spec_of_its_devices() {
    // A spec the record's prepare cannot have written: torn, another claim's
    // content, or naming other devices. Each is rolled back, never trusted.
    let other_devices: fn(&Node) -> String = |node| {
        let p = node.start();
        p.prepare(&claim_ref("u9"), &claim("u9", &[2, 3])).unwrap();
        let spec =
            std::fs::read_to_string(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u9.json"))
                .unwrap()
                .replace("u9", "u1");
        p.unprepare("u9").unwrap();
        spec
    };
    type SpecFor = fn(&Node) -> String;
    let cases: [(&str, SpecFor); 3] = [
        ("empty", |_| String::new()),
        ("garbage", |_| "{\"cdiVersion\":".to_owned()),
        ("other devices", other_devices),
    ];
    for (what, spec) in cases {
        let node = Node::new(4);
        node.start()
            .prepare(&claim_ref("u1"), &claim("u1", &[0, 1]))
            .unwrap();
        let content = spec(&node);
        save_checkpoint_with(&node, |cp| {
            let mut r = cp.get("u1").cloned().unwrap();
            r.state = ClaimState::PrepareStarted;
            cp.insert(r);
        });
        std::fs::write(
            node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json"),
            content,
        )
        .unwrap();
        let (p, report) = node.start_with_boot("boot-1");
        assert_eq!(report.rolled_back, ["u1"], "{what}");
        assert!(report.rolled_forward.is_empty(), "{what}");
        assert!(
            node.spec_files().is_empty(),
            "{what}: {:?}",
            node.spec_files()
        );
        p.prepare(&claim_ref("u2"), &claim("u2", &[0])).unwrap();
    }
}

#[test]
fn a_prepare_over_an_old_spec_removes_it_before_recording_the_start() {
    // The claim was prepared with other devices; its new prepare crashes right
    // after the started record. The old spec must not be taken for the new one.
    let node = Node::new(4);
    node.start()
        .prepare(&claim_ref("u1"), &claim("u1", &[0]))
        .unwrap();
    let p = node
        .start()
        .with_crash_hook(Arc::new(|at| at == CrashPoint::AfterStartedRecord));
    let err = p.prepare(&claim_ref("u1"), &claim("u1", &[1])).unwrap_err();
    assert!(matches!(err, ClaimError::Crashed(_)), "{err}");
    assert!(node.spec_files().is_empty(), "{:?}", node.spec_files());
    drop(p);
    let (_p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.rolled_back, ["u1"]);
}

#[test]
fn an_orphan_spec_is_removed_at_start() {
    let node = Node::new(2);
    let p = node.start();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    std::fs::copy(
        node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json"),
        node.cdi_dir().join("k8s.gpu.topodra.dev-claim_ghost.json"),
    )
    .unwrap();
    std::fs::write(node.cdi_dir().join("nvidia.yaml"), "not ours").unwrap();
    drop(p);
    let (_p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.orphan_specs_removed, vec!["ghost"]);
    assert_eq!(
        node.spec_files(),
        vec!["k8s.gpu.topodra.dev-claim_u1.json", "nvidia.yaml"]
    );
}

#[test]
fn after_a_reboot_claims_are_prepared_again_and_unprepare_still_works() {
    let node = Node::new(2);
    node.start()
        .prepare(&claim_ref("u1"), &claim("u1", &[0]))
        .unwrap();
    node.start()
        .prepare(&claim_ref("u2"), &claim("u2", &[1]))
        .unwrap();
    // /var/run is a tmpfs: a reboot empties the CDI directory.
    std::fs::remove_dir_all(node.cdi_dir()).unwrap();
    let (p, report) = node.start_with_boot("boot-2");
    assert!(report.rebooted);
    // u2's completion was never saved: it may have been answered, so it is held
    // like u1, not rolled back.
    assert!(report.rolled_back.is_empty(), "{report:?}");
    for uid in ["u1", "u2"] {
        assert_eq!(
            p.checkpoint().get(uid).unwrap().state,
            ClaimState::NeedsReprepare
        );
    }
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    assert_eq!(
        p.checkpoint().get("u1").unwrap().state,
        ClaimState::PrepareCompleted
    );
    // Until then the device stays reserved for its claim.
    assert!(p.prepare(&claim_ref("u3"), &claim("u3", &[1])).is_err());
    p.unprepare("u2").unwrap();
    assert!(p.checkpoint().get("u2").is_none());
}

#[test]
fn after_a_reboot_specs_that_outlived_it_are_removed() {
    // A CDI directory that is not a tmpfs keeps its files over a reboot; they were
    // never synced, so they may be torn, and every claim is prepared again anyway.
    let node = Node::new(2);
    let p = node.start();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    p.fence("the next instance");
    drop(p);
    let (p, report) = node.start_with_boot("boot-2");
    assert_eq!(report.stale_specs_removed, ["u1"]);
    assert!(node.spec_files().is_empty());
    assert!(
        p.prepare(&claim_ref("u3"), &claim("u3", &[0])).is_err(),
        "still held"
    );
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    assert_eq!(node.spec_files(), ["k8s.gpu.topodra.dev-claim_u1.json"]);
}

#[test]
fn a_corrupt_checkpoint_is_quarantined_and_rebuilt_from_specs() {
    for corruption in [&b""[..], b"{\"version\":1,\"checks", b"\x00\xff garbage"] {
        let node = Node::new(4);
        let p = node.start();
        p.prepare(&claim_ref("u1"), &claim("u1", &[0, 2])).unwrap();
        drop(p);
        std::fs::write(node.dir.path().join("state/checkpoint.json"), corruption).unwrap();
        let (p, report) = node.start_with_boot("boot-1");
        assert!(report.quarantined.is_some());
        assert_eq!(report.rebuilt, vec!["u1"]);
        let record = p.checkpoint().get("u1").cloned().unwrap();
        assert_eq!(record.namespace, "team-a");
        let devices: Vec<&str> = record.devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(devices, ["gpu-0", "gpu-2"]);
        assert!(
            record.devices.iter().all(|d| d.requests == ["gpus"]),
            "request names survive the rebuild: {:?}",
            record.devices
        );
        // The rebuilt record still guards its devices and unprepares cleanly.
        assert!(p.prepare(&claim_ref("u2"), &claim("u2", &[2])).is_err());
        p.unprepare("u1").unwrap();
        assert!(node.spec_files().is_empty());
    }
}

#[test]
fn a_failed_cdi_write_rolls_back() {
    let node = Node::new(2);
    let p = node.start();
    // The spec directory is a file: every write fails, as on a full or broken disk.
    std::fs::create_dir_all(node.dir.path()).unwrap();
    std::fs::write(node.cdi_dir(), b"").unwrap();
    let err = p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap_err();
    assert!(matches!(err, ClaimError::Cdi(_)), "{err}");
    assert!(p.checkpoint().claims.is_empty(), "the device is free again");
    std::fs::remove_file(node.cdi_dir()).unwrap();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
}

#[test]
fn bad_claims_are_refused_with_a_clear_error_and_no_state_change() {
    let node = Node::new(2);
    let p = node.start();
    let other_node = {
        let mut r = result("gpus", "gpu-0");
        r.pool = "node-b".into();
        claim_with("u1", vec![r], vec![])
    };
    let other_driver = {
        let mut r = result("gpus", "gpu-0");
        r.driver = "gpu.nvidia.com".into();
        claim_with("u1", vec![r], vec![])
    };
    let mut not_allocated = claim("u1", &[0]);
    not_allocated.status = None;
    let cases: Vec<(ResourceClaim, &str)> = vec![
        (other_node, "another node"),
        (other_driver, "no device of driver gpu.topodra.dev"),
        (not_allocated, "is not allocated"),
        (claim("u1", &[9]), "gpu-9 is not a GPU of this node"),
        (claim("other-uid", &[0]), "the claim was replaced"),
        (
            claim_with(
                "u1",
                vec![result("gpus", "gpu-0")],
                vec![opaque(serde_json::json!({
            "apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "Exclusive", "exclusiv": {}}}))],
            ),
            "sharing.exclusiv",
        ),
        (
            claim_with(
                "u1",
                vec![result("gpus", "gpu-0")],
                vec![opaque(serde_json::json!({
            "apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS"}}))],
            ),
            "MPS",
        ),
    ];
    for (c, want) in cases {
        let err = p.prepare(&claim_ref("u1"), &c).unwrap_err();
        assert!(
            err.to_string().contains(want),
            "{err} does not contain {want}"
        );
    }
    assert!(p.checkpoint().claims.is_empty());
    assert!(node.spec_files().is_empty());
}

#[test]
fn require_aligned_refuses_a_split_allocation() {
    let node = Node::new(8);
    let p = node.start();
    let aligned = serde_json::json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": {"requireAligned": true}});
    let split = claim_with(
        "u1",
        vec![result("gpus", "gpu-3"), result("gpus", "gpu-4")],
        vec![opaque(aligned.clone())],
    );
    let err = p.prepare(&claim_ref("u1"), &split).unwrap_err();
    assert!(err.to_string().contains("spans NUMA nodes 0,1"), "{err}");
    let ok = claim_with(
        "u1",
        vec![result("gpus", "gpu-0"), result("gpus", "gpu-3")],
        vec![opaque(aligned)],
    );
    p.prepare(&claim_ref("u1"), &ok).unwrap();
}

#[test]
fn env_hints_follow_the_numa_config() {
    let node = Node::new(2);
    let p = node.start();
    let no_hints = serde_json::json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": {"exportHints": false}});
    p.prepare(
        &claim_ref("u1"),
        &claim_with("u1", vec![result("gpus", "gpu-0")], vec![opaque(no_hints)]),
    )
    .unwrap();
    p.prepare(&claim_ref("u2"), &claim("u2", &[1])).unwrap();
    let env = |uid: &str| {
        let path = node
            .cdi_dir()
            .join(format!("k8s.gpu.topodra.dev-claim_{uid}.json"));
        let spec: crate::cdi::Spec =
            serde_json::from_slice(&std::fs::read(Path::new(&path)).unwrap()).unwrap();
        spec.container_edits.env
    };
    assert!(
        !env("u1")
            .iter()
            .any(|e| e.starts_with("TOPODRA_NUMA_NODES="))
    );
    assert!(env("u2").iter().any(|e| e == "TOPODRA_NUMA_NODES=0"));
}

#[test]
fn a_retried_prepare_answers_request_names_even_when_the_record_lost_them() {
    let node = Node::new(2);
    let p = node.start();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    drop(p);
    // What a rebuild by an older version left: a completed record without requests.
    let store = crate::checkpoint::CheckpointStore::new(node.dir.path().join("state"));
    let mut cp = store.load("boot-1").unwrap().checkpoint;
    let mut record = cp.get("u1").cloned().unwrap();
    record.devices[0].requests.clear();
    cp.insert(record);
    store.save(&cp).unwrap();

    let p = node.start();
    let again = p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    assert_eq!(again[0].requests, ["gpus"]);
    assert_eq!(
        p.checkpoint().get("u1").unwrap().devices[0].requests,
        ["gpus"]
    );
}

/// Writes a checkpoint whose checksum is right but whose content cannot be acted on.
fn save_checkpoint_with(
    node: &Node,
    edit: impl FnOnce(&mut topodra_model::checkpoint::Checkpoint),
) {
    let store = crate::checkpoint::CheckpointStore::new(node.dir.path().join("state"));
    let mut cp = store.load("boot-1").unwrap().checkpoint;
    edit(&mut cp);
    store.save(&cp).unwrap();
}

#[test]
fn records_with_invalid_uids_are_dropped_not_a_crash_loop() {
    for state in [ClaimState::PrepareStarted, ClaimState::PrepareCompleted] {
        let node = Node::new(2);
        node.start()
            .prepare(&claim_ref("u1"), &claim("u1", &[0]))
            .unwrap();
        save_checkpoint_with(&node, |cp| {
            let mut bad = cp.get("u1").cloned().unwrap();
            bad.uid = "../not a uid".into();
            bad.devices[0].device = "gpu-1".into();
            bad.state = state;
            cp.insert(bad);
        });
        let (p, report) = node.start_with_boot("boot-1");
        assert_eq!(report.bad_records.len(), 1, "{report:?}");
        assert!(report.bad_records[0].contains("not a valid UID"));
        assert!(p.checkpoint().get("../not a uid").is_none());
        assert!(p.checkpoint().get("u1").is_some(), "the good record stays");
        // The GPU the bad record held is free again.
        p.prepare(&claim_ref("u2"), &claim("u2", &[1])).unwrap();
    }
}

#[test]
fn a_directory_in_place_of_the_checkpoint_is_quarantined() {
    let node = Node::new(2);
    std::fs::create_dir_all(node.dir.path().join("state/checkpoint.json/inner")).unwrap();
    let (p, report) = node.start_with_boot("boot-1");
    let q = report.quarantined.expect("quarantined");
    assert_eq!(q.reason.to_string(), "checkpoint path is a directory");
    assert!(q.path.join("inner").is_dir(), "moved aside untouched");
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
}

#[test]
fn a_start_that_cannot_save_keeps_serving() {
    let node = Node::new(2);
    let p = node.start();
    p.prepare(&claim_ref("u1"), &claim("u1", &[0])).unwrap();
    p.fence("the next instance");
    drop(p);
    // A directory where the checkpoint's temp file goes: every save fails, as on a
    // full or read-only disk.
    let store = crate::checkpoint::CheckpointStore::new(node.dir.path().join("state"));
    let block = store.temp_path().join("x");
    std::fs::create_dir_all(&block).unwrap();

    // Nothing to change: nothing is written, so nothing fails.
    let (p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.save_failed, None);
    assert!(p.checkpoint().get("u1").is_some());
    drop(p);

    // Something to change (a prepare interrupted before its spec was written):
    // rolled back in memory and on the CDI directory, reported, and the plugin
    // still starts.
    std::fs::remove_dir_all(block.parent().unwrap()).unwrap();
    save_checkpoint_with(&node, |cp| {
        let mut r = cp.get("u1").cloned().unwrap();
        r.state = ClaimState::PrepareStarted;
        cp.insert(r);
    });
    std::fs::remove_file(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json")).unwrap();
    std::fs::create_dir_all(&block).unwrap();
    let (p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.rolled_back, ["u1"]);
    assert!(report.save_failed.is_some(), "{report:?}");
    assert!(p.checkpoint().get("u1").is_none());
    assert!(node.spec_files().is_empty());
    // A prepare needs a save: it fails for its claim alone and records nothing.
    let err = p.prepare(&claim_ref("u2"), &claim("u2", &[1])).unwrap_err();
    assert!(err.to_string().contains("checkpoint"), "{err}");
    assert!(p.checkpoint().get("u2").is_none());
}

#[test]
fn another_installation_s_specs_are_not_orphans() {
    let node = Node::new(2);
    node.start()
        .prepare(&claim_ref("u1"), &claim("u1", &[0]))
        .unwrap();
    // A second installation with its own driver name, same CDI directory.
    let mut config = node.config("boot-1");
    config.driver_name = "canary.topodra.dev".into();
    config.state_dir = node.dir.path().join("canary-state");
    let (canary, report) = Preparer::start(
        &config,
        &inventory(2),
        Box::new(TableDeviceNodes::nvidia(0..2, 509)),
        nvidia_files(),
    )
    .unwrap();
    assert!(report.orphan_specs_removed.is_empty());
    let mut c = claim("c1", &[1]);
    for r in topodra_model::slice::fixtures::allocation_results_mut(&mut c) {
        r.driver = "canary.topodra.dev".into();
    }
    let prepared = canary.prepare(&claim_ref("c1"), &c).unwrap();
    assert_eq!(
        prepared[0].cdi_device_ids,
        ["k8s.canary.topodra.dev/claim=c1-gpu-1"]
    );
    assert_eq!(
        node.spec_files(),
        [
            "k8s.canary.topodra.dev-claim_c1.json",
            "k8s.gpu.topodra.dev-claim_u1.json"
        ]
    );
    // Restarting the first installation leaves the canary's spec alone.
    let (_p, report) = node.start_with_boot("boot-1");
    assert!(report.orphan_specs_removed.is_empty());
    assert_eq!(node.spec_files().len(), 2);
}

mod arbitrary_state {
    use proptest::prelude::*;

    use super::*;
    use topodra_model::checkpoint::fixtures::arb_checkpoint;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever records a checksummed checkpoint holds (any UID, name, device,
        /// state), a start recovers from them: it never fails on its own state, it
        /// keeps no record it could not act on, and it still prepares.
        #[test]
        fn a_start_survives_any_checksummed_records(mut cp in arb_checkpoint(), same_boot in any::<bool>()) {
            let node = Node::new(2);
            if same_boot {
                cp.boot_id = "boot-1".into();
            }
            let store = crate::checkpoint::CheckpointStore::new(node.dir.path().join("state"));
            store.save(&cp).unwrap();
            let (p, report) = node.start_with_boot("boot-1");
            let kept = p.checkpoint();
            for uid in kept.claims.keys() {
                prop_assert!(crate::cdi::check_claim_uid(uid).is_ok(), "{uid:?} kept");
            }
            prop_assert!(kept.claims.values().all(|r| r.state != ClaimState::PrepareStarted));
            prop_assert_eq!(
                report.bad_records.len(),
                cp.claims.keys().filter(|u| crate::cdi::check_claim_uid(u).is_err()).count()
            );
            // gpu-0 and gpu-1 are free unless a kept record names them.
            let held: Vec<&str> = kept
                .claims
                .values()
                .flat_map(|r| r.devices.iter().filter(|d| d.pool == NODE).map(|d| d.device.as_str()))
                .collect();
            if !held.contains(&"gpu-0") {
                p.prepare(&claim_ref("fresh"), &claim("fresh", &[0])).unwrap();
            }
        }
    }
}

/// A started record whose MIG instance cannot be removed (here: no NVML to remove
/// it with) is not rolled back and not kept half-way either: it keeps its devices
/// as a claim to prepare again, and the start says why.
#[test]
fn a_rollback_that_cannot_remove_its_instance_keeps_the_claim_to_prepare_again() {
    let node = Node::new(2);
    node.start()
        .prepare(&claim_ref("u1"), &claim("u1", &[0]))
        .unwrap();
    save_checkpoint_with(&node, |cp| {
        let mut r = cp.get("u1").cloned().unwrap();
        r.state = ClaimState::PrepareStarted;
        r.devices[0].mig = Some(topodra_model::checkpoint::MigIntent {
            parent_uuid: "GPU-00000000".into(),
            profile_id: 19,
            start: 6,
            size: 1,
        });
        cp.insert(r);
    });
    std::fs::remove_file(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json")).unwrap();
    let (p, report) = node.start_with_boot("boot-1");
    assert!(report.rolled_back.is_empty(), "{report:?}");
    assert_eq!(report.rollback_pending.len(), 1, "{report:?}");
    assert!(report.rollback_pending[0].starts_with("u1: "), "{report:?}");
    let kept = p.checkpoint();
    assert_eq!(kept.get("u1").unwrap().state, ClaimState::NeedsReprepare);
    // Its GPU stays held.
    let err = p.prepare(&claim_ref("u2"), &claim("u2", &[0])).unwrap_err();
    assert!(matches!(err, ClaimError::DeviceInUse(_)), "{err}");
}

mod sharing;
