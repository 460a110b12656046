//! Machine profiles: one YAML file describes a whole host (CPUs, NUMA, PCI tree,
//! GPUs, NVLink, faults) so that the fake NVML and the rendered hwloc XML are
//! generated from a single source and cannot disagree by accident.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod fabric;
pub mod mig;

pub use fabric::{FabricHealth, FabricState, GpuFabric};
pub use mig::MigDevice;

/// Error for anything wrong with a profile: YAML syntax, schema, or a
/// cross-reference that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileError(pub String);

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProfileError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ProfileError> {
    Err(ProfileError(msg.into()))
}

/// A whole machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Where the layout comes from (public documents), free text.
    pub sources: String,
    /// `nvmlSystemGetDriverVersion`, e.g. "550.90.07".
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion`, NVML form (major*1000 + minor*10).
    pub cuda_driver_version: i32,
    /// `nvmlSystemGetNVMLVersion`; defaults to "<cuda major>.<driver_version>"
    /// which is how real NVML composes it.
    #[serde(default)]
    pub nvml_version: Option<String>,
    /// Hardware threads per core; siblings are numbered like Linux on x86:
    /// a node's CPU list is split in halves (first threads, then siblings).
    #[serde(default = "one")]
    pub threads_per_core: u32,
    pub packages: Vec<Package>,
    pub numa_nodes: Vec<NumaNode>,
    /// SLIT matrix; rows and columns in the order of `numa_nodes`.
    pub distances: Vec<Vec<u64>>,
    #[serde(default)]
    pub pci: Vec<HostBridge>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub nvlink: Option<NvLinkFabric>,
    #[serde(default)]
    pub xid_events: Vec<XidEvent>,
    /// Makes `nvmlInit*` fail with this NVML return code name
    /// (e.g. `DRIVER_NOT_LOADED`, with or without the `NVML_ERROR_` prefix).
    #[serde(default)]
    pub init_error: Option<String>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Package {
    pub os_index: u32,
    #[serde(default)]
    pub cpu_model: Option<String>,
    /// Sub-NUMA clustering label such as "SNC4" or "NPS4"; when set, the
    /// number of CPU NUMA nodes in the package must match the trailing count.
    #[serde(default)]
    pub sub_numa: Option<String>,
    /// Cores that share one L3 cache, counted in core order within the package
    /// (AMD EPYC: the cores of one CCX, 4 on Zen 2). Absent: one L3 for the whole
    /// package (Intel Xeon Scalable). Only the simulated CPU sysfs
    /// ([`crate::cpu_sysfs`]) reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l3_cores: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NumaKind {
    /// Ordinary DRAM node with CPUs.
    #[default]
    Cpu,
    /// CPU-less node holding a GPU's memory (GH200/GB200 coherent HBM).
    GpuMemory,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumaNode {
    pub os_index: u32,
    pub package: u32,
    /// Linux cpulist syntax ("0-55,112-167"); empty for gpu-memory nodes.
    #[serde(default)]
    pub cpus: String,
    pub memory_gib: u64,
    #[serde(default)]
    pub kind: NumaKind,
}

/// A PCI root complex. `bus: "0000:15"` is what sysfs calls `pci0000:15`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostBridge {
    pub bus: String,
    /// Exactly one of `numa_node` / `package` says where it is local.
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default)]
    pub package: Option<u32>,
    #[serde(default)]
    pub children: Vec<PciNode>,
}

/// One entry of a PCI bus, written as a single-key map
/// (`- bridge: {...}`, `- gpu: "0000:18:00.0"`, `- device: {...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "PciNodeRepr", into = "PciNodeRepr")]
pub enum PciNode {
    Bridge(PciBridge),
    /// Bus id of an entry in `gpus`.
    Gpu(String),
    Device(PciDevice),
}

// A struct rather than serde's externally tagged enum: YAML crates disagree on
// how they read those (serde_yaml 0.9, which this crate used before, took only
// `!tag` syntax), and the struct gives one clear error for a node with zero or
// several of the keys.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PciNodeRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bridge: Option<PciBridge>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device: Option<PciDevice>,
}

impl TryFrom<PciNodeRepr> for PciNode {
    type Error = String;

    fn try_from(r: PciNodeRepr) -> Result<Self, String> {
        match (r.bridge, r.gpu, r.device) {
            (Some(b), None, None) => Ok(Self::Bridge(b)),
            (None, Some(g), None) => Ok(Self::Gpu(g)),
            (None, None, Some(d)) => Ok(Self::Device(d)),
            _ => Err("a PCI node needs exactly one of `bridge`, `gpu`, `device`".to_owned()),
        }
    }
}

