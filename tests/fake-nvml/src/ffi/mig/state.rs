//! The simulated driver's MIG state: which GPU and compute instances exist on
//! each GPU. Real MIG instances live in the kernel driver, not in the process
//! that made them: they outlive a SIGKILLed client and vanish at reboot. So
//! the state lives in a file, not in the library's memory. The other per-GPU
//! settings that are the driver's rather than a process's live there too: the
//! MIG mode `nvmlDeviceSetMigMode` set and the compute mode
//! `nvmlDeviceSetComputeMode` set ([`GpuState::compute_mode`]).
//!
//!
//! - the file is `TOPODRA_FAKE_NVML_STATE` if set, else `nvml-state.yaml`
//!   next to the loaded library (where the profile sits);
//! - every change is a read-modify-write under an exclusive `flock` on a
//!   sibling `.lock` file, written to a temporary file and renamed over the old
//!   one, so a process killed at any point leaves the old or the new state,
//!   never half of one, and two processes never lose each other's changes;
//! - a GPU the file does not mention has the instances its profile lists
//!   (`mig_devices`): the geometry an operator (or mig-parted at boot) made.
//!   Removing the file is therefore a reboot back to that geometry.
//!
//! The file also carries test controls the library reads on every call, so a
//! test can steer a running plugin from outside: fault injection ([`Faults`])
//! and the capabilities directory the driver's procfs files are mirrored in.
//!
//! GPU instance ids. `/proc/driver/nvidia-caps/mig-minors` has `gi0` to `gi14`
//! per GPU: 15 ids, one per node of the binary tree of aligned power-of-two
//! spans over the 8 memory slices (1 of 8, 2 of 4, 4 of 2, 8 of 1). Public
//! `nvidia-smi mig -lgi` output on an A100 (seansiddens/mps-test README) shows
//! two 3g.20gb instances, GI 1 at placement 4:4 and GI 2 at 0:4: within the
//! level of 4-slice spans the upper half comes first. This library numbers
//! every level that way (`base + (start/size XOR count/2)`, base 0, 1, 3, 7
//! for spans of 8, 4, 2, 1); only the 4-slice level is confirmed by that
//! output, the others extrapolate it. Consumers must read an instance's id and
//! placement from NVML (`nvmlGpuInstanceGetInfo`), never derive one from the
//! other: topodra does.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::profile::{Gpu, MigDevice};

/// Env var naming the state file; wins over the file next to the library.
pub const STATE_ENV: &str = "TOPODRA_FAKE_NVML_STATE";
/// File the library keeps its state in, next to itself, when the env var is unset.
pub const STATE_FILE_NAME: &str = "nvml-state.yaml";

/// Memory slices of every MIG-capable GPU this library models (A100, H100,
/// H200, GB200: the MIG User Guide's placements all lie on 8 slices).
pub const MEMORY_SLICES: u32 = 8;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverState {
    /// Per GPU UUID; absent GPUs have their profile's geometry.
    #[serde(default)]
    pub gpus: BTreeMap<String, GpuState>,
    /// Mirror of `/proc/driver/nvidia/capabilities` the library keeps in step
    /// with the instances (`gpu<minor>/mig/gi<id>/access`, `.../ci<id>/access`),
    /// as the kernel module does; none kept when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities_dir: Option<PathBuf>,
    #[serde(default)]
    pub faults: Faults,
}

impl DriverState {
    /// Every instance the file records, as (GPU UUID, start, size, compute
    /// instances), sorted: what tests check after the fact. A GPU the file does
    /// not mention yet (its profile's instances) is not listed.
    pub fn spans(&self) -> Vec<(String, u32, u32, usize)> {
        let mut out: Vec<_> = self
            .gpus
            .iter()
            .flat_map(|(uuid, g)| {
                g.instances
                    .iter()
                    .map(|gi| (uuid.clone(), gi.start, gi.size, gi.compute.len()))
            })
            .collect();
        out.sort();
        out
    }

    /// The compute mode of GPU `uuid` as `nvmlDeviceGetComputeMode` answers it
    /// (`NVML_COMPUTEMODE_*`): what `nvmlDeviceSetComputeMode` last set, or
    /// `NVML_COMPUTEMODE_DEFAULT` for a GPU the file does not mention.
    pub fn compute_mode(&self, uuid: &str) -> u32 {
        self.gpus
            .get(uuid)
            .and_then(|g| g.compute_mode)
            .unwrap_or(nvml_wrapper_sys::bindings::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT)
    }

    /// [`DriverState::spans`] of one GPU, without its UUID.
    pub fn spans_of(&self, gpu: &str) -> Vec<(u32, u32, usize)> {
        self.spans()
            .into_iter()
            .filter(|s| s.0 == gpu)
            .map(|(_, start, size, compute)| (start, size, compute))
            .collect()
    }
}

