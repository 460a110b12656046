//! The GPU instance profile tables of the MIG-capable GPUs the profiles carry:
//! what `nvmlDeviceGetGpuInstanceProfileInfo{,V}` and
//! `nvmlDeviceGetGpuInstancePossiblePlacements_v2` answer for them.
//!
//! A profile table is a property of the GPU product, not of a machine, so it is
//! chosen by the GPU's NVML name rather than written into each profile YAML.
//! GPUs whose product has no table here answer NOT_SUPPORTED, as before.
//!
//! Sources, per column:
//! - which profiles exist, instance counts, engines and copy engines: NVIDIA
//!   Multi-Instance GPU User Guide (r580), "Supported MIG Profiles", Table 6 "GPU
//!   Instance Profiles on A100" (A100-SXM4-40GB) and Table 7 "GPU Instance
//!   Profiles on H100" (H100 80GB);
//! - profile ids (the `ID` column nvidia-smi prints, what `nvidia-smi mig -cgi`
//!   and `nvmlDeviceGetGpuInstancePossiblePlacements_v2` take; nvml.h: `id` is
//!   the "Unique profile ID within the device"), SMs and memory: `nvidia-smi mig
//!   -lgip` output. A100-SXM4-40GB: the guide's "Getting Started with MIG" and
//!   public output of newer drivers (1g.5gb 4.75 GiB, 1g.10gb and 2g.10gb 9.62,
//!   3g.20gb and 4g.20gb 19.50, 7g.40gb 39.25), which NVIDIA's go-nvml mock
//!   (`pkg/nvml/mock/gpus/a100.go`) states in MiB as 4864, 9856, 19968 and
//!   40192. H100 80GB HBM3: public output of H100 SXM5 80GB machines (e.g.
//!   stackhpc/ansible-slurm-appliance `docs/mig.md`): 1g.10gb 9.75 GiB, 1g.20gb
//!   and 2g.20gb 19.62, 3g.40gb and 4g.40gb 39.50, 7g.80gb 79.25; the MiB here
//!   are those figures times 1024 (nvidia-smi prints two decimals, so the exact
//!   value may differ by a few MiB);
//! - which `NVML_GPU_INSTANCE_PROFILE_*` index each row answers to: nvml.h's
//!   names (`1_SLICE`, `1_SLICE_REV1` "(rev1)", `1_SLICE_REV2` "(rev2)", ...),
//!   with rev1 the `+me` profile and rev2 the 1-slice profile with twice the
//!   memory, as NVIDIA's go-nvml mock and k8s-test-infra (`docs/mig.md`: "an
//!   A100's `1g.5gb` binds `1_SLICE` and publishes `19`") assign them;
//! - placements, in memory slices (nvml.h: `start` "Index of first occupied
//!   memory slice", `size` "Number of memory slices occupied"): the guide's
//!   `nvidia-smi mig -lgipp` example (`Profile ID 19 Placements:
//!   {0,1,2,3,4,5,6}:1`, `20 {0,...,6}:1`, `15 {0,2,4,6}:2`, `14 {0,2,4}:2`,
//!   `9 {0,4}:4`, `5 {0}:4`, `0 {0}:8`), which public H100 80GB output repeats
//!   id for id;
//! - the profile name the V call returns (`MIG 1g.5gb`): the Name column of
//!   `nvidia-smi mig -lgip`; that nvidia-smi prints this field is this
//!   library's assumption.
//!
//! Neither GPU reports P2P for any profile (`P2P No` in every `-lgip` row).

use nvml_wrapper_sys::bindings::*;

/// One row of `nvidia-smi mig -lgip` and its `-lgipp` placements.
#[derive(Debug)]
pub(crate) struct GiProfile {
    /// `NVML_GPU_INSTANCE_PROFILE_*`: what `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub(crate) profile: u32,
    /// The device's id for it: what the placements call takes.
    pub(crate) id: u32,
    /// Without the `MIG ` nvidia-smi puts in front.
    pub(crate) name: &'static str,
    pub(crate) slices: u32,
    pub(crate) instances: u32,
    pub(crate) multiprocessors: u32,
    pub(crate) copy_engines: u32,
    pub(crate) decoders: u32,
    pub(crate) encoders: u32,
    pub(crate) jpeg: u32,
    pub(crate) ofa: u32,
    pub(crate) memory_mib: u64,
    /// `(start, size)` in memory slices.
    pub(crate) placements: &'static [(u32, u32)],
}

