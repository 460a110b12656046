//! Preparing and unpreparing one claim: the kubelet's two calls, on the state
//! machine of [`super::Preparer`].

use k8s_openapi::api::resource::v1::ResourceClaim;
use topodra_model::checkpoint::{self, ClaimIdentity, ClaimRecord, ClaimState, PreparedGpu};

use super::*;
use crate::cdi::{self, ClaimGpu, ClaimSpecRequest};
use crate::checkpoint::unix_now;

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
        };
        let plan = plan::plan(&ctx, claim_ref, claim)?;
        let names: Vec<String> = plan.devices.iter().map(|d| d.device.clone()).collect();
        let _held = self.locks.lock(&names);
        // The answer always comes from the claim as it is now: request names in
        // particular, which a checkpoint rebuilt from CDI specs by an older version
        // may lack, and which the kubelet needs to hand devices to containers.
        let prepared: Vec<PreparedGpu> = plan
            .devices
            .iter()
            .map(|d| PreparedGpu {
                requests: d.requests.clone(),
                pool: self.pool.clone(),
                device: d.device.clone(),
                cdi_device_ids: vec![self.writer.kind().device_id(&claim_ref.uid, &d.device)],
                share_id: d.share_id.clone(),
                mig: None,
            })
            .collect();

        let done = self.state.read(|cp| {
            cp.get(&claim_ref.uid)
                .filter(|done| {
                    done.state == ClaimState::PrepareCompleted && same_devices(done, &names)
                })
                .map(|done| done.devices != prepared)
        });
        if let Some(stale) = done
            && self.writer.path_for(&claim_ref.uid).exists()
        {
            if stale {
                self.refresh_record(&claim_ref.uid, &prepared);
            }
            return Ok(prepared);
        }

        // Build the spec before recording anything: if the node cannot describe the
        // devices, there is nothing to roll back. Whether another claim holds one of
        // them is only known under the lock of the save below (begin_prepare).
        let gpus = plan
            .devices
            .iter()
            .filter_map(|d| Some((d, self.gpus.get(&d.device)?)))
            .map(|(planned, dev)| {
                let mut gpu = ClaimGpu::from_device(dev, self.nodes.as_ref())?;
                gpu.requests = planned.requests.clone();
                Ok(gpu)
            })
            .collect::<Result<_, cdi::CdiError>>()?;
        let request = ClaimSpecRequest {
            claim_uid: claim_ref.uid.clone(),
            claim_namespace: claim_ref.namespace.clone(),
            claim_name: claim_ref.name.clone(),
            gpus,
            env_hints: plan.env_hints,
            kind: self.writer.kind().clone(),
            capabilities: plan.capabilities.clone(),
        };
        let spec = cdi::claim_spec(&request, self.nodes.as_ref(), &*files?)?;
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

        if let Err(e) = self.writer.write(&claim_ref.uid, &spec) {
            // Nothing was handed out: forget the claim so its devices are free again.
            // The rename may have happened before the failure; a spec left next to
            // the started record would be rolled forward by the next start.
            if let Err(remove) = self.writer.remove(&claim_ref.uid) {
                tracing::error!(claim = %claim_ref.uid, error = %remove, "removing the spec of a failed prepare");
            }
            if let Err(rollback) = self.update(Some(&claim_ref.uid), |cp| {
                Ok::<_, CheckpointError>(cp.remove(&claim_ref.uid))
            }) {
                tracing::error!(claim = %claim_ref.uid, error = %rollback, "rolling back a failed prepare");
            }
            return Err(e.into());
        }
        #[cfg(feature = "crash-points")]
        self.crash(CrashPoint::AfterCdiWrite)?;

        self.complete_in_memory(claim_ref)?;
        #[cfg(feature = "crash-points")]
        self.crash(CrashPoint::BeforeAnswer)?;
        Ok(prepared)
    }

    /// Unprepares a claim by UID, from the checkpoint alone. Idempotent: an unknown
    /// claim is already unprepared.
    pub fn unprepare(&self, uid: &str) -> Result<(), ClaimError> {
        let _owned = self.owned()?;
        let devices: Vec<String> = self.state.read(|cp| match cp.get(uid) {
            Some(record) => record.devices.iter().map(|d| d.device.clone()).collect(),
            None => Vec::new(),
        });
        let _held = self.locks.lock(&devices);
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
        if self.state.read(|cp| cp.get(uid).is_some()) {
            self.update(Some(uid), |cp| Ok::<_, ClaimError>(cp.remove(uid)))?;
        }
        Ok(())
    }
}

pub(super) fn same_devices(record: &ClaimRecord, names: &[String]) -> bool {
    let mut have: Vec<&String> = record.devices.iter().map(|d| &d.device).collect();
    let mut want: Vec<&String> = names.iter().collect();
    have.sort();
    want.sort();
    have == want
}
