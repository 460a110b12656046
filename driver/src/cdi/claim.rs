//! The CDI spec of one prepared claim.
//!
//! One spec per claim, of the installation's [`CdiKind`], one CDI device per allocated GPU named
//! `<claimUID>-<deviceName>` so names never collide across claims in the shared
//! spec directory. A GPU's own device node is a per-device edit; everything any GPU
//! needs (control nodes, driver files, env hints) is claim-wide, which runtimes apply
//! once however many of the claim's devices a container gets.

use std::collections::BTreeSet;

use super::driver_files::DriverFiles;
use super::nodes::{DeviceNodes, NodeInfo, dev_path};
use super::spec::{ContainerEdits, Device, DeviceNode, Spec};
use super::version::minimum_version;
use super::{CdiError, CdiKind, cdi_device_name, check_claim_uid, validate};
use crate::cpuset::IdList;
use crate::inventory::{AllocatableDevice, Gpu};

/// Annotation keys on the spec, so an operator reading `/var/run/cdi` can tell which
/// claim a file belongs to without the checkpoint.
pub(crate) const ANNOTATION_CLAIM_UID: &str = "topodra.dev/claim-uid";
pub(crate) const ANNOTATION_CLAIM_NAMESPACE: &str = "topodra.dev/claim-namespace";
pub(crate) const ANNOTATION_CLAIM_NAME: &str = "topodra.dev/claim-name";
/// On each device, when NVML gave the GPU a UUID.
pub(crate) const ANNOTATION_GPU_UUID: &str = "topodra.dev/gpu-uuid";
/// On each device: the claim's requests it serves, comma-separated (request names are
/// DNS labels, so they hold no comma).
pub(crate) const ANNOTATION_REQUESTS: &str = "topodra.dev/requests";

/// Env hints (when [`ClaimSpecRequest::env_hints`] is on). They describe the whole
/// claim: env is claim-wide, because per-device values for one key would overwrite
/// each other in a container that gets several of the claim's GPUs.
pub(crate) const ENV_VISIBLE_GPUS: &str = "TOPODRA_VISIBLE_GPUS";
pub(crate) const ENV_NUMA_NODES: &str = "TOPODRA_NUMA_NODES";
pub(crate) const ENV_CPUS: &str = "TOPODRA_CPUS";
/// CUDA numbers devices fastest-first by default; bus order makes CUDA's device
/// indices agree with NVML's and `nvidia-smi`'s inside the container.
pub(crate) const ENV_CUDA_DEVICE_ORDER: &str = "CUDA_DEVICE_ORDER=PCI_BUS_ID";

/// Cgroup access for device nodes: containers read and write them but have no reason
/// to create nodes (`m`).
const NODE_PERMISSIONS: &str = "rw";

/// One allocated device (a GPU or a MIG device), with what the spec needs from the
/// inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimGpu {
    /// The device name in the ResourceSlice and allocation result (`gpu-3`).
    pub device_name: String,
    /// Minor of `/dev/nvidia<minor>` (a MIG device's parent GPU).
    pub minor: u32,
    /// The UUID the workload sees (a MIG device's own).
    pub uuid: Option<String>,
    pub numa_node: Option<u32>,
    pub local_cpus: IdList,
    /// For a MIG device, its capability nodes under `/dev` (see
    /// [`DeviceNodes::mig_access_nodes`]): without them CUDA sees the parent GPU's
    /// node but cannot open the MIG device.
    pub mig_nodes: Vec<String>,
    /// The claim's requests this device serves (base names), kept in the spec so a
    /// checkpoint rebuilt from specs still answers the kubelet with them.
    pub requests: Vec<String>,
}

