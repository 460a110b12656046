//! The prepare checkpoint: what the kubelet plugin has prepared, kept on disk.
//!
//! The kubelet may ask us to unprepare a claim after the plugin restarted and after the
//! claim object is gone, so everything unprepare needs (devices, CDI spec path) is
//! recorded here. Prepare is two-phase: a record is written in
//! [`ClaimState::PrepareStarted`] *before* any side effect (CDI spec, sharing setup),
//! and turned into [`ClaimState::PrepareCompleted`] after them. The completion is only
//! made in memory and reaches disk with the next save of any kind: the spec itself,
//! which appears by an atomic rename after the started record is on disk, is the
//! durable mark that the prepare finished (see `prepare::recovery`). A crash therefore
//! leaves a started record, which `rollback_candidates` hands back at startup to be
//! rolled forward (its spec is there) or back (it is not).
//!
//! # Reboots
//!
//! CDI specs live under `/var/run`, which a reboot empties, and the kubelet calls
//! prepare again for every claim of its pods (it does not trust its own "prepared"
//! state across restarts). A completed record whose spec vanished must therefore not
//! answer prepare from the record alone. `after_reboot` keeps every record, so the
//! devices stay reserved and unprepare still finds what to clean up, but turns
//! completed *and started* records into [`ClaimState::NeedsReprepare`]: the next
//! prepare redoes the work, and the startup rollback leaves them alone (their pods may
//! still be bound here and about to be restarted). A started record may be a prepare
//! the kubelet was told had succeeded, since the completion is not saved before the
//! answer; across a power loss the spec is no evidence either way, so the record keeps
//! its devices until the claim is prepared again or the stale-claim check finds it
//! gone. Holding a GPU too long is the safe direction; handing it out twice is not.
//!
//! # Layout
//!
//! - `format`: the pure on-disk encoding ([`encode`], [`parse`]); see there for the
//!   file format. The file itself (atomic saves, quarantine) is the node crate's
//!   `checkpoint` module.

#[cfg(any(test, feature = "test-fixtures"))]
#[allow(clippy::arithmetic_side_effects)] // fixtures compute on their own values
pub mod fixtures;
mod format;
mod records;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;

pub use format::{CorruptReason, MAX_CHECKPOINT_BYTES, encode, parse};

// These are the plugin's own view; the file holds the records of `records`, which
// `format` converts at the one crossing, so a change here changes no file.

/// Every claim this node has prepared or is preparing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The kernel boot id at the time of the last save; see `after_reboot`.
    pub boot_id: String,
    /// Keyed by claim UID.
    pub claims: BTreeMap<String, ClaimRecord>,
}

/// What was prepared for one ResourceClaim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub state: ClaimState,
    pub devices: Vec<PreparedGpu>,
    /// Path of the CDI spec file written for this claim. Recorded when prepare starts,
    /// before the file is written, so a rollback knows what may need deleting.
    pub cdi_spec: Option<String>,
    /// Unix seconds of the last state change.
    pub updated_at: u64,
}

/// Where a claim stands in the two-phase prepare.
///
/// Every state holds the claim's devices: a record releases them only by being
/// removed (unprepare or rollback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimState {
    /// Prepare began and may have left partial side effects; or it finished, was
    /// answered, and the completion is not saved yet (the spec on disk says which).
    PrepareStarted,
    /// Prepare finished; the recorded CDI ids are valid.
    PrepareCompleted,
    /// Prepare finished (or started) in an earlier boot; its side effects may be gone,
    /// so the next prepare must redo them.
    NeedsReprepare,
}

impl fmt::Display for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PrepareStarted => "PrepareStarted",
            Self::PrepareCompleted => "PrepareCompleted",
            Self::NeedsReprepare => "NeedsReprepare",
        })
    }
}

/// One allocated device as prepared for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedGpu {
    /// Request names (base names, without a subrequest suffix) this device serves.
    pub requests: Vec<String>,
    pub pool: String,
    /// Device name in the pool, e.g. `gpu-3`.
    pub device: String,
    /// Fully qualified CDI device ids returned to the kubelet.
    pub cdi_device_ids: Vec<String>,
    /// Set when the device is shared (time slicing, MPS) under this id.
    pub share_id: Option<String>,
    /// The MIG instance prepare makes for this device (dynamic MIG); `None` for a
    /// device that exists without us (a whole GPU, a MIG device an operator made).
    pub mig: Option<MigIntent>,
    /// For a share of a shared device: what it shares and what prepare set up for
    /// it, so that the last share's unprepare can undo it from the record alone.
    pub sharing: Option<ShareIntent>,
}

