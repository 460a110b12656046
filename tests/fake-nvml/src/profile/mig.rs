//! MIG devices of a GPU in MIG mode: the (GPU instance, compute instance)
//! pairs NVML hands out as MIG device handles, and the nvidia-capabilities
//! device minors that gate access to them.
//!
//! Facts used here, from the NVIDIA Multi-Instance GPU User Guide:
//! - "MIG Device Names": a device is named `<g>g.<mem>gb` after its GPU
//!   instance's compute slices and memory; when the compute instance is
//!   smaller than its GPU instance the name is `<c>c.<g>g.<mem>gb`. Profiles
//!   with media extensions add `+me` (e.g. `1g.5gb+me`).
//! - "Device Nodes and Capabilities": `/proc/driver/nvidia-caps/mig-minors`
//!   lists every possible capability and its minor: `config 1`, `monitor 2`,
//!   `gpu0/gi0/access 3`, `gpu0/gi0/ci0/access 4`, … up to
//!   `gpu31/gi14/ci7/access 4322`; the guide's example geometry on GPU 0 GI 1
//!   uses `/dev/nvidia-cap12` to `nvidia-cap15` (GI 1, CI 0..2). That fixes
//!   the scheme: 15 GPU instances of 1 + 8 minors per GPU, 32 GPUs.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Gpu, ProfileError, err};

/// One MIG device: a compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDevice {
    /// GPU instance id (0..=14, `nvmlDeviceGetGpuInstanceId`).
    pub gpu_instance_id: u32,
    /// Compute instance id inside the GPU instance (0..=7,
    /// `nvmlDeviceGetComputeInstanceId`).
    pub compute_instance_id: u32,
    /// MIG device name without the `MIG ` prefix, e.g. `1g.5gb`, `1c.3g.20gb`.
    pub profile: String,
    /// `nvmlDeviceAttributes_t.gpuInstanceSliceCount`.
    pub gpu_instance_slices: u32,
    /// `nvmlDeviceAttributes_t.computeInstanceSliceCount`.
    pub compute_instance_slices: u32,
    /// Memory of the GPU instance (shared by its compute instances).
    pub memory_mib: u64,
    /// `nvmlDeviceAttributes_t.multiprocessorCount`.
    pub multiprocessors: u32,
    #[serde(default)]
    pub copy_engines: u32,
    #[serde(default)]
    pub decoders: u32,
    #[serde(default)]
    pub encoders: u32,
    #[serde(default)]
    pub jpeg_engines: u32,
    #[serde(default)]
    pub ofa_engines: u32,
    /// `MIG-<uuid>`, what `nvmlDeviceGetUUID` answers for the MIG handle.
    pub uuid: String,
    /// Minor of `gpu<minor>/mig/gi<id>/access`; derived from the documented
    /// mig-minors scheme when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_cap_minor: Option<u32>,
    /// Minor of `gpu<minor>/mig/gi<id>/ci<id>/access`; derived when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_cap_minor: Option<u32>,
}

/// Highest GPU instance id the mig-minors file has a slot for.
pub const MAX_GPU_INSTANCE_ID: u32 = 14;
/// Highest compute instance id the mig-minors file has a slot for.
pub const MAX_COMPUTE_INSTANCE_ID: u32 = 7;
/// Highest GPU minor the mig-minors file covers (`gpu31/...`).
pub const MAX_GPU_MINOR: u32 = 31;
/// `mig/config` and `mig/monitor` take minors 1 and 2.
pub const CONFIG_MINOR: u32 = 1;
pub const MONITOR_MINOR: u32 = 2;

/// First minor of GPU 0's block (`gpu0/gi0/access 3`).
const FIRST_GPU_MINOR: u32 = 3;
/// A GPU instance takes its own access minor plus one per compute instance.
const MINORS_PER_GI: u32 = 1 + MAX_COMPUTE_INSTANCE_ID + 1;
const MINORS_PER_GPU: u32 = (MAX_GPU_INSTANCE_ID + 1) * MINORS_PER_GI;

/// Minor of `gpu<gpu_minor>/mig/gi<gi>/access` in the mig-minors scheme.
pub fn gi_access_minor(gpu_minor: u32, gi: u32) -> u32 {
    FIRST_GPU_MINOR + gpu_minor * MINORS_PER_GPU + gi * MINORS_PER_GI
}

/// Minor of `gpu<gpu_minor>/mig/gi<gi>/ci<ci>/access` in the mig-minors scheme.
pub fn ci_access_minor(gpu_minor: u32, gi: u32, ci: u32) -> u32 {
    gi_access_minor(gpu_minor, gi) + 1 + ci
}