/// Seven 1-slice starts: slot 7 of the eight memory slices takes no 1g instance.
const ONES: &[(u32, u32)] = &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)];
const TWOS_OF_FOUR: &[(u32, u32)] = &[(0, 2), (2, 2), (4, 2), (6, 2)];
const TWOS_OF_THREE: &[(u32, u32)] = &[(0, 2), (2, 2), (4, 2)];
const HALVES: &[(u32, u32)] = &[(0, 4), (4, 4)];
const FIRST_HALF: &[(u32, u32)] = &[(0, 4)];
const WHOLE: &[(u32, u32)] = &[(0, 8)];

#[allow(clippy::too_many_arguments)]
const fn row(
    profile: u32,
    id: u32,
    name: &'static str,
    slices: u32,
    instances: u32,
    multiprocessors: u32,
    engines: [u32; 5],
    memory_mib: u64,
    placements: &'static [(u32, u32)],
) -> GiProfile {
    let [copy_engines, decoders, encoders, jpeg, ofa] = engines;
    GiProfile {
        profile,
        id,
        name,
        slices,
        instances,
        multiprocessors,
        copy_engines,
        decoders,
        encoders,
        jpeg,
        ofa,
        memory_mib,
        placements,
    }
}

// Engines: [copy engines, decoders, encoders, JPEG, OFA].

/// A100-SXM4-40GB (MIG User Guide Table 6; `-lgip` as above).
#[rustfmt::skip]
static A100_SXM4_40GB: &[GiProfile] = &[
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.5gb", 1, 7, 14, [1, 0, 0, 0, 0], 4864, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.10gb", 2, 3, 28, [2, 1, 0, 0, 0], 9856, TWOS_OF_THREE),
    row(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.20gb", 3, 2, 42, [3, 2, 0, 0, 0], 19968, HALVES),
    row(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.20gb", 4, 1, 56, [4, 2, 0, 0, 0], 19968, FIRST_HALF),
    row(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.40gb", 7, 1, 98, [7, 5, 0, 1, 1], 40192, WHOLE),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 14, [1, 1, 0, 1, 1], 4864, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 4, 14, [1, 1, 0, 0, 0], 9856, TWOS_OF_FOUR),
];

/// H100 80GB HBM3, the SXM5 board (MIG User Guide Table 7; `-lgip` as above).
#[rustfmt::skip]
static H100_80GB: &[GiProfile] = &[
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 16, [1, 1, 0, 1, 0], 9984, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 32, [2, 2, 0, 2, 0], 20096, TWOS_OF_THREE),
    row(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 60, [3, 3, 0, 3, 0], 40448, HALVES),
    row(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 64, [4, 4, 0, 4, 0], 40448, FIRST_HALF),
    row(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 132, [8, 7, 0, 7, 1], 81152, WHOLE),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 16, [1, 1, 0, 1, 1], 9984, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 26, [1, 1, 0, 1, 0], 20096, TWOS_OF_FOUR),
];

/// The table of a GPU product by its NVML name, if this library has one.
pub(crate) fn table(gpu_name: &str) -> Option<&'static [GiProfile]> {
    match gpu_name {
        "NVIDIA A100-SXM4-40GB" => Some(A100_SXM4_40GB),
        "NVIDIA H100 80GB HBM3" => Some(H100_80GB),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the guide's tables imply: every placement lies on the eight memory
    /// slices, is aligned to its size, and there are at least as many as the
    /// profile has instances; ids and indices are unique; the name's compute
    /// slices are the row's.
    #[test]
    fn tables_are_consistent() {
        for t in [A100_SXM4_40GB, H100_80GB] {
            for (i, r) in t.iter().enumerate() {
                assert!(r.profile < NVML_GPU_INSTANCE_PROFILE_COUNT, "{}", r.name);
                assert!(
                    t[i + 1..]
                        .iter()
                        .all(|o| o.id != r.id && o.profile != r.profile)
                );
                assert!(r.name.starts_with(&format!("{}g.", r.slices)), "{}", r.name);
                assert!(r.placements.len() >= r.instances as usize, "{}", r.name);
                for &(start, size) in r.placements {
                    assert!(size.is_power_of_two() && start % size == 0, "{}", r.name);
                    assert!(start + size <= 8, "{}", r.name);
                }
            }
        }
    }
}