impl From<PciNode> for PciNodeRepr {
    fn from(n: PciNode) -> Self {
        let mut r = Self {
            bridge: None,
            gpu: None,
            device: None,
        };
        match n {
            PciNode::Bridge(b) => r.bridge = Some(b),
            PciNode::Gpu(g) => r.gpu = Some(g),
            PciNode::Device(d) => r.device = Some(d),
        }
        r
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BridgeRole {
    RootPort,
    SwitchUpstream,
    SwitchDownstream,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciBridge {
    pub bus_id: String,
    #[serde(default)]
    pub role: Option<BridgeRole>,
    #[serde(default)]
    pub vendor: u16,
    #[serde(default)]
    pub device_id: u16,
    pub children: Vec<PciNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciDevice {
    pub bus_id: String,
    /// Class code without prog-if, e.g. 0x0200 Ethernet, 0x0207 InfiniBand,
    /// 0x0108 NVMe, 0x0680 bridge (NVSwitch).
    pub class: u16,
    pub vendor: u16,
    pub device_id: u16,
    #[serde(default)]
    pub subvendor: u16,
    #[serde(default)]
    pub subdevice: u16,
    #[serde(default)]
    pub revision: u8,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
}

impl Architecture {
    /// NVLink version a GPU of this generation reports.
    pub fn nvlink_version(self) -> u32 {
        match self {
            Self::Kepler | Self::Maxwell => 0,
            Self::Pascal => 1,
            Self::Volta | Self::Turing => 2,
            Self::Ampere | Self::Ada => 3,
            Self::Hopper => 4,
            Self::Blackwell => 5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
    /// `nvmlDeviceGetMaxMigDeviceCount` while MIG is enabled; defaults to
    /// [`mig::DEFAULT_MAX_MIG_DEVICES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_devices: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// NVML index; GPUs visible to NVML must be numbered 0..n.
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub name: String,
    /// NVML brand enum name without `NVML_BRAND_`, e.g. `NVIDIA`, `TESLA`.
    pub brand: String,
    pub architecture: Architecture,
    /// "major.minor", e.g. "9.0".
    pub compute_capability: String,
    pub memory_mib: u64,
    /// "0000:18:00.0" (4-digit domain, as sysfs and hwloc write it).
    pub bus_id: String,
    /// NVML form: device id in the high half, vendor in the low (0x233010de).
    pub pci_device_id: u32,
    /// NVML form: subsystem device in the high half, subsystem vendor low.
    #[serde(default)]
    pub pci_subsystem_id: u32,
    #[serde(default = "default_revision")]
    pub pci_revision: u8,
    /// Absent means the GPU has no MIG support (NOT_SUPPORTED).
    #[serde(default)]
    pub mig: Option<MigMode>,
    /// MIG devices that exist (only with `mig.current: true`), in NVML's MIG
    /// device index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
    /// `nvmlDeviceGetGpuFabricInfo{,V}`; absent means NOT_SUPPORTED, as on
    /// PCIe GPUs and GPUs outside an NVLink fabric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<GpuFabric>,
    /// `nvmlDeviceGetNumaNodeId`: the GPU-memory node on coherent
    /// platforms; absent means NOT_SUPPORTED, as on PCIe-attached GPUs.
    #[serde(default)]
    pub numa_node_id: Option<u32>,
    /// `nvmlDeviceGetVirtualizationMode` (nvml.h `nvmlGpuVirtualizationMode_t`):
    /// `none` on bare metal, the default; `passthrough` for a GPU handed whole to
    /// a VM, as the lent test machines are.
    #[serde(default, skip_serializing_if = "is_default")]
    pub virtualization: Virtualization,
    /// Fell off the bus before NVML was initialised: handle lookups answer
    /// GPU_IS_LOST (see the README for what each call answers).
    #[serde(default)]
    pub lost: bool,
    /// Falls off the bus this many ms after the first `nvmlInit` of the
    /// library; until then the GPU behaves normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_after_ms: Option<u64>,
    /// Back on the bus this many ms after the first `nvmlInit` (needs `lost`
    /// or `lost_after_ms`); illustrative, real GPUs need a reset or reboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_after_ms: Option<u64>,
    /// In the PCI tree and hwloc, but not enumerated by NVML.
    #[serde(default)]
    pub nvml_hidden: bool,
    /// Enumerated by NVML, but left out of the rendered hwloc XML.
    #[serde(default)]
    pub hwloc_hidden: bool,
    /// Explicit links, assigned to link numbers in order.
    #[serde(default)]
    pub nvlinks: Vec<NvLinkSpec>,
    /// Link slots the GPU has (defaults to the number of links described);
    /// slots past the described links report an inactive state.
    #[serde(default)]
    pub nvlink_slots: Option<u32>,
}

fn default_revision() -> u8 {
    0xa1
}

/// `count` consecutive links to `remote` (a GPU or NVSwitch bus id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkSpec {
    pub remote: String,
    #[serde(default = "one")]
    pub count: u32,
    #[serde(default = "yes")]
    pub active: bool,
    /// What the far end is; inferred (a GPU of the profile or an NVSwitch)
    /// when absent. `ibmnpu` models the NVLink-attached POWER9 CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_type: Option<RemoteType>,
}

/// `nvmlIntNvLinkDeviceType_t` without the UNKNOWN value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteType {
    Gpu,
    Switch,
    /// `NVML_NVLINK_DEVICE_TYPE_IBMNPU`: an IBM POWER CPU's NVLink unit.
    Ibmnpu,
}

/// What `nvmlDeviceGetNvLinkRemotePciInfo_v2` answers for a link that ends
/// at an NVSwitch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwitchRemotePci {
    /// The switch's own PCI address.
    #[default]
    Address,
    /// The all-ones placeholder `FFFFFFFF:FF:FF.0` (see the README).
    Placeholder,
}

/// Machine-wide NVLink settings. With `switches` and `links_per_gpu`, every
/// GPU without explicit `nvlinks` spreads its links round-robin over the
/// switches (DGX-style NVSwitch baseboard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkFabric {
    #[serde(default)]
    pub version: Option<u32>,
    #[serde(default)]
    pub switches: Vec<String>,
    #[serde(default)]
    pub links_per_gpu: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub switch_remote_pci: SwitchRemotePci,
}

/// How the GPU is virtualized, as NVML reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Virtualization {
    /// Bare metal (`NVML_GPU_VIRTUALIZATION_MODE_NONE`).
    #[default]
    None,
    /// `NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH`.
    Passthrough,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidEvent {
    pub gpu_index: u32,
    pub xid: u64,
    /// Delay from event registration.
    pub after_ms: u64,
    /// The GPU instance the error is attributable to, reported in
    /// `nvmlEventData_t.gpuInstanceId` (nvml.h: set when MIG is enabled and the
    /// error is attributable to a GPU instance, 0xFFFFFFFF otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}

/// PCI address. Ordering is numeric, which is also PCI enumeration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BusId {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl BusId {
    /// Accepts "dddd:bb:dd.f", "dddddddd:bb:dd.f" and "bb:dd.f", any case.
    pub fn parse(s: &str) -> Result<Self, ProfileError> {
        let bad = || ProfileError(format!("invalid PCI bus id {s:?}"));
        let parts: Vec<&str> = s.trim().split(':').collect();
        let (domain, bus, devfn) = match parts.as_slice() {
            [d, b, df] => (*d, *b, *df),
            [b, df] => ("0", *b, *df),
            _ => return Err(bad()),
        };
        let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
        if domain.is_empty() || domain.len() > 8 || bus.len() != 2 || dev.len() != 2 {
            return Err(bad());
        }
        let id = Self {
            domain: u32::from_str_radix(domain, 16).map_err(|_| bad())?,
            bus: u8::from_str_radix(bus, 16).map_err(|_| bad())?,
            device: u8::from_str_radix(dev, 16).map_err(|_| bad())?,
            function: u8::from_str_radix(func, 16).map_err(|_| bad())?,
        };
        if id.device > 0x1f || id.function > 7 {
            return Err(bad());
        }
        Ok(id)
    }

    /// NVML `busId`: 8-digit domain, upper-case hex ("00000000:2A:00.0").
    pub fn nvml(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// NVML `busIdLegacy`: 4-digit domain, upper-case hex.
    pub fn nvml_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Display for BusId {
    /// sysfs/hwloc form: 4-digit domain, lower-case hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Parses a root bus "dddd:bb" into (domain, bus).
pub fn parse_root_bus(s: &str) -> Result<(u32, u8), ProfileError> {
    let bad = || ProfileError(format!("invalid host bridge bus {s:?} (want \"dddd:bb\")"));
    let (d, b) = s.trim().split_once(':').ok_or_else(bad)?;
    if d.is_empty() || d.len() > 8 || b.len() != 2 {
        return Err(bad());
    }
    Ok((
        u32::from_str_radix(d, 16).map_err(|_| bad())?,
        u8::from_str_radix(b, 16).map_err(|_| bad())?,
    ))
}

/// Parses a Linux cpulist ("0-3,8,10-11") into sorted, unique CPU numbers.
pub fn parse_cpu_list(s: &str) -> Result<Vec<u32>, ProfileError> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || ProfileError(format!("invalid cpu list element {part:?} in {s:?}"));
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<u32>().map_err(|_| bad())?,
                b.trim().parse::<u32>().map_err(|_| bad())?,
            ),
            None => {
                let v = part.parse::<u32>().map_err(|_| bad())?;
                (v, v)
            }
        };
        if lo > hi || hi > 65535 {
            return Err(bad());
        }
        out.extend(lo..=hi);
    }
    Ok(out.into_iter().collect())
}

/// Where a PCI device sits, resolved from the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciLocation {
    /// Root bus of the host bridge, "dddd:bb".
    pub host_bridge: String,
    /// NUMA nodes local to the host bridge: its `numa_node`, or every CPU
    /// node of its `package`.
    pub numa_nodes: Vec<u32>,
    pub package: u32,
    /// Bus ids of the PCI-PCI bridges above the device, top first.
    pub bridges: Vec<BusId>,
}

