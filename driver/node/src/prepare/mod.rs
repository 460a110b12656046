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

mod claim;
mod commit;
#[cfg(feature = "crash-points")]
mod crash;
mod error;
mod locks;
mod plan;
mod recovery;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

#[cfg(feature = "crash-points")]
pub use crash::{CrashHook, CrashPoint};
pub use error::{ClaimError, ClaimErrorKind, RecoveryError};
pub use recovery::StartupReport;

use crate::cdi::{self, DeviceNodes, DriverFiles, SpecWriter};
use crate::checkpoint::{CheckpointError, CheckpointStore, unix_now};
use crate::dynamic_mig::Carver;
use crate::sharing::{MpsControl, TimeSlicer};
use topodra_model::checkpoint::{
    self, Checkpoint, ClaimIdentity, MigIntent, PreparedGpu, ShareIntent, ShareMode,
};
use topodra_model::inventory::{AllocatableDevice, Inventory};
use topodra_model::slice::{
    DynamicDevice, DynamicMig, SharedDevice, Sharing, SharingMode, SliceOptions, dynamic_devices,
    shared_devices,
};

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
    /// Dynamic MIG: the GPUs' partitions are devices, prepared by making their
    /// instances with `carver`.
    pub dynamic_mig: bool,
    /// Makes and removes MIG instances. Needed with dynamic MIG, and wherever a
    /// record names an instance (dynamic MIG turned off since): without it such a
    /// record is kept, holding its slices, until a start with NVML removes it.
    pub carver: Option<Arc<Carver>>,
    /// Which shared devices the slices publish; their shares are prepared here.
    pub sharing: Sharing,
    /// Sets and resets shared GPUs' time slices. Needed where the node's interval
    /// is not Default, and wherever a record names a time slice: without it such
    /// a record cannot be undone and stays until a start with it.
    pub time_slicer: Option<Arc<TimeSlicer>>,
    /// Sets MPS GPUs' compute mode and runs their control daemons. Needed with
    /// MPS devices, and wherever a record names an MPS share.
    pub mps: Option<Arc<MpsControl>>,
}

impl PreparerConfig {
    /// The checkpoint file and the CDI spec directory this configuration names.
    fn store_and_writer(&self) -> (CheckpointStore, SpecWriter) {
        (
            CheckpointStore::new(&self.state_dir),
            SpecWriter::new(
                &self.cdi_spec_dir,
                cdi::CdiKind::for_driver(&self.driver_name),
            ),
        )
    }
}

