//! Preparing and unpreparing one claim: the kubelet's two calls, on the state
//! machine of [`super::Preparer`].

use k8s_openapi::api::resource::v1::ResourceClaim;
use topodra_model::checkpoint::{
    self, ClaimIdentity, ClaimRecord, ClaimState, PreparedGpu, ShareIntent, ShareMode,
};

use super::*;
use crate::cdi::{self, ClaimGpu, ClaimSpecRequest};
use crate::checkpoint::unix_now;
use crate::dynamic_mig::MadeInstance;
use topodra_model::inventory::MigDevice;

impl Preparer {
    /// Prepares one claim whose object the caller has read from the API server.
    /// Idempotent: a claim already prepared with the same devices gets the same answer.
    pub fn prepare(
        &self,
        claim_ref: &ClaimIdentity,
        claim: &ResourceClaim,
    ) -> Result<Vec<PreparedGpu>, ClaimError> {
        // Refused at once after a handover or in read-only mode, before any work.
        drop(self.owned()?);
        if let Some(reason) = &self.read_only {
            return Err(ClaimError::StateUnusable {
                reason: reason.clone(),
            });
        }
        // The driver's files, read again here when they changed: before the fence's
        // read side is taken, so that a read that never returns (a toolkit spec on a
        // stuck mount) holds up this call alone, never a handover's fence. An error
        // counts only where a spec is written: a claim prepared already is answered.
        let files = self.files.current();
        let _owned = self.owned()?;
        let ctx = plan::Context {
            driver_name: &self.driver_name,
            pool: &self.pool,
            gpus: &self.gpus,
            dynamic: &self.dynamic,
            shared: &self.shared,
        };
        let plan = plan::plan(&ctx, claim_ref, claim)?;
        let names: Vec<String> = plan.devices.iter().map(|d| d.device.clone()).collect();
        let _held = self.locks.lock(&self.lock_names(&names));
        // The answer always comes from the claim as it is now: request names in
        // particular, which a checkpoint rebuilt from CDI specs by an older version
        // may lack, and which the kubelet needs to hand devices to containers.
        let mut prepared: Vec<PreparedGpu> = Vec::with_capacity(plan.devices.len());
        for d in &plan.devices {
            prepared.push(PreparedGpu {
                requests: d.requests.clone(),
                pool: self.pool.clone(),
                device: d.device.clone(),
                cdi_device_ids: vec![self.writer.kind().device_id(&claim_ref.uid, &d.device)],
                share_id: d.share_id.clone(),
                mig: self.intent_of(&d.device),
                sharing: self.share_of(claim_ref, d)?,
            });
        }

        // From the claim's record, if any: whether it is prepared already (and its
        // answer stale), and the instances it named before this prepare, the only
        // ones that may be found already made and used (`Carver::create_gpu_instance`).
        let (done, recorded): (Option<bool>, Vec<MigIntent>) = self.state.read(|cp| {
            let Some(r) = cp.get(&claim_ref.uid) else {
                return (None, Vec::new());
            };
            let done = (r.state == ClaimState::PrepareCompleted && same_devices(r, &names))
                .then(|| r.devices != prepared);
            (
                done,
                r.devices.iter().filter_map(|d| d.mig.clone()).collect(),
            )
        });
        if let Some(stale) = done
            && self.writer.path_for(&claim_ref.uid).exists()
        {
            if stale {
                self.refresh_record(&claim_ref.uid, &prepared);
            }
            return Ok(prepared);
        }

        // Without dynamic MIG, build the spec before recording anything: if the
        // node cannot describe the devices, there is nothing to roll back. A
        // partition's instance, whose ids the spec needs, is made only after the
        // record names it, so that a crash in between leaves a record to find it by.
        // Whether another claim holds one of the devices is only known under the
        // lock of the save below (begin_prepare).
        let files = files?;
        let makes_instances = prepared.iter().any(|d| d.mig.is_some());
        let early_spec = if makes_instances {
            None
        } else {
            Some(self.build_spec(claim_ref, &plan, &prepared, &BTreeMap::new(), &files)?)
        };
        let spec_path = self.writer.path_for(&claim_ref.uid);
        // A spec already at the path (a claim prepared again after a reboot, or with
        // other devices) goes first: a spec found next to a started record must be
        // the one this prepare wrote, or the next start would roll forward to it.
        // (Removing a spec that is not there is a no-op.)
        self.writer.remove(&claim_ref.uid)?;

        self.update(Some(&claim_ref.uid), |cp| {
            checkpoint::begin_prepare(
                cp,
                claim_ref.clone(),
                prepared.clone(),
                Some(spec_path.display().to_string()),
                unix_now(),
            )
            .map(|_| ())
            .map_err(|e| ClaimError::transition(claim_ref, e))
        })?;
        #[cfg(feature = "crash-points")]
        self.crash(CrashPoint::AfterStartedRecord)?;

        // A share's GPU runs at the node's interval from its first share on; the
        // record above names it, so a crash from here on leaves one to undo it by.
        if let Err(e) = self.set_time_slices(claim_ref, &prepared) {
            return Err(self.abandon(claim_ref, &prepared, &[], e));
        }
        #[cfg(feature = "crash-points")]
        if time_slices(&prepared).next().is_some() {
            self.crash(CrashPoint::AfterTimeSlice)?;
        }
        // An MPS share's GPU goes into EXCLUSIVE_PROCESS and gets its daemon with
        // its first share, the record above naming both; a partition's daemon once
        // its instance is made, below.
        if !makes_instances && let Err(e) = self.start_mps(claim_ref, &prepared, &BTreeMap::new()) {
            return Err(self.abandon(claim_ref, &prepared, &[], e));
        }

        let spec = match early_spec {
            Some(spec) => spec,
            None => {
                let mut ours = recorded;
                let made = self
                    .make_instances(claim_ref, &prepared, &mut ours)
                    .and_then(|made| {
                        self.start_mps(claim_ref, &prepared, &made)?;
                        self.build_spec(claim_ref, &plan, &prepared, &made, &files)
                    });
                match made {
                    Ok(spec) => spec,
                    Err(e) => return Err(self.abandon(claim_ref, &prepared, &ours, e)),
                }
            }
        };
        #[cfg(feature = "crash-points")]
        if makes_instances {
            self.crash(CrashPoint::BeforeSpec)?;
        }

        if let Err(e) = self.writer.write(&claim_ref.uid, &spec) {
            let ours: Vec<MigIntent> = prepared.iter().filter_map(|d| d.mig.clone()).collect();
            return Err(self.abandon(claim_ref, &prepared, &ours, e.into()));
        }
        #[cfg(feature = "crash-points")]
        self.crash(CrashPoint::AfterCdiWrite)?;

        self.complete_in_memory(claim_ref)?;
        #[cfg(feature = "crash-points")]
        self.crash(CrashPoint::BeforeAnswer)?;
        Ok(prepared)
    }