/// Faults a test injects; each counter is consumed by the calls it fails.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// The next this many GPU instance creations fail with
    /// `NVML_ERROR_UNKNOWN` and create nothing.
    #[serde(default)]
    pub fail_gpu_instance_creates: u32,
    /// The next this many compute instance creations fail with
    /// `NVML_ERROR_UNKNOWN` and create nothing, leaving their GPU instance in
    /// place: the half-made state a driver must roll back.
    #[serde(default)]
    pub fail_compute_instance_creates: u32,
    /// Every creation takes this long (real creations take from tens of
    /// milliseconds to seconds).
    #[serde(default)]
    pub create_delay_ms: u64,
}

/// One GPU's instances, in creation order (the MIG device index order).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuState {
    /// The MIG mode since `nvmlDeviceSetMigMode`; the profile's until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<ModeState>,
    #[serde(default)]
    pub instances: Vec<GpuInstance>,
    /// Generated MIG UUIDs so far: makes each new one unique.
    #[serde(default)]
    pub uuids_made: u64,
    /// The compute mode since `nvmlDeviceSetComputeMode`, as nvml.h numbers it
    /// (`NVML_COMPUTEMODE_*`: 0 DEFAULT, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS).
    /// Absent means DEFAULT, which is what a GPU has at boot (nvml.h: "Under
    /// Linux it is not persistent across reboots and always resets to
    /// Default"), so removing the file resets it like a reboot, and files
    /// written before the field existed still load. Setting DEFAULT again
    /// removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_mode: Option<u32>,
}

/// MIG mode as `nvmlDeviceGetMigMode` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeState {
    pub current: bool,
    pub pending: bool,
}

/// A GPU instance: a span of memory slices and some compute slices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInstance {
    pub id: u32,
    /// The profile's id (`nvmlGpuInstanceProfileInfo_t.id`); `None` for an
    /// instance from the machine profile whose GPU has no profile table here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<u32>,
    /// Memory slices `start..start + size`.
    pub start: u32,
    pub size: u32,
    /// Compute slices.
    pub slices: u32,
    /// Profile name without `MIG `, e.g. `3g.40gb`.
    pub name: String,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    /// [copy engines, decoders, encoders, JPEG, OFA].
    pub engines: [u32; 5],
    /// Minor of its `access` capability, when the profile fixed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_minor: Option<u32>,
    #[serde(default)]
    pub compute: Vec<ComputeInstance>,
}

