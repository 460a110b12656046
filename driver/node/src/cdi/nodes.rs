//! Device numbers of the NVIDIA device nodes.
//!
//! The spec states type, major and minor of every node explicitly, so a runtime can
//! create the node in the container even where the host has not created it yet (the
//! UVM node appears only after something opened it once), and so that the device
//! cgroup rule is right without the runtime having to stat anything.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use super::CdiError;

mod table;

#[cfg(test)]
pub(crate) use table::TABLE_CAPS_MAJOR;
pub use table::TableDeviceNodes;

/// Major of `/dev/nvidia<N>` and `/dev/nvidiactl`, fixed by the NVIDIA kernel module.
pub(crate) const NVIDIA_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub(crate) const NVIDIACTL_MINOR: u32 = 255;

/// Kind of a device node, as CDI spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    Char,
    Block,
}

impl NodeKind {
    pub(crate) fn as_cdi(self) -> &'static str {
        match self {
            NodeKind::Char => "c",
            NodeKind::Block => "b",
        }
    }
}

/// What the host kernel has for one node under `/dev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeInfo {
    pub kind: NodeKind,
    pub major: u32,
    pub minor: u32,
    /// Permissions and owner of the host's node; `None` when the node does not exist
    /// on the host and its numbers come from `/proc/devices`.
    pub owner: Option<NodeOwner>,
}

/// The permission bits and owner of a host device node, which the container's
/// node gets too: a driver installed with `NVreg_DeviceFileMode=0660` and a
/// `video` group keeps that policy inside the container, and a runtime with an
/// older CDI library does not fall back to 0666.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeOwner {
    /// Permission bits only (`0o660`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl NodeInfo {
    pub(crate) const fn char(major: u32, minor: u32) -> Self {
        Self {
            kind: NodeKind::Char,
            major,
            minor,
            owner: None,
        }
    }

    #[cfg(test)]
    pub(crate) const fn owned(self, mode: u32, uid: u32, gid: u32) -> Self {
        Self {
            owner: Some(NodeOwner { mode, uid, gid }),
            ..self
        }
    }
}

/// Looks up device nodes by their name under `/dev` (`nvidia0`, `nvidia-uvm`).
///
/// `Ok(None)` means the host has no such device: neither a node nor a registered
/// driver for it. Tests use [`TableDeviceNodes`].
pub trait DeviceNodes {
    fn lookup(&self, name: &str) -> Result<Option<NodeInfo>, CdiError>;

    /// The capability nodes that open one MIG device to a process, as names under
    /// `/dev`: the GPU instance's `access` capability, then the compute instance's.
    /// The NVIDIA driver gates MIG devices behind these nodes
    /// (`/dev/nvidia-caps/nvidia-cap<N>`), whose minors it lists per instance in
    /// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access`
    /// (NVIDIA MIG user guide, "Device Nodes and Capabilities").
    fn mig_access_nodes(
        &self,
        parent_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<Vec<String>, CdiError>;

    /// The GPU's DRM nodes (`dri/card1`, `dri/renderD128`) that exist under `/dev`,
    /// as the kernel lists them in `/sys/bus/pci/devices/<bus id>/drm/` when
    /// `nvidia-drm` is loaded, and the `/dev/dri/by-path` links to them. None where
    /// the node has no DRM devices (the default).
    fn dri_nodes(&self, pci_bus_id: &str) -> Result<DriNodes, CdiError> {
        let _ = pci_bus_id;
        Ok(DriNodes::default())
    }
}

/// One GPU's DRM nodes, and the by-path links that name them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriNodes {
    /// Names under `/dev`: `dri/card1`, `dri/renderD128`.
    pub nodes: Vec<String>,
    /// (target as the host's link has it, link path): `("../card1",
    /// "/dev/dri/by-path/pci-0000:18:00.0-card")`.
    pub by_path: Vec<(String, String)>,
}