    /// The claim's CDI spec; `made` holds the instances of its dynamic MIG devices,
    /// `prepared` what is recorded for each device (a share's intent).
    fn build_spec(
        &self,
        claim_ref: &ClaimIdentity,
        plan: &plan::Plan,
        prepared: &[PreparedGpu],
        made: &BTreeMap<String, MadeInstance>,
        files: &cdi::NvidiaFiles,
    ) -> Result<cdi::Spec, ClaimError> {
        let mut gpus = Vec::new();
        for planned in &plan.devices {
            if let Some(shared) = self.shared.get(&planned.device) {
                let mut gpu = match (&shared.mig, made.get(&planned.device)) {
                    // A share of a partition gets the partition's MIG device.
                    (Some(p), Some(m)) => ClaimGpu::from_device(
                        &made_device(&shared.gpu, &p.profile, p.placement, m),
                        self.nodes.as_ref(),
                    )?,
                    _ => ClaimGpu::from_gpu(&shared.gpu)?,
                };
                gpu.device_name.clone_from(&planned.device);
                gpu.requests = planned.requests.clone();
                gpu.share = prepared
                    .iter()
                    .find(|p| p.device == planned.device)
                    .and_then(|p| Some((p.share_id.clone()?, p.sharing.clone()?)));
                gpus.push(gpu);
                continue;
            }
            let mut gpu = match (self.dynamic.get(&planned.device), made.get(&planned.device)) {
                (Some(d), Some(m)) => {
                    let dev = made_device(&d.gpu, &d.profile, d.placement, m);
                    let mut gpu = ClaimGpu::from_device(&dev, self.nodes.as_ref())?;
                    // Named as the slice names it: the CDI id the kubelet gets.
                    gpu.device_name.clone_from(&planned.device);
                    gpu
                }
                _ => match self.gpus.get(&planned.device) {
                    Some(dev) => ClaimGpu::from_device(dev, self.nodes.as_ref())?,
                    None => continue,
                },
            };
            gpu.requests = planned.requests.clone();
            gpus.push(gpu);
        }
        let request = ClaimSpecRequest {
            claim_uid: claim_ref.uid.clone(),
            claim_namespace: claim_ref.namespace.clone(),
            claim_name: claim_ref.name.clone(),
            gpus,
            env_hints: plan.env_hints,
            kind: self.writer.kind().clone(),
            capabilities: plan.capabilities.clone(),
        };
        Ok(cdi::claim_spec(&request, self.nodes.as_ref(), files)?)
    }

