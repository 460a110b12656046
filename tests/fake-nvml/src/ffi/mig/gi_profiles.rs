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
//! No GPU here reports P2P for any profile (`P2P No` in every `-lgip` row
//! the sources below show).
//!
//! The three tables added after the first two, per product and column (the
//! index mapping and the profile name are as above throughout):
//!
//! A100-SXM4-80GB (NVML name `NVIDIA A100-SXM4-80GB`, as public `nvidia-smi`
//! output of such boards shows, e.g. NVIDIA/mig-parted#31, and as
//! GoogleCloudPlatform/container-engine-accelerators
//! `partition_gpu/partition_gpu.go` spells it):
//! - profiles, instance counts (7, 1, 4, 3, 2, 1, 1) and engines: the guide's
//!   Table 6, whose note gives the 80GB names (1g.10gb, 1g.10gb+me, 1g.20gb,
//!   2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb) for the same rows;
//! - ids 19, 14, 9, 5, 0: `partition_gpu.go` above (its A100 80GB entries);
//!   20 and 15: the A100 ids of the guide's `-lgipp` example, which public
//!   A100 80GB `-lgip` output repeats (20 for 1g.10gb+me, 15 for 1g.20gb);
//! - SMs (14, 14, 14, 28, 42, 56, 98) and memory in MiB (9856, 9856, 19968,
//!   19968, 40192, 40192, 80384): go-nvml's mock (`pkg/nvml/mock/gpus/a100.go`,
//!   `a100_80gb_GpuInstanceProfiles`). Public A100 80GB `-lgip` output agrees
//!   on every SM count and on 19.50 and 39.25 GiB for the 2- and 4-memory-slice
//!   rows; its 1g and 7g figures vary with the driver (9.50 GiB, and 78.75 to
//!   79.00 GiB, in the outputs found), so those two are go-nvml's 9.62 and
//!   78.50 GiB;
//! - placements: the guide's `-lgipp` example, id for id; no `-lgipp` of an
//!   80GB board was found, and Table 6 gives the 80GB rows the same memory
//!   fractions.
//!
//! H200 141GB SXM (NVML name `NVIDIA H200`, what the real H200 in
//! `real/h200-vm` reports and what `partition_gpu.go` spells):
//! - profiles, instance counts and engines: the guide's Table 8 "GPU Instance
//!   Profiles on H200";
//! - ids, SMs, engines and memory: public `-lgip` output of an H200 machine
//!   (NVIDIA/mig-parted#120): 1g.18gb id 19, 16 SMs, 16.00 GiB; 1g.18gb+me 20,
//!   16, 16.00; 1g.35gb 15, 26, 32.25; 2g.35gb 14, 32, 32.25; 3g.71gb 9, 60,
//!   69.50; 4g.71gb 5, 64, 69.50; 7g.141gb 0, 132, 139.75, with the same
//!   `[CE, DEC, ENC, JPEG, OFA]` as the H100 rows (7g: 8, 7, 0, 7, 1). Another
//!   driver's output prints 32.50 and 140.00 GiB for 2g and 7g; the MiB here
//!   follow mig-parted#120 throughout;
//! - placements: no H200 `-lgipp` was found; Table 8 gives the same memory
//!   fractions as the H100's Table 7, so the H100's placements are assumed.
//!
//! GB200 (NVML name `NVIDIA GB200`, as `partition_gpu.go` spells it; the
//! guide has no GB200 table, only the B200's Table 9):
//! - profiles and instance counts: public `-lgip` output of a production
//!   GB200 NVL board (NVIDIA/mig-parted#227, whose fix, mig-parted#228, names
//!   1g.23gb, 1g.47gb, 2g.47gb, 3g.93gb, 4g.93gb and 7g.186gb in
//!   `deployments/systemd/config-default.yaml`; an earlier board printed
//!   1g.24gb and 3g.95gb, NVIDIA/gpu-operator#1303) and `partition_gpu.go`
//!   (counts 7, 4, 3, 2, 1, 1);
//! - ids: 19, 20, 15, 14 from mig-parted#227; 9, 5, 0 from `partition_gpu.go`;
//! - SMs, engines and memory of the 1g and 2g rows, from mig-parted#227:
//!   1g.23gb and 1g.23gb+me 18 SMs, 22.00 GiB, `[2, 1, 0, 1, 0]` and
//!   `[2, 1, 0, 1, 1]`; 1g.47gb 32 SMs, 45.50 GiB, `[2, 1, 0, 1, 0]`; 2g.47gb
//!   38 SMs, 45.50 GiB, `[4, 2, 0, 2, 0]` (`[CE, DEC, ENC, JPEG, OFA]`);
//! - the 3g, 4g and 7g rows' SMs, engines and memory have no source found
//!   (the rest of mig-parted#227's output could not be read) and are derived here:
//!   SMs at 19 per 1/7 of the GPU (the 2g row's 38 over its 2/7, the guide's
//!   fractions of SMs) give 57, 76 and 133; memory at the 2g row's 45.50 GiB
//!   per two memory slices gives 91.00 GiB for four (3g, 4g) and 182.00 for
//!   eight (7g), short of the real figures by the little the H100 shows
//!   (39.50 against twice 19.62); copy engines 6, 8 and 16 are Table 9's
//!   B200 figures, and two per slice as the 1g and 2g rows show; decoders and
//!   JPEG one per slice as those rows show, OFA only on 7g as Table 9 has it;
//! - placements: no GB200 `-lgipp` was found; assumed the H100's, as Table 9
//!   gives the B200 the same memory fractions.

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

