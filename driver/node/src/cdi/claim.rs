//! The CDI spec of one prepared claim.
//!
//! One spec per claim, of the installation's [`CdiKind`], one CDI device per allocated GPU named
//! `<claimUID>-<deviceName>` so names never collide across claims in the shared
//! spec directory. A GPU's own device node is a per-device edit; everything any GPU
//! needs (control nodes, driver files, env hints) is claim-wide, which runtimes apply
//! once however many of the claim's devices a container gets.

use std::collections::BTreeSet;

use super::capabilities::{DriverCapabilities, DriverCapability};
use super::hooks::Link;
use super::nodes::{DeviceNodes, NodeInfo, dev_path};
use super::nvidia_files::NvidiaFiles;
use super::spec::{ContainerEdits, Device, DeviceNode, Mount, Spec};
use super::version::minimum_version;
use super::{CdiError, CdiKind, cdi_device_name, check_claim_uid, validate};
use topodra_model::IdList;
use topodra_model::checkpoint::{ShareIntent, ShareMode};
use topodra_model::config::v1alpha1::TimeSliceInterval;
use topodra_model::inventory::{AllocatableDevice, Gpu};
use topodra_model::slice::interval_name;

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

/// On a share's device: what the checkpoint needs to rebuild its record from the
/// spec alone (its share id, mode, GPU and time slice) and what it was given.
pub(crate) const ANNOTATION_SHARE_ID: &str = "topodra.dev/share-id";
pub(crate) const ANNOTATION_SHARING: &str = "topodra.dev/sharing";
pub(crate) const ANNOTATION_SHARED_GPU: &str = "topodra.dev/shared-gpu";
pub(crate) const ANNOTATION_TIMESLICE: &str = "topodra.dev/timeslice";
pub(crate) const ANNOTATION_MEMORY_BYTES: &str = "topodra.dev/memory-bytes";
pub(crate) const ANNOTATION_COMPUTE_PERCENT: &str = "topodra.dev/compute-percent";
pub(crate) const ANNOTATION_MPS_PIPE_DIR: &str = "topodra.dev/mps-pipe-dir";
pub(crate) const ANNOTATION_PRIOR_COMPUTE_MODE: &str = "topodra.dev/prior-compute-mode";

/// Where an MPS share's container finds its GPU's daemon: the path NVIDIA's MPS
/// documentation gives as `CUDA_MPS_PIPE_DIRECTORY`'s default, set explicitly too.
pub(crate) const MPS_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// A share's environment, per device: the mode, the interval, and the memory the
/// scheduler set aside for it, which a time-sliced GPU does not enforce (any share
/// can allocate all of the GPU's memory), and says so.
pub(crate) const ENV_SHARING: &str = "TOPODRA_SHARING";
pub(crate) const ENV_TIME_SLICE_INTERVAL: &str = "TOPODRA_TIME_SLICE_INTERVAL";
pub(crate) const ENV_MEMORY_SHARE: &str = "TOPODRA_GPU_MEMORY_SHARE";
pub(crate) const ENV_MEMORY_SHARE_ENFORCED: &str = "TOPODRA_GPU_MEMORY_SHARE_ENFORCED";

/// Env hints (when [`ClaimSpecRequest::env_hints`] is on). They describe the whole
/// claim: env is claim-wide, because per-device values for one key would overwrite
/// each other in a container that gets several of the claim's GPUs.
pub(crate) const ENV_VISIBLE_GPUS: &str = "TOPODRA_VISIBLE_GPUS";
pub(crate) const ENV_NUMA_NODES: &str = "TOPODRA_NUMA_NODES";
pub(crate) const ENV_CPUS: &str = "TOPODRA_CPUS";
/// CUDA numbers devices fastest-first by default; bus order makes CUDA's device
/// indices agree with NVML's and `nvidia-smi`'s inside the container.
pub(crate) const ENV_CUDA_DEVICE_ORDER: &str = "CUDA_DEVICE_ORDER=PCI_BUS_ID";

