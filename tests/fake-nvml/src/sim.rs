//! A whole simulated GPU node on disk: the fake NVML with a profile, the profile's
//! hwloc topology, a driver root of real ELF files ([`crate::driver_root`]), a
//! `/proc/devices` that registers the NVIDIA majors, and a copy of
//! `/proc/driver/nvidia/capabilities` with the MIG access capabilities, and the
//! profile's CPUs as sysfs shows them under a host root ([`crate::cpu_sysfs`]) for a
//! CPU DRA driver beside ours. The kubelet plugin runs against it unchanged, with
//! the paths passed as its ordinary flags.

use std::path::{Path, PathBuf};

use crate::driver_root::{self, DriverRoot, Layout};
use crate::profile::mig::{CONFIG_MINOR, MONITOR_MINOR};
use crate::{Profile, cpu_sysfs, hwloc_xml};

/// Major of `nvidia-caps` in the simulated `/proc/devices`. The kernel assigns
/// it dynamically; 508 is the value in the MIG User Guide's `ls -l
/// /dev/nvidia-caps` example, so illustrative.
pub const NVIDIA_CAPS_MAJOR: u32 = 508;

/// The simulated `/proc/devices`: majors of the NVIDIA character devices,
/// in ascending order as the kernel lists them. 195 is the NVIDIA driver's
/// fixed major; nvidia-caps and nvidia-uvm are dynamic, their numbers
/// illustrative.
fn proc_devices_text() -> String {
    format!(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n{NVIDIA_CAPS_MAJOR} nvidia-caps\n\
         509 nvidia-uvm\n\nBlock devices:\n  8 sd\n"
    )
}

/// `DeviceFileMode` of `mig/config`: 256 (0400, root only), as the MIG User
/// Guide's `cat /proc/driver/nvidia/capabilities/mig/config` shows.
const MODE_ROOT_READ: u32 = 0o400;
/// 292 (0444): `mig/monitor` and the GI/CI `access` files are world-readable
/// (`-r--r--r--` in the guide's `ls -l` listings).
const MODE_ALL_READ: u32 = 0o444;

/// Body of a capability file, in the format the MIG User Guide prints
/// ("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1").
pub fn capability_file(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

/// Lays out `/proc/driver/nvidia/capabilities` under `dir`: `mig/config` and
/// `mig/monitor` when a GPU is MIG-capable, and for every MIG device
/// `gpu<minor>/mig/gi<id>/access` and `gpu<minor>/mig/gi<id>/ci<id>/access`.
pub fn write_capabilities(dir: &Path, profile: &Profile) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if profile.gpus.iter().any(|g| g.mig.is_some()) {
        let mig = dir.join("mig");
        std::fs::create_dir_all(&mig)?;
        std::fs::write(
            mig.join("config"),
            capability_file(CONFIG_MINOR, MODE_ROOT_READ),
        )?;
        std::fs::write(
            mig.join("monitor"),
            capability_file(MONITOR_MINOR, MODE_ALL_READ),
        )?;
    }
    for g in &profile.gpus {
        for d in &g.mig_devices {
            let gi = dir
                .join(format!("gpu{}", g.minor))
                .join("mig")
                .join(format!("gi{}", d.gpu_instance_id));
            let ci = gi.join(format!("ci{}", d.compute_instance_id));
            std::fs::create_dir_all(&ci)?;
            std::fs::write(
                gi.join("access"),
                capability_file(d.gi_minor(g.minor), MODE_ALL_READ),
            )?;
            std::fs::write(
                ci.join("access"),
                capability_file(d.ci_minor(g.minor), MODE_ALL_READ),
            )?;
        }
    }
    Ok(())
}

/// Paths of a simulated node, as flags of `topodra-kubelet-plugin serve`.
#[derive(Debug, Clone)]
pub struct SimNode {
    pub nvml_lib: PathBuf,
    pub hwloc_xml: PathBuf,
    pub driver_root: PathBuf,
    pub dev_root: PathBuf,
    pub proc_devices: PathBuf,
    /// Mirror of `/proc/driver/nvidia/capabilities`.
    pub capabilities_dir: PathBuf,
    /// The fake NVML's MIG state ([`crate::ffi::mig::state`]): which GPU and
    /// compute instances exist. Tests inject faults through it;
    /// [`SimNode::reboot`] resets it.
    pub nvml_state: PathBuf,
    /// The `nvidia-cdi-hook` the plugin installs (`--cdi-hook-source`): NVIDIA's
    /// or a stand-in, see [`crate::cdi_hook`]. `None` passes no flag, and the
    /// plugin looks for the image's `/usr/bin/nvidia-cdi-hook`.
    pub cdi_hook_source: Option<PathBuf>,
    /// A host root whose `sys/devices/system/{cpu,node}` describe the profile's
    /// CPUs ([`crate::cpu_sysfs`]): the `HOST_ROOT` of kubernetes-sigs'
    /// dra-driver-cpu. Not a plugin flag (ours reads CPUs from the hwloc XML).
    pub cpu_host_root: PathBuf,
}

impl SimNode {
    /// The plugin flags that point at this node.
    pub fn plugin_args(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        let mut args = vec![
            format!("--nvml-lib={}", p(&self.nvml_lib)),
            format!("--hwloc-xml={}", p(&self.hwloc_xml)),
            format!("--driver-root={}", p(&self.driver_root)),
            format!("--dev-root={}", p(&self.dev_root)),
            format!("--proc-devices={}", p(&self.proc_devices)),
            format!("--nvidia-capabilities-dir={}", p(&self.capabilities_dir)),
        ];
        if let Some(hook) = &self.cdi_hook_source {
            args.push(format!("--cdi-hook-source={}", p(hook)));
        }
        args
    }