/// One NVLink of a GPU after expanding the compact forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLink {
    pub link: u32,
    pub remote: BusId,
    pub active: bool,
    pub kind: RemoteType,
}

impl Profile {
    /// Parses and validates.
    pub fn from_yaml_str(yaml: &str) -> Result<Self, ProfileError> {
        let p: Self = serde_saphyr::from_str(yaml).map_err(|e| {
            // One line, as every other profile error; the default display adds a
            // multi-line source snippet.
            ProfileError(format!("profile YAML: {}", e.without_snippet()))
        })?;
        p.validate()?;
        Ok(p)
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProfileError(format!("reading {}: {e}", path.display())))?;
        Self::from_yaml_str(&text).map_err(|e| ProfileError(format!("{}: {e}", path.display())))
    }

    /// A profile shipped in `profiles/`.
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        if !builtin_names().contains(&name) {
            return err(format!(
                "no builtin profile {name:?}; known: {}",
                builtin_names().join(", ")
            ));
        }
        Self::load(profiles_dir().join(format!("{name}.yaml")))
    }

    pub fn to_yaml(&self) -> String {
        // Serialising plain data structs cannot fail.
        serde_saphyr::to_string(self).unwrap_or_default()
    }

    pub fn nvml_version(&self) -> String {
        self.nvml_version.clone().unwrap_or_else(|| {
            format!(
                "{}.{}",
                self.cuda_driver_version / 1000,
                self.driver_version
            )
        })
    }

    /// GPUs NVML enumerates, by NVML index.
    pub fn nvml_gpus(&self) -> Vec<&Gpu> {
        let mut v: Vec<&Gpu> = self.gpus.iter().filter(|g| !g.nvml_hidden).collect();
        v.sort_by_key(|g| g.index);
        v
    }

    pub fn gpu_by_bus_id(&self, bus: BusId) -> Option<&Gpu> {
        self.gpus
            .iter()
            .find(|g| BusId::parse(&g.bus_id).ok() == Some(bus))
    }

    pub fn numa_node(&self, os_index: u32) -> Option<&NumaNode> {
        self.numa_nodes.iter().find(|n| n.os_index == os_index)
    }

    /// CPU NUMA nodes of a package, in profile order.
    pub fn cpu_nodes_of_package(&self, package: u32) -> Vec<&NumaNode> {
        self.numa_nodes
            .iter()
            .filter(|n| n.package == package && n.kind == NumaKind::Cpu)
            .collect()
    }

    /// Where a PCI device (GPU or other) sits in the tree.
    pub fn pci_location(&self, bus: BusId) -> Option<PciLocation> {
        fn walk(nodes: &[PciNode], target: BusId, path: &mut Vec<BusId>) -> bool {
            for n in nodes {
                match n {
                    PciNode::Bridge(b) => {
                        let Ok(id) = BusId::parse(&b.bus_id) else {
                            continue;
                        };
                        if id == target {
                            return true;
                        }
                        path.push(id);
                        if walk(&b.children, target, path) {
                            return true;
                        }
                        path.pop();
                    }
                    PciNode::Gpu(s) => {
                        if BusId::parse(s).ok() == Some(target) {
                            return true;
                        }
                    }
                    PciNode::Device(d) => {
                        if BusId::parse(&d.bus_id).ok() == Some(target) {
                            return true;
                        }
                    }
                }
            }
            false
        }
        for hb in &self.pci {
            let mut path = Vec::new();
            if walk(&hb.children, bus, &mut path) {
                let (numa_nodes, package) = match (hb.numa_node, hb.package) {
                    (Some(n), _) => (vec![n], self.numa_node(n)?.package),
                    (None, Some(p)) => (
                        self.cpu_nodes_of_package(p)
                            .iter()
                            .map(|n| n.os_index)
                            .collect(),
                        p,
                    ),
                    (None, None) => return None,
                };
                return Some(PciLocation {
                    host_bridge: hb.bus.clone(),
                    numa_nodes,
                    package,
                    bridges: path,
                });
            }
        }
        None
    }

    /// Every non-GPU endpoint in the PCI tree, keyed by bus id.
    pub fn pci_devices(&self) -> BTreeMap<BusId, &PciDevice> {
        fn walk<'a>(nodes: &'a [PciNode], out: &mut BTreeMap<BusId, &'a PciDevice>) {
            for n in nodes {
                match n {
                    PciNode::Bridge(b) => walk(&b.children, out),
                    PciNode::Device(d) => {
                        if let Ok(id) = BusId::parse(&d.bus_id) {
                            out.insert(id, d);
                        }
                    }
                    PciNode::Gpu(_) => {}
                }
            }
        }
        let mut out = BTreeMap::new();
        for hb in &self.pci {
            walk(&hb.children, &mut out);
        }
        out
    }

    /// Bus ids of NVSwitches: the fabric's list plus PCI devices of class
    /// 0x0680 from NVIDIA.
    pub fn nvswitches(&self) -> BTreeSet<BusId> {
        let mut out: BTreeSet<BusId> = self
            .nvlink
            .iter()
            .flat_map(|f| f.switches.iter())
            .filter_map(|s| BusId::parse(s).ok())
            .collect();
        out.extend(
            self.pci_devices()
                .into_iter()
                .filter(|(_, d)| d.vendor == 0x10de && d.class == 0x0680)
                .map(|(id, _)| id),
        );
        out
    }

    /// The NVLinks of a GPU, expanded. Explicit `nvlinks` win over the
    /// fabric's round-robin form.
    pub fn links_of(&self, gpu: &Gpu) -> Vec<ResolvedLink> {
        let mut out = Vec::new();
        if !gpu.nvlinks.is_empty() {
            let mut link = 0;
            for spec in &gpu.nvlinks {
                let Ok(remote) = BusId::parse(&spec.remote) else {
                    continue;
                };
                let kind = spec
                    .remote_type
                    .unwrap_or_else(|| self.infer_remote(remote));
                for _ in 0..spec.count {
                    out.push(ResolvedLink {
                        link,
                        remote,
                        active: spec.active,
                        kind,
                    });
                    link += 1;
                }
            }
        } else if let Some(f) = &self.nvlink {
            let switches: Vec<BusId> = f
                .switches
                .iter()
                .filter_map(|s| BusId::parse(s).ok())
                .collect();
            if !switches.is_empty() {
                for link in 0..f.links_per_gpu {
                    out.push(ResolvedLink {
                        link,
                        remote: switches[link as usize % switches.len()],
                        active: true,
                        kind: RemoteType::Switch,
                    });
                }
            }
        }
        out
    }

    /// The far end of a link whose spec does not say: a GPU of the profile,
    /// else an NVSwitch (validation rejects anything that is neither).
    fn infer_remote(&self, remote: BusId) -> RemoteType {
        if self.gpu_by_bus_id(remote).is_some() {
            RemoteType::Gpu
        } else {
            RemoteType::Switch
        }
    }

    /// Whether NVSwitch links report the placeholder remote PCI address.
    pub fn switch_remote_pci(&self) -> SwitchRemotePci {
        self.nvlink
            .as_ref()
            .map(|f| f.switch_remote_pci)
            .unwrap_or_default()
    }

    /// Number of NVLink slots NVML answers for; 0 means no NVLink at all.
    pub fn nvlink_slots(&self, gpu: &Gpu) -> u32 {
        gpu.nvlink_slots
            .unwrap_or_else(|| u32::try_from(self.links_of(gpu).len()).unwrap_or(u32::MAX))
    }

    pub fn nvlink_version(&self, gpu: &Gpu) -> u32 {
        self.nvlink
            .as_ref()
            .and_then(|f| f.version)
            .unwrap_or_else(|| gpu.architecture.nvlink_version())
    }

    /// Checks every cross-reference; called by the constructors.
    pub fn validate(&self) -> Result<(), ProfileError> {
        self.validate_inner()
            .map_err(|e| ProfileError(format!("profile {:?}: {}", self.name, e.0)))
    }

    fn validate_inner(&self) -> Result<(), ProfileError> {
        if self.name.trim().is_empty() {
            return err("name is empty");
        }
        if self.driver_version.is_empty() || self.driver_version.len() >= 80 {
            return err("driver_version must be 1..79 characters");
        }
        if let Some(code) = &self.init_error
            && return_code_from_name(code).is_none()
        {
            return err(format!("init_error: unknown NVML return code {code:?}"));
        }
        if self.threads_per_core == 0 {
            return err("threads_per_core must be at least 1");
        }

        // Packages.
        let mut pkgs = BTreeSet::new();
        for p in &self.packages {
            if !pkgs.insert(p.os_index) {
                return err(format!("duplicate package os_index {}", p.os_index));
            }
            if p.l3_cores == Some(0) {
                return err(format!(
                    "package {}: l3_cores must be at least 1",
                    p.os_index
                ));
            }
        }

        // NUMA nodes and their CPUs.
        let mut nodes = BTreeSet::new();
        let mut all_cpus = BTreeSet::new();
        for n in &self.numa_nodes {
            if !nodes.insert(n.os_index) {
                return err(format!("duplicate NUMA node os_index {}", n.os_index));
            }
            if !pkgs.contains(&n.package) {
                return err(format!(
                    "NUMA node {} refers to missing package {}",
                    n.os_index, n.package
                ));
            }
            let cpus = parse_cpu_list(&n.cpus)?;
            match n.kind {
                NumaKind::Cpu if cpus.is_empty() => {
                    return err(format!("NUMA node {} has kind cpu but no cpus", n.os_index));
                }
                NumaKind::GpuMemory if !cpus.is_empty() => {
                    return err(format!(
                        "NUMA node {} has kind gpu-memory but lists cpus",
                        n.os_index
                    ));
                }
                _ => {}
            }
            if cpus.len() % self.threads_per_core as usize != 0 {
                return err(format!(
                    "NUMA node {}: {} cpus is not a multiple of threads_per_core {}",
                    n.os_index,
                    cpus.len(),
                    self.threads_per_core
                ));
            }
            for c in cpus {
                if !all_cpus.insert(c) {
                    return err(format!("cpu {c} is listed in more than one NUMA node"));
                }
            }
        }
        for p in &self.packages {
            let cpu_nodes = self.cpu_nodes_of_package(p.os_index).len();
            if cpu_nodes == 0 {
                return err(format!("package {} has no CPU NUMA node", p.os_index));
            }
            if let Some(label) = &p.sub_numa {
                let digits: String = label.chars().filter(char::is_ascii_digit).collect();
                match digits.parse::<usize>() {
                    Ok(k) if k == cpu_nodes => {}
                    _ => {
                        return err(format!(
                            "package {}: sub_numa {label:?} but {cpu_nodes} CPU NUMA nodes",
                            p.os_index
                        ));
                    }
                }
            }
        }

        // Distances.
        let n = self.numa_nodes.len();
        if self.distances.len() != n || self.distances.iter().any(|r| r.len() != n) {
            return err(format!(
                "distance matrix must be square with {n} rows of {n} (one per NUMA node)"
            ));
        }
        for (i, row) in self.distances.iter().enumerate() {
            if row[i] != 10 {
                return err(format!("distances[{i}][{i}] must be 10 (SLIT local)"));
            }
        }

        // GPUs.
        let mut gpu_bus = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        let mut minors = BTreeSet::new();
        let mut indices = BTreeSet::new();
        for g in &self.gpus {
            let id = BusId::parse(&g.bus_id)?;
            if !gpu_bus.insert(id) {
                return err(format!("duplicate GPU bus id {}", g.bus_id));
            }
            if !g.uuid.starts_with("GPU-") || g.uuid.len() >= 80 {
                return err(format!(
                    "GPU {}: uuid must look like GPU-xxxxxxxx-…",
                    g.bus_id
                ));
            }
            if !uuids.insert(g.uuid.as_str()) {
                return err(format!("duplicate GPU uuid {}", g.uuid));
            }
            if !minors.insert(g.minor) {
                return err(format!("duplicate GPU minor {}", g.minor));
            }
            if !indices.insert(g.index) {
                return err(format!("duplicate GPU index {}", g.index));
            }
            if g.name.is_empty() || g.name.len() >= 96 {
                return err(format!("GPU {}: name must be 1..95 characters", g.bus_id));
            }
            if brand_from_name(&g.brand).is_none() {
                return err(format!("GPU {}: unknown brand {:?}", g.bus_id, g.brand));
            }
            if parse_compute_capability(&g.compute_capability).is_none() {
                return err(format!(
                    "GPU {}: compute_capability {:?} is not \"major.minor\"",
                    g.bus_id, g.compute_capability
                ));
            }
            if g.pci_device_id & 0xffff != 0x10de {
                return err(format!(
                    "GPU {}: pci_device_id {:#010x} must end in the NVIDIA vendor id 10de",
                    g.bus_id, g.pci_device_id
                ));
            }
            // Any node of the machine. Where nvmlDeviceGetNumaNodeId answers on
            // non-coherent platforms it names the GPU's CPU node (NVIDIA's DRA
            // driver publishes it as such: kubernetes-sigs/dra-driver-nvidia-gpu
            // PR 1165), while others answer NOT_SUPPORTED (same thread: L4 on
            // driver 580); consumers must check it against the topology.
            if let Some(node) = g.numa_node_id
                && self.numa_node(node).is_none()
            {
                return err(format!(
                    "GPU {}: numa_node_id {node} is not a NUMA node of the machine",
                    g.bus_id
                ));
            }
        }
        let visible: Vec<u32> = self.nvml_gpus().iter().map(|g| g.index).collect();
        if visible
            .iter()
            .enumerate()
            .any(|(i, &idx)| idx as usize != i)
        {
            return err(format!(
                "NVML-visible GPU indices must be 0..{} without gaps, got {visible:?}",
                visible.len()
            ));
        }

        // PCI tree.
        let mut seen = BTreeSet::new();
        let mut roots = BTreeSet::new();
        for hb in &self.pci {
            let (domain, bus) = parse_root_bus(&hb.bus)?;
            if !roots.insert((domain, bus)) {
                return err(format!("duplicate host bridge {}", hb.bus));
            }
            match (hb.numa_node, hb.package) {
                (Some(n), None) => {
                    if self.numa_node(n).is_none_or(|n| n.kind != NumaKind::Cpu) {
                        return err(format!(
                            "host bridge {} refers to missing or CPU-less NUMA node {n}",
                            hb.bus
                        ));
                    }
                }
                (None, Some(p)) => {
                    if !pkgs.contains(&p) {
                        return err(format!(
                            "host bridge {} refers to missing package {p}",
                            hb.bus
                        ));
                    }
                }
                _ => {
                    return err(format!(
                        "host bridge {} needs exactly one of numa_node or package",
                        hb.bus
                    ));
                }
            }
            if hb.children.is_empty() {
                return err(format!("host bridge {} has no children", hb.bus));
            }
            check_children(&hb.children, domain, bus, &gpu_bus, &mut seen)?;
        }
        for g in &self.gpus {
            let id = BusId::parse(&g.bus_id)?;
            if self.pci_location(id).is_none() {
                return err(format!("GPU {} is not placed in the PCI tree", g.bus_id));
            }
        }

        // NVLink.
        let switches = self.nvswitches();
        if let Some(f) = &self.nvlink {
            for s in &f.switches {
                BusId::parse(s)?;
            }
            if f.links_per_gpu > bindings::NVML_NVLINK_MAX_LINKS {
                return err(format!(
                    "nvlink.links_per_gpu {} exceeds NVML_NVLINK_MAX_LINKS",
                    f.links_per_gpu
                ));
            }
            if f.links_per_gpu > 0 && f.switches.is_empty() {
                return err("nvlink.links_per_gpu needs nvlink.switches");
            }
        }
        for g in &self.gpus {
            let me = BusId::parse(&g.bus_id)?;
            for spec in &g.nvlinks {
                let r = BusId::parse(&spec.remote)?;
                if r == me {
                    return err(format!("GPU {}: NVLink to itself", g.bus_id));
                }
                check_remote(g, spec, r, &gpu_bus, &switches)?;
            }
            let links = self.links_of(g);
            if links.len() > bindings::NVML_NVLINK_MAX_LINKS as usize {
                return err(format!(
                    "GPU {}: {} NVLinks exceed NVML_NVLINK_MAX_LINKS",
                    g.bus_id,
                    links.len()
                ));
            }
            if let Some(slots) = g.nvlink_slots
                && ((slots as usize) < links.len() || slots > bindings::NVML_NVLINK_MAX_LINKS)
            {
                return err(format!(
                    "GPU {}: nvlink_slots {slots} must cover its {} links and not exceed {}",
                    g.bus_id,
                    links.len(),
                    bindings::NVML_NVLINK_MAX_LINKS
                ));
            }
            // Point-to-point cables exist at both ends.
            for l in links.iter().filter(|l| gpu_bus.contains(&l.remote)) {
                let Some(peer) = self.gpu_by_bus_id(l.remote) else {
                    continue;
                };
                let mine = links.iter().filter(|x| x.remote == l.remote).count();
                let theirs = self
                    .links_of(peer)
                    .iter()
                    .filter(|x| x.remote == me)
                    .count();
                if mine != theirs {
                    return err(format!(
                        "NVLink {} <-> {} is asymmetric ({mine} vs {theirs} links)",
                        g.bus_id, peer.bus_id
                    ));
                }
            }
        }

        self.validate_gpu_extras()?;

        // XIDs.
        for x in &self.xid_events {
            if !visible.contains(&x.gpu_index) {
                return err(format!(
                    "xid event refers to GPU index {} which NVML does not enumerate",
                    x.gpu_index
                ));
            }
        }
        Ok(())
    }
}

