//! The normalized config the driver acts on, and how a claim's configs combine into it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;

use super::{ConfigError, decode};

/// What the driver does for one request, whatever API version it was written in.
///
/// Every served version converts into this, so prepare, CDI generation and the
/// checkpoint never see versioned types and a new version only adds a conversion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectiveConfig {
    /// How the GPUs are shared.
    pub sharing: SharingPolicy,
    /// NUMA behaviour.
    pub numa: NumaPolicy,
}

/// How the GPUs of a request are shared between the containers that use the claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SharingPolicy {
    /// No sharing setup; the default.
    #[default]
    Exclusive,
    /// Time-sliced contexts.
    TimeSlicing {
        /// Slice length.
        interval: TimeSlice,
    },
    /// CUDA MPS.
    Mps(MpsPolicy),
}

/// Time-slice length, as `nvidia-smi compute-policy --set-timeslice` takes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimeSlice {
    /// The driver's default.
    #[default]
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

impl TimeSlice {
    /// The value of `nvidia-smi compute-policy --set-timeslice`.
    pub fn nvidia_smi_value(self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Short => 1,
            Self::Medium => 2,
            Self::Long => 3,
        }
    }
}

/// MPS settings, with defaults resolved to "not set".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MpsPolicy {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 1 to 100.
    pub active_thread_percentage: Option<u8>,
    /// Pinned device memory limit in bytes for devices without an override.
    pub default_pinned_memory_limit: Option<u64>,
    /// Overrides in bytes, by device name (`gpu-0`). A name that is not allocated to
    /// the request is for the caller to refuse; only it knows the allocation.
    pub per_device_pinned_memory_limit: BTreeMap<String, u64>,
}

impl MpsPolicy {
    /// The pinned memory limit in bytes for `device`, if any applies.
    pub fn pinned_memory_limit(&self, device: &str) -> Option<u64> {
        self.per_device_pinned_memory_limit
            .get(device)
            .copied()
            .or(self.default_pinned_memory_limit)
    }
}

/// NUMA behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaPolicy {
    /// Export the NUMA nodes and local CPUs of the allocated GPUs as environment hints.
    pub export_hints: bool,
    /// Refuse to prepare when the allocated GPUs span NUMA nodes.
    pub require_aligned: bool,
}

impl Default for NumaPolicy {
    fn default() -> Self {
        Self {
            export_hints: true,
            require_aligned: false,
        }
    }
}

/// `source` of a config that the DeviceClass supplied.
pub const SOURCE_FROM_CLASS: &str = "FromClass";
/// `source` of a config that the claim supplied.
pub const SOURCE_FROM_CLAIM: &str = "FromClaim";

/// The effective config of each request in `request_names`, from the allocation's
/// `status.allocation.devices.config`.
///
/// Configs for other drivers, and entries without `opaque`, are skipped. Every config
/// for `driver_name` is decoded, even one scoped to no request on this node, so a
/// broken config fails the claim the same way wherever it lands.
///
/// Precedence: class configs, then claim configs, each in list order, whatever order
/// the list has; the last one that applies to a request wins. A config applies when
/// its `requests` is empty, names the request, or names the main request of a
/// subrequest (`gpu` applies to `gpu/big`).
///
/// The winner replaces the earlier configs as a whole object; fields are not merged.
/// A field-wise merge has no clear answer for a class that sets MPS limits and a claim
/// that switches to time-slicing, and "the config you can see is the config in force"
/// is easier to reason about from a claim than a merge across two objects. A class
/// that wants to make a setting mandatory should use an admission policy, not rely on
/// claims not overriding it. A request no config applies to gets
/// [`EffectiveConfig::default`].
///
/// An error names the entry's index in `status.allocation.devices.config` and its
/// source, and fails the whole claim: preparing some of its requests with a config the
/// user did not intend is worse than preparing none.
pub fn effective_configs(
    driver_name: &str,
    configs: &[DeviceAllocationConfiguration],
    request_names: &[String],
) -> Result<BTreeMap<String, EffectiveConfig>, ConfigError> {
    struct Ranked<'a> {
        from_claim: bool,
        index: usize,
        scope: &'a [String],
        effective: EffectiveConfig,
    }

    let mut ranked = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        let Some(opaque) = &config.opaque else {
            continue;
        };
        if opaque.driver != driver_name {
            continue;
        }
        let from_claim = match config.source.as_str() {
            SOURCE_FROM_CLASS => false,
            SOURCE_FROM_CLAIM => true,
            other => {
                return Err(ConfigError::UnknownSource {
                    index,
                    origin: other.to_owned(),
                });
            }
        };
        let decoded = decode(driver_name, opaque).map_err(|error| ConfigError::InConfig {
            index,
            origin: config.source.clone(),
            error: Box::new(error),
        })?;
        if let Some(decoded) = decoded {
            ranked.push(Ranked {
                from_claim,
                index,
                scope: config.requests.as_deref().unwrap_or_default(),
                effective: decoded.to_effective(),
            });
        }
    }
    // The API server lists class configs first today; sorting keeps the claim's
    // precedence from depending on that.
    ranked.sort_by_key(|r| (r.from_claim, r.index));

    Ok(request_names
        .iter()
        .map(|request| {
            let effective = ranked
                .iter()
                .rev()
                .find(|r| applies(r.scope, request))
                .map(|r| r.effective.clone())
                .unwrap_or_default();
            (request.clone(), effective)
        })
        .collect())
}