/// Default maximum of MIG devices per GPU: the MIG User Guide's "Supported
/// GPUs" table gives 7 instances for A100, H100, H200, B200 and GB200.
pub const DEFAULT_MAX_MIG_DEVICES: u32 = 7;

impl MigDevice {
    pub fn gi_minor(&self, gpu_minor: u32) -> u32 {
        self.gi_cap_minor
            .unwrap_or_else(|| gi_access_minor(gpu_minor, self.gpu_instance_id))
    }

    pub fn ci_minor(&self, gpu_minor: u32) -> u32 {
        self.ci_cap_minor.unwrap_or_else(|| {
            ci_access_minor(gpu_minor, self.gpu_instance_id, self.compute_instance_id)
        })
    }

    /// Checks the name against the slice counts, as the naming convention
    /// spells them: `[<c>c.]<g>g.<n>gb[+me]`.
    fn check_profile_name(&self) -> Result<(), String> {
        let base = self.profile.strip_suffix("+me").unwrap_or(&self.profile);
        let parts: Vec<&str> = base.split('.').collect();
        let (ci, gi, mem) = match parts.as_slice() {
            [gi, mem] => (None, *gi, *mem),
            [ci, gi, mem] => (Some(*ci), *gi, *mem),
            _ => {
                return Err(format!(
                    "profile {:?} is not [<c>c.]<g>g.<n>gb",
                    self.profile
                ));
            }
        };
        let count = |s: &str, unit: &str| s.strip_suffix(unit).and_then(|n| n.parse::<u32>().ok());
        if count(mem, "gb").is_none() {
            return Err(format!(
                "profile {:?}: memory part must be <n>gb",
                self.profile
            ));
        }
        if count(gi, "g") != Some(self.gpu_instance_slices) {
            return Err(format!(
                "profile {:?} does not match gpu_instance_slices {}",
                self.profile, self.gpu_instance_slices
            ));
        }
        // Without a `<c>c.` part the compute instance takes the whole GPU
        // instance ("MIG Device Names": the CI sizing is implied).
        let want_ci = ci.map_or(Some(self.gpu_instance_slices), |c| count(c, "c"));
        if want_ci != Some(self.compute_instance_slices) {
            return Err(format!(
                "profile {:?} does not match compute_instance_slices {}",
                self.profile, self.compute_instance_slices
            ));
        }
        Ok(())
    }
}

/// Checks one GPU's MIG devices; `uuids` and `minors` collect across GPUs.
pub(super) fn validate_gpu(
    g: &Gpu,
    uuids: &mut BTreeSet<String>,
    minors: &mut BTreeSet<u32>,
) -> Result<(), ProfileError> {
    if g.mig.is_some_and(|m| m.max_devices == Some(0)) {
        return err(format!(
            "GPU {}: mig.max_devices must be at least 1",
            g.bus_id
        ));
    }
    if g.mig_devices.is_empty() {
        return Ok(());
    }
    if !g.mig.is_some_and(|m| m.current) {
        return err(format!(
            "GPU {}: mig_devices need MIG mode enabled (mig.current: true)",
            g.bus_id
        ));
    }
    if g.minor > MAX_GPU_MINOR {
        return err(format!(
            "GPU {}: minor {} has no MIG capability minors (gpu0..gpu{MAX_GPU_MINOR})",
            g.bus_id, g.minor
        ));
    }
    let max = g.max_mig_devices();
    if g.mig_devices.len() > max as usize {
        return err(format!(
            "GPU {}: {} MIG devices exceed the maximum of {max}",
            g.bus_id,
            g.mig_devices.len()
        ));
    }
    let mut pairs = BTreeSet::new();
    for d in &g.mig_devices {
        check_device(d, &mut pairs, uuids).map_err(|msg| {
            ProfileError(format!(
                "GPU {} MIG device gi{}/ci{}: {msg}",
                g.bus_id, d.gpu_instance_id, d.compute_instance_id
            ))
        })?;
    }
    let gis = gpu_instances(g)?;
    check_minors(g, gis.keys().copied(), minors)?;
    check_capacity(g, &gis, max)
}

/// One device on its own: ids, name, sizes, UUID.
fn check_device(
    d: &MigDevice,
    pairs: &mut BTreeSet<(u32, u32)>,
    uuids: &mut BTreeSet<String>,
) -> Result<(), String> {
    if d.gpu_instance_id > MAX_GPU_INSTANCE_ID || d.compute_instance_id > MAX_COMPUTE_INSTANCE_ID {
        return Err(format!(
            "ids must be gi 0..={MAX_GPU_INSTANCE_ID}, ci 0..={MAX_COMPUTE_INSTANCE_ID}"
        ));
    }
    if !pairs.insert((d.gpu_instance_id, d.compute_instance_id)) {
        return Err("duplicate (gpu instance, compute instance)".into());
    }
    d.check_profile_name()?;
    if d.compute_instance_slices == 0 || d.compute_instance_slices > d.gpu_instance_slices {
        return Err("compute_instance_slices must be 1..=gpu_instance_slices".into());
    }
    if d.multiprocessors == 0 || d.memory_mib == 0 {
        return Err("multiprocessors and memory_mib must be positive".into());
    }
    if !d.uuid.starts_with("MIG-") || d.uuid.len() >= 80 {
        return Err(format!("uuid {:?} must look like MIG-xxxxxxxx-…", d.uuid));
    }
    if !uuids.insert(d.uuid.clone()) {
        return Err(format!("duplicate uuid {}", d.uuid));
    }
    Ok(())
}