/// A compute instance and the MIG device it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeInstance {
    pub id: u32,
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*` (the CI profile id NVML reports).
    pub profile_id: u32,
    /// Compute slices `start..start + slices` of its GPU instance.
    pub start: u32,
    pub device: MigDevice,
}

/// The id of the GPU instance slot `start..start + size` (module docs), or
/// `None` when the span is not an aligned power of two on the 8 slices.
pub fn slot_id(start: u32, size: u32) -> Option<u32> {
    if !size.is_power_of_two() || size > MEMORY_SLICES || !start.is_multiple_of(size) {
        return None;
    }
    if start + size > MEMORY_SLICES {
        return None;
    }
    let count = MEMORY_SLICES / size;
    Some(count - 1 + ((start / size) ^ (count / 2)))
}

/// The span of GPU instance id `id`, the inverse of [`slot_id`].
pub fn slot_of(id: u32) -> Option<(u32, u32)> {
    if id >= 2 * MEMORY_SLICES - 1 {
        return None;
    }
    // The level's span count: the largest power of two not above id + 1.
    let count = 1 << (31 - (id + 1).leading_zeros());
    let index = (id - (count - 1)) ^ (count / 2);
    let size = MEMORY_SLICES / count;
    Some((index * size, size))
}

impl GpuInstance {
    pub fn overlaps(&self, start: u32, size: u32) -> bool {
        start < self.start + self.size && self.start < start + size
    }

    /// Compute slices its compute instances take.
    pub fn used_compute_slices(&self) -> u32 {
        self.compute
            .iter()
            .map(|c| c.device.compute_instance_slices)
            .sum()
    }
}

/// Error of the state file itself: the library answers `NVML_ERROR_UNKNOWN`
/// and prints this once, as for a broken profile.
#[derive(Debug)]
pub struct StateError(pub String);

/// Where this library keeps its state.
pub fn path(own_dir: Option<&Path>) -> Option<PathBuf> {
    match std::env::var_os(STATE_ENV) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => own_dir.map(|d| d.join(STATE_FILE_NAME)),
    }
}

/// The state file, following a symlink so that copies of the library in
/// other directories (a driver root's) share one state.
fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

/// The last file parsed, by its text: NVML's queries read the state on every
/// call, and parsing the YAML each time made a test of thousands of calls slow.
/// Comparing the text (a few kilobytes) keeps a file any process wrote since from
/// ever being mistaken for the one parsed before.
static PARSED: std::sync::Mutex<Option<(PathBuf, String, DriverState)>> =
    std::sync::Mutex::new(None);

/// Reads the state; a missing file is the boot state.
pub fn read(path: &Path) -> Result<DriverState, StateError> {
    let path = resolved(path);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DriverState::default()),
        Err(e) => return Err(StateError(format!("{}: {e}", path.display()))),
    };
    let mut cache = PARSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((p, t, state)) = cache.as_ref()
        && *p == path
        && *t == text
    {
        return Ok(state.clone());
    }
    let state: DriverState = serde_saphyr::from_str(&text)
        .map_err(|e| StateError(format!("{}: {e}", path.display())))?;
    *cache = Some((path, text, state.clone()));
    Ok(state)
}

/// The compute mode of GPU `uuid` in the state file `path` (the node's
/// `nvml_state`, or the file next to an installed library): what a test reads
/// to see what a plugin told NVML, from outside the plugin's process.
/// [`DriverState::compute_mode`] of [`read`]; a missing file is the boot state,
/// `NVML_COMPUTEMODE_DEFAULT` for every GPU.
///
/// # Errors
/// As [`read`]: a file that cannot be read or parsed.
pub fn compute_mode(path: &Path, uuid: &str) -> Result<u32, StateError> {
    Ok(read(path)?.compute_mode(uuid))
}

/// Writes `state` so that a crash leaves the old or the new file.
pub fn write(path: &Path, state: &DriverState) -> Result<(), StateError> {
    let path = resolved(path);
    let err = |e: std::io::Error| StateError(format!("{}: {e}", path.display()));
    let text = serde_saphyr::to_string(state).map_err(|e| StateError(e.to_string()))?;
    let tmp = path.with_extension("yaml.tmp");
    // No fsync: a killed process cannot tear a renamed file, and a power cut is
    // a reboot, which ends every instance anyway (and removes this file).
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(())
}

/// Runs `f` on the state under the file lock and writes back what it leaves,
/// unless it fails. `f`'s error is kept apart from the file's.
pub fn update<T, E>(
    path: &Path,
    f: impl FnOnce(&mut DriverState) -> Result<T, E>,
) -> Result<Result<T, E>, StateError> {
    let target = resolved(path);
    let lock_path = target.with_extension("yaml.lock");
    let err = |e: std::io::Error| StateError(format!("{}: {e}", lock_path.display()));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(err)?;
    // SAFETY: a valid descriptor owned by `lock`, which outlives the lock.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    let mut state = read(&target)?;
    let before = state.clone();
    let out = f(&mut state);
    if out.is_ok() && state != before {
        write(&target, &state)?;
    }
    // Closing `lock` releases the flock.
    Ok(out)
}

/// The instances a GPU has at boot: its profile's MIG devices, grouped into
/// GPU instances by id, each placed on the span its id names.
pub(crate) fn boot_instances(
    g: &Gpu,
    table: Option<&[super::gi_profiles::GiProfile]>,
) -> Vec<GpuInstance> {
    let mut out: Vec<GpuInstance> = Vec::new();
    for d in &g.mig_devices {
        let ci = ComputeInstance {
            id: d.compute_instance_id,
            profile_id: compute_profile_for(d.compute_instance_slices).unwrap_or(0),
            start: 0,
            device: d.clone(),
        };
        if let Some(gi) = out.iter_mut().find(|gi| gi.id == d.gpu_instance_id) {
            let start = gi.used_compute_slices();
            gi.compute.push(ComputeInstance { start, ..ci });
            continue;
        }
        let base = d
            .profile
            .rsplit_once("c.")
            .map_or(d.profile.as_str(), |(_, b)| b);
        let row = table.and_then(|t| t.iter().find(|r| r.name == base));
        let (start, size) = slot_of(d.gpu_instance_id).unwrap_or((0, 0));
        out.push(GpuInstance {
            id: d.gpu_instance_id,
            profile_id: row.map(|r| r.id),
            start,
            size,
            slices: d.gpu_instance_slices,
            name: base.to_owned(),
            memory_mib: d.memory_mib,
            multiprocessors: row.map_or(d.multiprocessors, |r| r.multiprocessors),
            engines: row.map_or(
                [
                    d.copy_engines,
                    d.decoders,
                    d.encoders,
                    d.jpeg_engines,
                    d.ofa_engines,
                ],
                |r| [r.copy_engines, r.decoders, r.encoders, r.jpeg, r.ofa],
            ),
            cap_minor: d.gi_cap_minor,
            compute: vec![ci],
        });
    }
    out
}

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` of a compute instance of `slices`
/// compute slices (nvml.h names them by slice count).
pub fn compute_profile_for(slices: u32) -> Option<u32> {
    use nvml_wrapper_sys::bindings::*;
    Some(match slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// Compute slices of a `NVML_COMPUTE_INSTANCE_PROFILE_*`, the inverse of
/// [`compute_profile_for`]; the `REV1` profile is not modelled.
pub fn compute_slices_of(profile: u32) -> Option<u32> {
    (1..=8).find(|&s| compute_profile_for(s) == Some(profile))
}

/// A fresh MIG UUID: unique per GPU and creation, in NVML's `MIG-` form.
pub fn new_mig_uuid(gpu_uuid: &str, n: u64) -> String {
    // FNV-1a of the parent's UUID: stable per GPU, so the UUIDs of one GPU's
    // instances share a prefix a reader can spot in logs.
    let h = gpu_uuid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!(
        "MIG-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xffff,
        (n >> 48) & 0xffff,
        n & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids_cover_the_fifteen_capability_slots() {
        let mut seen = std::collections::BTreeSet::new();
        for size in [8, 4, 2, 1] {
            for start in (0..MEMORY_SLICES).step_by(size as usize) {
                let id = slot_id(start, size).expect("aligned");
                assert_eq!(slot_of(id), Some((start, size)), "id {id}");
                assert!(seen.insert(id));
            }
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            (0..15).collect::<Vec<_>>()
        );
        assert_eq!(slot_of(15), None);
        assert_eq!(slot_id(2, 4), None);
        assert_eq!(slot_id(0, 3), None);
        assert_eq!(slot_id(8, 1), None);
    }

    /// The public A100 output the numbering follows: two 3g.20gb instances,
    /// GI 1 at 4:4 and GI 2 at 0:4.
    #[test]
    fn four_slice_spans_follow_public_output() {
        assert_eq!(slot_id(4, 4), Some(1));
        assert_eq!(slot_id(0, 4), Some(2));
        assert_eq!(slot_id(0, 8), Some(0));
    }

    #[test]
    fn uuids_are_unique_and_well_formed() {
        let a = new_mig_uuid("GPU-1", 0);
        let b = new_mig_uuid("GPU-1", 1);
        let c = new_mig_uuid("GPU-2", 0);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".len());
    }

    /// A file written before the compute mode was kept still loads, its GPUs
    /// in DEFAULT; DEFAULT is written as no entry.
    #[test]
    fn compute_mode_is_optional_and_defaults() {
        use nvml_wrapper_sys::bindings::{
            nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT as DEFAULT,
            nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS as EXCLUSIVE_PROCESS,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(STATE_FILE_NAME);
        std::fs::write(
            &p,
            "gpus:\n  GPU-1:\n    mig_mode: {current: false, pending: false}\n    \
             instances: []\n    uuids_made: 0\nfaults: {}\n",
        )
        .expect("old file");
        let old = read(&p).expect("an old file loads");
        assert_eq!(old.gpus["GPU-1"].compute_mode, None);
        assert_eq!(old.compute_mode("GPU-1"), DEFAULT);
        assert_eq!(old.compute_mode("GPU-other"), DEFAULT);
        assert_eq!(compute_mode(&p, "GPU-1").expect("read"), DEFAULT);
        assert!(
            !serde_saphyr::to_string(&old)
                .expect("yaml")
                .contains("compute_mode"),
            "absent stays absent"
        );

        update::<(), ()>(&p, |s| {
            s.gpus.get_mut("GPU-1").expect("gpu").compute_mode = Some(EXCLUSIVE_PROCESS);
            Ok(())
        })
        .expect("io")
        .expect("ok");
        assert!(
            std::fs::read_to_string(&p)
                .expect("text")
                .contains("compute_mode: 3")
        );
        assert_eq!(compute_mode(&p, "GPU-1").expect("read"), EXCLUSIVE_PROCESS);
        assert_eq!(
            compute_mode(&dir.path().join("none.yaml"), "GPU-1").expect("no file"),
            DEFAULT,
            "no file is the boot state"
        );
    }

    #[test]
    fn update_writes_only_what_succeeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(STATE_FILE_NAME);
        let r: Result<(), ()> = update(&p, |s| {
            s.faults.create_delay_ms = 5;
            Err(())
        })
        .expect("io");
        assert!(r.is_err());
        assert!(!p.exists(), "a failed update writes nothing");
        update::<(), ()>(&p, |s| {
            s.faults.create_delay_ms = 5;
            Ok(())
        })
        .expect("io")
        .expect("ok");
        assert_eq!(read(&p).expect("read").faults.create_delay_ms, 5);
    }
}