impl Profile {
    /// MIG devices, fabric info and loss timing of every GPU.
    fn validate_gpu_extras(&self) -> Result<(), ProfileError> {
        let mut mig_uuids: BTreeSet<String> = self.gpus.iter().map(|g| g.uuid.clone()).collect();
        let mut cap_minors = BTreeSet::from([mig::CONFIG_MINOR, mig::MONITOR_MINOR]);
        for g in &self.gpus {
            mig::validate_gpu(g, &mut mig_uuids, &mut cap_minors)?;
            if let Some(f) = &g.fabric {
                f.validate(&g.bus_id)?;
            }
            check_loss_timing(g)?;
        }
        Ok(())
    }
}

/// `lost` and `lost_after_ms` are two starts of one outage, and a recovery
/// comes after the start.
fn check_loss_timing(g: &Gpu) -> Result<(), ProfileError> {
    if g.lost && g.lost_after_ms.is_some() {
        return err(format!(
            "GPU {}: lost and lost_after_ms are exclusive (lost means lost at init)",
            g.bus_id
        ));
    }
    if let Some(back) = g.recovered_after_ms {
        let start = match (g.lost, g.lost_after_ms) {
            (true, _) => 0,
            (false, Some(ms)) => ms,
            (false, None) => {
                return err(format!(
                    "GPU {}: recovered_after_ms needs lost or lost_after_ms",
                    g.bus_id
                ));
            }
        };
        if back <= start {
            return err(format!(
                "GPU {}: recovered_after_ms {back} must be after the loss at {start} ms",
                g.bus_id
            ));
        }
    }
    Ok(())
}

