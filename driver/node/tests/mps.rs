//! MPS shares on a simulated L40S node: the fake NVML keeps each GPU's compute
//! mode and the fake driver root's `nvidia-cuda-mps-control` runs real daemon
//! processes, so the prepare state machine is checked against what a node's
//! driver would have been told: the first share sets EXCLUSIVE_PROCESS and starts
//! the GPU's daemon, the last one stops it and puts the mode back, and a crash at
//! each step is undone at the next start.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nvml_wrapper::Nvml;
use topodra_fake_nvml::driver_root;
use topodra_fake_nvml::ffi::mig::state;
use topodra_fake_nvml::sim::{self, SimNode};
use topodra_fake_nvml::{Profile, cdylib_path};
use topodra_model::Inventory;
use topodra_model::checkpoint::ClaimIdentity;
use topodra_model::slice::{Mps, Sharing, TimeSlicing};
use topodra_node::cdi::{CdiConfig, ContainerEdits, NvidiaFiles, NvidiaFilesSource, Spec};
use topodra_node::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_node::dynamic_mig::Carver;
use topodra_node::prepare::{ClaimError, CrashPoint, Preparer, PreparerConfig};
use topodra_node::sharing::MpsControl;

const DRIVER: &str = "gpu.topodra.dev";
const NODE: &str = "node-a";

struct Node {
    dir: tempfile::TempDir,
    sim: SimNode,
    inventory: Inventory,
    /// Dynamic MIG with MPS shares of the 3g.40gb partitions.
    mig: bool,
}

impl Node {
    fn new() -> Self {
        Self::of("l40s-pcie", false)
    }

    /// A DGX H100 with every GPU in MIG mode and no instance, under dynamic MIG.
    fn mig() -> Self {
        Self::of("dgx-h100-mig", true)
    }

    fn of(profile: &str, mig: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let yaml = Profile::builtin(profile).unwrap().to_yaml();
        let sim = sim::materialize(&dir.path().join("sim"), &yaml, &cdylib_path()).unwrap();
        let mut config = DiscoveryConfig::default();
        config.nvml_lib = Some(sim.nvml_lib.clone());
        config.nvml = NvmlPolicy::Required;
        config.topology = TopologyInput::HwlocXml(sim.hwloc_xml.clone());
        config.sysfs_root = PathBuf::from("/nonexistent");
        let inventory = discovery::discover(&config).unwrap();
        Self {
            dir,
            sim,
            inventory,
            mig,
        }
    }

    fn mps_dir(&self) -> PathBuf {
        self.dir.path().join("state/mps")
    }

