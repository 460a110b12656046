//! The prepare/unprepare state machine behind the kubelet's DRA calls.
//!
//! A claim is prepared in two phases: the checkpoint first records the claim as
//! started (with the CDI spec path it is about to write) and is synced, then the spec
//! is renamed into place, then the claim is marked completed in memory and the
//! kubelet answered. The completion reaches disk with the next save of any kind
//! (another prepare, an unprepare, the fence): the spec, which only appears after the
//! started record is durable, is the mark that the prepare finished. A crash at any
//! point leaves a started record, which the next start rolls forward when its spec is
//! there and back when it is not; a completed one, which a retried prepare returns as
//! is; or nothing. One synced save per prepare instead of two is what makes a prepare
//! cost two fsyncs (see `docs/design.md`, "Crash safety of prepare"). Unprepare needs
//! nothing but the checkpoint.
//!
//! Devices are locked one by one, so claims on disjoint GPUs proceed in parallel;
//! their checkpoint changes share saves (`commit`), and a call returns only once a
//! save holding its change is on disk, but for the completions above, which memory
//! holds ahead of it.
//! Every error is per claim: the caller answers each claim of a batch separately.
//!
//! A handover is a fence ([`Preparer::fence`]): once it returns, every prepare and
//! unprepare that was under way has finished, the completions are saved, and every
//! later one is refused without touching the checkpoint or the CDI directory. A
//! prepare that was still waiting for its claim on a slow API server when this
//! process gave the node's state away can therefore never overwrite what the new
//! owner recorded since.

mod commit;
#[cfg(feature = "crash-points")]
mod crash;
mod error;
mod locks;
mod plan;
mod recovery;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use k8s_openapi::api::resource::v1::ResourceClaim;

#[cfg(feature = "crash-points")]
pub use crash::{CrashHook, CrashPoint};
pub use error::{ClaimError, StartError};
pub use recovery::StartupReport;

use crate::cdi::{self, ClaimGpu, ClaimSpecRequest, DeviceNodes, DriverFiles, SpecWriter};
use crate::checkpoint::{
    self, Checkpoint, CheckpointError, CheckpointStore, ClaimRecord, ClaimRef, ClaimState,
    PreparedDevice,
};
use crate::inventory::{AllocatableDevice, Inventory};

/// Where the state machine keeps its state and who it is.
#[derive(Debug, Clone)]
pub struct PreparerConfig {
    pub driver_name: String,
    /// This node's name, which is also its pool's name.
    pub node_name: String,
    /// Directory of the checkpoint.
    pub state_dir: PathBuf,
    /// The current boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// Directory of the CDI specs.
    pub cdi_spec_dir: PathBuf,
}