/// An explicit link's far end exists and is of the kind the spec says.
fn check_remote(
    g: &Gpu,
    spec: &NvLinkSpec,
    remote: BusId,
    gpus: &BTreeSet<BusId>,
    switches: &BTreeSet<BusId>,
) -> Result<(), ProfileError> {
    let is_gpu = gpus.contains(&remote);
    let is_switch = switches.contains(&remote);
    let ok = match spec.remote_type {
        None => is_gpu || is_switch,
        Some(RemoteType::Gpu) => is_gpu,
        Some(RemoteType::Switch) => is_switch,
        // A POWER9 NPU is a CPU-side device, never one of the GPUs.
        Some(RemoteType::Ibmnpu) => !is_gpu && !is_switch,
    };
    if ok {
        return Ok(());
    }
    err(match spec.remote_type {
        None => format!(
            "GPU {}: NVLink remote {} is neither a GPU nor an NVSwitch (set remote_type for other ends)",
            g.bus_id, spec.remote
        ),
        Some(kind) => format!(
            "GPU {}: NVLink remote {} is not a {kind:?} (remote_type)",
            g.bus_id, spec.remote
        ),
    })
}

impl Gpu {
    /// `nvmlDeviceGetMaxMigDeviceCount` while MIG is enabled.
    pub fn max_mig_devices(&self) -> u32 {
        self.mig
            .and_then(|m| m.max_devices)
            .unwrap_or(mig::DEFAULT_MAX_MIG_DEVICES)
    }

