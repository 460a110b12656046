//! `gpu.topodra.dev/v1alpha1`: the first served version of the config API.
//!
//! These types mirror the JSON exactly (camelCase, every field optional except
//! `apiVersion` and `kind`) and reject unknown fields, so a typo fails the claim
//! instead of silently configuring nothing. They are public for building configs;
//! to read one, go through `super::decode`, which also checks the rules that span
//! fields. The driver itself works on `EffectiveConfig`, which every version
//! converts into.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::effective::{EffectiveConfig, NumaPolicy, SharingPolicy};
use super::{ConfigError, MemoryQuantity, strict};
use crate::capabilities::{DriverCapabilities, DriverCapability};

/// The version string of this module's types.
#[cfg(test)]
pub(crate) const VERSION: &str = "v1alpha1";
/// `apiVersion` as it must appear in the JSON.
pub(crate) const API_VERSION: &str = "gpu.topodra.dev/v1alpha1";
/// The kind of [`GpuConfig`].
pub(crate) const GPU_CONFIG_KIND: &str = "GpuConfig";

/// Configuration of the GPUs allocated to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    /// Always `gpu.topodra.dev/v1alpha1` (`API_VERSION`).
    pub api_version: String,
    /// Always `GpuConfig` (`GPU_CONFIG_KIND`).
    pub kind: String,
    /// How containers share the GPUs. Absent: exclusive.
    #[serde(
        default,
        deserialize_with = "strict::object",
        skip_serializing_if = "Option::is_none"
    )]
    pub sharing: Option<Sharing>,
    /// NUMA behaviour. Absent: export hints, do not require alignment.
    #[serde(
        default,
        deserialize_with = "strict::object",
        skip_serializing_if = "Option::is_none"
    )]
    pub numa: Option<Numa>,
    /// Which classes of the driver's files the containers get (`compute`,
    /// `utility`, `video`, `graphics`, `ngx`, as `NVIDIA_DRIVER_CAPABILITIES` names
    /// them). Absent: all of them. The CDI spec is claim-wide, so a claim whose
    /// requests list different classes gets their union.
    #[serde(
        default,
        deserialize_with = "strict::string_enums",
        skip_serializing_if = "Option::is_none"
    )]
    pub capabilities: Option<Vec<DriverCapability>>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            api_version: API_VERSION.to_owned(),
            kind: GPU_CONFIG_KIND.to_owned(),
            sharing: None,
            numa: None,
            capabilities: None,
        }
    }
}

/// `sharing`: at most the block that matches `strategy` may be set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sharing {
    /// The sharing strategy.
    #[serde(
        default,
        deserialize_with = "strict::string_enum",
        skip_serializing_if = "is_default"
    )]
    pub strategy: SharingStrategy,
    /// Settings for [`SharingStrategy::TimeSlicing`].
    #[serde(
        default,
        deserialize_with = "strict::object",
        skip_serializing_if = "Option::is_none"
    )]
    pub time_slicing: Option<TimeSlicing>,
    /// Settings for [`SharingStrategy::Mps`].
    #[serde(
        default,
        deserialize_with = "strict::object",
        skip_serializing_if = "Option::is_none"
    )]
    pub mps: Option<Mps>,
}

/// `sharing.strategy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// One container at a time owns the GPU's compute; the default.
    #[default]
    Exclusive,
    /// Contexts are time-sliced by the GPU scheduler.
    TimeSlicing,
    /// CUDA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
}

/// `sharing.timeSlicing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicing {
    /// Length of a time slice.
    #[serde(
        default,
        deserialize_with = "strict::string_enum",
        skip_serializing_if = "is_default"
    )]
    pub interval: TimeSliceInterval,
}

/// `sharing.timeSlicing.interval`, the values `nvidia-smi compute-policy
/// --set-timeslice` takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    /// Whatever the driver uses when nothing is set.
    #[default]
    Default,
    /// Short slices.
    Short,
    /// Medium slices.
    Medium,
    /// Long slices.
    Long,
}

/// `sharing.mps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mps {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for every client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<Percentage>,
    /// Pinned device memory limit per client on every device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<MemoryQuantity>,
    /// Per-device overrides of the pinned memory limit, keyed by device name as
    /// published in the ResourceSlice (`gpu-0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_device_pinned_memory_limit: Option<BTreeMap<DeviceName, MemoryQuantity>>,
}

/// `numa`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Numa {
    /// Put the NUMA nodes and local CPUs of the allocated GPUs into the container's
    /// environment, so runtimes that pin threads can use them.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub export_hints: bool,
    /// Refuse to prepare when the allocated GPUs span NUMA nodes. The scheduler aligns
    /// only what the claim's constraints ask for; this catches a template that forgot
    /// the `matchAttribute` constraint before the workload runs slowly.
    #[serde(default, skip_serializing_if = "is_default")]
    pub require_aligned: bool,
}

impl Default for Numa {
    fn default() -> Self {
        Self {
            export_hints: true,
            require_aligned: false,
        }
    }
}

fn yes() -> bool {
    true
}

// Defaults are left out when serializing so that re-encoding an accepted config is
// never longer than what was accepted, and stays under the size limit.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn is_true(value: &bool) -> bool {
    *value
}

/// An integer percentage from 1 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Percentage(u8);

impl Percentage {
    /// `None` outside 1..=100: 0% would starve every client, and MPS caps at 100.
    pub(crate) fn new(value: u8) -> Option<Self> {
        (1..=100).contains(&value).then_some(Self(value))
    }
}

