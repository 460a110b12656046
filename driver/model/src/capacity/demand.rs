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
    /// MIG devices by profile, from requests of a MIG class whose profile the class
    /// or the request's selectors name.
    pub mig: Vec<MigWant>,
}

/// Some MIG devices of one profile.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MigWant {
    pub profile: String,
    pub count: u32,
}

/// What a device class of ours hands out, as far as its CEL selectors say it in the
/// forms our chart writes (`device.attributes["<driver>"].type == "gpu"`,
/// `... .profile == "1g.10gb"`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClassKind {
    /// Any device of the driver (no type selector the model reads).
    #[default]
    Any,
    /// Whole GPUs.
    Gpus,
    /// MIG devices, of one profile when a selector names it.
    Mig { profile: Option<String> },
}

impl ClassKind {
    /// The kind the selector expressions `exprs` pick out of our driver's devices,
    /// and whether every one of them was read in full (a conjunction of the driver,
    /// type and profile comparisons and nothing else).
    pub fn of_selectors<'a>(
        exprs: impl IntoIterator<Item = &'a str>,
        driver: &str,
    ) -> (Self, bool) {
        let mut kind = ClassKind::Any;
        let mut understood = true;
        for e in exprs {
            for term in e.split("&&") {
                let t: String = term
                    .split_whitespace()
                    .collect::<String>()
                    .replace('\'', "\"");
                let t = t.trim_matches(|c| c == '(' || c == ')');
                if let Some(v) = equals(t, driver, "type") {
                    kind = match (v, std::mem::take(&mut kind)) {
                        ("gpu", _) => ClassKind::Gpus,
                        ("mig", ClassKind::Mig { profile }) => ClassKind::Mig { profile },
                        ("mig", _) => ClassKind::Mig { profile: None },
                        (_, k) => {
                            understood = false;
                            k
                        }
                    };
                } else if let Some(v) = equals(t, driver, "profile") {
                    kind = ClassKind::Mig {
                        profile: Some(v.to_owned()),
                    };
                } else if t != format!("device.driver==\"{driver}\"") {
                    understood = false;
                }
            }
        }
        (kind, understood)
    }

    /// This class's kind narrowed by a request's selectors.
    fn narrowed(&self, by: ClassKind) -> ClassKind {
        match (self, by) {
            (ClassKind::Mig { profile: Some(p) }, ClassKind::Mig { profile: None }) => {
                ClassKind::Mig {
                    profile: Some(p.clone()),
                }
            }
            (k, ClassKind::Any) => k.clone(),
            (_, b) => b,
        }
    }
}

/// The value `v` of `device.attributes["<driver>"].<name>=="v"` (quotes normalised,
/// no spaces).
fn equals<'a>(term: &'a str, driver: &str, name: &str) -> Option<&'a str> {
    let prefix = format!("device.attributes[\"{driver}\"].{name}==\"");
    term.strip_prefix(prefix.as_str())?.strip_suffix('"')
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
        Self::of_claim_classified(spec, driver, numa_aliases, |class| {
            is_ours(class).then_some(ClassKind::Any)
        })
    }

    /// [`Self::of_claim_with_aliases`] with what each class of ours hands out: a
    /// request for MIG devices of a known profile is counted in [`Self::mig`], one
    /// for whole GPUs (or any device) in [`Self::count`].
    pub fn of_claim_classified(
        spec: &ResourceClaimSpec,
        driver: &str,
        numa_aliases: &[String],
        classify: impl Fn(&str) -> Option<ClassKind>,
    ) -> Option<Self> {
        let devices = spec.devices.as_ref()?;
        let mut demand = Demand {
            count: 0,
            level: None,
            requests: Vec::new(),
            unjudged: Vec::new(),
            cpus: None,
            mig: Vec::new(),
        };
        let of =
            |class: &str,
             selectors: Option<&Vec<k8s_openapi::api::resource::v1::DeviceSelector>>| {
                let kind = classify(class)?;
                let exprs: Vec<&str> = selectors
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.cel.as_ref().map(|c| c.expression.as_str()))
                    .collect();
                let (by, understood) = ClassKind::of_selectors(exprs.iter().copied(), driver);
                // A selector without CEL is one the model cannot read either.
                let all_cel = selectors.is_none_or(|s| s.len() == exprs.len());
                let opaque = selectors.is_some_and(|s| !s.is_empty()) && !(understood && all_cel);
                Some((kind.narrowed(by), opaque))
            };
        for req in devices.requests.as_deref().unwrap_or_default() {
            let wanted = if let Some(e) = &req.exactly {
                of(&e.device_class_name, e.selectors.as_ref())
                    .map(|(kind, opaque)| (e.allocation_mode.as_deref(), e.count, kind, opaque))
            } else {
                req.first_available
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|s| {
                        of(&s.device_class_name, s.selectors.as_ref()).map(|(kind, opaque)| {
                            (s.allocation_mode.as_deref(), s.count, kind, opaque)
                        })
                    })
                    .min_by_key(|(_, count, _, _)| count.unwrap_or(1))
            };
            let Some((mode, count, kind, opaque)) = wanted else {
                continue;
            };
            if mode == Some("All") {
                demand.unjudged.push(format!(
                    "request {} asks for all matching devices",
                    req.name
                ));
                continue;
            }
            if opaque {
                demand
                    .unjudged
                    .push(format!("selectors of request {}", req.name));
            }
            let count = u32::try_from(count.unwrap_or(1)).unwrap_or(0);
            match kind {
                ClassKind::Mig {
                    profile: Some(profile),
                } => match demand.mig.iter_mut().find(|w| w.profile == profile) {
                    Some(w) => w.count = w.count.saturating_add(count),
                    None => demand.mig.push(MigWant { profile, count }),
                },
                ClassKind::Mig { profile: None } => {
                    demand.unjudged.push(format!(
                        "request {} asks for MIG devices of any profile",
                        req.name
                    ));
                    continue;
                }
                ClassKind::Gpus | ClassKind::Any => {
                    demand.count = demand.count.saturating_add(count);
                }
            }
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

    /// "1 MIG device 7g.80gb", "2 MIG devices 1g.10gb and 1 MIG device 3g.40gb on
    /// one NUMA node": the MIG part of the demand.
    pub fn describe_mig(&self) -> String {
        let parts: Vec<String> = self
            .mig
            .iter()
            .map(|w| {
                let s = if w.count == 1 { "" } else { "s" };
                format!("{} MIG device{s} {}", w.count, w.profile)
            })
            .collect();
        let what = parts.join(" and ");
        match self.level {
            Some(l) => format!("{what} on {}", l.one()),
            None => what,
        }
    }

    /// "4 GPUs on one NUMA node", "1 GPU", "4 GPUs and 32 CPUs on one NUMA node".
    pub fn describe(&self) -> String {
        if self.count == 0 && !self.mig.is_empty() {
            return self.describe_mig();
        }
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
