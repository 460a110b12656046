//! Turning MIG mode on where that is safe, for operators who let the plugin do it
//! (`--enable-mig-mode`): GPUs that support MIG, are not in MIG mode, switch without
//! a GPU reset, and that no prepared claim holds.
//!
//! NVIDIA's MIG user guide: enabling MIG mode on an A100 or A30 needs a GPU reset
//! before it takes effect; on Hopper and later it takes effect at once, provided no
//! process uses the GPU. The plugin never resets a GPU, so Ampere GPUs are left as
//! they are, and a change NVML still reports as pending is set back.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError};

use nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE;
use topodra_model::Inventory;
use topodra_model::inventory::MigMode;

use super::Carver;

/// Architectures whose MIG mode changes without a GPU reset.
const NO_RESET: [&str; 2] = ["Hopper", "Blackwell"];

/// What was done with one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModeOutcome {
    /// MIG mode is on now.
    Enabled,
    /// Left as it was, and why.
    Skipped(String),
    /// NVML refused or the change did not take; the GPU is as it was.
    Failed(String),
}

impl Carver {
    /// Turns MIG mode on for each GPU of `inventory` that supports it, is not in
    /// MIG mode, switches without a reset, and whose devices no prepared claim
    /// holds (`held`: device names from the checkpoint). GPUs without MIG support
    /// or already in MIG mode are not listed. Calls on one GPU wait for its other
    /// MIG calls.
    pub fn enable_mig_mode(
        &self,
        inventory: &Inventory,
        held: &BTreeSet<String>,
    ) -> Vec<(String, ModeOutcome)> {
        let mut out = Vec::new();
        for gpu in &inventory.gpus {
            let off = MigMode {
                current: false,
                pending: false,
            };
            // A MIG mode at all says the GPU supports MIG: NVML answers
            // NOT_SUPPORTED otherwise. Profiles are read only once it is on.
            if gpu.mig_mode != Some(off) {
                continue;
            }
            let name = gpu.device_name();
            let outcome = if !gpu
                .architecture
                .as_deref()
                .is_some_and(|a| NO_RESET.contains(&a))
            {
                ModeOutcome::Skipped(format!(
                    "{} GPUs need a GPU reset to change MIG mode, which the plugin never does",
                    gpu.architecture.as_deref().unwrap_or("these")
                ))
            } else if held
                .iter()
                .any(|d| *d == name || d.starts_with(&format!("{name}-mig-")))
            {
                ModeOutcome::Skipped("a prepared claim holds it".to_owned())
            } else {
                self.switch_on(gpu.uuid.as_deref().unwrap_or_default())
            };
            out.push((name, outcome));
        }
        out
    }

    fn switch_on(&self, uuid: &str) -> ModeOutcome {
        let lock = {
            let mut parents = self.parents.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(parents.entry(uuid.to_owned()).or_default())
        };
        let _held = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let gpu = match self.nvml.device_by_uuid(uuid) {
            Ok(g) => g,
            Err(e) => return ModeOutcome::Failed(format!("finding the GPU: {e}")),
        };
        if let Err(e) = gpu.set_mig_mode(true) {
            return ModeOutcome::Failed(format!("enabling MIG mode: {e}"));
        }
        match gpu.mig_mode() {
            Ok(m) if m.current == NVML_DEVICE_MIG_ENABLE => ModeOutcome::Enabled,
            other => {
                // Pending a reset after all: set it back, so the GPU is offered
                // whole again instead of as nothing until someone resets it.
                let back = gpu.set_mig_mode(false).err();
                ModeOutcome::Failed(format!(
                    "MIG mode did not take effect ({}); set back{}",
                    match other {
                        Ok(m) => format!("current {}, pending {}", m.current, m.pending),
                        Err(e) => e.to_string(),
                    },
                    back.map(|e| format!(", which failed: {e}"))
                        .unwrap_or_default()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_DISABLE;

    use super::*;

    /// The fake NVML with `profile`, and the inventory discovery would read from it
    /// for what this needs: each GPU's MIG mode and architecture.
    fn machine(profile: &str) -> (tempfile::TempDir, Carver, Inventory) {
        let (dir, carver, p) = crate::dynamic_mig::tests::carver_on(profile);
        let mut inv = Inventory::default();
        for g in &p.gpus {
            let mut gpu = topodra_model::Gpu::at(g.bus_id.parse().expect("bus id"));
            gpu.minor = Some(g.minor);
            gpu.uuid = Some(g.uuid.clone());
            // The fake's names are NVML's (`Hopper`, `Ampere`).
            gpu.architecture = Some(format!("{:?}", g.architecture));
            gpu.mig_mode = g.mig.as_ref().map(|m| MigMode {
                current: m.current,
                pending: m.pending,
            });
            inv.gpus.push(gpu);
        }
        (dir, carver, inv)
    }

    fn current(c: &Carver, uuid: &str) -> u32 {
        c.nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.mig_mode())
            .expect("mig mode")
            .current
    }

    #[test]
    fn hopper_gpus_switch_unless_a_claim_holds_them() {
        let (_dir, c, inv) = machine("dgx-h100");
        let held = BTreeSet::from(["gpu-3".to_owned()]);
        let out = c.enable_mig_mode(&inv, &held);
        assert_eq!(out.len(), 8);
        for (name, outcome) in &out {
            let uuid = inv
                .gpus
                .iter()
                .find(|g| g.device_name() == *name)
                .and_then(|g| g.uuid.clone())
                .unwrap();
            if name == "gpu-3" {
                assert_eq!(
                    *outcome,
                    ModeOutcome::Skipped("a prepared claim holds it".into())
                );
                assert_eq!(current(&c, &uuid), NVML_DEVICE_MIG_DISABLE);
            } else {
                assert_eq!(*outcome, ModeOutcome::Enabled, "{name}");
                assert_eq!(current(&c, &uuid), NVML_DEVICE_MIG_ENABLE, "{name}");
            }
        }
        // Once on, a GPU is not listed again.
        let mut after = inv.clone();
        for g in &mut after.gpus {
            if g.device_name() != "gpu-3" {
                g.mig_mode = Some(MigMode {
                    current: true,
                    pending: true,
                });
            }
        }
        assert_eq!(
            c.enable_mig_mode(&after, &held)
                .into_iter()
                .map(|(n, _)| n)
                .collect::<Vec<_>>(),
            ["gpu-3"]
        );
    }

    #[test]
    fn ampere_gpus_are_left_alone() {
        let (_dir, c, inv) = machine("dgx-a100");
        let out = c.enable_mig_mode(&inv, &BTreeSet::new());
        assert!(!out.is_empty());
        for (name, outcome) in out {
            assert!(
                matches!(&outcome, ModeOutcome::Skipped(why) if why.contains("need a GPU reset")),
                "{name}: {outcome:?}"
            );
        }
    }
}