/// A100-SXM4-80GB (MIG User Guide Table 6 with its 80GB names; go-nvml's
/// mock for SMs and memory; see the module doc).
#[rustfmt::skip]
static A100_SXM4_80GB: &[GiProfile] = &[
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 14, [1, 0, 0, 0, 0], 9856, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 28, [2, 1, 0, 0, 0], 19968, TWOS_OF_THREE),
    row(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 42, [3, 2, 0, 0, 0], 40192, HALVES),
    row(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 56, [4, 2, 0, 0, 0], 40192, FIRST_HALF),
    row(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 98, [7, 5, 0, 1, 1], 80384, WHOLE),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 14, [1, 1, 0, 1, 1], 9856, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 14, [1, 1, 0, 0, 0], 19968, TWOS_OF_FOUR),
];

/// H200 141GB SXM (MIG User Guide Table 8; `-lgip` of NVIDIA/mig-parted#120).
#[rustfmt::skip]
static H200: &[GiProfile] = &[
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.18gb", 1, 7, 16, [1, 1, 0, 1, 0], 16384, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.35gb", 2, 3, 32, [2, 2, 0, 2, 0], 33024, TWOS_OF_THREE),
    row(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.71gb", 3, 2, 60, [3, 3, 0, 3, 0], 71168, HALVES),
    row(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.71gb", 4, 1, 64, [4, 4, 0, 4, 0], 71168, FIRST_HALF),
    row(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.141gb", 7, 1, 132, [8, 7, 0, 7, 1], 143104, WHOLE),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.18gb+me", 1, 1, 16, [1, 1, 0, 1, 1], 16384, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.35gb", 1, 4, 26, [1, 1, 0, 1, 0], 33024, TWOS_OF_FOUR),
];

/// GB200 (`-lgip` of NVIDIA/mig-parted#227 for the 1g and 2g rows; the 3g, 4g
/// and 7g rows' SMs, engines and memory are derived, see the module doc).
#[rustfmt::skip]
static GB200: &[GiProfile] = &[
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.23gb", 1, 7, 18, [2, 1, 0, 1, 0], 22528, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.47gb", 2, 3, 38, [4, 2, 0, 2, 0], 46592, TWOS_OF_THREE),
    row(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.93gb", 3, 2, 57, [6, 3, 0, 3, 0], 93184, HALVES),
    row(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.93gb", 4, 1, 76, [8, 4, 0, 4, 0], 93184, FIRST_HALF),
    row(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.186gb", 7, 1, 133, [16, 7, 0, 7, 1], 186368, WHOLE),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.23gb+me", 1, 1, 18, [2, 1, 0, 1, 1], 22528, ONES),
    row(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.47gb", 1, 4, 32, [2, 1, 0, 1, 0], 46592, TWOS_OF_FOUR),
];

/// The table of a GPU product by its NVML name, if this library has one.
pub(crate) fn table(gpu_name: &str) -> Option<&'static [GiProfile]> {
    match gpu_name {
        "NVIDIA A100-SXM4-40GB" => Some(A100_SXM4_40GB),
        "NVIDIA A100-SXM4-80GB" => Some(A100_SXM4_80GB),
        "NVIDIA H100 80GB HBM3" => Some(H100_80GB),
        "NVIDIA H200" => Some(H200),
        "NVIDIA GB200" => Some(GB200),
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
        for t in [A100_SXM4_40GB, A100_SXM4_80GB, H100_80GB, H200, GB200] {
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