/// One claim's share of a GPU, recorded before prepare changes the GPU's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareIntent {
    pub mode: ShareMode,
    /// The exclusive device of the GPU this share is part of (`gpu-<minor>`): no
    /// claim may hold it while a share of it is held, nor the reverse.
    pub gpu_device: String,
    /// The GPU's UUID, as the driver's tools take it.
    pub gpu_uuid: String,
    /// The time-slice setting (`nvidia-smi compute-policy --set-timeslice`, 0 to
    /// 3) this share runs at; 0 is the driver's default, which nothing sets.
    pub timeslice: u8,
    /// The memory the claim's allocation consumed, in bytes.
    pub memory_bytes: Option<u64>,
    /// MPS: the percentage of the GPU's SMs the allocation consumed.
    pub compute_percent: Option<u32>,
    /// MPS: the control daemon's pipe directory, where unprepare tells it to quit.
    pub pipe_dir: Option<String>,
    /// MPS: the GPU's compute mode before its first share set EXCLUSIVE_PROCESS
    /// (nvml.h's numbering), which its last share's unprepare puts back. Every
    /// share of the GPU carries it, so any of them can be the last.
    pub prior_compute_mode: Option<u32>,
}

/// How a GPU is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShareMode {
    TimeSlicing,
    Mps,
}

impl PreparedGpu {
    /// Whether `self`, held by one claim, keeps another claim from holding `other`:
    /// the same device unless both are distinct shares of it, a GPU and a share of
    /// it, or two shares of one GPU in different modes.
    pub fn excludes(&self, other: &PreparedGpu) -> bool {
        if self.pool != other.pool {
            return false;
        }
        if self.device == other.device {
            return match (&self.share_id, &other.share_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
        }
        match (&self.sharing, &other.sharing) {
            (Some(s), None) => s.gpu_device == other.device,
            (None, Some(o)) => o.gpu_device == self.device,
            (Some(s), Some(o)) => s.gpu_device == o.gpu_device && s.mode != o.mode,
            (None, None) => false,
        }
    }
}

/// A MIG instance the plugin makes at prepare: a GPU instance of `profile_id` at
/// memory slices `start..start + size` of the GPU `parent_uuid`, with one compute
/// instance spanning it. Recorded with the claim before the first NVML call, so
/// a restart after a crash finds a half-made instance by its placement and
/// removes it, and unprepare removes the instance from the record alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigIntent {
    pub parent_uuid: String,
    /// NVML's GPU instance profile id (`nvmlGpuInstanceProfileInfo_t.id`).
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

impl MigIntent {
    /// Whether the two instances would share a memory slice of one GPU: NVML
    /// refuses the second, and the checkpoint refuses to record it.
    pub fn overlaps(&self, other: &Self) -> bool {
        self.parent_uuid == other.parent_uuid
            && self.start < other.start.saturating_add(other.size)
            && other.start < self.start.saturating_add(self.size)
    }
}

/// Identity of the claim being prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIdentity {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// A device that another claim's record holds. The one place the plugin checks
/// exclusivity: `begin_prepare`, under the lock of the checkpoint in memory that
/// holds every pending change (`prepare::commit`), so two prepares racing for a GPU
/// cannot both pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "device {device} is already prepared for claim {}/{} ({}): delete the pod using that claim first; \
     if it is gone, its unprepare failed (see the plugin's logs)",
    holder.namespace, holder.name, holder.uid
)]
pub struct DeviceInUse {
    pub pool: String,
    pub device: String,
    pub holder: ClaimIdentity,
}

impl DeviceInUse {
    fn into_transition(self) -> TransitionError {
        TransitionError::DeviceInUse(Box::new(self))
    }
}

/// A two-phase transition that the checkpoint refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// Boxed: the other variants are the rare ones, and this keeps the type small.
    #[error(transparent)]
    DeviceInUse(Box<DeviceInUse>),
    /// A caller bug: completing a claim that was never started.
    #[error("claim {0} is not in the checkpoint")]
    UnknownClaim(String),
    /// A caller bug: completing a claim that was not (re)started in this boot.
    #[error("claim {uid} cannot complete prepare from state {state}")]
    NotStarted { uid: String, state: ClaimState },
}