    /// Whether the GPU is off the bus `ms` milliseconds after the first
    /// `nvmlInit`.
    pub fn lost_at(&self, ms: u64) -> bool {
        let start = if self.lost {
            Some(0)
        } else {
            self.lost_after_ms
        };
        match start {
            Some(start) if ms >= start => self.recovered_after_ms.is_none_or(|back| ms < back),
            _ => false,
        }
    }
}

use nvml_wrapper_sys::bindings;

fn check_children(
    children: &[PciNode],
    domain: u32,
    bus: u8,
    gpus: &BTreeSet<BusId>,
    seen: &mut BTreeSet<BusId>,
) -> Result<(), ProfileError> {
    // Sibling bridges decode disjoint bus ranges, or PCI routing is ambiguous.
    let mut ranges: Vec<(u8, u8, &str)> = Vec::new();
    for c in children {
        if let PciNode::Bridge(b) = c
            && let Some((lo, hi)) = bus_range(&b.children)
        {
            if let Some((_, _, other)) = ranges.iter().find(|(l, h, _)| lo <= *h && *l <= hi) {
                return err(format!(
                    "bridges {other} and {} decode overlapping bus ranges",
                    b.bus_id
                ));
            }
            ranges.push((lo, hi, &b.bus_id));
        }
    }
    for c in children {
        let id = match c {
            PciNode::Bridge(b) => BusId::parse(&b.bus_id)?,
            PciNode::Gpu(s) => {
                let id = BusId::parse(s)?;
                if !gpus.contains(&id) {
                    return err(format!("PCI tree refers to GPU {s} missing from gpus"));
                }
                id
            }
            PciNode::Device(d) => BusId::parse(&d.bus_id)?,
        };
        if !seen.insert(id) {
            return err(format!("duplicate PCI bus id {id} in the PCI tree"));
        }
        if id.domain != domain || id.bus != bus {
            return err(format!(
                "{id} cannot sit on bus {domain:04x}:{bus:02x} (its parent's secondary bus)"
            ));
        }
        if let PciNode::Bridge(b) = c {
            let mut child_bus = None;
            for cc in &b.children {
                let cid = match cc {
                    PciNode::Bridge(x) => BusId::parse(&x.bus_id)?,
                    PciNode::Gpu(s) => BusId::parse(s)?,
                    PciNode::Device(d) => BusId::parse(&d.bus_id)?,
                };
                match child_bus {
                    None => child_bus = Some(cid.bus),
                    Some(cb) if cb != cid.bus => {
                        return err(format!(
                            "children of bridge {id} are on different buses ({cb:02x} and {:02x})",
                            cid.bus
                        ));
                    }
                    _ => {}
                }
            }
            let Some(secondary) = child_bus else {
                return err(format!("bridge {id} has no children"));
            };
            if secondary <= bus {
                return err(format!(
                    "bridge {id}: children on bus {secondary:02x} must be above {bus:02x}"
                ));
            }
            check_children(&b.children, domain, secondary, gpus, seen)?;
        }
    }
    Ok(())
}