/// The `/dev` name of MIG capability node `minor`.
pub(crate) fn mig_cap_node(minor: u32) -> String {
    format!("{MIG_CAPS_DIR}/nvidia-cap{minor}")
}

/// Directory of the MIG capability nodes under `/dev`, and the `/proc/devices` name
/// of their (dynamically assigned) major.
const MIG_CAPS_DIR: &str = "nvidia-caps";

/// Where the driver lists MIG capability minors, unless told otherwise.
pub const DEFAULT_CAPABILITIES_DIR: &str = "/proc/driver/nvidia/capabilities";

/// The host's device nodes, as seen by this process.
///
/// A node is stat'ed under `<dev_root>/dev/`; when it is missing, the major is taken
/// from the driver registered in `/proc/devices` and the minor from the node's fixed
/// role, because the NVIDIA and UVM modules register their majors before any node
/// exists.
#[derive(Debug, Clone)]
pub struct HostDeviceNodes {
    dev_root: PathBuf,
    proc_devices: PathBuf,
    capabilities_dir: PathBuf,
    sysfs_root: PathBuf,
}

impl HostDeviceNodes {
    /// `dev_root` is `/` when this process sees the host's `/dev` at `/dev`.
    pub(crate) fn new(dev_root: impl Into<PathBuf>) -> Self {
        Self {
            dev_root: dev_root.into(),
            proc_devices: PathBuf::from("/proc/devices"),
            capabilities_dir: PathBuf::from(DEFAULT_CAPABILITIES_DIR),
            sysfs_root: PathBuf::from("/sys"),
        }
    }

    /// Reads the GPUs' DRM devices from another sysfs than `/sys`.
    pub(crate) fn with_sysfs_root(mut self, path: impl Into<PathBuf>) -> Self {
        self.sysfs_root = path.into();
        self
    }

    /// Reads MIG capability minors from another directory than
    /// `/proc/driver/nvidia/capabilities` (a simulated node's).
    pub(crate) fn with_capabilities_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.capabilities_dir = path.into();
        self
    }

    /// The minor a capability `access` file names (`DeviceFileMinor: 12`).
    fn capability_minor(&self, relative: &str) -> Result<u32, CdiError> {
        let path = self.capabilities_dir.join(relative);
        let text = fs::read_to_string(&path).map_err(|source| CdiError::DeviceNode {
            path: path.clone(),
            source,
        })?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("DeviceFileMinor:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| CdiError::DeviceNode {
                path,
                source: io::Error::new(io::ErrorKind::InvalidData, "no DeviceFileMinor line"),
            })
    }

    /// Reads the registered drivers from another file than `/proc/devices`
    /// (`/proc` is not namespaced for this file, so only tests need this).
    pub fn with_proc_devices(mut self, path: impl Into<PathBuf>) -> Self {
        self.proc_devices = path.into();
        self
    }

    fn stat(&self, name: &str) -> Result<Option<NodeInfo>, CdiError> {
        let path = self.dev_root.join("dev").join(name);
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CdiError::DeviceNode { path, source }),
        };
        let ft = meta.file_type();
        let kind = if ft.is_char_device() {
            NodeKind::Char
        } else if ft.is_block_device() {
            NodeKind::Block
        } else {
            return Err(CdiError::NotADeviceNode { path });
        };
        let rdev = meta.rdev();
        Ok(Some(NodeInfo {
            kind,
            major: libc::major(rdev),
            minor: libc::minor(rdev),
            owner: Some(NodeOwner {
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
            }),
        }))
    }

    fn registered(&self, name: &str) -> Result<Option<NodeInfo>, CdiError> {
        let Some((drivers, minor)) = fallback_for(name) else {
            return Ok(None);
        };
        let text = match fs::read_to_string(&self.proc_devices) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CdiError::DeviceNode {
                    path: self.proc_devices.clone(),
                    source,
                });
            }
        };
        let majors = char_majors(&text);
        Ok(drivers
            .iter()
            .find_map(|d| majors.get(*d))
            .map(|major| NodeInfo::char(*major, minor)))
    }
}