impl Checkpoint {
    /// An empty checkpoint for the given boot.
    pub fn new(boot_id: impl Into<String>) -> Self {
        Self {
            boot_id: boot_id.into(),
            claims: BTreeMap::new(),
        }
    }

    pub fn get(&self, uid: &str) -> Option<&ClaimRecord> {
        self.claims.get(uid)
    }

    /// The claim, if any, whose record holds `pool/device` (one of them, for a
    /// shared device).
    pub fn holder_of(&self, pool: &str, device: &str) -> Option<&ClaimRecord> {
        self.claims.values().find(|r| r.holds(pool, device))
    }

    /// The claim and device, if any, whose hold keeps a claim other than
    /// `claim_uid` from holding `want` ([`PreparedGpu::excludes`]).
    pub fn excluding(
        &self,
        want: &PreparedGpu,
        claim_uid: &str,
    ) -> Option<(&ClaimRecord, &PreparedGpu)> {
        self.claims
            .values()
            .filter(|r| r.uid != claim_uid)
            .find_map(|r| r.devices.iter().find(|d| d.excludes(want)).map(|d| (r, d)))
    }

    /// The time-sliced shares of GPU `gpu_uuid` that other claims than
    /// `claim_uid` hold in this boot (started or completed): while there is one,
    /// the GPU's interval is set and must stay.
    pub fn live_time_slices(&self, gpu_uuid: &str, claim_uid: &str) -> usize {
        self.claims
            .values()
            .filter(|r| r.uid != claim_uid && r.state != ClaimState::NeedsReprepare)
            .flat_map(|r| r.devices.iter())
            .filter_map(|d| d.sharing.as_ref())
            .filter(|s| {
                s.mode == ShareMode::TimeSlicing && s.gpu_uuid == gpu_uuid && s.timeslice != 0
            })
            .count()
    }

    /// An MPS share of `gpu_device` (a GPU, or a MIG partition) that a claim other
    /// than `claim_uid` holds in this boot (started or completed), if any: while
    /// there is one, its MPS daemon runs (and a GPU's compute mode stays
    /// EXCLUSIVE_PROCESS).
    pub fn live_mps_share(&self, gpu_device: &str, claim_uid: &str) -> Option<&ShareIntent> {
        self.claims
            .values()
            .filter(|r| r.uid != claim_uid && r.state != ClaimState::NeedsReprepare)
            .flat_map(|r| r.devices.iter())
            .filter_map(|d| d.sharing.as_ref())
            .find(|s| s.mode == ShareMode::Mps && s.gpu_device == gpu_device)
    }

    /// Whether a claim other than `claim_uid` holds the MIG instance `intent` (its
    /// shares of one partition do): it stays while one does.
    pub fn mig_held_by_others(&self, intent: &MigIntent, claim_uid: &str) -> bool {
        self.claims
            .values()
            .filter(|r| r.uid != claim_uid)
            .flat_map(|r| r.devices.iter())
            .any(|d| d.mig.as_ref() == Some(intent))
    }

    /// The claim and device, if any, whose MIG instance would overlap `intent`.
    pub fn mig_overlap(&self, intent: &MigIntent) -> Option<(&ClaimRecord, &PreparedGpu)> {
        self.claims.values().find_map(|r| {
            r.devices
                .iter()
                .find(|d| d.mig.as_ref().is_some_and(|m| m.overlaps(intent)))
                .map(|d| (r, d))
        })
    }

    /// Inserts or replaces the record under its own UID; returns the previous one.
    pub fn insert(&mut self, record: ClaimRecord) -> Option<ClaimRecord> {
        self.claims.insert(record.uid.clone(), record)
    }

    pub fn remove(&mut self, uid: &str) -> Option<ClaimRecord> {
        self.claims.remove(uid)
    }
}

impl ClaimRecord {
    pub fn holds(&self, pool: &str, device: &str) -> bool {
        self.devices
            .iter()
            .any(|d| d.pool == pool && d.device == device)
    }
}