/// A GPU instance: its slices and memory, and the slices its compute
/// instances use.
#[derive(Debug, Clone, Copy)]
struct GpuInstance {
    slices: u32,
    memory_mib: u64,
    used_slices: u32,
}

/// Groups the devices by GPU instance; the devices of one GPU instance agree
/// on its size and their compute instances fit in it.
fn gpu_instances(g: &Gpu) -> Result<BTreeMap<u32, GpuInstance>, ProfileError> {
    let mut gis: BTreeMap<u32, GpuInstance> = BTreeMap::new();
    for d in &g.mig_devices {
        let gi = gis.entry(d.gpu_instance_id).or_insert(GpuInstance {
            slices: d.gpu_instance_slices,
            memory_mib: d.memory_mib,
            used_slices: 0,
        });
        if (gi.slices, gi.memory_mib) != (d.gpu_instance_slices, d.memory_mib) {
            return err(format!(
                "GPU {}: devices of gi{} disagree on gpu_instance_slices or memory_mib",
                g.bus_id, d.gpu_instance_id
            ));
        }
        gi.used_slices += d.compute_instance_slices;
        if gi.used_slices > gi.slices {
            return err(format!(
                "GPU {}: compute instances of gi{} use more slices than their GPU instance",
                g.bus_id, d.gpu_instance_id
            ));
        }
    }
    Ok(gis)
}

/// The GPU instances fit the GPU: compute slices (as many as its maximum of
/// instances on A100/H100/B200) and memory.
fn check_capacity(g: &Gpu, gis: &BTreeMap<u32, GpuInstance>, max: u32) -> Result<(), ProfileError> {
    let slices: u32 = gis.values().map(|gi| gi.slices).sum();
    if slices > max {
        return err(format!(
            "GPU {}: GPU instances use {slices} compute slices, more than {max}",
            g.bus_id
        ));
    }
    let memory: u64 = gis.values().map(|gi| gi.memory_mib).sum();
    if memory > g.memory_mib {
        return err(format!(
            "GPU {}: GPU instances hold {memory} MiB, more than the GPU's {} MiB",
            g.bus_id, g.memory_mib
        ));
    }
    Ok(())
}

/// Capability minors are unique machine-wide; the devices of one GPU instance
/// share its access minor.
fn check_minors(
    g: &Gpu,
    gis: impl Iterator<Item = u32>,
    minors: &mut BTreeSet<u32>,
) -> Result<(), ProfileError> {
    for gi in gis {
        let of_gi: BTreeSet<u32> = g
            .mig_devices
            .iter()
            .filter(|d| d.gpu_instance_id == gi)
            .map(|d| d.gi_minor(g.minor))
            .collect();
        if of_gi.len() != 1 {
            return err(format!(
                "GPU {}: devices of gi{gi} disagree on gi_cap_minor",
                g.bus_id
            ));
        }
        if !of_gi.iter().all(|m| minors.insert(*m)) {
            return err(format!(
                "GPU {}: gi{gi} access minor is not unique",
                g.bus_id
            ));
        }
    }
    for d in &g.mig_devices {
        if !minors.insert(d.ci_minor(g.minor)) {
            return err(format!(
                "GPU {}: gi{}/ci{} access minor is not unique",
                g.bus_id, d.gpu_instance_id, d.compute_instance_id
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_follow_the_mig_minors_file() {
        // Values printed in the MIG User Guide's mig-minors example.
        assert_eq!(gi_access_minor(0, 0), 3);
        assert_eq!(ci_access_minor(0, 0, 0), 4);
        assert_eq!(ci_access_minor(0, 0, 2), 6);
        assert_eq!(ci_access_minor(31, 14, 6), 4321);
        assert_eq!(ci_access_minor(31, 14, 7), 4322);
        // GPU 0, GI 1, CIs 0..2 -> nvidia-cap12..15 in the guide's example.
        assert_eq!(gi_access_minor(0, 1), 12);
        assert_eq!(ci_access_minor(0, 1, 2), 15);
    }
}
