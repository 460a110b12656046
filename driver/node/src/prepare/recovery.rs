//! What a start does before serving: load the checkpoint, and make it and the CDI
//! spec directory agree again after a crash, a reboot or a corrupt file.

use crate::cdi::{self, Spec, SpecWriter};
use crate::checkpoint::{CheckpointStore, Quarantined, unix_now};
use crate::dynamic_mig::Carver;
use crate::sharing::{MpsControl, TimeSlicer};
use topodra_model::checkpoint::{
    self, Checkpoint, ClaimRecord, ClaimState, MigIntent, PreparedGpu,
};

use super::RecoveryError;

/// What recovery did, for logs, metrics and Events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartupReport {
    /// The checkpoint was corrupt and moved aside; it was rebuilt from CDI specs.
    pub quarantined: Option<Quarantined>,
    /// Claims rebuilt from CDI spec files after a quarantine.
    pub rebuilt: Vec<String>,
    /// The node rebooted since the checkpoint was written.
    pub rebooted: bool,
    /// Claims whose prepare had started but not written its spec: spec removed,
    /// the MIG instances it may have made removed, record dropped.
    pub rolled_back: Vec<String>,
    /// Claims to roll back whose MIG instance could not be removed (or no NVML
    /// was there to remove it): the record stays, holding the instance's slices,
    /// as one to prepare again, for an unprepare or a retried prepare. With why.
    pub rollback_pending: Vec<String>,
    /// The MIG instances of the claims rolled back, removed now: discovery, which
    /// ran before, may have found them, and must not take them for someone else's.
    pub rolled_back_instances: Vec<MigIntent>,
    /// Claims recorded as started whose spec was written, so the prepare finished
    /// (and was likely answered) before the completion was saved: completed.
    pub rolled_forward: Vec<String>,
    /// After a reboot: specs of ours removed, since every claim is prepared again.
    pub stale_specs_removed: Vec<String>,
    /// CDI specs of ours that no claim owned: removed.
    pub orphan_specs_removed: Vec<String>,
    /// Records the checkpoint's checksum vouched for that cannot be acted on (a claim
    /// UID no spec file could carry): dropped, with why.
    pub bad_records: Vec<String>,
    /// Recovery changed the checkpoint but could not save it (a full disk, say): the
    /// plugin serves from memory and the next start redoes the same recovery.
    pub save_failed: Option<String>,
}