/// Secondary bus and subordinate bus of a bridge whose children are `children`.
pub fn bus_range(children: &[PciNode]) -> Option<(u8, u8)> {
    fn max_bus(nodes: &[PciNode]) -> Option<u8> {
        nodes
            .iter()
            .filter_map(|n| match n {
                PciNode::Bridge(b) => {
                    let own = BusId::parse(&b.bus_id).ok().map(|i| i.bus);
                    own.max(max_bus(&b.children))
                }
                PciNode::Gpu(s) => BusId::parse(s).ok().map(|i| i.bus),
                PciNode::Device(d) => BusId::parse(&d.bus_id).ok().map(|i| i.bus),
            })
            .max()
    }
    let first = children.first().and_then(|n| match n {
        PciNode::Bridge(b) => BusId::parse(&b.bus_id).ok(),
        PciNode::Gpu(s) => BusId::parse(s).ok(),
        PciNode::Device(d) => BusId::parse(&d.bus_id).ok(),
    })?;
    Some((first.bus, max_bus(children)?))
}

/// "9.0" → (9, 0).
pub fn parse_compute_capability(s: &str) -> Option<(i32, i32)> {
    let (a, b) = s.split_once('.')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// NVML brand enum name (with or without `NVML_BRAND_`) → value.
pub fn brand_from_name(name: &str) -> Option<bindings::nvmlBrandType_t> {
    let n = name.trim().to_ascii_uppercase();
    let n = n.strip_prefix("NVML_BRAND_").unwrap_or(&n);
    Some(match n {
        "UNKNOWN" => bindings::nvmlBrandType_enum_NVML_BRAND_UNKNOWN,
        "QUADRO" => bindings::nvmlBrandType_enum_NVML_BRAND_QUADRO,
        "TESLA" => bindings::nvmlBrandType_enum_NVML_BRAND_TESLA,
        "NVS" => bindings::nvmlBrandType_enum_NVML_BRAND_NVS,
        "GRID" => bindings::nvmlBrandType_enum_NVML_BRAND_GRID,
        "GEFORCE" => bindings::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
        "TITAN" => bindings::nvmlBrandType_enum_NVML_BRAND_TITAN,
        "NVIDIA_VAPPS" => bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VAPPS,
        "NVIDIA_VPC" => bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VPC,
        "NVIDIA_VCS" => bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VCS,
        "NVIDIA_VWS" => bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA_VWS,
        "NVIDIA_CLOUD_GAMING" | "NVIDIA_VGAMING" => {
            bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA_CLOUD_GAMING
        }
        "QUADRO_RTX" => bindings::nvmlBrandType_enum_NVML_BRAND_QUADRO_RTX,
        "NVIDIA_RTX" => bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
        "NVIDIA" => bindings::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        "GEFORCE_RTX" => bindings::nvmlBrandType_enum_NVML_BRAND_GEFORCE_RTX,
        "TITAN_RTX" => bindings::nvmlBrandType_enum_NVML_BRAND_TITAN_RTX,
        _ => return None,
    })
}

/// The NVML return codes by name (without `NVML_ERROR_`/`NVML_` prefix).
const RETURN_CODES: &[(&str, bindings::nvmlReturn_t)] = &[
    ("SUCCESS", bindings::nvmlReturn_enum_NVML_SUCCESS),
    (
        "UNINITIALIZED",
        bindings::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
    ),
    (
        "INVALID_ARGUMENT",
        bindings::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    ),
    (
        "NOT_SUPPORTED",
        bindings::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    ),
    (
        "NO_PERMISSION",
        bindings::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
    ),
    (
        "ALREADY_INITIALIZED",
        bindings::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED,
    ),
    ("NOT_FOUND", bindings::nvmlReturn_enum_NVML_ERROR_NOT_FOUND),
    (
        "INSUFFICIENT_SIZE",
        bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
    ),
    (
        "INSUFFICIENT_POWER",
        bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
    ),
    (
        "DRIVER_NOT_LOADED",
        bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
    ),
    ("TIMEOUT", bindings::nvmlReturn_enum_NVML_ERROR_TIMEOUT),
    ("IRQ_ISSUE", bindings::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE),
    (
        "LIBRARY_NOT_FOUND",
        bindings::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
    ),
    (
        "FUNCTION_NOT_FOUND",
        bindings::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
    ),
    (
        "CORRUPTED_INFOROM",
        bindings::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
    ),
    (
        "GPU_IS_LOST",
        bindings::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
    ),
    (
        "RESET_REQUIRED",
        bindings::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
    ),
    (
        "OPERATING_SYSTEM",
        bindings::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM,
    ),
    (
        "LIB_RM_VERSION_MISMATCH",
        bindings::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    ),
    ("IN_USE", bindings::nvmlReturn_enum_NVML_ERROR_IN_USE),
    ("MEMORY", bindings::nvmlReturn_enum_NVML_ERROR_MEMORY),
    ("NO_DATA", bindings::nvmlReturn_enum_NVML_ERROR_NO_DATA),
    (
        "VGPU_ECC_NOT_SUPPORTED",
        bindings::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
    ),
    (
        "INSUFFICIENT_RESOURCES",
        bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
    ),
    (
        "FREQ_NOT_SUPPORTED",
        bindings::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED,
    ),
    (
        "ARGUMENT_VERSION_MISMATCH",
        bindings::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ),
    (
        "DEPRECATED",
        bindings::nvmlReturn_enum_NVML_ERROR_DEPRECATED,
    ),
    ("NOT_READY", bindings::nvmlReturn_enum_NVML_ERROR_NOT_READY),
    (
        "GPU_NOT_FOUND",
        bindings::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND,
    ),
    (
        "INVALID_STATE",
        bindings::nvmlReturn_enum_NVML_ERROR_INVALID_STATE,
    ),
    (
        "RESET_TYPE_NOT_SUPPORTED",
        bindings::nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED,
    ),
    ("UNKNOWN", bindings::nvmlReturn_enum_NVML_ERROR_UNKNOWN),
];

pub fn return_code_from_name(name: &str) -> Option<bindings::nvmlReturn_t> {
    let n = name.trim().to_ascii_uppercase();
    let n = n
        .strip_prefix("NVML_ERROR_")
        .or_else(|| n.strip_prefix("NVML_"))
        .unwrap_or(&n);
    RETURN_CODES.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
}

pub fn return_code_name(code: bindings::nvmlReturn_t) -> Option<&'static str> {
    RETURN_CODES
        .iter()
        .find(|(_, v)| *v == code)
        .map(|(k, _)| *k)
}