    /// Makes the MIG instances of the claim's dynamic MIG devices. `ours` holds
    /// the instances the claim's record named before this prepare, which may be
    /// found made already; each GPU instance this prepare makes is added to it,
    /// so that a failure removes those and no other.
    fn make_instances(
        &self,
        claim_ref: &ClaimIdentity,
        prepared: &[PreparedGpu],
        ours: &mut Vec<MigIntent>,
    ) -> Result<BTreeMap<String, MadeInstance>, ClaimError> {
        let mut made = BTreeMap::new();
        for d in prepared {
            let Some(intent) = &d.mig else { continue };
            // Another claim's share of the same partition made the instance, or is
            // making it: it is used as it is, never refused as someone else's.
            let sibling = self
                .state
                .read(|cp| cp.mig_held_by_others(intent, &claim_ref.uid));
            let carver = self.carver_for(claim_ref, &d.device)?;
            let mig_error = |source| ClaimError::Mig {
                namespace: claim_ref.namespace.clone(),
                name: claim_ref.name.clone(),
                device: d.device.clone(),
                source: Box::new(source),
            };
            carver
                .create_gpu_instance(intent, sibling || ours.contains(intent))
                .map_err(mig_error)?;
            if !ours.contains(intent) {
                ours.push(intent.clone());
            }
            #[cfg(feature = "crash-points")]
            self.crash(CrashPoint::AfterGpuInstance)?;
            let m = carver.create_compute_instance(intent).map_err(mig_error)?;
            #[cfg(feature = "crash-points")]
            self.crash(CrashPoint::AfterComputeInstance)?;
            made.insert(d.device.clone(), m);
        }
        Ok(made)
    }

    fn carver_for(&self, claim_ref: &ClaimIdentity, device: &str) -> Result<&Carver, ClaimError> {
        self.carver.as_deref().ok_or_else(|| ClaimError::NoCarver {
            namespace: claim_ref.namespace.clone(),
            name: claim_ref.name.clone(),
            device: device.to_owned(),
        })
    }