/// Records that prepare of `claim` is starting, with everything needed to undo it.
///
/// Refuses when one of `devices` is held by another claim (but for distinct
/// shares of one shared device, see [`PreparedGpu::excludes`]), or would make a MIG
/// instance overlapping one another claim's record holds (the scheduler's counters
/// keep that from happening; this keeps a stale slice from making it happen). A
/// record already there for
/// the same UID is replaced: the caller calls this only after deciding the prepare must
/// be (re)done, e.g. for a retry or a [`ClaimState::NeedsReprepare`] record.
pub fn begin_prepare(
    checkpoint: &mut Checkpoint,
    claim: ClaimIdentity,
    devices: Vec<PreparedGpu>,
    cdi_spec: Option<String>,
    now: u64,
) -> Result<&ClaimRecord, TransitionError> {
    for d in &devices {
        if let Some((holder, held)) = checkpoint.excluding(d, &claim.uid) {
            return Err(DeviceInUse {
                pool: held.pool.clone(),
                device: held.device.clone(),
                holder: ClaimIdentity {
                    uid: holder.uid.clone(),
                    namespace: holder.namespace.clone(),
                    name: holder.name.clone(),
                },
            }
            .into_transition());
        }
        // Shares of one partition hold its one instance together.
        if let Some((holder, held)) = d.mig.as_ref().and_then(|m| checkpoint.mig_overlap(m))
            && holder.uid != claim.uid
            && (held.device != d.device || held.excludes(d))
        {
            return Err(DeviceInUse {
                pool: held.pool.clone(),
                device: held.device.clone(),
                holder: ClaimIdentity {
                    uid: holder.uid.clone(),
                    namespace: holder.namespace.clone(),
                    name: holder.name.clone(),
                },
            }
            .into_transition());
        }
    }
    let record = ClaimRecord {
        uid: claim.uid.clone(),
        namespace: claim.namespace,
        name: claim.name,
        state: ClaimState::PrepareStarted,
        devices,
        cdi_spec,
        updated_at: now,
    };
    Ok(match checkpoint.claims.entry(claim.uid) {
        Entry::Occupied(mut slot) => {
            slot.insert(record);
            slot.into_mut()
        }
        Entry::Vacant(slot) => slot.insert(record),
    })
}

/// Marks a started prepare as done. Completing an already completed claim is a no-op,
/// so a retried call is harmless; completing a claim that was never (re)started is a
/// caller bug and refused.
pub fn complete_prepare<'a>(
    checkpoint: &'a mut Checkpoint,
    uid: &str,
    now: u64,
) -> Result<&'a ClaimRecord, TransitionError> {
    let record = checkpoint
        .claims
        .get_mut(uid)
        .ok_or_else(|| TransitionError::UnknownClaim(uid.to_owned()))?;
    match record.state {
        ClaimState::PrepareCompleted => {}
        ClaimState::PrepareStarted => {
            record.state = ClaimState::PrepareCompleted;
            record.updated_at = now;
        }
        ClaimState::NeedsReprepare => {
            return Err(TransitionError::NotStarted {
                uid: uid.to_owned(),
                state: record.state,
            });
        }
    }
    Ok(record)
}

/// Claims a crash left in the middle of a prepare, or after its answer but before the
/// completion was saved: each is rolled forward or back before new prepares are served.
pub fn rollback_candidates(checkpoint: &Checkpoint) -> Vec<ClaimRecord> {
    checkpoint
        .claims
        .values()
        .filter(|r| r.state == ClaimState::PrepareStarted)
        .cloned()
        .collect()
}

/// Applies the reboot rule (see the module docs) when `current_boot_id` differs from
/// the recorded one, and records the new boot id. Returns the UIDs turned into
/// [`ClaimState::NeedsReprepare`]; calling it again in the same boot changes nothing.
pub fn after_reboot(checkpoint: &mut Checkpoint, current_boot_id: &str) -> Vec<String> {
    if checkpoint.boot_id == current_boot_id {
        return Vec::new();
    }
    checkpoint.boot_id = current_boot_id.to_owned();
    let mut marked = Vec::new();
    for record in checkpoint.claims.values_mut() {
        if record.state != ClaimState::NeedsReprepare {
            record.state = ClaimState::NeedsReprepare;
            marked.push(record.uid.clone());
        }
    }
    marked
}

#[cfg(test)]
mod tests;