impl ClaimGpu {
    /// Takes the device name and node data from an inventory GPU. A GPU without a
    /// minor (NVML did not see it) has no device node we could hand out.
    pub(crate) fn from_gpu(gpu: &Gpu) -> Result<Self, CdiError> {
        let device_name = gpu.device_name();
        let minor = gpu.minor.ok_or_else(|| CdiError::GpuWithoutMinor {
            device: device_name.clone(),
        })?;
        Ok(Self {
            device_name,
            minor,
            uuid: gpu.uuid.clone(),
            numa_node: gpu.numa_node,
            local_cpus: gpu.local_cpus.clone(),
            mig_nodes: Vec::new(),
            requests: Vec::new(),
        })
    }

    /// A whole GPU as [`ClaimGpu::from_gpu`]; a MIG device with its parent's node,
    /// its own UUID and its capability nodes, looked up now so a missing one fails
    /// the prepare instead of the container start.
    pub(crate) fn from_device(
        dev: &AllocatableDevice,
        nodes: &dyn DeviceNodes,
    ) -> Result<Self, CdiError> {
        let mut out = Self::from_gpu(&dev.gpu)?;
        if let Some(mig) = &dev.mig {
            out.device_name = dev.name();
            out.uuid = Some(mig.uuid.clone());
            out.mig_nodes =
                nodes.mig_access_nodes(out.minor, mig.gpu_instance, mig.compute_instance)?;
        }
        Ok(out)
    }
}

/// What to build a claim's spec from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpecRequest {
    pub claim_uid: String,
    pub claim_namespace: String,
    pub claim_name: String,
    /// In allocation order; the env hints list UUIDs in this order.
    pub gpus: Vec<ClaimGpu>,
    /// Adds the `TOPODRA_*` topology hints and `CUDA_DEVICE_ORDER`.
    pub env_hints: bool,
    /// The installation's spec kind (from its driver name).
    pub kind: CdiKind,
}

impl ClaimSpecRequest {
    /// The CDI ids to return to the kubelet, one per GPU, in request order.
    pub fn cdi_device_ids(&self) -> Vec<String> {
        self.gpus
            .iter()
            .map(|g| self.kind.device_id(&self.claim_uid, &g.device_name))
            .collect()
    }
}