impl Serialize for Percentage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.0)
    }
}

impl<'de> Deserialize<'de> for Percentage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PercentageVisitor;

        impl Visitor<'_> for PercentageVisitor {
            type Value = Percentage;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer from 1 to 100")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Percentage, E> {
                u8::try_from(v)
                    .ok()
                    .and_then(Percentage::new)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Percentage, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
        }

        deserializer.deserialize_u64(PercentageVisitor)
    }
}

/// A key of `perDevicePinnedMemoryLimit`: a device name as a ResourceSlice allows it
/// (a DNS label). Whether the device is part of the allocation is only known at
/// prepare time; here only the spelling is checked, so `GPU0` or `gpu_0` fail early.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct DeviceName(String);

impl DeviceName {
    /// `None` unless `name` is a DNS label (lowercase alphanumerics and `-`, at most
    /// 63 characters, alphanumeric at both ends), which is what the API server
    /// requires of device names.
    pub(crate) fn new(name: &str) -> Option<Self> {
        let bytes = name.as_bytes();
        let label_char = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let ok = (1..=63).contains(&bytes.len())
            && bytes.first().is_some_and(label_char)
            && bytes.last().is_some_and(label_char)
            && bytes.iter().all(|b| label_char(b) || *b == b'-');
        ok.then(|| Self(name.to_owned()))
    }
}

impl<'de> Deserialize<'de> for DeviceName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;

        impl Visitor<'_> for NameVisitor {
            type Value = DeviceName;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device name as published in the ResourceSlice, e.g. \"gpu-0\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<DeviceName, E> {
                DeviceName::new(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }

        deserializer.deserialize_str(NameVisitor)
    }
}

impl GpuConfig {
    /// Checks what the field types cannot: relations between fields.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(caps) = &self.capabilities {
            let names: Vec<&str> = DriverCapability::ALL.iter().map(|c| c.as_str()).collect();
            if caps.is_empty() {
                return Err(ConfigError::invalid(
                    "capabilities",
                    format!(
                        "must list at least one of {}; leave capabilities out for all of them",
                        names.join(", ")
                    ),
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            if let Some(twice) = caps.iter().find(|c| !seen.insert(**c)) {
                return Err(ConfigError::invalid(
                    "capabilities",
                    format!("lists {twice} more than once"),
                ));
            }
        }
        let Some(sharing) = &self.sharing else {
            return Ok(());
        };
        // Ignoring a block that does not match would leave the operator believing
        // e.g. MPS limits are in force when the strategy is TimeSlicing.
        let mismatch = |block: &str, wants: &str| {
            ConfigError::invalid(
                format!("sharing.{block}"),
                format!(
                    "only allowed when sharing.strategy is {wants}, but the strategy is {}; \
                     set strategy: {wants} or remove sharing.{block}",
                    strategy_name(sharing.strategy),
                ),
            )
        };
        if sharing.time_slicing.is_some() && sharing.strategy != SharingStrategy::TimeSlicing {
            return Err(mismatch("timeSlicing", "TimeSlicing"));
        }
        if sharing.mps.is_some() && sharing.strategy != SharingStrategy::Mps {
            return Err(mismatch("mps", "MPS"));
        }
        Ok(())
    }

    /// The normalized form the driver acts on. Refuses, naming the field, what the
    /// schema accepts but a claim cannot have: MPS, which the device decides, and a
    /// time-slice interval other than Default, which is the node's to set (a GPU
    /// runs all its shares at one interval, so claims may not fight over it; they
    /// select it as a device attribute). Refused here, every caller refuses it the
    /// same way instead of prepare finding out later.
    pub(crate) fn to_effective(&self) -> Result<EffectiveConfig, ConfigError> {
        let sharing = self.sharing.clone().unwrap_or_default();
        let sharing = match sharing.strategy {
            SharingStrategy::Exclusive => SharingPolicy::Exclusive,
            SharingStrategy::TimeSlicing => match sharing.time_slicing.unwrap_or_default().interval
            {
                TimeSliceInterval::Default => SharingPolicy::TimeSlicing,
                other => {
                    return Err(ConfigError::NotImplemented {
                        path: "sharing.timeSlicing.interval".into(),
                        message: format!(
                            "{other:?} cannot be set per claim: the interval is a node setting; \
                             select time-sliced devices with timeSliceInterval == \"{other:?}\" \
                             and leave interval out or set Default"
                        ),
                    });
                }
            },
            SharingStrategy::Mps => {
                return Err(ConfigError::NotImplemented {
                    path: "sharing.strategy".into(),
                    message: "MPS is chosen by the device, not the config: ask for the class mps.topodra.dev, with the memory and compute of the share in capacity.requests"
                        .into(),
                });
            }
        };
        let numa = self.numa.clone().unwrap_or_default();
        let capabilities = match &self.capabilities {
            Some(caps) => DriverCapabilities::new(caps.iter().copied()).ok_or_else(|| {
                ConfigError::invalid("capabilities", "must list at least one capability")
            })?,
            None => DriverCapabilities::all(),
        };
        Ok(EffectiveConfig {
            sharing,
            numa: NumaPolicy {
                export_hints: numa.export_hints,
                require_aligned: numa.require_aligned,
            },
            capabilities,
        })
    }
}

fn strategy_name(strategy: SharingStrategy) -> &'static str {
    match strategy {
        SharingStrategy::Exclusive => "Exclusive",
        SharingStrategy::TimeSlicing => "TimeSlicing",
        SharingStrategy::Mps => "MPS",
    }
}
