//! The normalized config the driver acts on, and how a claim's configs combine into it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceAllocationConfiguration;

use super::{ConfigError, decode};
use crate::capabilities::DriverCapabilities;

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
    /// Which classes of driver files the containers get.
    pub capabilities: DriverCapabilities,
}

/// How the GPUs of a request are shared between the containers that use the claim.
///
/// Only what the plugin implements: a config asking for MPS or a time-slice interval
/// other than the default is refused when it is converted (see
/// `v1alpha1::GpuConfig::to_effective`),
/// so nothing downstream has to refuse it again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SharingPolicy {
    /// No sharing setup; the default.
    #[default]
    Exclusive,
    /// Time-sliced contexts at the driver's default interval: GPUs already time-slice
    /// between the processes of one claim, so there is nothing to set up.
    TimeSlicing,
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
pub(crate) const SOURCE_FROM_CLASS: &str = "FromClass";
/// `source` of a config that the claim supplied.
pub(crate) const SOURCE_FROM_CLAIM: &str = "FromClaim";

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
        let effective = decode(driver_name, opaque)
            .and_then(|decoded| decoded.map(|d| d.to_effective()).transpose())
            .map_err(|error| ConfigError::InConfig {
                index,
                origin: config.source.clone(),
                error: Box::new(error),
            })?;
        if let Some(effective) = effective {
            ranked.push(Ranked {
                from_claim,
                index,
                scope: config.requests.as_deref().unwrap_or_default(),
                effective,
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

    /// A config told apart by its NUMA flags, the only settings with more than one
    /// accepted value.
    fn numa(export_hints: bool, require_aligned: bool) -> Value {
        json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig",
               "numa": {"exportHints": export_hints, "requireAligned": require_aligned}})
    }

    const A: (bool, bool) = (false, false);
    const B: (bool, bool) = (false, true);
    const C: (bool, bool) = (true, true);

    fn config(flags: (bool, bool)) -> Value {
        numa(flags.0, flags.1)
    }

    fn flags(config: &EffectiveConfig) -> (bool, bool) {
        (config.numa.export_hints, config.numa.require_aligned)
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
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
            entry(SOURCE_FROM_CLAIM, &[], DRIVER, config(A)),
            entry(SOURCE_FROM_CLASS, &[], DRIVER, config(C)),
        ];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(flags(&got["gpu"]), A);
    }

    #[test]
    fn later_config_of_the_same_source_wins() {
        let configs = [
            entry(SOURCE_FROM_CLASS, &[], DRIVER, config(C)),
            entry(SOURCE_FROM_CLASS, &[], DRIVER, config(B)),
            entry(SOURCE_FROM_CLAIM, &[], DRIVER, numa(true, false)),
            entry(SOURCE_FROM_CLAIM, &[], DRIVER, config(A)),
        ];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(flags(&got["gpu"]), A);
    }

    #[test]
    fn whole_object_replacement() {
        // The claim only asks for alignment; the class's time-slicing does not survive.
        let configs = [
            entry(
                SOURCE_FROM_CLASS,
                &[],
                DRIVER,
                gpu_config(json!({"strategy": "TimeSlicing"})),
            ),
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
            entry(SOURCE_FROM_CLASS, &[], DRIVER, config(C)),
            entry(SOURCE_FROM_CLAIM, &["train"], DRIVER, config(A)),
            entry(SOURCE_FROM_CLAIM, &["infer/small"], DRIVER, config(B)),
            entry(SOURCE_FROM_CLAIM, &["nowhere"], DRIVER, numa(true, false)),
        ];
        let requests = names(&["train", "train/a", "infer/small", "infer/big", "other"]);
        let got = effective_configs(DRIVER, &configs, &requests).unwrap();
        let got: Vec<_> = requests.iter().map(|r| flags(&got[r])).collect();
        assert_eq!(got, [A, A, B, C, C]);
    }

    #[test]
    fn subrequest_scope_does_not_match_a_prefix() {
        let configs = [entry(SOURCE_FROM_CLAIM, &["gpu"], DRIVER, config(A))];
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
            entry(SOURCE_FROM_CLASS, &[], DRIVER, config(C)),
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
    fn not_implemented_sharing_is_refused_naming_entry_and_field() {
        for (parameters, path, what) in [
            (
                gpu_config(
                    json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}}),
                ),
                "sharing.strategy",
                "MPS is chosen by the device, not the config",
            ),
            (
                time_slicing("Long"),
                "sharing.timeSlicing.interval",
                "Long cannot be set per claim: the interval is a node setting",
            ),
        ] {
            let configs = [
                entry(SOURCE_FROM_CLASS, &[], DRIVER, config(C)),
                entry(SOURCE_FROM_CLAIM, &["gpu"], DRIVER, parameters),
            ];
            let err = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("config[1] (FromClaim): {path}: {what}")),
                "{msg}"
            );
            assert_eq!(err.path(), Some(path));
        }
        // The default interval is what GPUs do anyway.
        let configs = [entry(
            SOURCE_FROM_CLAIM,
            &[],
            DRIVER,
            time_slicing("Default"),
        )];
        let got = effective_configs(DRIVER, &configs, &names(&["gpu"])).unwrap();
        assert_eq!(got["gpu"].sharing, SharingPolicy::TimeSlicing);
    }
}