/// Always set: on nodes where `nvidia-container-runtime` is the default runtime,
/// a CUDA image's `NVIDIA_VISIBLE_DEVICES=all` would make that runtime inject every
/// GPU of the node besides the claim's. `void` turns its environment path off.
pub(crate) const ENV_VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";
/// The same for the runtime's `volume-mounts` device list strategy, which reads
/// the device list from mounts under this directory.
pub(crate) const VOID_DEVICE_LIST_MOUNT: &str = "/var/run/nvidia-container-devices/void";

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
    /// The GPU's PCI address in sysfs form, for its DRM nodes; `None` for a MIG
    /// device, which gets none (as with the toolkit, unless it has graphics
    /// engines, which data-center MIG profiles do not).
    pub pci_bus_id: Option<String>,
    /// For a share of a shared GPU: its share id and what its prepare recorded.
    pub share: Option<(String, ShareIntent)>,
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
            pci_bus_id: Some(gpu.pci_bus_id.to_string()),
            share: None,
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
            out.pci_bus_id = None;
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
    /// Which classes of driver files the containers get (all unless the claim's
    /// config narrows them).
    pub capabilities: DriverCapabilities,
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
    driver: &NvidiaFiles,
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

    let hook = driver.hook();
    let mut devices = Vec::with_capacity(req.gpus.len());
    for gpu in &req.gpus {
        let node_name = format!("nvidia{}", gpu.minor);
        let mut device_nodes = Vec::with_capacity(1 + gpu.mig_nodes.len());
        for name in std::iter::once(&node_name).chain(&gpu.mig_nodes) {
            device_nodes.push(device_node(name, required_node(nodes, name)?));
        }
        let mut hooks = Vec::new();
        let graphics = req.capabilities.contains(DriverCapability::Graphics);
        if let Some(bus) = gpu.pci_bus_id.as_deref().filter(|_| graphics) {
            let dri = nodes.dri_nodes(bus)?;
            for name in &dri.nodes {
                if let Some(info) = nodes.lookup(name)? {
                    device_nodes.push(device_node(name, info));
                }
            }
            let links: Vec<Link> = dri
                .by_path
                .iter()
                .map(|(target, link)| Link {
                    target: target.clone(),
                    link: link.clone(),
                })
                .collect();
            hooks.extend(hook.as_ref().and_then(|h| h.create_symlinks(&links)));
        }
        // A whole GPU can take the memory limits its pod's environment asks for.
        if let (Some(h), Some(root), Some(uuid)) = (&hook, driver.host_root(), &gpu.uuid)
            && gpu.mig_nodes.is_empty()
        {
            hooks.push(h.apply_cuda_memory_limits(&root.to_string_lossy(), uuid));
        }
        let mut device = Device {
            name: cdi_device_name(&req.claim_uid, &gpu.device_name),
            container_edits: ContainerEdits {
                device_nodes,
                hooks,
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
        if let Some((share_id, share)) = &gpu.share {
            share_edits(&mut device, share_id, share);
        }
        devices.push(device);
    }

    let mut device_nodes = Vec::new();
    for name in ["nvidiactl", "nvidia-uvm"] {
        device_nodes.push(device_node(name, required_node(nodes, name)?));
    }
    // Only profilers use uvm-tools, and only display and Vulkan applications
    // modeset (present when the nvidia-modeset module is loaded); CUDA runs
    // without either.
    for name in ["nvidia-uvm-tools", "nvidia-modeset"] {
        match nodes.lookup(name)? {
            Some(info) => device_nodes.push(device_node(name, info)),
            None => tracing::debug!(node = name, "no such device; leaving it out"),
        }
    }
    let driver_edits = driver.edits(&req.capabilities);

    let own_env = if req.env_hints {
        env_hints(&req.gpus)
    } else {
        Vec::new()
    };
    let mut own_env = own_env;
    own_env.push(ENV_VISIBLE_DEVICES_VOID.to_owned());
    let own_keys: BTreeSet<&str> = own_env.iter().filter_map(|e| env_key(e)).collect();
    let mut env = own_env.clone();
    env.extend(
        driver_edits
            .env
            .iter()
            .filter(|e| env_key(e).is_none_or(|k| !own_keys.contains(k)))
            .cloned(),
    );
    let mut mounts = driver_edits.mounts;
    if !mounts
        .iter()
        .any(|m| m.container_path == VOID_DEVICE_LIST_MOUNT)
    {
        mounts.push(Mount {
            host_path: "/dev/null".to_owned(),
            container_path: VOID_DEVICE_LIST_MOUNT.to_owned(),
            kind: Some("bind".to_owned()),
            options: ["ro", "nosuid", "nodev", "bind"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
        });
    }

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
            hooks: driver_edits.hooks,
            mounts,
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

/// A share's annotations and environment on its device, and for MPS the mount of
/// its GPU's daemon pipe directory.
fn share_edits(device: &mut Device, share_id: &str, share: &ShareIntent) {
    let mode = match share.mode {
        ShareMode::TimeSlicing => "TimeSlicing",
        ShareMode::Mps => "MPS",
    };
    let a = &mut device.annotations;
    a.insert(ANNOTATION_SHARE_ID.into(), share_id.to_owned());
    a.insert(ANNOTATION_SHARING.into(), mode.to_owned());
    a.insert(ANNOTATION_SHARED_GPU.into(), share.gpu_device.clone());
    let edits = &mut device.container_edits;
    edits.env.push(format!("{ENV_SHARING}={mode}"));
    if let Some(bytes) = share.memory_bytes {
        a.insert(ANNOTATION_MEMORY_BYTES.into(), bytes.to_string());
        edits.env.push(format!("{ENV_MEMORY_SHARE}={bytes}"));
    }
    match share.mode {
        ShareMode::TimeSlicing => {
            a.insert(ANNOTATION_TIMESLICE.into(), share.timeslice.to_string());
            edits.env.push(format!(
                "{ENV_TIME_SLICE_INTERVAL}={}",
                interval_name(timeslice_interval(share.timeslice))
            ));
            if share.memory_bytes.is_some() {
                edits.env.push(format!("{ENV_MEMORY_SHARE_ENFORCED}=false"));
            }
        }
        ShareMode::Mps => {
            if let Some(pipe) = &share.pipe_dir {
                a.insert(ANNOTATION_MPS_PIPE_DIR.into(), pipe.clone());
                edits.mounts.push(Mount {
                    host_path: pipe.clone(),
                    container_path: MPS_PIPE_DIR.to_owned(),
                    kind: Some("bind".to_owned()),
                    options: ["rw", "nosuid", "nodev", "rbind"]
                        .into_iter()
                        .map(str::to_owned)
                        .collect(),
                });
                edits
                    .env
                    .push(format!("CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIR}"));
                // The daemon's shared memory, beside its pipes (`sharing::mps`).
                if let Some(shm) = std::path::Path::new(pipe).parent().map(|d| d.join("shm")) {
                    edits.mounts.push(Mount {
                        host_path: shm.display().to_string(),
                        container_path: "/dev/shm".to_owned(),
                        kind: Some("bind".to_owned()),
                        options: ["rw", "nosuid", "nodev", "rbind"]
                            .into_iter()
                            .map(str::to_owned)
                            .collect(),
                    });
                }
            }
            if let Some(mode) = share.prior_compute_mode {
                a.insert(ANNOTATION_PRIOR_COMPUTE_MODE.into(), mode.to_string());
            }
            if let Some(percent) = share.compute_percent {
                a.insert(ANNOTATION_COMPUTE_PERCENT.into(), percent.to_string());
                edits
                    .env
                    .push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}"));
            }
            if let Some(bytes) = share.memory_bytes {
                // MPS enforces it per device ordinal; a share's container sees its
                // one GPU as ordinal 0. Whole MiB, rounded down, as MPS takes them.
                edits.env.push(format!(
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M",
                    bytes >> 20
                ));
                edits.env.push(format!("{ENV_MEMORY_SHARE_ENFORCED}=true"));
            }
        }
    }
}

/// The interval of an `nvidia-smi --set-timeslice` value.
pub(crate) fn timeslice_interval(value: u8) -> TimeSliceInterval {
    match value {
        1 => TimeSliceInterval::Short,
        2 => TimeSliceInterval::Medium,
        3 => TimeSliceInterval::Long,
        _ => TimeSliceInterval::Default,
    }
}

/// The `nvidia-smi --set-timeslice` value of an interval (NVIDIA's numbering:
/// Default 0, Short 1, Medium 2, Long 3).
pub fn timeslice_value(interval: TimeSliceInterval) -> u8 {
    match interval {
        TimeSliceInterval::Default => 0,
        TimeSliceInterval::Short => 1,
        TimeSliceInterval::Medium => 2,
        TimeSliceInterval::Long => 3,
    }
}

fn required_node(nodes: &dyn DeviceNodes, name: &str) -> Result<NodeInfo, CdiError> {
    nodes
        .lookup(name)?
        .ok_or_else(|| CdiError::MissingDeviceNode {
            path: dev_path(name),
        })
}

/// Type, major and minor are all stated, so the runtime does not need the node to
/// exist on the host. Mode, uid and gid are the host node's where it exists: a
/// runtime fills a missing mode from the host node only with a recent CDI library
/// (containerd 1.7's gives 0666), and a user-namespaced pod needs the owner stated.
/// A node known only from `/proc/devices` leaves them to the runtime.
fn device_node(name: &str, info: NodeInfo) -> DeviceNode {
    DeviceNode {
        path: dev_path(name),
        kind: Some(info.kind.as_cdi().to_owned()),
        major: Some(i64::from(info.major)),
        minor: Some(i64::from(info.minor)),
        permissions: Some(NODE_PERMISSIONS.to_owned()),
        file_mode: info.owner.map(|o| o.mode),
        uid: info.owner.map(|o| o.uid),
        gid: info.owner.map(|o| o.gid),
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
mod tests;