/// Builds the claim's spec, carrying the lowest `cdiVersion` its fields allow, and
/// checks it with `validate` so a spec runtimes would refuse is never returned.
pub fn claim_spec(
    req: &ClaimSpecRequest,
    nodes: &dyn DeviceNodes,
    driver: &DriverFiles,
) -> Result<Spec, CdiError> {
    check_claim_uid(&req.claim_uid)?;
    if req.gpus.is_empty() {
        return Err(CdiError::NoDevices {
            claim_uid: req.claim_uid.clone(),
        });
    }
    let mut names = BTreeSet::new();
    for g in &req.gpus {
        if !names.insert(g.device_name.as_str()) {
            return Err(CdiError::DuplicateDevice {
                device: g.device_name.clone(),
            });
        }
    }

    let mut devices = Vec::with_capacity(req.gpus.len());
    for gpu in &req.gpus {
        let node_name = format!("nvidia{}", gpu.minor);
        let mut device_nodes = Vec::with_capacity(1 + gpu.mig_nodes.len());
        for name in std::iter::once(&node_name).chain(&gpu.mig_nodes) {
            device_nodes.push(device_node(name, required_node(nodes, name)?));
        }
        let mut device = Device {
            name: cdi_device_name(&req.claim_uid, &gpu.device_name),
            container_edits: ContainerEdits {
                device_nodes,
                ..Default::default()
            },
            ..Default::default()
        };
        if let Some(uuid) = &gpu.uuid {
            device
                .annotations
                .insert(ANNOTATION_GPU_UUID.into(), uuid.clone());
        }
        if !gpu.requests.is_empty() {
            device
                .annotations
                .insert(ANNOTATION_REQUESTS.into(), gpu.requests.join(","));
        }
        devices.push(device);
    }

    let mut device_nodes = Vec::new();
    for name in ["nvidiactl", "nvidia-uvm"] {
        device_nodes.push(device_node(name, required_node(nodes, name)?));
    }
    // Only profilers use it; a node without it still runs CUDA.
    match nodes.lookup("nvidia-uvm-tools")? {
        Some(info) => device_nodes.push(device_node("nvidia-uvm-tools", info)),
        None => tracing::debug!("no nvidia-uvm-tools device; leaving it out"),
    }

    let own_env = if req.env_hints {
        env_hints(&req.gpus)
    } else {
        Vec::new()
    };
    let own_keys: BTreeSet<&str> = own_env.iter().filter_map(|e| env_key(e)).collect();
    let mut env = own_env.clone();
    env.extend(
        driver
            .edits
            .env
            .iter()
            .filter(|e| env_key(e).is_none_or(|k| !own_keys.contains(k)))
            .cloned(),
    );

    let mut spec = Spec {
        cdi_version: String::new(),
        kind: req.kind.kind(),
        annotations: [
            (ANNOTATION_CLAIM_UID, &req.claim_uid),
            (ANNOTATION_CLAIM_NAMESPACE, &req.claim_namespace),
            (ANNOTATION_CLAIM_NAME, &req.claim_name),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect(),
        devices,
        container_edits: ContainerEdits {
            env,
            device_nodes,
            hooks: driver.edits.hooks.clone(),
            mounts: driver.edits.mounts.clone(),
            ..Default::default()
        },
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    validate(&spec).map_err(|problems| CdiError::InvalidSpec {
        claim_uid: req.claim_uid.clone(),
        problems,
    })?;
    Ok(spec)
}

fn required_node(nodes: &dyn DeviceNodes, name: &str) -> Result<NodeInfo, CdiError> {
    nodes
        .lookup(name)?
        .ok_or_else(|| CdiError::MissingDeviceNode {
            path: dev_path(name),
        })
}

/// Type, major and minor are all stated, so the runtime does not need the node to
/// exist on the host; `fileMode`, `uid` and `gid` are left to the runtime, which takes
/// the mode from the host node and the owner from the container's user.
fn device_node(name: &str, info: NodeInfo) -> DeviceNode {
    DeviceNode {
        path: dev_path(name),
        kind: Some(info.kind.as_cdi().to_owned()),
        major: Some(i64::from(info.major)),
        minor: Some(i64::from(info.minor)),
        permissions: Some(NODE_PERMISSIONS.to_owned()),
        ..Default::default()
    }
}

/// A hint is set only when every GPU of the claim contributes to it: a partial NUMA
/// or CPU set would steer work away from the GPU whose topology is unknown.
fn env_hints(gpus: &[ClaimGpu]) -> Vec<String> {
    let mut env = Vec::new();
    let uuids: Option<Vec<&str>> = gpus.iter().map(|g| g.uuid.as_deref()).collect();
    if let Some(uuids) = uuids {
        env.push(format!("{ENV_VISIBLE_GPUS}={}", uuids.join(",")));
    }
    let numa: Option<IdList> = gpus.iter().map(|g| g.numa_node).collect();
    if let Some(numa) = numa {
        env.push(format!("{ENV_NUMA_NODES}={numa}"));
    }
    if gpus.iter().all(|g| !g.local_cpus.is_empty()) {
        let cpus: IdList = gpus.iter().flat_map(|g| g.local_cpus.iter()).collect();
        env.push(format!("{ENV_CPUS}={cpus}"));
    }
    env.push(ENV_CUDA_DEVICE_ORDER.to_owned());
    env
}

fn env_key(entry: &str) -> Option<&str> {
    entry.split_once('=').map(|(k, _)| k)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cdi::driver_files::{DriverFilesSource, DriverRoot, tests::fake_driver_root};
    use crate::cdi::nodes::TableDeviceNodes;
    use crate::cdi::spec::Mount;
    use crate::cdi::version::Version;

    const UID: &str = "0b7c2f4e-3c1d-4a5e-9f60-1d2e3f4a5b6c";

    fn gpu(minor: u32, numa: u32, cpus: &str) -> ClaimGpu {
        ClaimGpu {
            device_name: format!("gpu-{minor}"),
            minor,
            uuid: Some(format!("GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd")),
            numa_node: Some(numa),
            local_cpus: cpus.parse().unwrap(),
            mig_nodes: vec![],
            requests: vec![],
        }
    }

    fn request(gpus: Vec<ClaimGpu>) -> ClaimSpecRequest {
        ClaimSpecRequest {
            claim_uid: UID.into(),
            claim_namespace: "team-a".into(),
            claim_name: "train-gpus".into(),
            gpus,
            env_hints: true,
            kind: CdiKind::default(),
        }
    }

    fn driver() -> DriverFiles {
        DriverFiles {
            source: DriverFilesSource::Discovered { root: "/".into() },
            edits: ContainerEdits {
                mounts: vec![Mount {
                    host_path: "/usr/lib64/libcuda.so.1".into(),
                    container_path: "/usr/lib64/libcuda.so.1".into(),
                    kind: Some("bind".into()),
                    options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "rbind".into()],
                }],
                ..Default::default()
            },
        }
    }

    #[test]
    fn two_gpu_claim() {
        let nodes = TableDeviceNodes::nvidia([0, 1, 2, 3], 509);
        let req = request(vec![gpu(2, 1, "28-41,84-97"), gpu(3, 1, "28-41,84-97")]);
        let spec = claim_spec(&req, &nodes, &driver()).unwrap();

        assert_eq!(spec.kind, "k8s.gpu.topodra.dev/claim");
        // Annotations make 0.6.0 the floor, and nothing newer is used.
        assert_eq!(spec.cdi_version, "0.6.0");
        assert_eq!(spec.annotations[ANNOTATION_CLAIM_UID], UID);
        assert_eq!(spec.annotations[ANNOTATION_CLAIM_NAMESPACE], "team-a");
        let names: Vec<_> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, [format!("{UID}-gpu-2"), format!("{UID}-gpu-3")]);
        let node = &spec.devices[1].container_edits.device_nodes[0];
        assert_eq!(node.path, "/dev/nvidia3");
        assert_eq!(
            (node.kind.as_deref(), node.major, node.minor),
            (Some("c"), Some(195), Some(3))
        );
        assert_eq!(node.host_path, None);

        let ctl: Vec<_> = spec
            .container_edits
            .device_nodes
            .iter()
            .map(|n| (n.path.as_str(), n.major, n.minor))
            .collect();
        assert_eq!(
            ctl,
            [
                ("/dev/nvidiactl", Some(195), Some(255)),
                ("/dev/nvidia-uvm", Some(509), Some(0)),
                ("/dev/nvidia-uvm-tools", Some(509), Some(1)),
            ]
        );
        assert_eq!(
            spec.container_edits.env,
            [
                "TOPODRA_VISIBLE_GPUS=GPU-00000002-aaaa-bbbb-cccc-dddddddddddd,GPU-00000003-aaaa-bbbb-cccc-dddddddddddd",
                "TOPODRA_NUMA_NODES=1",
                "TOPODRA_CPUS=28-41,84-97",
                "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            ]
        );
        assert_eq!(spec.container_edits.mounts, driver().edits.mounts);
        assert_eq!(
            req.cdi_device_ids(),
            [
                format!("k8s.gpu.topodra.dev/claim={UID}-gpu-2"),
                format!("k8s.gpu.topodra.dev/claim={UID}-gpu-3"),
            ]
        );
    }

    /// The whole file, as runtimes will read it.
    #[test]
    fn golden_json() {
        let nodes = TableDeviceNodes::nvidia([0, 1], 509);
        let req = request(vec![gpu(0, 0, "0-13,56-69"), gpu(1, 0, "0-13,56-69")]);
        let spec = claim_spec(&req, &nodes, &driver()).unwrap();
        let got = serde_json::to_value(&spec).unwrap();
        let want = serde_json::json!({
          "cdiVersion": "0.6.0",
          "kind": "k8s.gpu.topodra.dev/claim",
          "annotations": {
            "topodra.dev/claim-name": "train-gpus",
            "topodra.dev/claim-namespace": "team-a",
            "topodra.dev/claim-uid": UID
          },
          "devices": [
            {
              "name": format!("{UID}-gpu-0"),
              "annotations": {"topodra.dev/gpu-uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"},
              "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "permissions": "rw"}
              ]}
            },
            {
              "name": format!("{UID}-gpu-1"),
              "annotations": {"topodra.dev/gpu-uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"},
              "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "permissions": "rw"}
              ]}
            }
          ],
          "containerEdits": {
            "env": [
              "TOPODRA_VISIBLE_GPUS=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd,GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
              "TOPODRA_NUMA_NODES=0",
              "TOPODRA_CPUS=0-13,56-69",
              "CUDA_DEVICE_ORDER=PCI_BUS_ID"
            ],
            "deviceNodes": [
              {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "permissions": "rw"},
              {"path": "/dev/nvidia-uvm", "type": "c", "major": 509, "minor": 0, "permissions": "rw"},
              {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 509, "minor": 1, "permissions": "rw"}
            ],
            "mounts": [
              {
                "hostPath": "/usr/lib64/libcuda.so.1",
                "containerPath": "/usr/lib64/libcuda.so.1",
                "type": "bind",
                "options": ["ro", "nosuid", "nodev", "rbind"]
              }
            ]
          }
        });
        assert_eq!(
            got,
            want,
            "{}",
            serde_json::to_string_pretty(&spec).unwrap()
        );
    }

    #[test]
    fn hints_cover_gpus_on_different_numa_nodes() {
        let nodes = TableDeviceNodes::nvidia([0, 4], 509);
        let req = request(vec![gpu(0, 0, "0-13"), gpu(4, 2, "56-69")]);
        let spec = claim_spec(&req, &nodes, &driver()).unwrap();
        assert!(
            spec.container_edits
                .env
                .contains(&"TOPODRA_NUMA_NODES=0,2".to_owned())
        );
        assert!(
            spec.container_edits
                .env
                .contains(&"TOPODRA_CPUS=0-13,56-69".to_owned())
        );
    }

    #[test]
    fn partial_topology_leaves_the_hint_out() {
        let nodes = TableDeviceNodes::nvidia([0, 1], 509);
        let mut unknown = gpu(1, 0, "0-3");
        unknown.numa_node = None;
        unknown.local_cpus = IdList::new();
        unknown.uuid = None;
        let spec =
            claim_spec(&request(vec![gpu(0, 0, "0-3"), unknown]), &nodes, &driver()).unwrap();
        assert_eq!(spec.container_edits.env, ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]);
        assert!(spec.devices[1].annotations.is_empty());
    }

    #[test]
    fn hints_off_and_toolkit_env() {
        let nodes = TableDeviceNodes::nvidia([0], 509);
        let mut drv = driver();
        drv.edits.env = vec![
            "NVIDIA_VISIBLE_DEVICES=void".into(),
            "CUDA_DEVICE_ORDER=FASTEST_FIRST".into(),
        ];
        let mut req = request(vec![gpu(0, 0, "0-3")]);
        let spec = claim_spec(&req, &nodes, &drv).unwrap();
        assert_eq!(
            spec.container_edits.env.last().unwrap(),
            "NVIDIA_VISIBLE_DEVICES=void"
        );
        assert!(
            !spec
                .container_edits
                .env
                .contains(&"CUDA_DEVICE_ORDER=FASTEST_FIRST".to_owned())
        );

        req.env_hints = false;
        let spec = claim_spec(&req, &nodes, &drv).unwrap();
        assert_eq!(spec.container_edits.env, drv.edits.env);
    }

    #[test]
    fn missing_nodes() {
        let mut nodes = TableDeviceNodes::nvidia([0], 509);
        let err = claim_spec(&request(vec![gpu(1, 0, "0")]), &nodes, &driver()).unwrap_err();
        assert!(err.to_string().contains("/dev/nvidia1"), "{err}");

        nodes.0.remove("nvidia-uvm-tools");
        let spec = claim_spec(&request(vec![gpu(0, 0, "0")]), &nodes, &driver()).unwrap();
        assert_eq!(spec.container_edits.device_nodes.len(), 2);

        nodes.0.remove("nvidia-uvm");
        let err = claim_spec(&request(vec![gpu(0, 0, "0")]), &nodes, &driver()).unwrap_err();
        assert!(err.to_string().contains("/dev/nvidia-uvm"), "{err}");
    }

    #[test]
    fn bad_requests() {
        let nodes = TableDeviceNodes::nvidia([0], 509);
        let err = claim_spec(&request(vec![]), &nodes, &driver()).unwrap_err();
        assert!(matches!(err, CdiError::NoDevices { .. }), "{err}");

        let err = claim_spec(
            &request(vec![gpu(0, 0, "0"), gpu(0, 0, "0")]),
            &nodes,
            &driver(),
        )
        .unwrap_err();
        assert!(matches!(err, CdiError::DuplicateDevice { .. }), "{err}");

        for uid in ["", "../etc", "a/b", "x y", "-abc"] {
            let mut req = request(vec![gpu(0, 0, "0")]);
            req.claim_uid = uid.into();
            let err = claim_spec(&req, &nodes, &driver()).unwrap_err();
            assert!(matches!(err, CdiError::InvalidClaimUid { .. }), "{uid}");
        }

        let mut req = request(vec![gpu(0, 0, "0")]);
        req.gpus[0].device_name = "gpu_0!".into();
        let err = claim_spec(&req, &nodes, &driver()).unwrap_err();
        assert!(matches!(err, CdiError::InvalidSpec { .. }), "{err}");
    }

    #[test]
    fn from_inventory_gpu() {
        let mut g = Gpu::at("0000:18:00.0".parse().unwrap());
        assert!(matches!(
            ClaimGpu::from_gpu(&g),
            Err(CdiError::GpuWithoutMinor { .. })
        ));
        g.minor = Some(2);
        g.uuid = Some("GPU-x".into());
        g.numa_node = Some(0);
        g.local_cpus = "0-3".parse().unwrap();
        let c = ClaimGpu::from_gpu(&g).unwrap();
        assert_eq!(c.device_name, "gpu-2");
        assert_eq!(c.minor, 2);
    }

    #[test]
    fn with_discovered_driver_files() {
        let root = fake_driver_root();
        let files = DriverFiles::discover(&DriverRoot::new(root.path())).unwrap();
        let nodes = TableDeviceNodes::nvidia([0], 509);
        let spec = claim_spec(&request(vec![gpu(0, 0, "0-7")]), &nodes, &files).unwrap();
        assert_eq!(spec.cdi_version, Version::V0_6_0.to_string());
        assert_eq!(spec.container_edits.mounts, files.edits.mounts);
        assert!(validate(&spec).is_ok());
    }

    #[test]
    fn each_device_records_its_requests() {
        let mut g0 = gpu(0, 0, "0-3");
        g0.requests = vec!["gpus".into(), "extra".into()];
        let req = request(vec![g0, gpu(1, 0, "0-3")]);
        let spec = claim_spec(&req, &TableDeviceNodes::nvidia([0, 1], 509), &driver()).unwrap();
        assert_eq!(
            spec.devices[0].annotations[ANNOTATION_REQUESTS],
            "gpus,extra"
        );
        assert!(
            !spec.devices[1]
                .annotations
                .contains_key(ANNOTATION_REQUESTS)
        );
    }
}