pub(super) fn recover(
    store: &CheckpointStore,
    writer: &SpecWriter,
    boot_id: &str,
    pool: &str,
    carver: Option<&Carver>,
    time_slicer: Option<&TimeSlicer>,
    mps: Option<&MpsControl>,
) -> Result<(Checkpoint, StartupReport), RecoveryError> {
    let loaded = store.load(boot_id)?;
    let mut checkpoint = loaded.checkpoint;
    let unchanged = checkpoint.clone();
    let mut report = StartupReport {
        rebooted: loaded.rebooted,
        ..Default::default()
    };

    // A record whose UID could never name a spec file blocks its devices and can be
    // neither rolled back nor unprepared: drop it rather than fail every start.
    let bad: Vec<String> = checkpoint
        .claims
        .keys()
        .filter(|uid| cdi::check_claim_uid(uid).is_err())
        .cloned()
        .collect();
    for uid in bad {
        if let Some(record) = checkpoint.remove(&uid) {
            let devices: Vec<&str> = record.devices.iter().map(|d| d.device.as_str()).collect();
            tracing::warn!(claim = ?uid, ?devices, "checkpoint record with an invalid claim UID dropped");
            report.bad_records.push(format!(
                "claim UID {uid:?} ({}/{}, devices {}) is not a valid UID; record dropped",
                record.namespace,
                record.name,
                devices.join(",")
            ));
        }
    }

    if let Some(q) = loaded.quarantined {
        tracing::warn!(path = %q.path.display(), reason = %q.reason, "checkpoint was corrupt; rebuilding from CDI specs");
        for uid in writer.list_owned()? {
            if let Some(record) = record_from_spec(writer, &uid, pool) {
                report.rebuilt.push(uid);
                checkpoint.insert(record);
            }
        }
        report.quarantined = Some(q);
    }

    if loaded.rebooted {
        let reprepare = checkpoint::after_reboot(&mut checkpoint, boot_id);
        tracing::info!(
            claims = reprepare.len(),
            "node rebooted; prepared claims will be prepared again"
        );
        // A spec that outlived the reboot (a CDI directory that is not a tmpfs) is
        // not synced and may be torn; the next prepare of its claim writes it anew.
        for uid in writer.list_owned()? {
            writer.remove(&uid)?;
            report.stale_specs_removed.push(uid);
        }
    }

    report.rolled_forward = roll_forward(&mut checkpoint, writer, pool);
    for record in checkpoint::rollback_candidates(&checkpoint) {
        writer.remove(&record.uid)?;
        // A MIG instance is found by the placement its record names: whatever
        // steps the crashed prepare got through, nothing else of it is left.
        let undone = reset_time_slices(&checkpoint, &record, time_slicer)
            .and_then(|()| stop_mps(&checkpoint, &record, mps))
            .and_then(|()| remove_instances(&checkpoint, &record, carver));
        if let Err(why) = undone {
            // The record keeps the instance's slices, but leaves the started state:
            // no start keeps a prepare half-way. As one to prepare again, an
            // unprepare (the kubelet's, or the stale-claim check's) removes the
            // instance, and a retried prepare uses it, as its record made it.
            tracing::error!(claim = %record.uid, error = %why, "rolling back a prepare: its MIG instance or time slice stays, and its record with it, to be prepared again or unprepared");
            if let Some(kept) = checkpoint.claims.get_mut(&record.uid) {
                kept.state = ClaimState::NeedsReprepare;
            }
            report
                .rollback_pending
                .push(format!("{}: {why}", record.uid));
            continue;
        }
        report
            .rolled_back_instances
            .extend(record.devices.iter().filter_map(|d| d.mig.clone()));
        checkpoint.remove(&record.uid);
        report.rolled_back.push(record.uid);
    }

    for uid in writer.list_owned()? {
        if checkpoint.get(&uid).is_none() {
            writer.remove(&uid)?;
            report.orphan_specs_removed.push(uid);
        }
    }
    writer.remove_stale_temp_files()?;
    // Saving only a changed checkpoint keeps a start on a full (or read-only) disk
    // from failing when there is nothing to write.
    let changed = checkpoint != unchanged || report.quarantined.is_some();
    if changed && let Err(e) = store.save(&checkpoint) {
        tracing::error!(error = %e, "recovered checkpoint not saved; serving from memory");
        report.save_failed = Some(e.to_string());
    }
    Ok((checkpoint, report))
}

/// Sets the GPUs of a record's time-sliced shares back to the driver's default,
/// where no other claim's share holds them in this boot.
fn reset_time_slices(
    checkpoint: &Checkpoint,
    record: &ClaimRecord,
    time_slicer: Option<&TimeSlicer>,
) -> Result<(), String> {
    for (d, share) in super::claim::time_slices(&record.devices) {
        if checkpoint.live_time_slices(&share.gpu_uuid, &record.uid) > 0 {
            continue;
        }
        time_slicer
            .ok_or("no nvidia-smi to reset the time slice of a shared GPU")?
            .set(&share.gpu_uuid, 0)
            .map_err(|e| format!("{}: {e}", d.device))?;
    }
    Ok(())
}

/// Stops the MPS daemons of a record's MPS shares and puts their GPUs' compute
/// mode back, where no other claim's MPS share holds them in this boot.
fn stop_mps(
    checkpoint: &Checkpoint,
    record: &ClaimRecord,
    mps: Option<&MpsControl>,
) -> Result<(), String> {
    for (d, share) in super::claim::mps_shares(&record.devices) {
        if checkpoint
            .live_mps_share(&share.gpu_device, &record.uid)
            .is_some()
        {
            continue;
        }
        mps.ok_or("no MPS control to stop the daemon of a shared GPU")?
            .undo(share)
            .map_err(|e| format!("{}: {e}", d.device))?;
    }
    Ok(())
}

/// Removes the MIG instances a record names that no other record holds (shares
/// of one partition hold its instance together).
fn remove_instances(
    checkpoint: &Checkpoint,
    record: &ClaimRecord,
    carver: Option<&Carver>,
) -> Result<(), String> {
    for d in &record.devices {
        let Some(intent) = &d.mig else { continue };
        if checkpoint.mig_held_by_others(intent, &record.uid) {
            continue;
        }
        let carver = carver.ok_or("no NVML to remove the instance of dynamic MIG device")?;
        carver
            .destroy(intent)
            .map_err(|e| format!("{}: {e}", d.device))?;
    }
    Ok(())
}