    /// A reboot of the node's GPUs: the instances made since boot are gone,
    /// the profile's own are back, and the capability files say so. Faults
    /// injected into the state are cleared with it.
    pub fn reboot(&self, profile_yaml: &str) -> std::io::Result<()> {
        let profile = Profile::from_yaml_str(profile_yaml).map_err(std::io::Error::other)?;
        std::fs::remove_dir_all(&self.capabilities_dir)?;
        write_capabilities(&self.capabilities_dir, &profile)?;
        write_boot_state(&self.nvml_state, &self.capabilities_dir)
    }

    /// This node with `hook` as the plugin's `--cdi-hook-source`.
    #[must_use]
    pub fn with_cdi_hook(mut self, hook: impl Into<PathBuf>) -> Self {
        self.cdi_hook_source = Some(hook.into());
        self
    }
}

/// The state file of a freshly booted node: no instances beyond the profile's,
/// the capabilities mirror to keep in step.
fn write_boot_state(path: &Path, capabilities_dir: &Path) -> std::io::Result<()> {
    let state = crate::ffi::mig::state::DriverState {
        capabilities_dir: Some(capabilities_dir.to_owned()),
        ..Default::default()
    };
    crate::ffi::mig::state::write(path, &state).map_err(|e| std::io::Error::other(e.0))
}

/// Choices of [`materialize_with`] that callers other than topodra's plugin need.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimOptions {
    /// Also make the driver's device nodes under `<driver-root>/dev` (needs
    /// `CAP_MKNOD`; refused, it is an error). NVIDIA's GPU kubelet plugin takes
    /// its driver root as the device root when the root has a `dev/`, and
    /// otherwise looks in the host's `/dev`.
    pub driver_root_device_nodes: bool,
}

/// Lays out a simulated node for `profile_yaml` under `dir`, installing `nvml_lib_src`
/// (a built `libtopodra_fake_nvml.so`) as its NVML.
pub fn materialize(
    dir: &Path,
    profile_yaml: &str,
    nvml_lib_src: &Path,
) -> std::io::Result<SimNode> {
    materialize_with(dir, profile_yaml, nvml_lib_src, SimOptions::default())
}

/// [`materialize`] with [`SimOptions`].
pub fn materialize_with(
    dir: &Path,
    profile_yaml: &str,
    nvml_lib_src: &Path,
    options: SimOptions,
) -> std::io::Result<SimNode> {
    let profile = Profile::from_yaml_str(profile_yaml).map_err(std::io::Error::other)?;
    let nvml_dir = dir.join("nvml");
    std::fs::create_dir_all(&nvml_dir)?;
    let nvml_lib = nvml_dir.join(crate::INSTALLED_NAME);
    std::fs::copy(nvml_lib_src, &nvml_lib)?;
    std::fs::write(nvml_dir.join(crate::ffi::PROFILE_FILE_NAME), profile_yaml)?;
    // Absolute paths: the state names the mirror, the driver root links the
    // state, and whoever reads either may run in another directory.
    let capabilities_dir = dir.join("capabilities");
    write_capabilities(&capabilities_dir, &profile)?;
    let capabilities_dir = std::fs::canonicalize(capabilities_dir)?;
    let nvml_state =
        std::fs::canonicalize(&nvml_dir)?.join(crate::ffi::mig::state::STATE_FILE_NAME);
    write_boot_state(&nvml_state, &capabilities_dir)?;

    let hwloc = dir.join("topology.xml");
    std::fs::write(&hwloc, hwloc_xml::render(&profile))?;

    // A driver root of real ELF files (see `driver_root`): the R570 file list with
    // the profile's driver version, its NVML this node's fake with the profile
    // beside it, so whatever dlopens the root's `libnvidia-ml.so.1` (the NVIDIA
    // Container Toolkit, a container) sees this machine, and its libcuda names the
    // profile's GPUs (UUID, name) to a process given their nodes. No device nodes
    // unless asked for: topodra's plugin takes their numbers from `proc-devices`,
    // and tests that need nodes make them in the dev root themselves.
    let driver_root = dir.join("driver-root");
    let built = DriverRoot::build(
        &driver_root,
        Layout::Debian,
        &profile.driver_version,
        &driver_root::Options {
            gpu_minors: profile
                .gpus
                .iter()
                .filter(|g| !g.nvml_hidden)
                .map(|g| g.minor)
                .collect(),
            cuda_gpus: driver_root::CudaGpu::from_profile(&profile),
            cuda_driver_version: profile.cuda_driver_version,
            nvml_lib: Some(nvml_lib_src.to_owned()),
            nvml_profile: Some(profile_yaml.to_owned()),
            nvml_state: Some(nvml_state.clone()),
            device_nodes: options.driver_root_device_nodes,
            ..driver_root::Options::default()
        },
    )?;
    if let driver_root::DeviceNodes::Skipped { reason } = built.device_nodes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            reason,
        ));
    }

    let dev_root = dir.join("dev-root");
    std::fs::create_dir_all(dev_root.join("dev"))?;
    let proc_devices = dir.join("proc-devices");
    std::fs::write(&proc_devices, proc_devices_text())?;
    let cpu_host_root = dir.join("host-root");
    cpu_sysfs::write(&cpu_host_root, &profile)?;
    Ok(SimNode {
        nvml_lib,
        hwloc_xml: hwloc,
        driver_root,
        dev_root,
        proc_devices,
        capabilities_dir,
        nvml_state,
        cdi_hook_source: None,
        cpu_host_root,
    })
}