/// `tests/fake-nvml/profiles` in the source tree.
pub fn profiles_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("profiles")
}

/// Names of the profiles shipped in `profiles/`.
pub fn builtin_names() -> &'static [&'static str] {
    &[
        "dgx-h100",
        "dgx-a100",
        "l40s-pcie",
        "snc4-xeon",
        "gb200",
        "empty",
        "init-failure",
        "mismatch",
        "dgx-a100-mig",
        "dgx-h100-mig",
        "hgx-h100-placeholder",
        "lost-gpu",
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_forms() {
        let id = BusId::parse("0000:2a:00.0").expect("parse");
        assert_eq!(id.to_string(), "0000:2a:00.0");
        assert_eq!(id.nvml(), "00000000:2A:00.0");
        assert_eq!(id.nvml_legacy(), "0000:2A:00.0");
        assert_eq!(BusId::parse("00000000:2A:00.0"), Ok(id));
        assert_eq!(BusId::parse("2a:00.0"), Ok(id));
        assert!(BusId::parse("0000:2a:20.0").is_err());
        assert!(BusId::parse("junk").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,8"), Ok(vec![0, 1, 2, 8]));
        assert_eq!(parse_cpu_list(""), Ok(vec![]));
        assert!(parse_cpu_list("3-1").is_err());
    }

    #[test]
    fn return_codes_by_name() {
        assert_eq!(
            return_code_from_name("DRIVER_NOT_LOADED"),
            Some(bindings::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED)
        );
        assert_eq!(
            return_code_from_name("NVML_ERROR_GPU_IS_LOST"),
            Some(bindings::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
        );
        assert_eq!(return_code_from_name("NOPE"), None);
    }
}