/// Completes the started records whose spec is in place, and returns their UIDs. The
/// spec is only renamed into place after the started record is durable, and a
/// prepare that finds one already there removes it first, so it is the spec this
/// prepare wrote, whole: the prepare finished, and the kubelet may have been answered.
pub(super) fn roll_forward(
    checkpoint: &mut Checkpoint,
    writer: &SpecWriter,
    pool: &str,
) -> Vec<String> {
    let mut done = Vec::new();
    for record in checkpoint::rollback_candidates(checkpoint) {
        // Completing a started record cannot be refused.
        if spec_matches(writer, &record, pool)
            && checkpoint::complete_prepare(checkpoint, &record.uid, unix_now()).is_ok()
        {
            done.push(record.uid);
        }
    }
    done
}

/// Whether the claim's spec is on disk, readable, and names exactly the record's
/// devices (anything else is not a finished prepare of this record).
fn spec_matches(writer: &SpecWriter, record: &ClaimRecord, pool: &str) -> bool {
    record_from_spec(writer, &record.uid, pool).is_some_and(|from_spec| {
        let names: Vec<String> = from_spec.devices.into_iter().map(|d| d.device).collect();
        super::claim::same_devices(record, &names)
    })
}

/// A completed record recovered from a spec we wrote. The spec names the claim in its
/// annotations, each device as `<claimUID>-<deviceName>` with its requests in an
/// annotation (specs of older versions lack it; a retried prepare re-derives them
/// from the claim in any case).
fn record_from_spec(writer: &SpecWriter, uid: &str, pool: &str) -> Option<ClaimRecord> {
    let path = writer.path_for(uid);
    let spec: Spec = match std::fs::read(&path).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(spec)) => spec,
        Ok(Err(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable CDI spec skipped in rebuild");
            return None;
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "CDI spec vanished during rebuild");
            return None;
        }
    };
    let annotation = |key: &str| spec.annotations.get(key).cloned().unwrap_or_default();
    let prefix = format!("{uid}-");
    let devices = spec
        .devices
        .iter()
        .filter_map(|d| Some((d, d.name.strip_prefix(&prefix)?)))
        .map(|(d, device)| PreparedGpu {
            requests: d
                .annotations
                .get(cdi::ANNOTATION_REQUESTS)
                .map(|r| {
                    r.split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            pool: pool.to_owned(),
            device: device.to_owned(),
            cdi_device_ids: vec![writer.kind().device_id(uid, device)],
            share_id: d.annotations.get(cdi::ANNOTATION_SHARE_ID).cloned(),
            mig: None,
            sharing: share_from_annotations(&d.annotations),
        })
        .collect();
    Some(ClaimRecord {
        uid: uid.to_owned(),
        namespace: annotation(cdi::ANNOTATION_CLAIM_NAMESPACE),
        name: annotation(cdi::ANNOTATION_CLAIM_NAME),
        state: ClaimState::PrepareCompleted,
        devices,
        cdi_spec: Some(path.display().to_string()),
        updated_at: unix_now(),
    })
}

/// A share's intent as its device's annotations in the spec carry it
/// (`cdi::claim`), or `None` for a device that is not a share.
fn share_from_annotations(
    a: &std::collections::BTreeMap<String, String>,
) -> Option<topodra_model::checkpoint::ShareIntent> {
    use topodra_model::checkpoint::{ShareIntent, ShareMode};
    let number = |key: &str| a.get(key).and_then(|v| v.parse::<u32>().ok());
    let mode = match a.get(cdi::ANNOTATION_SHARING)?.as_str() {
        "TimeSlicing" => ShareMode::TimeSlicing,
        "MPS" => ShareMode::Mps,
        other => {
            tracing::warn!(
                mode = other,
                "CDI spec names an unknown sharing mode; share not rebuilt"
            );
            return None;
        }
    };
    Some(ShareIntent {
        mode,
        gpu_device: a.get(cdi::ANNOTATION_SHARED_GPU)?.clone(),
        gpu_uuid: a.get(cdi::ANNOTATION_GPU_UUID).cloned().unwrap_or_default(),
        timeslice: a
            .get(cdi::ANNOTATION_TIMESLICE)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
        memory_bytes: a
            .get(cdi::ANNOTATION_MEMORY_BYTES)
            .and_then(|m| m.parse().ok()),
        compute_percent: number(cdi::ANNOTATION_COMPUTE_PERCENT),
        pipe_dir: a.get(cdi::ANNOTATION_MPS_PIPE_DIR).cloned(),
        prior_compute_mode: number(cdi::ANNOTATION_PRIOR_COMPUTE_MODE),
    })
}