    /// Undoes a prepare that failed after its record was saved: the spec, the MIG
    /// instances that are the claim's (`ours`: made by it, now or before), then the
    /// record, so its devices are free again. An instance at a placement of the
    /// claim that is not its own (someone else's, which made the prepare fail) is
    /// left alone. An instance that cannot be removed keeps the record, and with
    /// it the slices, for an unprepare or the next start to remove. Returns
    /// `error`, the failure. A crash point's error is returned untouched: a crash
    /// cleans nothing up.
    fn abandon(
        &self,
        claim_ref: &ClaimIdentity,
        prepared: &[PreparedGpu],
        ours: &[MigIntent],
        error: ClaimError,
    ) -> ClaimError {
        #[cfg(feature = "crash-points")]
        if matches!(error, ClaimError::Crashed(_)) {
            return error;
        }
        // The rename may have happened before a write failed; a spec left next to
        // the started record would be rolled forward by the next start.
        if let Err(remove) = self.writer.remove(&claim_ref.uid) {
            tracing::error!(claim = %claim_ref.uid, error = %remove, "removing the spec of a failed prepare");
        }
        if let Err(why) = self
            .reset_time_slices(claim_ref, prepared)
            .and_then(|()| self.stop_mps(claim_ref, prepared))
        {
            tracing::error!(claim = %claim_ref.uid, error = %why,
                "the time slice of a failed share could not be reset; its record stays until an unprepare or the next start resets it");
            return error;
        }
        for intent in ours {
            // An instance a sibling share still holds stays.
            if self
                .state
                .read(|cp| cp.mig_held_by_others(intent, &claim_ref.uid))
            {
                continue;
            }
            let removed = self
                .carver
                .as_deref()
                .map(|c| c.destroy(intent).map_err(|e| e.to_string()))
                .unwrap_or_else(|| Err("no NVML".to_owned()));
            if let Err(why) = removed {
                tracing::error!(claim = %claim_ref.uid, gpu = %intent.parent_uuid, start = intent.start, error = %why,
                    "the MIG instance of a failed prepare could not be removed; its record stays until an unprepare or the next start removes it");
                return error;
            }
        }
        if let Err(rollback) = self.update(Some(&claim_ref.uid), |cp| {
            Ok::<_, CheckpointError>(cp.remove(&claim_ref.uid))
        }) {
            tracing::error!(claim = %claim_ref.uid, error = %rollback, "rolling back a failed prepare");
        }
        error
    }

    /// Unprepares a claim by UID, from the checkpoint alone. Idempotent: an unknown
    /// claim is already unprepared.
    pub fn unprepare(&self, uid: &str) -> Result<(), ClaimError> {
        let _owned = self.owned()?;
        let record = self.state.read(|cp| cp.get(uid).cloned());
        let devices: Vec<String> = record
            .iter()
            .flat_map(|r| r.devices.iter().map(|d| d.device.clone()))
            .collect();
        let _held = self.locks.lock(&self.lock_names(&devices));
        // The spec goes first: a crash between the two steps leaves a record whose
        // spec is gone, which the next unprepare finishes; the reverse would leave a
        // spec that no record owns until the next start.
        self.writer.remove(uid)?;
        if self.read_only.is_some() {
            if self.state.in_memory(false, |cp| cp.remove(uid)).is_some() {
                tracing::warn!(
                    claim = uid,
                    "unprepared read-only: the record stays in the checkpoint on disk"
                );
            }
            return Ok(());
        }
        // The instances and time slices go before the record: one that cannot be
        // undone keeps the record, and the kubelet retries the unprepare.
        if let Some(record) = &record {
            let identity = ClaimIdentity {
                uid: record.uid.clone(),
                namespace: record.namespace.clone(),
                name: record.name.clone(),
            };
            self.reset_time_slices(&identity, &record.devices)?;
            self.stop_mps(&identity, &record.devices)?;
            for d in &record.devices {
                let Some(intent) = &d.mig else { continue };
                if self.state.read(|cp| cp.mig_held_by_others(intent, uid)) {
                    continue;
                }
                self.carver_for(&identity, &d.device)?
                    .destroy(intent)
                    .map_err(|source| ClaimError::Mig {
                        namespace: record.namespace.clone(),
                        name: record.name.clone(),
                        device: d.device.clone(),
                        source: Box::new(source),
                    })?;
            }
        }
        if self.state.read(|cp| cp.get(uid).is_some()) {
            self.update(Some(uid), |cp| Ok::<_, ClaimError>(cp.remove(uid)))?;
        }
        Ok(())
    }
}

