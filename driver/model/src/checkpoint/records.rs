//! The records of a checkpoint file's `data`, version 1, exactly as they are on
//! disk. Private to the checkpoint: the plugin works with the types of the parent
//! module, and [`super::format`] converts at the one crossing, so a change of those
//! types changes no file. `testdata/v1.json` pins this schema (its test decodes the
//! file and encodes it back byte for byte).
//!
//! No `deny_unknown_fields` anywhere: after a rollback to an older plugin, fields a
//! newer one added must be ignored rather than make the whole file corrupt. Anything
//! that changes the meaning of existing fields (a new state, a renamed field) needs a
//! new format version instead.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Checkpoint, ClaimRecord, ClaimState, MigIntent, PreparedGpu, ShareIntent, ShareMode};

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CheckpointV1 {
    #[serde(default)]
    boot_id: String,
    /// Keyed by claim UID.
    #[serde(default)]
    claims: BTreeMap<String, ClaimV1>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimV1 {
    uid: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    state: StateV1,
    #[serde(default)]
    devices: Vec<DeviceV1>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cdi_spec: Option<String>,
    #[serde(default)]
    updated_at: u64,
}

/// Spelled as the states were named when version 1 was written.
#[derive(Serialize, Deserialize)]
enum StateV1 {
    PrepareStarted,
    PrepareCompleted,
    NeedsReprepare,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceV1 {
    #[serde(default)]
    requests: Vec<String>,
    pool: String,
    device: String,
    #[serde(default)]
    cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    share_id: Option<String>,
    /// Added without a new version: an older plugin ignores it and leaves the
    /// instance in place on unprepare, which holds slices too long but never
    /// takes another's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mig: Option<MigV1>,
    /// Added without a new version: an older plugin ignores it, so its unprepare
    /// of the last share leaves the GPU's interval set (a setting left behind,
    /// never a GPU handed out twice: it knows no shared device to prepare).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sharing: Option<SharingV1>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SharingV1 {
    mode: ShareModeV1,
    gpu_device: String,
    #[serde(rename = "gpuUUID")]
    gpu_uuid: String,
    #[serde(default)]
    timeslice: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compute_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pipe_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prior_compute_mode: Option<u32>,
}

#[derive(Serialize, Deserialize)]
enum ShareModeV1 {
    TimeSlicing,
    #[serde(rename = "MPS")]
    Mps,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MigV1 {
    parent_uuid: String,
    profile_id: u32,
    start: u32,
    size: u32,
}

impl From<&Checkpoint> for CheckpointV1 {
    fn from(c: &Checkpoint) -> Self {
        Self {
            boot_id: c.boot_id.clone(),
            claims: c
                .claims
                .iter()
                .map(|(uid, r)| (uid.clone(), ClaimV1::from(r)))
                .collect(),
        }
    }
}

impl From<CheckpointV1> for Checkpoint {
    fn from(c: CheckpointV1) -> Self {
        Self {
            boot_id: c.boot_id,
            claims: c
                .claims
                .into_iter()
                .map(|(uid, r)| (uid, ClaimRecord::from(r)))
                .collect(),
        }
    }
}

impl From<&ClaimRecord> for ClaimV1 {
    fn from(r: &ClaimRecord) -> Self {
        Self {
            uid: r.uid.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            state: match r.state {
                ClaimState::PrepareStarted => StateV1::PrepareStarted,
                ClaimState::PrepareCompleted => StateV1::PrepareCompleted,
                ClaimState::NeedsReprepare => StateV1::NeedsReprepare,
            },
            devices: r.devices.iter().map(DeviceV1::from).collect(),
            cdi_spec: r.cdi_spec.clone(),
            updated_at: r.updated_at,
        }
    }
}

impl From<ClaimV1> for ClaimRecord {
    fn from(r: ClaimV1) -> Self {
        Self {
            uid: r.uid,
            namespace: r.namespace,
            name: r.name,
            state: match r.state {
                StateV1::PrepareStarted => ClaimState::PrepareStarted,
                StateV1::PrepareCompleted => ClaimState::PrepareCompleted,
                StateV1::NeedsReprepare => ClaimState::NeedsReprepare,
            },
            devices: r.devices.into_iter().map(PreparedGpu::from).collect(),
            cdi_spec: r.cdi_spec,
            updated_at: r.updated_at,
        }
    }
}

impl From<&PreparedGpu> for DeviceV1 {
    fn from(d: &PreparedGpu) -> Self {
        Self {
            requests: d.requests.clone(),
            pool: d.pool.clone(),
            device: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: d.share_id.clone(),
            mig: d.mig.as_ref().map(|m| MigV1 {
                parent_uuid: m.parent_uuid.clone(),
                profile_id: m.profile_id,
                start: m.start,
                size: m.size,
            }),
            sharing: d.sharing.as_ref().map(|s| SharingV1 {
                mode: match s.mode {
                    ShareMode::TimeSlicing => ShareModeV1::TimeSlicing,
                    ShareMode::Mps => ShareModeV1::Mps,
                },
                gpu_device: s.gpu_device.clone(),
                gpu_uuid: s.gpu_uuid.clone(),
                timeslice: s.timeslice,
                memory_bytes: s.memory_bytes,
                compute_percent: s.compute_percent,
                pipe_dir: s.pipe_dir.clone(),
                prior_compute_mode: s.prior_compute_mode,
            }),
        }
    }
}

impl From<DeviceV1> for PreparedGpu {
    fn from(d: DeviceV1) -> Self {
        Self {
            requests: d.requests,
            pool: d.pool,
            device: d.device,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
            mig: d.mig.map(|m| MigIntent {
                parent_uuid: m.parent_uuid,
                profile_id: m.profile_id,
                start: m.start,
                size: m.size,
            }),
            sharing: d.sharing.map(|s| ShareIntent {
                mode: match s.mode {
                    ShareModeV1::TimeSlicing => ShareMode::TimeSlicing,
                    ShareModeV1::Mps => ShareMode::Mps,
                },
                gpu_device: s.gpu_device,
                gpu_uuid: s.gpu_uuid,
                timeslice: s.timeslice,
                memory_bytes: s.memory_bytes,
                compute_percent: s.compute_percent,
                pipe_dir: s.pipe_dir,
                prior_compute_mode: s.prior_compute_mode,
            }),
        }
    }
}
