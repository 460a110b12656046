//! What a claim asks of our GPUs, in the terms the model can judge.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaimSpec;

use super::Level;
use super::consumable::{amount, amount_text, local_name};
use super::device::SHARING;
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
    /// Shares of shared GPUs, from requests of a class of shared devices (the
    /// time-sliced class), each with the capacities it asks for.
    pub shares: Vec<ShareWant>,
}

/// Some MIG devices of one profile.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MigWant {
    pub profile: String,
    pub count: u32,
}

/// Some shares of shared GPUs, all alike: of one mode, each asking for the same
/// capacities. `count` shares are judged as shares of that size, several of which
/// may go to one GPU.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ShareWant {
    /// The mode (the devices' `sharing` attribute) the class or a selector names;
    /// `None`: any shared device.
    pub sharing: Option<String>,
    pub count: u32,
    /// Each share's request by capacity name, without the driver's domain
    /// (`memory`: bytes). A capacity not named here takes the device's default
    /// (its request policy's `default`, read from the slice).
    pub capacity: BTreeMap<String, u64>,
}

impl ShareWant {
    /// "1 time-sliced share (20Gi memory)", "2 MPS shares (10Gi memory, 30 compute
    /// each)", "1 time-sliced share (of the default size)".
    pub fn describe(&self) -> String {
        let s = if self.count == 1 { "" } else { "s" };
        let size = if self.capacity.is_empty() {
            "of the default size".to_owned()
        } else {
            let each = if self.count == 1 { "" } else { " each" };
            format!("{}{each}", self.sizes().join(", "))
        };
        format!(
            "{} {} share{s} ({size})",
            self.count,
            mode_words(self.sharing.as_deref())
        )
    }

    /// Each capacity asked for as people read it, memory first: `20Gi memory`,
    /// `30 compute`.
    pub fn sizes(&self) -> Vec<String> {
        let mut named: Vec<(&String, &u64)> = self.capacity.iter().collect();
        named.sort_by_key(|(n, _)| (n.as_str() != "memory", n.as_str()));
        named
            .into_iter()
            .map(|(name, v)| format!("{} {name}", amount_text(name, *v)))
            .collect()
    }
}

/// A sharing mode as a message says it: `time-sliced`, `MPS`; `shared` for any.
pub fn mode_words(sharing: Option<&str>) -> String {
    match sharing {
        None | Some("") => "shared".to_owned(),
        Some("TimeSlicing") => "time-sliced".to_owned(),
        Some(other) => other.to_owned(),
    }
}

/// What a device class of ours hands out, as far as its CEL selectors say it in the
/// forms our chart writes (`device.attributes["<driver>"].type == "gpu"`,
/// `... .profile == "1g.10gb"`, `... .sharing == "TimeSlicing"`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClassKind {
    /// Any device of the driver (no type selector the model reads).
    #[default]
    Any,
    /// Whole GPUs.
    Gpus,
    /// MIG devices, of one profile when a selector names it.
    Mig { profile: Option<String> },
    /// Shares of shared devices (`type == "shared"`), of one mode when a selector
    /// names it (`sharing == "TimeSlicing"`).
    Shared { sharing: Option<String> },
}

impl ClassKind {
    /// The kind the selector expressions `exprs` pick out of our driver's devices,
    /// and whether every one of them was read in full (a conjunction of the driver,
    /// type, profile and sharing comparisons and nothing else).
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
                        ("shared", ClassKind::Shared { sharing }) => ClassKind::Shared { sharing },
                        ("shared", _) => ClassKind::Shared { sharing: None },
                        (_, k) => {
                            understood = false;
                            k
                        }
                    };
                } else if let Some(v) = equals(t, driver, "profile") {
                    kind = ClassKind::Mig {
                        profile: Some(v.to_owned()),
                    };
                } else if let Some(v) = equals(t, driver, SHARING) {
                    kind = ClassKind::Shared {
                        sharing: Some(v.to_owned()),
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
            (ClassKind::Shared { sharing: Some(m) }, ClassKind::Shared { sharing: None }) => {
                ClassKind::Shared {
                    sharing: Some(m.clone()),
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
    /// for shares of shared devices in [`Self::shares`] with the capacities it
    /// asks for, one for whole GPUs (or any device) in [`Self::count`].
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
            shares: Vec::new(),
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
                of(&e.device_class_name, e.selectors.as_ref()).map(|(kind, opaque)| {
                    let mode = e.allocation_mode.as_deref();
                    (mode, e.count, kind, opaque, e.capacity.as_ref())
                })
            } else {
                req.first_available
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|s| {
                        of(&s.device_class_name, s.selectors.as_ref()).map(|(kind, opaque)| {
                            let mode = s.allocation_mode.as_deref();
                            (mode, s.count, kind, opaque, s.capacity.as_ref())
                        })
                    })
                    .min_by_key(|(_, count, _, _, _)| count.unwrap_or(1))
            };
            let Some((mode, count, kind, opaque, capacity)) = wanted else {
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
                ClassKind::Shared { sharing } => {
                    let mut want = ShareWant {
                        sharing,
                        count,
                        capacity: BTreeMap::new(),
                    };
                    let requested = capacity.and_then(|c| c.requests.as_ref());
                    for (name, q) in requested.into_iter().flatten() {
                        match amount(q) {
                            Some(v) => {
                                want.capacity.insert(local_name(name, driver).to_owned(), v);
                            }
                            None => demand
                                .unjudged
                                .push(format!("capacity {name} of request {} ({})", req.name, q.0)),
                        }
                    }
                    match demand
                        .shares
                        .iter_mut()
                        .find(|w| w.sharing == want.sharing && w.capacity == want.capacity)
                    {
                        Some(w) => w.count = w.count.saturating_add(count),
                        None => demand.shares.push(want),
                    }
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

    /// "1 time-sliced share (20Gi memory) on one NUMA node": the shares of the
    /// demand.
    pub fn describe_shares(&self) -> String {
        let what = self
            .shares
            .iter()
            .map(ShareWant::describe)
            .collect::<Vec<_>>()
            .join(" and ");
        match self.level {
            Some(l) => format!("{what} on {}", l.one()),
            None => what,
        }
    }

    /// Whether the demand is shares of shared GPUs and nothing the model judges
    /// besides: no whole GPUs, no MIG devices.
    pub fn shares_only(&self) -> bool {
        self.count == 0 && self.mig.is_empty() && !self.shares.is_empty()
    }

    /// "4 GPUs on one NUMA node", "1 GPU", "4 GPUs and 32 CPUs on one NUMA node".
    pub fn describe(&self) -> String {
        if self.shares_only() {
            return self.describe_shares();
        }
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