fn applies(scope: &[String], request: &str) -> bool {
    let main = request.split_once('/').map_or(request, |(main, _)| main);
    scope.is_empty() || scope.iter().any(|s| s == request || s == main)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::{Value, json};

    use super::*;

    const DRIVER: &str = "gpu.topodra.dev";

    fn entry(
        source: &str,
        requests: &[&str],
        driver: &str,
        parameters: Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.to_owned(),
                parameters: RawExtension(parameters),
            }),
            requests: (!requests.is_empty())
                .then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
            source: source.to_owned(),
        }
    }

    fn gpu_config(sharing: Value) -> Value {
        json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing})
    }

    fn time_slicing(interval: &str) -> Value {
        gpu_config(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}))
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn interval(config: &EffectiveConfig) -> Option<TimeSlice> {
        match config.sharing {
            SharingPolicy::TimeSlicing { interval } => Some(interval),
            _ => None,
        }
    }

    #[test]
    fn no_config_means_defaults() {
        let got = effective_configs(DRIVER, &[], &names(&["a", "b/c"])).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.values().all(|c| *c == EffectiveConfig::default()));
        let default = EffectiveConfig::default();
        assert_eq!(default.sharing, SharingPolicy::Exclusive);
        assert!(default.numa.export_hints);
        assert!(!default.numa.require_aligned);
    }

    #[test]
    fn claim_overrides_class_even_when_listed_first() {
        let configs = [
            entry(SOURCE_FROM_CLAIM, &[], DRIVER, time_slicing("Long")),
            entry(SOURCE_FROM_CLASS, &[], DRIVER, time_slicing("Short")),
        ];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(interval(&got["gpu"]), Some(TimeSlice::Long));
    }

    #[test]
    fn later_config_of_the_same_source_wins() {
        let configs = [
            entry(SOURCE_FROM_CLASS, &[], DRIVER, time_slicing("Short")),
            entry(SOURCE_FROM_CLASS, &[], DRIVER, time_slicing("Medium")),
            entry(SOURCE_FROM_CLAIM, &[], DRIVER, time_slicing("Default")),
            entry(SOURCE_FROM_CLAIM, &[], DRIVER, time_slicing("Long")),
        ];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(interval(&got["gpu"]), Some(TimeSlice::Long));
    }

    #[test]
    fn whole_object_replacement() {
        // The claim only asks for alignment; the class's time-slicing does not survive.
        let configs = [
            entry(SOURCE_FROM_CLASS, &[], DRIVER, time_slicing("Short")),
            entry(
                SOURCE_FROM_CLAIM,
                &[],
                DRIVER,
                json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig",
                       "numa": {"requireAligned": true}}),
            ),
        ];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(got["gpu"].sharing, SharingPolicy::Exclusive);
        assert!(got["gpu"].numa.require_aligned);
    }

    #[test]
    fn scoping_by_request_and_subrequest() {
        let configs = [
            entry(SOURCE_FROM_CLASS, &[], DRIVER, time_slicing("Short")),
            entry(SOURCE_FROM_CLAIM, &["train"], DRIVER, time_slicing("Long")),
            entry(
                SOURCE_FROM_CLAIM,
                &["infer/small"],
                DRIVER,
                time_slicing("Medium"),
            ),
            entry(
                SOURCE_FROM_CLAIM,
                &["nowhere"],
                DRIVER,
                time_slicing("Default"),
            ),
        ];
        let requests = names(&["train", "train/a", "infer/small", "infer/big", "other"]);
        let got = effective_configs(DRIVER, &configs, &requests).unwrap();
        let intervals: Vec<_> = requests
            .iter()
            .map(|r| interval(&got[r]).unwrap())
            .collect();
        assert_eq!(
            intervals,
            [
                TimeSlice::Long,
                TimeSlice::Long,
                TimeSlice::Medium,
                TimeSlice::Short,
                TimeSlice::Short,
            ]
        );
    }

    #[test]
    fn subrequest_scope_does_not_match_a_prefix() {
        let configs = [entry(
            SOURCE_FROM_CLAIM,
            &["gpu"],
            DRIVER,
            time_slicing("Long"),
        )];
        let got = effective_configs(DRIVER, &configs, &names(&["gpus", "gpus/x"])).unwrap();
        assert!(got.values().all(|c| *c == EffectiveConfig::default()));
    }

    #[test]
    fn other_drivers_and_non_opaque_entries_are_skipped() {
        let configs = [
            entry(SOURCE_FROM_CLAIM, &[], "nic.example.com", json!("anything")),
            entry("SomethingNew", &[], "nic.example.com", json!({})),
            DeviceAllocationConfiguration {
                opaque: None,
                requests: None,
                source: SOURCE_FROM_CLAIM.to_owned(),
            },
        ];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(got["gpu"], EffectiveConfig::default());
    }

    #[test]
    fn error_names_index_and_source() {
        let configs = [
            entry(SOURCE_FROM_CLASS, &[], DRIVER, time_slicing("Short")),
            entry(
                SOURCE_FROM_CLAIM,
                &["unrelated"],
                DRIVER,
                time_slicing("Forever"),
            ),
        ];
        let err = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("config[1] (FromClaim): sharing.timeSlicing.interval:"),
            "{msg}"
        );
        assert!(msg.contains("Forever"), "{msg}");
        assert_eq!(err.path(), Some("sharing.timeSlicing.interval"));
    }

    #[test]
    fn unknown_source_is_refused() {
        let configs = [entry("FromNamespace", &[], DRIVER, time_slicing("Short"))];
        let msg = effective_configs(DRIVER, &configs, &names(&["gpu"]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("config[0]") && msg.contains("FromNamespace"),
            "{msg}"
        );
    }

    #[test]
    fn mps_limits_resolve_per_device() {
        let configs = [entry(
            SOURCE_FROM_CLAIM,
            &[],
            DRIVER,
            gpu_config(json!({"strategy": "MPS", "mps": {
                "defaultActiveThreadPercentage": 25,
                "defaultPinnedDeviceMemoryLimit": "1Gi",
                "perDevicePinnedMemoryLimit": {"gpu-3": "2Gi"}
            }})),
        )];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        let SharingPolicy::Mps(mps) = &got["gpu"].sharing else {
            panic!("{:?}", got["gpu"]);
        };
        assert_eq!(mps.active_thread_percentage, Some(25));
        assert_eq!(mps.pinned_memory_limit("gpu-3"), Some(2 << 30));
        assert_eq!(mps.pinned_memory_limit("gpu-0"), Some(1 << 30));
    }

    #[test]
    fn time_slice_values() {
        let values = [
            TimeSlice::Default,
            TimeSlice::Short,
            TimeSlice::Medium,
            TimeSlice::Long,
        ]
        .map(TimeSlice::nvidia_smi_value);
        assert_eq!(values, [0, 1, 2, 3]);
    }
}