    fn start_with(&self, boot_id: &str) -> (Preparer, topodra_node::prepare::StartupReport) {
        let nvml = Nvml::builder()
            .lib_path(self.sim.nvml_lib.as_os_str())
            .init()
            .unwrap();
        let mps = MpsControl::find(
            nvml,
            &self.sim.driver_root,
            Some(&self.sim.nvml_lib),
            self.mps_dir(),
        )
        .unwrap();
        let config = PreparerConfig {
            driver_name: DRIVER.into(),
            node_name: NODE.into(),
            state_dir: self.dir.path().join("state"),
            boot_id: boot_id.into(),
            cdi_spec_dir: self.dir.path().join("cdi"),
            dynamic_mig: self.mig,
            carver: self.mig.then(|| {
                Arc::new(Carver::new(
                    Nvml::builder()
                        .lib_path(self.sim.nvml_lib.as_os_str())
                        .init()
                        .unwrap(),
                ))
            }),
            sharing: Sharing {
                mps: Some(Mps::default()),
                time_slicing: self.mig.then(TimeSlicing::default),
                mig_profiles: if self.mig {
                    vec!["3g.40gb".to_owned()]
                } else {
                    Vec::new()
                },
            },
            time_slicer: None,
            mps: Some(Arc::new(mps)),
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

    fn start(&self) -> Preparer {
        self.start_with("boot-1").0
    }

    fn uuid(&self, index: usize) -> String {
        self.inventory.gpus[index].uuid.clone().unwrap()
    }

    fn compute_mode(&self, index: usize) -> u32 {
        state::compute_mode(&self.sim.nvml_state, &self.uuid(index)).unwrap()
    }

    fn calls(&self) -> Vec<String> {
        driver_root::mps_control_calls(&self.sim.driver_root).unwrap()
    }

    fn pipe(&self, gpu: &str) -> PathBuf {
        self.mps_dir().join(gpu).join("pipe")
    }

    fn daemon_alive(&self, gpu: &str) -> bool {
        match driver_root::mps_daemon_pid(&self.pipe(gpu)).unwrap() {
            Some(pid) => Path::new(&format!("/proc/{pid}")).exists() && !zombie(pid),
            None => false,
        }
    }

    fn spec(&self, uid: &str) -> Spec {
        let path = self
            .dir
            .path()
            .join(format!("cdi/k8s.gpu.topodra.dev-claim_{uid}.json"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

impl Drop for Node {
    /// No daemon outlives its test, whatever the test left.
    fn drop(&mut self) {
        let Ok(gpus) = std::fs::read_dir(self.mps_dir()) else {
            return;
        };
        for gpu in gpus.flatten() {
            if let Ok(Some(pid)) = driver_root::mps_daemon_pid(&gpu.path().join("pipe")) {
                // SAFETY: a plain kill(2) of a process this test's plugin started.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
    }
}

/// Whether `pid` has exited and waits to be reaped (the daemons' parent, the
/// test's init, may reap late).
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

fn identity(uid: &str) -> ClaimIdentity {
    ClaimIdentity {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

/// Claim `uid`'s share of `device`, with `memory` and `compute` percent of it.
fn share(uid: &str, device: &str, memory: &str, compute: u32) -> ResourceClaim {
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
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: DRIVER.into(),
                        pool: NODE.into(),
                        device: device.into(),
                        share_id: Some(format!("share-{uid}")),
                        consumed_capacity: Some(BTreeMap::from([
                            ("memory".to_owned(), Quantity(memory.to_owned())),
                            ("compute".to_owned(), Quantity(compute.to_string())),
                        ])),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn prepare(p: &Preparer, uid: &str, device: &str, memory: &str, compute: u32) {
    p.prepare(&identity(uid), &share(uid, device, memory, compute))
        .unwrap();
}

#[test]
fn two_shares_run_under_one_daemon_and_each_container_gets_its_limits() {
    let node = Node::new();
    let p = node.start();
    assert_eq!(node.compute_mode(2), 0);
    prepare(&p, "u1", "gpu-2-mps", "10Gi", 30);
    assert_eq!(node.compute_mode(2), 3, "EXCLUSIVE_PROCESS while MPS runs");
    assert!(node.daemon_alive("gpu-2"));
    let pipe = node.pipe("gpu-2");
    let log = node.mps_dir().join("gpu-2/log");
    assert_eq!(
        node.calls(),
        [driver_root::mps_start_call(&pipe, &log, &node.uuid(2))]
    );

    prepare(&p, "u2", "gpu-2-mps", "20Gi", 50);
    assert_eq!(node.calls().len(), 1, "the second share finds the daemon");

    let spec = node.spec("u2");
    let edits = &spec.devices[0].container_edits;
    for want in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
    ] {
        assert!(edits.env.iter().any(|e| e == want), "{:?}", edits.env);
    }
    assert_eq!(edits.mounts[0].host_path, pipe.display().to_string());
    // The daemon's /dev/shm is the directory every share's container gets there.
    let shm = node.mps_dir().join("gpu-2/shm");
    assert_eq!(edits.mounts[1].host_path, shm.display().to_string());
    assert_eq!(edits.mounts[1].container_path, "/dev/shm");
    let pid = driver_root::mps_daemon_pid(&pipe).unwrap().unwrap();
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    assert_eq!(
        inode(Path::new(&format!("/proc/{pid}/root/dev/shm"))),
        inode(&shm),
        "the daemon's /dev/shm"
    );

    p.unprepare("u1").unwrap();
    assert!(node.daemon_alive("gpu-2"), "u2 still runs on it");
    assert_eq!(node.compute_mode(2), 3);
    p.unprepare("u2").unwrap();
    assert_eq!(node.compute_mode(2), 0, "the mode before MPS is back");
    assert_eq!(
        node.calls().last().unwrap(),
        &driver_root::mps_quit_call(&pipe)
    );
    assert!(!node.daemon_alive("gpu-2"));
}

#[test]
fn the_daemon_outlives_the_plugin_and_a_new_one_finds_it() {
    let node = Node::new();
    let p = node.start();
    prepare(&p, "u1", "gpu-5-mps", "1Gi", 10);
    drop(p);
    assert!(node.daemon_alive("gpu-5"), "no plugin process holds it");
    let p = node.start();
    // A retried prepare of the same claim changes nothing and keeps the mode
    // the GPU had before MPS (not the EXCLUSIVE_PROCESS it has now).
    prepare(&p, "u1", "gpu-5-mps", "1Gi", 10);
    assert_eq!(node.calls().len(), 1);
    let record = p.checkpoint().get("u1").cloned().unwrap();
    assert_eq!(
        record.devices[0]
            .sharing
            .as_ref()
            .unwrap()
            .prior_compute_mode,
        Some(0)
    );
    prepare(&p, "u2", "gpu-5-mps", "1Gi", 10);
    assert_eq!(node.calls().len(), 1);
    p.unprepare("u1").unwrap();
    p.unprepare("u2").unwrap();
    assert!(!node.daemon_alive("gpu-5"));
    assert_eq!(node.compute_mode(5), 0);
}

#[test]
fn a_crash_at_each_mps_step_is_undone_at_the_next_start() {
    for point in [
        CrashPoint::AfterStartedRecord,
        CrashPoint::AfterComputeMode,
        CrashPoint::AfterMpsDaemon,
    ] {
        let node = Node::new();
        let p = node
            .start()
            .with_crash_hook(Arc::new(move |at| at == point));
        let err = p
            .prepare(&identity("u1"), &share("u1", "gpu-1-mps", "1Gi", 10))
            .unwrap_err();
        assert!(matches!(err, ClaimError::Crashed(_)), "{point:?}: {err}");
        drop(p);
        let (p, report) = node.start_with("boot-1");
        assert_eq!(report.rolled_back, ["u1"], "{point:?}");
        assert!(!node.daemon_alive("gpu-1"), "{point:?}");
        assert_eq!(node.compute_mode(1), 0, "{point:?}");
        // The kubelet's retry sets it all up again.
        prepare(&p, "u1", "gpu-1-mps", "1Gi", 10);
        assert!(node.daemon_alive("gpu-1"), "{point:?}");
        p.unprepare("u1").unwrap();
        assert!(!node.daemon_alive("gpu-1"), "{point:?}");
    }
}

#[test]
fn a_daemon_killed_behind_the_plugins_back_does_not_block_unprepare() {
    let node = Node::new();
    let p = node.start();
    prepare(&p, "u1", "gpu-0-mps", "1Gi", 10);
    let pid = driver_root::mps_daemon_pid(&node.pipe("gpu-0"))
        .unwrap()
        .unwrap();
    // SAFETY: a plain kill(2) of the daemon the plugin started.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
    // Whether the kill lands before or after the unprepare tells the daemon to
    // quit, the unprepare finds it gone and goes on.
    p.unprepare("u1").unwrap();
    assert_eq!(node.compute_mode(0), 0);
    assert!(!node.daemon_alive("gpu-0"));
}

/// With the host's namespaces (the chart's `--mps-host-namespaces`): the daemon
/// enters PID 1's mount and cgroup namespaces before it runs. Only where this
/// process may enter them and they are its own (a plain host, not a sandbox whose
/// PID 1 is someone else's), so the driver root's paths mean the same there.
#[test]
fn a_daemon_starts_in_the_hosts_namespaces_where_they_can_be_entered() {
    let own = |ns: &str| std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
    let init = |ns: &str| std::fs::read_link(format!("/proc/1/ns/{ns}")).ok();
    if ["mnt", "cgroup"]
        .iter()
        .any(|ns| init(ns).is_none() || init(ns) != own(ns))
    {
        eprintln!(
            "skipped: PID 1's mount or cgroup namespace is not readable or not this process's"
        );
        return;
    }
    let node = Node::new();
    let nvml = Nvml::builder()
        .lib_path(node.sim.nvml_lib.as_os_str())
        .init()
        .unwrap();
    let mps = MpsControl::find(nvml, &node.sim.driver_root, None, node.mps_dir())
        .unwrap()
        .in_host_namespaces(topodra_node::sharing::HostNamespaces {
            host_root: node.sim.driver_root.clone(),
            local_root: node.sim.driver_root.clone(),
        })
        .unwrap();
    let dirs = mps.start("gpu-0", &node.uuid(0)).unwrap();
    assert!(node.daemon_alive("gpu-0"));
    mps.stop(&dirs.pipe).unwrap();
    assert!(!node.daemon_alive("gpu-0"));
}

/// MPS on a dynamically made MIG partition: the first share makes the 3g.40gb
/// instance and starts a daemon for its MIG device (no compute mode change: MIG
/// GPUs refuse one), the second share uses both, and the last one's unprepare
/// quits the daemon and removes the instance.
#[test]
fn two_mps_shares_of_one_partition_share_its_instance_and_daemon() {
    let node = Node::mig();
    let p = node.start();
    let device = "gpu-3-mig-3g-40gb-4-mps";
    let partition = "gpu-3-mig-3g-40gb-4";
    let spans = || {
        state::read(&node.sim.nvml_state)
            .unwrap()
            .spans_of(&node.uuid(3))
    };
    prepare(&p, "u1", device, "10Gi", 50);
    assert_eq!(
        spans(),
        [(4, 4, 1)],
        "one instance, with its compute instance"
    );
    assert!(node.daemon_alive(partition));
    let start = node.calls();
    assert_eq!(start.len(), 1);
    assert!(
        start[0].contains("visible=MIG-"),
        "the daemon is the MIG device's: {start:?}"
    );
    assert_eq!(node.compute_mode(3), 0, "a MIG GPU keeps its compute mode");
    let spec = node.spec("u1");
    let nodes = &spec.devices[0].container_edits.device_nodes;
    assert!(
        nodes
            .iter()
            .any(|n| n.path.starts_with("/dev/nvidia-caps/")),
        "the share gets the MIG device's capability nodes: {nodes:?}"
    );

    prepare(&p, "u2", device, "10Gi", 50);
    assert_eq!(spans(), [(4, 4, 1)], "the second share uses the instance");
    assert_eq!(node.calls().len(), 1, "and the daemon");

    // The partition itself, and the other mode's device, are another claim's
    // only once the shares are gone.
    let err = p
        .prepare(
            &identity("u3"),
            &share("u3", "gpu-3-mig-3g-40gb-4-ts", "1Gi", 0),
        )
        .unwrap_err();
    assert!(matches!(err, ClaimError::DeviceInUse(_)), "{err}");

    p.unprepare("u1").unwrap();
    assert_eq!(spans(), [(4, 4, 1)], "u2 still holds it");
    assert!(node.daemon_alive(partition));
    p.unprepare("u2").unwrap();
    assert!(spans().is_empty(), "the last share removed the instance");
    assert!(!node.daemon_alive(partition));
    assert_eq!(
        node.calls().last().unwrap(),
        &driver_root::mps_quit_call(&node.pipe(partition))
    );
}