pub struct Preparer {
    driver_name: String,
    pool: String,
    /// Every allocatable device (whole GPU or MIG device) by its slice name.
    gpus: BTreeMap<String, AllocatableDevice>,
    locks: locks::DeviceLocks,
    writer: SpecWriter,
    nodes: Box<dyn DeviceNodes + Send + Sync>,
    files: DriverFiles,
    /// The checkpoint, in memory and saved (group commit).
    state: commit::Committer,
    /// `Some(new owner)` once the state is handed over. Every prepare and unprepare
    /// holds the read side for as long as it runs, so taking the write side (in
    /// `fence`) waits for all of them.
    fence: RwLock<Option<String>>,
    /// Why the state directory may not be written, when it may not
    /// ([`Preparer::start_read_only`]).
    read_only: Option<String>,
    #[cfg(feature = "crash-points")]
    crash_hook: Option<CrashHook>,
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preparer")
            .field("driver_name", &self.driver_name)
            .field("pool", &self.pool)
            .field("devices", &self.gpus.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Preparer {
    /// Loads the checkpoint and brings disk and checkpoint back in line (see
    /// `recovery`); the report says what had to be done, for logs and Events.
    pub fn start(
        config: &PreparerConfig,
        inventory: &Inventory,
        nodes: Box<dyn DeviceNodes + Send + Sync>,
        files: impl Into<DriverFiles>,
    ) -> Result<(Self, StartupReport), StartError> {
        let store = CheckpointStore::new(&config.state_dir);
        let writer = SpecWriter::new(
            &config.cdi_spec_dir,
            cdi::CdiKind::for_driver(&config.driver_name),
        );
        let (checkpoint, report) =
            recovery::recover(&store, &writer, &config.boot_id, &config.node_name)?;
        let preparer = Self::assemble(
            config,
            inventory,
            nodes,
            files.into(),
            store,
            writer,
            checkpoint,
        );
        Ok((preparer, report))
    }

    /// Starts without writing the state directory, for a process that could not
    /// take ownership of it (read-only, full, or its lock file unusable): the
    /// checkpoint is read as it is, recovery is left to the next owner, every
    /// prepare is refused with `reason`, and unprepare removes a known claim's CDI
    /// spec and forgets its record in memory only. The checkpoint on disk keeps the
    /// record, so the GPUs stay held for the next owner until its stale-claim check
    /// finds the claim gone; never the reverse, a GPU handed out twice.
    pub fn start_read_only(
        config: &PreparerConfig,
        inventory: &Inventory,
        nodes: Box<dyn DeviceNodes + Send + Sync>,
        files: impl Into<DriverFiles>,
        reason: String,
    ) -> Self {
        let store = CheckpointStore::new(&config.state_dir);
        let writer = SpecWriter::new(
            &config.cdi_spec_dir,
            cdi::CdiKind::for_driver(&config.driver_name),
        );
        let (mut checkpoint, unreadable) = store.read_only(&config.boot_id);
        if let Some(why) = unreadable {
            tracing::error!(error = %why, "checkpoint not readable; serving read-only with no known claims");
        }
        checkpoint::after_reboot(&mut checkpoint, &config.boot_id);
        // In memory only, as a start that owns the state would do it on disk.
        recovery::roll_forward(&mut checkpoint, &writer, &config.node_name);
        Self {
            read_only: Some(reason),
            ..Self::assemble(
                config,
                inventory,
                nodes,
                files.into(),
                store,
                writer,
                checkpoint,
            )
        }
    }

    fn assemble(
        config: &PreparerConfig,
        inventory: &Inventory,
        nodes: Box<dyn DeviceNodes + Send + Sync>,
        files: DriverFiles,
        store: CheckpointStore,
        writer: SpecWriter,
        checkpoint: Checkpoint,
    ) -> Self {
        let gpus: BTreeMap<String, AllocatableDevice> = inventory
            .allocatable()
            .into_iter()
            .map(|d| (d.name(), d))
            .collect();
        Self {
            driver_name: config.driver_name.clone(),
            pool: config.node_name.clone(),
            locks: locks::DeviceLocks::new(gpus.keys().cloned()),
            gpus,
            writer,
            nodes,
            files,
            state: commit::Committer::new(store, checkpoint),
            fence: RwLock::new(None),
            read_only: None,
            #[cfg(feature = "crash-points")]
            crash_hook: None,
        }
    }

    /// Why this state machine serves read-only, if it does.
    pub fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }

    /// Applies `change` (to at most the record of `uid`) and saves it; see
    /// `commit` for how saves are shared. A refused change saves nothing.
    fn update<T, E: From<CheckpointError>>(
        &self,
        uid: Option<&str>,
        change: impl FnOnce(&mut Checkpoint) -> Result<T, E>,
    ) -> Result<T, E> {
        self.state.update(uid, change)
    }

    /// Records a prepare as completed in memory only; the spec on disk stands for
    /// the completion until the next save carries it.
    fn complete_in_memory(&self, claim_ref: &ClaimRef) -> Result<(), ClaimError> {
        self.state
            .in_memory(true, |cp| {
                checkpoint::complete_prepare(cp, &claim_ref.uid, checkpoint::unix_now()).map(|_| ())
            })
            .map_err(|e| ClaimError::transition(claim_ref, e))
    }

    /// Saves the completions memory holds ahead of disk, so that the checkpoint alone
    /// says what is prepared (for a handover, or an older version after a rollback).
    /// Best effort: what is not saved the next start rolls forward from the specs.
    fn save_completions(&self) {
        if self.read_only.is_some() || !self.state.has_unsaved() {
            return;
        }
        if let Err(e) = self.update(None, |_| Ok::<_, CheckpointError>(())) {
            tracing::warn!(error = %e, "could not save completed prepares; the next start rolls them forward");
        }
    }

    /// Brings a completed record's answer up to date (request names after a
    /// rebuild). Best effort: the answer given is right either way; the record only
    /// matters again after a restart.
    fn refresh_record(&self, uid: &str, prepared: &[PreparedDevice]) {
        let result = self.update(Some(uid), |cp| {
            if let Some(record) = cp.claims.get_mut(uid) {
                record.devices = prepared.to_vec();
            }
            Ok::<_, CheckpointError>(())
        });
        if let Err(e) = result {
            tracing::warn!(claim = uid, error = %e, "could not record refreshed request names");
        }
    }

    /// Stops this process from writing the node's state, for the instance `to`
    /// that takes it over: waits until every prepare and unprepare in flight has
    /// returned, then refuses all later ones with [`ClaimError::HandedOver`]. Call
    /// it before letting go of the ownership lock. Blocks; idempotent.
    pub fn fence(&self, to: &str) {
        let mut fence = self.fence.write().unwrap_or_else(PoisonError::into_inner);
        if fence.is_none() {
            self.save_completions();
            *fence = Some(to.to_owned());
        }
    }

    /// Whether [`Preparer::fence`] has been called.
    pub fn is_fenced(&self) -> bool {
        self.fence
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The read side of the fence, held by a call for as long as it may write;
    /// refused once the state is handed over.
    fn owned(&self) -> Result<RwLockReadGuard<'_, Option<String>>, ClaimError> {
        let fence = self.fence.read().unwrap_or_else(PoisonError::into_inner);
        match fence.as_ref() {
            Some(to) => Err(ClaimError::HandedOver { to: to.clone() }),
            None => Ok(fence),
        }
    }

    /// A copy of the current checkpoint.
    pub fn checkpoint(&self) -> Checkpoint {
        self.state.read(Checkpoint::clone)
    }

    /// Number of devices held by prepared (or preparing) claims.
    pub fn prepared_devices(&self) -> usize {
        self.state
            .read(|cp| cp.claims.values().map(|c| c.devices.len()).sum())
    }

    /// Prepares one claim whose object the caller has read from the API server.
    /// Idempotent: a claim already prepared with the same devices gets the same answer.
    pub fn prepare(
        &self,
        claim_ref: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let _owned = self.owned()?;
        if let Some(reason) = &self.read_only {
            return Err(ClaimError::StateUnusable {
                reason: reason.clone(),
            });
        }
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
        let prepared: Vec<PreparedDevice> = plan
            .devices
            .iter()
            .map(|d| PreparedDevice {
                requests: d.requests.clone(),
                pool: self.pool.clone(),
                device: d.device.clone(),
                cdi_device_ids: vec![self.writer.kind().device_id(&claim_ref.uid, &d.device)],
                share_id: d.share_id.clone(),
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
        let files = self.files.current()?;
        let spec = cdi::claim_spec(&request, self.nodes.as_ref(), &files)?;
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
                checkpoint::unix_now(),
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

fn same_devices(record: &ClaimRecord, names: &[String]) -> bool {
    let mut have: Vec<&String> = record.devices.iter().map(|d| &d.device).collect();
    let mut want: Vec<&String> = names.iter().collect();
    have.sort();
    want.sort();
    have == want
}

#[cfg(test)]
mod tests;
