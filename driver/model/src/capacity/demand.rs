//! What a claim asks of our GPUs, in the terms the model can judge.

use k8s_openapi::api::resource::v1::ResourceClaimSpec;

use super::Level;
use super::mixed::CpuDemand;

/// The part of a claim that the model can check against free GPUs: how many of our
/// GPUs its requests want and the level one `matchAttribute` constraint aligns them
/// on. What it cannot judge (CEL selectors, `All` requests) is listed, so an
/// explanation never claims more than it knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demand {
    pub count: u32,
    pub level: Option<Level>,
    /// Names of the requests counted.
    pub requests: Vec<String>,
    /// What the model left out, in words.
    pub unjudged: Vec<String>,
    /// CPUs of the CPU driver that one constraint puts on the same NUMA node as
    /// these GPUs ([`CpuDemand::of_claim`]); the caller sets it.
    pub cpus: Option<CpuDemand>,
}

impl Demand {
    /// The demand of a claim on the device classes `is_ours` accepts; `None` when no
    /// request of the claim names one of them.
    ///
    /// For a `firstAvailable` request the smallest of our alternatives counts: the
    /// claim cannot be allocated only if even that does not fit.
    pub fn of_claim(
        spec: &ResourceClaimSpec,
        driver: &str,
        is_ours: impl Fn(&str) -> bool,
    ) -> Option<Self> {
        Self::of_claim_with_aliases(spec, driver, &[], is_ours)
    }

    /// [`Self::of_claim`], where a constraint on one of `numa_aliases` (other
    /// drivers' names for the NUMA node, which our plugin also publishes) aligns on
    /// the NUMA node too.
    pub fn of_claim_with_aliases(
        spec: &ResourceClaimSpec,
        driver: &str,
        numa_aliases: &[String],
        is_ours: impl Fn(&str) -> bool,
    ) -> Option<Self> {
        let devices = spec.devices.as_ref()?;
        let mut demand = Demand {
            count: 0,
            level: None,
            requests: Vec::new(),
            unjudged: Vec::new(),
            cpus: None,
        };
        for req in devices.requests.as_deref().unwrap_or_default() {
            let wanted = if let Some(e) = &req.exactly {
                is_ours(&e.device_class_name).then(|| {
                    let selectors = e.selectors.as_ref().is_some_and(|s| !s.is_empty());
                    (e.allocation_mode.as_deref(), e.count, selectors)
                })
            } else {
                req.first_available
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .filter(|s| is_ours(&s.device_class_name))
                    .map(|s| {
                        let selectors = s.selectors.as_ref().is_some_and(|s| !s.is_empty());
                        (s.allocation_mode.as_deref(), s.count, selectors)
                    })
                    .min_by_key(|(_, count, _)| count.unwrap_or(1))
            };
            let Some((mode, count, selectors)) = wanted else {
                continue;
            };
            if mode == Some("All") {
                demand.unjudged.push(format!(
                    "request {} asks for all matching devices",
                    req.name
                ));
                continue;
            }
            if selectors {
                demand
                    .unjudged
                    .push(format!("selectors of request {}", req.name));
            }
            let count = u32::try_from(count.unwrap_or(1)).unwrap_or(0);
            demand.count = demand.count.saturating_add(count);
            demand.requests.push(req.name.clone());
        }
        if demand.requests.is_empty() && demand.unjudged.is_empty() {
            return None;
        }
        demand.level = devices
            .constraints
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|c| {
                c.requests.as_ref().is_none_or(|names| {
                    names.is_empty() || demand.requests.iter().any(|r| names.contains(r))
                })
            })
            .filter_map(|c| c.match_attribute.as_deref())
            .find_map(|a| {
                Level::from_match_attribute(a, driver).or_else(|| {
                    numa_aliases
                        .iter()
                        .any(|n| n == a)
                        .then_some(Level::NumaNode)
                })
            });
        Some(demand)
    }

    /// "4 GPUs on one NUMA node", "1 GPU", "4 GPUs and 32 CPUs on one NUMA node".
    pub fn describe(&self) -> String {
        let gpus = if self.count == 1 { "GPU" } else { "GPUs" };
        if let Some(c) = &self.cpus {
            if c.whole {
                return format!("{} {gpus} and a whole NUMA node's CPUs", self.count);
            }
            let cpus = if c.count == 1 { "CPU" } else { "CPUs" };
            return format!(
                "{} {gpus} and {} {cpus} on {}",
                self.count,
                c.count,
                Level::NumaNode.one()
            );
        }
        match self.level {
            Some(l) => format!("{} {gpus} on {}", self.count, l.one()),
            None => format!("{} {gpus}", self.count),
        }
    }
}
