//! A whole simulated GPU node on disk: the fake NVML with a profile, the profile's
//! hwloc topology, a driver root with the library names the CDI code looks for, and a
//! `/proc/devices` that registers the NVIDIA majors. The kubelet plugin runs against
//! it unchanged, with the paths passed as its ordinary flags.

use std::path::{Path, PathBuf};

use crate::{Profile, hwloc_xml};

/// Paths of a simulated node, as flags of `topodra-kubelet-plugin serve`.
#[derive(Debug, Clone)]
pub struct SimNode {
    pub nvml_lib: PathBuf,
    pub hwloc_xml: PathBuf,
    pub driver_root: PathBuf,
    pub dev_root: PathBuf,
    pub proc_devices: PathBuf,
}

impl SimNode {
    /// The plugin flags that point at this node.
    pub fn plugin_args(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            format!("--nvml-lib={}", p(&self.nvml_lib)),
            format!("--hwloc-xml={}", p(&self.hwloc_xml)),
            format!("--driver-root={}", p(&self.driver_root)),
            format!("--dev-root={}", p(&self.dev_root)),
            format!("--proc-devices={}", p(&self.proc_devices)),
        ]
    }
}

/// Lays out a simulated node for `profile_yaml` under `dir`, installing `nvml_lib_src`
/// (a built `libtopodra_fake_nvml.so`) as its NVML.
pub fn materialize(
    dir: &Path,
    profile_yaml: &str,
    nvml_lib_src: &Path,
) -> std::io::Result<SimNode> {
    let profile = Profile::from_yaml_str(profile_yaml).map_err(std::io::Error::other)?;
    let nvml_dir = dir.join("nvml");
    std::fs::create_dir_all(&nvml_dir)?;
    let nvml_lib = nvml_dir.join(crate::INSTALLED_NAME);
    std::fs::copy(nvml_lib_src, &nvml_lib)?;
    std::fs::write(nvml_dir.join(crate::ffi::PROFILE_FILE_NAME), profile_yaml)?;

    let hwloc = dir.join("topology.xml");
    std::fs::write(&hwloc, hwloc_xml::render(&profile))?;

    // Empty files with the driver's library and binary names: enough for the CDI
    // spec's mounts, which only need paths.
    let driver_root = dir.join("driver-root");
    let version = &profile.driver_version;
    let libdir = driver_root.join("usr/lib/x86_64-linux-gnu");
    let bindir = driver_root.join("usr/bin");
    std::fs::create_dir_all(&libdir)?;
    std::fs::create_dir_all(&bindir)?;
    for lib in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
    ] {
        std::fs::write(libdir.join(format!("{lib}.{version}")), b"")?;
    }
    std::fs::write(bindir.join("nvidia-smi"), b"")?;

    let dev_root = dir.join("dev-root");
    std::fs::create_dir_all(dev_root.join("dev"))?;
    let proc_devices = dir.join("proc-devices");
    std::fs::write(
        &proc_devices,
        "Character devices:\n  1 mem\n195 nvidia-frontend\n509 nvidia-uvm\n\nBlock devices:\n  8 sd\n",
    )?;
    Ok(SimNode {
        nvml_lib,
        hwloc_xml: hwloc,
        driver_root,
        dev_root,
        proc_devices,
    })
}
