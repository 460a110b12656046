//! Dynamic MIG on the node: making the MIG instance a prepared partition needs,
//! and removing it again.
//!
//! The scheduler picks a profile and placement from the published counters; the
//! claim's record names them ([`MigIntent`]) before anything here runs. An
//! instance is a GPU instance at the intended placement with one compute
//! instance spanning it, which NVML then hands out as a MIG device.
//!
//! What this module never does: touch an instance at any placement but the one a
//! record names, or change a GPU's MIG mode. Calls on one GPU are serialised
//! ([`Carver`] holds a lock per parent GPU), calls on different GPUs are not: NVML
//! reconfigures one GPU at a time, and a node-wide lock would make one slow
//! creation hold up every other GPU's prepares.
//!
//! Each step is idempotent, so a prepare retried after a crash between steps
//! finishes the instance instead of failing on its half.

mod mode;
mod nvml;

pub use mode::ModeOutcome;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use topodra_model::checkpoint::MigIntent;

/// A made instance: what the CDI spec needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeInstance {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// `MIG-<uuid>` of its MIG device.
    pub uuid: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CarveError {
    #[error("GPU {parent}: {step}: {source}")]
    Nvml {
        parent: String,
        step: &'static str,
        #[source]
        source: NvmlError,
    },
    #[error(
        "GPU {parent}: a GPU instance of profile {found} is at memory slices {start}+{size}, where this claim's profile {wanted} was to go; it was not made by this plugin for this claim and is left alone"
    )]
    PlacementTaken {
        parent: String,
        start: u32,
        size: u32,
        found: u32,
        wanted: u32,
    },
    #[error(
        "GPU {parent}: GPU instance {gpu_instance} has compute instance {compute_instance}, but NVML lists no MIG device for it"
    )]
    NoMigDevice {
        parent: String,
        gpu_instance: u32,
        compute_instance: u32,
    },
}

impl CarveError {
    fn nvml<'a>(intent: &'a MigIntent, step: &'static str) -> impl FnOnce(NvmlError) -> Self + 'a {
        move |source| Self::Nvml {
            parent: intent.parent_uuid.clone(),
            step,
            source,
        }
    }

    /// NVML said the slices are taken or the instance is in use: the claim cannot
    /// be served as allocated now, which is not a fault of this node.
    pub fn is_conflict(&self) -> bool {
        match self {
            Self::PlacementTaken { .. } => true,
            Self::Nvml { source, .. } => insufficient(source) || matches!(source, NvmlError::InUse),
            Self::NoMigDevice { .. } => false,
        }
    }
}

/// NVML_ERROR_INSUFFICIENT_RESOURCES, which nvml-wrapper 0.13 has no variant for
/// (it arrives as `UnexpectedVariant`): NVML's answer for slices already taken.
fn insufficient(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::UnexpectedVariant(code)
            if *code == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES
    )
}

/// Makes and removes the MIG instances of prepared partitions.
pub struct Carver {
    nvml: Nvml,
    parents: Mutex<BTreeMap<String, Arc<Mutex<()>>>>,
}

impl std::fmt::Debug for Carver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Carver").finish_non_exhaustive()
    }
}

