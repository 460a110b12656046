//! Checks a claim against this node and turns its allocation into a plan: which of
//! our devices, for which requests, with which config. No side effects.

use crate::cdi::DriverCapabilities;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::ClaimError;
use topodra_model::checkpoint::ClaimIdentity;
use topodra_model::config::{EffectiveConfig, MemoryQuantity, effective_configs};
use topodra_model::inventory::AllocatableDevice;
use topodra_model::slice::{DynamicDevice, SharedDevice};

/// One allocated device of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PlannedDevice {
    pub(super) device: String,
    /// Base request names (`gpus` for the sub-request `gpus/large`), as the kubelet
    /// expects them back.
    pub(super) requests: Vec<String>,
    pub(super) share_id: Option<String>,
    /// The memory this share's allocation consumed, in bytes (shared devices).
    pub(super) memory_bytes: Option<u64>,
    /// The percentage of the GPU's SMs this share's allocation consumed (MPS).
    pub(super) compute_percent: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) devices: Vec<PlannedDevice>,
    pub(super) env_hints: bool,
    /// The union of the requests' driver capabilities: CDI edits are claim-wide.
    pub(super) capabilities: DriverCapabilities,
}

pub(super) struct Context<'a> {
    pub(super) driver_name: &'a str,
    pub(super) pool: &'a str,
    pub(super) gpus: &'a BTreeMap<String, AllocatableDevice>,
    pub(super) dynamic: &'a BTreeMap<String, DynamicDevice>,
    pub(super) shared: &'a BTreeMap<String, SharedDevice>,
}

impl Context<'_> {
    fn numa_node(&self, device: &str) -> Option<u32> {
        match (self.dynamic.get(device), self.shared.get(device)) {
            (Some(d), _) => d.gpu.numa_node,
            (None, Some(s)) => s.gpu.numa_node,
            (None, None) => self.gpus.get(device).and_then(|g| g.gpu.numa_node),
        }
    }
}

/// Two shares' amounts of one thing, added with `add`.
fn sum<T>(a: Option<T>, b: Option<T>, add: impl FnOnce(T, T) -> T) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(add(a, b)),
        (a, b) => a.or(b),
    }
}

fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

pub(super) fn plan(
    ctx: &Context<'_>,
    claim_ref: &ClaimIdentity,
    claim: &ResourceClaim,
) -> Result<Plan, ClaimError> {
    let namespace = claim_ref.namespace.clone();
    let name = claim_ref.name.clone();
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != claim_ref.uid {
        return Err(ClaimError::UidMismatch {
            namespace,
            name,
            expected: claim_ref.uid.clone(),
            found,
        });
    }
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| ClaimError::NotAllocated {
            namespace: namespace.clone(),
            name: name.clone(),
        })?;
    let ours: Vec<_> = allocation
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == ctx.driver_name)
        .collect();
    if ours.is_empty() {
        return Err(ClaimError::NoDevicesForDriver {
            namespace,
            name,
            driver: ctx.driver_name.to_owned(),
        });
    }

    let mut devices: Vec<PlannedDevice> = Vec::new();
    for result in &ours {
        if result.pool != ctx.pool {
            return Err(ClaimError::WrongPool {
                namespace,
                name,
                pool: result.pool.clone(),
                device: result.device.clone(),
                node: ctx.pool.to_owned(),
            });
        }
        let shared = ctx.shared.contains_key(&result.device);
        if !ctx.gpus.contains_key(&result.device)
            && !ctx.dynamic.contains_key(&result.device)
            && !shared
        {
            return Err(ClaimError::UnknownDevice {
                namespace,
                name,
                device: result.device.clone(),
            });
        }
        if result.admin_access == Some(true) {
            return Err(ClaimError::Unsupported {
                namespace,
                name,
                what: "adminAccess".into(),
            });
        }
        if shared && result.share_id.is_none() {
            return Err(ClaimError::NoShareId {
                namespace,
                name,
                device: result.device.clone(),
            });
        }
        let base = base_request(&result.request).to_owned();
        let consumed = |name: &str| result.consumed_capacity.as_ref().and_then(|c| c.get(name));
        let memory_bytes = consumed("memory")
            .and_then(|q| q.0.parse::<MemoryQuantity>().ok())
            .map(|m| m.bytes());
        let compute_percent = consumed("compute").and_then(|q| q.0.parse::<u32>().ok());
        match devices.iter_mut().find(|d| d.device == result.device) {
            Some(d) => {
                if !d.requests.contains(&base) {
                    d.requests.push(base);
                }
                // Two requests of one claim may each get a share of one device:
                // the container gets the device once, with both shares' memory.
                if d.share_id != result.share_id {
                    d.memory_bytes = sum(d.memory_bytes, memory_bytes, u64::saturating_add);
                    d.compute_percent =
                        sum(d.compute_percent, compute_percent, u32::saturating_add);
                }
            }
            None => devices.push(PlannedDevice {
                device: result.device.clone(),
                requests: vec![base],
                share_id: result.share_id.clone(),
                memory_bytes,
                compute_percent,
            }),
        }
    }

    let request_names: Vec<String> = ours
        .iter()
        .map(|r| r.request.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let configs = effective_configs(
        ctx.driver_name,
        allocation.config.as_deref().unwrap_or_default(),
        &request_names,
    )
    .map_err(|source| ClaimError::Config {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    })?;
    let default = EffectiveConfig::default();
    let config_of = |request: &str| configs.get(request).unwrap_or(&default);

    // Sharing needs no work here: what is not implemented (MPS, a non-default
    // time-slice interval) was refused when the configs were decoded.
    if request_names
        .iter()
        .any(|r| config_of(r).numa.require_aligned)
    {
        let nodes: BTreeSet<Option<u32>> =
            devices.iter().map(|d| ctx.numa_node(&d.device)).collect();
        if nodes.len() > 1 || nodes.contains(&None) {
            let nodes: Vec<String> = nodes
                .iter()
                .map(|n| n.map_or_else(|| "unknown".to_owned(), |n| n.to_string()))
                .collect();
            return Err(ClaimError::NotAligned {
                namespace,
                name,
                nodes: nodes.join(","),
            });
        }
    }

    Ok(Plan {
        devices,
        env_hints: request_names.iter().all(|r| config_of(r).numa.export_hints),
        capabilities: request_names
            .iter()
            .map(|r| config_of(r).capabilities.clone())
            .reduce(|a, b| a.union(&b))
            .unwrap_or_default(),
    })
}