impl Preparer {
    /// Sets the node's interval on each shared GPU of `prepared` that no other
    /// claim's share holds in this boot (the first share sets it; a later one finds
    /// it set). Called under the GPU's lock, with the claim's record saved.
    fn set_time_slices(
        &self,
        claim_ref: &ClaimIdentity,
        prepared: &[PreparedGpu],
    ) -> Result<(), ClaimError> {
        self.time_slices_alone(claim_ref, prepared, |share| share.timeslice)
    }

    /// Sets each shared GPU of `devices` back to the driver's default interval
    /// where no other claim's share holds it in this boot.
    fn reset_time_slices(
        &self,
        claim_ref: &ClaimIdentity,
        devices: &[PreparedGpu],
    ) -> Result<(), ClaimError> {
        self.time_slices_alone(claim_ref, devices, |_| 0)
    }

    /// Sets the time slice `value` gives each time-sliced GPU of `devices` that no
    /// other claim's share holds in this boot: the one share that decides it.
    fn time_slices_alone(
        &self,
        claim_ref: &ClaimIdentity,
        devices: &[PreparedGpu],
        value: impl Fn(&ShareIntent) -> u8,
    ) -> Result<(), ClaimError> {
        for (d, share) in time_slices(devices) {
            let others = self
                .state
                .read(|cp| cp.live_time_slices(&share.gpu_uuid, &claim_ref.uid));
            if others > 0 {
                continue;
            }
            self.time_slicer_for(claim_ref, d, share)?
                .set(&share.gpu_uuid, value(share))
                .map_err(|source| sharing_error(claim_ref, &d.device, source))?;
        }
        Ok(())
    }

    /// For each MPS share of `prepared` whose GPU (or partition) no other claim's
    /// MPS share holds in this boot: a GPU into EXCLUSIVE_PROCESS (a partition
    /// stays as it is), then the control daemon for the GPU, or for the
    /// partition's MIG device (`made`). Called under the GPU's lock, with the
    /// claim's record (naming the prior mode) saved.
    fn start_mps(
        &self,
        claim_ref: &ClaimIdentity,
        prepared: &[PreparedGpu],
        made: &BTreeMap<String, MadeInstance>,
    ) -> Result<(), ClaimError> {
        for (d, share) in self.mps_alone(claim_ref, prepared) {
            let mps = self.mps_for(claim_ref, &d.device)?;
            let err = |e| sharing_error(claim_ref, &d.device, e);
            if share.prior_compute_mode.is_some() {
                mps.set_compute_mode(&share.gpu_uuid, crate::sharing::EXCLUSIVE_PROCESS)
                    .map_err(err)?;
                #[cfg(feature = "crash-points")]
                self.crash(CrashPoint::AfterComputeMode)?;
            }
            let visible = made.get(&d.device).map_or(&share.gpu_uuid, |m| &m.uuid);
            mps.start(&share.gpu_device, visible).map_err(err)?;
            #[cfg(feature = "crash-points")]
            self.crash(CrashPoint::AfterMpsDaemon)?;
        }
        Ok(())
    }