impl Carver {
    pub fn new(nvml: Nvml) -> Self {
        Self {
            nvml,
            parents: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs `f` on the parent GPU of `intent`, alone among calls on that GPU.
    fn on_parent<T>(
        &self,
        intent: &MigIntent,
        f: impl FnOnce(&Device<'_>) -> Result<T, CarveError>,
    ) -> Result<T, CarveError> {
        let lock = {
            let mut parents = self.parents.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(parents.entry(intent.parent_uuid.clone()).or_default())
        };
        let _held = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let gpu = self
            .nvml
            .device_by_uuid(intent.parent_uuid.as_str())
            .map_err(CarveError::nvml(intent, "finding the GPU"))?;
        f(&gpu)
    }

    /// The GPU instance at the intended placement, if there is one. One of another
    /// profile there is an error: it is not ours to use or remove.
    fn find(
        &self,
        gpu: &Device<'_>,
        intent: &MigIntent,
    ) -> Result<Option<nvml::GpuInstance>, CarveError> {
        let ours = nvml::gpu_instances(&self.nvml, gpu, intent.profile_id)
            .map_err(CarveError::nvml(intent, "listing GPU instances"))?
            .into_iter()
            .find(|gi| (gi.start, gi.size) == (intent.start, intent.size));
        Ok(ours)
    }

    /// Step one: the GPU instance at the intended placement. `ours` says whether
    /// the claim's record named this instance before this prepare began (a
    /// prepare again after its spec went missing): then an instance already there
    /// is the one an earlier prepare made, and is used. Otherwise an instance
    /// there was made by someone else, and is refused, never used. Returns its id.
    pub fn create_gpu_instance(&self, intent: &MigIntent, ours: bool) -> Result<u32, CarveError> {
        self.on_parent(intent, |gpu| {
            if let Some(gi) = self.find(gpu, intent)? {
                if ours {
                    return Ok(gi.id);
                }
                return Err(CarveError::PlacementTaken {
                    parent: intent.parent_uuid.clone(),
                    start: gi.start,
                    size: gi.size,
                    found: gi.profile_id,
                    wanted: intent.profile_id,
                });
            }
            match nvml::create_gpu_instance(
                &self.nvml,
                gpu,
                intent.profile_id,
                intent.start,
                intent.size,
            ) {
                Ok(gi) => Ok(gi.id),
                Err(e) if insufficient(&e) => Err(self.taken(gpu, intent)),
                Err(e) => Err(CarveError::nvml(intent, "creating the GPU instance")(e)),
            }
        })
    }

    /// Why the slices are taken: an instance of another profile overlapping the
    /// placement, when one can be found, else NVML's own answer.
    fn taken(&self, gpu: &Device<'_>, intent: &MigIntent) -> CarveError {
        let insufficient = || CarveError::Nvml {
            parent: intent.parent_uuid.clone(),
            step: "creating the GPU instance",
            source: NvmlError::UnexpectedVariant(
                nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
            ),
        };
        for profile in nvml::profile_ids(&self.nvml, gpu) {
            let Ok(list) = nvml::gpu_instances(&self.nvml, gpu, profile) else {
                continue;
            };
            if let Some(gi) = list.iter().find(|gi| {
                gi.start < intent.start.saturating_add(intent.size)
                    && intent.start < gi.start.saturating_add(gi.size)
            }) {
                return CarveError::PlacementTaken {
                    parent: intent.parent_uuid.clone(),
                    start: gi.start,
                    size: gi.size,
                    found: gi.profile_id,
                    wanted: intent.profile_id,
                };
            }
        }
        insufficient()
    }

    /// Step two: the compute instance spanning the GPU instance, made unless one
    /// is there. Returns the made instance with its MIG device's UUID.
    pub fn create_compute_instance(&self, intent: &MigIntent) -> Result<MadeInstance, CarveError> {
        self.on_parent(intent, |gpu| {
            let gi = self.find(gpu, intent)?.ok_or(CarveError::Nvml {
                parent: intent.parent_uuid.clone(),
                step: "finding the GPU instance just made",
                source: NvmlError::NotFound,
            })?;
            let existing = nvml::compute_instances(&self.nvml, &gi)
                .map_err(CarveError::nvml(intent, "listing compute instances"))?;
            let ci = match existing.first() {
                Some(ci) => *ci,
                None => {
                    let profile = nvml::full_compute_profile(&self.nvml, &gi)
                        .map_err(CarveError::nvml(intent, "finding the compute profile"))?;
                    nvml::create_compute_instance(&self.nvml, &gi, profile)
                        .map_err(CarveError::nvml(intent, "creating the compute instance"))?
                }
            };
            let uuid = nvml::mig_uuid(&self.nvml, gpu, gi.id, ci.id)
                .map_err(CarveError::nvml(intent, "reading the MIG device"))?
                .ok_or(CarveError::NoMigDevice {
                    parent: intent.parent_uuid.clone(),
                    gpu_instance: gi.id,
                    compute_instance: ci.id,
                })?;
            Ok(MadeInstance {
                gpu_instance: gi.id,
                compute_instance: ci.id,
                uuid,
            })
        })
    }

    /// Removes the instance at the intended placement: its compute instances,
    /// then the GPU instance, as NVML requires. `false` when there was none.
    pub fn destroy(&self, intent: &MigIntent) -> Result<bool, CarveError> {
        self.on_parent(intent, |gpu| {
            let Some(gi) = self.find(gpu, intent)? else {
                return Ok(false);
            };
            for ci in nvml::compute_instances(&self.nvml, &gi)
                .map_err(CarveError::nvml(intent, "listing compute instances"))?
            {
                nvml::destroy_compute_instance(&self.nvml, &ci)
                    .map_err(CarveError::nvml(intent, "destroying a compute instance"))?;
            }
            nvml::destroy_gpu_instance(&self.nvml, &gi)
                .map_err(CarveError::nvml(intent, "destroying the GPU instance"))?;
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests;
