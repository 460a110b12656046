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

use super::super::nvml_record::{PROFILES_PAST_COUNT, possible_placements, profile_info_v};
use super::Answers;
use topodra_model::inventory::{MigDevice, MigPlacement, MigProfile};

/// The GPU instance profiles of a GPU in MIG mode, each with its possible
/// placements: what dynamic MIG publishes.
///
/// Profiles are asked by index until NVML answers INVALID_ARGUMENT past the
/// compiled-in count (nvml.h's forward-compatible enumeration), so a newer
/// driver's profiles are found too. A profile is kept only with its name (the
/// versioned call, answered while MIG mode is on) and at least one placement
/// (nvml.h: the placements call "Requires privileged user"): a partition needs
/// both to be published and created. Everything else NVML declines is a
/// profile this GPU does not have.
pub(super) fn profiles(nvml: &Nvml, gpu: &Device<'_>, a: &mut Answers) -> Vec<MigProfile> {
    let mut out = Vec::new();
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT.saturating_add(PROFILES_PAST_COUNT) {
        let info = match profile_info_v(nvml, gpu, index) {
            Ok(info) => info,
            Err(NvmlError::InvalidArg) if index >= NVML_GPU_INSTANCE_PROFILE_COUNT => break,
            Err(e) => {
                a.ok::<()>(Err(e));
                continue;
            }
        };
        let name = info
            .name
            .as_deref()
            .map(|n| n.strip_prefix("MIG ").unwrap_or(n).trim());
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            continue;
        };
        let placements = match possible_placements(nvml, gpu, info.id) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(profile = info.id, error = %e, "no placements for a MIG profile");
                a.ok::<()>(Err(e));
                continue;
            }
        };
        if placements.is_empty() {
            continue;
        }
        out.push(MigProfile {
            id: info.id,
            name: name.to_owned(),
            slice_count: info.slice_count,
            instance_count: info.instance_count,
            memory_mib: info.memory_size_mb,
            multiprocessors: info.multiprocessor_count,
            copy_engines: info.copy_engine_count,
            decoders: info.decoder_count,
            encoders: info.encoder_count,
            jpeg_engines: info.jpeg_count,
            ofa_engines: info.ofa_count,
            placements: placements
                .iter()
                .map(|p| MigPlacement {
                    start: p.start,
                    size: p.size,
                })
                .collect(),
        });
    }
    out
}

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
        match describe(nvml, gpu, &handle, a) {
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

fn describe(nvml: &Nvml, gpu: &Device<'_>, h: &Device<'_>, a: &mut Answers) -> Option<MigDevice> {
    let uuid = a.ok(h.uuid())?;
    let gpu_instance = a.ok(instance_id(nvml, h, Instance::Gpu))?;
    // Where its GPU instance sits: what dynamic MIG must count as taken. Asking
    // for a GPU instance by id needs MIG mode on, as listing MIG devices does.
    let info = a.ok(gpu_instance_info(nvml, gpu, gpu_instance));
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
        placement: info.map(|i| MigPlacement {
            start: i.placement.start,
            size: i.placement.size,
        }),
        profile_id: info.map(|i| i.profileId),
    })
}

/// `nvmlDeviceGetGpuInstanceById` then `nvmlGpuInstanceGetInfo`.
pub(crate) fn gpu_instance_info(
    nvml: &Nvml,
    gpu: &Device<'_>,
    id: u32,
) -> Result<nvmlGpuInstanceInfo_t, NvmlError> {
    let lib = nvml.lib();
    let by_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())?;
    let mut gi = std::ptr::null_mut();
    // SAFETY: a GPU handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { by_id(gpu.handle(), id, &mut gi) })?;
    // SAFETY: plain integers and pointers; all-zero is a valid value.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a GPU instance handle of this NVML instance and a valid out pointer.
    nvml_try(unsafe { get_info(gi, &mut info) })?;
    Ok(info)
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
