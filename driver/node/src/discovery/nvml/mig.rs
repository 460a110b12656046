//! The existing MIG devices of a GPU in MIG mode.
//!
//! A MIG device is a compute instance inside a GPU instance. NVML hands out a device
//! handle per MIG device (`nvmlDeviceGetMigDeviceHandleByIndex`, indices up to
//! `nvmlDeviceGetMaxMigDeviceCount`, NOT_FOUND for empty slots) that answers UUID,
//! name and memory like a GPU; the instance ids and the profile's slice counts come
//! from calls nvml-wrapper does not wrap.

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::*;

use super::Answers;
use topodra_model::inventory::MigDevice;

pub(super) fn devices(nvml: &Nvml, gpu: &Device<'_>, a: &mut Answers) -> Vec<MigDevice> {
    let max = a.ok(gpu.mig_device_count()).unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..max {
        let handle = match gpu.mig_device_by_index(i) {
            Ok(h) => h,
            Err(NvmlError::NotFound) => continue,
            Err(NvmlError::GpuLost) => {
                a.lost = true;
                continue;
            }
            Err(e) => {
                tracing::debug!(index = i, error = %e, "MIG device slot unreadable");
                continue;
            }
        };
        match describe(nvml, &handle, a) {
            Some(m) => out.push(m),
            None => tracing::warn!(
                index = i,
                "a MIG device answers no UUID or instance ids; not published"
            ),
        }
    }
    out.sort_by_key(|m| (m.gpu_instance, m.compute_instance));
    out
}

fn describe(nvml: &Nvml, h: &Device<'_>, a: &mut Answers) -> Option<MigDevice> {
    let uuid = a.ok(h.uuid())?;
    let gpu_instance = a.ok(instance_id(nvml, h, Instance::Gpu))?;
    let compute_instance = a.ok(instance_id(nvml, h, Instance::Compute))?;
    let attrs = a.ok(attributes(nvml, h));
    let memory_bytes = a
        .ok(h.memory_info())
        .map(|m| m.total)
        .or_else(|| attrs.map(|x| x.memorySizeMB << 20));
    let profile = a
        .ok(h.name())
        .and_then(|n| profile_from_name(&n))
        .or_else(|| attrs.and_then(|x| profile_from_attributes(&x)));
    Some(MigDevice {
        uuid,
        gpu_instance,
        compute_instance,
        profile,
        memory_bytes,
        multiprocessors: attrs.map(|x| x.multiprocessorCount),
    })
}

enum Instance {
    Gpu,
    Compute,
}

fn instance_id(nvml: &Nvml, h: &Device<'_>, which: Instance) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let f = match which {
        Instance::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        Instance::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut id = 0;
    // SAFETY: a MIG handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { f(h.handle(), &mut id) })?;
    Ok(id)
}

fn attributes(nvml: &Nvml, h: &Device<'_>) -> Result<nvmlDeviceAttributes_t, NvmlError> {
    let lib = nvml.lib();
    let f = nvml_sym(lib.nvmlDeviceGetAttributes_v2.as_ref())?;
    // SAFETY: plain integers; all-zero is a valid value.
    let mut attrs: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
    // SAFETY: a MIG handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { f(h.handle(), &mut attrs) })?;
    Ok(attrs)
}

/// NVML names a MIG device `<GPU name> MIG <profile>` (`NVIDIA A100-SXM4-40GB MIG
/// 1g.5gb`), the profile as `nvidia-smi mig -lgip` lists it.
fn profile_from_name(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    let valid = !profile.is_empty()
        && profile
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'+');
    valid.then(|| profile.to_owned())
}

/// The profile name from slice counts and memory when NVML's name carries none:
/// `<g>g.<mem>gb`, with `<c>c.` in front when the compute instance takes only part
/// of its GPU instance. Memory is rounded up to whole GB, which matches NVIDIA's
/// names for the common profiles but not for every one, hence only a fallback.
fn profile_from_attributes(x: &nvmlDeviceAttributes_t) -> Option<String> {
    if x.gpuInstanceSliceCount == 0 || x.memorySizeMB == 0 {
        return None;
    }
    let gb = x.memorySizeMB.div_ceil(1024);
    let gi = format!("{}g.{gb}gb", x.gpuInstanceSliceCount);
    Some(
        if x.computeInstanceSliceCount == 0
            || x.computeInstanceSliceCount == x.gpuInstanceSliceCount
        {
            gi
        } else {
            format!("{}c.{gi}", x.computeInstanceSliceCount)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_comes_from_the_name() {
        assert_eq!(
            profile_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb").as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            profile_from_name("NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb").as_deref(),
            Some("1c.2g.20gb")
        );
        assert_eq!(profile_from_name("NVIDIA H100 80GB HBM3"), None);
        assert_eq!(profile_from_name("X MIG bad profile"), None);
    }

    #[test]
    fn profile_falls_back_to_slices_and_memory() {
        // SAFETY: plain integers.
        let mut x: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
        x.gpuInstanceSliceCount = 3;
        x.computeInstanceSliceCount = 3;
        x.memorySizeMB = 19968;
        assert_eq!(profile_from_attributes(&x).as_deref(), Some("3g.20gb"));
        x.computeInstanceSliceCount = 1;
        assert_eq!(profile_from_attributes(&x).as_deref(), Some("1c.3g.20gb"));
        x.memorySizeMB = 0;
        assert_eq!(profile_from_attributes(&x), None);
    }
}
