//! Shares of a time-sliced GPU: several claims on one device, the interval set by
//! the first share and reset after the last, and each failure undone.

use std::os::unix::fs::PermissionsExt as _;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use topodra_model::config::v1alpha1::TimeSliceInterval;
use topodra_model::slice::TimeSlicing;

use super::*;

/// A node of four GPUs with 80 GiB each, time-sliced at `interval`, whose
/// driver root's `nvidia-smi` is a script that logs its arguments (and fails
/// while `fail` exists).
struct SharedNode {
    node: Node,
    interval: TimeSliceInterval,
}

impl SharedNode {
    fn new(interval: TimeSliceInterval) -> Self {
        let node = Node::new(4);
        let bin = node.dir.path().join("driver/usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = node.dir.path().join("smi.log");
        let fail = node.dir.path().join("fail");
        let script = format!(
            "#!/bin/sh\nif [ -e {fail} ]; then echo 'GPU is lost' >&2; exit 15; fi\necho \"$*\" >> {log}\n",
            fail = fail.display(),
            log = log.display()
        );
        let smi = bin.join("nvidia-smi");
        std::fs::write(&smi, script).unwrap();
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { node, interval }
    }

    fn inventory(&self) -> Inventory {
        let mut inv = inventory(4);
        for g in &mut inv.gpus {
            g.memory_bytes = Some(80 << 30);
        }
        inv
    }

    fn config(&self, boot_id: &str) -> PreparerConfig {
        let mut config = self.node.config(boot_id);
        config.sharing.time_slicing = Some(TimeSlicing {
            interval: self.interval,
            replicas: 4,
        });
        config.time_slicer = Some(Arc::new(
            TimeSlicer::find(&self.node.dir.path().join("driver"), None).unwrap(),
        ));
        config
    }

    fn start_with_boot(&self, boot_id: &str) -> (Preparer, StartupReport) {
        Preparer::start(
            &self.config(boot_id),
            &self.inventory(),
            Box::new(TableDeviceNodes::nvidia(0..4, 509)),
            nvidia_files(),
        )
        .unwrap()
    }

    fn start(&self) -> Preparer {
        self.start_with_boot("boot-1").0
    }

    /// What `nvidia-smi` was told, one call a line.
    fn smi_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.node.dir.path().join("smi.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn fail_smi(&self, fail: bool) {
        let path = self.node.dir.path().join("fail");
        if fail {
            std::fs::write(path, "").unwrap();
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A claim for a share of `device` with `share_id`, `memory` consumed.
fn share(uid: &str, device: &str, share_id: Option<&str>, memory: &str) -> ResourceClaim {
    let mut r = result("gpu", device);
    r.share_id = share_id.map(str::to_owned);
    r.consumed_capacity = Some(std::collections::BTreeMap::from([(
        "memory".to_owned(),
        Quantity(memory.to_owned()),
    )]));
    claim_with(uid, vec![r], vec![])
}

/// Prepares claim `uid`'s share `share_id` of `device`, with `memory` of it.
fn prepare_share(
    p: &Preparer,
    uid: &str,
    device: &str,
    share_id: &str,
    memory: &str,
) -> Result<Vec<PreparedGpu>, ClaimError> {
    p.prepare(&claim_ref(uid), &share(uid, device, Some(share_id), memory))
}

const GPU1: &str = "GPU-00000001";

fn set(value: u8) -> String {
    format!("compute-policy -i {GPU1} --set-timeslice {value}")
}

#[test]
fn two_claims_share_a_gpu_the_first_sets_the_interval_and_the_last_resets_it() {
    let node = SharedNode::new(TimeSliceInterval::Long);
    let p = node.start();
    let a = p
        .prepare(
            &claim_ref("u1"),
            &share("u1", "gpu-1-ts", Some("s-1"), "20Gi"),
        )
        .unwrap();
    assert_eq!(a[0].share_id.as_deref(), Some("s-1"));
    let shared = a[0].sharing.as_ref().unwrap();
    assert_eq!(shared.gpu_device, "gpu-1");
    assert_eq!(shared.gpu_uuid, GPU1);
    assert_eq!(shared.timeslice, 3);
    assert_eq!(shared.memory_bytes, Some(20 << 30));
    assert_eq!(node.smi_calls(), [set(3)]);

    prepare_share(&p, "u2", "gpu-1-ts", "s-2", "40Gi").unwrap();
    // The second share finds the interval set.
    assert_eq!(node.smi_calls(), [set(3)]);

    // Each container is told its own share, and that it is not enforced.
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            node.node
                .cdi_dir()
                .join("k8s.gpu.topodra.dev-claim_u2.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let env = &spec["devices"][0]["containerEdits"]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&"TOPODRA_GPU_MEMORY_SHARE=42949672960".into()),
        "{env}"
    );

    p.unprepare("u1").unwrap();
    assert_eq!(
        node.smi_calls(),
        [set(3)],
        "a share is left: the interval stays"
    );
    p.unprepare("u2").unwrap();
    assert_eq!(node.smi_calls(), [set(3), set(0)]);
    // Unprepare is idempotent and touches nothing the second time.
    p.unprepare("u2").unwrap();
    assert_eq!(node.smi_calls().len(), 2);
}

#[test]
fn the_default_interval_changes_nothing_on_the_gpu() {
    let node = SharedNode::new(TimeSliceInterval::Default);
    let p = node.start();
    prepare_share(&p, "u1", "gpu-0-ts", "s-1", "1Gi").unwrap();
    p.unprepare("u1").unwrap();
    assert!(node.smi_calls().is_empty());
}

#[test]
fn one_share_id_is_one_claims() {
    let node = SharedNode::new(TimeSliceInterval::Default);
    let p = node.start();
    prepare_share(&p, "u1", "gpu-0-ts", "s-1", "1Gi").unwrap();
    let err = p
        .prepare(
            &claim_ref("u2"),
            &share("u2", "gpu-0-ts", Some("s-1"), "1Gi"),
        )
        .unwrap_err();
    assert!(matches!(err, ClaimError::DeviceInUse(_)), "{err}");
}

#[test]
fn a_gpu_and_a_share_of_it_exclude_each_other() {
    let node = SharedNode::new(TimeSliceInterval::Default);
    let p = node.start();
    prepare_share(&p, "u1", "gpu-2-ts", "s-1", "1Gi").unwrap();
    let err = p.prepare(&claim_ref("u2"), &claim("u2", &[2])).unwrap_err();
    assert!(
        matches!(&err, ClaimError::DeviceInUse(e) if e.device == "gpu-2-ts"),
        "{err}"
    );
    p.unprepare("u1").unwrap();
    p.prepare(&claim_ref("u2"), &claim("u2", &[2])).unwrap();
    let err = p
        .prepare(
            &claim_ref("u3"),
            &share("u3", "gpu-2-ts", Some("s-3"), "1Gi"),
        )
        .unwrap_err();
    assert!(
        matches!(&err, ClaimError::DeviceInUse(e) if e.device == "gpu-2"),
        "{err}"
    );
}

#[test]
fn a_share_without_a_share_id_is_refused() {
    let node = SharedNode::new(TimeSliceInterval::Default);
    let p = node.start();
    let err = p
        .prepare(&claim_ref("u1"), &share("u1", "gpu-0-ts", None, "1Gi"))
        .unwrap_err();
    assert!(matches!(err, ClaimError::NoShareId { .. }), "{err}");
    assert!(p.checkpoint().claims.is_empty());
}

#[test]
fn a_failed_interval_rolls_the_share_back() {
    let node = SharedNode::new(TimeSliceInterval::Short);
    let p = node.start();
    node.fail_smi(true);
    let err = p
        .prepare(
            &claim_ref("u1"),
            &share("u1", "gpu-1-ts", Some("s-1"), "1Gi"),
        )
        .unwrap_err();
    assert!(matches!(err, ClaimError::Sharing { .. }), "{err}");
    assert!(err.to_string().contains("GPU is lost"), "{err}");
    assert_eq!(err.kind().as_str(), "sharing");
    assert!(node.node.spec_files().is_empty());
    // The GPU may have taken the setting before nvidia-smi failed, and resetting
    // it failed too: the started record stays, to be undone by the retry, an
    // unprepare or the next start.
    assert_eq!(
        p.checkpoint().get("u1").unwrap().state,
        ClaimState::PrepareStarted
    );

    // An unprepare whose reset fails keeps the record for the kubelet's retry.
    node.fail_smi(false);
    prepare_share(&p, "u1", "gpu-1-ts", "s-1", "1Gi").unwrap();
    node.fail_smi(true);
    assert!(p.unprepare("u1").is_err());
    assert!(p.checkpoint().get("u1").is_some());
    node.fail_smi(false);
    p.unprepare("u1").unwrap();
    assert_eq!(node.smi_calls(), [set(1), set(0)]);
}

#[test]
fn a_crash_after_the_interval_is_undone_at_the_next_start() {
    let node = SharedNode::new(TimeSliceInterval::Medium);
    let p = node
        .start()
        .with_crash_hook(Arc::new(|at| at == CrashPoint::AfterTimeSlice));
    let err = p
        .prepare(
            &claim_ref("u1"),
            &share("u1", "gpu-1-ts", Some("s-1"), "1Gi"),
        )
        .unwrap_err();
    assert!(matches!(err, ClaimError::Crashed(_)), "{err}");
    assert_eq!(node.smi_calls(), [set(2)]);
    drop(p);
    let (p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.rolled_back, ["u1"]);
    assert_eq!(node.smi_calls(), [set(2), set(0)]);
    assert!(p.checkpoint().claims.is_empty());
}

#[test]
fn a_crash_beside_a_live_share_leaves_the_interval_set() {
    let node = SharedNode::new(TimeSliceInterval::Medium);
    let p = node.start();
    prepare_share(&p, "u1", "gpu-1-ts", "s-1", "1Gi").unwrap();
    drop(p);
    let p = node
        .start()
        .with_crash_hook(Arc::new(|at| at == CrashPoint::AfterStartedRecord));
    assert!(prepare_share(&p, "u2", "gpu-1-ts", "s-2", "1Gi").is_err());
    drop(p);
    let (p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.rolled_back, ["u2"]);
    assert_eq!(node.smi_calls(), [set(2)], "u1 still runs at the interval");
    assert!(p.checkpoint().get("u1").is_some());
}

#[test]
fn a_reboot_sets_the_interval_again_at_the_first_prepare() {
    let node = SharedNode::new(TimeSliceInterval::Long);
    let p = node.start();
    prepare_share(&p, "u1", "gpu-1-ts", "s-1", "1Gi").unwrap();
    prepare_share(&p, "u2", "gpu-1-ts", "s-2", "1Gi").unwrap();
    drop(p);
    // The driver forgot the setting; both records wait to be prepared again.
    let (p, _) = node.start_with_boot("boot-2");
    prepare_share(&p, "u2", "gpu-1-ts", "s-2", "1Gi").unwrap();
    assert_eq!(node.smi_calls(), [set(3), set(3)]);
    prepare_share(&p, "u1", "gpu-1-ts", "s-1", "1Gi").unwrap();
    assert_eq!(node.smi_calls().len(), 2);
}

#[test]
fn a_rebuilt_checkpoint_keeps_each_share() {
    let node = SharedNode::new(TimeSliceInterval::Long);
    let p = node.start();
    prepare_share(&p, "u1", "gpu-1-ts", "s-1", "20Gi").unwrap();
    prepare_share(&p, "u2", "gpu-1-ts", "s-2", "20Gi").unwrap();
    let before = p.checkpoint();
    drop(p);
    std::fs::write(
        node.node.dir.path().join("state/checkpoint.json"),
        b"garbage",
    )
    .unwrap();
    let (p, report) = node.start_with_boot("boot-1");
    assert_eq!(report.rebuilt.len(), 2);
    let after = p.checkpoint();
    for uid in ["u1", "u2"] {
        let got = &after.get(uid).unwrap().devices[0];
        let want = &before.get(uid).unwrap().devices[0];
        assert_eq!(got.share_id, want.share_id);
        assert_eq!(got.sharing, want.sharing);
    }
    // A third share still prepares beside the rebuilt two, and the last
    // unprepare resets the interval.
    prepare_share(&p, "u3", "gpu-1-ts", "s-3", "20Gi").unwrap();
    for uid in ["u1", "u2", "u3"] {
        p.unprepare(uid).unwrap();
    }
    assert_eq!(node.smi_calls(), [set(3), set(0)]);
}