pub struct Preparer {
    driver_name: String,
    pool: String,
    /// Every allocatable device (whole GPU or MIG device) by its slice name.
    gpus: BTreeMap<String, AllocatableDevice>,
    /// With dynamic MIG, the devices whose instance a prepare makes (whole GPUs
    /// in MIG mode and their partitions), by slice name; they win over `gpus`.
    dynamic: BTreeMap<String, DynamicDevice>,
    /// The shared devices (`gpu-<minor>-ts`), by slice name.
    shared: BTreeMap<String, SharedDevice>,
    carver: Option<Arc<Carver>>,
    time_slicer: Option<Arc<TimeSlicer>>,
    mps: Option<Arc<MpsControl>>,
    /// The MIG instances the checkpoint held at start (see
    /// [`Preparer::own_mig_instances`]).
    own_mig_instances: BTreeSet<(String, u32, u32)>,
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
    ) -> Result<(Self, StartupReport), RecoveryError> {
        let (store, writer) = config.store_and_writer();
        let (checkpoint, report) = recovery::recover(
            &store,
            &writer,
            &config.boot_id,
            &config.node_name,
            config.carver.as_deref(),
            config.time_slicer.as_deref(),
            config.mps.as_deref(),
        )?;
        let preparer = Self::assemble(
            config,
            inventory,
            nodes,
            files.into(),
            (store, writer),
            checkpoint,
            // Discovery ran before the rollback removed them: they are the
            // plugin's (gone now), not someone else's.
            &report.rolled_back_instances,
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
        let (store, writer) = config.store_and_writer();
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
                (store, writer),
                checkpoint,
                &[],
            )
        }
    }

    fn assemble(
        config: &PreparerConfig,
        inventory: &Inventory,
        nodes: Box<dyn DeviceNodes + Send + Sync>,
        files: DriverFiles,
        (store, writer): (CheckpointStore, SpecWriter),
        checkpoint: Checkpoint,
        rolled_back: &[MigIntent],
    ) -> Self {
        let gpus: BTreeMap<String, AllocatableDevice> = inventory
            .allocatable()
            .into_iter()
            .map(|d| (d.name(), d))
            .collect();
        let mut own_mig_instances = own_instances(&checkpoint);
        own_mig_instances.extend(
            rolled_back
                .iter()
                .map(|m| (m.parent_uuid.clone(), m.start, m.size)),
        );
        let dynamic = dynamic_map(config, inventory, &own_mig_instances);
        let shared = shared_map(config, inventory);
        Self {
            driver_name: config.driver_name.clone(),
            pool: config.node_name.clone(),
            locks: locks::DeviceLocks::new(
                gpus.keys()
                    .chain(dynamic.keys())
                    .chain(shared.keys())
                    .cloned(),
            ),
            gpus,
            dynamic,
            shared,
            carver: config.carver.clone(),
            time_slicer: config.time_slicer.clone(),
            mps: config.mps.clone(),
            own_mig_instances,
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

    /// The instance a prepare of `device` makes, for a dynamic MIG device or a
    /// share of a partition.
    fn intent_of(&self, device: &str) -> Option<MigIntent> {
        let (gpu, profile, placement) = match (self.dynamic.get(device), self.shared.get(device)) {
            (Some(d), _) => (&d.gpu, &d.profile, d.placement),
            (None, Some(s)) => {
                let m = s.mig.as_ref()?;
                (&s.gpu, &m.profile, m.placement)
            }
            (None, None) => return None,
        };
        Some(MigIntent {
            parent_uuid: gpu.uuid.clone()?,
            profile_id: profile.id,
            start: placement.start,
            size: placement.size,
        })
    }

    /// What a prepare of shared device `device` records for claim `uid`'s share,
    /// with what it consumed. For an MPS share, the GPU's compute mode before MPS
    /// (the other live shares' record of it, or NVML's answer now, for the first
    /// share: read before anything changes) and its daemon's pipe directory.
    /// Called under the GPU's lock.
    fn share_of(
        &self,
        claim_ref: &ClaimIdentity,
        planned: &plan::PlannedDevice,
    ) -> Result<Option<ShareIntent>, ClaimError> {
        let Some(d) = self.shared.get(&planned.device) else {
            return Ok(None);
        };
        let gpu_uuid = d.gpu.uuid.clone().unwrap_or_default();
        // A share of a partition is part of the partition: its exclusion, its
        // daemon and its instance are the partition's.
        let gpu_device = d
            .mig
            .as_ref()
            .map_or_else(|| d.gpu.device_name(), |m| m.device.clone());
        let mut share = ShareIntent {
            mode: match d.mode {
                SharingMode::TimeSlicing => ShareMode::TimeSlicing,
                SharingMode::Mps => ShareMode::Mps,
            },
            gpu_device,
            gpu_uuid,
            timeslice: cdi::timeslice_value(d.interval),
            memory_bytes: planned.memory_bytes,
            compute_percent: None,
            pipe_dir: None,
            prior_compute_mode: None,
        };
        if share.mode == ShareMode::Mps {
            let mps = self.mps_for(claim_ref, &planned.device)?;
            // This claim's own record first: a retry must not read back the mode
            // its first prepare set.
            let live = self.state.read(|cp| {
                let own = cp.get(&claim_ref.uid).and_then(|r| {
                    r.devices
                        .iter()
                        .find(|p| p.device == planned.device)
                        .and_then(|p| p.sharing.as_ref())
                });
                own.or_else(|| cp.live_mps_share(&share.gpu_device, &claim_ref.uid))
                    .and_then(|s| s.prior_compute_mode)
            });
            // A MIG instance runs MPS without a compute mode change: MIG-enabled
            // GPUs refuse EXCLUSIVE_PROCESS.
            let prior = match (live, &d.mig) {
                (_, Some(_)) => None,
                (Some(mode), None) => Some(mode),
                (None, None) => Some(
                    mps.compute_mode(&share.gpu_uuid)
                        .map_err(|e| claim::sharing_error(claim_ref, &planned.device, e))?,
                ),
            };
            share.compute_percent = planned.compute_percent;
            share.pipe_dir = Some(mps.dirs(&share.gpu_device).pipe.display().to_string());
            share.prior_compute_mode = prior;
        }
        Ok(Some(share))
    }

    fn mps_for(&self, claim_ref: &ClaimIdentity, device: &str) -> Result<&MpsControl, ClaimError> {
        self.mps.as_deref().ok_or_else(|| ClaimError::NoMpsControl {
            namespace: claim_ref.namespace.clone(),
            name: claim_ref.name.clone(),
            device: device.to_owned(),
        })
    }

    /// The locks a call on `devices` takes: the devices, and for dynamic MIG and
    /// shared ones their GPU too, so that the instances of one GPU are made one at
    /// a time (and never beside a claim of the whole GPU), and the shares of one
    /// GPU change its settings one at a time.
    fn lock_names(&self, devices: &[String]) -> Vec<String> {
        let mut names = devices.to_vec();
        names.extend(
            devices
                .iter()
                .filter_map(|d| self.dynamic.get(d))
                .map(|d| d.gpu.device_name()),
        );
        names.extend(
            devices
                .iter()
                .filter_map(|d| self.shared.get(d))
                .map(|d| d.gpu.device_name()),
        );
        names
    }

    /// The MIG instances the claims of the checkpoint held when this state
    /// machine started, by parent UUID and memory slices: among the instances
    /// discovery found then, the ones this plugin made (`SliceOptions::
    /// own_mig_instances`). Instances made since are not in that inventory.
    pub fn own_mig_instances(&self) -> &BTreeSet<(String, u32, u32)> {
        &self.own_mig_instances
    }

    /// Each shared device with the devices whose health is its own, nearest
    /// first: a partition's shares the partition's (an XID may name the partition
    /// alone), then the GPU's (`gpu-3-mig-3g-40gb-4-ts`: `gpu-3-mig-3g-40gb-4`,
    /// `gpu-3`; `gpu-3-ts`: `gpu-3`).
    pub fn shared_devices(&self) -> Vec<(String, Vec<String>)> {
        self.shared
            .iter()
            .map(|(name, d)| {
                let mut sources: Vec<String> = d.mig.iter().map(|m| m.device.clone()).collect();
                sources.push(d.gpu.device_name());
                (name.clone(), sources)
            })
            .collect()
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
    fn complete_in_memory(&self, claim_ref: &ClaimIdentity) -> Result<(), ClaimError> {
        self.state
            .in_memory(true, |cp| {
                checkpoint::complete_prepare(cp, &claim_ref.uid, unix_now()).map(|_| ())
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
    fn refresh_record(&self, uid: &str, prepared: &[PreparedGpu]) {
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
}

/// With dynamic MIG, the devices a prepare makes an instance for, by name; `own`
/// are the plugin's own instances among those discovery found.
fn dynamic_map(
    config: &PreparerConfig,
    inventory: &Inventory,
    own: &BTreeSet<(String, u32, u32)>,
) -> BTreeMap<String, DynamicDevice> {
    if config.carver.is_none() || !config.dynamic_mig {
        return BTreeMap::new();
    }
    let mut opts = SliceOptions::new(&config.node_name);
    opts.dynamic_mig = DynamicMig::All;
    opts.own_mig_instances.clone_from(own);
    dynamic_devices(inventory, &opts)
        .into_iter()
        .map(|d| (d.name.clone(), d))
        .collect()
}

/// The shared devices the slices publish under `config`, by name.
fn shared_map(config: &PreparerConfig, inventory: &Inventory) -> BTreeMap<String, SharedDevice> {
    let mut opts = SliceOptions::new(&config.node_name);
    opts.sharing.clone_from(&config.sharing);
    if config.dynamic_mig && config.carver.is_some() {
        opts.dynamic_mig = DynamicMig::All;
    }
    shared_devices(inventory, &opts)
        .into_iter()
        .map(|d| (d.name.clone(), d))
        .collect()
}

/// The MIG instances a checkpoint's records name.
fn own_instances(checkpoint: &Checkpoint) -> BTreeSet<(String, u32, u32)> {
    checkpoint
        .claims
        .values()
        .flat_map(|r| r.devices.iter())
        .filter_map(|d| d.mig.as_ref())
        .map(|m| (m.parent_uuid.clone(), m.start, m.size))
        .collect()
}

#[cfg(test)]
mod tests;