    /// For each MPS share of `devices` whose GPU no other claim's MPS share holds
    /// in this boot: the daemon quits, then the GPU's compute mode goes back to
    /// what it was before MPS. Both are idempotent, so a retry redoes them.
    fn stop_mps(
        &self,
        claim_ref: &ClaimIdentity,
        devices: &[PreparedGpu],
    ) -> Result<(), ClaimError> {
        for (d, share) in self.mps_alone(claim_ref, devices) {
            self.mps_for(claim_ref, &d.device)?
                .undo(share)
                .map_err(|e| sharing_error(claim_ref, &d.device, e))?;
        }
        Ok(())
    }

    /// The MPS shares of `devices` whose GPU or partition no other claim's MPS
    /// share holds in this boot: the ones whose daemon and compute mode are this
    /// claim's to set up or undo.
    fn mps_alone<'d>(
        &self,
        claim_ref: &ClaimIdentity,
        devices: &'d [PreparedGpu],
    ) -> Vec<(&'d PreparedGpu, &'d ShareIntent)> {
        self.state.read(|cp| {
            mps_shares(devices)
                .filter(|(_, s)| cp.live_mps_share(&s.gpu_device, &claim_ref.uid).is_none())
                .collect()
        })
    }

    fn time_slicer_for(
        &self,
        claim_ref: &ClaimIdentity,
        d: &PreparedGpu,
        share: &ShareIntent,
    ) -> Result<&TimeSlicer, ClaimError> {
        self.time_slicer
            .as_deref()
            .ok_or_else(|| ClaimError::NoTimeSlicer {
                namespace: claim_ref.namespace.clone(),
                name: claim_ref.name.clone(),
                device: d.device.clone(),
                interval: share.timeslice.to_string(),
                why: "none found in the driver root at start".to_owned(),
            })
    }
}

/// The shares among `devices` whose GPU runs at a time slice other than the
/// driver's default: the only ones that change a setting.
pub(super) fn time_slices(
    devices: &[PreparedGpu],
) -> impl Iterator<Item = (&PreparedGpu, &ShareIntent)> {
    devices.iter().filter_map(|d| {
        d.sharing
            .as_ref()
            .filter(|s| s.mode == ShareMode::TimeSlicing && s.timeslice != 0)
            .map(|s| (d, s))
    })
}

/// The MIG device of instance `m`, made for a partition of `gpu` with `profile` at
/// `placement`, as discovery would have found it.
fn made_device(
    gpu: &topodra_model::inventory::Gpu,
    profile: &topodra_model::inventory::MigProfile,
    placement: topodra_model::inventory::MigPlacement,
    m: &MadeInstance,
) -> AllocatableDevice {
    AllocatableDevice {
        gpu: gpu.clone(),
        mig: Some(MigDevice {
            uuid: m.uuid.clone(),
            gpu_instance: m.gpu_instance,
            compute_instance: m.compute_instance,
            profile: Some(profile.name.clone()),
            memory_bytes: Some(profile.memory_mib << 20),
            multiprocessors: Some(profile.multiprocessors),
            placement: Some(placement),
            profile_id: Some(profile.id),
        }),
    }
}

/// The MPS shares among `devices`.
pub(super) fn mps_shares(
    devices: &[PreparedGpu],
) -> impl Iterator<Item = (&PreparedGpu, &ShareIntent)> {
    devices.iter().filter_map(|d| {
        d.sharing
            .as_ref()
            .filter(|s| s.mode == ShareMode::Mps)
            .map(|s| (d, s))
    })
}

pub(super) fn sharing_error(
    claim_ref: &ClaimIdentity,
    device: &str,
    source: crate::sharing::SharingError,
) -> ClaimError {
    ClaimError::Sharing {
        namespace: claim_ref.namespace.clone(),
        name: claim_ref.name.clone(),
        device: device.to_owned(),
        source: Box::new(source),
    }
}

pub(super) fn same_devices(record: &ClaimRecord, names: &[String]) -> bool {
    let mut have: Vec<&String> = record.devices.iter().map(|d| &d.device).collect();
    let mut want: Vec<&String> = names.iter().collect();
    have.sort();
    want.sort();
    have == want
}