impl DeviceNodes for HostDeviceNodes {
    fn lookup(&self, name: &str) -> Result<Option<NodeInfo>, CdiError> {
        match self.stat(name)? {
            Some(info) => Ok(Some(info)),
            None => self.registered(name),
        }
    }

    fn mig_access_nodes(
        &self,
        parent_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<Vec<String>, CdiError> {
        let gi = format!("gpu{parent_minor}/mig/gi{gpu_instance}");
        let ci = format!("{gi}/ci{compute_instance}");
        Ok(vec![
            mig_cap_node(self.capability_minor(&format!("{gi}/access"))?),
            mig_cap_node(self.capability_minor(&format!("{ci}/access"))?),
        ])
    }

    fn dri_nodes(&self, pci_bus_id: &str) -> Result<DriNodes, CdiError> {
        let drm = self
            .sysfs_root
            .join("bus/pci/devices")
            .join(pci_bus_id)
            .join("drm");
        let Ok(entries) = fs::read_dir(&drm) else {
            return Ok(DriNodes::default());
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| is_drm_node_name(n))
            .collect();
        names.sort();
        let mut out = DriNodes::default();
        for name in names {
            let node = format!("dri/{name}");
            // Only nodes the host has: a DRM minor has no fixed number to fall
            // back to, and an entry in sysfs without a node is udev still at work.
            match self.stat(&node) {
                Ok(Some(_)) => out.nodes.push(node),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "skipping a DRM device"),
            }
        }
        let dev = self.dev_root.join("dev");
        for suffix in ["card", "render"] {
            let link = format!("/dev/dri/by-path/pci-{pci_bus_id}-{suffix}");
            let Ok(target) = fs::read_link(dev.join(link.trim_start_matches("/dev/"))) else {
                continue;
            };
            let Some(target_name) = target.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if out.nodes.iter().any(|n| n == &format!("dri/{target_name}")) {
                out.by_path
                    .push((target.to_string_lossy().into_owned(), link));
            }
        }
        Ok(out)
    }
}

/// `card<N>` or `renderD<N>`: the DRM nodes a container uses (not `controlD<N>`,
/// nor the connector entries sysfs lists beside them, `card1-DP-1`).
fn is_drm_node_name(name: &str) -> bool {
    let digits = |rest: &str| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix("renderD").is_some_and(digits)
        || name.strip_prefix("card").is_some_and(digits)
}

/// For a node the NVIDIA modules own: the `/proc/devices` names that may carry its
/// major (the name changed across driver generations) and its fixed minor.
fn fallback_for(name: &str) -> Option<(&'static [&'static str], u32)> {
    const FRONTEND: &[&str] = &["nvidia-frontend", "nvidia"];
    if let Some(minor) = name
        .strip_prefix(MIG_CAPS_DIR)
        .and_then(|n| n.strip_prefix("/nvidia-cap"))
    {
        return Some((&["nvidia-caps"], minor.parse().ok()?));
    }
    match name {
        "nvidiactl" => Some((FRONTEND, NVIDIACTL_MINOR)),
        "nvidia-uvm" => Some((&["nvidia-uvm"], 0)),
        "nvidia-uvm-tools" => Some((&["nvidia-uvm"], 1)),
        _ => {
            let minor: u32 = name.strip_prefix("nvidia")?.parse().ok()?;
            Some((FRONTEND, minor))
        }
    }
}

/// The `Character devices:` section of `/proc/devices`, name to major.
fn char_majors(text: &str) -> BTreeMap<&str, u32> {
    let mut out = BTreeMap::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, name)) = line.split_once(char::is_whitespace)
            && let Ok(major) = major.parse()
        {
            out.entry(name.trim()).or_insert(major);
        }
    }
    out
}

/// `/dev/<name>`, the path containers and the host both use.
pub(crate) fn dev_path(name: &str) -> String {
    format!("/dev/{name}")
}

#[cfg(test)]
mod tests;
